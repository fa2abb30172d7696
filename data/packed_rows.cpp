#include "zest/data/packed_rows.h"

#include <algorithm>
#include <numeric>

#include "zest/core/check.h"
#include "zest/data/distributed_sampler.h"

namespace zest {

RowPlan::RowPlan(const TokenDataset& data, int64_t epoch, RowPlanOptions options) : options_(options) {
  ZEST_CHECK(options.max_seq_len > 1, "a row of {} tokens: give at least 2 (a token and the one it predicts)",
             options.max_seq_len);
  ZEST_CHECK(epoch >= 0, "epoch {} is negative", epoch);
  const int64_t n = data.size();
  std::vector<int64_t> order;
  if (options.shuffle) {
    order = torch_randperm(n, options.seed + static_cast<uint64_t>(epoch));
  } else {
    order.resize(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  int64_t room = 0;  // left in the current row
  for (const int64_t d : order) {
    const int64_t length = data.length(d);
    if (length == 0) continue;
    const int64_t take = std::min(length, options.max_seq_len);
    if (take < length) {
      ++truncated_;
      truncated_tokens_ += length - take;
    }
    if (!options.packing || take > room) {
      row_begin_.push_back(static_cast<int64_t>(pieces_.size()));
      room = options.max_seq_len;
    }
    pieces_.push_back({d, take});
    room -= take;
    tokens_ += take;
  }
}

std::span<const RowPiece> RowPlan::row(int64_t r) const {
  ZEST_CHECK(r >= 0 && r < rows(), "row {} of a plan of {} rows", r, rows());
  const size_t begin = static_cast<size_t>(row_begin_[static_cast<size_t>(r)]);
  const size_t end = r + 1 < rows() ? static_cast<size_t>(row_begin_[static_cast<size_t>(r) + 1]) : pieces_.size();
  return std::span<const RowPiece>(pieces_).subspan(begin, end - begin);
}

int64_t TokenRow::trained() const {
  return std::count_if(targets.begin(), targets.end(), [](int64_t t) { return t != kIgnoreIndex; });
}

TokenRow make_row(const TokenDataset& data, std::span<const RowPiece> pieces, int64_t pad_to, int64_t pad_id) {
  TokenRow row;
  int64_t doc = 0;
  for (const RowPiece& p : pieces) {
    TokenDocument d = data.document(p.document);
    ZEST_CHECK(static_cast<int64_t>(d.tokens.size()) >= p.tokens,
               "{}: document {} has {} tokens, the plan {}: the data changed since the plan was made",
               data.path(), p.document, d.tokens.size(), p.tokens);
    for (int64_t t = 0; t < p.tokens; ++t) {
      const size_t i = static_cast<size_t>(t);
      row.tokens.push_back(d.tokens[i]);
      const bool last = t + 1 == p.tokens;
      row.targets.push_back(last ? kIgnoreIndex : d.labels.empty() ? d.tokens[i + 1] : d.labels[i + 1]);
      row.positions.push_back(t);
      row.documents.push_back(doc);
    }
    ++doc;
  }
  const int64_t used = static_cast<int64_t>(row.tokens.size());
  ZEST_CHECK(pad_to >= used, "a row of {} tokens padded to {}: pad to at least its length", used, pad_to);
  row.tokens.resize(static_cast<size_t>(pad_to), pad_id);
  row.targets.resize(static_cast<size_t>(pad_to), kIgnoreIndex);
  row.positions.resize(static_cast<size_t>(pad_to), 0);
  row.documents.resize(static_cast<size_t>(pad_to), -1);
  return row;
}

}  // namespace zest
