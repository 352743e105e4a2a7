#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "lamp/amp/grad_scaler.h"
#include "lamp/platform/checkpoint_file.h"
#include "test_util.h"

namespace {

using lamp_test::BitEqual;
using lamp_test::expect_error;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// One parameter and an optimizer over it. Each scripted step gives the
// parameter a scaled gradient of ones, or a non-finite one.
struct Rig {
  explicit Rig(torch::Device device = torch::kCPU,
               torch::Dtype dtype = torch::kFloat, double momentum = 0.0)
      : w(torch::ones({3}, torch::TensorOptions().device(device).dtype(dtype))
              .requires_grad_()),
        opt(std::vector<torch::Tensor>{w},
            torch::optim::SGDOptions(1.0).momentum(momentum)) {}
  void set_grad(float value) {
    w.mutable_grad() = torch::full({3}, value, w.options());
  }
  torch::Tensor w;
  torch::optim::SGD opt;
};

// One iteration of the Python recipe with a gradient of `value * scale`.
bool scripted_step(lamp::GradScaler& scaler, Rig& rig, float value) {
  const auto scale = scaler.scale(torch::ones({}, rig.w.device()));
  rig.set_grad(value * scale.item<float>());
  const bool stepped = scaler.step(rig.opt);
  scaler.update();
  return stepped;
}

TEST(GradScaler, DefaultsArePythons) {
  lamp::GradScalerOptions o;
  EXPECT_EQ(o.init_scale(), 65536.0);
  EXPECT_EQ(o.growth_factor(), 2.0);
  EXPECT_EQ(o.backoff_factor(), 0.5);
  EXPECT_EQ(o.growth_interval(), 2000);
  EXPECT_TRUE(o.enabled());
  EXPECT_EQ(o.hysteresis(), 1);
  lamp::GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_FALSE(scaler.scale_tensor().defined());
}

TEST(GradScaler, ScaleMultipliesByTheScale) {
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(1024));
  const auto scaled = scaler.scale(torch::tensor({2.0f, -0.5f}));
  EXPECT_TRUE(BitEqual(scaled, torch::tensor({2048.0f, -512.0f})));
  const auto both = scaler.scale({torch::tensor(1.0f), torch::tensor(3.0f)});
  EXPECT_EQ(both[1].item<float>(), 3072.0f);
}

// Golden sequence worked out by hand from PyTorch's rule
// (torch/csrc/.../AmpKernels: backoff on inf, grow after growth_interval
// consecutive finite steps).
TEST(GradScaler, FollowsPyTorchsScaleAndTrackerSequence) {
  lamp::GradScaler scaler(
      lamp::GradScalerOptions().init_scale(8).growth_interval(3));
  Rig rig;
  const std::string pattern = "FFFFIFFFIIFFF";
  const std::vector<double> scales = {8, 8, 16, 16, 8, 8, 8, 16, 8, 4, 4, 4, 8};
  const std::vector<int64_t> trackers = {1, 2, 0, 1, 0, 1, 2, 0, 0, 0, 1, 2, 0};
  for (size_t i = 0; i < pattern.size(); ++i) {
    const bool finite = pattern[i] == 'F';
    EXPECT_EQ(scripted_step(scaler, rig, finite ? 1.0f : kInf), finite) << i;
    EXPECT_EQ(scaler.get_scale(), scales[i]) << "step " << i;
    EXPECT_EQ(scaler.growth_tracker(), trackers[i]) << "step " << i;
  }
  EXPECT_EQ(scaler.steps_taken(), 10);
  EXPECT_EQ(scaler.steps_skipped(), 3);
}

TEST(GradScaler, BacksOffAndSkipsOnInfOrNaNLeavingOptimizerUntouched) {
  for (float bad : {kInf, -kInf, kNaN}) {
    lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(256));
    Rig rig(torch::kCPU, torch::kFloat, /*momentum=*/0.9);
    Rig reference(torch::kCPU, torch::kFloat, 0.9);
    lamp::GradScaler reference_scaler(
        lamp::GradScalerOptions().init_scale(128));
    ASSERT_TRUE(scripted_step(scaler, rig, 0.5f));
    ASSERT_TRUE(scripted_step(reference_scaler, reference, 0.5f));
    const auto before = rig.w.detach().clone();
    EXPECT_FALSE(scripted_step(scaler, rig, bad));
    EXPECT_TRUE(scaler.last_step_skipped());
    EXPECT_EQ(scaler.get_scale(), 128.0);
    EXPECT_TRUE(BitEqual(rig.w.detach(), before));
    // The momentum buffer is untouched too: the next step matches an
    // optimizer that never saw the bad step.
    ASSERT_TRUE(scripted_step(scaler, rig, 0.25f));
    ASSERT_TRUE(scripted_step(reference_scaler, reference, 0.25f));
    EXPECT_TRUE(BitEqual(rig.w.detach(), reference.w.detach()));
  }
}

TEST(GradScaler, UnscalesGradientsExactly) {
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(4096));
  Rig rig;
  scaler.scale(torch::ones({}));
  rig.w.mutable_grad() = torch::tensor({4096.0f, -2048.0f, 1.0f});
  scaler.unscale_(rig.opt);
  EXPECT_TRUE(
      BitEqual(rig.w.grad(), torch::tensor({1.0f, -0.5f, 1.0f / 4096.0f})));
}

TEST(GradScaler, MinAndMaxScaleBoundTheScale) {
  lamp::GradScaler low(lamp::GradScalerOptions().init_scale(4).min_scale(2));
  Rig rig;
  scripted_step(low, rig, kInf);
  EXPECT_EQ(low.get_scale(), 2.0);
  EXPECT_FALSE(scripted_step(low, rig, kInf));
  EXPECT_EQ(low.get_scale(), 2.0);

  lamp::GradScaler high(
      lamp::GradScalerOptions().init_scale(4).max_scale(8).growth_interval(1));
  scripted_step(high, rig, 1.0f);
  EXPECT_EQ(high.get_scale(), 8.0);
  scripted_step(high, rig, 1.0f);
  EXPECT_EQ(high.get_scale(), 8.0);

  EXPECT_THROW(lamp::GradScaler(lamp::GradScalerOptions().min_scale(1e6)),
               c10::Error);

  // update(new_scale) respects the bounds, and a scale set by hand below
  // min_scale is never raised by a backoff.
  lamp::GradScaler bounded(
      lamp::GradScalerOptions().init_scale(16).min_scale(4).max_scale(64));
  scripted_step(bounded, rig, 1.0f);
  bounded.update(1000.0);
  EXPECT_EQ(bounded.get_scale(), 64.0);
  bounded.update(1.0);
  EXPECT_EQ(bounded.get_scale(), 4.0);
}

