// The top-level `aio` section (DeepSpeed's runtime/swap_tensor/aio_config.py,
// read with dict lookups): the NVMe tier's I/O settings, under DeepSpeed's
// names and defaults (nvme/aio_config.h), each checked for its type and
// range. DeepSpeed reads the section whatever the offload device but uses
// it only for "nvme": without it, it is noted as ignored.
#include <fmt/format.h>

#include "zest/config/detail/config_sections.h"

namespace zest::config_detail {

void read_aio(Section& top, FileState& file) {
  std::optional<Section> a = top.sub("aio", Unknown::kIgnoreUnlessTypo);
  if (!a) return;
  AioConfig& c = file.out.aio;
  if (a->read_int("block_size", c.block_size, 4096, int64_t{1} << 30) && c.block_size % 4096 != 0) {
    a->problem("block_size", fmt::format("is {}: direct I/O needs a multiple of 4096 bytes (DeepSpeed's default is "
                                         "1048576)",
                                         c.block_size));
  }
  a->read_int("queue_depth", c.queue_depth, 1, 1 << 16);
  // Older DeepSpeed (before 0.15) calls it thread_count.
  if (const char* threads = a->either("intra_op_parallelism", "thread_count")) {
    a->read_int(threads, c.intra_op_parallelism, 1, 1024);
  }
  a->read_bool("single_submit", c.single_submit);
  // io_uring reaps completions while it submits, whatever the value.
  a->read_bool("overlap_events", c.overlap_events);
  a->refuse_if("use_gds", is_on, "GPUDirect Storage (cuFile reads and writes between the drive and the GPU)",
               "false, as in ZEST");
  a->finish();
  const bool nvme = file.out.offload_optimizer.device == OffloadDevice::kNvme ||
                    file.out.offload_param.device == OffloadDevice::kNvme;
  if (!nvme) file.ignored("aio", "NVMe I/O settings: DeepSpeed uses them only with offload device \"nvme\"");
}

}  // namespace zest::config_detail
