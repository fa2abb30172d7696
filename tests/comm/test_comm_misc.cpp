// Sub-communicators, byte counters, grouping and argument checks.
#include <doctest/doctest.h>

#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "zest/comm/inprocess_comm.h"

using namespace zest;

namespace {

// A 1-rank backend whose group calls and collectives fail on demand, the way
// NCCL's do when ncclGroupEnd or an enqueue reports an error; otherwise it
// moves nothing. It counts the groups it was asked to start and end.
class ScriptedComm final : public Communicator {
 public:
  ScriptedComm() : Communicator(0, 1, Device::host(), CommOptions{}) {}
  std::string_view backend_name() const override { return "scripted"; }

  // A 1-element all_reduce on the host's stream.
  void all_reduce_one() {
    float x = 1.0f;
    all_reduce(&x, &x, 1, DType::kFloat32, ReduceOp::kSum, Stream::default_for(Device::host()));
  }

  bool fail_group_start = false;
  bool fail_group_end = false;
  bool fail_collectives = false;
  int groups_started = 0;
  int groups_ended = 0;

 protected:
  using Desc = CollectiveDesc;
  void do_all_reduce(const Desc&, const void*, void*, const Stream&) override { maybe_fail(); }
  void do_reduce_scatter(const Desc&, const void*, void*, const Stream&) override { maybe_fail(); }
  void do_all_gather(const Desc&, const void*, void*, const Stream&) override { maybe_fail(); }
  void do_broadcast(const Desc&, const void*, void*, const Stream&) override { maybe_fail(); }
  void do_barrier(const Desc&, const Stream&) override { maybe_fail(); }
  void do_group_start() override {
    if (fail_group_start) throw Error("the backend could not start a group", __FILE__, __LINE__);
    ++groups_started;
  }
  void do_group_end() override {
    ++groups_ended;
    if (fail_group_end) {
      throw CommError(CommError::Reason::kBackend, "launching the group failed", __FILE__, __LINE__);
    }
  }
  std::unique_ptr<Communicator> do_split(const Desc&, int, int, bool) override { return nullptr; }

 private:
  void maybe_fail() const {
    if (fail_collectives) {
      throw CommError(CommError::Reason::kBackend, "the link went down", __FILE__, __LINE__);
    }
  }
};

}  // namespace

TEST_CASE("split makes groups by color, ordered by key") {
  run_inprocess(4, [](Communicator& comm) {
    OwnedStream stream(Device::host());
    // Even and odd ranks, each group in reverse rank order.
    std::unique_ptr<Communicator> half = comm.split(comm.rank() % 2, -comm.rank());
    REQUIRE(half != nullptr);
    CHECK(half->size() == 2);
    CHECK(half->rank() == (comm.rank() < 2 ? 1 : 0));
    int32_t v = comm.rank();
    half->all_reduce(&v, &v, 1, DType::kInt32, ReduceOp::kSum, stream);
    CHECK(v == (comm.rank() % 2 == 0 ? 0 + 2 : 1 + 3));
    // The parent keeps working, and its numbering counts the split.
    CHECK(comm.sequence() == 1);
    int32_t all = 1;
    comm.all_reduce(&all, &all, 1, DType::kInt32, ReduceOp::kSum, stream);
    CHECK(all == 4);
    // A rank may stay out of a split; a child can be split again.
    std::unique_ptr<Communicator> some = comm.split(comm.rank() == 3 ? -1 : 0, comm.rank());
    CHECK((some == nullptr) == (comm.rank() == 3));
    if (some) {
      CHECK(some->size() == 3);
      std::unique_ptr<Communicator> single = some->split(some->rank(), 0);
      CHECK(single->size() == 1);
      float f = 2.5f;
      single->all_reduce(&f, &f, 1, DType::kFloat32, ReduceOp::kAvg, stream);
      CHECK(f == 2.5f);
    }
  });
}

