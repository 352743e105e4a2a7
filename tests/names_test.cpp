// lamp::NameTable and the tables of every enum-like choice: each value has
// one name that parses back to it, aliases parse too, and an unknown name is
// refused with the list.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "lamp/amp/precision.h"
#include "lamp/amp/train_step.h"
#include "lamp/optim/optimizer.h"
#include "lamp/platform/names.h"
#include "lamp/training/schedule.h"
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
