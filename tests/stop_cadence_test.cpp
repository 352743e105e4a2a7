// When a data-parallel run's ranks check whether one was asked to stop
// (training/stop_cadence.h): the first check at once, then as many cycles as
// fill StopCadence::kTarget at the pace measured since the last check, 1 to
// kMostCycles, counted down exactly as agreed, and started over anew.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>

#include "training/stop_cadence.h"

namespace {

using lamp::training::detail::StopCadence;
using std::chrono::milliseconds;

// The cycles due() passes over before the next check, after one.
int64_t cycles_to_next_check(StopCadence& cadence) {
  int64_t passed = 0;
  while (!cadence.due()) {
    ++passed;
  }
  return passed;
}

TEST(StopCadence, TheFirstCheckIsAtOnceAndProposesOneCycle) {
  StopCadence cadence;
  EXPECT_TRUE(cadence.due());
  EXPECT_EQ(cadence.proposal(StopCadence::Clock::now()), 1);
}

TEST(StopCadence, ProposesTheCyclesThatFillItsTargetAtThePaceSinceTheLast) {
  const auto start = StopCadence::Clock::now();
  StopCadence cadence;
  ASSERT_TRUE(cadence.due());
  cadence.agree(4, start);
  // 4 cycles of 2 ms each: 50 fill 100 ms.
  EXPECT_EQ(cycles_to_next_check(cadence), 3);
  EXPECT_EQ(cadence.proposal(start + milliseconds(8)), 50);
  // A slower pace, 30 ms a cycle, proposes 3 (100 / 30, rounded down).
  cadence.agree(2, start + milliseconds(8));
  EXPECT_EQ(cycles_to_next_check(cadence), 1);
  EXPECT_EQ(cadence.proposal(start + milliseconds(68)), 3);
}

TEST(StopCadence, ProposesOneToTheMostCycles) {
  const auto start = StopCadence::Clock::now();
  StopCadence cadence;
  ASSERT_TRUE(cadence.due());
  cadence.agree(1, start);
  ASSERT_TRUE(cadence.due());
  // A cycle longer than the target: the next cycle checks again.
  EXPECT_EQ(cadence.proposal(start + milliseconds(500)), 1);
  // A pace too fast to measure, or faster than kMostCycles fill.
  EXPECT_EQ(cadence.proposal(start), StopCadence::kMostCycles);
  EXPECT_EQ(cadence.proposal(start + std::chrono::microseconds(10)),
            StopCadence::kMostCycles);
}

TEST(StopCadence, CountsDownTheCyclesAgreedNotItsOwnProposal) {
  const auto start = StopCadence::Clock::now();
  StopCadence cadence;
  ASSERT_TRUE(cadence.due());
  cadence.agree(7, start);
  EXPECT_EQ(cycles_to_next_check(cadence), 6);
  // Fewer than one cycle agreed is one: the next cycle checks.
  cadence.agree(0, start);
  EXPECT_TRUE(cadence.due());
}

TEST(StopCadence, RestartMakesTheNextCycleACheckWithoutAPace) {
  const auto start = StopCadence::Clock::now();
  StopCadence cadence;
  ASSERT_TRUE(cadence.due());
  cadence.agree(1, start);
  ASSERT_TRUE(cadence.due());
  cadence.agree(100, start + milliseconds(1));
  cadence.restart();
  EXPECT_TRUE(cadence.due());
  EXPECT_EQ(cadence.proposal(start + milliseconds(2)), 1);
}

} // namespace
