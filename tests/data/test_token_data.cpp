// Tokenized datasets against files written as Megatron-LM and Hugging Face
// write them, and packed rows against DataCollatorWithFlattening's rows
// followed by the model's label shift, both computed independently by
// tests/tools/token_data_writer.py; then every kind of malformed input,
// each refused with a message naming the file and what is wrong.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/temp_dir.h"
#include "zest/core/check.h"
#include "zest/core/file_io.h"
#include "zest/data/distributed_sampler.h"
#include "zest/data/global_batch.h"
#include "zest/data/megatron_dataset.h"
#include "zest/data/packed_rows.h"
#include "zest/data/tokenized_jsonl.h"

namespace {

using zest::test::TempDir;
using V = std::vector<int64_t>;

std::string writer(const std::string& args) {
  return fmt::format("python3 {}/tests/tools/token_data_writer.py {}", ZEST_SOURCE_DIR, args);
}

void run(const std::string& command) { REQUIRE_MESSAGE(std::system(command.c_str()) == 0, command); }

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

// The reference rows of `expected` (a writer's .expected.json) in file order.
nlohmann::json reference_rows(const TempDir& dir, const std::string& expected, int64_t max_seq_len, bool packing) {
  const std::string out = dir / "rows.json";
  run(writer(fmt::format("rows {} {}{} > {}", expected, max_seq_len, packing ? " --packing" : "", out)));
  return read_json(out);
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) { return zest::read_text_file(path); }

// Every row of the plan in file order against the reference.
void check_rows(const zest::TokenDataset& data, const TempDir& dir, const std::string& expected) {
  bool several = false;  // some packed row holds more than one document
  for (const int64_t len : {64, 128, 400}) {
    for (const bool packing : {false, true}) {
      CAPTURE(len);
      CAPTURE(packing);
      const zest::RowPlan plan(data, 0, {.max_seq_len = len, .packing = packing, .shuffle = false});
      const nlohmann::json ref = reference_rows(dir, expected, len, packing);
      REQUIRE(plan.rows() == static_cast<int64_t>(ref.size()));
      int64_t packed_documents = 0;
      for (int64_t r = 0; r < plan.rows(); ++r) {
        CAPTURE(r);
        const zest::TokenRow row = zest::make_row(data, plan.row(r), len);
        const nlohmann::json& want = ref[static_cast<size_t>(r)];
        CHECK(row.tokens == want["tokens"].get<V>());
        CHECK(row.targets == want["targets"].get<V>());
        CHECK(row.positions == want["positions"].get<V>());
        CHECK(row.documents == want["documents"].get<V>());
        packed_documents += static_cast<int64_t>(plan.row(r).size());
      }
      several = several || (packing && packed_documents > plan.rows());
      if (!packing) CHECK(packed_documents == plan.rows());
    }
  }
  CHECK(several);
}

}  // namespace

TEST_CASE("a Megatron indexed dataset reads as Megatron-LM wrote it, uint16 and int32, one or several sequences a document") {
  TempDir dir;
  for (const std::string dtype : {"uint16", "int32"}) {
    for (const bool split : {false, true}) {
      CAPTURE(dtype);
      CAPTURE(split);
      const std::string prefix = dir / fmt::format("{}_{}", dtype, split);
      run(writer(fmt::format("megatron {} --dtype {}{}", prefix, dtype, split ? " --split-sentences" : "")));
      const zest::MegatronDataset data(prefix, dtype == "uint16" ? 50000 : 150000);
      const nlohmann::json expected = read_json(prefix + ".expected.json");
      REQUIRE(data.size() == static_cast<int64_t>(expected.size()));
      CHECK(data.dtype_code() == (dtype == "uint16" ? 8 : 4));
      CHECK(data.sequences() > (split ? data.size() : data.size() - 1));
      int64_t tokens = 0;
      for (int64_t d = 0; d < data.size(); ++d) {
        const V want = expected[static_cast<size_t>(d)]["tokens"].get<V>();
        CHECK(data.length(d) == static_cast<int64_t>(want.size()));
        const zest::TokenDocument doc = data.document(d);
        CHECK(doc.tokens == want);
        CHECK(doc.labels.empty());
        tokens += data.length(d);
      }
      CHECK(tokens > 4000);
      check_rows(data, dir, prefix + ".expected.json");
    }
  }
}

