// Atomic file replacement: the target holds the old bytes or the new, temporaries are unique and
// never left behind, errors name the file and keep the old one, the streaming writer commits or
// cleans up, and temporaries of dead writers are recognised.
#include "common/base/atomic_file.h"

#include <gmock/gmock.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/base/mapped_file.h"
#include "tests/common/base/test_dir.h"

namespace riskkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using ::testing::UnorderedElementsAre;

static_assert(!std::is_copy_constructible_v<AtomicFileWriter>);
static_assert(std::is_nothrow_move_constructible_v<AtomicFileWriter>);

constexpr int kCannotDropPrivileges = 77;

// Runs `body` in a child process, for what must not touch this one (privileges, resource limits),
// and returns its exit status: 0 when its checks held.
int RunInChild(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// In a child: as root, becomes "nobody", so file permissions apply as they do to a service
// account. False when that is not allowed here.
bool DropRootPrivileges() {
  return ::geteuid() != 0 ||
         (::setgroups(0, nullptr) == 0 && ::setgid(65534) == 0 && ::setuid(65534) == 0);
}

class AtomicFileTest : public testing::TestDir {};

TEST_F(AtomicFileTest, ReplacesTheContentAndLeavesNoTemporary) {
  const std::string path = Path("target");
  Write(path, "old content that is longer than the new");
  ASSERT_TRUE(WriteFileAtomically(path, "new").ok());
  EXPECT_EQ(Read(path), "new");
  EXPECT_THAT(Names(), ElementsAre("target"));
}

TEST_F(AtomicFileTest, CreatesAMissingFileWithBinaryContent) {
  const std::string path = Path("fresh");
  const std::string bytes("a\0b\xff\n", 5);
  ASSERT_TRUE(WriteFileAtomically(path, bytes).ok());
  EXPECT_EQ(Read(path), bytes);
  ASSERT_TRUE(WriteFileAtomically(path, "").ok());  // an empty file is a valid content too
  EXPECT_EQ(Read(path), "");
  EXPECT_THAT(Names(), ElementsAre("fresh"));
}

TEST_F(AtomicFileTest, RelativePathsUseTheWorkingDirectory) {
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir_);
  const absl::Status s = WriteFileAtomically("relative", "here");
  std::filesystem::current_path(cwd);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(Read(Path("relative")), "here");
}

TEST_F(AtomicFileTest, TemporariesAreUniqueNextToTheTarget) {
  const std::string path = Path("target");
  std::vector<std::vector<std::string>> per_thread(8);
  std::vector<std::thread> threads;
  for (auto& names : per_thread) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) names.push_back(TemporaryPathFor(path));
    });
  }
  for (auto& t : threads) t.join();
  std::set<std::string> all;
  for (const auto& names : per_thread) {
    for (const std::string& n : names) {
      EXPECT_THAT(n, StartsWith(path + ".tmp." + std::to_string(::getpid()) + "."));
      all.insert(n);
    }
  }
  EXPECT_EQ(all.size(), 8u * 200u);
}

TEST_F(AtomicFileTest, ConcurrentWritersEachReplaceTheWholeFile) {
  const std::string path = Path("target");
  constexpr int kWriters = 8;
  constexpr size_t kBytes = 256 * 1024;
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(kWriters);
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      for (int round = 0; round < 4 && results[w].ok(); ++round) {
        results[w] = WriteFileAtomically(path, std::string(kBytes, static_cast<char>('a' + w)));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  // One writer's bytes, all of them: no interleaving, no truncation.
  const std::string final_bytes = Read(path);
  ASSERT_EQ(final_bytes.size(), kBytes);
  EXPECT_EQ(final_bytes, std::string(kBytes, final_bytes[0]));
  EXPECT_GE(final_bytes[0], 'a');
  EXPECT_LT(final_bytes[0], 'a' + kWriters);
  EXPECT_THAT(Names(), ElementsAre("target"));
}

TEST_F(AtomicFileTest, MissingDirectoryIsNotFoundNamingThePath) {
  const std::string path = Path("no/such/dir/target");
  const absl::Status s = WriteFileAtomically(path, "bytes");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
  EXPECT_THAT(std::string(s.message()), HasSubstr(std::strerror(ENOENT)));
  EXPECT_TRUE(Names().empty());
  // A regular file where a directory should be reads the same way.
  Write(Path("file"), "x");
  EXPECT_EQ(WriteFileAtomically(Path("file/target"), "bytes").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Read(Path("file")), "x");
}

TEST_F(AtomicFileTest, ReadOnlyDirectoryIsPermissionDeniedAndKeepsTheOldFile) {
  const std::string path = Path("target");
  Write(path, "old");
  std::filesystem::permissions(
      dir_, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec |
                std::filesystem::perms::others_read | std::filesystem::perms::others_exec);
  const int rc = RunInChild([&] {
    if (!DropRootPrivileges()) return kCannotDropPrivileges;
    const absl::Status s = WriteFileAtomically(path, "new");
    if (s.code() != absl::StatusCode::kPermissionDenied) return 1;
    if (std::string(s.message()).find(path) == std::string::npos) return 2;
    if (std::string(s.message()).find(std::strerror(EACCES)) == std::string::npos) return 3;
    return 0;
  });
  if (rc == kCannotDropPrivileges) GTEST_SKIP() << "cannot run a child as an unprivileged user";
  EXPECT_EQ(rc, 0) << "1: wrong code, 2: no path in the message, 3: no reason in it";
  EXPECT_EQ(Read(path), "old");
  EXPECT_THAT(Names(), ElementsAre("target"));
}

TEST_F(AtomicFileTest, FailedRenameRemovesTheTemporaryAndKeepsTheTarget) {
  // A non-empty directory cannot be replaced by a file.
  const std::string path = Path("target");
  std::filesystem::create_directory(path);
  Write(Path("target/inside"), "kept");
  const absl::Status s = WriteFileAtomically(path, "bytes");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
  EXPECT_THAT(std::string(s.message()), HasSubstr("rename"));
  EXPECT_THAT(Names(), ElementsAre("target"));
  EXPECT_EQ(Read(Path("target/inside")), "kept");
}

TEST_F(AtomicFileTest, FailedAppendRemovesTheTemporaryAndKeepsTheTarget) {
  const std::string path = Path("target");
  Write(path, "old");
  // A file size limit makes write() fail (EFBIG) part-way, as a full disk would.
  const int rc = RunInChild([&] {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit = {.rlim_cur = 1024, .rlim_max = RLIM_INFINITY};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 10;
    auto w = AtomicFileWriter::Create(path);
    if (!w.ok()) return 11;
    if (!w->Append(std::string(512, 'x')).ok()) return 12;
    const std::string temp = w->temp_path();
    const absl::Status s = w->Append(std::string(4096, 'y'));
    if (s.ok()) return 1;
    if (std::string(s.message()).find(temp) == std::string::npos) return 2;
    if (std::filesystem::exists(temp)) return 3;
    // The writer has ended: nothing more can be written or committed.
    if (w->Append("z").code() != absl::StatusCode::kFailedPrecondition) return 4;
    if (w->Commit().code() != absl::StatusCode::kFailedPrecondition) return 5;
    return 0;
  });
  EXPECT_EQ(rc, 0) << "see the checks in the child";
  EXPECT_EQ(Read(path), "old");
  EXPECT_THAT(Names(), ElementsAre("target"));
}

TEST_F(AtomicFileTest, WriterShowsNothingUntilCommit) {
  const std::string path = Path("target");
  Write(path, "old");
  auto w = AtomicFileWriter::Create(path);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->path(), path);
  EXPECT_THAT(w->temp_path(), StartsWith(path + ".tmp."));
  ASSERT_TRUE(w->Append("new ").ok());
  ASSERT_TRUE(w->Append("").ok());
  ASSERT_TRUE(w->Append("content").ok());
  EXPECT_EQ(Read(path), "old");
  EXPECT_EQ(Read(w->temp_path()), "new content");
  ASSERT_TRUE(w->Commit().ok());
  EXPECT_EQ(Read(path), "new content");
  EXPECT_THAT(Names(), ElementsAre("target"));
  EXPECT_EQ(w->Append("more").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w->Commit().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Read(path), "new content");
}

