// Support for the generated translation units of the documentation's code
// examples (scripts/doc_examples.py; docs/BUILD.md, Code examples in the docs).
#pragma once

#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace zest_doc {

// An object a prelude names for a fragment that is compiled and linked, never
// run: the example only has to type-check against the real API.
template <typename T>
T& given() {
  throw std::logic_error("a compile-only documentation example was run");
}

template <typename F>
int result_of(F&& f) {
  if constexpr (std::is_void_v<decltype(f())>) {
    f();
    return 0;
  } else {
    return static_cast<int>(f());
  }
}

// Runs the examples marked `run`, each in a fresh directory of its own under
// the working directory (they may write checkpoints and files).
class Runner {
 public:
  void run(const char* where, const std::function<int()>& example) {
    namespace fs = std::filesystem;
    const fs::path home = fs::current_path();
    std::string dir_name = std::string("run_") + where;
    for (char& c : dir_name)
      if (c == '/' || c == ':' || c == '.') c = '_';
    const fs::path dir = home / dir_name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    fs::current_path(dir);
    std::string problem;
    try {
      const int rc = example();
      if (rc != 0) problem = "returned " + std::to_string(rc);
    } catch (const std::exception& e) {
      problem = std::string("threw: ") + e.what();
    }
    fs::current_path(home);
    ++ran_;
    if (problem.empty()) {
      std::printf("ran %s: ok\n", where);
    } else {
      std::printf("ran %s: FAILED, %s\n", where, problem.c_str());
      failures_.push_back(std::string(where) + ": " + problem);
    }
    std::fflush(stdout);
  }

  void note_skipped(const char* what) { skipped_.emplace_back(what); }

  int finish(int compiled) const {
    for (const std::string& s : skipped_) std::printf("not built here: %s\n", s.c_str());
    std::printf("doc examples: %d compiled and linked, %d of them run, %zu failed to run, %zu not built here\n",
                compiled, ran_, failures_.size(), skipped_.size());
    for (const std::string& f : failures_) std::printf("FAILED: %s\n", f.c_str());
    return failures_.empty() ? 0 : 1;
  }

 private:
  int ran_ = 0;
  std::vector<std::string> failures_;
  std::vector<std::string> skipped_;
};

}  // namespace zest_doc
