// An access file rotated on disk: a changed file takes effect without a restart, a broken one is
// ignored and the last good list stays.
#include "services/access/access_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace riskkv {
namespace {

class AccessFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("riskkv_access_file_test." + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "access").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // Writes a new file in place of the old (a new inode, as `mv` or an atomic writer does).
  void Write(const std::string& text) {
    const std::string tmp = path_ + ".tmp";
    std::ofstream(tmp) << text;
    std::filesystem::rename(tmp, path_);
  }
  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(AccessFileTest, AMissingOrBrokenFileIsRefusedAtOpen) {
  auto missing = AccessFile::Open(path_);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--access-file"), std::string::npos);
  Write("client alice token short\n");
  auto broken = AccessFile::Open(path_);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find(":1: the token of 'alice'"), std::string::npos)
      << broken.status();
  Write(std::string((1 << 20) + 1, '#'));
  auto huge = AccessFile::Open(path_);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("larger than"), std::string::npos) << huge.status();
}

TEST_F(AccessFileTest, ARotatedFileTakesEffectAndABrokenOneIsIgnored) {
  Write("client alice token alice-secret-0123456789\n");
  auto f = AccessFile::Open(path_);
  ASSERT_TRUE(f.ok()) << f.status();
  (*f)->set_check_interval(absl::ZeroDuration());
  EXPECT_TRUE((*f)->Current()->ByToken("alice-secret-0123456789").has_value());

  Write("client alice token alice-rotated-9876543210\n");
  EXPECT_FALSE((*f)->Current()->ByToken("alice-secret-0123456789").has_value());
  EXPECT_TRUE((*f)->Current()->ByToken("alice-rotated-9876543210").has_value());

  Write("client alice token tiny\n");  // refused: the last good list stays
  EXPECT_TRUE((*f)->Current()->ByToken("alice-rotated-9876543210").has_value());
  std::filesystem::remove(path_);  // gone: the same
  EXPECT_TRUE((*f)->Current()->ByToken("alice-rotated-9876543210").has_value());
}

TEST_F(AccessFileTest, TheFileIsLookedAtOncePerInterval) {
  Write("client alice token alice-secret-0123456789\n");
  auto f = AccessFile::Open(path_);
  ASSERT_TRUE(f.ok());
  (*f)->set_check_interval(absl::Hours(1));
  Write("client alice token alice-rotated-9876543210\n");
  EXPECT_TRUE((*f)->Current()->ByToken("alice-secret-0123456789").has_value())
      << "read again before the interval passed";
}

}  // namespace
}  // namespace riskkv
