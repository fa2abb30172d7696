// The fine-tuning data path (zest/data) on one thread: rows read and made
// (RowPlan + make_row: tokens, shifted targets, positions, document ids)
// from a Megatron indexed dataset, from tokenized JSONL and from text JSONL
// (prompt/completion records tokenized with a checkpoint's tokenizer.model,
// by default Mistral v0.3's in tests/tokenizer), and the JSONL files'
// opening passes (every record parsed, or tokenized, once for its length),
// in tokens/s;
// against a memcpy of the same tokens as int64 in the same run (the least a
// reader must do: each token lands in the row once). A training step's
// tokens/s (the llama example prints it) is what the data path must outrun.
//
//   data_bench [--documents N] [--tokens-per-doc T] [--row 2048] [--rounds 3] [--dir PATH]
//              [--tokenizer DIR]   (text JSONL skipped in a build without SentencePiece)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/cli.h"
#include "zest/data/megatron_dataset.h"
#include "zest/data/packed_rows.h"
#include "zest/data/tokenized_jsonl.h"
#include "zest/tokenizer/hf_tokenizer.h"
#include "zest/tokenizer/text_jsonl.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int64_t documents = 20000;
  int64_t tokens_per_doc = 400;  // on average: lengths T/2 .. 3T/2
  int64_t row = 2048;
  int rounds = 3;
  std::string dir = "/tmp";
  std::string tokenizer = ZEST_BENCH_TOKENIZER;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int64_t doc_length(const Options& o, int64_t d) { return o.tokens_per_doc / 2 + (d * 7919) % (o.tokens_per_doc + 1); }

// A Megatron dataset (uint16 tokens) as Megatron-LM's _IndexWriter writes it.
void write_megatron(const Options& o, const std::string& prefix) {
  std::ofstream bin(prefix + ".bin", std::ios::binary), idx(prefix + ".idx", std::ios::binary);
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, docs{0};
  int64_t at = 0;
  for (int64_t d = 0; d < o.documents; ++d) {
    const int64_t n = doc_length(o, d);
    std::vector<uint16_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<uint16_t>((d * 31 + i * 13) % 32000);
    bin.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(2 * n));
    lengths.push_back(static_cast<int32_t>(n));
    pointers.push_back(at);
    at += 2 * n;
    docs.push_back(d + 1);
  }
  const auto put = [&](const void* p, size_t n) { idx.write(static_cast<const char*>(p), static_cast<std::streamsize>(n)); };
  put("MMIDIDX\0\0", 9);
  const uint64_t version = 1, s = lengths.size(), dc = docs.size();
  const uint8_t code = 8;
  put(&version, 8);
  put(&code, 1);
  put(&s, 8);
  put(&dc, 8);
  put(lengths.data(), 4 * lengths.size());
  put(pointers.data(), 8 * pointers.size());
  put(docs.data(), 8 * docs.size());
}

void write_jsonl(const Options& o, const std::string& path) {
  std::ofstream out(path);
  for (int64_t d = 0; d < o.documents; ++d) {
    const int64_t n = doc_length(o, d), prompt = n / 4;
    std::string ids, labels;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = (d * 31 + i * 13) % 32000;
      ids += fmt::format("{}{}", i ? ", " : "", t);
      labels += fmt::format("{}{}", i ? ", " : "", i < prompt ? -100 : t);
    }
    out << "{\"input_ids\": [" << ids << "], \"labels\": [" << labels << "]}\n";
  }
}

// Text records of about the documents' lengths in words: a quarter prompt.
void write_text(const Options& o, const std::string& path) {
  static const char* const kWords[] = {"the", "optimizer", "state", "is", "sharded", "across", "ranks", "and",
                                       "gradients", "reduce", "scatter", "parameters", "gather", "before", "use",
                                       "memory", "of", "each", "GPU", "falls", "with", "their", "number"};
  std::ofstream out(path);
  for (int64_t d = 0; d < o.documents; ++d) {
    const int64_t n = doc_length(o, d), prompt = n / 4;
    std::string p, c;
    for (int64_t i = 0; i < n; ++i) {
      std::string& s = i < prompt ? p : c;
      s += fmt::format("{}{}", i == 0 ? "" : " ", kWords[(d * 31 + i * 13) % 23]);
    }
    out << "{\"prompt\": \"" << p << "\", \"completion\": \"" << c << "\"}\n";
  }
}