TEST_CASE("tokenized JSONL: labels, padding dropped at either end, records without labels, blank lines") {
  TempDir dir;
  const std::string path = dir / "sft.jsonl";
  run(writer("jsonl " + path));
  const zest::TokenizedJsonl data(path, 32000);
  const nlohmann::json expected = read_json(path + ".expected.json");
  REQUIRE(data.size() == static_cast<int64_t>(expected.size()));
  for (int64_t d = 0; d < data.size(); ++d) {
    CAPTURE(d);
    const zest::TokenDocument doc = data.document(d);
    CHECK(doc.tokens == expected[static_cast<size_t>(d)]["tokens"].get<V>());
    const V labels = expected[static_cast<size_t>(d)]["labels"].get<V>();
    // A record without labels reads as all tokens trained on.
    CHECK((doc.labels.empty() ? doc.tokens : doc.labels) == labels);
    CHECK(data.length(d) == static_cast<int64_t>(doc.tokens.size()));
  }
  CHECK(data.line_of(10) == 11);
  CHECK(data.line_of(11) == 13);  // after the blank line
  check_rows(data, dir, path + ".expected.json");
}

TEST_CASE("row plans: truncation, the shuffle of each epoch, and global batches whatever the world size") {
  TempDir dir;
  const std::string prefix = dir / "mg";
  run(writer("megatron " + prefix + " --dtype uint16"));
  const zest::MegatronDataset data(prefix);
  // Truncation: documents longer than 100 tokens keep their first 100.
  const zest::RowPlan cut(data, 0, {.max_seq_len = 100, .packing = false, .shuffle = false});
  int64_t longer = 0, lost = 0, kept = 0, empty = 0;
  for (int64_t d = 0; d < data.size(); ++d) {
    empty += data.length(d) == 0 ? 1 : 0;
    longer += data.length(d) > 100 ? 1 : 0;
    lost += std::max<int64_t>(0, data.length(d) - 100);
    kept += std::min<int64_t>(data.length(d), 100);
  }
  CHECK(cut.truncated_documents() == longer);
  CHECK(cut.truncated_tokens() == lost);
  CHECK(cut.tokens() == kept);
  CHECK(empty == 2);  // documents 0 and 5: no rows
  CHECK(cut.rows() == data.size() - empty);
  // The shuffle: torch.randperm seeded seed + epoch, empty documents left out.
  for (const int64_t epoch : {0, 1, 2}) {
    const zest::RowPlan plan(data, epoch, {.max_seq_len = 400, .packing = false, .shuffle = true, .seed = 9});
    V order;
    for (const int64_t d : zest::torch_randperm(data.size(), 9 + static_cast<uint64_t>(epoch))) {
      if (data.length(d) > 0) order.push_back(d);
    }
    V got;
    for (int64_t r = 0; r < plan.rows(); ++r) got.push_back(plan.row(r)[0].document);
    CHECK(got == order);
  }
  // Packed, every document appears once per epoch, and no row overflows.
  const zest::RowPlanOptions packed{.max_seq_len = 256, .packing = true, .shuffle = true, .seed = 3};
  std::set<int64_t> seen;
  const zest::RowPlan plan(data, 0, packed);
  for (int64_t r = 0; r < plan.rows(); ++r) {
    int64_t used = 0;
    for (const zest::RowPiece& p : plan.row(r)) {
      CHECK(seen.insert(p.document).second);
      used += p.tokens;
    }
    CHECK(used <= 256);
  }
  CHECK(static_cast<int64_t>(seen.size()) == data.size() - empty);

  // Global batches: epochs follow one another, each its own plan's rows;
  // the rows of a step are the same however many ranks split them.
  zest::GlobalBatches batches(data, packed, 4);
  const int64_t e0 = batches.steps_in_epoch(0), e1 = batches.steps_in_epoch(1);
  CHECK(e0 == plan.rows() / 4);
  CHECK(batches.position(e0 - 1) == std::pair<int64_t, int64_t>{0, e0 - 1});
  CHECK(batches.position(e0) == std::pair<int64_t, int64_t>{1, 0});
  CHECK(batches.position(e0 + e1 + 1) == std::pair<int64_t, int64_t>{2, 1});
  const zest::RowPlan plan1(data, 1, packed);
  for (int64_t i = 0; i < 4; ++i) {
    const auto a = batches.row(e0 + 1, i);
    const auto b = plan1.row(4 + i);
    REQUIRE(a.size() == b.size());
    for (size_t k = 0; k < a.size(); ++k) CHECK(a[k].document == b[k].document);
  }
  CHECK_THROWS_WITH_AS(zest::GlobalBatches(data, packed, plan.rows() + 1),
                       doctest::Contains("fewer than one global batch"), zest::Error);
}

