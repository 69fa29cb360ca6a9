// Discovery of the CUDA module and its devices: absent module, module without a driver (this
// build machine), and a real device where one exists (label gpu; skipped elsewhere).
#include "kernels/accelerator.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "kernels/gpu.h"

namespace riskkv {
namespace {

#ifdef RISKKV_CUDA_MODULE_PATH
// First in this file: whether cuBLAS is mapped depends on what ran before in the process.
TEST(Accelerator, ProbingMapsNoCublas) {
  const AcceleratorProbe p = ProbeCuda();
  ASSERT_TRUE(p.module_loaded) << p.reason;
  EXPECT_NE(p.module_path.find("libriskkv_cuda_probe.so"), std::string::npos) << p.module_path;
  EXPECT_NE(p.engine_path.find("libriskkv_cuda.so"), std::string::npos) << p.engine_path;
  if (p.devices.empty()) LoadGpuRuntime().IgnoreError();  // without a GPU, no engine either
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    EXPECT_EQ(line.find("libcublas"), std::string::npos) << line;
  }
}
#endif

TEST(Accelerator, MissingModuleIsAReasonNotACrash) {
  const AcceleratorProbe p = ProbeCudaModule("/nonexistent/libriskkv_cuda.so");
  EXPECT_FALSE(p.module_loaded);
  EXPECT_TRUE(p.devices.empty());
  EXPECT_NE(p.reason.find("not loadable"), std::string::npos) << p.reason;
}

TEST(Accelerator, ProbeAlwaysExplainsAnAbsentGpu) {
  const AcceleratorProbe p = ProbeCuda();
  if (p.devices.empty()) {
    EXPECT_FALSE(p.reason.empty());
  } else {
    EXPECT_TRUE(p.reason.empty());
  }
}

#ifdef RISKKV_CUDA_MODULE_PATH
TEST(Accelerator, BuiltModuleLoads) {
  const AcceleratorProbe p = ProbeCudaModule(RISKKV_CUDA_MODULE_PATH);
  ASSERT_TRUE(p.module_loaded) << p.reason;
  if (p.devices.empty()) {
    // No driver (cudaErrorInsufficientDriver) or no device: named, and the count stays 0.
    EXPECT_TRUE(p.reason.find("cudaGetDeviceCount") != std::string::npos ||
                p.reason == "no CUDA device")
        << p.reason;
  }
}

TEST(AcceleratorGpu, DeviceDescribed) {
  const AcceleratorProbe p = ProbeCudaModule(RISKKV_CUDA_MODULE_PATH);
  if (p.devices.empty()) GTEST_SKIP() << "no GPU here: " << p.reason;
  for (const auto& d : p.devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.total_memory_bytes, 0u);
    EXPECT_GE(d.compute_major, 7);
  }
}
#endif

}  // namespace
}  // namespace riskkv
