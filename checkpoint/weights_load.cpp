// load_owned_weights (weights_io.h): this rank's shard of each unit read
// with positioned reads and written into the engine in one pass. A
// tensor-parallel slice of a parameter is read from the whole tensor in the
// file run by run (owned_pieces.h's SourceMap).
//
// Note [one pass from the file into the shard]: a unit's owned byte ranges
// are read as stored into one of two reusable buffers (F64 converted to
// fp32 as it is read), or with map_files looked at where the page cache
// holds them (file_view.h: mapped, each chunk populated first, so an I/O
// error is an error and not SIGBUS; measured slower here, see
// HfImportOptions::map_files). Each chunk is checked for NaN/Inf on its raw
// bits right after it is read, while it is in cache. Only a unit found clean is stored:
// converted from the file's bytes straight into the master shard and the
// compute-dtype parameters (Engine::load_shard), so a unit holding a bad
// value keeps its previous values without a copy of them. The reads of unit
// u + 1 and the stores of unit u are one work list, shared by the threads,
// so the disk is kept busy while the host stores. Memory: the pages of two
// units' shards as stored, mapped or in the buffers.
//
// Where a unit's shard comes whole in the compute dtype into host memory (a
// bf16 checkpoint into bf16 parameters) a store would be a copy of the
// file's bytes, and the master is widened later (Note [a master widened
// when first read] in engine/engine_load.cpp): its pieces are read straight
// into the parameters (Engine::ShardLoad::in_place), one copy from the page
// cache as a plain read makes, with no buffer. A unit found holding a bad
// value then gets its parameters back from its master, which the load did
// not touch (Engine::abandon_shard_load; a frozen unit has no master and is
// zeroed instead).

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstring>
#include <memory>

#include "zest/checkpoint/detail/owned_pieces.h"
#include "zest/checkpoint/weights_io.h"
#include "zest/core/check.h"
#include "zest/memory/raw_allocator.h"
#include "zest/optim/grad_ops.h"

