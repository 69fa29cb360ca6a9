// Finds the CUDA module and asks it for GPUs, without linking any CUDA library into the
// process. Every failure (module absent, driver absent, no device) becomes a reason string, and
// the caller stays on the CPU backend.
#pragma once

#include <string>
#include <vector>

namespace riskkv {

struct GpuDevice {
  std::string name;
  uint64_t total_memory_bytes = 0;
  int compute_major = 0, compute_minor = 0, multiprocessors = 0;
  int clock_khz = 0;  // peak SM clock
};

struct AcceleratorProbe {
  bool module_loaded = false;      // libriskkv_cuda.so found and its ABI matches
  std::string module_path;         // where it was loaded from (when loaded)
  std::vector<GpuDevice> devices;  // empty when no usable GPU
  std::string reason;              // why there is no GPU, for logs ("" when devices exist)
  void* handle = nullptr;          // the dlopen handle (when loaded); never closed
};

// Looks for libriskkv_cuda.so in $RISKKV_CUDA_MODULE (a file), then beside the running
// executable and in ../kernels/cuda relative to it (the build tree), then the loader's path.
AcceleratorProbe ProbeCuda();

// Same, for an explicit module path.
AcceleratorProbe ProbeCudaModule(const std::string& path);

}  // namespace riskkv
