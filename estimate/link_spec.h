// A link of the cost model (estimate/cost_model.h): its bandwidth and
// latency, named presets, and the text zest-estimate --link takes.
//
//   // zest-example: run
//   const zest::LinkSpec ib = zest::parse_link_spec("200Gbit/s,5us");
//   ZEST_CHECK(ib.bytes_per_s == 25e9 && ib.latency_s == 5e-6, "200 Gbit/s is 25 GB/s");
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace zest {

struct LinkSpec {
  double bytes_per_s = 0.0;  // per direction
  double latency_s = 0.0;    // one message's start-up: the alpha of a hop
};

enum class LinkPresetClass : unsigned char { kIntra, kInter };

struct LinkPreset {
  std::string_view name;
  LinkPresetClass link_class;  // which link it describes
  LinkSpec link;
  std::string_view what;  // the hardware, for --help and the docs
};

// nvlink4, nvlink3 (within a host); ib-ndr, ib-hdr, efa-400, efa-100
// (a host's NICs together); sim-intra, sim-inter (this project's simulated
// hosts, measured). Sources and assumptions: Note [link presets] in
// link_spec.cpp.
const std::vector<LinkPreset>& link_presets();
// Throws an Error listing the presets when there is none of that name.
const LinkPreset& link_preset(std::string_view name);
// "nvlink4, nvlink3, ...": for messages.
std::string link_preset_names();

// "BANDWIDTH[,LATENCY]" or a preset's name. Bandwidth in bytes (B, kB, MB,
// GB, TB, KiB, MiB, GiB) or bits (bit, kbit, Mbit, Gbit, Tbit; also kbps,
// Mbps, Gbps) per second, "/s" optional: 400GB/s, 25Gbit/s, 100Gbps, 4.5e11
// (bytes/s). Latency: ns, us, ms, s (0 without a unit): 5us, 1.5ms. Without
// one, 0. Throws an Error quoting the text and the expected form.
LinkSpec parse_link_spec(std::string_view text);

}  // namespace zest
