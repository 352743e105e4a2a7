#pragma once

// When the ranks of a data-parallel run next ask one another whether one of
// them was asked to stop (TrainerOptions::stop_requested). Each check is an
// all-reduce that holds every rank to the slowest one's pace, and in an
// evaluation on a CPU one a turn cost more than the turns themselves where
// they are short: two train_mnist ranks evaluating batches of 2, 10 and 50
// images took 2.0x, 1.4-1.6x and 1.2-1.3x as long as with no check at all.
// So the answer carries, besides the rank asked, the number of turns until
// the next check: each rank proposes as many as fill about kTarget at its
// own pace since the last check, and all take the fewest proposed. Every
// rank thus checks at the same turns, the stop comes about kTarget after a
// rank was asked, and the checks' cost fell within the machine's noise
// (docs/distributed.md).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>

namespace lamp {
namespace training {
namespace detail {

class StopCadence {
 public:
  using Clock = std::chrono::steady_clock;
  /// About this long of an evaluation between two checks.
  static constexpr std::chrono::milliseconds kTarget{100};
  /// At most this many cycles between two checks.
  static constexpr int64_t kMostCycles = 256;

  /// Starts over (a fit(), an evaluation, the training after one): the
  /// next due() is a check, and the pace is measured anew.
  void restart() { *this = StopCadence(); }

  /// Counts a cycle (a step, an evaluation's turn): whether the ranks
  /// check at this one.
  bool due() {
    ++cycles_since_check_;
    if (cycles_left_ > 0) {
      --cycles_left_;
      return false;
    }
    return true;
  }

  /// The cycles until the next check that this rank proposes at a check
  /// due `now`, from its pace since the last one: as many as fill kTarget,
  /// 1 to kMostCycles (1 at the first check, which has no pace yet).
  int64_t proposal(Clock::time_point now) const {
    if (!last_check_) {
      return 1;
    }
    const auto took = now - *last_check_;
    if (took <= Clock::duration::zero()) {
      return kMostCycles;
    }
    const int64_t fill = kTarget * cycles_since_check_ / took;
    return std::clamp<int64_t>(fill, 1, kMostCycles);
  }

  /// The ranks agreed, at a check due `now`, on `cycles` until the next
  /// one (the fewest proposed; 1: the next cycle checks again).
  void agree(int64_t cycles, Clock::time_point now) {
    cycles_left_ = std::max<int64_t>(cycles, 1) - 1;
    cycles_since_check_ = 0;
    last_check_ = now;
  }

 private:
  // Cycles to pass before the next check.
  int64_t cycles_left_ = 0;
  // Cycles counted by due() since the last check (this one's included).
  int64_t cycles_since_check_ = 0;
  std::optional<Clock::time_point> last_check_;
};

} // namespace detail
} // namespace training
} // namespace lamp
