// Launch environments, the TCP and file rendezvous, and init_distributed's
// host paths. Ranks are threads; sockets are on 127.0.0.1 only.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "zest/launch/bootstrap.h"
#include "zest/launch/file_rendezvous.h"
#include "zest/launch/launch_env.h"
#include "zest/launch/tcp_rendezvous.h"
#include "zest/core/rank_context.h"

using namespace zest;
using namespace std::chrono_literals;
using Env = std::map<std::string, std::string>;
using Clock = std::chrono::steady_clock;

namespace {

LaunchEnv detect(Env vars) { return detect_launch_env(env_from_map(std::move(vars))); }

// The message of the zest::Error that detect() throws, or "" when none.
std::string detect_error(Env vars) {
  try {
    detect(std::move(vars));
  } catch (const Error& e) {
    return e.message();
  }
  return {};
}

// What one rank's thread ended with.
struct Outcome {
  std::string value;
  bool threw = false;
  bool comm_error = false;
  CommError::Reason reason = CommError::Reason::kBackend;
  std::string message;
};

// Runs fn(rank) for ranks 0..n-1 on threads, rank r starting after delay(r).
std::vector<Outcome> run_ranks(int n, const std::function<std::string(int)>& fn,
                               const std::function<std::chrono::milliseconds(int)>& delay =
                                   [](int) { return 0ms; }) {
  std::vector<Outcome> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ScopedRank scoped(r, n);
      std::this_thread::sleep_for(delay(r));
      Outcome& o = out[static_cast<size_t>(r)];
      try {
        o.value = fn(r);
      } catch (const CommError& e) {
        o.threw = o.comm_error = true;
        o.reason = e.reason();
        o.message = e.message();
      } catch (const Error& e) {
        o.threw = true;
        o.message = e.message();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

// 128 bytes like an NCCL id, zeros included.
std::string sample_blob() {
  std::string b(128, '\0');
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>((i * 37 + 11) % 256);
  b[5] = '\0';
  return b;
}

RendezvousMember member(int rank, int world, std::chrono::milliseconds timeout,
                        std::string job = "") {
  return RendezvousMember{rank, world, std::move(job), timeout};
}

// A fresh directory under the system's temp dir, removed at scope end.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "zest-rdv-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  size_t entries() const {
    return static_cast<size_t>(std::distance(std::filesystem::directory_iterator(path),
                                             std::filesystem::directory_iterator()));
  }
};

int64_t ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

// Every rank ended without an error and with `blob`.
void check_every_rank_got(const std::vector<Outcome>& out, const std::string& blob) {
  for (const Outcome& o : out) {
    CHECK_MESSAGE(!o.threw, o.message);
    CHECK(o.value == blob);
  }
}

// `me` as a rank of a TCP rendezvous on 127.0.0.1 at `server`: rank 0
// serves `blob` there, any other rank fetches.
std::string serve_or_fetch(TcpRendezvousServer& server, const RendezvousMember& me,
                           const std::string& blob) {
  if (me.rank == 0) {
    server.serve(me, blob);
    return blob;
  }
  return tcp_rendezvous_fetch("127.0.0.1", server.port(), me);
}

}  // namespace

// ---------------------------------------------------------------- launch env

TEST_CASE("launch env: no launcher is a single process") {
  const LaunchEnv env = detect({});
  CHECK(env.launcher == "none");
  CHECK(env.rank == 0);
  CHECK(env.world_size == 1);
  CHECK(env.local_rank == 0);
  CHECK(env.local_world_size == 1);
  CHECK(env.master_addr.empty());
  CHECK(env.master_port == 0);
  CHECK(env.rendezvous_port == 0);
  CHECK(env.job_id.empty());
  CHECK_FALSE(env.is_mpi_launch());
  // Empty values count as unset.
  CHECK(detect({{"RANK", ""}, {"WORLD_SIZE", ""}}).launcher == "none");
}

