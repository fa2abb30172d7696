#include "common/token_data.h"

#include <array>
#include <bit>
#include <cmath>

#include "zest/core/check.h"
#include "zest/tokenizer/hf_tokenizer.h"
#include "zest/tokenizer/text_jsonl.h"

namespace examples {

void add_token_data_flags(cli::App& app, TokenDataFlags& flags) {
  app.add_option("--format", flags.format)->check(cli::IsMember({"fortunes", "megatron", "jsonl", "text"}));
  app.add_option("--tokenizer", flags.tokenizer);
  app.add_option("--val-data", flags.val_data);
  app.add_option("--max-seq-len", flags.max_seq_len)->check(cli::Range(int64_t{2}, int64_t{1} << 24));
  app.add_flag("--packing", flags.packing);
  app.add_option("--epochs", flags.epochs)->check(cli::Range(int64_t{1}, int64_t{1} << 20));
}

void check_token_data_flags(TokenDataFlags& flags, const std::string& hf_dir) {
  if (flags.format == "text" && flags.tokenizer.empty()) {
    if (hf_dir.empty()) {
      cli::usage_error("--format text needs a tokenizer: --tokenizer PATH (a checkpoint directory or its "
                       "tokenizer.model), or --hf DIR whose tokenizer.model is used");
    }
    flags.tokenizer = hf_dir;
  } else if (flags.format != "text" && !flags.tokenizer.empty()) {
    cli::usage_error("--tokenizer is for --format text (text JSONL tokenized as it is read); --format {} is {}",
                     flags.format, flags.tokenized() ? "already tokenized" : "the byte-level fortune corpus");
  }
  if (flags.tokenized()) return;
  const auto refuse = [](const char* flag) {
    cli::usage_error("{} needs a dataset: --format megatron, jsonl or text with --data", flag);
  };
  if (!flags.val_data.empty()) refuse("--val-data");
  if (flags.max_seq_len > 0) refuse("--max-seq-len");
  if (flags.packing) refuse("--packing");
  if (flags.epochs > 0) refuse("--epochs");
}

std::unique_ptr<zest::TokenDataset> open_dataset(const TokenDataFlags& flags, const std::string& path, int64_t vocab) {
  if (flags.format != "text") return zest::open_token_dataset(flags.format, path, vocab);
  auto tokenizer = std::make_shared<const zest::HfTokenizer>(flags.tokenizer);
  return std::make_unique<zest::TextJsonl>(path, std::move(tokenizer), vocab);
}

Batch to_batch(const zest::TokenDataset& data, const std::vector<std::vector<zest::RowPiece>>& rows, int64_t pad_to,
               bool packed) {
  const int64_t n = static_cast<int64_t>(rows.size());
  const auto tensor = [&] { return torch::empty({n, pad_to}, torch::kLong); };
  Batch b{tensor(), tensor(), packed ? tensor() : torch::Tensor(), packed ? tensor() : torch::Tensor()};
  for (int64_t r = 0; r < n; ++r) {
    const zest::TokenRow row = zest::make_row(data, rows[static_cast<size_t>(r)], pad_to);
    const auto put = [&](torch::Tensor& t, const std::vector<int64_t>& v) {
      std::memcpy(t[r].data_ptr<int64_t>(), v.data(), v.size() * sizeof(int64_t));
    };
    put(b.inputs, row.tokens);
    put(b.targets, row.targets);
    if (packed) {
      put(b.positions, row.positions);
      put(b.documents, row.documents);
    }
  }
  return b;
}

TokenData::TokenData(const TokenDataFlags& flags, const std::string& path, int64_t vocab, int64_t max_seq_len,
                     int64_t global_batch, uint64_t seed)
    : data_(open_dataset(flags, path, vocab)),
      max_seq_len_(max_seq_len),
      packing_(flags.packing),
      batches_(*data_, {.max_seq_len = max_seq_len, .packing = flags.packing, .shuffle = true, .seed = seed},
               global_batch) {}

Batch TokenData::rows(int64_t step, int64_t first, int64_t count) {
  std::vector<std::vector<zest::RowPiece>> rows;
  for (int64_t i = first; i < first + count; ++i) {
    const std::span<const zest::RowPiece> r = batches_.row(step, i);
    rows.emplace_back(r.begin(), r.end());
  }
  return to_batch(*data_, rows, max_seq_len_, packing_);
}

int64_t TokenData::steps(int64_t epochs) {
  int64_t n = 0;
  for (int64_t e = 0; e < epochs; ++e) n += batches_.steps_in_epoch(e);
  return n;
}

int64_t global_trained_tokens(zest::Engine& engine, const std::vector<Batch>& micro_batches) {
  int64_t mine = 0;
  for (const Batch& b : micro_batches) mine += (b.targets != -100).sum().item<int64_t>();
  const std::array<int64_t, 1> local = {mine};
  int64_t total = 0;
  for (const int64_t n : engine.all_gather_scalars(local)) total += n;
  return total;
}

HeldOutLoss held_out_loss(zest::Engine& engine, MeshTrainer& trainer, const zest::TokenDataset& data,
                          zest::RowPlanOptions options, int64_t chunk) {
  options.shuffle = false;
  const zest::RowPlan plan(data, 0, options);
  const int64_t world = engine.comm().size(), rank = engine.comm().rank();
  const int64_t per_rank = (plan.rows() + world - 1) / world;
  double sum = 0.0;
  int64_t trained = 0;
  for (int64_t i = 0; i < per_rank; i += chunk) {
    std::vector<std::vector<zest::RowPiece>> rows;
    for (int64_t k = i; k < std::min(per_rank, i + chunk); ++k) {
      const int64_t r = k * world + rank;
      if (r < plan.rows()) {
        const auto row = plan.row(r);
        rows.emplace_back(row.begin(), row.end());
      } else {
        rows.emplace_back();  // padding only: nothing trained
      }
    }
    const Batch b = to_batch(data, rows, options.max_seq_len, options.packing);
    trained += (b.targets != -100).sum().item<int64_t>();
    sum += trainer.loss_sum(b);
    engine.end_forward();
  }
  const std::array<int64_t, 2> mine = {std::bit_cast<int64_t>(sum), trained};
  const std::vector<int64_t> all = engine.all_gather_scalars(mine);
  HeldOutLoss out;
  double total = 0.0;
  for (size_t r = 0; r < all.size(); r += 2) {
    total += std::bit_cast<double>(all[r]);
    out.tokens += all[r + 1];
  }
  ZEST_CHECK(out.tokens > 0, "{}: the held-out data has no trained tokens", data.path());
  out.loss = total / static_cast<double>(out.tokens);
  out.perplexity = std::exp(out.loss);
  out.rows = plan.rows();
  return out;
}

}  // namespace examples
