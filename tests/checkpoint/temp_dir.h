// A fresh directory under the system's temp dir, removed at scope end.
#pragma once

#include <filesystem>
#include <random>
#include <string>
#include <system_error>

#include <fmt/format.h>

namespace zest::test {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() / fmt::format("zest_ckpt_{:08x}{:08x}", rd(), rd());
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;  // never throws from a destructor
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path.string(); }
  // The path of `name` inside, as a string.
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

}  // namespace zest::test
