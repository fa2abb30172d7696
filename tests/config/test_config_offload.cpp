// zero_optimization.offload_optimizer / offload_param and their deprecated
// forms, read with DeepSpeed's semantics (deepspeed/runtime/zero/config.py
// and offload_config.py): defaults, the stages at which each acts, the ratio
// check, "nvme" with its keys, NVMe-only keys noted with other devices, and
// the aio section.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <string>

#include "zest/config/config.h"
#include "config_test_helpers.h"

using namespace zest;
using zest::test::error_of;
using zest::test::ignored_reason;

TEST_CASE("offload defaults are DeepSpeed's") {
  // DeepSpeedZeroOffloadOptimizerConfig: pin_memory False, ratio 1.0;
  // DeepSpeedZeroOffloadParamConfig: buffer_count 5, buffer_size 1e8,
  // max_in_cpu 1e9, pin_memory False; device "none" in both.
  const EngineConfig c = test::parse("{}");
  CHECK(c.offload_optimizer.device == OffloadDevice::kNone);
  CHECK_FALSE(c.offload_optimizer.pin_memory);
  CHECK(c.offload_optimizer.ratio == 1.0);
  CHECK_FALSE(c.offload_optimizer.delayed_update);
  CHECK(c.offload_param.device == OffloadDevice::kNone);
  CHECK_FALSE(c.offload_param.pin_memory);
  CHECK(c.offload_param.buffer_count == 5);
  CHECK(c.offload_param.buffer_size == 100'000'000);
  CHECK(c.offload_param.max_in_cpu == 1'000'000'000);
  // A section with only a device takes the defaults for the rest.
  const EngineConfig cpu = test::parse(R"({"zero_optimization": {"stage": 2,
    "offload_optimizer": {"device": "cpu"}}})");
  CHECK(cpu.offload_optimizer.device == OffloadDevice::kCpu);
  CHECK_FALSE(cpu.offload_optimizer.pin_memory);
  CHECK(cpu.offload_optimizer.ratio == 1.0);
  CHECK(cpu.ignored.empty());
}

TEST_CASE("offload sections set the config with the values written") {
  const EngineConfig c = test::parse(R"({"zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "CPU", "pin_memory": true, "ratio": 0.25},
    "offload_param": {"device": "cpu", "pin_memory": true, "buffer_count": 7, "buffer_size": 2e7,
                      "max_in_cpu": 3e8}}})");
  CHECK(c.offload_optimizer.device == OffloadDevice::kCpu);
  CHECK(c.offload_optimizer.pin_memory);
  CHECK(c.offload_optimizer.ratio == 0.25);
  CHECK(c.offload_param.device == OffloadDevice::kCpu);
  CHECK(c.offload_param.pin_memory);
  CHECK(c.offload_param.buffer_count == 7);
  CHECK(c.offload_param.buffer_size == 20'000'000);
  CHECK(c.offload_param.max_in_cpu == 300'000'000);
  // The parameters' pool and CPU limit are NVMe settings in DeepSpeed: read,
  // and noted as acted on by nothing with device cpu.
  CHECK(c.ignored.size() == 3);
  for (const char* key : {"buffer_count", "buffer_size", "max_in_cpu"}) {
    CAPTURE(key);
    CHECK(ignored_reason(c, std::string("zero_optimization.offload_param.") + key).find("an NVMe offload setting") == 0);
  }
  // "auto" for the device is its default, as DeepSpeed drops an unfilled "auto".
  const EngineConfig a = test::parse(R"({"zero_optimization": {"stage": 2,
    "offload_optimizer": {"device": "auto"}}})");
  CHECK(a.offload_optimizer.device == OffloadDevice::kNone);
  REQUIRE(a.auto_filled.size() == 3);  // and the program's optimizer and schedule
  CHECK(a.auto_filled[0].key == "zero_optimization.offload_optimizer.device");
}

