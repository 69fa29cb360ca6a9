// RISKKV_CPU_KERNELS, read once (cpu_features.h).
#include "kernels/cpu/cpu_features.h"

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace riskkv::cpu {

bool Avx512KernelsAllowed() {
  static const bool allowed = [] {
    const char* env = std::getenv("RISKKV_CPU_KERNELS");
    const std::string_view value = env == nullptr ? "" : env;
    if (value == "avx2") return false;
    if (!value.empty() && value != "auto") {
      std::fprintf(stderr,
                   "riskkv: RISKKV_CPU_KERNELS=%s is not a kernel set (auto or avx2); using auto\n",
                   env);
    }
    return true;
  }();
  return allowed;
}

}  // namespace riskkv::cpu
