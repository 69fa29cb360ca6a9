#include "services/node/advertise.h"

#include <gtest/gtest.h>

namespace riskkv {
namespace {

TEST(DefaultAdvertise, KeepsAListenHostAndTakesThePortTheServerGot) {
  EXPECT_EQ(DefaultAdvertise("127.0.0.1:0", 41234, "edge-a"), "127.0.0.1:41234");
  EXPECT_EQ(DefaultAdvertise("10.0.0.7:7070", 7070, "edge-a"), "10.0.0.7:7070");
  EXPECT_EQ(DefaultAdvertise("[fd00::5]:7070", 7070, "edge-a"), "[fd00::5]:7070");
  EXPECT_EQ(DefaultAdvertise("node.example:7070", 7070, "edge-a"), "node.example:7070");
}

TEST(DefaultAdvertise, NamesTheHostInsteadOfAWildcard) {
  EXPECT_EQ(DefaultAdvertise("0.0.0.0:7070", 7070, "edge-a"), "edge-a:7070");
  EXPECT_EQ(DefaultAdvertise("[::]:7070", 7070, "edge-b"), "edge-b:7070");
  EXPECT_EQ(DefaultAdvertise(":7070", 7070, "edge-b"), "edge-b:7070");
  EXPECT_EQ(DefaultAdvertise("0.0.0.0:0", 39001, ""), "localhost:39001");
}

TEST(HostName, IsThisMachines) { EXPECT_FALSE(HostName().empty()); }

}  // namespace
}  // namespace riskkv
