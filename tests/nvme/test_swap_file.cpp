// SwapFile: unique, preallocated, direct where possible, removed at the end
// and after a crash; links, read-only and full file systems refused with the
// path and the bytes.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "nvme/nvme_test_util.h"
#include "zest/core/check.h"
#include "zest/core/logging.h"
#include "zest/nvme/swap_file.h"

using namespace zest;
using zest::test::LimitedDir;
using zest::test::TempDir;
using zest::test::error_of;

namespace {

bool exists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

// A pid that was alive and is no longer: a child that exited and was reaped.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return pid;
}

void touch(const std::string& p) {
  const int fd = ::open(p.c_str(), O_CREAT | O_WRONLY | O_EXCL, 0600);
  REQUIRE(fd >= 0);
  ::close(fd);
}

}  // namespace

TEST_CASE("SwapFile: a unique name per rank and process, preallocated to the aligned size, removed on destruction") {
  TempDir dir;
  std::string path;
  {
    SwapFile a = SwapFile::create(dir.str(), {.bytes = 10000, .rank = 3});
    SwapFile b = SwapFile::create(dir.str(), {.bytes = 10000, .rank = 3});
    path = a.path();
    CHECK(a.path() != b.path());
    const std::string name = std::filesystem::path(a.path()).filename().string();
    CHECK(name.starts_with(fmt::format("zest_swap.r3.{}.", ::getpid())));
    CHECK(name.ends_with(".bin"));
    CHECK(a.alignment() % 4096 == 0);
    CHECK(a.size() == (10000 + a.alignment() - 1) / a.alignment() * a.alignment());
    struct stat st {};
    REQUIRE(::stat(a.path().c_str(), &st) == 0);
    CHECK(static_cast<uint64_t>(st.st_size) == a.size());
    CHECK(static_cast<uint64_t>(st.st_blocks) * 512 >= a.size());  // preallocated, not sparse
    CHECK((st.st_mode & 0777) == 0600);
    CHECK(a.direct());  // the test's temp dir is ext4/xfs/btrfs (or tmpfs >= 6.6)
    SwapFile moved = std::move(a);
    CHECK(moved.path() == path);
    CHECK(exists(path));
  }
  CHECK_FALSE(exists(path));
  CHECK(std::filesystem::is_empty(dir.path));
}

TEST_CASE("SwapFile: a link planted at the file's name is refused and its target left untouched") {
  TempDir dir;
  const std::string target = dir / "precious";
  touch(target);
  REQUIRE(::symlink(target.c_str(), (dir / "zest_swap.r0.planted.bin").c_str()) == 0);
  const std::string msg =
      error_of([&] { SwapFile::create(dir.str(), {.bytes = 4096, .name = "zest_swap.r0.planted.bin"}); });
  CHECK(msg == fmt::format("cannot create the NVMe swap file {}: File exists", dir / "zest_swap.r0.planted.bin"));
  struct stat st {};
  REQUIRE(::stat(target.c_str(), &st) == 0);
  CHECK(st.st_size == 0);
  // A regular file in the way is refused the same way (O_EXCL), not reused.
  touch(dir / "taken.bin");
  CHECK(error_of([&] { SwapFile::create(dir.str(), {.bytes = 4096, .name = "taken.bin"}); })
            .ends_with("taken.bin: File exists"));
}

TEST_CASE("SwapFile: stale files of dead processes are removed at the next create, while live ones, links and others stay") {
  TempDir dir;
  const pid_t dead = dead_pid();
  const std::string stale = dir / fmt::format("zest_swap.r1.{}.00000000deadbeef.bin", dead);
  const std::string alive = dir / "zest_swap.r0.1.0000000000000001.bin";  // pid 1 is alive
  const std::string mine = dir / fmt::format("zest_swap.r2.{}.0000000000000002.bin", ::getpid());
  const std::string stale_link = dir / fmt::format("zest_swap.r3.{}.0000000000000003.bin", dead);
  const std::string other = dir / fmt::format("notes.{}.bin", dead);
  touch(stale);
  touch(alive);
  touch(mine);
  touch(other);
  REQUIRE(::symlink(other.c_str(), stale_link.c_str()) == 0);
  SwapFile f = SwapFile::create(dir.str(), {.bytes = 4096});
  CHECK_FALSE(exists(stale));
  CHECK(exists(alive));
  CHECK(exists(mine));
  CHECK(exists(stale_link));
  CHECK(exists(other));
  CHECK(remove_stale_swap_files(dir.str()).empty());
}

TEST_CASE("SwapFile: removed when the process leaves through exit(), left by a crash and removed on the next start") {
  TempDir dir;
  const std::string record = dir / "path.txt";
  auto child = [&](bool crash) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      SwapFile* f = new SwapFile(SwapFile::create(dir.str(), {.bytes = 4096}));
      FILE* out = std::fopen(record.c_str(), "w");
      std::fputs(f->path().c_str(), out);
      std::fclose(out);
      if (crash) ::_exit(0);  // no atexit hooks: as a kill -9 leaves it
      std::exit(0);           // the destructor never runs; the atexit hook does
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    FILE* in = std::fopen(record.c_str(), "r");
    REQUIRE(in != nullptr);
    char buf[4096] = {};
    const size_t n = std::fread(buf, 1, sizeof buf - 1, in);
    std::fclose(in);
    return std::string(buf, n);
  };
  const std::string exited = child(false);
  CHECK_FALSE(exists(exited));
  const std::string crashed = child(true);
  CHECK(exists(crashed));
  SwapFile next = SwapFile::create(dir.str(), {.bytes = 4096});
  CHECK_FALSE(exists(crashed));
}

