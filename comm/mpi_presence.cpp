// Note [the presence channel] (mpi_presence.h): the process's side channel,
// its messages, and the hook in MPI_Finalize that says a rank is leaving.
#include "zest/comm/detail/mpi_presence.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "zest/comm/communicator.h"
#include "zest/comm/mpi_comm.h"
#include "zest/comm/detail/mpi_poll.h"
#include "zest/core/exit_deadline.h"
#include "zest/core/logging.h"
#include "zest/core/mpi_check.h"

namespace zest::mpi {
namespace {

enum Kind : int32_t { kLeaving = 1, kQuestion = 2, kAnswer = 3, kObjection = 4 };
constexpr int kPresenceTag = 7;  // every message on the channel; the kind is in it
// How long a rank leaving waits for the others to leave too (or to object),
// and, when one objects, for the waiting ranks to fail and end the job.
constexpr std::chrono::milliseconds kFinalizeWait{5000};
constexpr std::chrono::milliseconds kObjectionWait{5000};

// One message, of one size: the channel is matched with MPI_ANY_SOURCE and
// received whole.
struct Wire {
  int32_t kind = 0;
  int32_t comm_rank = 0;
  int32_t comm_size = 0;
  int32_t moving_data = 0;
  int64_t round = 0;  // a question's number, echoed by its answers
  char text[192] = {};
};

struct Peer {
  int32_t pid = 0;
  char host[60] = {};
};

struct PendingSend {
  MPI_Request request = MPI_REQUEST_NULL;
  Wire wire;
};

// Process-wide, like MPI's own state; never freed (the finalize hook and
// pending sends may use it up to the end of the process).
struct Presence {
  std::mutex mutex;  // everything below, and every receive on the channel
  MPI_Comm channel = MPI_COMM_NULL;
  int world_rank = 0;
  std::vector<Peer> peers;                   // by world rank
  std::vector<std::string> departed;         // by world rank: how it left, "" while here
  std::vector<std::pair<int, std::string>> objections;  // (world rank, what it waits in)
  std::vector<std::unique_ptr<PendingSend>> sends;
  // Sends freed unfinished at MPI_Finalize: MPI may still read them.
  std::vector<std::unique_ptr<PendingSend>> abandoned;
  int64_t round = 0;                         // this process's questions so far
};

Presence& presence() {
  static Presence* p = new Presence;
  return *p;
}

void copy_text(char* out, size_t size, std::string_view text) {
  const size_t n = std::min(size - 1, text.size());
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

// Sends `wire` to `world_rank` without waiting; the request is completed by
// later calls (prune_sends) or left to MPI at the end of the process.
void post(Presence& p, int world_rank, const Wire& wire) {
  auto send = std::make_unique<PendingSend>();
  send->wire = wire;
  ZEST_MPI_CHECK(MPI_Isend(&send->wire, sizeof(Wire), MPI_BYTE, world_rank, kPresenceTag, p.channel,
                           &send->request));
  p.sends.push_back(std::move(send));
}

void prune_sends(Presence& p) {
  std::erase_if(p.sends, [](const std::unique_ptr<PendingSend>& s) {
    int done = 0;
    ZEST_MPI_CHECK(MPI_Test(&s->request, &done, MPI_STATUS_IGNORE));
    return done != 0;
  });
}

Wire answer_for(const WaitingIn& me, int64_t round) {
  Wire w;
  w.kind = kAnswer;
  w.comm_rank = me.comm_rank;
  w.comm_size = me.comm_size;
  w.moving_data = me.moving_data ? 1 : 0;
  w.round = round;
  copy_text(w.text, sizeof(w.text), me.what);
  return w;
}

// Receives what has come; answers go to `on_answer(source, wire)`.
template <typename OnAnswer>
void drain(Presence& p, const WaitingIn& me, OnAnswer&& on_answer) {
  for (;;) {
    int flag = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    ZEST_MPI_CHECK(MPI_Improbe(MPI_ANY_SOURCE, kPresenceTag, p.channel, &flag, &message, &status));
    if (!flag) break;
    Wire w;
    ZEST_MPI_CHECK(MPI_Mrecv(&w, sizeof(Wire), MPI_BYTE, &message, MPI_STATUS_IGNORE));
    const int source = status.MPI_SOURCE;
    switch (w.kind) {
      case kLeaving:
        w.text[sizeof(w.text) - 1] = '\0';
        p.departed[static_cast<size_t>(source)] = w.text[0] ? w.text : "left";
        break;
      case kQuestion: post(p, source, answer_for(me, w.round)); break;
      case kAnswer: on_answer(source, w); break;
      case kObjection:
        w.text[sizeof(w.text) - 1] = '\0';
        p.objections.emplace_back(source, w.text);
        break;
      default: ZEST_LOG_WARN("the MPI presence channel got a message of unknown kind {} from world "
                             "rank {}; ignored", w.kind, source);
    }
  }
  prune_sends(p);
}

std::string describe_locked(const Presence& p, int world_rank);

// A rank that leaves while others wait for it ends the job, once they had
// the time to fail and say so themselves.
[[noreturn]] void end_job_for(Presence& p, std::unique_lock<std::mutex>& lock) {
  const auto& [rank, what] = p.objections.front();
  std::fprintf(stderr,
               "[%s] is finalizing MPI while %s still waits for it in %s: the job cannot finish; "
               "ending it with MPI_Abort unless the waiting ranks end it first\n",
               describe_locked(p, p.world_rank).c_str(), describe_locked(p, rank).c_str(),
               what.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  lock.unlock();
  std::this_thread::sleep_for(kObjectionWait);
  bound_mpi_abort();
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);  // MPI_Abort does not return; should it, the job must end anyway
}

// MPI_Finalize deletes MPI_COMM_SELF's attributes first thing, while MPI is
// still fully usable: every other process learns that this one is leaving.
// Then it waits, at most kFinalizeWait, until every other process said it
// is leaving too (the normal end of a job) or one objects, waiting for this
// one in a collective: the job then cannot finish, and this rank ends it
// (Open MPI's MPI_Finalize would wait for the others, and an mpiexec whose
// ranks abort around one inside MPI_Finalize can hang). Sends still pending
// are left to MPI (a peer that already finalized never receives them).
int on_finalize(MPI_Comm /*self*/, int keyval, void* /*attribute*/, void* /*extra*/) {
  try {
    Presence& p = presence();
    std::unique_lock<std::mutex> lock(p.mutex);
    if (p.channel == MPI_COMM_NULL) return MPI_SUCCESS;
    Wire w;
    w.kind = kLeaving;
    copy_text(w.text, sizeof(w.text),
              "finalized MPI (it returned from main, or called exit() or MPI_Finalize)");
    for (int r = 0; r < static_cast<int>(p.peers.size()); ++r) {
      if (r != p.world_rank) post(p, r, w);
    }
    const WaitingIn me{"MPI_Finalize", p.world_rank, static_cast<int>(p.peers.size()), false};
    const Deadline deadline(kFinalizeWait);
    for (;;) {
      drain(p, me, [](int, const Wire&) {});
      if (!p.objections.empty()) end_job_for(p, lock);
      const auto gone = std::count_if(p.departed.begin(), p.departed.end(),
                                      [](const std::string& d) { return !d.empty(); });
      if ((p.sends.empty() && gone + 1 >= static_cast<std::ptrdiff_t>(p.peers.size())) ||
          deadline.passed()) {
        break;
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      lock.lock();
    }
    for (auto& s : p.sends) {
      ZEST_MPI_WARN(MPI_Request_free(&s->request));
      p.abandoned.push_back(std::move(s));
    }
    p.sends.clear();
    // The channel and this callback's keyval go with MPI (MPI_COMM_SELF's
    // attributes are deleted first thing in MPI_Finalize, when every MPI
    // call is still allowed): the channel is closed from here on.
    ZEST_MPI_WARN(MPI_Comm_free(&p.channel));
    p.channel = MPI_COMM_NULL;
  } catch (const std::exception& e) {
    ZEST_LOG_WARN("could not tell the other ranks that this one is leaving: {}", e.what());
  }
  ZEST_MPI_WARN(MPI_Comm_free_keyval(&keyval));
  return MPI_SUCCESS;
}

std::string describe_locked(const Presence& p, int world_rank) {
  if (world_rank < 0 || static_cast<size_t>(world_rank) >= p.peers.size()) {
    return fmt::format("world rank {}", world_rank);
  }
  const Peer& peer = p.peers[static_cast<size_t>(world_rank)];
  return fmt::format("world rank {} on host {}, pid {}", world_rank,
                     std::string_view(peer.host, strnlen(peer.host, sizeof(peer.host))), peer.pid);
}

}  // namespace

bool presence_open() {
  Presence& p = presence();
  std::lock_guard<std::mutex> lock(p.mutex);
  return p.channel != MPI_COMM_NULL;
}

void open_presence(const Deadline& deadline, std::chrono::microseconds spin) {
  if (presence_open()) return;
  int world_rank = 0;
  int world_size = 0;
  ZEST_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  ZEST_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  // On the heap and kept on a timeout: MPI may still write them.
  struct Opening {
    MPI_Comm channel = MPI_COMM_NULL;
    Peer mine;
    std::vector<Peer> all;
  };
  auto opening = std::make_shared<Opening>();
  opening->all.resize(static_cast<size_t>(world_size));
  opening->mine.pid = static_cast<int32_t>(::getpid());
  if (::gethostname(opening->mine.host, sizeof(opening->mine.host) - 1) != 0) {
    copy_text(opening->mine.host, sizeof(opening->mine.host), "unknown host");
  }
  const auto await = [&](MPI_Request& request, const char* what) {
    if (poll_until(request, deadline, spin)) return;
    const std::string message = fmt::format(
        "opening ZEST's MPI presence channel ({}) timed out on world rank {} of {}: not every "
        "process took part; every process must call make_mpi_world",
        what, world_rank, world_size);
    MpiEnvironment::keep_until_exit(opening);
    MpiEnvironment::record_abort(message);
    throw CommError(CommError::Reason::kTimeout, message, __FILE__, __LINE__);
  };
  MPI_Request request = MPI_REQUEST_NULL;
  ZEST_MPI_CHECK(MPI_Comm_idup(MPI_COMM_WORLD, &opening->channel, &request));
  await(request, "MPI_Comm_idup");
  ZEST_MPI_CHECK(MPI_Comm_set_errhandler(opening->channel, MPI_ERRORS_RETURN));
  ZEST_MPI_CHECK(MPI_Iallgather(&opening->mine, sizeof(Peer), MPI_BYTE, opening->all.data(),
                                sizeof(Peer), MPI_BYTE, opening->channel, &request));
  await(request, "MPI_Iallgather of hosts");
  int keyval = MPI_KEYVAL_INVALID;
  ZEST_MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, on_finalize, &keyval, nullptr));
  ZEST_MPI_CHECK(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr));
  Presence& p = presence();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.world_rank = world_rank;
  p.peers = std::move(opening->all);
  p.departed.assign(static_cast<size_t>(world_size), std::string());
  p.channel = opening->channel;
}

