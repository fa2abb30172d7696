// libFuzzer target: any bytes as a checkpoint manifest. A zest::Error is the
// expected answer to malformed input; a finding is anything else (another
// exception, a crash, a sanitizer report), or a manifest that parses but
// does not survive its own round trip.
#include <cstddef>
#include <cstdint>
#include <string>

#include "zest/core/check.h"
#include "zest/checkpoint/checkpoint_manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  zest::CheckpointManifest m;
  try {
    m = zest::parse_manifest(text, "fuzz.json");
  } catch (const zest::Error&) {
    return 0;
  }
  // What parsed must write and parse back to the same layout.
  const zest::CheckpointManifest again = zest::parse_manifest(zest::manifest_to_json(m), "again.json");
  if (again.layout().describe() != m.layout().describe() || again.files.size() != m.files.size()) {
    __builtin_trap();
  }
  return 0;
}