TEST_CASE("SwapFile: a missing directory, a file as the directory and a read-only directory are refused by path") {
  TempDir dir;
  CHECK(error_of([&] { SwapFile::create(dir / "missing", {.bytes = 4096}); }) ==
        fmt::format("the NVMe swap directory (nvme_path) {} cannot be used: No such file or directory; create it or "
                    "name another",
                    dir / "missing"));
  touch(dir / "file");
  CHECK(error_of([&] { SwapFile::create(dir / "file", {.bytes = 4096}); }) ==
        fmt::format("the NVMe swap directory (nvme_path) {} is not a directory; name a directory", dir / "file"));
  // A read-only directory: a read-only tmpfs (root that may mount), the
  // mode 0555 (anyone else), or, for root that may not mount (a container),
  // /sys/kernel, which refuses new files to everyone.
  LimitedDir ro(/*read_only=*/true, 1 << 20);
  const std::string ro_path = ro.ready ? ro.path : "/sys/kernel";
  const std::string msg = error_of([&] { SwapFile::create(ro_path, {.bytes = 4096, .name = "zest_swap.r0.x.bin"}); });
  const std::string head = fmt::format("cannot create the NVMe swap file {}/zest_swap.r0.x.bin: ", ro_path);
  const std::string tail = "; nvme_path must be a writable directory: give write permission or name another";
  CHECK((msg == head + "Read-only file system" + tail || msg == head + "Permission denied" + tail));
}

TEST_CASE("SwapFile: a disk too small for the preallocation is an error naming the path and the bytes, and no file "
          "is left") {
  LimitedDir small(/*read_only=*/false, 1 << 20);
  if (small.ready) {
    const std::string msg =
        error_of([&] { SwapFile::create(small.path, {.bytes = 8 << 20, .name = "zest_swap.r0.big.bin"}); });
    CHECK(msg == fmt::format("cannot preallocate 8388608 bytes for the NVMe swap file {}/zest_swap.r0.big.bin: No "
                             "space left on device; free that much space on its file system, or point nvme_path at a "
                             "larger drive",
                             small.path));
    CHECK(std::filesystem::is_empty(small.path));
    // A tmpfs takes O_DIRECT from Linux 6.6; before, the file falls back to
    // buffered I/O. Either way it works.
    SwapFile f = SwapFile::create(small.path, {.bytes = 4096});
    CHECK(f.size() == f.alignment());
    return;
  }
  // No small file system to be had (no right to mount): the file-size limit
  // refuses the preallocation the same way, with EFBIG (and SIGXFSZ,
  // ignored here), through the same path.
  TempDir dir;
  struct rlimit saved {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
  struct rlimit small_limit = saved;
  small_limit.rlim_cur = 1 << 20;
  void (*old_handler)(int) = ::signal(SIGXFSZ, SIG_IGN);
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small_limit) == 0);
  const std::string msg = error_of([&] { SwapFile::create(dir.str(), {.bytes = 8 << 20, .name = "zest_swap.r0.b.bin"}); });
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, old_handler);
  CHECK(msg == fmt::format("cannot preallocate 8388608 bytes for the NVMe swap file {}/zest_swap.r0.b.bin: File too "
                           "large",
                           dir.str()));
  CHECK(std::filesystem::is_empty(dir.path));
}

namespace {
std::vector<std::string> g_lines;
void capture(LogLevel, std::string_view line) { g_lines.emplace_back(line); }
}  // namespace

TEST_CASE("SwapFile: a file system that refuses O_DIRECT (EINVAL) gets buffered I/O, with a note in the log") {
  TempDir dir;
  g_lines.clear();
  const LogLevel saved = log_level();
  set_log_level(LogLevel::kInfo);
  set_log_sink(capture);
  SwapFile f = SwapFile::create(dir.str(), {.bytes = 4096, .simulate_no_direct = true, .name = "zest_swap.r0.t.bin"});
  set_log_sink(nullptr);
  set_log_level(saved);
  CHECK_FALSE(f.direct());
  CHECK((::fcntl(f.fd(), F_GETFL) & O_DIRECT) == 0);
  CHECK(f.size() == f.alignment());
  REQUIRE(g_lines.size() == 1);
  CHECK(g_lines[0].find(fmt::format("] the file system of {} refuses O_DIRECT: its swap file uses buffered I/O "
                                    "(the page cache)\n",
                                    dir.str())) != std::string::npos);
  // The escape hatch: no O_DIRECT asked for, none tried.
  SwapFile g = SwapFile::create(dir.str(), {.bytes = 4096, .direct = false});
  CHECK_FALSE(g.direct());
}
