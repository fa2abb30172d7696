// load_owned_weights (weights_io.h): this rank's shard of each unit read
// with positioned reads and written into the engine in one pass.
//
// Note [one pass from the file into the shard]: a unit's owned byte ranges
// are read as stored into one of two reusable buffers (F64 converted to
// fp32 as it is read), or with map_files looked at where the page cache
// holds them (file_view.h: mapped, each chunk populated first, so an I/O
// error is an error and not SIGBUS; measured slower here, see
// HfImportOptions::map_files). Each chunk is checked for NaN/Inf on its raw
// bits right after it is read, while it is in cache. Only a unit found clean is stored:
// converted from the file's bytes straight into the master shard and the
// compute-dtype parameters (Engine::load_shard; a bf16 file into bf16
// parameters is a copy), so a unit holding a bad value keeps its previous
// values without a copy of them. The reads of unit u + 1 and the stores of
// unit u are one work list, shared by the threads, so the disk is kept busy
// while the host stores. Memory: the pages of two units' shards as stored,
// mapped or in the buffers.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "zest/checkpoint/owned_pieces.h"
#include "zest/checkpoint/weights_io.h"
#include "zest/core/check.h"
#include "zest/optim/grad_ops.h"

namespace zest {
namespace {

// Elements per read and check: a few hundred KiB, so the check finds the
// read's bytes in cache.
constexpr size_t kReadElems = size_t{1} << 18;
// Elements per store task (several threads share a unit), and of the
// zeros the padding is stored from.
constexpr size_t kStoreElems = size_t{1} << 18;
constexpr size_t kZeroElems = size_t{1} << 13;
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
};

// Index of the first NaN or Inf among n elements of `dtype` at p, or -1. An
// all-ones exponent plus its lowest bit carries into the sign bit, and only
// then: one OR-reduction without an early exit, which vectorizes, and a
// second look only where it found one.
template <typename Bits, Bits kExponent, Bits kLow>
int64_t first_non_finite_bits(const std::byte* p, size_t n) {
  constexpr Bits kTop = Bits{1} << (sizeof(Bits) * 8 - 1);
  const auto bits = [p](size_t i) {
    Bits b;
    std::memcpy(&b, p + i * sizeof(Bits), sizeof(Bits));
    return static_cast<Bits>((b & kExponent) + kLow);
  };
  Bits any = 0;
  for (size_t i = 0; i < n; ++i) any |= bits(i);
  if ((any & kTop) == 0) return -1;
  for (size_t i = 0; i < n; ++i) {
    if ((bits(i) & kTop) != 0) return static_cast<int64_t>(i);
  }
  ZEST_INTERNAL_ASSERT(false, "first_non_finite_bits: the reduction found a value the scan did not");
  return -1;
}

int64_t first_non_finite(DType dtype, const std::byte* p, size_t n) {
  switch (dtype) {
    case DType::kFloat32:
      return first_non_finite_bits<uint32_t, 0x7f800000u, 0x00800000u>(p, n);
    case DType::kBFloat16:
      return first_non_finite_bits<uint16_t, 0x7f80u, 0x0080u>(p, n);
    case DType::kFloat16:
      return first_non_finite_bits<uint16_t, 0x7c00u, 0x0400u>(p, n);
    default:
      ZEST_INTERNAL_ASSERT(false, "first_non_finite of {}", dtype_name(dtype));
      return -1;
  }
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
  // The unit's pieces laid out in the buffer, which grows to hold them.
  void lay_out(const std::vector<detail::OwnedPiece>& pieces, bool map_files) {
    raws_.clear();
    size_t at = 0;
    for (const detail::OwnedPiece& p : pieces) {
      const SafetensorsTensor& t = p.from.file->tensor(p.from.tensor);
      const std::optional<DType> stored = t.zest_dtype;
      const DType d = stored && is_floating(*stored) ? *stored : DType::kFloat32;  // F64: converted when read
      const size_t bytes = (p.end - p.begin) * elem_size(d);
      if (stored == d && map_files) {
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
      // Huge pages where the kernel gives them on request: first-touch
      // faults (a buffer is new at each import) cost 512 times fewer.
      size_ = (at + kHugePage - 1) / kHugePage * kHugePage;
      data_.reset(static_cast<std::byte*>(std::aligned_alloc(kHugePage, size_)));
      ZEST_CHECK(data_ != nullptr, "loading weights: cannot allocate a read buffer of {} bytes", size_);
      // Advice only: where it is refused the buffer is as good, in 4 KiB pages.
      (void)::madvise(data_.get(), size_, MADV_HUGEPAGE);
    }
  }
  const std::vector<RawPiece>& raws() const { return raws_; }
  // A range of the buffer (never of a view) for a read to fill.
  std::span<std::byte> writable(const std::byte* p, size_t n) const {
    ZEST_INTERNAL_ASSERT(p >= data_.get() && p + n <= data_.get() + size_, "a read into a loader's view");
    return {data_.get() + (p - data_.get()), n};
  }
  const std::byte* at(const RawPiece& r, size_t element) const {
    const size_t skip = (element - r.piece->begin) * elem_size(r.dtype);
    return r.view ? r.view->bytes().data() + skip : data_.get() + r.offset + skip;
  }

 private:
  std::vector<RawPiece> raws_;
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t size_ = 0;
};

void read_chunk(const UnitBuffer& buffer, Task& t) {
  const RawPiece& r = *t.raw;
  const OwnedWeightSource& from = r.piece->from;
  const SafetensorsTensor& tensor = from.file->tensor(from.tensor);
  const uint64_t first = t.begin - r.piece->param->offset;  // in the whole tensor
  const size_t bytes = (t.end - t.begin) * elem_size(r.dtype);
  const std::byte* in = buffer.at(r, t.begin);
  if (r.view) {
    r.view->populate(static_cast<size_t>(in - r.view->bytes().data()), bytes);
  } else if (tensor.zest_dtype == r.dtype) {
    from.file->read_range(from.tensor, first * tensor.elem_size, buffer.writable(in, bytes));
  } else {
    from.file->read_range_as(from.tensor, r.dtype, first, buffer.writable(in, bytes));
  }
  // fp32, fp16 and bf16 widen exactly, so a non-finite value here is one
  // in the file (or an F64 beyond fp32).
  if (const int64_t bad = first_non_finite(r.dtype, in, t.end - t.begin); bad >= 0) {
    t.first_bad = static_cast<int64_t>(first) + bad;
  }
}

// Stores [t.begin, t.end) of unit u (of the shard starting at shard_begin)
// from the buffer as read, converted by the engine straight into the master
// and the parameters; the padding from `zeros`.
void store_chunk(Engine& engine, int u, size_t shard_begin, const UnitBuffer& buffer, const Task& t,
                 std::span<const float> zeros) {
  if (t.raw != nullptr) {
    engine.load_shard(u, t.begin - shard_begin, buffer.at(*t.raw, t.begin), t.raw->dtype, t.end - t.begin);
    return;
  }
  for (size_t b = t.begin; b < t.end; b += zeros.size()) {
    engine.load_shard(u, b - shard_begin, zeros.first(std::min(zeros.size(), t.end - b)));
  }
}

// The store tasks of unit u: its pieces and its padding (elements of no
// parameter), in chunks.
std::vector<Task> store_tasks(const UnitLayout& U, size_t shard_begin, const UnitBuffer& buffer) {
  std::vector<Task> out;
  const auto add = [&](const RawPiece* raw, size_t b, size_t e) {
    for (; b < e; b += kStoreElems) out.push_back({false, raw, b, std::min(e, b + kStoreElems)});
  };
  for (const RawPiece& r : buffer.raws()) add(&r, r.piece->begin, r.piece->end);
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
  const std::vector<float> zeros(kZeroElems, 0.0f);  // the padding's source
  bool previous_clean = false;
  // Step k reads unit k and stores unit k - 1 (when it was found clean).
  for (int k = 0; k <= units; ++k) {
    std::vector<Task> reads, stores;
    if (k < units) {
      UnitBuffer& b = buffers[static_cast<size_t>(k % 2)];
      b.lay_out(plan.pieces[static_cast<size_t>(k)], map_files);
      for (const RawPiece& r : b.raws()) {
        for (size_t e = r.piece->begin; e < r.piece->end; e += kReadElems) {
          reads.push_back({true, &r, e, std::min(r.piece->end, e + kReadElems)});
        }
      }
    }
    const int s = k - 1;  // the unit stored
    const UnitBuffer& stored = buffers[static_cast<size_t>((k + 1) % 2)];
    const size_t stored_begin = s >= 0 ? layout.unit(s).shard * part : 0;
    if (previous_clean) {
      stores = store_tasks(layout.unit(s), stored_begin, stored);
      if (!engine.begin_shard_load(s)) {
        // Device memory: one load_shard at a time, from this thread.
        for (const Task& t : stores) store_chunk(engine, s, stored_begin, stored, t, zeros);
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
          store_chunk(engine, s, stored_begin, stored, t, zeros);
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
  }
  return non_finite;
}

void finish_loaded_weights(Engine& engine) { engine.finish_shard_load(detail::restarted_progress(engine)); }

}  // namespace zest
