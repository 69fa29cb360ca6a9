// Error reporting and RAII owners for device memory, pinned host memory, streams, events and
// cuBLAS handles inside the CUDA module.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <utility>

namespace riskkv::cuda {

// The message of the calling thread's last failure (errno-like: objects shared between threads
// never write one string concurrently).
inline std::string& LastError() {
  static thread_local std::string message;
  return message;
}

// Records "file:line: what" as the thread's last failure and returns 1, the error code every
// method of the module returns on failure.
inline int Fail(const char* file, int line, const std::string& what) {
  const char* base = file;
  for (const char* p = file; *p != '\0'; ++p)
    if (*p == '/') base = p + 1;
  LastError() = std::string(base) + ":" + std::to_string(line) + ": " + what;
  return 1;
}

inline std::string CudaMessage(const char* expr, cudaError_t e) {
  return std::string(expr) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}
inline std::string BlasMessage(const char* expr, cublasStatus_t s) {
  return std::string(expr) + ": " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")";
}

}  // namespace riskkv::cuda

// Return 1 from the enclosing function with file, line and the error recorded (Fail).
#define RKV_CUDA(expr)                                                                             \
  do {                                                                                             \
    const cudaError_t rkv_e_ = (expr);                                                             \
    if (rkv_e_ != cudaSuccess)                                                                     \
      return ::riskkv::cuda::Fail(__FILE__, __LINE__, ::riskkv::cuda::CudaMessage(#expr, rkv_e_)); \
  } while (0)
#define RKV_BLAS(expr)                                                                             \
  do {                                                                                             \
    const cublasStatus_t rkv_s_ = (expr);                                                          \
    if (rkv_s_ != CUBLAS_STATUS_SUCCESS)                                                           \
      return ::riskkv::cuda::Fail(__FILE__, __LINE__, ::riskkv::cuda::BlasMessage(#expr, rkv_s_)); \
  } while (0)
#define RKV_TRY(expr)          \
  do {                         \
    if ((expr) != 0) return 1; \
  } while (0)

namespace riskkv::cuda {

template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  ~DeviceArray() { Reset(); }
  DeviceArray(DeviceArray&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      Reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  cudaError_t Allocate(size_t n) {
    Reset();
    if (n == 0) return cudaSuccess;
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, n * sizeof(T));
    if (e == cudaSuccess) {
      p_ = static_cast<T*>(p);
      n_ = n;
    }
    return e;
  }
  // Grows to at least n elements, by half again at least, so buffers that grow a little per call
  // (attention scores during decoding) reallocate rarely. Contents are not kept.
  cudaError_t Reserve(size_t n) {
    return n <= n_ ? cudaSuccess : Allocate(std::max(n, n_ + n_ / 2));
  }
  void Reset() {
    if (p_ != nullptr) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (p_ != nullptr) cudaFreeHost(p_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  cudaError_t Allocate(size_t bytes) {
    if (p_ != nullptr) cudaFreeHost(p_);
    p_ = nullptr;
    const cudaError_t e = cudaMallocHost(&p_, bytes);
    if (e != cudaSuccess) p_ = nullptr;
    return e;
  }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

class Stream {
 public:
  Stream() = default;
  ~Stream() {
    if (s_ != nullptr) cudaStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaError_t Create() { return cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking); }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  Event() = default;
  ~Event() {
    if (e_ != nullptr) cudaEventDestroy(e_);
  }
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&&) = delete;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaError_t Create(bool timing = false) {
    return cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming);
  }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

class BlasHandle {
 public:
  BlasHandle() = default;
  ~BlasHandle() {
    if (h_ != nullptr) cublasDestroy(h_);
  }
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;
  cublasStatus_t Create() { return cublasCreate(&h_); }
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

}  // namespace riskkv::cuda