// Every row of a packed plan made once: tokens in rows per second.
// `trained` counts the rows' trained tokens (which keeps the rows made).
double rows_rate(const zest::TokenDataset& data, const Options& o, int64_t& trained) {
  const auto t0 = Clock::now();
  const zest::RowPlan plan(data, 0, {.max_seq_len = o.row, .packing = true, .shuffle = true, .seed = 1});
  trained = 0;
  for (int64_t r = 0; r < plan.rows(); ++r) trained += zest::make_row(data, plan.row(r), o.row).trained();
  return static_cast<double>(plan.tokens()) / seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  cli::App app("data_bench: the fine-tuning data path's tokens/s", "data_bench");
  app.add_option("--documents", o.documents)->check(cli::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--tokens-per-doc", o.tokens_per_doc)->check(cli::Range(int64_t{2}, int64_t{1} << 20));
  app.add_option("--row", o.row)->check(cli::Range(int64_t{2}, int64_t{1} << 24));
  app.add_option("--rounds", o.rounds)->check(cli::Range(1, 1000));
  app.add_option("--dir", o.dir);
  app.add_option("--tokenizer", o.tokenizer);
  const std::string usage = app.help();
  try {
    cli::parse(app, argc, argv);
  } catch (const cli::UsageError& e) {
    return cli::usage_exit("data_bench", e, usage);
  }
  try {
    const std::string prefix = o.dir + "/zest_data_bench", jsonl = prefix + ".jsonl", text = prefix + ".text.jsonl";
    write_megatron(o, prefix);
    write_jsonl(o, jsonl);
    const bool with_text = zest::has_sentencepiece();
    std::shared_ptr<const zest::HfTokenizer> tokenizer;
    if (with_text) {
      write_text(o, text);
      tokenizer = std::make_shared<const zest::HfTokenizer>(o.tokenizer);
    }
    int64_t total = 0;
    for (int64_t d = 0; d < o.documents; ++d) total += doc_length(o, d);
    fmt::print("data_bench ({} build): {} documents, {} tokens, rows of {} packed, one thread, the best of {} rounds\n",
               ZEST_BENCH_BUILD_TYPE, o.documents, total, o.row, o.rounds);
    double copy = 0, megatron = 0, open = 0, json_rows = 0, text_open = 0, text_rows = 0;
    int64_t text_tokens = 0;
    std::vector<int64_t> src(static_cast<size_t>(total)), dst(static_cast<size_t>(total));
    for (int round = 0; round < o.rounds; ++round) {
      auto t0 = Clock::now();
      std::memcpy(dst.data(), src.data(), src.size() * sizeof(int64_t));
      copy = std::max(copy, static_cast<double>(total) / seconds_since(t0));
      int64_t trained = 0, json_trained = 0;
      const zest::MegatronDataset mg(prefix, 32000);
      megatron = std::max(megatron, rows_rate(mg, o, trained));
      t0 = Clock::now();
      const zest::TokenizedJsonl js(jsonl, 32000);
      open = std::max(open, static_cast<double>(total) / seconds_since(t0));
      json_rows = std::max(json_rows, rows_rate(js, o, json_trained));
      // Every token but each document's last is trained in the Megatron
      // rows; the JSONL's prompts (a quarter) are masked.
      if (trained != total - o.documents || json_trained >= trained) {
        throw std::runtime_error(fmt::format("trained tokens {} (megatron) and {} (jsonl) are not as written",
                                             trained, json_trained));
      }
      if (with_text) {
        t0 = Clock::now();
        const zest::TextJsonl tx(text, tokenizer, 32768);
        text_tokens = 0;
        for (int64_t d = 0; d < tx.size(); ++d) text_tokens += tx.length(d);
        text_open = std::max(text_open, static_cast<double>(text_tokens) / seconds_since(t0));
        int64_t text_trained = 0;
        text_rows = std::max(text_rows, rows_rate(tx, o, text_trained));
        if (text_trained <= 0 || text_trained >= text_tokens) {
          throw std::runtime_error(fmt::format("text: {} of {} tokens trained", text_trained, text_tokens));
        }
      }
    }
    fmt::print("{:<40} {:>14} {:>10}\n", "path", "Mtokens/s", "x memcpy");
    const auto row = [&](const char* name, double rate) {
      fmt::print("{:<40} {:>14.2f} {:>10.4f}\n", name, rate / 1e6, rate / copy);
    };
    row("memcpy of the tokens as int64 (baseline)", copy);
    row("megatron: plan + rows made", megatron);
    row("jsonl: opening pass (parse every record)", open);
    row("jsonl: plan + rows made (parse again)", json_rows);
    if (with_text) {
      fmt::print("text JSONL: {} tokens by {}\n", text_tokens, tokenizer->describe());
      row("text: opening pass (tokenize every record)", text_open);
      row("text: plan + rows made (tokenize again)", text_rows);
      std::filesystem::remove(text);
    } else {
      fmt::print("text JSONL: skipped, this build has no SentencePiece\n");
    }
    std::filesystem::remove(prefix + ".bin");
    std::filesystem::remove(prefix + ".idx");
    std::filesystem::remove(jsonl);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "data_bench: %s\n", e.what());
    return 1;
  }
}
