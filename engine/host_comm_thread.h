// Whether the engine's communication stream on the host gets a thread of its
// own (Note [the host's communication thread] in host_comm_thread.cpp).
#pragma once

#include "zest/comm/communicator.h"
#include "zest/config/config.h"
#include "zest/memory/caching_allocator.h"

namespace zest {

// True when `config` asks for overlap_comm on a host communicator of more
// than one rank that can take collectives from another thread, and either
// ZeroConfig::host_comm_thread says so, or, unset, ZEST_HOST_COMM_THREAD
// (1 or 0) does, or, unset too, every rank sharing this process's CPUs has
// one to spare. Collective over `control` (the ranks of `comm`) when
// overlap_comm applies.
bool use_host_comm_thread(const EngineConfig& config, const Communicator& comm, Communicator& control,
                          CachingAllocator& alloc, const Stream& stream);

// The default's rule: `cpus` this process may run on, of the host's
// `host_cpus`, for `in_process` ranks in this process and `on_host` ranks on
// this host.
bool core_to_spare(int cpus, int host_cpus, int in_process, int on_host);

}  // namespace zest
