/* The C interface between host code and the dlopen'ed CUDA module (libriskkv_cuda.so). Plain C
   types only at this boundary: the device query runs before anything else, and the engine
   factories hand out objects whose interface (engine_api.h) uses plain types too. */
#ifndef RISKKV_KERNELS_CUDA_MODULE_ABI_H_
#define RISKKV_KERNELS_CUDA_MODULE_ABI_H_

#include <stdint.h>

/* Raised with every change to this file or to engine_api.h: a module and a process disagreeing on
   the Engine's methods must not load together. */
#define RISKKV_CUDA_ABI_VERSION 5

typedef struct RiskkvCudaDevice {
  char name[256];
  uint64_t total_memory_bytes;
  int compute_major;
  int compute_minor;
  int multiprocessors;
  int clock_khz; /* peak SM clock */
} RiskkvCudaDevice;

#ifdef __cplusplus
namespace riskkv::cuda {
struct ModelDims;
class Engine;
class Ops;
}  // namespace riskkv::cuda
extern "C" {
/* Returns RISKKV_CUDA_ABI_VERSION of the module. */
typedef int (*RiskkvCudaAbiVersionFn)(void);
/* Fills up to max_devices entries and returns the device count, or -1 with a message in error. */
typedef int (*RiskkvCudaQueryDevicesFn)(RiskkvCudaDevice* out, int max_devices, char* error,
                                        int error_len);
/* An engine for one model on `device`, or null with a message in error. */
typedef riskkv::cuda::Engine* (*RiskkvCudaNewEngineFn)(int device,
                                                       const riskkv::cuda::ModelDims* dims,
                                                       char* error, int error_len);
/* Single-op entry points on `device`, or null with a message in error. */
typedef riskkv::cuda::Ops* (*RiskkvCudaNewOpsFn)(int device, char* error, int error_len);
}
#endif

#endif  // RISKKV_KERNELS_CUDA_MODULE_ABI_H_
