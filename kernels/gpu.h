// The host's handle on the CUDA module: finds it once per process, and turns its factories and
// error codes into RAII objects and absl::Status values. Nothing here links a CUDA library; where
// the module, the driver or a device is missing every call is Unavailable with the reason.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/accelerator.h"
#include "kernels/cuda/engine_api.h"
#include "kernels/cuda/module_abi.h"

namespace riskkv {

// The loaded module and its devices (probed once, on first use).
struct GpuRuntime {
  AcceleratorProbe probe;
  std::string engine_error;  // why the engine module did not load (devices found)
  RiskkvCudaNewEngineFn new_engine = nullptr;
  RiskkvCudaNewOpsFn new_ops = nullptr;
};

// Unavailable, naming why, when no usable GPU exists.
absl::StatusOr<const GpuRuntime*> LoadGpuRuntime();

// 0 is OK; anything else is Internal with the module's message (which names file and line).
absl::Status FromGpu(int rc, const char* error);

absl::StatusOr<std::unique_ptr<cuda::Engine>> NewGpuEngine(const cuda::ModelDims& dims,
                                                           int device = 0);
absl::StatusOr<std::unique_ptr<cuda::Ops>> NewGpuOps(int device = 0);

// Dense f16 tensor-core peak of a device in FLOP/s from its architecture, SM count and clock;
// 0 when the architecture is not in the table (then no fraction of peak is reported).
double PeakF16Flops(const GpuDevice& device);

}  // namespace riskkv
