// The one JSON parser of the library (config/detail/json_parse.h) and the readers
// that use it: deep nesting, duplicate keys and out-of-range numbers are
// errors naming the source, the byte offset and the key path; none crashes.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "error_of.h"
#include "zest/checkpoint/checkpoint_manifest.h"
#include "zest/config/config.h"
#include "zest/config/detail/json_parse.h"
#include "zest/core/check.h"
#include "zest/estimate/memory_estimate.h"

namespace test_json_parse {

using namespace zest;
using zest::test::error_of;
using nlohmann::json;

namespace {

std::string parse_error(const std::string& text, int max_depth = 16) {
  return error_of([&] { (void)detail::parse_json(text, "test.json", {.max_depth = max_depth}); });
}

std::string nested(int depth) { return std::string(static_cast<size_t>(depth), '[') + std::string(static_cast<size_t>(depth), ']'); }

}  // namespace

TEST_CASE("parse_json builds the same document as nlohmann's parser") {
  const std::string text = R"({"a": [1, -2, 3.5, true, null, "s", {"b": [[]]}], "c": {}, "u": 18446744073709551615})";
  CHECK(detail::parse_json(text, "t") == json::parse(text));
  CHECK(detail::parse_json("  7 ", "t") == json(7));
  CHECK(detail::parse_json(nested(16), "t") == json::parse(nested(16)));
}

TEST_CASE("nesting deeper than the limit is refused before it is built, at any depth") {
  CHECK(parse_error(nested(17)) ==
        "test.json: byte 17 (at [0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]): values nest 17 levels deep here, "
        "more than the 16 this file may have (objects and arrays inside each other)");
  // 100,000 deep (200 KB): once a SIGSEGV when an error message printed it.
  const std::string deep = parse_error(nested(100'000));
  CHECK(deep.starts_with("test.json: byte 17 "));
  CHECK(deep.size() < 400);
  std::string objects;
  for (int i = 0; i < 100'000; ++i) objects += "{\"k\":";
  CHECK(parse_error(objects).starts_with("test.json: byte 81 (at k.k.k.k.k.k.k.k.k.k.k.k.k.k.k.k): values nest 17 "));
}

TEST_CASE("a key twice in one object is refused, naming it") {
  CHECK(parse_error(R"({"a": 1, "a": 2})") ==
        "test.json: byte 12 (at a): the key \"a\" appears twice in one object; each key may appear once (which of "
        "the two was meant?)");
  CHECK(parse_error(R"({"x": [{"b": 1}, {"b": 2, "c": 3, "b": 4}]})")
            .starts_with("test.json: byte 37 (at x[1].b): the key \"b\" appears twice"));
  CHECK(detail::parse_json(R"({"a": {"b": 1}, "b": {"a": 2}})", "t").size() == 2);  // same key, other objects
}

TEST_CASE("numbers beyond a double's range, and integers beyond int64") {
  CHECK(parse_error(R"({"x": [1, 1e400]})") ==
        "test.json: byte 15 (at x[1]): the number 1e400 is beyond a double's range (about 1.8e308)");
  CHECK(parse_error("-1e999") == "test.json: byte 6: the number -1e999 is beyond a double's range (about 1.8e308)");
  std::string why;
  CHECK_FALSE(detail::json_int64(json::parse("9223372036854775808"), &why).has_value());
  CHECK(why == "is 9223372036854775808, above the largest 64-bit integer (9223372036854775807)");
  CHECK(detail::json_int64(json::parse("9223372036854775807")) == INT64_MAX);
  CHECK(detail::json_int64(json::parse("-9223372036854775808")) == INT64_MIN);
  CHECK_FALSE(detail::json_int64(json::parse("2.0"), &why).has_value());
  CHECK(why == "is 2.0, not an integer");
}

TEST_CASE("invalid JSON names the source and the byte") {
  CHECK(parse_error(R"({"a": })").starts_with("test.json: byte 7 (at a): not valid JSON (parse error at line 1, "
                                               "column 7: syntax error while parsing value"));
  CHECK(parse_error("{} x").starts_with("test.json: byte 4: not valid JSON ("));
  CHECK(parse_error("").starts_with("test.json: byte 0: not valid JSON ("));
}

TEST_CASE("config files, checkpoint manifests and units files all go through it") {
  CHECK(error_of([] { (void)parse_config_json(nested(100'000)); })
            .starts_with("config: byte 17: values nest 17 levels deep here"));
  CHECK(error_of([] { (void)parse_config_json(R"({"steps_per_print": 1, "steps_per_print": 2})"); }) ==
        "config: byte 40 (at steps_per_print): the key \"steps_per_print\" appears twice in one object; each key "
        "may appear once (which of the two was meant?)");
  CHECK(error_of([] { (void)parse_manifest(nested(100'000), "ck/manifest.json"); })
            .starts_with("checkpoint manifest 'ck/manifest.json': byte 9 "));
  CHECK(error_of([] { (void)parse_manifest(R"({"format": "zest-checkpoint", "format": "x"})", "m.json"); }) ==
        "checkpoint manifest 'm.json': byte 38 (at format): the key \"format\" appears twice in one object; each "
        "key may appear once (which of the two was meant?)");
  CHECK(error_of([] {
          (void)parse_manifest(R"({"format": "zest-checkpoint", "format_version": 9223372036854775808})", "m.json");
        }) == "checkpoint manifest 'm.json': manifest.format_version is 9223372036854775808, above the largest "
              "64-bit integer (9223372036854775807); it must be an integer from 1 to 1000000");
  CHECK(error_of([] { (void)parse_model_description(nested(100'000)); }).starts_with("units: byte 5 "));
  CHECK(error_of([] { (void)parse_model_description(R"([{"name": "a", "params": [4], "name": "b"}])"); })
            == "units: byte 36 (at [0].name): the key \"name\" appears twice in one object; each key may appear "
               "once (which of the two was meant?)");
}

}  // namespace test_json_parse