TEST_CASE("launch env: torchrun") {
  const LaunchEnv env = detect({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "node17"},
                                {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RUN_ID", "run-42"}});
  CHECK(env.launcher == "torchrun");
  CHECK(env.rank == 5);
  CHECK(env.world_size == 8);
  CHECK(env.local_rank == 1);
  CHECK(env.local_world_size == 4);
  CHECK(env.master_addr == "node17");
  CHECK(env.master_port == 29500);
  CHECK(env.rendezvous_port == 29500);
  CHECK(env.job_id == "run-42");
  CHECK(env.str() == "rank 5 of 8 (local 1 of 4, launcher torchrun)");

  SUBCASE("torchrun's agent store holds MASTER_PORT: ZEST takes the next one") {
    const LaunchEnv e = detect({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"},
                                {"MASTER_PORT", "29500"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
    CHECK(e.master_port == 29500);
    CHECK(e.rendezvous_port == 29501);
  }
  SUBCASE("ZEST_MASTER_PORT overrides") {
    const LaunchEnv e = detect({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"},
                                {"MASTER_PORT", "29500"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                {"ZEST_MASTER_PORT", "31000"}});
    CHECK(e.rendezvous_port == 31000);
  }
  SUBCASE("static rendezvous names every run 'none', which names nothing") {
    CHECK(detect({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"TORCHELASTIC_RUN_ID", "none"}}).job_id.empty());
    CHECK(detect({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"ZEST_JOB_ID", "mine"}}).job_id == "mine");
  }
  SUBCASE("RANK and WORLD_SIZE alone are one node") {
    const LaunchEnv e = detect({{"RANK", "2"}, {"WORLD_SIZE", "3"}});
    CHECK(e.local_rank == 2);
    CHECK(e.local_world_size == 3);
  }
}

TEST_CASE("launch env: Open MPI and MPICH") {
  const LaunchEnv env = detect({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"PMIX_NAMESPACE", "prterun-x@1"}});
  CHECK(env.launcher == "openmpi");
  CHECK(env.is_mpi_launch());
  CHECK(env.rank == 3);
  CHECK(env.world_size == 4);
  CHECK(env.local_rank == 1);
  CHECK(env.local_world_size == 2);
  CHECK(env.job_id == "prterun-x@1");
  CHECK(env.master_addr.empty());

  const LaunchEnv mpich = detect({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"},
                                  {"MPI_LOCALNRANKS", "2"}, {"MASTER_ADDR", "10.0.0.1"},
                                  {"MASTER_PORT", "1234"}});
  CHECK(mpich.launcher == "mpich");
  CHECK(mpich.is_mpi_launch());
  CHECK(mpich.rank == 1);
  CHECK(mpich.local_rank == 1);
  CHECK(mpich.master_addr == "10.0.0.1");
  CHECK(mpich.rendezvous_port == 1234);
}

TEST_CASE("launch env: Slurm") {
  Env base = {{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "7"}, {"SLURM_LOCALID", "1"},
              {"SLURM_JOB_ID", "991"}, {"SLURM_STEP_ID", "0"}};
  SUBCASE("SLURM_NTASKS_PER_NODE") {
    Env e = base;
    e["SLURM_NTASKS_PER_NODE"] = "2";
    const LaunchEnv env = detect(e);
    CHECK(env.launcher == "slurm");
    CHECK(env.rank == 5);
    CHECK(env.world_size == 7);
    CHECK(env.local_rank == 1);
    CHECK(env.local_world_size == 2);
    CHECK(env.job_id == "991.0");
  }
  SUBCASE("derived from the step's tasks per node") {
    Env e = base;
    e["SLURM_STEP_TASKS_PER_NODE"] = "2(x3),1";
    e["SLURM_NODEID"] = "1";
    CHECK(detect(e).local_world_size == 2);
    e["SLURM_NODEID"] = "3";
    e["SLURM_PROCID"] = "6";
    e["SLURM_LOCALID"] = "0";
    CHECK(detect(e).local_world_size == 1);
    e["SLURM_NODEID"] = "4";
    CHECK(detect_error(e).find("lists fewer nodes than SLURM_NODEID=4") != std::string::npos);
    e["SLURM_NODEID"] = "0";
    e["SLURM_STEP_TASKS_PER_NODE"] = "2(x";
    CHECK(detect_error(e).find("SLURM_STEP_TASKS_PER_NODE='2(x' is not valid") != std::string::npos);
  }
  SUBCASE("one node") {
    Env e = base;
    e["SLURM_NNODES"] = "1";
    CHECK(detect(e).local_world_size == 7);
  }
  SUBCASE("several nodes and no per-node count is an error, not a guess") {
    Env e = base;
    e["SLURM_NNODES"] = "3";
    CHECK(detect_error(e).find("Slurm does not say how many tasks run on this node") != std::string::npos);
  }
  SUBCASE("MASTER_ADDR is taken when the job sets it") {
    Env e = base;
    e["SLURM_NTASKS_PER_NODE"] = "4";
    e["MASTER_ADDR"] = "node1";
    e["MASTER_PORT"] = "40000";
    CHECK(detect(e).master_addr == "node1");
    CHECK(detect(e).rendezvous_port == 40000);
  }
}

TEST_CASE("launch env: a launcher started inside another wins over the outer one's variables") {
  // mpirun inside a Slurm allocation inherits SLURM_PROCID=0.
  CHECK(detect({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}})
            .launcher == "openmpi");
  CHECK(detect({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"},
                {"OMPI_COMM_WORLD_SIZE", "1"}})
            .launcher == "torchrun");
}

TEST_CASE("launch env: malformed values name the variable, the value and what is expected") {
  CHECK(detect_error({{"RANK", "x3"}, {"WORLD_SIZE", "4"}}) ==
        "environment variable RANK='x3' is not valid: expected this process's rank, a whole "
        "number from 0 to 16777215");
  CHECK(detect_error({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}).find("RANK='-1' is not valid") != std::string::npos);
  CHECK(detect_error({{"RANK", "1"}, {"WORLD_SIZE", "0"}}).find("WORLD_SIZE='0' is not valid: expected the number of processes") != std::string::npos);
  CHECK(detect_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}}) ==
        "environment variable RANK=4 is not a rank of a job of WORLD_SIZE=4: ranks run from 0 to "
        "3; check the launcher's settings");
  CHECK(detect_error({{"RANK", "1"}}).find("WORLD_SIZE is not set, but RANK is") != std::string::npos);
  CHECK(detect_error({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}})
            .find("local rank 2 of 2 processes") != std::string::npos);
  CHECK(detect_error({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "8"}})
            .find("cannot exceed the job's") != std::string::npos);
  CHECK(detect_error({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "two"}})
            .find("OMPI_COMM_WORLD_SIZE='two' is not valid") != std::string::npos);
  CHECK(detect_error({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "0"}}) ==
        "environment variable MASTER_PORT='0' is not valid: expected rank 0's TCP port, a whole "
        "number from 1 to 65535");
  CHECK(detect_error({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "99999"}}).find("MASTER_PORT='99999'") != std::string::npos);
  CHECK(detect_error({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "80a"}}).find("MASTER_PORT='80a'") != std::string::npos);
  CHECK(detect_error({{"MASTER_ADDR", "h"}}).find("MASTER_ADDR is set ('h') but MASTER_PORT is not") != std::string::npos);
  CHECK(detect_error({{"ZEST_MASTER_PORT", "70000"}}).find("ZEST_MASTER_PORT='70000'") != std::string::npos);
}

