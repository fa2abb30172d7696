// Checks every collective of a Communicator, bit for bit, for every dtype, in
// place and out of place, over element counts that do not divide evenly.
// Inputs are crafted so that every result is exact in its dtype (small
// integers in the floating types, values whose sums do not overflow or whose
// wrap-around is defined for the integers), so any correct reduction order
// gives the same bits and the expected values can be written down here.
//
// Used by the in-process tests (one thread per rank) and by the MPI test
// program (one process per rank); both fold their results into a digest so
// that runs of different backends can be compared for identical output. The
// GPU tests run the same checks with every buffer in device memory
// (check_all_collectives_in with their own buffer type).
#pragma once

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "zest/comm/communicator.h"
#include "zest/core/dtype.h"

namespace zest::test {

inline constexpr size_t kConformanceCounts[] = {0, 1, 7, 1000, 4099};

// FNV-1a over bytes, for comparing runs.
struct Digest {
  uint64_t value = 1469598103934665603ull;
  void add(const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) value = (value ^ p[i]) * 1099511628211ull;
  }
};

// The value rank r contributes at element i, as a double (exact in every
// dtype it is stored in). `scale` multiplies floating values so that an
// average over `scale` ranks stays exact.
inline double input_value(DType t, int r, size_t i, int scale) {
  switch (t) {
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
      return scale * static_cast<double>(static_cast<int>((i * 7 + static_cast<size_t>(r) * 3) % 11) - 5);
    case DType::kInt32:
      return static_cast<double>(static_cast<int64_t>((i % 5) * 100003) * (r + 1) - 250000);
    case DType::kInt64:
      return static_cast<double>(i % 13) * 1099511627776.0 + r;  // 2^40 multiples: beyond int32
    case DType::kUInt8:
      return static_cast<double>((i * 37 + static_cast<size_t>(r) * 101) % 256);
  }
  return 0;
}

inline void store_value(DType t, void* base, size_t i, double v) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::kFloat16: static_cast<fp16*>(base)[i] = fp16(static_cast<float>(v)); break;
    case DType::kBFloat16: static_cast<bf16*>(base)[i] = bf16(static_cast<float>(v)); break;
    case DType::kInt32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); break;
    case DType::kInt64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); break;
    case DType::kUInt8:
      // Sums wrap modulo 256, as the backends' integer sums do.
      static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(static_cast<int64_t>(v) & 0xff);
      break;
  }
}

// The expected result of reducing element i over all ranks.
inline double expected_reduction(DType t, ReduceOp op, int world, size_t i, int scale) {
  double acc = input_value(t, 0, i, scale);
  for (int r = 1; r < world; ++r) {
    const double x = input_value(t, r, i, scale);
    acc = op == ReduceOp::kMax ? (x > acc ? x : acc) : acc + x;
  }
  return op == ReduceOp::kAvg ? acc / world : acc;
}

// Buffers of `count` elements filled with this rank's inputs.
inline std::vector<unsigned char> make_input(DType t, int rank, size_t offset, size_t count, int scale) {
  std::vector<unsigned char> buf(count * elem_size(t) + 1);  // +1: never a null data()
  for (size_t i = 0; i < count; ++i) store_value(t, buf.data(), i, input_value(t, rank, offset + i, scale));
  return buf;
}

inline std::vector<unsigned char> make_expected_reduction(DType t, ReduceOp op, int world, size_t offset,
                                                          size_t count, int scale) {
  std::vector<unsigned char> buf(count * elem_size(t) + 1);
  for (size_t i = 0; i < count; ++i) store_value(t, buf.data(), i, expected_reduction(t, op, world, offset + i, scale));
  return buf;
}

// `bytes` bytes of 0xAB (and one more: never a null data()): a result buffer
// whose every byte the collective must overwrite.
inline std::vector<unsigned char> make_poisoned(size_t bytes) {
  return std::vector<unsigned char>(bytes + 1, 0xAB);
}

inline bool same_bytes(const std::vector<unsigned char>& a, const void* b, size_t bytes) {
  return std::memcmp(a.data(), b, bytes) == 0;
}

