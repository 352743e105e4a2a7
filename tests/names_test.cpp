// lamp::NameTable and the tables of every enum-like choice: each value has
// one name that parses back to it, aliases parse too, and an unknown name is
// refused with the list. And numbers as text (platform/number_text.h): the
// same strings in every C locale.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <clocale>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "lamp/amp/precision.h"
#include "lamp/amp/train_step.h"
#include "lamp/optim/optimizer.h"
#include "lamp/platform/names.h"
#include "lamp/training/schedule.h"
#include "platform/number_text.h"
#include "test_util.h"

namespace {

enum class Colour { kRed, kGreen, kBlue };

const lamp::NameTable<Colour>& colours() {
  static const lamp::NameTable<Colour> table("colour", "colours",
                                             {{"red", Colour::kRed},
                                              {"green", Colour::kGreen},
                                              {"verde", Colour::kGreen},
                                              {"blue", Colour::kBlue}});
  return table;
}

template <typename T>
void expect_round_trip(const lamp::NameTable<T>& table) {
  for (const auto& name : table.names()) {
    EXPECT_EQ(table.name(table.parse(name)), name);
  }
}

// LC_NUMERIC set to a locale whose decimal point is a comma, for the
// object's lifetime: an installed one, or else one built here by localedef
// from a definition of LC_NUMERIC alone, in a temporary folder that
// LOCPATH names while setlocale() loads it. active() is false where neither
// works (no such locale, no localedef).
class CommaNumbers {
 public:
  CommaNumbers() : saved_(std::setlocale(LC_NUMERIC, nullptr)) {
    for (const char* name : {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8",
                             "fr_FR.utf8", "ru_RU.UTF-8", "ru_RU.utf8"}) {
      if (use(name)) {
        return;
      }
    }
    build();
  }
  ~CommaNumbers() {
    std::setlocale(LC_NUMERIC, saved_.c_str());
    if (!folder_.empty()) {
      // Not std::filesystem::remove_all: the torch wheels' copy of it
      // crashes (src/platform/paths.cpp).
      const std::string command = "rm -rf '" + folder_ + "'";
      const int status = std::system(command.c_str());
      static_cast<void>(status);
    }
  }
  CommaNumbers(const CommaNumbers&) = delete;
  CommaNumbers& operator=(const CommaNumbers&) = delete;

  bool active() const { return active_; }

 private:
  bool use(const char* name) {
    active_ = std::setlocale(LC_NUMERIC, name) != nullptr &&
              std::string(std::localeconv()->decimal_point) == ",";
    if (!active_) {
      std::setlocale(LC_NUMERIC, saved_.c_str());
    }
    return active_;
  }
  void build() {
    std::string folder = ::testing::TempDir() + "lamp_locale_XXXXXX";
    if (::mkdtemp(&folder[0]) == nullptr) {
      return;
    }
    folder_ = folder;
    const std::string source = folder_ + "/comma.src";
    std::ofstream(source) << "LC_NUMERIC\ndecimal_point \",\"\n"
                             "thousands_sep \".\"\ngrouping 3;3\n"
                             "END LC_NUMERIC\n";
    // localedef exits 1 for the categories the definition leaves out; the
    // locale is judged by whether setlocale() takes it.
    const std::string command = "localedef -c -i '" + source + "' '" + folder_ +
                                "/lamp_comma' >/dev/null 2>&1";
    const int status = std::system(command.c_str());
    static_cast<void>(status);
    const char* previous = std::getenv("LOCPATH");
    const std::string saved_path = previous != nullptr ? previous : "";
    ::setenv("LOCPATH", folder_.c_str(), 1);
    use("lamp_comma");
    if (previous != nullptr) {
      ::setenv("LOCPATH", saved_path.c_str(), 1);
    } else {
      ::unsetenv("LOCPATH");
    }
  }

  const std::string saved_;
  std::string folder_;
  bool active_ = false;
};

} // namespace

TEST(NameTable, CanonicalNamesAliasesAndTheRefusal) {
  const auto& table = colours();
  EXPECT_EQ(table.names(), (std::vector<std::string>{"red", "green", "blue"}));
  EXPECT_EQ(table.spellings(),
            (std::vector<std::string>{"red", "green", "verde", "blue"}));
  EXPECT_EQ(table.parse("verde"), Colour::kGreen);
  EXPECT_EQ(table.name(Colour::kGreen), "green");
  EXPECT_EQ(table.choices(), "red, green (or verde) and blue");
  EXPECT_EQ(
      lamp_test::error_of([&] { table.parse("Red"); }),
      "lamp: unknown colour 'Red'; valid colours are red, green (or verde) and blue.");
}