TEST_CASE("launch env: detect_launch_env() reads the process environment") {
  const char* rank = std::getenv("RANK");
  const LaunchEnv env = detect_launch_env();
  if (rank == nullptr && std::getenv("OMPI_COMM_WORLD_RANK") == nullptr &&
      std::getenv("PMI_RANK") == nullptr && std::getenv("SLURM_PROCID") == nullptr) {
    CHECK(env.launcher == "none");
  }
}

TEST_CASE("launch env: each rank's GPU follows its local rank") {
  LaunchEnv env;
  env.rank = 11;
  env.world_size = 16;
  env.local_rank = 3;
  env.local_world_size = 8;
  CHECK(local_cuda_device(env, 8) == Device::cuda(3));
  CHECK(local_cuda_device(env, 1) == Device::cuda(0));  // one GPU per process
  CHECK_THROWS_WITH_AS(local_cuda_device(env, 2),
                       doctest::Contains("would use cuda:3, but this process sees 2 GPUs"), Error);
  CHECK_THROWS_AS(local_cuda_device(env, 0), Error);
}

// ---------------------------------------------------------------- TCP

TEST_CASE("tcp rendezvous: 4 ranks on 127.0.0.1 get rank 0's blob") {
  const std::string blob = sample_blob();
  TcpRendezvousServer server("127.0.0.1", 0);  // a free port, then tell the others
  REQUIRE(server.port() > 0);
  const auto out =
      run_ranks(4, [&](int r) { return serve_or_fetch(server, member(r, 4, 5000ms), blob); });
  check_every_rank_got(out, blob);
}

