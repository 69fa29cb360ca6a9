/* The C interface between host code and the dlopen'ed CUDA module (libriskkv_cuda.so). Plain C
   types only, so the module and the process never share C++ ABI or CUDA headers. */
#ifndef RISKKV_KERNELS_CUDA_MODULE_ABI_H_
#define RISKKV_KERNELS_CUDA_MODULE_ABI_H_

#include <stdint.h>

#define RISKKV_CUDA_ABI_VERSION 1

typedef struct RiskkvCudaDevice {
  char name[256];
  uint64_t total_memory_bytes;
  int compute_major;
  int compute_minor;
  int multiprocessors;
} RiskkvCudaDevice;

#ifdef __cplusplus
extern "C" {
#endif
/* Returns RISKKV_CUDA_ABI_VERSION of the module. */
typedef int (*RiskkvCudaAbiVersionFn)(void);
/* Fills up to max_devices entries and returns the device count, or -1 with a message in error. */
typedef int (*RiskkvCudaQueryDevicesFn)(RiskkvCudaDevice* out, int max_devices, char* error,
                                        int error_len);
#ifdef __cplusplus
}
#endif

#endif  // RISKKV_KERNELS_CUDA_MODULE_ABI_H_
