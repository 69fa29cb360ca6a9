// RISKKV_CPU_KERNELS (kernels/cpu/cpu_features.h): this test runs twice, as cpu_features_test in
// the environment it is given and as avx2_kernels/ with RISKKV_CPU_KERNELS=avx2, where no
// AVX-512 kernel may be chosen whatever the CPU.
#include "kernels/cpu/cpu_features.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string_view>

#include "kernels/cpu/fixed_order.h"
#include "kernels/cpu/panels.h"

namespace riskkv::cpu {
namespace {

bool Avx2Requested() {
  const char* env = std::getenv("RISKKV_CPU_KERNELS");
  return env != nullptr && std::string_view(env) == "avx2";
}

TEST(CpuFeatures, Avx2KernelsAloneWhenTheEnvironmentAsks) {
  if (Avx2Requested()) {
    EXPECT_FALSE(Avx512KernelsAllowed());
    EXPECT_FALSE(PanelsSupported());
    EXPECT_FALSE(PairTileSupported());
  } else {
    EXPECT_TRUE(Avx512KernelsAllowed());
    EXPECT_EQ(PanelsSupported(), __builtin_cpu_supports("avx512vnni") != 0);
    EXPECT_EQ(PairTileSupported(), __builtin_cpu_supports("avx512f") != 0);
  }
}

}  // namespace
}  // namespace riskkv::cpu
