#include "zest/estimate/link_spec.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "zest/core/check.h"

namespace zest {
namespace {

// A number and its unit, "400GB/s" -> (400, "gb/s"), the unit lower-cased
// and without spaces; false when no number starts the text.
bool split_number(std::string_view text, double& value, std::string& unit) {
  const std::string s(text);
  char* end = nullptr;
  value = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(value)) return false;
  unit.clear();
  for (const char* p = end; *p != '\0'; ++p) {
    if (*p != ' ') unit += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
  }
  return true;
}

double bandwidth(std::string_view text) {
  double v = 0.0;
  std::string unit;
  if (split_number(text, v, unit)) {
    if (unit.size() > 2 && unit.ends_with("/s")) unit.resize(unit.size() - 2);
    if (unit.size() > 3 && unit.ends_with("bps")) unit = unit.substr(0, unit.size() - 3) + "bit";
    static const std::pair<std::string_view, double> kUnits[] = {
        {"", 1},          {"b", 1},           {"kb", 1e3},        {"mb", 1e6},        {"gb", 1e9},
        {"tb", 1e12},     {"kib", 0x1p10},    {"mib", 0x1p20},    {"gib", 0x1p30},    {"bit", 0.125},
        {"kbit", 125.0},  {"mbit", 125e3},    {"gbit", 125e6},    {"tbit", 125e9}};
    for (const auto& [name, scale] : kUnits) {
      if (unit == name && v > 0.0) return v * scale;
    }
  }
  throw Error(fmt::format("'{}' is not a bandwidth; expected a positive number of bytes or bits a second such "
                          "as 400GB/s, 25Gbit/s, 100Gbps or 4.5e11 (bytes/s)",
                          text),
              __FILE__, __LINE__);
}

double latency(std::string_view text) {
  double v = 0.0;
  std::string unit;
  if (split_number(text, v, unit) && v >= 0.0) {
    // Divided by a power of ten, which the double holds exactly, so that
    // "5us" is the double nearest 5e-6 (5 x 1e-6 is not).
    static const std::pair<std::string_view, double> kUnits[] = {
        {"ns", 1e9}, {"us", 1e6}, {"\u00b5s", 1e6}, {"ms", 1e3}, {"s", 1.0}};
    if (unit.empty() && v == 0.0) return 0.0;
    for (const auto& [name, per_second] : kUnits) {
      if (unit == name) return v / per_second;
    }
  }
  throw Error(fmt::format("'{}' is not a latency; expected 0 or more with a unit: ns, us, ms or s (e.g. 5us)", text),
              __FILE__, __LINE__);
}

}  // namespace

// Note [link presets]. Bandwidths per direction. NVLink: NVIDIA's datasheets
// give 900 GB/s (H100 SXM, NVLink 4) and 600 GB/s (A100 SXM, NVLink 3) a
// GPU, both directions together. Networks: a host's NICs together at their
// line rates (DGX H100: 8 x 400 Gbit/s NDR; DGX A100: 8 x 200 Gbit/s HDR;
// AWS p4d.24xlarge: 400 Gbit/s of EFA; p3dn.24xlarge: 100 Gbit/s). The
// latencies are this model's assumptions, the order of one NCCL ring step,
// not measurements: 3 us within a host, 5 us over InfiniBand, 15 us over
// EFA. sim-intra and sim-inter were measured on this project's 2-core VM
// (docs/BENCHMARKS.md, "Cost model against published scaling figures"):
// bench/comm_bench --backend mpi --quick, 2 ranks, Open MPI over TCP
// between two processes of one simulated host (scripts/sim_hosts.sh) and
// between two hosts over the unshaped veth pair: the 4 MiB all_gather's
// bus bandwidth (each rank's bytes over the time) and the 4 KiB
// all_gather's time, the better of two runs on a loaded machine (the other
// gave 2.26 GB/s within, 0.42 GB/s between).
const std::vector<LinkPreset>& link_presets() {
  using C = LinkPresetClass;
  static const std::vector<LinkPreset> kPresets = {
      {"nvlink4", C::kIntra, {450e9, 3e-6}, "H100 SXM NVLink 4, 450 GB/s a GPU each way"},
      {"nvlink3", C::kIntra, {300e9, 3e-6}, "A100 SXM NVLink 3, 300 GB/s a GPU each way"},
      {"ib-ndr", C::kInter, {400e9, 5e-6}, "8 x 400 Gbit/s InfiniBand NDR a host (DGX H100)"},
      {"ib-hdr", C::kInter, {200e9, 5e-6}, "8 x 200 Gbit/s InfiniBand HDR a host (DGX A100)"},
      {"efa-400", C::kInter, {50e9, 15e-6}, "400 Gbit/s EFA a host (AWS p4d.24xlarge)"},
      {"efa-100", C::kInter, {12.5e9, 15e-6}, "100 Gbit/s a host (AWS p3dn.24xlarge)"},
      {"sim-intra", C::kIntra, {2.3e9, 12e-6}, "measured: MPI over TCP within a simulated host"},
      {"sim-inter", C::kInter, {1.2e9, 14e-6}, "measured: MPI over TCP between simulated hosts"},
  };
  return kPresets;
}

std::string link_preset_names() {
  std::string names;
  for (const LinkPreset& p : link_presets()) names += fmt::format("{}{}", names.empty() ? "" : ", ", p.name);
  return names;
}

const LinkPreset& link_preset(std::string_view name) {
  for (const LinkPreset& p : link_presets()) {
    if (p.name == name) return p;
  }
  throw Error(fmt::format("no link preset '{}': the presets are {}", name, link_preset_names()), __FILE__, __LINE__);
}

LinkSpec parse_link_spec(std::string_view text) {
  for (const LinkPreset& p : link_presets()) {
    if (p.name == text) return p.link;
  }
  const size_t comma = text.find(',');
  LinkSpec out;
  out.bytes_per_s = bandwidth(text.substr(0, comma));
  if (comma != std::string_view::npos) out.latency_s = latency(text.substr(comma + 1));
  return out;
}

}  // namespace zest