TEST_CASE("tcp rendezvous: rank 0 may start last") {
  const std::string blob = sample_blob();
  const int port = pick_free_loopback_port();
  const auto out = run_ranks(
      4,
      [&](int r) { return tcp_rendezvous("127.0.0.1", port, member(r, 4, 5000ms), r == 0 ? blob : "", "127.0.0.1"); },
      [](int r) { return r == 0 ? 400ms : 0ms; });
  check_every_rank_got(out, blob);
}

TEST_CASE("tcp rendezvous: a world of 1 needs nobody") {
  CHECK(tcp_rendezvous("127.0.0.1", pick_free_loopback_port(), member(0, 1, 100ms), "id", "127.0.0.1") == "id");
}

TEST_CASE("tcp rendezvous: a connection that is not a rank is dropped and waited past") {
  const std::string blob = sample_blob();
  TcpRendezvousServer server("127.0.0.1", 0);
  std::thread intruder([&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(server.port()));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      const char junk[] = "GET / HTTP/1.0\r\n\r\n12345";
      CHECK(::send(fd, junk, sizeof(junk), MSG_NOSIGNAL) > 0);
    }
    ::close(fd);
  });
  intruder.join();
  const auto out =
      run_ranks(3, [&](int r) { return serve_or_fetch(server, member(r, 3, 5000ms), blob); });
  check_every_rank_got(out, blob);
}

TEST_CASE("tcp rendezvous: a rank whose rank 0 never comes times out in time, saying where") {
  const int port = pick_free_loopback_port();
  const auto t0 = Clock::now();
  const auto out = run_ranks(1, [&](int) {
    return tcp_rendezvous_fetch("127.0.0.1", port, member(1, 2, 600ms));
  });
  CHECK(ms_since(t0) < 2000);
  REQUIRE(out[0].comm_error);
  CHECK(out[0].reason == CommError::Reason::kTimeout);
  const std::string prefix = fmt::format("TCP rendezvous at 127.0.0.1:{} timed out on rank 1 of 2 after ", port);
  CHECK_MESSAGE(out[0].message.rfind(prefix, 0) == 0, out[0].message);
  CHECK(out[0].message.find("could not connect to rank 0 (last error: Connection refused)") != std::string::npos);
}

TEST_CASE("tcp rendezvous: rank 0 times out naming the ranks that did not come, and tells the others") {
  TcpRendezvousServer server("127.0.0.1", 0);
  const auto t0 = Clock::now();
  const auto out = run_ranks(2, [&](int r) {
    return serve_or_fetch(server, r == 0 ? member(0, 3, 700ms) : member(1, 3, 5000ms), "id");
  });
  CHECK(ms_since(t0) < 2000);
  REQUIRE(out[0].comm_error);
  CHECK(out[0].reason == CommError::Reason::kTimeout);
  CHECK_MESSAGE(out[0].message.find("timed out on rank 0 of 3 after") != std::string::npos, out[0].message);
  CHECK(out[0].message.find("rank 1 connected, rank 2 did not") != std::string::npos);
  REQUIRE(out[1].comm_error);
  CHECK(out[1].reason == CommError::Reason::kAborted);
  CHECK_MESSAGE(out[1].message.find("rank 0 says: TCP rendezvous at") != std::string::npos, out[1].message);
  CHECK(out[1].message.find("rank 2 did not") != std::string::npos);
}

