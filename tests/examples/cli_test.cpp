// The programs' command-line parser (examples/common/cli.h): integers read
// as decimal whatever their leading zeros, lamp's messages for bad values,
// and an integer flag without lamp's checks refused before parsing.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/cli.h"

namespace {

// parse_command_line() on `args` (after the program's name): its status,
// what it printed on stderr, and the exception it threw, if any.
struct Parsed {
  int status = 0;
  std::string printed;
  std::string thrown;
};

Parsed parse(CLI::App& app, std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (auto& arg : args) {
    argv.push_back(arg.data());
  }
  Parsed parsed;
  ::testing::internal::CaptureStderr();
  try {
    parsed.status = lamp_examples::parse_command_line(
        app, "prog", static_cast<int>(argv.size()), argv.data());
  } catch (const std::exception& e) {
    parsed.thrown = lamp_examples::error_message(e);
  }
  parsed.printed = ::testing::internal::GetCapturedStderr();
  return parsed;
}

TEST(CommandLine, IntegersAreDecimalWhateverTheirLeadingZeros) {
  int64_t count = 0, signed_count = 0;
  uint64_t seed = 0;
  std::vector<int64_t> ids;
  CLI::App app{"test"};
  app.add_option("--count", count)->check(lamp_examples::integer_in(0, 100));
  app.add_option("--signed", signed_count)
      ->check(lamp_examples::integer_at_least(-100));
  app.add_option("--seed", seed)->check(lamp_examples::unsigned_integer());
  app.add_option("--ids", ids)
      ->delimiter(',')
      ->check(lamp_examples::integer_in(0, 1000));
  const auto parsed = parse(app, {"--count", "010", "--signed", "-007",
                                  "--seed", "08", "--ids", "010,09,0"});
  EXPECT_EQ(parsed.status, -1) << parsed.printed << parsed.thrown;
  EXPECT_EQ(count, 10);
  EXPECT_EQ(signed_count, -7);
  EXPECT_EQ(seed, 8u);
  EXPECT_EQ(ids, (std::vector<int64_t>{10, 9, 0}));
}

TEST(CommandLine, BadIntegersAreUsageErrorsNamingTheFlag) {
  int64_t count = 0;
  CLI::App app{"test"};
  app.add_option("--count", count)->check(lamp_examples::integer_in(1, 100));
  const auto out_of_range = parse(app, {"--count", "0101"});
  EXPECT_EQ(out_of_range.status, lamp_examples::kUsageError);
  EXPECT_NE(out_of_range.printed.find(
                "prog: error: --count: 101 is out of range: give an integer "
                "in 1..100"),
            std::string::npos)
      << out_of_range.printed;
  CLI::App again{"test"};
  again.add_option("--count", count)->check(lamp_examples::integer_in(1, 100));
  const auto word = parse(again, {"--count", "0x10"});
  EXPECT_EQ(word.status, lamp_examples::kUsageError);
  EXPECT_NE(word.printed.find("--count: '0x10' is not an integer"),
            std::string::npos)
      << word.printed;
}

// A flag CLI11 alone would read (octal "010", its own messages) stops the
// program before parsing, naming the flag and the fix; other types and
// switches are left alone.
TEST(CommandLine, AnIntegerFlagWithoutLampsChecksIsRefused) {
  for (const bool in_group : {false, true}) {
    SCOPED_TRACE(in_group ? "in an option group" : "in the app");
    int64_t unchecked = 0;
    double rate = 0;
    bool on = false;
    std::string name;
    CLI::App app{"test"};
    app.add_option("--rate", rate);
    app.add_flag("--on", on);
    app.add_option("--name", name);
    CLI::App* where = in_group ? app.add_option_group("group") : &app;
    where->add_option("--unchecked", unchecked);
    const auto parsed = parse(app, {"--unchecked", "010"});
    EXPECT_NE(
        parsed.thrown.find("the flag --unchecked reads an integer without "
                           "lamp_examples' integer checks; give it "
                           "->check(integer_in(...))"),
        std::string::npos)
        << parsed.thrown;
    EXPECT_EQ(unchecked, 0);
  }
  double rate = 0;
  bool on = false;
  CLI::App fine{"test"};
  fine.add_option("--rate", rate);
  fine.add_flag("--on", on);
  const auto parsed = parse(fine, {"--rate", "0.5", "--on"});
  EXPECT_EQ(parsed.status, -1) << parsed.printed << parsed.thrown;
  EXPECT_EQ(rate, 0.5);
  EXPECT_TRUE(on);
}

} // namespace
