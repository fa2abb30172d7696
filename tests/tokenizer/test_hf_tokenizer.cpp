// A checkpoint's tokenizer.model run as Hugging Face runs it, and text
// JSONL tokenized as TRL's SFTTrainer tokenizes it, against
// tests/tools/hf_tokenizer_reference.py's ids for the same records (an
// independent reference: tokenizers' BPE over the checkpoint's
// tokenizer.json, no SentencePiece), with Mistral-7B-Instruct-v0.3's real
// tokenizer (tests/tokenizer/mistral_v03/README.md). Then every refusal.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/temp_dir.h"
#include "error_of.h"
#include "zest/core/check.h"
#include "zest/core/file_io.h"
#include "zest/data/token_dataset.h"
#include "zest/tokenizer/hf_tokenizer.h"
#include "zest/tokenizer/text_jsonl.h"

namespace test_hf_tokenizer {

namespace fs = std::filesystem;
using zest::test::TempDir;
using V = std::vector<int64_t>;

const std::string kFixture = std::string(ZEST_SOURCE_DIR) + "/tests/tokenizer/mistral_v03";

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  REQUIRE(out.good());
}

nlohmann::json fixture_config() { return nlohmann::json::parse(zest::read_text_file(kFixture + "/tokenizer_config.json")); }

// A checkpoint directory: the fixture's tokenizer.model, `config` as
// tokenizer_config.json (null: none), `tokenizer_json` as tokenizer.json
// (null: none).
std::string checkpoint(const TempDir& dir, const std::string& name, const nlohmann::json& config,
                       const nlohmann::json& tokenizer_json = nullptr) {
  const fs::path d = dir.path / name;
  fs::create_directories(d);
  fs::copy_file(kFixture + "/tokenizer.model", d / "tokenizer.model");
  if (!config.is_null()) write_file(d / "tokenizer_config.json", config.dump());
  if (!tokenizer_json.is_null()) write_file(d / "tokenizer.json", tokenizer_json.dump());
  return d.string();
}

std::vector<nlohmann::json> expected(const std::string& layout) {
  std::vector<nlohmann::json> out;
  std::ifstream in(kFixture + "/expected_" + layout + ".jsonl");
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  REQUIRE(out.size() == 8);
  return out;
}

// Every record of records.jsonl through TextJsonl against the reference.
void check_records(const std::string& dir, const std::string& layout) {
  auto tok = std::make_shared<const zest::HfTokenizer>(dir);
  zest::TextJsonl data(kFixture + "/records.jsonl", tok, /*vocab_size=*/32768);
  const auto want = expected(layout);
  REQUIRE(data.size() == static_cast<int64_t>(want.size()));
  for (int64_t d = 0; d < data.size(); ++d) {
    CAPTURE(d);
    const zest::TokenDocument doc = data.document(d);
    CHECK(doc.tokens == want[static_cast<size_t>(d)]["input_ids"].get<V>());
    CHECK(data.length(d) == static_cast<int64_t>(doc.tokens.size()));
    const V labels = doc.labels.empty() ? doc.tokens : doc.labels;  // empty: every token trained on
    CHECK(labels == want[static_cast<size_t>(d)]["labels"].get<V>());
  }
  // Records 3 and 5: the prompt's last token merges with the completion's
  // first (TRL warns, and masks the prompt's count of tokens).
  CHECK(data.mismatched_prompts() == 2);
}