TEST(GradScaler, PortableUpdateNeverRaisesTheScaleOnBackoff) {
  auto scale = torch::full({}, 1.0f);
  auto tracker = torch::zeros({}, torch::kInt);
  auto overflows = torch::zeros({}, torch::kInt);
  lamp::detail::update_scale_(scale, tracker, overflows, torch::ones({}), 2.0,
                              0.5, 10, /*min_scale=*/8.0, 1e9, 1);
  EXPECT_EQ(scale.item<float>(), 1.0f);
}

TEST(GradScaler, GrowthThatWouldOverflowFP32IsRefused) {
  const double huge = std::ldexp(1.0, 127); // 2^128 is inf in FP32
  lamp::GradScaler scaler(
      lamp::GradScalerOptions().init_scale(huge).growth_interval(1));
  Rig rig;
  scripted_step(scaler, rig, 0.0f);
  EXPECT_EQ(scaler.get_scale(), huge);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, HysteresisBacksOffOnTheNthConsecutiveOverflow) {
  lamp::GradScaler scaler(
      lamp::GradScalerOptions().init_scale(64).hysteresis(3).growth_interval(
          100));
  Rig rig;
  const std::string pattern = "IIIIFIII";
  const std::vector<double> scales = {64, 64, 32, 16, 16, 16, 16, 8};
  for (size_t i = 0; i < pattern.size(); ++i) {
    const bool finite = pattern[i] == 'F';
    EXPECT_EQ(scripted_step(scaler, rig, finite ? 1.0f : kInf), finite) << i;
    EXPECT_EQ(scaler.get_scale(), scales[i]) << "step " << i;
    EXPECT_EQ(scaler.growth_tracker(), finite ? 1 : 0) << "step " << i;
  }
  EXPECT_EQ(scaler.steps_skipped(), 7);
}

TEST(GradScaler, StaticModeKeepsTheScaleButStillSkips) {
  lamp::GradScaler scaler(
      lamp::GradScalerOptions().init_scale(128).dynamic(false).growth_interval(
          1));
  Rig rig;
  EXPECT_TRUE(scripted_step(scaler, rig, 1.0f));
  EXPECT_TRUE(scripted_step(scaler, rig, 1.0f));
  EXPECT_FALSE(scripted_step(scaler, rig, kNaN));
  EXPECT_EQ(scaler.get_scale(), 128.0);
}

TEST(GradScaler, UpdateWithNewScaleSetsIt) {
  lamp::GradScaler scaler;
  Rig rig;
  scripted_step(scaler, rig, 1.0f);
  scaler.update(2.0);
  EXPECT_EQ(scaler.get_scale(), 2.0);
  EXPECT_THROW(scaler.update(-1.0), c10::Error);
}

// A new scale the FP32 scale tensor cannot hold is refused, as the
// constructor refuses it: 1e39 would be inf, 1e-46 a scale of 0 that never
// recovers. max_scale's clamp comes first.
TEST(GradScaler, UpdateRefusesAScaleFloat32CannotHold) {
  lamp::GradScaler scaler;
  Rig rig;
  scripted_step(scaler, rig, 1.0f);
  for (double scale : {1e39, 1e-46}) {
    expect_error([&] { scaler.update(scale); },
                 "lamp::GradScaler::update: the scale");
    expect_error([&] { scaler.update(scale); },
                 "is not representable in float32");
    EXPECT_EQ(scaler.get_scale(), 65536.0);
  }
  lamp::GradScaler bounded(lamp::GradScalerOptions().max_scale(16777216.0));
  scripted_step(bounded, rig, 1.0f);
  bounded.update(1e39);
  EXPECT_EQ(bounded.get_scale(), 16777216.0);
}

TEST(GradScaler, StateErrorsMatchPython) {
  Rig rig;
  lamp::GradScaler fresh;
  expect_error([&] { fresh.step(rig.opt); }, "before scale()");
  expect_error([&] { fresh.unscale_(rig.opt); }, "before scale()");

  lamp::GradScaler scaler;
  scaler.scale(torch::ones({}));
  expect_error([&] { scaler.update(); }, "no inf checks were recorded");
  rig.set_grad(1.0f);
  scaler.unscale_(rig.opt);
  expect_error([&] { scaler.unscale_(rig.opt); }, "already been called");
  scaler.step(rig.opt);
  expect_error([&] { scaler.unscale_(rig.opt); }, "after step()");
  expect_error([&] { scaler.step(rig.opt); }, "already been called");
  scaler.update();
  rig.set_grad(1.0f);
  EXPECT_TRUE(scaler.step(rig.opt)); // READY again after update()
  scaler.update();

  Rig no_grads;
  no_grads.w.mutable_grad() = torch::Tensor();
  expect_error([&] { scaler.step(no_grads.opt); }, "none of its parameters");
}

TEST(GradScaler, SaveLoadRoundTripUsesPythonsKeys) {
  lamp::GradScaler scaler(lamp::GradScalerOptions()
                              .init_scale(32)
                              .growth_interval(5)
                              .growth_factor(3)
                              .backoff_factor(0.25)
                              .hysteresis(2));
  Rig rig;
  for (float v : {1.0f, 1.0f, kInf, kInf, 1.0f}) {
    scripted_step(scaler, rig, v);
  }
  ASSERT_EQ(scaler.get_scale(), 8.0);
  ASSERT_EQ(scaler.growth_tracker(), 1);
  std::stringstream stream;
  {
    torch::serialize::OutputArchive archive;
    scaler.save(archive);
    archive.save_to(stream);
  }
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  c10::IValue value;
  archive.read("scale", value);
  EXPECT_EQ(value.toDouble(), 8.0);
  archive.read("growth_factor", value);
  EXPECT_EQ(value.toDouble(), 3.0);
  archive.read("backoff_factor", value);
  EXPECT_EQ(value.toDouble(), 0.25);
  archive.read("growth_interval", value);
  EXPECT_EQ(value.toInt(), 5);
  archive.read("_growth_tracker", value);
  EXPECT_EQ(value.toInt(), 1);

  for (bool initialised : {false, true}) {
    lamp::GradScaler restored;
    if (initialised) {
      restored.scale(torch::ones({}));
    }
    restored.load(archive);
    EXPECT_EQ(restored.get_scale(), 8.0);
    EXPECT_EQ(restored.growth_tracker(), 1);
    EXPECT_EQ(restored.options().growth_interval(), 5);
    EXPECT_EQ(restored.options().backoff_factor(), 0.25);
    EXPECT_EQ(restored.options().hysteresis(), 2);
    // Same future: four more finite steps grow the scale by 3.
    Rig r;
    for (int i = 0; i < 4; ++i) {
      scripted_step(restored, r, 1.0f);
    }
    EXPECT_EQ(restored.get_scale(), 24.0);
  }
}

