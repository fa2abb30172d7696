#include "zest/launch/launch_env.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <utility>
#include <vector>

#include "zest/core/check.h"

namespace zest {
namespace {

constexpr int kMaxRanks = 1 << 24;  // more is a typo, not a job

// One launcher's variable names.
struct Scheme {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

// In order of precedence; see launch_env.h for why.
constexpr Scheme kSchemes[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},  // local size: below
};

std::optional<int64_t> to_int(std::string_view text) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || stop != end || text.empty()) return std::nullopt;
  return v;
}

// `name`'s value as a whole number in [lo, hi]; `expected` says what it is.
int parse_int(const std::string& name, const std::string& value, int64_t lo, int64_t hi,
              std::string_view expected) {
  const std::optional<int64_t> v = to_int(value);
  ZEST_CHECK(v && *v >= lo && *v <= hi,
             "environment variable {}='{}' is not valid: expected {}, a whole number from {} to {}",
             name, value, expected, lo, hi);
  return static_cast<int>(*v);
}

class Reader {
 public:
  explicit Reader(const EnvLookup& env) : env_(env) {}

  std::optional<std::string> get(const char* name) const {
    std::optional<std::string> v = env_(name);
    if (v && v->empty()) v.reset();
    return v;
  }
  std::optional<int> get_int(const char* name, int64_t lo, int64_t hi,
                             std::string_view expected) const {
    const std::optional<std::string> v = get(name);
    if (!v) return std::nullopt;
    return parse_int(name, *v, lo, hi, expected);
  }
  int require_int(const char* name, const char* because, int64_t lo, int64_t hi,
                  std::string_view expected) const {
    const std::optional<int> v = get_int(name, lo, hi, expected);
    ZEST_CHECK(v.has_value(), "environment variable {} is not set, but {} is: the launcher set "
                              "one without the other; set {} to {}",
               name, because, name, expected);
    return *v;
  }

 private:
  const EnvLookup& env_;
};

// Expands Slurm's "2(x3),1" (two tasks on each of three nodes, then one) and
// returns node `node`'s count.
std::optional<int> slurm_tasks_on_node(const std::string& name, const std::string& value, int node) {
  std::vector<int> per_node;
  std::string_view rest = value;
  auto bad = [&]() {
    ZEST_FAIL("environment variable {}='{}' is not valid: expected Slurm's tasks-per-node list "
              "such as '4' or '2(x3),1'",
              name, value);
  };
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    int64_t repeat = 1;
    const size_t paren = item.find("(x");
    if (paren != std::string_view::npos) {
      if (item.back() != ')') bad();
      const std::optional<int64_t> r = to_int(item.substr(paren + 2, item.size() - paren - 3));
      if (!r || *r < 1 || *r > kMaxRanks) bad();
      repeat = *r;
      item = item.substr(0, paren);
    }
    const std::optional<int64_t> n = to_int(item);
    if (!n || *n < 1 || *n > kMaxRanks) bad();
    for (int64_t i = 0; i < repeat && per_node.size() <= static_cast<size_t>(node); ++i) {
      per_node.push_back(static_cast<int>(*n));
    }
  }
  if (per_node.empty()) bad();
  if (static_cast<size_t>(node) >= per_node.size()) return std::nullopt;
  return per_node[static_cast<size_t>(node)];
}

int slurm_local_world_size(const Reader& env, int world_size) {
  if (auto n = env.get_int("SLURM_NTASKS_PER_NODE", 1, kMaxRanks, "the tasks on each node")) {
    return *n;
  }
  const std::optional<int> node = env.get_int("SLURM_NODEID", 0, kMaxRanks, "this node's index");
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    const std::optional<std::string> list = env.get(name);
    if (list && node) {
      const std::optional<int> n = slurm_tasks_on_node(name, *list, *node);
      ZEST_CHECK(n.has_value(), "environment variable {}='{}' lists fewer nodes than SLURM_NODEID={}",
                 name, *list, *node);
      return *n;
    }
  }
  const std::optional<int> nodes = env.get_int("SLURM_NNODES", 1, kMaxRanks, "the job's node count");
  ZEST_CHECK(nodes == 1, "Slurm does not say how many tasks run on this node: set "
                         "--ntasks-per-node (SLURM_NTASKS_PER_NODE), or launch with srun, which "
                         "sets SLURM_STEP_TASKS_PER_NODE and SLURM_NODEID");
  return world_size;
}

