#include "zest/data/token_dataset.h"

#include "zest/core/check.h"
#include "zest/data/megatron_dataset.h"
#include "zest/data/tokenized_jsonl.h"

namespace zest {

std::unique_ptr<TokenDataset> open_token_dataset(const std::string& format, const std::string& path,
                                                 int64_t vocab_size) {
  if (format == "megatron") return std::make_unique<MegatronDataset>(path, vocab_size);
  if (format == "jsonl") return std::make_unique<TokenizedJsonl>(path, vocab_size);
  ZEST_FAIL("data format '{}': the formats are megatron (PATH.bin and PATH.idx, Megatron-LM's indexed dataset) and "
            "jsonl (tokenized records: input_ids, labels, attention_mask)",
            format);
}

}  // namespace zest
