// exit_after: a process stuck on its way out (an MPI_Abort whose launcher is
// unreachable) still ends, with status 1 and its message, once the wait is
// over; and not before.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "zest/core/exit_deadline.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Ended {
  bool exited = false;
  int status = -1;
  double seconds = 0.0;
  std::string stderr_text;
};

// Forks a child that calls exit_after(wait) and then hangs (sleeps far
// longer); waits up to `limit` for it, killing it then.
Ended run_stuck_child(std::chrono::milliseconds wait, std::chrono::seconds limit) {
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  const auto start = Clock::now();
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::dup2(pipe_fds[1], STDERR_FILENO);
    ::close(pipe_fds[0]);
    zest::exit_after(wait, "stuck child: gave up waiting");
    ::sleep(60);  // the hang: an MPI_Abort that never returns
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  Ended out;
  int status = 0;
  pid_t done = 0;
  while ((done = ::waitpid(child, &status, WNOHANG)) == 0 && Clock::now() - start < limit) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (done == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
  } else {
    REQUIRE(done == child);
    out.exited = WIFEXITED(status);
    out.status = out.exited ? WEXITSTATUS(status) : -1;
  }
  char buffer[256];
  ssize_t n = 0;
  while ((n = ::read(pipe_fds[0], buffer, sizeof(buffer))) > 0) out.stderr_text.append(buffer, static_cast<size_t>(n));
  ::close(pipe_fds[0]);
  return out;
}

}  // namespace

TEST_CASE("exit_after ends a process that hangs on its way out, with status 1 and its message") {
  const Ended e = run_stuck_child(std::chrono::milliseconds(300), std::chrono::seconds(10));
  CHECK(e.exited);
  CHECK(e.status == 1);
  CHECK(e.seconds >= 0.3);
  CHECK(e.seconds < 5.0);
  CHECK(e.stderr_text == "stuck child: gave up waiting\n");
}