TEST_CASE("counters follow the ring model per operation kind") {
  std::mutex m;
  std::vector<CommCounters> seen(4);
  run_inprocess(4, [&](Communicator& comm) {
    OwnedStream stream(Device::host());
    std::vector<float> big(400), part(100);
    comm.all_reduce(big.data(), big.data(), 400, DType::kFloat32, ReduceOp::kSum, stream);
    comm.reduce_scatter(big.data(), part.data(), 100, DType::kFloat32, ReduceOp::kSum, stream);
    comm.all_gather(part.data(), big.data(), 100, DType::kFloat32, stream);
    std::vector<bf16> h(64);
    comm.broadcast(h.data(), h.data(), 64, DType::kBFloat16, 2, stream);
    std::lock_guard<std::mutex> lock(m);
    seen[comm.rank()] = comm.counters();
  });
  for (int r = 0; r < 4; ++r) {
    const CommCounters& c = seen[r];
    CHECK(c[CollectiveKind::kAllReduce].calls == 1);
    CHECK(c[CollectiveKind::kAllReduce].elements == 400);
    CHECK(c[CollectiveKind::kAllReduce].bytes_sent == 2.0 * 3 / 4 * 1600);
    CHECK(c[CollectiveKind::kReduceScatter].elements == 400);
    CHECK(c[CollectiveKind::kReduceScatter].bytes_sent == 3 * 400);
    CHECK(c[CollectiveKind::kAllGather].bytes_received == 3 * 400);
    CHECK(c[CollectiveKind::kBroadcast].bytes_sent == (r == 2 ? 128 : 0));
    CHECK(c[CollectiveKind::kBroadcast].bytes_received == (r == 2 ? 0 : 128));
    CHECK(c.total_bytes_sent() == 2400 + 1200 + 1200 + (r == 2 ? 128 : 0));
  }
  run_inprocess(1, [](Communicator& comm) {
    float x = 1;
    comm.all_reduce(&x, &x, 1, DType::kFloat32, ReduceOp::kSum, Stream::default_for(Device::host()));
    CHECK(comm.counters()[CollectiveKind::kAllReduce].calls == 1);
    CHECK(comm.counters().total_bytes_sent() == 0);  // one rank moves nothing
  });
}

TEST_CASE("bad arguments get clear errors before any rank waits") {
  run_inprocess(2, [](Communicator& comm) {
    OwnedStream stream(Device::host());
    int32_t i = 0;
    float f[4] = {};
    CHECK_THROWS_WITH_AS(comm.all_reduce(&i, &i, 1, DType::kInt32, ReduceOp::kAvg, stream),
                         doctest::Contains("avg is defined for floating types only"), Error);
    CHECK_THROWS_WITH_AS(comm.broadcast(f, f, 4, DType::kFloat32, 2, stream),
                         doctest::Contains("root 2 is not a rank of this communicator (0..1)"), Error);
    CHECK_THROWS_WITH_AS(comm.all_reduce(nullptr, f, 4, DType::kFloat32, ReduceOp::kSum, stream),
                         doctest::Contains("must not be null"), Error);
    CHECK_THROWS_WITH_AS(comm.reduce_scatter(f, f + 1, 2, DType::kFloat32, ReduceOp::kSum, stream),
                         doctest::Contains("recv overlaps send"), Error);
    CHECK_THROWS_WITH_AS(comm.group_end(), doctest::Contains("without a matching group_start"), Error);
    CHECK(comm.sequence() == 0);
    // Grouped operations still complete; non-roots may pass no send buffer.
    comm.group_start();
    comm.group_start();
    float v = static_cast<float>(comm.rank() + 1);
    comm.all_reduce(&v, &v, 1, DType::kFloat32, ReduceOp::kMax, stream);
    comm.group_end();
    comm.group_end();
    CHECK(v == 2.0f);
    float got = 0;
    const float seven = 7;
    comm.broadcast(comm.rank() == 0 ? &seven : nullptr, &got, 1, DType::kFloat32, 0, stream);
    CHECK(got == 7.0f);
  });
  CHECK_THROWS_WITH_AS(make_inprocess_group(0), doctest::Contains("1 to 4096 ranks"), Error);
  CommOptions zero;
  zero.timeout = std::chrono::milliseconds(0);
  CHECK_THROWS_WITH_AS(make_inprocess_group(2, Device::host(), zero),
                       doctest::Contains("timeout must be positive"), Error);
  CommOptions negative_spin;
  negative_spin.spin = std::chrono::microseconds(-1);
  CHECK_THROWS_WITH_AS(make_inprocess_group(2, Device::host(), negative_spin),
                       doctest::Contains("CommOptions::spin must be between 0 and the timeout"), Error);
  CommOptions zero_init;
  zero_init.init_timeout = std::chrono::milliseconds(0);
  CHECK_THROWS_WITH_AS(make_inprocess_group(2, Device::host(), zero_init),
                       doctest::Contains("CommOptions::init_timeout must be positive, got 0 ms"), Error);
}

