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
  bool module_loaded = false;      // the probe module found and its ABI matches
  std::string module_path;         // where it was loaded from (when loaded)
  std::string engine_path;         // the engine module to load once a device is known
  std::vector<GpuDevice> devices;  // empty when no usable GPU
  std::string reason;              // why there is no GPU, for logs ("" when devices exist)
};

// Looks for the engine module libriskkv_cuda.so in $RISKKV_CUDA_MODULE (a file), then beside the
// running executable and in ../kernels/cuda relative to it (the build tree), then the loader's
// path, and asks the small probe module beside it (libriskkv_cuda_probe.so, which links no
// cuBLAS) for devices; the engine module itself answers where no probe sits beside it.
AcceleratorProbe ProbeCuda();

// Asks the module at `path` (either kind) for devices.
AcceleratorProbe ProbeCudaModule(const std::string& path);

// dlopens a CUDA module (RTLD_LOCAL: its CUDA symbols stay out of the global namespace) and checks
// its ABI version. Null with *reason set when it cannot be used. Handles are never closed:
// unloading CUDA runtimes is not reliably safe.
void* OpenCudaModule(const std::string& path, std::string* reason);

}  // namespace riskkv