// With hysteresis 2, one overflow is pending at the checkpoint: the restored
// scaler must back off on the next overflow, as the original does.
TEST(GradScaler, SaveLoadKeepsThePendingOverflowCount) {
  const auto options =
      lamp::GradScalerOptions().init_scale(64).hysteresis(2).growth_interval(
          100);
  lamp::GradScaler original(options);
  Rig rig;
  scripted_step(original, rig, 1.0f);
  scripted_step(original, rig, kInf); // 1 of 2: no backoff yet
  ASSERT_EQ(original.get_scale(), 64.0);
  std::stringstream stream;
  {
    torch::serialize::OutputArchive archive;
    original.save(archive);
    archive.save_to(stream);
  }
  const std::string saved = stream.str();
  for (bool initialised : {false, true}) {
    std::stringstream copy(saved);
    torch::serialize::InputArchive archive;
    archive.load_from(copy);
    lamp::GradScaler restored(options);
    if (initialised) {
      restored.scale(torch::ones({}));
    }
    restored.load(archive);
    Rig r;
    EXPECT_FALSE(scripted_step(restored, r, kInf));
    EXPECT_EQ(restored.get_scale(), 32.0) << "initialised " << initialised;
  }
  EXPECT_FALSE(scripted_step(original, rig, kInf));
  EXPECT_EQ(original.get_scale(), 32.0);
}

// min_scale_patience: overflows that meet the scale at min_scale are counted
// (finite steps in between do not reset the count); the patience-th stops
// with advice; the count resets only when the scale grows above min_scale.
TEST(GradScaler, StopsWhenTheScaleIsStuckAtItsMinimum) {
  lamp::GradScaler scaler(lamp::GradScalerOptions()
                              .init_scale(4)
                              .min_scale(2)
                              .growth_interval(2)
                              .min_scale_patience(3));
  Rig rig;
  scripted_step(scaler, rig, kInf); // 4 -> 2: not yet at the minimum
  EXPECT_EQ(scaler.get_scale(), 2.0);
  EXPECT_EQ(scaler.min_scale_overflows(), 0);
  scripted_step(scaler, rig, kInf); // at 2: 1
  scripted_step(scaler, rig, 1.0f); // finite: the count stays
  EXPECT_EQ(scaler.min_scale_overflows(), 1);
  scripted_step(scaler, rig, kNaN); // 2
  EXPECT_EQ(scaler.min_scale_overflows(), 2);
  const auto message =
      lamp_test::error_of([&] { scripted_step(scaler, rig, kInf); });
  for (const char* part :
       {"loss scale is stuck at its minimum (min_scale=2)",
        "3 steps overflowed", "min_scale_patience=3", "amp-bf16",
        "lower the learning rate", "--max-grad-norm"}) {
    EXPECT_NE(message.find(part), std::string::npos) << part << message;
  }
  EXPECT_EQ(scaler.min_scale_overflows(), 3);
}

TEST(GradScaler, MinScaleCountResetsWhenTheScaleGrows) {
  lamp::GradScaler scaler(lamp::GradScalerOptions()
                              .init_scale(2)
                              .min_scale(2)
                              .growth_interval(2)
                              .min_scale_patience(3));
  Rig rig;
  scripted_step(scaler, rig, kInf);
  scripted_step(scaler, rig, kInf);
  EXPECT_EQ(scaler.min_scale_overflows(), 2);
  scripted_step(scaler, rig, 1.0f);
  scripted_step(scaler, rig, 1.0f); // grows to 4: the count resets
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_EQ(scaler.min_scale_overflows(), 0);
  scripted_step(scaler, rig, kInf); // 4 -> 2
  scripted_step(scaler, rig, kInf); // 1
  scripted_step(scaler, rig, kInf); // 2: still under the patience
  EXPECT_EQ(scaler.min_scale_overflows(), 2);
}

TEST(GradScaler, MinScalePatienceZeroNeverStops) {
  for (double min_scale : {0.0, 2.0}) {
    lamp::GradScaler scaler(
        lamp::GradScalerOptions().init_scale(2).min_scale(min_scale));
    EXPECT_EQ(scaler.options().min_scale_patience(), 0);
    Rig rig;
    for (int i = 0; i < 50; ++i) {
      EXPECT_FALSE(scripted_step(scaler, rig, kInf));
    }
    EXPECT_EQ(scaler.min_scale_overflows(), 0);
    EXPECT_NO_THROW(scaler.check_min_scale_patience());
  }
  EXPECT_THROW(
      lamp::GradScaler(lamp::GradScalerOptions().min_scale_patience(-1)),
      c10::Error);
}

TEST(GradScaler, SaveLoadKeepsTheMinScaleCount) {
  const auto options =
      lamp::GradScalerOptions().init_scale(2).min_scale(2).min_scale_patience(
          3);
  lamp::GradScaler original(options);
  Rig rig;
  scripted_step(original, rig, kInf);
  scripted_step(original, rig, kInf);
  ASSERT_EQ(original.min_scale_overflows(), 2);
  const auto state = original.state_dict();
  EXPECT_EQ(state.at("_min_scale_overflows").toInt(), 2);
  EXPECT_EQ(state.at("min_scale_patience").toInt(), 3);
  std::stringstream stream;
  {
    torch::serialize::OutputArchive archive;
    original.save(archive);
    archive.save_to(stream);
  }
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  // Patience from the archive, over a scaler made without it.
  lamp::GradScaler restored(lamp::GradScalerOptions().init_scale(2));
  restored.load(archive);
  EXPECT_EQ(restored.min_scale_overflows(), 2);
  EXPECT_EQ(restored.options().min_scale_patience(), 3);
  Rig r;
  EXPECT_THROW(scripted_step(restored, r, kInf), c10::Error);
}