std::string describe_world_rank(int world_rank) {
  Presence& p = presence();
  std::lock_guard<std::mutex> lock(p.mutex);
  return describe_locked(p, world_rank);
}

void object_to_departure(int world_rank, const WaitingIn& me) {
  Presence& p = presence();
  std::lock_guard<std::mutex> lock(p.mutex);
  if (p.channel == MPI_COMM_NULL) return;
  Wire w;
  w.kind = kObjection;
  copy_text(w.text, sizeof(w.text), fmt::format("MPI {} (as rank {} of {})", me.what, me.comm_rank,
                                                me.comm_size));
  post(p, world_rank, w);
}

std::vector<int> world_ranks_of(MPI_Comm comm) {
  MPI_Group group = MPI_GROUP_NULL;
  MPI_Group world = MPI_GROUP_NULL;
  ZEST_MPI_CHECK(MPI_Comm_group(comm, &group));
  int size = 0;
  std::vector<int> ranks;
  std::vector<int> out;
  try {
    ZEST_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
    ZEST_MPI_CHECK(MPI_Group_size(group, &size));
    ranks.resize(static_cast<size_t>(size));
    out.resize(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) ranks[static_cast<size_t>(r)] = r;
    ZEST_MPI_CHECK(MPI_Group_translate_ranks(group, size, ranks.data(), world, out.data()));
  } catch (...) {
    if (world != MPI_GROUP_NULL) ZEST_MPI_WARN(MPI_Group_free(&world));
    ZEST_MPI_WARN(MPI_Group_free(&group));
    throw;
  }
  ZEST_MPI_WARN(MPI_Group_free(&world));
  ZEST_MPI_WARN(MPI_Group_free(&group));
  return out;
}