TEST_CASE("tokenizer.model encodes text records as Hugging Face's LlamaTokenizerFast and TRL do: Mistral v0.3's layout") {
  if (!zest::has_sentencepiece()) {
    CHECK_THROWS_WITH_AS(zest::HfTokenizer{kFixture}, doctest::Contains("libsentencepiece-dev"), zest::Error);
    return;
  }
  TempDir dir;
  // As the checkpoint ships it: legacy false, add_prefix_space true.
  check_records(checkpoint(dir, "shipped", fixture_config()), "first");
  // The same layout said by a tokenizer.json (which decides over legacy).
  nlohmann::json legacy_config = fixture_config();
  legacy_config["legacy"] = true;
  const nlohmann::json metaspace = {
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", false}}}};
  check_records(checkpoint(dir, "tokenizer_json", legacy_config, metaspace), "first");

  const zest::HfTokenizer tok(checkpoint(dir, "plain", fixture_config()));
  CHECK(tok.encode("[INST] Hello [/INST]") == V{1, 3, 23325, 29473, 4});
  CHECK(tok.encode("[INST] Hello [/INST]", /*add_special_tokens=*/false) == V{3, 23325, 29473, 4});
  CHECK(tok.vocab_size() == 32768);
  CHECK(tok.bos_id() == 1);
  CHECK(tok.eos_id() == 2);
  CHECK(tok.eos_token() == "</s>");
  CHECK(tok.encode("") == V{1});
  CHECK(tok.describe().find("Metaspace first") != std::string::npos);
}

TEST_CASE("tokenizer.model in the legacy layout: a space before every piece between added tokens") {
  if (!zest::has_sentencepiece()) return;  // the case above checks the refusal
  TempDir dir;
  nlohmann::json config = fixture_config();
  config["legacy"] = true;
  check_records(checkpoint(dir, "legacy", config), "legacy");
  // legacy absent: transformers' default, legacy.
  config.erase("legacy");
  check_records(checkpoint(dir, "default", config), "legacy");
  // tokenizer.json with LlamaConverter's legacy normalizer decides over legacy false.
  const nlohmann::json prepend = {
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\u2581"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}}},
      {"pre_tokenizer", nullptr}};
  check_records(checkpoint(dir, "json", fixture_config(), prepend), "legacy");
  // No configuration at all: LlamaTokenizer's defaults, <unk>, <s>, </s> the
  // only added tokens ("[INST]" is then text).
  const zest::HfTokenizer bare(checkpoint(dir, "bare", nullptr));
  CHECK(bare.encode("Hello world") == V{1, 23325, 2294});
  // </s> split out of the text, and a space before the piece after it.
  const int64_t a = bare.encode("a", false).at(0), b = bare.encode("b", false).at(0);
  CHECK(bare.encode("a</s>b") == V{1, a, 2, b});
  CHECK(bare.encode("a</s>b", false) == V{a, 2, b});
}

TEST_CASE("add_bos_token and add_eos_token, and the eos a TRL completion gets once") {
  if (!zest::has_sentencepiece()) return;
  TempDir dir;
  nlohmann::json config = fixture_config();
  config["add_bos_token"] = false;
  config["add_eos_token"] = true;
  const zest::HfTokenizer tok(checkpoint(dir, "flags", config));
  CHECK(tok.encode("Hello world") == V{23325, 2294, 2});
  // TRL appends eos_token to a completion without one, then the
  // post-processor adds another: both are kept, as TRL keeps them.
  const std::string records = (dir.path / "r.jsonl").string();
  write_file(records, R"({"prompt": "Hello", "completion": " world"})" "\n");
  zest::TextJsonl data(records, std::make_shared<const zest::HfTokenizer>(checkpoint(dir, "flags2", config)));
  const zest::TokenDocument doc = data.document(0);
  CHECK(doc.tokens == V{23325, 2294, 2, 2});
  // The prompt alone is "▁Hello </s>": two tokens masked, the second of them
  // the completion's first, as TRL masks them.
  CHECK(doc.labels == V{-100, -100, 2, 2});
  CHECK(data.mismatched_prompts() == 1);
}

TEST_CASE("tokenizers and records ZEST would encode differently from Hugging Face are refused by name") {
  TempDir dir;
  // tokenizer.json alone: byte-level BPE (Llama 3, Qwen).
  const fs::path llama3 = dir.path / "llama3";
  fs::create_directories(llama3);
  write_file(llama3 / "tokenizer.json", R"({"model": {"type": "BPE"}})");
  CHECK_THROWS_WITH_AS(zest::HfTokenizer{llama3.string()},
                       doctest::Contains("tokenizer.json without a tokenizer.model"), zest::Error);
  CHECK(zest::test::error_of([&] { zest::HfTokenizer t(llama3.string()); }).find("--format jsonl") != std::string::npos);
  const fs::path empty = dir.path / "empty";
  fs::create_directories(empty);
  CHECK_THROWS_WITH_AS(zest::HfTokenizer{empty.string()}, doctest::Contains("no tokenizer.model"), zest::Error);
  if (!zest::has_sentencepiece()) return;

  nlohmann::json config = fixture_config();
  config["tokenizer_class"] = "GemmaTokenizer";
  CHECK_THROWS_WITH_AS(zest::HfTokenizer{checkpoint(dir, "gemma", config)},
                       doctest::Contains("tokenizer_class \"GemmaTokenizer\""), zest::Error);
  config = fixture_config();
  config["added_tokens_decoder"]["3"]["single_word"] = true;
  CHECK_THROWS_WITH_AS(zest::HfTokenizer{checkpoint(dir, "single_word", config)},
                       doctest::Contains("\"[INST]\" is single_word"), zest::Error);
  config = fixture_config();
  config["add_bos_token"] = "yes";
  CHECK_THROWS_WITH_AS(zest::HfTokenizer{checkpoint(dir, "bos", config)},
                       doctest::Contains("\"add_bos_token\" is \"yes\""), zest::Error);
  const nlohmann::json split = {
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", true}}}};
  CHECK_THROWS_WITH_AS(zest::HfTokenizer(checkpoint(dir, "split", fixture_config(), split)),
                       doctest::Contains("\"split\": true"), zest::Error);
  const nlohmann::json nfkc = {{"normalizer", {{"type", "NFKC"}}}, {"pre_tokenizer", nullptr}};
  CHECK_THROWS_WITH_AS(zest::HfTokenizer(checkpoint(dir, "nfkc", fixture_config(), nfkc)),
                       doctest::Contains("normalizer step {\"type\":\"NFKC\"}"), zest::Error);
  // A tokenizer.model that is not one.
  const fs::path junk = dir.path / "junk";
  fs::create_directories(junk);
  write_file(junk / "tokenizer.model", std::string("\x0f\xff\xff", 3));
  CHECK_THROWS_WITH_AS(zest::HfTokenizer{junk.string()}, doctest::Contains("not a SentencePiece model"), zest::Error);

  // Records: each refusal names the file and line.
  auto tok = std::make_shared<const zest::HfTokenizer>(checkpoint(dir, "ok", fixture_config()));
  const auto refused = [&](const std::string& record, const std::string& message, int64_t vocab = 0) {
    const std::string path = (dir.path / "bad.jsonl").string();
    write_file(path, "{\"text\": \"fine\"}\n\n" + record + "\n");
    const std::string error = zest::test::error_of([&] { zest::TextJsonl d(path, tok, vocab); });
    CHECK_MESSAGE(error.find(path + ":3: ") != std::string::npos, error);
    CHECK_MESSAGE(error.find(message) != std::string::npos, error);
  };
  refused(R"({"messages": [{"role": "user", "content": "hi"}]})", "chat template");
  refused(R"({"prompt": [{"role": "user", "content": "hi"}], "completion": "x"})", "is a list (a conversation)");
  refused(R"({"prompt": "no completion"})", "a \"prompt\" without a \"completion\"");
  refused(R"({"text": 3})", "\"text\" is 3, not a string");
  refused(R"({"input_ids": [1, 2]})", "give it as --format jsonl");
  refused(R"({"title": "x"})", "without \"prompt\" and \"completion\" or \"text\"");
  refused(R"({"text": "x")", "not a JSON object");
  refused(R"({"text": "Hello world"})", "id 23325, outside the model's vocabulary [0, 10000)", 10000);
}

}  // namespace test_hf_tokenizer