TEST(NameTable, EveryChoiceOfTheLibraryRoundTrips) {
  expect_round_trip(lamp::precision_table());
  expect_round_trip(lamp::cuda_graph_mode_table());
  expect_round_trip(lamp::optim::implementation_table());
  expect_round_trip(lamp::training::schedule_table());
  EXPECT_EQ(lamp::parse_precision("fp16"), lamp::Precision::kHalf);
  EXPECT_EQ(lamp::to_string(lamp::Precision::kHalf), "half");
  EXPECT_EQ(lamp::precision_names(),
            (std::vector<std::string>{"fp32", "tf32", "amp", "amp-bf16", "half",
                                      "bf16", "fp8", "auto"}));
  EXPECT_EQ(
      lamp_test::error_of([] { lamp::parse_precision("fp4"); }),
      "lamp: unknown precision 'fp4'; valid precisions are fp32, tf32, amp, amp-bf16, half (or fp16), bf16, fp8 and auto.");
  EXPECT_EQ(lamp::training::schedule_table().names(),
            (std::vector<std::string>{"onecycle", "cosine", "warmup-cosine",
                                      "constant"}));
  EXPECT_EQ(lamp::optim::optimizer_names(),
            (std::vector<std::string>{"sgd", "adam", "adamw"}));
}

// exact()'s strings are stored in checkpoints and compared as text on
// resume, so they are fixed: printf's "%.15g", or "%.17g" where 15 digits do
// not read back as the value (the golden strings are Python's '%.15g' and
// '%.17g', which round as glibc's printf does).
TEST(NumberText, ExactIsFifteenDigitsOrSeventeen) {
  using lamp::detail::exact;
  EXPECT_EQ(exact(0.05), "0.05");
  EXPECT_EQ(exact(0.4914), "0.4914");
  EXPECT_EQ(exact(3e-4), "0.0003");
  EXPECT_EQ(exact(2.5e-5), "2.5e-05");
  EXPECT_EQ(exact(100), "100");
  EXPECT_EQ(exact(1e15), "1e+15");
  EXPECT_EQ(exact(1e300), "1e+300");
  EXPECT_EQ(exact(-0.0), "-0");
  EXPECT_EQ(exact(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(exact(1.0 / 3), "0.33333333333333331");
  EXPECT_EQ(exact(123456789012345678.0), "1.2345678901234568e+17");
  // The smallest subnormal reads back from 15 digits.
  EXPECT_EQ(exact(std::numeric_limits<double>::denorm_min()),
            "4.94065645841247e-324");
  EXPECT_EQ(exact(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(exact(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(exact(std::nan("")), "nan");
  EXPECT_EQ(lamp::detail::byte_count(512), "512 bytes");
  EXPECT_EQ(lamp::detail::byte_count(1610612736), "1.5 GiB (1610612736 bytes)");
  // 1.25 MiB: a tie, rounded to even as printf's "%.1f" does.
  EXPECT_EQ(lamp::detail::byte_count(1310720), "1.2 MiB (1310720 bytes)");
}

// A host program that calls setlocale(LC_ALL, "de_DE.UTF-8") gets the same
// strings: snprintf would write "0,4914", and a checkpoint's settings would
// then differ from the same run's in the "C" locale.
TEST(NumberText, TheSameStringsUnderADecimalCommaLocale) {
  const CommaNumbers comma;
  if (!comma.active()) {
    GTEST_SKIP() << "no locale with a decimal comma is installed, and "
                    "localedef could not build one";
  }
  char text[16];
  std::snprintf(text, sizeof(text), "%.1f", 0.5);
  ASSERT_EQ(std::string(text), "0,5"); // the locale is in effect
  EXPECT_EQ(lamp::detail::exact(0.4914), "0.4914");
  EXPECT_EQ(lamp::detail::exact(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(lamp::detail::exact(2.5e-5), "2.5e-05");
  EXPECT_EQ(lamp::detail::byte_count(1610612736), "1.5 GiB (1610612736 bytes)");
}
