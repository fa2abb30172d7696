// API misuse ends in a zest::Error that says what was wrong and what to do.
#include <doctest/doctest.h>

#include "engine_harness.h"

using namespace zest;
using namespace zest::test;

namespace {

struct OneRank {
  CachingAllocator alloc{make_host_allocator()};
  std::unique_ptr<Communicator> comm = std::move(make_inprocess_group(1)[0]);
  Engine engine;
  explicit OneRank(EngineConfig config = base_config(0))
      : engine(config, *comm, alloc, Stream::default_for(Device::host())) {}
};

}  // namespace

TEST_CASE("registration mistakes are named") {
  OneRank r;
  r.engine.add_unit("a", {{"x", {3}}});
  r.engine.add_unit("a", {{"y", {3}}});
  CHECK_THROWS_WITH_AS(r.engine.finalize(init_values), doctest::Contains("unit 'a' registered twice"), Error);

  OneRank dup;
  dup.engine.add_unit("a", {{"x", {3}}});
  dup.engine.add_unit("b", {{"x", {4}}});
  CHECK_THROWS_WITH_AS(dup.engine.finalize(init_values),
                       doctest::Contains("parameter 'x' registered twice (again in unit 'b')"), Error);

  OneRank shape;
  shape.engine.add_unit("a", {{"x", {3, 0}}});
  CHECK_THROWS_WITH_AS(shape.engine.finalize(init_values),
                       doctest::Contains("has shape [3, 0]: every dimension must be positive"), Error);

  OneRank group;
  group.engine.add_unit("a", {{"x", {3}, "no_decay"}});
  CHECK_THROWS_WITH_AS(group.engine.finalize(init_values),
                       doctest::Contains("group 'no_decay', which was not declared"), Error);

  OneRank none;
  CHECK_THROWS_WITH_AS(none.engine.finalize(init_values), doctest::Contains("no unit registered"), Error);
}

TEST_CASE("a host stream with a thread of its own is refused as the engine's stream") {
  // The optimizer runs in the caller's thread on the host: on such a stream
  // it would race with the copies and reductions queued there.
  CachingAllocator alloc(make_host_allocator());
  std::unique_ptr<Communicator> comm = std::move(make_inprocess_group(1)[0]);
  const OwnedStream queue(Device::host(), HostWork::kOwnThread);
  CHECK_THROWS_WITH_AS(Engine(base_config(2), *comm, alloc, queue.get()),
                       doctest::Contains("give it an inline stream"), Error);
  const OwnedStream inline_stream(Device::host());
  CHECK_NOTHROW(Engine(base_config(2), *comm, alloc, inline_stream.get()));
}

TEST_CASE("registering after finalize, and using the engine before it") {
  OneRank r;
  register_model(r.engine);
  CHECK_THROWS_WITH_AS(r.engine.gather(0), doctest::Contains("call finalize() first"), Error);
  CHECK_THROWS_WITH_AS(r.engine.step(), doctest::Contains("call finalize() first"), Error);
  r.engine.finalize(init_values);
  CHECK_THROWS_WITH_AS(r.engine.add_unit("late", {{"late.w", {2}}}),
                       doctest::Contains("add_unit('late') after finalize()"), Error);
  CHECK_THROWS_WITH_AS(r.engine.add_param_group("late", 0.0f),
                       doctest::Contains("after finalize()"), Error);
  CHECK_THROWS_WITH_AS(r.engine.finalize(init_values), doctest::Contains("finalize() called twice"), Error);
}

TEST_CASE("gradients of a unit that is not gathered, unknown names, wrong dtypes") {
  OneRank r(base_config(3));
  register_model(r.engine);
  r.engine.finalize(init_values);
  CHECK_THROWS_WITH_AS(r.engine.grads(1), doctest::Contains("grads() of unit 'b', which is not gathered"),
                       Error);
  UnitHandle h = r.engine.gather(1);
  CHECK_THROWS_WITH_AS(h.param<float>("nope"), doctest::Contains("no parameter named 'nope'"), Error);
  CHECK_THROWS_WITH_AS(h.param<float>("a.w"),
                       doctest::Contains("parameter 'a.w' belongs to unit 'a', not to unit 'b'"), Error);
  CHECK_THROWS_WITH_AS(h.param<bf16>("b.w"), doctest::Contains("is fp32, not bf16"), Error);
  CHECK_THROWS_WITH_AS(r.engine.gather(7), doctest::Contains("unit index 7 is out of range: 3 units"),
                       Error);
  GradHandle g = r.engine.grads(1);
  CHECK(g.grad<float>("b.w").size() == 35);
  g.done();
  CHECK_THROWS_WITH_AS(g.grad<float>("b.w"), doctest::Contains("used after done()"), Error);
  CHECK_THROWS_WITH_AS(g.done(), doctest::Contains("done() of unit 'b' twice"), Error);
  CHECK_THROWS_WITH_AS(r.engine.grads(1), doctest::Contains("after its done() in this micro-step"), Error);
}

TEST_CASE("step without gradients, with some units missing, or with a unit still gathered") {
  OneRank r;
  register_model(r.engine);
  r.engine.finalize(init_values);
  CHECK_THROWS_WITH_AS(r.engine.step(), doctest::Contains("step() without gradients"), Error);
  {
    UnitHandle h = r.engine.gather(0);
    r.engine.grads(0).done();
  }
  CHECK_THROWS_WITH_AS(r.engine.step(),
                       doctest::Contains("the gradients of unit 'b' are not done in this micro-step (1 of 3"),
                       Error);
  UnitHandle b = r.engine.gather(1);
  r.engine.grads(1).done();
  UnitHandle c = r.engine.gather(2);
  r.engine.grads(2).done();
  CHECK_THROWS_WITH_AS(r.engine.step(), doctest::Contains("step() while unit 'b' is gathered"), Error);
  b.release();
  c.release();
  CHECK(r.engine.step().applied);
}

TEST_CASE("ranks that registered different models fail naming the first difference") {
  CommOptions options;
  options.timeout = std::chrono::seconds(20);
  CHECK_THROWS_WITH_AS(
      run_inprocess(
          3,
          [](Communicator& comm) {
            CachingAllocator alloc(make_host_allocator());
            Engine engine(base_config(1), comm, alloc, Stream::default_for(Device::host()));
            engine.add_unit("a", {{"a.w", {4, comm.rank() == 2 ? 5 : 6}}});
            engine.finalize(init_values);
          },
          Device::host(), options),
      doctest::Contains("rank 0 and rank 2 differ at line 3: 'param a.w [4, 6] group default' against "
                        "'param a.w [4, 5] group default'"),
      Error);
}

TEST_CASE("bad configurations are refused") {
  EngineConfig c = base_config(0);
  c.fp16.enabled = true;
  c.bf16 = true;
  CHECK_THROWS_WITH_AS(OneRank{c}, doctest::Contains("choose one compute dtype"), Error);
  c = base_config(4);
  CHECK_THROWS_WITH_AS(OneRank{c}, doctest::Contains("allowed values are 0, 1, 2 and 3"), Error);
}