TEST_CASE("offload acts at DeepSpeed's stages only") {
  // offload_optimizer: ZeRO's optimizers (stages 1-3) offload; at stage 0
  // DeepSpeed's fp16/bf16 optimizers never do.
  for (int stage : {1, 2, 3}) {
    const EngineConfig c = test::parse(fmt::format(
        R"({{"zero_optimization": {{"stage": {}, "offload_optimizer": {{"device": "cpu"}}}}}})", stage));
    CHECK(c.offload_optimizer.device == OffloadDevice::kCpu);
  }
  const EngineConfig z0 = test::parse(R"({"zero_optimization": {"stage": 0,
    "offload_optimizer": {"device": "cpu", "pin_memory": true}}})");
  CHECK(z0.offload_optimizer.device == OffloadDevice::kNone);
  CHECK(ignored_reason(z0, "zero_optimization.offload_optimizer") ==
        "device \"cpu\" at stage 0: DeepSpeed offloads the optimizer only under ZeRO (stages 1-3), and so does "
        "ZEST; nothing is offloaded");
  // offload_param: stage 3 only.
  for (int stage : {0, 1, 2}) {
    const EngineConfig c = test::parse(fmt::format(
        R"({{"zero_optimization": {{"stage": {}, "offload_param": {{"device": "cpu"}}}}}})", stage));
    CHECK(c.offload_param.device == OffloadDevice::kNone);
    CHECK(ignored_reason(c, "zero_optimization.offload_param") ==
          fmt::format("DeepSpeed offloads parameters only at stage 3; this is stage {}, so nothing is offloaded",
                      stage));
  }
}

TEST_CASE("offload_optimizer.ratio: [0, 1], and below 1 only at stage 3") {
  CHECK(test::parse(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu",
    "ratio": 0}}})").offload_optimizer.ratio == 0.0);
  CHECK(error_of(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 1.5}}})") ==
        "config: zero_optimization.offload_optimizer.ratio is 1.5; allowed: 0 to 1");
  CHECK(error_of(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"ratio": -0.1}}})") ==
        "config: zero_optimization.offload_optimizer.ratio is -0.1; allowed: 0 to 1");
  // DeepSpeedZeroConfig.offload_ratio_check, whatever the device.
  for (const char* device : {"cpu", "none"}) {
    CAPTURE(device);
    CHECK(error_of(fmt::format(R"({{"zero_optimization": {{"stage": 2, "offload_optimizer": {{"device": "{}",
      "ratio": 0.5}}}}}})", device)) ==
          "config: zero_optimization.offload_optimizer.ratio is 0.5 at stage 2: DeepSpeed allows partial offload "
          "only at stage 3 and refuses this file; set stage 3, or ratio 1 (in code, "
          "EngineConfig::offload_optimizer.ratio below 1 works at stages 1-3)");
  }
}

