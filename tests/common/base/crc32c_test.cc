// CRC-32C against the RFC 3720 test vectors, and the hardware path against the portable one.
#include "common/base/crc32c.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace riskkv {
namespace {

TEST(Crc32c, MatchesRfc3720TestVectors) {
  std::vector<uint8_t> v(32, 0);
  EXPECT_EQ(Crc32c(v), 0x8A9136AAu);
  std::fill(v.begin(), v.end(), 0xFF);
  EXPECT_EQ(Crc32c(v), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) v[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(v), 0x46DD794Eu);
  const std::string s = "123456789";
  const std::span<const uint8_t> b(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  EXPECT_EQ(Crc32c(b), 0xE3069283u);
  EXPECT_EQ(Crc32cExtend(Crc32c(b.first(4)), b.subspan(4)), 0xE3069283u);
  std::vector<uint8_t> odd(1001);
  for (size_t i = 0; i < odd.size(); ++i) odd[i] = static_cast<uint8_t>(i * 7 + 3);
  EXPECT_EQ(Crc32c(odd), Crc32cExtendPortable(0, odd));
}

}  // namespace
}  // namespace riskkv