// A buffer in host memory, for check_all_collectives_in. Another buffer
// type (device memory) offers the same: made from its initial bytes, get()
// for the collective, read() for the `bytes` bytes at `offset` once the work
// queued on `stream` is done (and one more: never a null data()).
class HostBuffer {
 public:
  explicit HostBuffer(std::vector<unsigned char> initial) : bytes_(std::move(initial)) {}
  unsigned char* get() { return bytes_.data(); }
  std::vector<unsigned char> read(const Stream& /*stream*/, size_t offset, size_t bytes) const {
    std::vector<unsigned char> out(bytes + 1);
    std::memcpy(out.data(), bytes_.data() + offset, bytes);
    return out;
  }

 private:
  std::vector<unsigned char> bytes_;
};

// Runs every collective over buffers of type Buffer; returns the digest of
// all results.
template <typename Buffer>
uint64_t check_all_collectives_in(Communicator& comm, const Stream& stream,
                                   std::span<const size_t> counts = kConformanceCounts) {
  const int w = comm.size();
  const int me = comm.rank();
  Digest digest;
  // The bytes of `buf` at `offset`, checked against `expect`, then digested.
  auto check = [&](const Buffer& buf, size_t offset, const std::vector<unsigned char>& expect,
                   size_t bytes) {
    const std::vector<unsigned char> got = buf.read(stream, offset, bytes);
    REQUIRE(same_bytes(expect, got.data(), bytes));
    digest.add(got.data(), bytes);
  };
  for (DType t : kAllDTypes) {
    const size_t es = elem_size(t);
    for (size_t n : counts) {
      for (bool in_place : {false, true}) {
        CAPTURE(dtype_name(t));
        CAPTURE(n);
        CAPTURE(in_place);
        const size_t my_offset = static_cast<size_t>(me) * n * es;  // of this rank's part
        // all_reduce
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
          if (op == ReduceOp::kAvg && !is_floating(t)) continue;
          CAPTURE(reduce_op_name(op));
          const int scale = op == ReduceOp::kAvg ? w : 1;
          Buffer send(make_input(t, me, 0, n, scale));
          Buffer recv(make_poisoned(n * es));
          Buffer& out = in_place ? send : recv;
          comm.all_reduce(send.get(), out.get(), n, t, op, stream);
          check(out, 0, make_expected_reduction(t, op, w, 0, n, scale), n * es);

          // reduce_scatter: this rank's part of the reduction of w x n elements
          Buffer big(make_input(t, me, 0, n * static_cast<size_t>(w), scale));
          Buffer part(make_poisoned(n * es));
          void* rs_out = in_place ? static_cast<void*>(big.get() + my_offset) : part.get();
          comm.reduce_scatter(big.get(), rs_out, n, t, op, stream);
          check(in_place ? big : part, in_place ? my_offset : 0,
                make_expected_reduction(t, op, w, static_cast<size_t>(me) * n, n, scale), n * es);
        }
        // all_gather: part r of the result is rank r's input at offset r*n
        {
          const std::vector<unsigned char> input = make_input(t, me, static_cast<size_t>(me) * n, n, 1);
          std::vector<unsigned char> initial = make_poisoned(static_cast<size_t>(w) * n * es);
          if (in_place) std::memcpy(initial.data() + my_offset, input.data(), n * es);
          Buffer gathered(std::move(initial));
          Buffer mine(input);
          const void* send =
              in_place ? static_cast<const void*>(gathered.get() + my_offset) : mine.get();
          comm.all_gather(send, gathered.get(), n, t, stream);
          for (int r = 0; r < w; ++r) {
            CAPTURE(r);
            check(gathered, static_cast<size_t>(r) * n * es,
                  make_input(t, r, static_cast<size_t>(r) * n, n, 1), n * es);
          }
        }
        // broadcast from every root in turn
        for (int root = 0; root < w; ++root) {
          CAPTURE(root);
          Buffer buf(make_input(t, me, 0, n, 1));
          Buffer recv(make_poisoned(n * es));
          Buffer& out = in_place ? buf : recv;
          comm.broadcast(buf.get(), out.get(), n, t, root, stream);
          check(out, 0, make_input(t, root, 0, n, 1), n * es);
        }
      }
    }
  }
  comm.barrier(stream);
  return digest.value;
}

// check_all_collectives_in over host buffers.
inline uint64_t check_all_collectives(Communicator& comm, const Stream& stream,
                                      std::span<const size_t> counts = kConformanceCounts) {
  return check_all_collectives_in<HostBuffer>(comm, stream, counts);
}

}  // namespace zest::test