TEST_CASE("a failing group_end aborts the communicator, and every later call says why") {
  ScriptedComm comm;
  comm.fail_group_end = true;
  comm.group_start();
  comm.all_reduce_one();
  CHECK_THROWS_WITH_AS(comm.group_end(), doctest::Contains("launching the group failed"), CommError);
  CHECK(comm.aborted());
  CHECK(comm.abort_reason() == "launching the group failed");
  CHECK(comm.groups_ended == 1);
  // The group is closed: nothing below is "inside a group" or unmatched.
  const std::string why = "aborted by an earlier failure: launching the group failed";
  CHECK_THROWS_WITH_AS(comm.all_reduce_one(), doctest::Contains(why.c_str()), CommError);
  CHECK_THROWS_WITH_AS(comm.split(0, 0), doctest::Contains(why.c_str()), CommError);
  CHECK_THROWS_WITH_AS(comm.group_start(), doctest::Contains(why.c_str()), CommError);
  CHECK_THROWS_WITH_AS(comm.group_end(), doctest::Contains(why.c_str()), CommError);
  CHECK(comm.groups_started == 1);
  CHECK(comm.groups_ended == 1);
}

TEST_CASE("a collective failing inside a group closes the group with the abort") {
  ScriptedComm comm;
  comm.fail_collectives = true;
  comm.group_start();
  comm.group_start();
  CHECK_THROWS_WITH_AS(comm.all_reduce_one(), doctest::Contains("the link went down"), CommError);
  CHECK(comm.aborted());
  // The backend's group was ended at once (NCCL's is per-thread state that
  // would swallow this thread's later calls), and only once.
  CHECK(comm.groups_ended == 1);
  const std::string why = "aborted by an earlier failure: the link went down";
  CHECK_THROWS_WITH_AS(comm.group_end(), doctest::Contains(why.c_str()), CommError);
  CHECK_THROWS_WITH_AS(comm.group_end(), doctest::Contains(why.c_str()), CommError);
  CHECK(comm.groups_ended == 1);
}

TEST_CASE("a group that the backend could not start is not left open") {
  ScriptedComm comm;
  comm.fail_group_start = true;
  CHECK_THROWS_WITH_AS(comm.group_start(), doctest::Contains("could not start a group"), Error);
  CHECK(comm.aborted());
  CHECK(comm.groups_ended == 0);  // nothing was started, so nothing is ended
  const std::string why = "aborted by an earlier failure: the backend could not start a group";
  CHECK_THROWS_WITH_AS(comm.split(0, 0), doctest::Contains(why.c_str()), CommError);
  CHECK_THROWS_WITH_AS(comm.group_end(), doctest::Contains(why.c_str()), CommError);
  CHECK(comm.groups_ended == 0);
}

