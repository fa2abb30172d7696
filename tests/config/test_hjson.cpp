// Config files as DeepSpeed's hjson.load reads them: comments, trailing and
// missing commas, unquoted keys, quoteless and multiline strings; errors
// point into the file as written.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "config_test_helpers.h"
#include "zest/config/detail/hjson.h"
#include "zest/config/detail/json_parse.h"

using namespace zest;
using nlohmann::json;

namespace {

json hjson(const std::string& text) { return detail::parse_json(text, "t.hjson", {.max_depth = 16, .hjson = true}); }

std::string hjson_error(const std::string& text) {
  try {
    (void)hjson(text);
  } catch (const Error& e) {
    return e.message();
  }
  return "no error";
}

}  // namespace

TEST_CASE("Hjson: what DeepSpeed's reader accepts becomes the same document") {
  const json j = hjson(R"(# an NVMe example, annotated
{
  // ZeRO-3
  "zero_optimization": {
    stage: 3,            # unquoted key, comment after the value
    "offload_param": {"device": "nvme", "nvme_path": "/local_nvme",},  /* trailing comma */
    sub_group_size: 1e9
    overlap_comm: true
  },
  'name': 'it\'s "x"',
  note: a quoteless string, with a comma # and this too
  n: -0.5e-3
  empty: null
  list: [1, 2,
         3,]
  text:
    '''
    first
      second
    '''
})");
  CHECK(j["zero_optimization"]["stage"] == 3);
  CHECK(j["zero_optimization"]["offload_param"]["nvme_path"] == "/local_nvme");
  CHECK(j["zero_optimization"]["sub_group_size"] == 1e9);
  CHECK(j["zero_optimization"]["overlap_comm"] == true);
  CHECK(j["name"] == "it's \"x\"");
  CHECK(j["note"] == "a quoteless string, with a comma # and this too");
  CHECK(j["n"] == -0.5e-3);
  CHECK(j["empty"].is_null());
  CHECK(j["list"] == json::array({1, 2, 3}));
  CHECK(j["text"] == "first\n  second");
}

TEST_CASE("Hjson: a JSON file reads as before, and the root braces are optional") {
  const std::string text =
      R"({"a": [1, -2, 3.5, true, null, "s\"q\\", {"b": [[]]}], "c": {}, "u": 18446744073709551615})";
  CHECK(hjson(text) == json::parse(text));
  CHECK(hjson("stage: 2\nname: x") == json::parse(R"({"stage": 2, "name": "x"})"));
}

TEST_CASE("Hjson: errors give the byte of the file as written") {
  // The duplicate key's byte is in the original text, after the comments.
  const std::string dup = "{\n  # c\n  \"a\": 1,\n  a: 2\n}";
  const std::string e = hjson_error(dup);
  CHECK(e.find("appears twice") != std::string::npos);
  CHECK(e.find("t.hjson: byte ") == 0);
  CHECK(hjson_error("{\"a\": 1 /* never closed").find("byte 8: not valid Hjson or JSON (a /* comment that is never "
                                                      "closed)") != std::string::npos);
  CHECK(hjson_error("{two words: 1}").find("whitespace inside an unquoted key") != std::string::npos);
  CHECK(hjson_error("{\"a\": \"unterminated}").find("a string that is never closed") != std::string::npos);
  CHECK(hjson_error("{\"a\": [1, 2}").find("not valid") != std::string::npos);
  CHECK(hjson_error(std::string(100000, '[')).find("more than the 16") != std::string::npos);
}

TEST_CASE("a commented DeepSpeed file loads with its values") {
  const std::string nvme = R"({
    // ZeRO-Infinity: parameters and optimizer state on NVMe
    "train_micro_batch_size_per_gpu": 4,
    "zero_optimization": {
      "stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"},  // fast local disk
    },
  })";
  const EngineConfig c = parse_config_json(nvme, test::ds_config_program());
  CHECK(c.offload_optimizer.device == OffloadDevice::kNvme);
  CHECK(c.offload_optimizer.nvme_path == "/local_nvme");
}

TEST_CASE("Hjson: ''' strings as hjson-py reads them") {
  // Text right after the opening quotes, quotes inside, a closing line
  // indented deeper than the opening column (its extra spaces and the break
  // before them stay), CRs dropped, the last line break dropped.
  CHECK(hjson("a: '''one\r\n  two '' three\n  '''")["a"] == "one\ntwo '' three");
  CHECK(hjson("a: '''x'''")["a"] == "x");
  CHECK(hjson("a:\n  '''\n  x\n     '''")["a"] == "x\n   ");
  CHECK(hjson_error("a: '''x''").find("a ''' string that is never closed") != std::string::npos);
}