TEST_CASE("nvme loads with its keys and DeepSpeed's defaults, nvme_path required, and NVMe-only keys are noted "
          "with any other device") {
  // DeepSpeedZeroOffloadOptimizerConfig: buffer_count 4, pipeline_read,
  // pipeline_write and fast_init False; ...ParamConfig: buffer_count 5,
  // buffer_size 1e8, max_in_cpu 1e9.
  const EngineConfig d = test::parse("{}");
  CHECK(d.offload_optimizer.buffer_count == 4);
  CHECK_FALSE(d.offload_optimizer.pipeline_read);
  CHECK_FALSE(d.offload_optimizer.pipeline_write);
  CHECK_FALSE(d.offload_optimizer.fast_init);
  CHECK(d.offload_optimizer.nvme_path.empty());
  CHECK(d.offload_param.nvme_path.empty());
  const EngineConfig n = test::parse(R"({"zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_count": 6, "pipeline_read": true,
                          "pipeline_write": true, "fast_init": true, "pin_memory": true},
    "offload_param": {"device": "nvme", "nvme_path": "/local_nvme2", "buffer_count": 7, "buffer_size": 2e8,
                      "max_in_cpu": 3e9}}})");
  CHECK(n.offload_optimizer.device == OffloadDevice::kNvme);
  CHECK(n.offload_optimizer.nvme_path == "/local_nvme");
  CHECK(n.offload_optimizer.buffer_count == 6);
  CHECK(n.offload_optimizer.pipeline_read);
  CHECK(n.offload_optimizer.pipeline_write);
  CHECK(n.offload_optimizer.fast_init);
  CHECK(n.offload_optimizer.pin_memory);
  CHECK(n.offload_param.device == OffloadDevice::kNvme);
  CHECK(n.offload_param.nvme_path == "/local_nvme2");
  CHECK(n.offload_param.buffer_count == 7);
  CHECK(n.offload_param.buffer_size == 200'000'000);
  CHECK(n.offload_param.max_in_cpu == 3'000'000'000);
  CHECK(n.ignored.empty());
  CHECK(error_of(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})") ==
        "config: zero_optimization.offload_param.device is \"nvme\" without zero_optimization.offload_param.nvme_path: "
        "name the directory on the NVMe drive where the swap files go");
  CHECK(error_of(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": 3}}})") ==
        "config: 2 problems:\n"
        "  - zero_optimization.offload_optimizer.nvme_path must be the path of a directory on the NVMe drive, got 3\n"
        "  - zero_optimization.offload_optimizer.device is \"nvme\" without "
        "zero_optimization.offload_optimizer.nvme_path: name the directory on the NVMe drive where the swap files go");
  CHECK(error_of(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/x",
    "buffer_count": -1}}})") ==
        "config: zero_optimization.offload_optimizer.buffer_count is -1; allowed: 0 to 1125899906842624");
  CHECK(error_of(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}})") ==
        "config: zero_optimization.offload_param.device is \"gpu\" (did you mean \"cpu\"?); allowed: none, cpu, nvme");
  // Where DeepSpeed does not act on the section, nvme is dropped as cpu is:
  // offload_param below stage 3, offload_optimizer at stage 0 (no nvme_path
  // needed then).
  const EngineConfig z2 = test::parse(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "nvme"}}})");
  CHECK(z2.offload_param.device == OffloadDevice::kNone);
  CHECK(ignored_reason(z2, "zero_optimization.offload_param") ==
        "DeepSpeed offloads parameters only at stage 3; this is stage 2, so nothing is offloaded");
  const EngineConfig z0 = test::parse(R"({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "nvme"}}})");
  CHECK(z0.offload_optimizer.device == OffloadDevice::kNone);
  CHECK(ignored_reason(z0, "zero_optimization.offload_optimizer") ==
        "device \"nvme\" at stage 0: DeepSpeed offloads the optimizer only under ZeRO (stages 1-3), and so does ZEST; "
        "nothing is offloaded");
  // DeepSpeed's docs write the NVMe keys next to device "cpu": they load,
  // noted by name.
  const EngineConfig c = test::parse(R"({"zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "cpu", "nvme_path": "/local_nvme", "buffer_count": 4, "pipeline_read": false,
                          "pipeline_write": false, "fast_init": false},
    "offload_param": {"device": "cpu", "nvme_path": "/local_nvme"}}})");
  CHECK(c.offload_optimizer.device == OffloadDevice::kCpu);
  CHECK(c.offload_param.device == OffloadDevice::kCpu);
  const char* const nvme = "an NVMe offload setting: DeepSpeed reads it only with device \"nvme\"";
  for (const char* key : {"offload_optimizer.nvme_path", "offload_optimizer.buffer_count",
                          "offload_optimizer.pipeline_read", "offload_optimizer.pipeline_write",
                          "offload_optimizer.fast_init", "offload_param.nvme_path"}) {
    CAPTURE(key);
    CHECK(ignored_reason(c, std::string("zero_optimization.") + key) == nvme);
  }
  CHECK(c.ignored.size() == 6);
  // An unknown key in a section is refused, as DeepSpeed's models forbid extras.
  CHECK(error_of(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memroy": true}}})")
            .find("unknown key 'zero_optimization.offload_param.pin_memroy' in zero_optimization.offload_param "
                  "(did you mean 'pin_memory'?)") != std::string::npos);
}