TEST(GradScaler, LoadAcceptsPythonIntegersAndRejectsInvalidState) {
  auto archive_with = [](double scale, c10::IValue growth_factor,
                         int64_t interval) {
    torch::serialize::OutputArchive out;
    out.write("scale", c10::IValue(scale));
    out.write("growth_factor", growth_factor);
    out.write("backoff_factor", c10::IValue(0.5));
    out.write("growth_interval", c10::IValue(interval));
    out.write("_growth_tracker", c10::IValue(int64_t{3}));
    std::stringstream stream;
    out.save_to(stream);
    auto in = std::make_shared<torch::serialize::InputArchive>();
    in->load_from(stream);
    return in;
  };
  lamp::GradScaler scaler;
  // Python's GradScaler(growth_factor=2) stores an int.
  scaler.load(*archive_with(512.0, c10::IValue(int64_t{3}), 7));
  EXPECT_EQ(scaler.get_scale(), 512.0);
  EXPECT_EQ(scaler.options().growth_factor(), 3.0);
  EXPECT_EQ(scaler.growth_tracker(), 3);
  expect_error([&] { scaler.load(*archive_with(-1.0, c10::IValue(2.0), 7)); },
               "finite and positive");
  expect_error([&] { scaler.load(*archive_with(8.0, c10::IValue(0.5), 7)); },
               "growth_factor");
  expect_error([&] { scaler.load(*archive_with(8.0, c10::IValue(2.0), 0)); },
               "growth_interval");
  // Refused loads change nothing.
  EXPECT_EQ(scaler.get_scale(), 512.0);
  EXPECT_EQ(scaler.options().growth_interval(), 7);
}

// Python's set_growth_interval() lowers the interval without touching the
// tracker, so its state_dict() can hold a tracker at or past the interval:
// the load takes it as interval - 1 (as lamp's set_growth_interval clamps
// it), says so, and the next finite step grows the scale.
TEST(GradScaler, LoadClampsATrackerPastALoweredInterval) {
  // Python's state: scale 256, growth_interval 10, this tracker (and, when
  // given, lamp's _overflow_count).
  const auto python_state = [](int64_t tracker, int64_t overflow_count = -1) {
    torch::serialize::OutputArchive out;
    out.write("scale", c10::IValue(256.0));
    out.write("growth_factor", c10::IValue(2.0));
    out.write("backoff_factor", c10::IValue(0.5));
    out.write("growth_interval", c10::IValue(int64_t{10}));
    out.write("_growth_tracker", c10::IValue(tracker));
    if (overflow_count >= 0) {
      out.write("_overflow_count", c10::IValue(overflow_count));
    }
    return lamp_test::reopened(out);
  };
  lamp::GradScaler scaler;
  {
    // A load that another field refuses says nothing of the tracker.
    lamp_test::Warnings refused;
    expect_error([&] { scaler.load(*python_state(1500, 5)); },
                 "_overflow_count is 5");
    EXPECT_TRUE(refused.containing("_growth_tracker").empty());
    EXPECT_EQ(scaler.growth_tracker(), 0);
  }
  lamp_test::Warnings warnings;
  scaler.load(*python_state(1500));
  const auto said = warnings.containing("_growth_tracker is 1500");
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("at or past growth_interval=10"), std::string::npos)
      << said[0];
  EXPECT_NE(said[0].find("it is taken as 9"), std::string::npos) << said[0];
  EXPECT_EQ(scaler.growth_tracker(), 9);
  Rig rig;
  EXPECT_TRUE(scripted_step(scaler, rig, 1.0f));
  EXPECT_EQ(scaler.get_scale(), 512.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  // A tracker just below the interval loads as it is, without a word.
  lamp_test::Warnings quiet;
  scaler.load(*python_state(9));
  EXPECT_TRUE(quiet.containing("_growth_tracker").empty());
  EXPECT_EQ(scaler.growth_tracker(), 9);
}

// A state archive with Python's keys and lamp's; `changes` replaces or adds
// values.
std::shared_ptr<torch::serialize::InputArchive> state_archive(
    const std::map<std::string, c10::IValue>& changes) {
  std::map<std::string, c10::IValue> values = {
      {"scale", c10::IValue(256.0)},
      {"growth_factor", c10::IValue(2.0)},
      {"backoff_factor", c10::IValue(0.5)},
      {"growth_interval", c10::IValue(int64_t{2000})},
      {"_growth_tracker", c10::IValue(int64_t{3})},
      {"hysteresis", c10::IValue(int64_t{2})},
      {"_overflow_count", c10::IValue(int64_t{1})}};
  for (const auto& change : changes) {
    values[change.first] = change.second;
  }
  torch::serialize::OutputArchive out;
  for (const auto& value : values) {
    out.write(value.first, value.second);
  }
  return lamp_test::reopened(out);
}

// Every field is checked before any is assigned: a refused load leaves scale,
// tracker, overflow count and options as they were, whether or not the
// scaler has made its tensors yet. The tracker and the overflow count live in
// int32 tensors and must lie where update() can bring them back to zero.
TEST(GradScaler, RefusedLoadLeavesTheWholeStateAsItWas) {
  const std::vector<std::pair<std::map<std::string, c10::IValue>, std::string>>
      corrupt = {
          {{{"_growth_tracker", c10::IValue(int64_t{1} << 40)}},
           "_growth_tracker is 1099511627776, outside [0, 2^31 - 1]"},
          {{{"_growth_tracker", c10::IValue(int64_t{1} << 31)}},
           "_growth_tracker is 2147483648"},
          {{{"_growth_tracker", c10::IValue(int64_t{-1})}},
           "_growth_tracker is -1"},
          {{{"growth_interval", c10::IValue(int64_t{1} << 40)},
            {"_growth_tracker", c10::IValue(int64_t{1} << 35)}},
           "growth_interval"},
          {{{"_overflow_count", c10::IValue(int64_t{3})}},
           "_overflow_count is 3, outside [0, hysteresis=2]"},
          {{{"_overflow_count", c10::IValue(int64_t{-1})}},
           "_overflow_count is -1"},
          {{{"scale", c10::IValue(1e300)}}, "float32"},
          {{{"scale", c10::IValue(1e-50)}}, "float32"},
          {{{"scale", c10::IValue(std::nan(""))}}, "finite and positive"},
          {{{"growth_factor", c10::IValue(1.0)}}, "growth_factor"},
          {{{"backoff_factor", c10::IValue(1.5)}}, "backoff_factor"},
          {{{"hysteresis", c10::IValue(int64_t{0})}}, "hysteresis"},
          {{{"growth_factor", c10::IValue(std::string("2"))}},
           "'growth_factor' has type String in the archive where a number is expected"},
          {{{"_growth_tracker", c10::IValue(2.0)}},
           "'_growth_tracker' has type Double in the archive where an integer is expected"},
          {{{"dynamic", c10::IValue(int64_t{1})}},
           "'dynamic' has type Int in the archive where a bool is expected"},
      };
  const auto options = lamp::GradScalerOptions()
                           .init_scale(64)
                           .growth_interval(7)
                           .growth_factor(4)
                           .backoff_factor(0.25)
                           .hysteresis(3);
  for (bool initialised : {false, true}) {
    lamp::GradScaler scaler(options);
    if (initialised) {
      Rig rig;
      scripted_step(scaler, rig, 1.0f);
      scripted_step(scaler, rig, kInf); // pending: one overflow of three
    }
    const double scale = scaler.get_scale();
    const int64_t tracker = scaler.growth_tracker();
    for (const auto& item : corrupt) {
      expect_error([&] { scaler.load(*state_archive(item.first)); },
                   item.second);
      EXPECT_EQ(scaler.get_scale(), scale) << item.second;
      EXPECT_EQ(scaler.growth_tracker(), tracker) << item.second;
      EXPECT_EQ(scaler.options().growth_interval(), 7) << item.second;
      EXPECT_EQ(scaler.options().growth_factor(), 4.0) << item.second;
      EXPECT_EQ(scaler.options().backoff_factor(), 0.25) << item.second;
      EXPECT_EQ(scaler.options().hysteresis(), 3) << item.second;
    }
    if (initialised) {
      // The pending overflow survived: two more overflows back off once.
      Rig rig;
      EXPECT_FALSE(scripted_step(scaler, rig, kInf));
      EXPECT_EQ(scaler.get_scale(), 64.0);
      EXPECT_FALSE(scripted_step(scaler, rig, kInf));
      EXPECT_EQ(scaler.get_scale(), 16.0);
    }
  }
}