TEST_CASE("malformed Megatron files are refused, naming the file and what is wrong") {
  TempDir dir;
  const std::string good = dir / "good";
  run(writer("megatron " + good + " --dtype uint16"));
  const std::string idx = read_bytes(good + ".idx"), bin = read_bytes(good + ".bin");
  const auto make = [&](const std::string& name, const std::string& i, const std::string& b) {
    const std::string p = dir / name;
    write_bytes(p + ".idx", i);
    write_bytes(p + ".bin", b);
    return p;
  };
  const auto refused = [&](const std::string& prefix, const std::string& what) {
    CAPTURE(what);
    CHECK_THROWS_WITH_AS(zest::MegatronDataset(prefix, 50000), doctest::Contains(what.c_str()), zest::Error);
  };
  refused(make("short_bin", idx, bin.substr(0, bin.size() - 2)), "the .bin is truncated");
  refused(make("short_idx", idx.substr(0, idx.size() - 8), bin), "the index is truncated");
  refused(make("tiny_idx", idx.substr(0, 20), bin), "shorter than a Megatron index's");
  std::string magic = idx;
  magic[0] = 'X';
  refused(make("magic", magic, bin), "no Megatron index header");
  std::string version = idx;
  version[9] = 2;
  refused(make("version", version, bin), "index version 2");
  std::string floats = idx;
  floats[17] = 7;
  refused(make("floats", floats, bin), "float32");
  // Sequence modes after the document indices: a multimodal dataset.
  const uint64_t sequences = [&] {
    uint64_t s;
    std::memcpy(&s, idx.data() + 18, 8);
    return s;
  }();
  refused(make("modes", idx + std::string(sequences, '\0'), bin), "multimodal");
  // The last document index past the sequences.
  std::string docs = idx;
  docs[docs.size() - 8] = static_cast<char>(docs[docs.size() - 8] + 1);
  refused(make("docs", docs, bin), "the documents end at sequence");
  CHECK_THROWS_WITH_AS(zest::MegatronDataset(dir / "missing"), doctest::Contains("missing.idx"), zest::Error);
  // A token past the vocabulary, reported when its document is read.
  const zest::MegatronDataset small(good, 1000);
  int64_t d = 0;
  while (small.length(d) == 0) ++d;
  CHECK_THROWS_WITH_AS(small.document(d), doctest::Contains("outside the model's vocabulary [0, 1000)"), zest::Error);
}

TEST_CASE("malformed JSONL records are refused, naming the file, the line and what is wrong") {
  TempDir dir;
  int n = 0;
  const auto refused = [&](const std::string& text, const std::string& what) {
    CAPTURE(text);
    const std::string path = dir / fmt::format("bad{}.jsonl", n++);
    write_bytes(path, "{\"input_ids\": [1, 2, 3]}\n" + text + "\n");
    const std::string message = fmt::format("{}:2: {}", path, what);
    CHECK_THROWS_WITH_AS(zest::TokenizedJsonl(path, 100), doctest::Contains(message.c_str()), zest::Error);
  };
  refused(R"({"text": "hello"})", "the record has no \"input_ids\" (it holds text");
  refused(R"({"input_ids": [1, 2], "labels": [1]})", "1 labels for 2 input_ids");
  refused(R"({"input_ids": [1, 2, 3], "attention_mask": [1, 0, 1]})", "attention_mask[1] is 0 between 1s");
  refused(R"({"input_ids": [1, 2], "attention_mask": [0, 0]})", "no input_ids outside the padding");
  refused(R"({"input_ids": [1, 200]})", "input_ids[1] is 200, outside the model's vocabulary [0, 100)");
  refused(R"({"input_ids": [1, 2], "labels": [1, -5]})", "labels[1] is -5");
  refused(R"({"input_ids": [1, "x"]})", "\"input_ids\"[1] is \"x\", not an integer");
  refused(R"({"input_ids": [1, 2)", "not a JSON object");
  refused(R"([1, 2, 3])", "a JSON array");
  const std::string empty = dir / "empty.jsonl";
  write_bytes(empty, "\n\n");
  CHECK_THROWS_WITH_AS(zest::TokenizedJsonl{empty}, doctest::Contains("no records"), zest::Error);
  CHECK_THROWS_WITH_AS(zest::open_token_dataset("parquet", empty, 0), doctest::Contains("data format 'parquet'"),
                       zest::Error);
}