namespace zest {
namespace {

// Elements per read and check (4 MiB of bf16): long enough that the
// kernel's readahead and its copy run at their rate (512 KiB reads measured
// 5-20 points slower warm), short enough that the check finds the read's
// bytes in the last-level cache.
constexpr size_t kReadElems = size_t{1} << 21;
// Elements per store task (several threads share a unit).
constexpr size_t kStoreElems = size_t{1} << 18;
constexpr size_t kRawAlign = 64;
constexpr size_t kHugePage = size_t{2} << 20;

// A piece's elements as the buffer holds them: the file's bytes for F32,
// F16 and BF16, fp32 for F64 (converted as read: beyond fp32's range it
// becomes Inf, found by the check like one in the file).
struct RawPiece {
  const detail::OwnedPiece* piece;
  DType dtype;
  size_t offset;                  // bytes into the unit's buffer, where not viewed
  std::optional<FileView> view;   // the file's own pages, where it stores `dtype`
  std::byte* in_place = nullptr;  // the parameters the piece is read into (Engine::ShardLoad::in_place)
};

// Index of the first NaN or Inf among n elements of `dtype` at p, or -1:
// one vectorized pass (any_non_finite_host, at memory speed), and a second
// look one element at a time only where it found one.
int64_t first_non_finite(DType dtype, const std::byte* p, size_t n) {
  if (!any_non_finite_host(p, dtype, n)) return -1;
  const size_t size = elem_size(dtype);
  for (size_t i = 0; i < n; ++i) {
    if (any_non_finite_host(p + i * size, dtype, 1)) return static_cast<int64_t>(i);
  }
  ZEST_INTERNAL_ASSERT(false, "first_non_finite: the pass found a value the scan did not");
  return -1;
}

// One task of a step: a read (or populate) and check of unit u + 1's chunk, or a store
// of unit u's chunk (raw null: zeros, the padding).
struct Task {
  bool read;
  const RawPiece* raw;
  size_t begin, end;       // in the unit's flat buffer
  int64_t first_bad = -1;  // reads: in the whole tensor
};

class UnitBuffer {
 public:
  // The unit's pieces laid out in the buffer, which grows to hold them, or
  // in `in_place` (the unit's shard, from shard_begin in the unit) where it
  // is given.
  void lay_out(const std::vector<detail::OwnedPiece>& pieces, bool map_files, std::span<std::byte> in_place,
               size_t shard_begin) {
    raws_.clear();
    in_place_ = in_place;
    size_t at = 0;
    for (const detail::OwnedPiece& p : pieces) {
      const SafetensorsTensor& t = p.from.file->tensor(p.from.tensor);
      const std::optional<DType> stored = t.zest_dtype;
      const DType d = stored && is_floating(*stored) ? *stored : DType::kFloat32;  // F64: converted when read
      const size_t bytes = (p.end - p.begin) * elem_size(d);
      if (!in_place.empty()) {
        ZEST_INTERNAL_ASSERT(stored == d && (p.end - shard_begin) * elem_size(d) <= in_place.size(),
                             "an in-place read of '{}' that is not a copy", p.param->name);
        raws_.push_back({&p, d, 0, std::nullopt, in_place.data() + (p.begin - shard_begin) * elem_size(d)});
        continue;
      }
      if (stored == d && map_files && p.map.run == 0) {
        // The file's pages themselves: no copy, and no buffer to fault in.
        std::optional<FileView> v =
            p.from.file->view_range(p.from.tensor, (p.begin - p.param->offset) * t.elem_size, bytes);
        if (v) {
          v->prefetch();  // read ahead while the previous unit is stored
          raws_.push_back({&p, d, 0, std::move(v)});
          continue;
        }
      }
      raws_.push_back({&p, d, at, std::nullopt});
      at += (bytes + kRawAlign - 1) / kRawAlign * kRawAlign;
    }
    if (at > size_) {
      data_.reset();  // the old buffer goes first
      // From the host allocator, in huge pages where the kernel gives them
      // (Note [host memory in huge pages]): first-touch faults (a buffer is
      // new at each import) cost 512 times fewer.
      size_ = (at + kHugePage - 1) / kHugePage * kHugePage;
      data_ = {static_cast<std::byte*>(host_->allocate(size_)), Free{host_.get(), size_}};
      ZEST_CHECK(data_ != nullptr, "loading weights: cannot allocate a read buffer of {} bytes", size_);
    }
  }
  const std::vector<RawPiece>& raws() const { return raws_; }
  // A range of the buffer or of the in-place parameters (never of a view)
  // for a read to fill.
  std::span<std::byte> writable(const std::byte* p, size_t n) const {
    std::byte* const place = in_place_.data();
    if (p >= place && p + n <= place + in_place_.size()) return {place + (p - place), n};
    ZEST_INTERNAL_ASSERT(p >= data_.get() && p + n <= data_.get() + size_, "a read into a loader's view");
    return {data_.get() + (p - data_.get()), n};
  }
  const std::byte* at(const RawPiece& r, size_t element) const {
    const size_t skip = (element - r.piece->begin) * elem_size(r.dtype);
    if (r.in_place != nullptr) return r.in_place + skip;
    return r.view ? r.view->bytes().data() + skip : data_.get() + r.offset + skip;
  }

