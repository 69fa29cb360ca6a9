// Loading the CUDA module's engine factories.
#include "kernels/gpu.h"

#include <dlfcn.h>

#include <string>

namespace riskkv {

absl::StatusOr<const GpuRuntime*> LoadGpuRuntime() {
  static const GpuRuntime* runtime = [] {
    auto* r = new GpuRuntime;
    r->probe = ProbeCuda();
    if (r->probe.devices.empty()) return r;
    // Only now the engine module and cuBLAS: a machine without a GPU never maps them.
    void* engine = OpenCudaModule(r->probe.engine_path, &r->engine_error);
    if (engine == nullptr) return r;
    r->new_engine =
        reinterpret_cast<RiskkvCudaNewEngineFn>(dlsym(engine, "riskkv_cuda_new_engine"));
    r->new_ops = reinterpret_cast<RiskkvCudaNewOpsFn>(dlsym(engine, "riskkv_cuda_new_ops"));
    return r;
  }();
  if (runtime->probe.devices.empty()) {
    return absl::UnavailableError("no GPU: " + runtime->probe.reason);
  }
  if (!runtime->engine_error.empty()) return absl::UnavailableError(runtime->engine_error);
  if (runtime->new_engine == nullptr || runtime->new_ops == nullptr) {
    return absl::UnavailableError("CUDA module " + runtime->probe.engine_path +
                                  " lacks the engine entry points");
  }
  return runtime;
}

absl::Status FromGpu(int rc, const char* error) {
  if (rc == 0) return absl::OkStatus();
  return absl::InternalError(std::string("GPU: ") + (error != nullptr ? error : "unknown error"));
}

absl::StatusOr<std::unique_ptr<cuda::Engine>> NewGpuEngine(const cuda::ModelDims& dims,
                                                           int device) {
  auto runtime = LoadGpuRuntime();
  if (!runtime.ok()) return runtime.status();
  char error[1024] = {};
  cuda::Engine* engine = (*runtime)->new_engine(device, &dims, error, sizeof(error));
  if (engine == nullptr) return absl::UnavailableError(std::string("GPU engine: ") + error);
  return std::unique_ptr<cuda::Engine>(engine);
}

absl::StatusOr<std::unique_ptr<cuda::Ops>> NewGpuOps(int device) {
  auto runtime = LoadGpuRuntime();
  if (!runtime.ok()) return runtime.status();
  char error[1024] = {};
  cuda::Ops* ops = (*runtime)->new_ops(device, error, sizeof(error));
  if (ops == nullptr) return absl::UnavailableError(std::string("GPU ops: ") + error);
  return std::unique_ptr<cuda::Ops>(ops);
}

double PeakF16Flops(const GpuDevice& d) {
  // Dense f16 tensor-core FLOP per SM per clock (f32 accumulation): A100 2048, H100/H200 4096.
  int per_sm_clock = 0;
  if (d.compute_major == 8 && d.compute_minor == 0) per_sm_clock = 2048;
  if (d.compute_major == 9 && d.compute_minor == 0) per_sm_clock = 4096;
  return static_cast<double>(per_sm_clock) * d.multiprocessors * d.clock_khz * 1e3;
}

}  // namespace riskkv