TEST_CASE("tcp rendezvous: mismatched world sizes fail on both sides") {
  TcpRendezvousServer server("127.0.0.1", 0);
  const auto out = run_ranks(
      3,
      [&](int r) { return serve_or_fetch(server, member(r, r == 2 ? 4 : 3, 3000ms), "id"); },
      [](int r) { return r == 2 ? 300ms : 0ms; });
  const std::string why = "rank 2 was started for a world of 4 ranks but rank 0 for 3";
  REQUIRE(out[0].comm_error);
  CHECK(out[0].reason == CommError::Reason::kMismatch);
  CHECK_MESSAGE(out[0].message.find(why) != std::string::npos, out[0].message);
  REQUIRE(out[2].comm_error);
  CHECK(out[2].reason == CommError::Reason::kMismatch);
  CHECK_MESSAGE(out[2].message.find("refused rank 2 of 4: rank 0 says: " + why) != std::string::npos,
                out[2].message);
  // Rank 1 was already there and is told why.
  REQUIRE(out[1].comm_error);
  CHECK(out[1].reason == CommError::Reason::kAborted);
  CHECK(out[1].message.find(why) != std::string::npos);
}

TEST_CASE("tcp rendezvous: two processes claiming one rank fail") {
  TcpRendezvousServer server("127.0.0.1", 0);
  const auto out = run_ranks(
      3,
      // Threads 1 and 2 both say they are rank 1.
      [&](int r) { return serve_or_fetch(server, member(r == 0 ? 0 : 1, 3, 3000ms), "id"); },
      [](int r) { return r == 2 ? 300ms : 0ms; });
  REQUIRE(out[0].comm_error);
  CHECK(out[0].message.find("two processes connected as rank 1") != std::string::npos);
  REQUIRE(out[2].comm_error);
  CHECK(out[2].reason == CommError::Reason::kMismatch);
  CHECK(out[2].message.find("two processes connected as rank 1") != std::string::npos);
  CHECK(out[1].comm_error);
}

TEST_CASE("tcp rendezvous: a rank of another job is turned away") {
  TcpRendezvousServer server("127.0.0.1", 0);
  const auto out = run_ranks(2, [&](int r) {
    return serve_or_fetch(
        server, r == 0 ? member(0, 2, 800ms, "job-a") : member(1, 2, 3000ms, "job-b"), "id");
  });
  REQUIRE(out[1].comm_error);
  CHECK(out[1].reason == CommError::Reason::kMismatch);
  CHECK(out[1].message.find("belongs to job 'job-a'") != std::string::npos);
  REQUIRE(out[0].comm_error);
  CHECK(out[0].reason == CommError::Reason::kTimeout);
  CHECK(out[0].message.find("turned away a rank 1 of another job") != std::string::npos);
}

