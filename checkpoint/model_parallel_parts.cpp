#include "zest/checkpoint/model_parallel_parts.h"

#include <filesystem>
#include <regex>

#include <fmt/format.h>

#include "zest/comm/gather_scalars.h"
#include "zest/core/check.h"
#include "zest/core/crc32.h"
#include "zest/memory/raw_allocator.h"

namespace zest {
namespace fs = std::filesystem;

std::string model_parallel_part_root(const std::string& root, const ModelParallel& mp) {
  return (fs::path(root) / fmt::format("mp_rank_{:02d}_{:03d}", mp.tp_rank, mp.pp_rank)).string();
}

void check_model_parallel_parts(const std::string& root, const ModelParallel& mp) {
  std::error_code ec;
  ZEST_CHECK(fs::is_directory(root, ec), "load_checkpoint: '{}' is not a directory", root);
  int tp = 0, pp = 0, parts = 0;
  const std::regex part(R"(mp_rank_(\d+)_(\d+))");
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (!std::regex_match(name, m, part)) continue;
    tp = std::max(tp, std::stoi(m[1].str()) + 1);
    pp = std::max(pp, std::stoi(m[2].str()) + 1);
    ++parts;
  }
  ZEST_CHECK(!ec, "load_checkpoint: cannot list '{}': {}", root, ec.message());
  ZEST_CHECK(parts > 0,
             "load_checkpoint: '{}' holds no mp_rank_TT_PPP parts: it was saved without tensor or pipeline "
             "parallelism, and this run has tp {} x pp {}; load it with tp = pp = 1 (only the data-parallel size "
             "reshards)",
             root, mp.tp_size, mp.pp_size);
  ZEST_CHECK(tp == mp.tp_size && pp == mp.pp_size,
             "load_checkpoint: '{}' was saved on a mesh of tp {} x pp {}, and this run has tp {} x pp {}: the "
             "parts are split otherwise; load it on tp {} x pp {} (any data-parallel size)",
             root, tp, pp, mp.tp_size, mp.pp_size, tp, pp);
  const std::string mine = model_parallel_part_root(root, mp);
  ZEST_CHECK(fs::is_directory(mine, ec), "load_checkpoint: '{}' is missing: the part of tp rank {}, pp rank {}",
             mine, mp.tp_rank, mp.pp_rank);
}

void agree_over_model_parallel(Engine& engine, std::string_view what, const std::string& root, bool ok,
                               const std::string& tag, int64_t steps) {
  const ModelParallel& mp = engine.model_parallel();
  Communicator& group = *mp.group;
  CachingAllocator alloc(group.device().is_cuda() ? make_cuda_allocator(group.device().index())
                                                  : make_host_allocator());
  const int64_t mine[3] = {ok ? 1 : 0, static_cast<int64_t>(crc32(tag.data(), tag.size())), steps};
  const std::vector<int64_t> all = all_gather_int64(group, alloc, Stream::default_for(group.device()), mine);
  if (!ok) return;
  // The group's rank r is tp rank r % tp, pp rank r / tp (Megatron's order).
  for (int r = 0; r < group.size(); ++r) {
    const int64_t* theirs = &all[3 * static_cast<size_t>(r)];
    ZEST_CHECK(theirs[0] == 1,
               "{}('{}'): the part of tp rank {}, pp rank {} failed (its ranks say why), so this part was not "
               "published either: every part's `latest` still names the last checkpoint saved",
               what, root, r % mp.tp_size, r / mp.tp_size);
    ZEST_CHECK(theirs[1] == mine[1] && theirs[2] == steps,
               "{}('{}'): the parts hold different checkpoints: this part (tp rank {}, pp rank {}) read '{}' at step "
               "{}, the part of tp rank {}, pp rank {} another at step {}: a save failed after some parts "
               "published? Load with a tag every part has (CheckpointOptions::tag)",
               what, root, mp.tp_rank, mp.pp_rank, tag, steps, r % mp.tp_size, r / mp.tp_size, theirs[2]);
  }
}

}  // namespace zest
