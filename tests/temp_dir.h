// A fresh directory under the system's temp dir, removed at scope end, for
// tests that write files (checkpoints, weight files).
#pragma once

#include <filesystem>
#include <random>
#include <string>

#include <fmt/format.h>

namespace zest::test {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const char* prefix = "zest_test") {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() / fmt::format("{}_{:08x}", prefix, rd());
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path.string(); }
};

}  // namespace zest::test