TEST_CASE("tcp rendezvous: bad input is an error at once") {
  const auto t0 = Clock::now();
  CHECK_THROWS_WITH_AS(tcp_rendezvous_fetch("127.0.0.1", 0, member(1, 2, 10s)),
                       doctest::Contains("port 0 is not a TCP port; use 1..65535"), Error);
  CHECK_THROWS_WITH_AS(tcp_rendezvous_fetch("127.0.0.1", 99999, member(1, 2, 10s)),
                       doctest::Contains("port 99999 is not a TCP port"), Error);
  CHECK_THROWS_WITH_AS(tcp_rendezvous("127.0.0.1", 0, member(0, 2, 10s), "id", "127.0.0.1"),
                       doctest::Contains("port 0 is not a TCP port"), Error);
  CHECK_THROWS_WITH_AS(TcpRendezvousServer("127.0.0.1", -5),
                       doctest::Contains("port -5 is not a TCP port; use 0..65535"), Error);
  // Not looked up (no name service traffic): refused for its spelling.
  CHECK_THROWS_WITH_AS(tcp_rendezvous_fetch("no such host!", 4000, member(1, 2, 10s)),
                       doctest::Contains("'no such host!' is not a host name or IP address"), Error);
  CHECK_THROWS_WITH_AS(tcp_rendezvous_fetch("127.0.0.1", 4000, member(2, 2, 10s)),
                       doctest::Contains("rank 2 is not a rank of a world of 2"), Error);
  CHECK_THROWS_WITH_AS(tcp_rendezvous_fetch("127.0.0.1", 4000, member(1, 2, 0ms)),
                       doctest::Contains("timeout must be positive"), Error);
  CHECK_THROWS_WITH_AS(tcp_rendezvous_fetch("127.0.0.1", 4000, member(0, 2, 10s)),
                       doctest::Contains("rank 0 serves the blob"), Error);
  CHECK(ms_since(t0) < 1000);
}

TEST_CASE("tcp rendezvous: a port in use is named, with what to do") {
  TcpRendezvousServer first("127.0.0.1", 0);
  CHECK_THROWS_WITH_AS(TcpRendezvousServer("127.0.0.1", first.port()),
                       doctest::Contains("Address already in use. Another process holds the port"),
                       Error);
}

// ---------------------------------------------------------------- file

TEST_CASE("file rendezvous: 4 ranks get rank 0's blob, and nothing is left behind") {
  TempDir dir;
  const std::string path = dir.file("rdv");
  const std::string blob = sample_blob();
  for (bool rank0_last : {false, true}) {
    CAPTURE(rank0_last);
    const auto out = run_ranks(
        4, [&](int r) { return file_rendezvous(path, member(r, 4, 5000ms, "job-1"), r == 0 ? blob : ""); },
        [&](int r) { return rank0_last && r == 0 ? 300ms : 0ms; });
    check_every_rank_got(out, blob);
    CHECK(dir.entries() == 0);
  }
}

TEST_CASE("file rendezvous: a world of 1 needs nobody") {
  TempDir dir;
  CHECK(file_rendezvous(dir.file("rdv"), member(0, 1, 100ms), "id") == "id");
  CHECK(dir.entries() == 0);
}

TEST_CASE("file rendezvous: a rank whose rank 0 never comes times out in time, saying where") {
  TempDir dir;
  const std::string path = dir.file("rdv");
  const auto t0 = Clock::now();
  const auto out = run_ranks(1, [&](int) { return file_rendezvous(path, member(1, 2, 600ms), ""); });
  CHECK(ms_since(t0) < 2000);
  REQUIRE(out[0].comm_error);
  CHECK(out[0].reason == CommError::Reason::kTimeout);
  const std::string prefix = "file rendezvous at " + path + " timed out on rank 1 of 2 after ";
  CHECK_MESSAGE(out[0].message.rfind(prefix, 0) == 0, out[0].message);
  CHECK(out[0].message.find("the file never appeared") != std::string::npos);
}

TEST_CASE("file rendezvous: rank 0 times out naming the ranks that did not come, and cleans up") {
  TempDir dir;
  const std::string path = dir.file("rdv");
  const auto out = run_ranks(2, [&](int r) { return file_rendezvous(path, member(r, 3, 700ms), "id"); });
  CHECK_FALSE(out[1].threw);
  REQUIRE(out[0].comm_error);
  CHECK(out[0].reason == CommError::Reason::kTimeout);
  CHECK(out[0].message.find("timed out on rank 0 of 3") != std::string::npos);
  CHECK_MESSAGE(out[0].message.find("rank 1 took the file, rank 2 did not") != std::string::npos, out[0].message);
  CHECK(dir.entries() == 0);
}

