// Reads a saved checkpoint (checkpoint.h) by unit and element range,
// whatever layout it was saved with: the engine's load, and the offline
// tools (zest-ckpt export and reshard) that never hold more than a range.
//
// Every shard file is checked against the manifest (size, CRC-32) the first
// time it is read, and every value for finiteness; problems are zest::Errors
// naming the file.
#pragma once

#include <cmath>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "zest/checkpoint/checkpoint_manifest.h"
#include "zest/core/file_io.h"

namespace zest {

class CheckpointReader {
 public:
  // `dir` is a checkpoint directory (root/step_000100), not the root.
  explicit CheckpointReader(std::string dir);

  const std::string& dir() const { return dir_; }
  const CheckpointManifest& manifest() const { return manifest_; }
  const ModelLayout& layout() const { return layout_; }

  // Elements [begin, begin + out.size()) of unit u's flat buffer `buffer`
  // (0: master weights, 1..: optimizer state), in the unit's coordinates;
  // elements past the saved padding read as zero.
  void read(int buffer, int unit, size_t begin, std::span<float> out);

  // Checks every file's size and checksum.
  void verify_all();

 private:
  const ReadOnlyFile& file(int partition);

  std::string dir_;
  CheckpointManifest manifest_;
  ModelLayout layout_;
  std::map<int, std::unique_ptr<ReadOnlyFile>> open_;
};

// "master weights", "optimizer state 0", ...
std::string shard_buffer_name(int buffer);

// Whether a checkpoint may hold `x` in shard buffer `buffer`: finite, and
// not negative in Adam's second moment (buffer 2). A load refuses anything
// else as corrupt, and a save refuses to write it.
inline bool checkpoint_value_ok(int buffer, float x) { return std::isfinite(x) && (buffer != 2 || x >= 0.0f); }

}  // namespace zest
