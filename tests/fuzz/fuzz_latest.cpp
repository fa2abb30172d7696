// libFuzzer target: any bytes as a checkpoint root's `latest` file. A
// zest::Error is the expected answer to anything but one tag and a newline;
// a finding is anything else (another exception, a crash, a sanitizer
// report), a tag that could leave the root or name ZEST's own files, or an
// error message with a byte of the input echoed raw (a control byte or a
// non-ASCII byte: a terminal would interpret it).
#include <cstddef>
#include <cstdint>
#include <string>

#include "zest/checkpoint/checkpoint_paths.h"
#include "zest/core/check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string tag;
  try {
    tag = zest::parse_latest(text, "root/latest");
  } catch (const zest::Error& e) {
    for (const char c : e.message()) {
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) __builtin_trap();
    }
    return 0;
  }
  if (!zest::is_plain_name(tag) || tag == "latest" || tag.find('/') != std::string::npos || tag.starts_with('.') ||
      tag.size() > 255 || (tag + "\n" != text && tag != text)) {
    __builtin_trap();
  }
  return 0;
}