void serve_presence(const WaitingIn& me) {
  Presence& p = presence();
  // Another thread serving it now does the same work.
  std::unique_lock<std::mutex> lock(p.mutex, std::try_to_lock);
  if (!lock.owns_lock() || p.channel == MPI_COMM_NULL) return;
  drain(p, me, [](int /*source*/, const Wire& /*stale answer*/) {});
}

std::optional<Departure> departed_among(std::span<const int> members) {
  Presence& p = presence();
  std::lock_guard<std::mutex> lock(p.mutex);
  for (const int r : members) {
    if (r >= 0 && static_cast<size_t>(r) < p.departed.size() &&
        !p.departed[static_cast<size_t>(r)].empty()) {
      return Departure{r, p.departed[static_cast<size_t>(r)]};
    }
  }
  return std::nullopt;
}

std::vector<std::optional<Answer>> ask_members(std::span<const int> members, const WaitingIn& me,
                                               std::chrono::milliseconds grace) {
  std::vector<std::optional<Answer>> answers(members.size());
  Presence& p = presence();
  std::unique_lock<std::mutex> lock(p.mutex);
  if (p.channel == MPI_COMM_NULL) return answers;
  const int64_t round = ++p.round;
  Wire question;
  question.kind = kQuestion;
  question.round = round;
  size_t waiting = 0;
  for (const int r : members) {
    if (r == p.world_rank) continue;
    post(p, r, question);
    ++waiting;
  }
  const Deadline deadline(grace);
  const auto on_answer = [&](int source, const Wire& w) {
    if (w.round != round) return;  // a late answer to an earlier question
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i] != source || answers[i]) continue;
      Wire copy = w;
      copy.text[sizeof(copy.text) - 1] = '\0';
      answers[i] = Answer{copy.text, copy.comm_size, copy.moving_data != 0};
      --waiting;
    }
  };
  for (;;) {
    drain(p, me, on_answer);
    if (waiting == 0 || deadline.passed()) break;
    // Unlocked while asleep, so that another thread can serve the channel.
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    lock.lock();
  }
  return answers;
}

}  // namespace zest::mpi
