// Mistakes that used to pass silently or crash: ranks with different
// hyper-parameters, stage-3 gathers of different units on different ranks,
// handles and engines outliving what they borrow, and errors quoted twice.
#include <doctest/doctest.h>

#include <memory>
#include <string>

#include "engine/engine_harness.h"
#include "zest/checkpoint/detail/on_every_rank.h"

using namespace zest;
using namespace zest::test;

namespace {

CommOptions seconds(int s) {
  CommOptions o;
  o.timeout = std::chrono::seconds(s);
  return o;
}

// finalize() on 2 ranks whose configurations differ as `tweak` makes rank 1's;
// returns the error rank 0 got.
std::string finalize_with(const std::function<void(EngineConfig&)>& tweak) {
  std::string error;
  try {
    run_inprocess(2, [&](Communicator& comm) {
      EngineConfig config = base_config(2);
      if (comm.rank() == 1) tweak(config);
      CachingAllocator alloc(make_host_allocator());
      Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
      register_model(engine);
      engine.finalize(init_values);
    }, Device::host(), seconds(20));
  } catch (const Error& e) {
    error = e.message();
  }
  return error;
}

}  // namespace

TEST_CASE("ranks with different hyper-parameters fail at finalize naming the line") {
  const std::string lr = finalize_with([](EngineConfig& c) { c.optimizer.lr = 0.02f; });
  CAPTURE(lr);
  CHECK(lr.find("rank 0 and rank 1 differ at line") != std::string::npos);
  CHECK(lr.find("'config optimizer AdamW lr 0.01 weight_decay 0.05 betas [0.9, 0.999] eps 1e-08") !=
        std::string::npos);
  CHECK(lr.find("against 'config optimizer AdamW lr 0.02 weight_decay") != std::string::npos);

  const std::string clip = finalize_with([](EngineConfig& c) { c.gradient_clipping = 1.0; });
  CHECK(clip.find("gradient_clipping 0' against 'config stage 2 compute fp32 "
                  "gradient_accumulation_steps 1 grad_accum_dtype fp32 gradient_clipping 1'") != std::string::npos);
  const std::string betas = finalize_with([](EngineConfig& c) { c.optimizer.beta2 = 0.99f; });
  CHECK(betas.find("betas [0.9, 0.99]") != std::string::npos);
  const std::string eps = finalize_with([](EngineConfig& c) { c.optimizer.eps = 1e-6f; });
  CHECK(eps.find("eps 1e-06") != std::string::npos);
  const std::string scale = finalize_with([](EngineConfig& c) {
    c.fp16.enabled = true;
    c.fp16.loss_scale = 128;
  });
  CHECK(scale.find("differ at line") != std::string::npos);
  CHECK(finalize_with([](EngineConfig&) {}).empty());
}

TEST_CASE("stage 3: ranks gathering different units of one size fail naming both") {
  std::vector<std::string> errors(2);
  CHECK_THROWS_AS(
      run_inprocess(2, [&](Communicator& comm) {
        EngineConfig config = base_config(3);
        CachingAllocator alloc(make_host_allocator());
        Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
        engine.add_unit("encoder", {{"encoder.w", {4, 6}}});
        engine.add_unit("decoder", {{"decoder.w", {6, 4}}});
        engine.finalize(init_values);
        try {
          UnitHandle h = engine.gather(comm.rank() == 0 ? 0 : 1);
        } catch (const CommError& e) {
          CHECK(e.reason() == CommError::Reason::kMismatch);
          errors[static_cast<size_t>(comm.rank())] = e.message();
          throw;
        }
      }, Device::host(), seconds(20)),
      CommError);
  // The first rank to arrive may be either; whichever detected it names both.
  const std::string& e = errors[0].find("tag 2") != std::string::npos ? errors[0] : errors[1];
  CAPTURE(errors[0]);
  CAPTURE(errors[1]);
  CHECK(e.find("stage 3: the ranks gathered different units (") != std::string::npos);
  CHECK(e.find("tag 1 is unit 'encoder'") != std::string::npos);
  CHECK(e.find("tag 2 is unit 'decoder'") != std::string::npos);
  CHECK(e.find("rank 0 called all_gather #2 (256 x fp32, tag 1)") != std::string::npos);
  CHECK(e.find("rank 1 called all_gather #2 (256 x fp32, tag 2)") != std::string::npos);
}