TEST_F(AtomicFileTest, DestroyingAnUncommittedWriterRemovesItsTemporary) {
  const std::string path = Path("target");
  Write(path, "old");
  std::string temp;
  {
    auto w = AtomicFileWriter::Create(path);
    ASSERT_TRUE(w.ok()) << w.status();
    temp = w->temp_path();
    ASSERT_TRUE(w->Append("abandoned").ok());
    EXPECT_THAT(Names(),
                UnorderedElementsAre("target", std::filesystem::path(temp).filename().string()));
  }
  EXPECT_FALSE(std::filesystem::exists(temp));
  EXPECT_EQ(Read(path), "old");
  EXPECT_THAT(Names(), ElementsAre("target"));
}

TEST_F(AtomicFileTest, MovedWriterCarriesItsTemporary) {
  const std::string path = Path("target");
  auto created = AtomicFileWriter::Create(path);
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_TRUE(created->Append("first ").ok());
  AtomicFileWriter w = std::move(*created);
  created = absl::InternalError("the moved-from writer is gone");  // destroys it: removes nothing
  ASSERT_TRUE(w.Append("second").ok());
  // Assigning over a writer abandons the one it held.
  auto other = AtomicFileWriter::Create(Path("other"));
  ASSERT_TRUE(other.ok());
  const std::string other_temp = other->temp_path();
  *other = std::move(w);
  EXPECT_FALSE(std::filesystem::exists(other_temp));
  ASSERT_TRUE(other->Commit().ok());
  EXPECT_EQ(Read(path), "first second");
  EXPECT_THAT(Names(), ElementsAre("target"));
}

TEST_F(AtomicFileTest, MappingOfTheTemporaryIsTheCommittedFile) {
  // How a caller checks bytes before they replace the target, and keeps using them after.
  const std::string path = Path("bank");
  auto w = AtomicFileWriter::Create(path);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->Append("checked bytes").ok());
  auto mapped = MappedFile::Open(w->temp_path());
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ASSERT_TRUE(w->Commit().ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(mapped->data()), mapped->size()),
            "checked bytes");
  EXPECT_EQ(Read(path), "checked bytes");
  EXPECT_THAT(Names(), ElementsAre("bank"));
}

TEST_F(AtomicFileTest, RemoveAbandonedTemporariesKeepsLiveWritersAndOtherFiles) {
  const std::string own = TemporaryPathFor(Path("mine"));
  Write(own, "this process, before it wrote anything");
  Write(Path("x.rkvbank.tmp.999999999.0"), "a process that no longer runs");
  Write(Path("y.rkvbank.tmp." + std::to_string(::getppid()) + ".3"), "a running process");
  Write(Path("z.tmp.notapid.0"), "not a temporary of ours");
  Write(Path("policy.pb"), "a real file");
  RemoveAbandonedTemporaries(dir_.string());
  EXPECT_THAT(Names(), UnorderedElementsAre("y.rkvbank.tmp." + std::to_string(::getppid()) + ".3",
                                            "z.tmp.notapid.0", "policy.pb"));
  // A missing directory is nothing to clean.
  RemoveAbandonedTemporaries(Path("absent"));
}

}  // namespace
}  // namespace riskkv