std::string job_id_for(const Reader& env, const std::string& launcher) {
  if (auto id = env.get("ZEST_JOB_ID")) return *id;
  if (launcher == "torchrun") {
    // torchrun's static rendezvous names every run "none": not a name.
    auto id = env.get("TORCHELASTIC_RUN_ID");
    return id && *id != "none" ? *id : std::string();
  }
  if (launcher == "slurm") {
    auto job = env.get("SLURM_JOB_ID");
    if (!job) return {};
    auto step = env.get("SLURM_STEP_ID");
    return step ? *job + "." + *step : *job;
  }
  if (launcher == "openmpi") {
    if (auto ns = env.get("PMIX_NAMESPACE")) return *ns;
    if (auto id = env.get("OMPI_MCA_ess_base_jobid")) return *id;
  }
  return {};
}

}  // namespace

std::string LaunchEnv::str() const {
  return fmt::format("rank {} of {} (local {} of {}, launcher {})", rank, world_size, local_rank,
                     local_world_size, launcher);
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

EnvLookup env_from_map(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

LaunchEnv detect_launch_env(const EnvLookup& lookup) {
  const Reader env(lookup);
  LaunchEnv out;
  for (const Scheme& s : kSchemes) {
    const std::optional<int> rank = env.get_int(s.rank, 0, kMaxRanks - 1, "this process's rank");
    if (!rank) continue;
    out.launcher = s.launcher;
    out.rank = *rank;
    out.world_size = env.require_int(s.size, s.rank, 1, kMaxRanks, "the number of processes in the job");
    ZEST_CHECK(out.rank < out.world_size,
               "environment variable {}={} is not a rank of a job of {}={}: ranks run from 0 to "
               "{}; check the launcher's settings",
               s.rank, out.rank, s.size, out.world_size, out.world_size - 1);
    const std::optional<int> local = env.get_int(s.local_rank, 0, kMaxRanks - 1, "this process's rank on its node");
    std::optional<int> local_size;
    if (s.local_size != nullptr) {
      local_size = env.get_int(s.local_size, 1, kMaxRanks, "the number of processes on this node");
    } else {
      local_size = slurm_local_world_size(env, out.world_size);
    }
    // A launcher that does not say (a hand-set RANK/WORLD_SIZE, say) is
    // taken as one node; one that gives only the node's count, as placing
    // ranks on nodes in blocks of that count.
    out.local_rank = local.value_or(local_size ? out.rank % *local_size : out.rank);
    out.local_world_size = local_size.value_or(out.world_size);
    ZEST_CHECK(out.local_rank < out.local_world_size && out.local_world_size <= out.world_size,
               "the {} environment says local rank {} of {} processes on this node in a job of {}: "
               "a local rank must be below the node's process count, which cannot exceed the "
               "job's; check {} and {}",
               s.launcher, out.local_rank, out.local_world_size, out.world_size, s.local_rank,
               s.local_size != nullptr ? s.local_size : "SLURM_NTASKS_PER_NODE");
    break;
  }

  if (auto addr = env.get("MASTER_ADDR")) out.master_addr = *addr;
  const std::optional<int> port = env.get_int("MASTER_PORT", 1, 65535, "rank 0's TCP port");
  out.master_port = port.value_or(0);
  ZEST_CHECK(out.master_addr.empty() || port.has_value(),
             "environment variable MASTER_ADDR is set ('{}') but MASTER_PORT is not: set "
             "MASTER_PORT to a free TCP port (1..65535) on rank 0's host",
             out.master_addr);
  const std::optional<int> zest_port =
      env.get_int("ZEST_MASTER_PORT", 1, 65535, "the TCP port of ZEST's rendezvous on rank 0's host");
  if (zest_port) {
    out.rendezvous_port = *zest_port;
  } else if (out.master_port != 0) {
    const std::optional<std::string> agent = env.get("TORCHELASTIC_USE_AGENT_STORE");
    const bool agent_store = out.launcher == "torchrun" && agent && (*agent == "True" || *agent == "1");
    ZEST_CHECK(!agent_store || out.master_port < 65535,
               "MASTER_PORT=65535 is torchrun's store, and ZEST's rendezvous would use the next "
               "port, which does not exist: set ZEST_MASTER_PORT to a free port");
    out.rendezvous_port = agent_store ? out.master_port + 1 : out.master_port;
  }
  out.job_id = job_id_for(env, out.launcher);
  return out;
}

}  // namespace zest