TEST_CASE("stage 3: the same units in the same order still gather") {
  run_inprocess(2, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(base_config(3), comm, alloc, Stream::default_for(Device::host()));
    engine.add_unit("encoder", {{"encoder.w", {4, 6}}});
    engine.add_unit("decoder", {{"decoder.w", {6, 4}}});
    engine.finalize(init_values);
    for (int u : {0, 1}) {
      UnitHandle h = engine.gather(u);
      CHECK(h.param<float>(u == 0 ? "encoder.w" : "decoder.w").size() == 24);
    }
  }, Device::host(), seconds(20));
}

TEST_CASE("handles that outlive their engine fail on use and are harmless to destroy") {
  auto comms = make_inprocess_group(1);
  CachingAllocator alloc(make_host_allocator());
  UnitHandle unit;
  GradHandle grads;
  {
    Engine engine(base_config(3), *comms[0], alloc, Stream::default_for(Device::host()));
    register_model(engine);
    engine.finalize(init_values);
    unit = engine.gather(0);
    grads = engine.grads(0);
    CHECK(unit.param<float>("a.w").size() == 91);
  }
  CHECK_THROWS_WITH_AS(unit.param<float>("a.w"),
                       doctest::Contains("parameter 'a.w' read through the UnitHandle of unit 0, "
                                         "whose Engine has been destroyed"),
                       Error);
  CHECK_THROWS_WITH_AS(grads.grad<float>("a.w"),
                       doctest::Contains("gradient 'a.w' on the GradHandle of unit 0, whose "
                                         "Engine has been destroyed"),
                       Error);
  CHECK_THROWS_WITH_AS(grads.done(), doctest::Contains("whose Engine has been destroyed"), Error);
  unit.release();  // nothing to give back to: does nothing
  CHECK(!unit);
}

TEST_CASE("an engine whose allocator or communicator was destroyed first says so") {
  SUBCASE("allocator") {
    auto comms = make_inprocess_group(1);
    auto alloc = std::make_unique<CachingAllocator>(make_host_allocator());
    auto engine = std::make_unique<Engine>(base_config(1), *comms[0], *alloc,
                                           Stream::default_for(Device::host()));
    register_model(*engine);
    engine->finalize(init_values);
    UnitHandle h = engine->gather(0);
    alloc.reset();  // warns: the engine's buffers are still live
    CHECK_THROWS_WITH_AS(engine->gather(1),
                         doctest::Contains("the CachingAllocator this Engine was created with "
                                           "has been destroyed"),
                         Error);
    CHECK_THROWS_WITH_AS(engine->step(), doctest::Contains("has been destroyed"), Error);
    CHECK_THROWS_WITH_AS((void)engine->memory_report(), doctest::Contains("has been destroyed"),
                         Error);
    h.release();
    engine.reset();  // frees nothing into the destroyed allocator
  }
  SUBCASE("communicator") {
    auto comms = make_inprocess_group(1);
    CachingAllocator alloc(make_host_allocator());
    auto engine = std::make_unique<Engine>(base_config(2), *comms[0], alloc,
                                           Stream::default_for(Device::host()));
    register_model(*engine);
    engine->finalize(init_values);
    comms.clear();
    CHECK_THROWS_WITH_AS(engine->gather(0),
                         doctest::Contains("engine: the Communicator this Engine was created "
                                           "with has been destroyed"),
                         Error);
    CHECK_THROWS_WITH_AS(engine->step(), doctest::Contains("has been destroyed"), Error);
    engine.reset();
  }
}

TEST_CASE("an error agreed across ranks carries its rank once") {
  std::vector<std::string> shown(2);
  std::vector<std::string> text(2);
  CHECK_THROWS(run_inprocess(2, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(base_config(1), comm, alloc, Stream::default_for(Device::host()));
    register_model(engine);
    engine.finalize(init_values);
    try {
      on_every_rank(engine, "reading the shard", [&] {
        if (comm.rank() == 0) ZEST_FAIL("cannot open shard_00000.bin");
      });
    } catch (const Error& e) {
      shown[static_cast<size_t>(comm.rank())] = e.what();
      text[static_cast<size_t>(comm.rank())] = e.message();
      throw;
    }
  }, Device::host(), seconds(20)));
  CAPTURE(shown[0]);
  CAPTURE(shown[1]);
  CHECK(shown[0].rfind("[rank 0] cannot open shard_00000.bin (", 0) == 0);
  CHECK(text[0] == "cannot open shard_00000.bin");
  CHECK(shown[1].rfind("[rank 1] reading the shard failed on rank 0: cannot open "
                       "shard_00000.bin (", 0) == 0);
  for (const std::string& s : shown) CHECK(s.find("] [rank") == std::string::npos);
}
