// The `aio` section of a DeepSpeed config (deepspeed/runtime/swap_tensor/
// aio_config.py), under DeepSpeed's names and with its defaults: how the
// NVMe tier's I/O engine (nvme/aio_backend.h) splits and queues requests.
//
//   block_size            bytes of one I/O request; a larger transfer is cut
//                         into requests of this size (DeepSpeed's libaio op
//                         does the same).
//   queue_depth           requests in flight at once (io_uring: the ring's
//                         submission entries and the cap on what is queued
//                         in the kernel).
//   intra_op_parallelism  threads of the thread-pool back end (DeepSpeed:
//                         threads that split one transfer; older files
//                         call it thread_count).
//   single_submit         submit each request on its own (true) or the
//                         requests of one transfer in one system call.
//   overlap_events        DeepSpeed's libaio loop submits new requests while
//                         reaping completions; io_uring always does, so it
//                         is read and noted (config/).
//   use_gds               GPUDirect Storage (cuFile): not supported; a file
//                         with true is refused by the config.
#pragma once

#include <cstdint>

namespace zest {

struct AioConfig {
  int64_t block_size = 1048576;
  int queue_depth = 8;
  int intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
};

}  // namespace zest
