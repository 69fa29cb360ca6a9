// MappedFile: the bytes and size of a mapped file, the errors for what cannot be mapped, empty
// files, and moves that keep the mapping where it is.
#include "common/base/mapped_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <type_traits>
#include <utility>

#include "tests/common/base/resident_bytes.h"
#include "tests/common/base/test_dir.h"

namespace riskkv {
namespace {

using ::testing::HasSubstr;

static_assert(!std::is_copy_constructible_v<MappedFile> && !std::is_copy_assignable_v<MappedFile>);
static_assert(std::is_nothrow_move_constructible_v<MappedFile> &&
              std::is_nothrow_move_assignable_v<MappedFile>);

// Bytes a text-only reader would get wrong: a NUL, high bytes, no trailing newline.
std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + 7) % 256);
  return s;
}

std::string Contents(const MappedFile& f) {
  return std::string(reinterpret_cast<const char*>(f.data()), f.size());
}

class MappedFileTest : public testing::TestDir {};

TEST_F(MappedFileTest, MapsTheWholeFile) {
  // Larger than a page and not a multiple of one, so the tail past the last page is mapped too.
  const std::string bytes = Pattern(3 * 4096 + 17);
  const std::string path = Path("data.bin");
  Write(path, bytes);
  auto f = MappedFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->size(), bytes.size());
  EXPECT_EQ(f->path(), path);
  EXPECT_EQ(Contents(*f), bytes);
}

// Dropped pages leave the process's resident set and read back as the file's bytes; the pages
// that a range only partly covers stay.
TEST_F(MappedFileTest, DroppedPagesLeaveTheResidentSetAndReadBackTheSameBytes) {
  constexpr size_t kPage = 4096;
  const std::string bytes = Pattern(256 * kPage);
  const std::string path = Path("weights.bin");
  Write(path, bytes);
  auto f = MappedFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(Contents(*f), bytes);  // every page read: all resident
  ASSERT_GE(testing::ResidentBytesOfMapping(f->data()), static_cast<int64_t>(bytes.size()));
  // From inside the first page to inside the last: pages 1 to 254 go.
  DropMappedPages(f->data() + 100, bytes.size() - 200);
  EXPECT_LE(testing::ResidentBytesOfMapping(f->data()), static_cast<int64_t>(2 * kPage));
  EXPECT_EQ(Contents(*f), bytes);
  EXPECT_GE(testing::ResidentBytesOfMapping(f->data()), static_cast<int64_t>(bytes.size()));
}

TEST_F(MappedFileTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = Path("absent.bin");
  auto f = MappedFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(f.status().message()), HasSubstr(std::strerror(ENOENT)));
}

TEST_F(MappedFileTest, DirectoryIsInvalidArgument) {
  auto f = MappedFile::Open(dir_.string());
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr(dir_.string()));
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("not a regular file"));
}

TEST_F(MappedFileTest, FifoIsRejectedWithoutWaitingForAWriter) {
  const std::string path = Path("fifo");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
  auto f = MappedFile::Open(path);  // would block forever if the open waited for a writer
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("not a regular file"));
}

TEST_F(MappedFileTest, EmptyFileMapsNothingButHasAReadablePointer) {
  const std::string path = Path("empty.bin");
  Write(path, "");
  auto f = MappedFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->size(), 0u);
  ASSERT_NE(f->data(), nullptr);
  EXPECT_EQ(f->data()[0], 0);
  EXPECT_EQ(f->path(), path);
}

TEST_F(MappedFileTest, DefaultConstructedMapsNothing) {
  const MappedFile f;
  EXPECT_EQ(f.size(), 0u);
  ASSERT_NE(f.data(), nullptr);
  EXPECT_EQ(f.path(), "");
}

TEST_F(MappedFileTest, MovesKeepTheMappingAtItsAddress) {
  const std::string a_bytes = Pattern(5000), b_bytes = "second file";
  Write(Path("a.bin"), a_bytes);
  Write(Path("b.bin"), b_bytes);
  auto a = MappedFile::Open(Path("a.bin"));
  auto b = MappedFile::Open(Path("b.bin"));
  ASSERT_TRUE(a.ok() && b.ok());
  const uint8_t* where = a->data();

  MappedFile moved(std::move(*a));
  EXPECT_EQ(moved.data(), where);  // views into it (tensor data) stay valid
  EXPECT_EQ(moved.size(), a_bytes.size());
  EXPECT_EQ(moved.path(), Path("a.bin"));
  EXPECT_EQ(Contents(moved), a_bytes);
  EXPECT_EQ(a->size(), 0u);  // the moved-from one maps nothing and unmaps nothing
  EXPECT_NE(a->data(), where);

  // Assigning over a mapping releases it and takes the other.
  *b = std::move(moved);
  EXPECT_EQ(b->data(), where);
  EXPECT_EQ(b->path(), Path("a.bin"));
  EXPECT_EQ(Contents(*b), a_bytes);
  EXPECT_EQ(moved.size(), 0u);
}

TEST_F(MappedFileTest, MappingOutlivesTheFilesName) {
  const std::string bytes = Pattern(10000);
  const std::string path = Path("doomed.bin");
  Write(path, bytes);
  auto f = MappedFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(std::filesystem::remove(path));
  EXPECT_EQ(Contents(*f), bytes);
}

}  // namespace
}  // namespace riskkv
