// How much of a mapping is resident in this process: the Rss line of /proc/self/smaps for the
// mapping that holds an address.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

namespace riskkv::testing {

// Resident bytes of the mapping containing `addr`, or -1 when no mapping holds it.
inline int64_t ResidentBytesOfMapping(const void* addr) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long long begin = 0, end = 0;
    char dash = 0;
    if (std::sscanf(line.c_str(), "%llx%c%llx", &begin, &dash, &end) == 3 && dash == '-') {
      inside = begin <= a && a < end;
      continue;
    }
    long long kb = 0;
    if (inside && std::sscanf(line.c_str(), "Rss: %lld kB", &kb) == 1) return kb * 1024;
  }
  return -1;
}

}  // namespace riskkv::testing
