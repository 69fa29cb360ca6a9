// dlopen-based discovery of the CUDA module and its devices.
#include "kernels/accelerator.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "kernels/cuda/module_abi.h"

namespace riskkv {
namespace {

constexpr const char* kModuleName = "libriskkv_cuda.so";
constexpr const char* kProbeModuleName = "libriskkv_cuda_probe.so";

std::filesystem::path ExecutableDir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : exe.parent_path();
}

}  // namespace

void* OpenCudaModule(const std::string& path, std::string* reason) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    *reason = std::string("CUDA module not loadable: ") + (err ? err : path);
    return nullptr;
  }
  auto abi = reinterpret_cast<RiskkvCudaAbiVersionFn>(dlsym(handle, "riskkv_cuda_abi_version"));
  if (abi == nullptr || abi() != RISKKV_CUDA_ABI_VERSION) {
    *reason = "CUDA module " + path + " has a different ABI version";
    return nullptr;
  }
  return handle;
}

AcceleratorProbe ProbeCudaModule(const std::string& path) {
  AcceleratorProbe probe;
  void* handle = OpenCudaModule(path, &probe.reason);
  if (handle == nullptr) return probe;
  auto query =
      reinterpret_cast<RiskkvCudaQueryDevicesFn>(dlsym(handle, "riskkv_cuda_query_devices"));
  if (query == nullptr) {
    probe.reason = "CUDA module " + path + " has no device query";
    return probe;
  }
  probe.module_loaded = true;
  probe.module_path = path;
  RiskkvCudaDevice devices[16] = {};
  char error[512] = {};
  const int count = query(devices, 16, error, sizeof(error));
  if (count < 0) {
    probe.reason = error;
  } else if (count == 0) {
    probe.reason = "no CUDA device";
  }
  for (int i = 0; i < count && i < 16; ++i) {
    probe.devices.push_back({devices[i].name, devices[i].total_memory_bytes,
                             devices[i].compute_major, devices[i].compute_minor,
                             devices[i].multiprocessors, devices[i].clock_khz});
  }
  return probe;
}

AcceleratorProbe ProbeCuda() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("RISKKV_CUDA_MODULE")) candidates.push_back(env);
  const auto dir = ExecutableDir();
  if (!dir.empty()) {
    candidates.push_back((dir / kModuleName).string());
    candidates.push_back((dir / ".." / "kernels" / "cuda" / kModuleName).string());
    candidates.push_back((dir / ".." / ".." / "kernels" / "cuda" / kModuleName).string());
  }
  for (const auto& c : candidates) {
    std::error_code ec;
    if (!std::filesystem::exists(c, ec)) continue;
    const auto probe_module = std::filesystem::path(c).parent_path() / kProbeModuleName;
    AcceleratorProbe probe =
        ProbeCudaModule(std::filesystem::exists(probe_module, ec) ? probe_module.string() : c);
    probe.engine_path = c;
    return probe;
  }
  AcceleratorProbe probe = ProbeCudaModule(kProbeModuleName);  // LD_LIBRARY_PATH / system paths
  probe.engine_path = kModuleName;
  if (!probe.module_loaded)
    probe.reason = "CUDA module libriskkv_cuda.so not found (CPU-only build or not installed)";
  return probe;
}

}  // namespace riskkv