TEST_CASE("file rendezvous: a leftover file is never taken for this run's") {
  TempDir dir;
  const std::string path = dir.file("rdv");
  {
    std::ofstream junk(path);
    junk << "an earlier run's remains";
  }
  SUBCASE("rank 0 replaces it") {
    const auto out = run_ranks(
        3, [&](int r) { return file_rendezvous(path, member(r, 3, 5000ms), r == 0 ? "new" : ""); },
        [](int r) { return r == 0 ? 300ms : 0ms; });
    check_every_rank_got(out, "new");
  }
  SUBCASE("without rank 0 the others say what they found") {
    const auto out = run_ranks(1, [&](int) { return file_rendezvous(path, member(1, 2, 300ms), ""); });
    REQUIRE(out[0].comm_error);
    CHECK(out[0].message.find("the file there is not a ZEST rendezvous file") != std::string::npos);
  }
}

TEST_CASE("file rendezvous: another job's file is not taken") {
  TempDir dir;
  const std::string path = dir.file("rdv");
  // Rank 0 of job A publishes; a rank of job B must not take it.
  const auto out = run_ranks(2, [&](int r) {
    return file_rendezvous(path, member(r, 2, 800ms, r == 0 ? "job-a" : "job-b"), "a's id");
  });
  REQUIRE(out[1].comm_error);
  CHECK(out[1].reason == CommError::Reason::kTimeout);
  CHECK_MESSAGE(out[1].message.find("only a file of job 'job-a' was there, and this rank has job 'job-b'") !=
                    std::string::npos,
                out[1].message);
  REQUIRE(out[0].comm_error);
  CHECK(out[0].reason == CommError::Reason::kTimeout);
}

TEST_CASE("file rendezvous: mismatched world sizes of one job fail on both sides") {
  TempDir dir;
  const std::string path = dir.file("rdv");
  const auto out = run_ranks(2, [&](int r) {
    return file_rendezvous(path, member(r, r == 0 ? 2 : 3, 3000ms, "job-1"), "id");
  });
  REQUIRE(out[1].comm_error);
  CHECK(out[1].reason == CommError::Reason::kMismatch);
  CHECK(out[1].message.find("rank 0 was started for a world of 2 ranks but rank 1 for 3") != std::string::npos);
  REQUIRE(out[0].comm_error);
  CHECK(out[0].reason == CommError::Reason::kMismatch);
  CHECK_MESSAGE(out[0].message.find("rank 1 was started for a world of 3 ranks but rank 0 for 2") !=
                    std::string::npos,
                out[0].message);
  CHECK(dir.entries() == 0);
}

