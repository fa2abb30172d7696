#include "zest/launch/file_rendezvous.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "zest/comm/communicator.h"
#include "zest/launch/detail/rendezvous_wire.h"
#include "zest/core/check.h"
#include "zest/core/file_io.h"
#include "zest/core/logging.h"
#include "zest/core/system_error.h"

namespace zest {
namespace {

using std::chrono::milliseconds;

// Big-endian, checksummed with FNV-1a over everything before the checksum:
//   file: "ZESTRDV1", world size u32, nonce u64, job id (u32 length + bytes),
//         blob (u32 length + bytes), checksum u64
//   ack:  "ZESTACK1", rank u32, world size u32, nonce u64, checksum u64
constexpr std::string_view kFileMagic = "ZESTRDV1";
constexpr std::string_view kAckMagic = "ZESTACK1";
constexpr size_t kMaxFileBytes = kMaxRendezvousBlob + 4096;

void seal(std::string& out) { wire::put64(out, wire::fnv1a(out)); }

// The record behind `magic` in `bytes`, its fields read by read(cursor):
// nullopt unless the magic and the checksum match and the fields fill the
// record exactly.
template <typename Record, typename Read>
std::optional<Record> unseal(std::string_view bytes, std::string_view magic, Read&& read) {
  if (bytes.size() < magic.size() + 8 || bytes.substr(0, magic.size()) != magic) return std::nullopt;
  const std::string_view body = bytes.substr(0, bytes.size() - 8);
  wire::Cursor tail(bytes.substr(bytes.size() - 8));
  if (tail.u64() != wire::fnv1a(body)) return std::nullopt;
  wire::Cursor fields(body.substr(magic.size()));
  Record record = read(fields);
  if (!fields.at_end()) return std::nullopt;
  return record;
}

struct Published {
  int world_size = 0;
  uint64_t nonce = 0;
  std::string job_id;
  std::string blob;
};

std::string encode(const Published& p) {
  std::string out(kFileMagic);
  wire::put32(out, static_cast<uint32_t>(p.world_size));
  wire::put64(out, p.nonce);
  wire::put32(out, static_cast<uint32_t>(p.job_id.size()));
  out += p.job_id;
  wire::put32(out, static_cast<uint32_t>(p.blob.size()));
  out += p.blob;
  seal(out);
  return out;
}

std::optional<Published> decode(std::string_view bytes) {
  return unseal<Published>(bytes, kFileMagic, [](wire::Cursor& c) {
    Published p;
    p.world_size = static_cast<int>(c.u32());
    p.nonce = c.u64();
    p.job_id = std::string(c.take(c.u32()));
    p.blob = std::string(c.take(c.u32()));
    return p;
  });
}

struct Ack {
  int rank = 0;
  int world_size = 0;
  uint64_t nonce = 0;
};

std::string encode(const Ack& a) {
  std::string out(kAckMagic);
  wire::put32(out, static_cast<uint32_t>(a.rank));
  wire::put32(out, static_cast<uint32_t>(a.world_size));
  wire::put64(out, a.nonce);
  seal(out);
  return out;
}

std::optional<Ack> decode_ack(std::string_view bytes) {
  return unseal<Ack>(bytes, kAckMagic, [](wire::Cursor& c) {
    Ack a;
    a.rank = static_cast<int>(c.u32());
    a.world_size = static_cast<int>(c.u32());
    a.nonce = c.u64();
    return a;
  });
}

std::string ack_path(const std::string& path, int rank) { return fmt::format("{}.ack{}", path, rank); }

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

uint64_t fresh_nonce() { return random_u64(); }

// The file's bytes, or nullopt when it does not exist (yet). A FIFO or
// device there is an error at once (ReadOnlyFile); a file too large to be a
// rendezvous file reads as empty, which decode takes for not ours.
std::optional<std::string> read_file(const std::string& path) {
  try {
    const std::optional<ReadOnlyFile> file = ReadOnlyFile::open_if_exists(path, {.follow_links = true});
    if (!file) return std::nullopt;
    return file->size() > kMaxFileBytes ? std::string() : file->read_all();
  } catch (const Error& e) {
    ZEST_FAIL("file rendezvous: {}; ZEST_RENDEZVOUS_FILE must name a regular file every rank can read", e.what());
  }
}

// Removes `path` if it is there.
void remove_file(const std::string& path, bool must) {
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) return;
  const std::string why = errno_text(errno);
  ZEST_CHECK(!must, "file rendezvous: cannot remove the old file {}: {}; remove it by hand or use "
                    "another ZEST_RENDEZVOUS_FILE", path, why);
  ZEST_LOG_WARN("file rendezvous: cannot remove {}: {}", path, why);
}

// Writes `bytes` to `path` whole or not at all: a temporary file in the same
// directory, fsynced, renamed over `path`, and the directory fsynced so the
// name survives a crash and is seen by other hosts' next lookup.
void write_atomically(const std::string& path, const std::string& bytes, int rank) {
  try {
    AtomicFile file(path);
    file.write(bytes);
    file.commit();
  } catch (const Error& e) {
    ZEST_FAIL("file rendezvous: rank {}: {}; ZEST_RENDEZVOUS_FILE must name a file in an existing directory that "
              "every rank can write, on a filesystem every rank sees",
              rank, e.what());
  }
}

void check_dir(const std::string& path, int rank) {
  const std::string dir = parent_dir(path);
  struct stat st {};
  ZEST_CHECK(::stat(dir.c_str(), &st) == 0,
             "file rendezvous: rank {} cannot use ZEST_RENDEZVOUS_FILE={}: its directory {}: {}; "
             "create the directory, on a filesystem every rank sees, before launching",
             rank, path, dir, errno_text(errno));
  ZEST_CHECK(S_ISDIR(st.st_mode), "file rendezvous: rank {} cannot use ZEST_RENDEZVOUS_FILE={}: {} "
                                  "is not a directory", rank, path, dir);
}

std::string job_text(const std::string& id) { return id.empty() ? "no job id" : "job '" + id + "'"; }

[[noreturn]] void timed_out(const std::string& path, const RendezvousMember& me,
                            const Deadline& deadline, const std::string& what) {
  throw CommError(CommError::Reason::kTimeout,
                  rendezvous_timeout_message("file", path, me, deadline, what), __FILE__, __LINE__);
}

// Polling interval: quick at first (ranks usually start together), then
// gentle on a shared filesystem's metadata server.
milliseconds next_wait(milliseconds wait) { return std::min(wait * 2, milliseconds(100)); }

std::string publish(const std::string& path, const RendezvousMember& me, std::string_view blob) {
  const Deadline deadline(me.timeout);
  const uint64_t nonce = fresh_nonce();
  // An earlier run's leftovers go first (see the stale-file rule in the header).
  remove_file(path, true);
  for (int r = 1; r < me.world_size; ++r) remove_file(ack_path(path, r), true);
  write_atomically(path, encode(Published{me.world_size, nonce, me.job_id, std::string(blob)}), 0);

  // Whatever happens next, the file must not outlive this run.
  struct Cleanup {
    const std::string& path;
    int world;
    ~Cleanup() {
      remove_file(path, false);
      for (int r = 1; r < world; ++r) remove_file(ack_path(path, r), false);
    }
  } cleanup{path, me.world_size};

  std::vector<bool> acked(static_cast<size_t>(me.world_size), false);
  int missing = me.world_size - 1;
  milliseconds wait(1);
  while (missing > 0) {
    for (int r = 1; r < me.world_size; ++r) {
      if (acked[static_cast<size_t>(r)]) continue;
      const std::optional<std::string> bytes = read_file(ack_path(path, r));
      if (!bytes) continue;
      const std::optional<Ack> ack = decode_ack(*bytes);
      if (!ack || ack->rank != r) continue;  // not (yet) a whole acknowledgement
      if (ack->nonce != nonce) {
        throw CommError(CommError::Reason::kMismatch,
                        fmt::format("file rendezvous at {}: rank {} took a file left by an earlier "
                                    "run (before rank 0 replaced it), so it has the wrong data. "
                                    "Delete {} before launching, use a new path per run, or set "
                                    "ZEST_JOB_ID to a value unique to each run",
                                    path, r, path),
                        __FILE__, __LINE__);
      }
      if (ack->world_size != me.world_size) {
        throw CommError(CommError::Reason::kMismatch,
                        fmt::format("file rendezvous at {}: rank {} was started for a world of {} "
                                    "ranks but rank 0 for {}: every rank must be started with the "
                                    "same world size",
                                    path, r, ack->world_size, me.world_size),
                        __FILE__, __LINE__);
      }
      acked[static_cast<size_t>(r)] = true;
      --missing;
    }
    if (missing == 0) break;
    if (deadline.passed()) {
      std::vector<int> here;
      std::vector<int> absent;
      for (int r = 1; r < me.world_size; ++r) (acked[static_cast<size_t>(r)] ? here : absent).push_back(r);
      timed_out(path, me, deadline,
                fmt::format("{} took the file, {} did not. Start every rank with the same "
                            "ZEST_RENDEZVOUS_FILE, on a filesystem every rank sees",
                            rank_list(here), rank_list(absent)));
    }
    sleep_within(deadline, wait);
    wait = next_wait(wait);
  }
  return std::string(blob);
}

std::string fetch(const std::string& path, const RendezvousMember& me) {
  const Deadline deadline(me.timeout);
  std::string seen = "the file never appeared";
  milliseconds wait(1);
  for (;;) {
    if (const std::optional<std::string> bytes = read_file(path)) {
      const std::optional<Published> file = decode(*bytes);
      if (!file) {
        seen = "the file there is not a ZEST rendezvous file";
      } else if (file->job_id != me.job_id) {
        seen = fmt::format("only a file of {} was there, and this rank has {} (an earlier run's?)",
                           job_text(file->job_id), job_text(me.job_id));
      } else if (file->world_size != me.world_size) {
        if (!me.job_id.empty()) {
          // Same job, so not stale: the ranks disagree. Tell rank 0 too.
          write_atomically(ack_path(path, me.rank), encode(Ack{me.rank, me.world_size, file->nonce}), me.rank);
          throw CommError(CommError::Reason::kMismatch,
                          fmt::format("file rendezvous at {}: rank 0 was started for a world of {} "
                                      "ranks but rank {} for {}: every rank must be started with "
                                      "the same world size",
                                      path, file->world_size, me.rank, me.world_size),
                          __FILE__, __LINE__);
        }
        seen = fmt::format("only a file for a world of {} ranks was there (an earlier run's?), and "
                           "this rank expects {}", file->world_size, me.world_size);
      } else {
        write_atomically(ack_path(path, me.rank), encode(Ack{me.rank, me.world_size, file->nonce}), me.rank);
        return file->blob;
      }
    }
    if (deadline.passed()) {
      timed_out(path, me, deadline,
                fmt::format("{}. Check that rank 0 is running with the same ZEST_RENDEZVOUS_FILE, "
                            "on a filesystem every rank sees",
                            seen));
    }
    sleep_within(deadline, wait);
    wait = next_wait(wait);
  }
}

}  // namespace

std::string file_rendezvous(const std::string& path, const RendezvousMember& me,
                            std::string_view blob) {
  check_rendezvous_member(me, "file");
  ZEST_CHECK(!path.empty() && path.back() != '/',
             "file rendezvous: ZEST_RENDEZVOUS_FILE='{}' does not name a file; give a file path "
             "on a filesystem every rank sees", path);
  check_rendezvous_blob(blob, "file");
  check_dir(path, me.rank);
  return me.rank == 0 ? publish(path, me, blob) : fetch(path, me);
}

}  // namespace zest