// A scale FP32 cannot hold is refused by load (and the constructor), not by
// the first scale() that tries to make the tensor.
TEST(GradScaler, ScaleOutsideFloat32IsRefusedWhereItIsGiven) {
  lamp::GradScaler fresh;
  expect_error(
      [&] {
        fresh.load(*state_archive({{"scale", c10::IValue(1e300)}}));
      },
      "lamp::GradScaler::load: the scale 1e+300 is not representable in float32");
  EXPECT_EQ(fresh.get_scale(), 65536.0);
  EXPECT_EQ(fresh.scale(torch::ones({})).item<float>(), 65536.0f);
  expect_error(
      [] { lamp::GradScaler(lamp::GradScalerOptions().init_scale(1e39)); },
      "lamp::GradScaler: the scale 1e+39 is not representable in float32");
}

TEST(GradScaler, DisabledScalerIsANoOp) {
  lamp::GradScaler scaler(lamp::GradScalerOptions().enabled(false));
  const auto loss = torch::tensor(3.0f);
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  EXPECT_EQ(scaler.get_scale(), 1.0);
  Rig rig;
  rig.set_grad(kInf);
  EXPECT_TRUE(scaler.step(rig.opt)); // no checks at all, as in Python
  scaler.update();
  torch::serialize::OutputArchive out;
  scaler.save(out);
  std::stringstream stream;
  out.save_to(stream);
  torch::serialize::InputArchive in;
  in.load_from(stream);
  lamp::GradScaler enabled;
  expect_error([&] { enabled.load(in); }, "disabled GradScaler");
  // Another archive (a module's) is not blamed on a disabled scaler: its
  // keys are named.
  torch::nn::Linear linear(2, 1);
  torch::serialize::OutputArchive module_out;
  linear->save(module_out);
  std::stringstream module_stream;
  module_out.save_to(module_stream);
  torch::serialize::InputArchive module_in;
  module_in.load_from(module_stream);
  expect_error([&] { enabled.load(module_in); },
               "lamp::GradScaler::load: the archive holds no GradScaler "
               "state (its 'scale', '_growth_tracker', ...); its keys are "
               "'weight', 'bias'.");
}

// Python's scaler.state_dict(): its keys and types, and lamp's keys only
// where the scaler does what Python's cannot.
TEST(GradScaler, StateDictHasPythonsKeysAndTypes) {
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(32));
  Rig rig;
  scripted_step(scaler, rig, 1.0f);
  const auto state = scaler.state_dict();
  std::vector<std::string> keys;
  for (const auto& item : state) {
    keys.push_back(item.key());
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"scale", "growth_factor",
                                            "backoff_factor", "growth_interval",
                                            "_growth_tracker"}));
  EXPECT_TRUE(state.at("scale").isDouble());
  EXPECT_EQ(state.at("scale").toDouble(), 32.0);
  EXPECT_TRUE(state.at("growth_factor").isDouble());
  EXPECT_TRUE(state.at("backoff_factor").isDouble());
  EXPECT_EQ(state.at("growth_interval").toInt(), 2000);
  EXPECT_EQ(state.at("_growth_tracker").toInt(), 1);

  for (const auto& options :
       {lamp::GradScalerOptions().hysteresis(2),
        lamp::GradScalerOptions().min_scale(1),
        lamp::GradScalerOptions().max_scale(1 << 20),
        lamp::GradScalerOptions().dynamic(false),
        lamp::GradScalerOptions().min_scale_patience(3)}) {
    // Python's 5 keys and lamp's 7.
    EXPECT_EQ(lamp::GradScaler(options).state_dict().size(), 12u);
  }
  EXPECT_EQ(lamp::GradScaler(lamp::GradScalerOptions().enabled(false))
                .state_dict()
                .size(),
            0u);

  // With hysteresis 1 an overflow backs off at once, whatever the overflow
  // count reads after it (the portable update counts it, ATen's does not):
  // a default scaler's state stays Python's after an overflowing step.
  lamp::GradScaler overflowed;
  scripted_step(overflowed, rig, kInf);
  EXPECT_EQ(overflowed.get_scale(), 32768.0);
  EXPECT_EQ(overflowed.state_dict().size(), 5u);
  EXPECT_FALSE(overflowed.state_dict().contains("min_scale"));
}

