#include "zest/mesh/device_mesh.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "zest/memory/copy.h"
#include "zest/memory/raw_allocator.h"

namespace zest {
namespace {

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// Every rank's host, as a hash of its host name (equal names, one host).
// An all-gather on the communicator's device: host memory on the host
// backends, a device buffer on a GPU.
std::vector<int64_t> host_hashes(Communicator& world) {
  char name[HOST_NAME_MAX + 1] = {};
  ZEST_CHECK(gethostname(name, sizeof(name) - 1) == 0, "device mesh: gethostname failed: {}", std::strerror(errno));
  const int64_t mine = static_cast<int64_t>(fnv1a(name));
  const size_t n = static_cast<size_t>(world.size());
  std::vector<int64_t> all(n);
  const Stream stream = Stream::default_for(world.device());
  if (world.device().is_host()) {
    world.all_gather(&mine, all.data(), 1, DType::kInt64, stream);
    return all;
  }
  std::unique_ptr<RawAllocator> raw = make_cuda_allocator(world.device().index());
  const size_t bytes = (n + 1) * sizeof(int64_t);
  void* buf = raw->allocate(bytes);
  ZEST_CHECK(buf != nullptr, "device mesh: no {} bytes of {} memory for the host exchange", bytes,
             world.device().str());
  try {
    auto* dev = static_cast<int64_t*>(buf);
    copy_bytes(stream, dev + n, &mine, sizeof(mine));
    world.all_gather(dev + n, dev, 1, DType::kInt64, stream);
    copy_bytes(stream, all.data(), dev, n * sizeof(int64_t));
    stream.synchronize();
  } catch (...) {
    raw->deallocate(buf, bytes);
    throw;
  }
  raw->deallocate(buf, bytes);
  return all;
}

// Throws unless every tp group lies on one host. Every rank runs the same
// check on the same data, so all refuse alike.
void check_tp_within_hosts(const MeshShape& shape, const std::vector<int64_t>& host) {
  for (int first = 0; first < shape.world(); first += shape.tp) {
    const std::vector<int> ranks = tp_group_ranks(shape, first);
    for (int r : ranks) {
      if (host[static_cast<size_t>(r)] == host[static_cast<size_t>(ranks.front())]) continue;
      // How many consecutive ranks the first host holds, for the advice.
      int per_host = 0;
      while (per_host < shape.world() && host[static_cast<size_t>(per_host)] == host[0]) ++per_host;
      ZEST_FAIL("device mesh {}: tensor-parallel group {} spans hosts (rank {} is on another host than rank {}), "
                "and tensor parallelism all-reduces activations in every layer; the first host holds ranks "
                "0-{} ({} per host): choose a tp size that divides the ranks per host, and launch consecutive "
                "ranks on each host (torchrun, mpirun --map-by slot and Slurm's block distribution do), or set "
                "MeshOptions::tp_within_host = false to allow it",
                shape.str(), fmt::format("[{}]", fmt::join(ranks, ",")), r, ranks.front(), per_host - 1,
                per_host);
    }
  }
}

}  // namespace

DeviceMesh::DeviceMesh(Communicator& world, MeshShape shape, MeshOptions options)
    : world_(world), shape_(shape) {
  check_mesh_shape(shape, world.size());
  coord_ = mesh_coord(shape, world.rank());
  if (options.tp_within_host && shape.tp > 1) {
    std::vector<int64_t> host;
    if (options.host_of_rank.empty()) {
      host = host_hashes(world);
    } else {
      ZEST_CHECK(options.host_of_rank.size() == static_cast<size_t>(world.size()),
                 "MeshOptions::host_of_rank has {} entries; give one per world rank ({})",
                 options.host_of_rank.size(), world.size());
      host.assign(options.host_of_rank.begin(), options.host_of_rank.end());
    }
    check_tp_within_hosts(shape, host);
  }
  // Each group is a color: the index of its first member, unique among the
  // groups of one kind; the world rank as key keeps the members ascending.
  const int r = world.rank();
  tp_ = world.split(tp_group_ranks(shape, r).front(), r);
  dp_ = world.split(dp_group_ranks(shape, r).front(), r);
  pp_ = world.split(pp_group_ranks(shape, r).front(), r);
  mp_ = world.split(model_parallel_group_ranks(shape, r).front(), r);
  const std::vector<int> embedding = embedding_group_ranks(shape, r);
  embedding_ = world.split(embedding.empty() ? -1 : embedding.front(), r);
}

DeviceMesh::~DeviceMesh() = default;

ModelParallel DeviceMesh::engine_model_parallel() const {
  ModelParallel m;
  m.group = shape_.tp * shape_.pp > 1 ? mp_.get() : nullptr;
  m.tp_rank = coord_.tp;
  m.tp_size = shape_.tp;
  m.pp_rank = coord_.pp;
  m.pp_size = shape_.pp;
  return m;
}

}  // namespace zest