 private:
  std::vector<RawPiece> raws_;
  std::span<std::byte> in_place_;
  struct Free {
    RawAllocator* raw;
    size_t bytes;
    void operator()(std::byte* p) const { raw->deallocate(p, bytes); }
  };
  std::unique_ptr<RawAllocator> host_ = make_host_allocator();  // outlives data_
  std::unique_ptr<std::byte, Free> data_{nullptr, Free{nullptr, 0}};
  size_t size_ = 0;
};

void read_chunk(const UnitBuffer& buffer, Task& t) {
  const RawPiece& r = *t.raw;
  const OwnedWeightSource& from = r.piece->from;
  const detail::SourceMap& map = r.piece->map;
  const SafetensorsTensor& tensor = from.file->tensor(from.tensor);
  const uint64_t first = t.begin - r.piece->param->offset;  // in the parameter
  const size_t size = elem_size(r.dtype), n = t.end - t.begin;
  const std::byte* in = buffer.at(r, t.begin);
  if (r.view) {
    r.view->populate(static_cast<size_t>(in - r.view->bytes().data()), n * size);
  } else {
    // A tensor-parallel slice: one read per run of the whole tensor (a
    // whole parameter is one run).
    for (size_t i = 0; i < n;) {
      const size_t count = map.contiguous_from(first + i, n - i);
      const std::span<std::byte> into = buffer.writable(in + i * size, count * size);
      if (tensor.zest_dtype == r.dtype) {
        from.file->read_range(from.tensor, map.at(first + i) * tensor.elem_size, into);
      } else {
        from.file->read_range_as(from.tensor, r.dtype, map.at(first + i), into);
      }
      i += count;
    }
  }
  // fp32, fp16 and bf16 widen exactly, so a non-finite value here is one
  // in the file (or an F64 beyond fp32).
  if (const int64_t bad = first_non_finite(r.dtype, in, n); bad >= 0) {
    t.first_bad = static_cast<int64_t>(map.at(first + static_cast<size_t>(bad)));
  }
}

// All-zero bytes: +0.0 in every floating dtype, the padding's values.
constexpr size_t kZeroBytes = size_t{32} << 10;
const std::byte* zero_bytes() {
  static const std::array<std::byte, kZeroBytes> zeros{};
  return zeros.data();
}

// Stores [t.begin, t.end) of unit u (of the shard starting at shard_begin)
// from the buffer as read, converted by the engine straight into the master
// and the parameters; the padding as zeros of `padding` (a load in place
// takes the compute dtype only).
void store_chunk(Engine& engine, int u, size_t shard_begin, const UnitBuffer& buffer, const Task& t, DType padding) {
  if (t.raw != nullptr) {
    engine.load_shard(u, t.begin - shard_begin, buffer.at(*t.raw, t.begin), t.raw->dtype, t.end - t.begin);
    return;
  }
  const size_t per = kZeroBytes / elem_size(padding);
  for (size_t b = t.begin; b < t.end; b += per) {
    engine.load_shard(u, b - shard_begin, zero_bytes(), padding, std::min(per, t.end - b));
  }
}

// The next unit's pieces asked of the kernel while this one is read, so
// that the disk has them in flight through the step's last reads and the
// hand-over between units (cold reads; in the page cache it costs nothing).
void will_need(const std::vector<detail::OwnedPiece>& pieces) {
  for (const detail::OwnedPiece& p : pieces) {
    const size_t size = p.from.file->tensor(p.from.tensor).elem_size;
    // A slice's runs lie between its first and its last element.
    const size_t first = p.map.at(p.begin - p.param->offset), last = p.map.at(p.end - 1 - p.param->offset);
    p.from.file->will_need_range(p.from.tensor, first * size, (last + 1 - first) * size);
  }
}

// The dtype every element of the shard comes in (Engine::begin_shard_load's
// every_value): the pieces' common stored dtype, where they cover every
// parameter's part of the shard (the padding is zeros of any dtype).
std::optional<DType> every_value(const std::vector<detail::OwnedPiece>& pieces, bool keeps_some) {
  if (keeps_some || pieces.empty()) return std::nullopt;
  std::optional<DType> common;
  for (const detail::OwnedPiece& p : pieces) {
    const std::optional<DType> d = p.from.file->tensor(p.from.tensor).zest_dtype;
    if (!d || !is_floating(*d) || (common && *common != *d)) return std::nullopt;  // F64 is converted
    common = d;
  }
  return common;
}

// The store tasks of unit u: its pieces and its padding (elements of no
// parameter), in chunks.
std::vector<Task> store_tasks(const UnitLayout& U, size_t shard_begin, const UnitBuffer& buffer) {
  std::vector<Task> out;
  const auto add = [&](const RawPiece* raw, size_t b, size_t e) {
    for (; b < e; b += kStoreElems) out.push_back({false, raw, b, std::min(e, b + kStoreElems)});
  };
  for (const RawPiece& r : buffer.raws()) {
    if (r.in_place == nullptr) add(&r, r.piece->begin, r.piece->end);  // else read there already
  }
  // Padding: the gaps between parameters (sourced or kept) in the shard.
  size_t covered = shard_begin;
  for (const ParamLayout& p : U.params) {
    const size_t b = std::max(shard_begin, p.offset), e = std::min(shard_begin + U.shard, p.offset + p.numel);
    if (b >= e) continue;
    add(nullptr, covered, b);
    covered = e;
  }
  add(nullptr, covered, shard_begin + U.shard);
  return out;
}

}  // namespace

NonFiniteValues load_owned_weights(Engine& engine, const std::function<OwnedWeightSource(const ParamLayout&)>& source,
                                   const std::function<void(uint64_t, uint64_t)>& progress, int threads,
                                   bool map_files) {
  const ModelLayout& layout = engine.layout();
  const auto part = static_cast<size_t>(engine.partition());
  const detail::OwnedReads plan = detail::plan_owned_reads(engine, source);
  const int units = layout.num_units();
  NonFiniteValues non_finite;
  std::array<UnitBuffer, 2> buffers;
  std::atomic<uint64_t> done{0};
  uint64_t reported = 0;  // by the calling thread only
  std::array<Engine::ShardLoad, 2> loads;
  std::array<DType, 2> padding{};  // the dtype each unit's padding is stored in
  bool previous_clean = false;
  // Step k reads unit k and stores unit k - 1 (when it was found clean).
  int k = 0;
  try {
    for (; k <= units; ++k) {
      std::vector<Task> reads, stores;
      if (k < units) {
        const size_t slot = static_cast<size_t>(k % 2);
        const std::vector<detail::OwnedPiece>& pieces = plan.pieces[static_cast<size_t>(k)];
        const std::optional<DType> every = every_value(pieces, plan.keeps_some[static_cast<size_t>(k)]);
        loads[slot] = engine.begin_shard_load(k, every);
        padding[slot] = every.value_or(DType::kFloat32);
        UnitBuffer& b = buffers[slot];
        b.lay_out(pieces, map_files, loads[slot].in_place, layout.unit(k).shard * part);
        for (const RawPiece& r : b.raws()) {
          for (size_t e = r.piece->begin; e < r.piece->end; e += kReadElems) {
            reads.push_back({true, &r, e, std::min(r.piece->end, e + kReadElems)});
          }
        }
        if (k + 1 < units) will_need(plan.pieces[static_cast<size_t>(k + 1)]);
      }
      const int s = k - 1;  // the unit stored
      const UnitBuffer& stored = buffers[static_cast<size_t>((k + 1) % 2)];
      const size_t stored_begin = s >= 0 ? layout.unit(s).shard * part : 0;
      const DType stored_padding = padding[static_cast<size_t>((k + 1) % 2)];
      if (previous_clean) {
        stores = store_tasks(layout.unit(s), stored_begin, stored);
        if (!loads[static_cast<size_t>((k + 1) % 2)].threads) {
          // Device memory: one load_shard at a time, from this thread.
          for (const Task& t : stores) store_chunk(engine, s, stored_begin, stored, t, stored_padding);
          stores.clear();
        }
      }
      // Reads and stores interleaved, so that the disk and the host both work
      // all through the step.
      std::vector<Task> tasks;
      for (size_t i = 0; i < std::max(reads.size(), stores.size()); ++i) {
        if (i < reads.size()) tasks.push_back(reads[i]);
        if (i < stores.size()) tasks.push_back(stores[i]);
      }
      const size_t workers = std::min(static_cast<size_t>(std::max(threads, 1)), tasks.size());
      std::atomic<size_t> next{0};
      const UnitBuffer& reading = buffers[static_cast<size_t>(k % 2)];
      // Worker 0 is this thread: it alone calls `progress`.
      const auto work = [&](bool reports) {
        for (size_t i = next++; i < tasks.size(); i = next++) {
          Task& t = tasks[i];
          if (!t.read) {
            store_chunk(engine, s, stored_begin, stored, t, stored_padding);
            continue;
          }
          read_chunk(reading, t);
          const OwnedWeightSource& from = t.raw->piece->from;
          const uint64_t now = done += (t.end - t.begin) * from.file->tensor(from.tensor).elem_size;
          if (reports && progress) {
            progress(now, plan.total);
            reported = now;
          }
        }
      };
      detail::run_on_threads(workers, work, [&] { next = tasks.size(); });
      // The reads other threads finished last.
      if (progress && reported != done) {
        reported = done;
        progress(reported, plan.total);
      }
      if (k == units) break;
      const size_t bad_before = non_finite.size();
      for (const Task& t : tasks) {
        // Reads are in order: the first bad chunk of a parameter has its first bad element.
        if (!t.read || t.first_bad < 0 ||
            (non_finite.size() > bad_before && non_finite.back().first == t.raw->piece->param->name)) {
          continue;
        }
        non_finite.emplace_back(t.raw->piece->param->name, static_cast<uint64_t>(t.first_bad));
      }
      previous_clean = non_finite.size() == bad_before;
      if (!previous_clean) engine.abandon_shard_load(k);
    }
  } catch (...) {
    // A failed read or store: the units in flight get their weights back
    // where they were written in place (the caller rebuilds the rest).
    for (const int u : {k - 1, k}) {
      if (u >= 0 && u < units) engine.abandon_shard_load(u);
    }
    throw;
  }
  return non_finite;
}

void finish_loaded_weights(Engine& engine) { engine.finish_shard_load(detail::restarted_progress(engine)); }

}  // namespace zest