// save_state_dict()/load_state_dict(path) keep all of lamp's state, the
// pending overflow of hysteresis included, as save()/load() do.
TEST(GradScaler, StateDictFileKeepsTheWholeState) {
  const auto options = lamp::GradScalerOptions()
                           .init_scale(64)
                           .hysteresis(2)
                           .growth_interval(100)
                           .min_scale(2)
                           .max_scale(4096);
  lamp::GradScaler original(options);
  Rig rig;
  scripted_step(original, rig, 1.0f);
  scripted_step(original, rig, kInf); // 1 of 2: no backoff yet
  const auto path = ::testing::TempDir() + "lamp_scaler_state_" +
                    std::to_string(::getpid()) + ".pt";
  {
    // torch::save / torch::load, as for a module or an optimizer: the whole
    // state, lamp's own fields too.
    torch::save(original, path);
    lamp::GradScaler loaded(options);
    torch::load(loaded, path);
    EXPECT_EQ(loaded.get_scale(), original.get_scale());
    EXPECT_EQ(loaded.growth_tracker(), original.growth_tracker());
    Rig r;
    EXPECT_FALSE(scripted_step(loaded, r, kInf)); // the saved 1 of 2 + this one
    EXPECT_EQ(loaded.get_scale(), 32.0);
  }
  original.save_state_dict(path);
  for (bool initialised : {false, true}) {
    lamp::GradScaler restored;
    if (initialised) {
      restored.scale(torch::ones({}));
    }
    restored.load_state_dict(path);
    EXPECT_EQ(restored.get_scale(), 64.0);
    EXPECT_EQ(restored.growth_tracker(), 0);
    EXPECT_EQ(restored.options().growth_interval(), 100);
    EXPECT_EQ(restored.options().hysteresis(), 2);
    EXPECT_EQ(restored.options().min_scale(), 2.0);
    EXPECT_EQ(restored.options().max_scale(), 4096.0);
    Rig r;
    EXPECT_FALSE(scripted_step(restored, r, kInf));
    EXPECT_EQ(restored.get_scale(), 32.0) << "initialised " << initialised;
  }
  std::remove(path.c_str());
}

// load_state_dict runs load()'s checks: a refused state changes nothing.
TEST(GradScaler, LoadStateDictIsCheckedAndAllOrNothing) {
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(64));
  const auto with = [&](const std::string& key, const c10::IValue& value) {
    auto state = scaler.state_dict();
    state.insert_or_assign(key, value);
    return state;
  };
  const std::vector<std::pair<c10::Dict<std::string, c10::IValue>, std::string>>
      corrupt = {
          {with("_growth_tracker", int64_t{-2}),
           "lamp::GradScaler::load_state_dict: _growth_tracker is -2"},
          {with("scale", 1e300), "not representable in float32"},
          {with("growth_factor", std::string("2")),
           "'growth_factor' has type String"},
          {with("hysteresis", int64_t{0}), "hysteresis"},
          {lamp::GradScaler(lamp::GradScalerOptions().enabled(false))
               .state_dict(),
           "disabled GradScaler"},
      };
  for (const auto& item : corrupt) {
    expect_error([&] { scaler.load_state_dict(item.first); }, item.second);
    EXPECT_EQ(scaler.get_scale(), 64.0) << item.second;
    EXPECT_EQ(scaler.options().growth_factor(), 2.0) << item.second;
    EXPECT_EQ(scaler.options().hysteresis(), 1) << item.second;
  }
  // Python writes growth_factor=2 as an int when given one.
  scaler.load_state_dict(with("growth_factor", int64_t{3}));
  EXPECT_EQ(scaler.options().growth_factor(), 3.0);
}

TEST(GradScaler, LoadStateDictNamesFilesItCannotRead) {
  const auto dir =
      ::testing::TempDir() + "lamp_scaler_files_" + std::to_string(::getpid());
  lamp::GradScaler scaler;
  // A string literal picks the file overload.
  expect_error([&] { scaler.load_state_dict("/nonexistent/lamp-scaler.pt"); },
               "cannot read /nonexistent/lamp-scaler.pt");
  // An archive of save() is read by InputArchive and load() instead.
  const auto archive_path = dir + "-archive.pt";
  torch::serialize::OutputArchive archive;
  scaler.save(archive);
  archive.save_to(archive_path);
  expect_error([&] { scaler.load_state_dict(archive_path); },
               "is read with torch::serialize::InputArchive");
  const auto list_path = dir + "-list.pt";
  lamp::save_pickle(c10::List<int64_t>({1, 2}), list_path);
  expect_error([&] { scaler.load_state_dict(list_path); }, "not a dict");
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  expect_error([&] { scaler.save_state_dict(dir + "/missing/scaler.pt"); },
               "does not exist");
  std::remove(archive_path.c_str());
  std::remove(list_path.c_str());
}

TEST(GradScaler, RefusesFp16GradientsUnlessAllowed) {
  Rig rig(torch::kCPU, torch::kHalf);
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(1024));
  scaler.scale(torch::ones({}));
  rig.set_grad(1024.0f);
  expect_error([&] { scaler.unscale_(rig.opt); }, "FP16 gradients");

  lamp::GradScaler allowing(
      lamp::GradScalerOptions().init_scale(1024).allow_fp16_grads(true));
  allowing.scale(torch::ones({}));
  allowing.unscale_(rig.opt);
  EXPECT_TRUE(BitEqual(rig.w.grad(), torch::ones({3}, torch::kHalf)));
}

TEST(GradScaler, UnscalesBf16Gradients) {
  Rig rig(torch::kCPU, torch::kBFloat16);
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(1024));
  EXPECT_TRUE(scripted_step(scaler, rig, 0.5f));
  EXPECT_TRUE(
      BitEqual(rig.w.detach(), torch::full({3}, 0.5, torch::kBFloat16)));
  EXPECT_FALSE(scripted_step(scaler, rig, kInf));
  EXPECT_EQ(scaler.get_scale(), 512.0);
}

TEST(GradScaler, SeveralOptimizersShareOneUpdate) {
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(16));
  Rig a, b;
  scaler.scale(torch::ones({}));
  a.set_grad(16.0f);
  b.set_grad(kInf);
  EXPECT_TRUE(scaler.step(a.opt));
  EXPECT_FALSE(scaler.step(b.opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_TRUE(BitEqual(a.w.detach(), torch::zeros({3})));
  EXPECT_TRUE(BitEqual(b.w.detach(), torch::ones({3})));
}

// The found-inf reduction sees every unscale's flag and what it leaves
// decides: another process's overflow (a reduction that raises the flag)
// skips this one's finite step and backs the scale off; none set: as before.
TEST(GradScaler, FoundInfReductionDecidesTheStep) {
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(16));
  std::vector<float> seen;
  bool other_overflowed = true;
  scaler.set_found_inf_reduction([&](torch::Tensor& found_inf) {
    EXPECT_EQ(found_inf.numel(), 1);
    EXPECT_EQ(found_inf.scalar_type(), torch::kFloat);
    seen.push_back(found_inf.item<float>());
    if (other_overflowed) {
      found_inf.fill_(1.0);
    }
  });
  Rig rig;
  EXPECT_FALSE(scripted_step(scaler, rig, 1.0f));
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_TRUE(BitEqual(rig.w.detach(), torch::ones({3})));
  other_overflowed = false;
  EXPECT_TRUE(scripted_step(scaler, rig, 1.0f));
  EXPECT_FALSE(scripted_step(scaler, rig, kInf));
  EXPECT_EQ(seen, (std::vector<float>{0.0f, 0.0f, 1.0f}));
  scaler.set_found_inf_reduction(nullptr);
  EXPECT_TRUE(scripted_step(scaler, rig, 1.0f));
  EXPECT_EQ(seen.size(), 3u);
}

