#pragma once

// The command line of the benchmarks run as a group's ranks
// (lamp_zero_step, lamp_sharded_step): positional arguments read strictly,
// so that "abc" or "12abc" is an error rather than 0 or 12, and their main.

#include <c10/util/Exception.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <string>
#include <system_error>

#include "common/cli.h"

namespace lamp_bench {

// Argument `i` (`what`): a decimal integer in lo..hi, nothing else, or
// `fallback` where the command line ends before it; `usage` ends the
// message of a refusal.
inline int64_t positional_integer(int argc, char** argv, int i,
                                  const char* what, int64_t lo, int64_t hi,
                                  int64_t fallback, const char* usage) {
  if (argc <= i) {
    return fallback;
  }
  const std::string text = argv[i];
  int64_t value = 0;
  const auto read =
      std::from_chars(text.data(), text.data() + text.size(), value);
  TORCH_CHECK(read.ec == std::errc() && read.ptr == text.data() + text.size(),
              "argument ", i, " (", what, ") is '", text, "', not an integer; ",
              usage, ".");
  TORCH_CHECK(value >= lo && value <= hi, "argument ", i, " (", what, ") is ",
              value, "; give an integer in ", lo, "..", hi, ". ", usage, ".");
  return value;
}

// `run(parse(argc, argv))` as `program`'s main: a bad command line is one
// line and exit status 2, an error while running one line and 1
// (lamp_examples::guarded_main).
template <class Args>
int rank_benchmark_main(const char* program, int argc, char** argv,
                        Args (*parse)(int, char**), int (*run)(const Args&)) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", program,
                 e.what_without_backtrace());
    return lamp_examples::kUsageError;
  }
  return lamp_examples::guarded_main(program, [&] { return run(args); });
}

} // namespace lamp_bench
