// Entry points of the CUDA module that the host side resolves with dlsym. The device query is
// the first: it tells a node whether a usable GPU exists before any GPU work is attempted.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "kernels/cuda/module_abi.h"

extern "C" int riskkv_cuda_abi_version() { return RISKKV_CUDA_ABI_VERSION; }

extern "C" int riskkv_cuda_query_devices(RiskkvCudaDevice* out, int max_devices, char* error,
                                         int error_len) {
  // Without a driver cudaGetDeviceCount returns cudaErrorInsufficientDriver and leaves the
  // count untouched, so it starts at 0.
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    std::snprintf(error, error_len, "cudaGetDeviceCount: %s (%d)", cudaGetErrorString(status),
                  static_cast<int>(status));
    return -1;
  }
  for (int i = 0; i < count && i < max_devices; ++i) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    std::snprintf(out[i].name, sizeof(out[i].name), "%s", prop.name);
    out[i].total_memory_bytes = prop.totalGlobalMem;
    out[i].compute_major = prop.major;
    out[i].compute_minor = prop.minor;
    out[i].multiprocessors = prop.multiProcessorCount;
    out[i].clock_khz = 0;
    cudaDeviceGetAttribute(&out[i].clock_khz, cudaDevAttrClockRate, i);
  }
  return count;
}