TEST(GradScaler, AccumulatesGradientsOfSeveralLosses) {
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(512));
  Rig rig;
  const auto x1 = torch::tensor({1.0f, 2.0f, 3.0f});
  const auto x2 = torch::tensor({0.5f, -1.0f, 0.25f});
  scaler.scale((rig.w * x1).sum()).backward();
  scaler.scale((rig.w * x2).sum()).backward();
  EXPECT_TRUE(scaler.step(rig.opt));
  scaler.update();
  EXPECT_TRUE(BitEqual(rig.w.detach(), 1 - (x1 + x2)));
}

TEST(GradScaler, OverflowDiagnosticsNameTheParameters) {
  auto a = torch::ones({2}).requires_grad_();
  auto b = torch::ones({2}).requires_grad_();
  torch::optim::SGD opt(std::vector<torch::Tensor>{a, b}, 0.1);
  lamp::GradScaler scaler(lamp::GradScalerOptions().diagnose_overflow(true));
  scaler.scale(torch::ones({}));
  a.mutable_grad() = torch::ones({2});
  b.mutable_grad() = torch::tensor({1.0f, kNaN});
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.last_overflow(),
            std::vector<std::string>{"param_groups[0].params[1]"});
  scaler.set_parameter_names({"fc.weight", "fc.bias"}, {a, b});
  a.mutable_grad() = torch::full({2}, kInf);
  b.mutable_grad() = torch::ones({2});
  EXPECT_FALSE(scaler.step(opt));
  EXPECT_EQ(scaler.last_overflow(), std::vector<std::string>{"fc.weight"});
}

// PyTorch's scale update, written out from ATen's kernel
// (aten/src/ATen/native/cuda/AmpKernels.cu, `amp_update_scale_cuda_kernel`,
// and its CPU twin from 2.3 on): the scale is FP32, the factors double, each
// product is computed in double and rounded once to FP32; growth is dropped
// when the grown scale is not finite.
struct ReferenceUpdate {
  float scale;
  int32_t tracker = 0;
  void operator()(bool found_inf, double growth, double backoff,
                  int32_t interval) {
    if (found_inf) {
      scale = static_cast<float>(static_cast<double>(scale) * backoff);
      tracker = 0;
      return;
    }
    const int32_t successful = tracker + 1;
    if (successful == interval) {
      const auto grown =
          static_cast<float>(static_cast<double>(scale) * growth);
      if (std::isfinite(grown)) {
        scale = grown;
      }
      tracker = 0;
    } else {
      tracker = successful;
    }
  }
};

