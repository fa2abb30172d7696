// A fresh directory under the system's temp dir, removed at scope end.
#pragma once

#include <filesystem>
#include <random>
#include <string>

#include <fmt/format.h>

namespace zest::test {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() / fmt::format("zest_ckpt_{:08x}", rd());
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path.string(); }
};

}  // namespace zest::test