namespace {

// Restores an environment variable as it was, whatever the checks do.
struct EnvRestore {
  const char* name;
  std::optional<std::string> old;
  explicit EnvRestore(const char* n) : name(n) {
    if (const char* v = std::getenv(name)) old = v;
  }
  ~EnvRestore() {
    if (old) {
      ::setenv(name, old->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  EnvRestore(const EnvRestore&) = delete;
  EnvRestore& operator=(const EnvRestore&) = delete;
};

}  // namespace

TEST_CASE("ZEST_COMM_TIMEOUT sets the default timeout, and a bad value is named") {
  // Restores the variable as it was, whatever the checks do.
  const EnvRestore restore("ZEST_COMM_TIMEOUT");
  ::unsetenv("ZEST_COMM_TIMEOUT");
  CHECK(CommOptions{}.timeout == std::chrono::minutes(10));
  ::setenv("ZEST_COMM_TIMEOUT", "", 1);
  CHECK(CommOptions{}.timeout == std::chrono::minutes(10));
  ::setenv("ZEST_COMM_TIMEOUT", "2.5", 1);
  CHECK(CommOptions{}.timeout == std::chrono::milliseconds(2500));
  ::setenv("ZEST_COMM_TIMEOUT", "30", 1);
  CHECK(CommOptions{}.timeout == std::chrono::seconds(30));
  // What every backend's default is: the in-process group's here.
  CHECK(make_inprocess_group(2)[1]->options().timeout == std::chrono::seconds(30));
  for (const char* bad : {"abc", "0", "-1", "inf", "nan", "1e7", "5s", "0.0001"}) {
    CAPTURE(bad);
    ::setenv("ZEST_COMM_TIMEOUT", bad, 1);
    const std::string expected =
        fmt::format("ZEST_COMM_TIMEOUT is '{}', not a number of seconds from 0.001 to 1e6", bad);
    CHECK_THROWS_WITH_AS(static_cast<void>(CommOptions{}), doctest::Contains(expected.c_str()), Error);
  }
}

TEST_CASE("creation and split have a timeout of their own, from ZEST_COMM_INIT_TIMEOUT") {
  const EnvRestore restore_init("ZEST_COMM_INIT_TIMEOUT");
  const EnvRestore restore("ZEST_COMM_TIMEOUT");
  ::unsetenv("ZEST_COMM_INIT_TIMEOUT");
  // A short collective timeout (the NCCL watchdog test's) leaves creation
  // its own, longer one.
  ::setenv("ZEST_COMM_TIMEOUT", "0.5", 1);
  CHECK(CommOptions{}.timeout == std::chrono::milliseconds(500));
  CHECK(CommOptions{}.init_timeout == std::chrono::minutes(10));
  CHECK(CommOptions{std::chrono::milliseconds(500)}.init_timeout == std::chrono::minutes(10));
  ::setenv("ZEST_COMM_INIT_TIMEOUT", "", 1);
  CHECK(CommOptions{}.init_timeout == std::chrono::minutes(10));
  ::setenv("ZEST_COMM_INIT_TIMEOUT", "90.25", 1);
  CHECK(CommOptions{}.init_timeout == std::chrono::milliseconds(90250));
  CHECK(CommOptions{}.timeout == std::chrono::milliseconds(500));
  CHECK(make_inprocess_group(2)[0]->options().init_timeout == std::chrono::milliseconds(90250));
  for (const char* bad : {"abc", "0", "-3", "inf", "1e7", "10m"}) {
    CAPTURE(bad);
    ::setenv("ZEST_COMM_INIT_TIMEOUT", bad, 1);
    const std::string expected =
        fmt::format("ZEST_COMM_INIT_TIMEOUT is '{}', not a number of seconds from 0.001 to 1e6", bad);
    CHECK_THROWS_WITH_AS(static_cast<void>(CommOptions{}), doctest::Contains(expected.c_str()), Error);
  }
}