bool has_cpu_amp_update_kernel() {
  auto scale = torch::ones({});
  auto tracker = torch::zeros({}, torch::kInt);
  try {
    at::_amp_update_scale_(scale, tracker, torch::zeros({}), 2.0, 0.5, 10);
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

// lamp's portable update against the reference rule on every LibTorch, and
// against ATen's own CPU kernel where this LibTorch has one (1.13 has it for
// CUDA only). Factors that round (1.7, 0.3) and a scale driven to the top of
// FP32's range, where growth is refused, are part of the sequences.
TEST(GradScaler, PortableUpdateEqualsPyTorchsRuleBitForBit) {
  const bool aten = has_cpu_amp_update_kernel();
  for (const float init : {1000.0f, 1e37f}) {
    torch::manual_seed(0);
    const auto infs = torch::rand({300}).lt(init > 1e30f ? 0.02 : 0.3);
    ReferenceUpdate reference{init};
    auto scale_a = torch::full({}, init), scale_b = scale_a.clone();
    auto tracker_a = torch::zeros({}, torch::kInt),
         tracker_b = tracker_a.clone();
    auto overflows = torch::zeros({}, torch::kInt);
    bool refused_growth = false;
    for (int64_t i = 0; i < infs.numel(); ++i) {
      const bool inf = infs[i].item<bool>();
      const auto found = torch::full({}, inf ? 1.0f : 0.0f);
      const float before = reference.scale;
      reference(inf, 1.7, 0.3, 3);
      refused_growth = refused_growth || (!inf && reference.tracker == 0 &&
                                          reference.scale == before);
      lamp::detail::update_scale_(scale_b, tracker_b, overflows, found, 1.7,
                                  0.3, 3, 0.0,
                                  std::numeric_limits<double>::infinity(), 1);
      ASSERT_EQ(scale_b.item<float>(), reference.scale) << "step " << i;
      ASSERT_EQ(tracker_b.item<int>(), reference.tracker) << "step " << i;
      if (aten) {
        at::_amp_update_scale_(scale_a, tracker_a, found, 1.7, 0.3, 3);
        ASSERT_TRUE(BitEqual(scale_b, scale_a)) << "step " << i;
        ASSERT_TRUE(BitEqual(tracker_b, tracker_a)) << "step " << i;
      }
    }
    EXPECT_EQ(refused_growth, init > 1e30f);
  }
  if (!aten) {
    std::cout
        << "[ note     ] no CPU _amp_update_scale_ in this LibTorch: compared with the reference rule only\n";
  }
}

// ATen's unscale, element by element: multiply in FP32 (the inverse scale is
// an FP32 number), round once to the tensor's dtype; found_inf is set when
// any element is inf or NaN.
template <typename T>
torch::Tensor reference_unscale(const torch::Tensor& t, float inv,
                                bool& found) {
  auto out = t.contiguous().clone();
  auto* data = out.data_ptr<T>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    const float v = static_cast<float>(data[i]);
    found = found || !std::isfinite(v);
    data[i] = static_cast<T>(v * inv);
  }
  return out;
}

torch::Tensor reference_unscale(const torch::Tensor& t, float inv,
                                bool& found) {
  switch (t.scalar_type()) {
    case torch::kHalf:
      return reference_unscale<c10::Half>(t, inv, found);
    case torch::kBFloat16:
      return reference_unscale<c10::BFloat16>(t, inv, found);
    default:
      return reference_unscale<float>(t, inv, found);
  }
}

// lamp's portable unscale against the reference rule on every LibTorch, and
// against ATen's CPU kernel where this LibTorch has one.
TEST(GradScaler, PortableUnscaleEqualsPyTorchsRuleBitForBit) {
  bool aten = true;
  for (auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    torch::manual_seed(1);
    // Values that round differently in FP16/BF16 after the multiply, an inf,
    // and an inverse scale that is not a power of two.
    std::vector<torch::Tensor> a = {torch::randn({64}).mul(3000).to(dtype),
                                    torch::randn({7, 5}).to(dtype)};
    a[1][2][3] = kInf;
    std::vector<torch::Tensor> b = {a[0].clone(), a[1].clone()};
    const float inv_value = 1.0f / 3000.0f;
    const auto inv = torch::full({}, inv_value);
    bool found_reference = false;
    const auto expected0 = reference_unscale(a[0], inv_value, found_reference);
    const auto expected1 = reference_unscale(a[1], inv_value, found_reference);
    auto found_b = torch::zeros({});
    lamp::detail::non_finite_check_and_unscale_(b, found_b, inv);
    EXPECT_TRUE(found_reference);
    EXPECT_EQ(found_b.item<float>(), 1.0f) << dtype;
    EXPECT_TRUE(BitEqual(b[0], expected0)) << dtype;
    EXPECT_TRUE(BitEqual(b[1], expected1)) << dtype;
    EXPECT_FALSE(BitEqual(b[0], a[0])) << dtype; // it did change them

    auto found_a = torch::zeros({});
    try {
      at::_amp_foreach_non_finite_check_and_unscale_(a, found_a, inv);
    } catch (const c10::Error&) {
      aten = false;
      continue;
    }
    EXPECT_TRUE(BitEqual(found_b, found_a)) << dtype;
    EXPECT_TRUE(BitEqual(b[0], a[0])) << dtype;
    EXPECT_TRUE(BitEqual(b[1], a[1])) << dtype;
  }
  if (!aten) {
    std::cout
        << "[ note     ] no CPU _amp_foreach_non_finite_check_and_unscale_ in this LibTorch: compared with the reference rule only\n";
  }
}

TEST(GradScaler, PortableUnscaleFindsNonFiniteValues) {
  std::vector<torch::Tensor> grads = {
      torch::tensor({2.0f, 4.0f}),
      torch::tensor({8.0f, kNaN}, torch::kFloat).to(torch::kBFloat16)};
  auto found = torch::zeros({});
  lamp::detail::non_finite_check_and_unscale_(grads, found,
                                              torch::full({}, 0.5f));
  EXPECT_EQ(found.item<float>(), 1.0f);
  EXPECT_TRUE(BitEqual(grads[0], torch::tensor({1.0f, 2.0f})));
  EXPECT_EQ(grads[1][0].item<float>(), 4.0f);
  // One-element state tensors of any shape, as ATen's contract allows.
  std::vector<torch::Tensor> finite = {torch::tensor(2.0f)};
  auto none = torch::zeros({1});
  lamp::detail::non_finite_check_and_unscale_(finite, none,
                                              torch::full({1}, 0.5f));
  EXPECT_EQ(none.item<float>(), 0.0f);
  EXPECT_EQ(finite[0].item<float>(), 1.0f);
}

TEST(GradScaler, FollowsTheSameSequenceOnGpu_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    lamp::GradScaler scaler(
        lamp::GradScalerOptions().init_scale(8).growth_interval(3));
    Rig rig(torch::kCUDA, dtype);
    const std::string pattern = "FFFFIFFFIIFFF";
    const std::vector<double> scales = {8,  8, 16, 16, 8, 8, 8,
                                        16, 8, 4,  4,  4, 8};
    for (size_t i = 0; i < pattern.size(); ++i) {
      const bool finite = pattern[i] == 'F';
      EXPECT_EQ(scripted_step(scaler, rig, finite ? 1.0f : kInf), finite);
      EXPECT_EQ(scaler.get_scale(), scales[i]) << dtype << " step " << i;
    }
    EXPECT_TRUE(scaler.scale_tensor().is_cuda());
  }
}

TEST(GradScaler, BoundsAndHysteresisOnGpu_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  lamp::GradScaler scaler(
      lamp::GradScalerOptions().init_scale(64).hysteresis(3).growth_interval(
          100));
  Rig rig(torch::kCUDA);
  const std::vector<double> scales = {64, 64, 32, 16, 16, 16, 16, 8};
  const std::string pattern = "IIIIFIII";
  for (size_t i = 0; i < pattern.size(); ++i) {
    scripted_step(scaler, rig, pattern[i] == 'F' ? 1.0f : kInf);
    EXPECT_EQ(scaler.get_scale(), scales[i]) << "step " << i;
  }
}

} // namespace

namespace {

// An optimizer whose step() runs `inside` first: it holds a scaler inside
// step() for as long as the test needs.
struct HeldSGD : torch::optim::SGD {
  using torch::optim::SGD::SGD;
  std::function<void()> inside;
  torch::Tensor step(LossClosure closure = nullptr) override {
    inside();
    return torch::optim::SGD::step(closure);
  }
};

// A scaler used by two threads at once: update() from a second thread while
// step() runs is refused, deterministically (step() is held until the second
// call returned).
TEST(GradScaler, RefusesUpdateFromASecondThreadDuringStep) {
  auto param = torch::ones({2}, torch::requires_grad());
  HeldSGD optimizer(std::vector<torch::Tensor>{param},
                    torch::optim::SGDOptions(0.1));
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(2.0));
  scaler.scale(param.sum()).backward();
  std::promise<void> inside;
  std::promise<void> released;
  auto release = released.get_future().share();
  optimizer.inside = [&] {
    inside.set_value();
    release.wait();
  };
  std::thread first([&] { EXPECT_TRUE(scaler.step(optimizer)); });
  inside.get_future().wait();
  std::string error;
  std::thread second([&] {
    error = lamp_test::error_of([&] { scaler.update(); });
    released.set_value();
  });
  second.join();
  first.join();
  EXPECT_NE(
      error.find("lamp::GradScaler::update called from two threads at once"),
      std::string::npos)
      << error;
  scaler.update(); // after step() returned, from any thread
  EXPECT_EQ(scaler.steps_taken(), 1);
}

} // namespace