TEST_CASE("the deprecated cpu_offload, cpu_offload_param and cpu_offload_use_pin_memory") {
  // true stands for the section with device "cpu" and its defaults.
  const EngineConfig c = test::parse(R"({"zero_optimization": {"stage": 3, "cpu_offload": true,
    "cpu_offload_param": true, "cpu_offload_use_pin_memory": true}})");
  CHECK(c.offload_optimizer.device == OffloadDevice::kCpu);
  CHECK(c.offload_param.device == OffloadDevice::kCpu);
  // DeepSpeed marks cpu_offload_use_pin_memory set_new_param False: it warns
  // and pins nothing.
  CHECK_FALSE(c.offload_optimizer.pin_memory);
  CHECK_FALSE(c.offload_param.pin_memory);
  // Honoured, so a warning (DeepSpeed's deprecation warning), not "ignored".
  CHECK(ignored_reason(c, "zero_optimization.cpu_offload").empty());
  REQUIRE(c.warnings.size() == 2);
  CHECK(c.warnings[0].key == "zero_optimization.cpu_offload");
  CHECK(c.warnings[0].text == "deprecated: read as offload_optimizer {\"device\": \"cpu\"} (write that instead)");
  CHECK(ignored_reason(c, "zero_optimization.cpu_offload_use_pin_memory") ==
        "deprecated, and DeepSpeed no longer applies it (it warns and pins nothing): write pin_memory in "
        "offload_optimizer or offload_param");
  // The same stage rules as the sections.
  const EngineConfig z2 = test::parse(R"({"zero_optimization": {"stage": 2, "cpu_offload": true,
    "cpu_offload_param": true}})");
  CHECK(z2.offload_optimizer.device == OffloadDevice::kCpu);
  CHECK(z2.offload_param.device == OffloadDevice::kNone);
  const EngineConfig z0 = test::parse(R"({"zero_optimization": {"stage": 0, "cpu_offload": true}})");
  CHECK(z0.offload_optimizer.device == OffloadDevice::kNone);
  const EngineConfig off = test::parse(R"({"zero_optimization": {"stage": 3, "cpu_offload": false}})");
  CHECK(off.offload_optimizer.device == OffloadDevice::kNone);
  CHECK(ignored_reason(off, "zero_optimization.cpu_offload") == "false: nothing is offloaded");
  // With the section it stands for, DeepSpeed asserts.
  CHECK(error_of(R"({"zero_optimization": {"stage": 2, "cpu_offload": false,
    "offload_optimizer": {"device": "cpu"}}})") ==
        "config: zero_optimization.cpu_offload is the deprecated form of zero_optimization.offload_optimizer, and "
        "the file writes both: DeepSpeed refuses that; keep only zero_optimization.offload_optimizer");
  CHECK(error_of(R"({"zero_optimization": {"stage": 2, "cpu_offload": "sometimes"}})") ==
        "config: zero_optimization.cpu_offload must be true or false, got \"sometimes\"");
}

TEST_CASE("aio: DeepSpeed's defaults and names, each key checked, noted as ignored without an nvme device") {
  // deepspeed/runtime/swap_tensor/aio_config.py's AIO_DEFAULT_DICT.
  const EngineConfig d = test::parse("{}");
  CHECK(d.aio.block_size == 1048576);
  CHECK(d.aio.queue_depth == 8);
  CHECK(d.aio.intra_op_parallelism == 1);
  CHECK_FALSE(d.aio.single_submit);
  CHECK(d.aio.overlap_events);
  CHECK_FALSE(d.aio.use_gds);
  const EngineConfig a = test::parse(R"({"zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}},
    "aio": {"block_size": 262144, "queue_depth": 32, "intra_op_parallelism": 4, "single_submit": true,
            "overlap_events": false, "use_gds": false}})");
  CHECK(a.aio.block_size == 262144);
  CHECK(a.aio.queue_depth == 32);
  CHECK(a.aio.intra_op_parallelism == 4);
  CHECK(a.aio.single_submit);
  CHECK_FALSE(a.aio.overlap_events);
  // use_gds false is accepted and noted, as every switch of a feature ZEST lacks.
  REQUIRE(a.ignored.size() == 1);
  CHECK(a.ignored[0].key == "aio.use_gds");
  // Older DeepSpeed's name for the threads.
  CHECK(test::parse(R"({"aio": {"thread_count": 3}})").aio.intra_op_parallelism == 3);
  const EngineConfig cpu = test::parse(R"({"aio": {"queue_depth": 16}})");
  CHECK(cpu.aio.queue_depth == 16);
  CHECK(ignored_reason(cpu, "aio") == "NVMe I/O settings: DeepSpeed uses them only with offload device \"nvme\"");
  CHECK(error_of(R"({"aio": {"block_size": 1000000}})") ==
        "config: aio.block_size is 1000000: direct I/O needs a multiple of 4096 bytes (DeepSpeed's default is 1048576)");
  CHECK(error_of(R"({"aio": {"block_size": 512}})") == "config: aio.block_size is 512; allowed: 4096 to 1073741824");
  CHECK(error_of(R"({"aio": {"queue_depth": 0}})") == "config: aio.queue_depth is 0; allowed: 1 to 65536");
  CHECK(error_of(R"({"aio": {"intra_op_parallelism": "4"}})") ==
        "config: aio.intra_op_parallelism must be a whole number, got \"4\"");
  CHECK(error_of(R"({"aio": {"single_submit": 1}})") == "config: aio.single_submit must be true or false, got 1");
  CHECK(error_of(R"({"aio": {"thread_count": 2, "intra_op_parallelism": 2}})").find("thread_count") !=
        std::string::npos);
  CHECK(error_of(R"({"aio": {"use_gds": true}})") ==
        "config: aio.use_gds is true: that asks for GPUDirect Storage (cuFile reads and writes between the drive and "
        "the GPU), which ZEST does not have (remove the key, or turn it off, to train without it)");
}
