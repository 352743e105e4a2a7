// The main of lamp's googletest programs. As gtest_main, plus one thing:
// with LAMP_GTEST_ALL_SKIPPED_EXIT=N in the environment, a run whose every
// selected test was skipped (GTEST_SKIP, e.g. a _CUDA test without a GPU)
// exits with N instead of 0, so that ctest, told SKIP_RETURN_CODE N, reports
// it as skipped rather than passed (tests/cmake/LampGtestSuites.cmake runs a
// suite per process).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const int result = RUN_ALL_TESTS();
  const char* all_skipped_exit = std::getenv("LAMP_GTEST_ALL_SKIPPED_EXIT");
  if (result != 0 || all_skipped_exit == nullptr) {
    return result;
  }
  const testing::UnitTest& run = *testing::UnitTest::GetInstance();
  if (run.test_to_run_count() > 0 &&
      run.skipped_test_count() == run.test_to_run_count()) {
    return std::atoi(all_skipped_exit);
  }
  return result;
}
