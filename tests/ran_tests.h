// Makes a test run that was asked to run test cases and ran none fail.
//
// ctest runs one test case per call (--test-case=NAME, from
// doctest_discover_tests). A name ctest mangles (it splits names at ';')
// matches no test case, and doctest then exits 0: a test that cannot fail.
// The counting listener below sees every case that starts; each test main
// passes its result through fail_if_none_ran. Include from one file per
// executable (the listener registers itself).
#pragma once

#include <doctest/doctest.h>

#include <cstdio>

namespace zest_test {

class RunCounter final : public doctest::IReporter {
 public:
  explicit RunCounter(const doctest::ContextOptions&) {}

  static inline bool run_started = false;  // false in query modes (--list-test-cases, --count)
  static inline int cases_started = 0;

  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override { run_started = true; }
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { ++cases_started; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

REGISTER_LISTENER("zest_run_counter", 1, RunCounter);

inline int fail_if_none_ran(int rc) {
  if (rc == 0 && RunCounter::run_started && RunCounter::cases_started == 0) {
    std::fprintf(stderr,
                 "no test case matched the filter, so nothing was tested: check the "
                 "--test-case name (ctest splits test names at ';', so a name must not "
                 "contain one)\n");
    return 1;
  }
  return rc;
}

}  // namespace zest_test