TEST_CASE("file rendezvous: a path that cannot be used is an error at once") {
  TempDir dir;
  const auto t0 = Clock::now();
  CHECK_THROWS_WITH_AS(file_rendezvous(dir.file("missing/rdv"), member(0, 2, 10s), "id"),
                       doctest::Contains(("its directory " + dir.file("missing") + ": No such file or directory").c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(file_rendezvous(dir.file("missing/rdv"), member(1, 2, 10s), ""),
                       doctest::Contains("create the directory"), Error);
  {
    std::ofstream plain(dir.file("plain"));
  }
  CHECK_THROWS_WITH_AS(file_rendezvous(dir.file("plain/rdv"), member(0, 2, 10s), "id"),
                       doctest::Contains("plain is not a directory"), Error);
  CHECK_THROWS_WITH_AS(file_rendezvous("", member(0, 2, 10s), "id"),
                       doctest::Contains("does not name a file"), Error);
  CHECK_THROWS_WITH_AS(file_rendezvous(dir.file("d/"), member(0, 2, 10s), "id"),
                       doctest::Contains("does not name a file"), Error);
  CHECK_THROWS_WITH_AS(file_rendezvous(dir.file("rdv"), member(0, 2, 10s), std::string(100000, 'x')),
                       doctest::Contains("more than the 65536 a rendezvous carries"), Error);
  if (::geteuid() != 0) {  // root writes anywhere
    std::filesystem::create_directory(dir.path / "ro");
    std::filesystem::permissions(dir.path / "ro", std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    CHECK_THROWS_WITH_AS(file_rendezvous(dir.file("ro/rdv"), member(0, 2, 10s), "id"),
                         doctest::Contains("Permission denied"), Error);
    std::filesystem::permissions(dir.path / "ro", std::filesystem::perms::owner_all);
  }
  CHECK(ms_since(t0) < 1000);
}

// ---------------------------------------------------------------- bootstrap

TEST_CASE("share_from_rank0 takes TCP at MASTER_ADDR, under torchrun next to its store") {
  const int port = pick_free_loopback_port();
  const std::string blob = sample_blob();
  const auto out = run_ranks(3, [&](int r) {
    const EnvLookup lookup = env_from_map({{"RANK", std::to_string(r)}, {"WORLD_SIZE", "3"},
                                           {"MASTER_ADDR", "127.0.0.1"},
                                           {"MASTER_PORT", std::to_string(port - 1)},
                                           {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                           {"TORCHELASTIC_RUN_ID", "t1"}});
    const LaunchEnv env = detect_launch_env(lookup);
    REQUIRE(env.rendezvous_port == port);
    return share_from_rank0(env, lookup, r == 0 ? blob : "", 5000ms);
  });
  check_every_rank_got(out, blob);
}

TEST_CASE("share_from_rank0 takes ZEST_RENDEZVOUS_FILE without MASTER_ADDR") {
  TempDir dir;
  const std::string blob = sample_blob();
  const auto out = run_ranks(3, [&](int r) {
    const EnvLookup lookup = env_from_map({{"SLURM_PROCID", std::to_string(r)}, {"SLURM_NTASKS", "3"},
                                           {"SLURM_NNODES", "1"}, {"SLURM_JOB_ID", "77"},
                                           {"ZEST_RENDEZVOUS_FILE", dir.file("id")}});
    return share_from_rank0(detect_launch_env(lookup), lookup, r == 0 ? blob : "", 5000ms);
  });
  check_every_rank_got(out, blob);
}

TEST_CASE("share_from_rank0 says what to set when the job has no way to meet") {
  const EnvLookup lookup = env_from_map({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_NNODES", "1"}});
  CHECK_THROWS_WITH_AS(share_from_rank0(detect_launch_env(lookup), lookup, "", 1000ms),
                       doctest::Contains("has no way to meet rank 0: set MASTER_ADDR and MASTER_PORT"),
                       Error);
  // One rank needs nobody.
  CHECK(share_from_rank0(LaunchEnv{}, env_from_map({}), "id", 1000ms) == "id");
}

TEST_CASE("init_distributed: one process on the host is a 1-rank in-process communicator") {
  std::unique_ptr<Communicator> comm = init_distributed(Device::host(), CommOptions{}, env_from_map({}));
  REQUIRE(comm != nullptr);
  CHECK(comm->backend_name() == "in-process");
  CHECK(comm->rank() == 0);
  CHECK(comm->size() == 1);
  float x = 3.0f;
  comm->all_reduce(&x, &x, 1, DType::kFloat32, ReduceOp::kSum, Stream::default_for(Device::host()));
  CHECK(x == 3.0f);
}

TEST_CASE("init_distributed: what cannot work says so before waiting for anyone") {
  const auto t0 = Clock::now();
  CHECK_THROWS_WITH_AS(
      init_distributed(Device::host(), CommOptions{},
                       env_from_map({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                                     {"MASTER_PORT", "4000"}})),
      doctest::Contains("host multi-process runs need the MPI backend"), Error);
  // No GPU here (or no CUDA in this build): refused on every rank alike.
  if (cuda_device_count() == 0) {
    CHECK_THROWS_AS(init_distributed(Device::cuda(0), CommOptions{}, env_from_map({})), Error);
  }
  CHECK_THROWS_WITH_AS(init_distributed(Device::host(), CommOptions{}, env_from_map({{"RANK", "zero"}})),
                       doctest::Contains("RANK='zero'"), Error);
  CHECK(ms_since(t0) < 1000);
}
