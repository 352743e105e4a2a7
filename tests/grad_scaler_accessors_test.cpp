// GradScaler's accessors under Python's names: the getters and setters of
// torch.amp.GradScaler, their checks, and the list of Python's public names
// against lamp's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lamp/amp/grad_scaler.h"
#include "test_util.h"

namespace {

using lamp_test::expect_error;

// The public names of Python's scaler, from
// `[n for n in dir(torch.amp.GradScaler) if not n.startswith("_")]`
// with torch 2.15.0 (the PyPI wheel, 2026-11-25).
const std::set<std::string> kPythonNames = {
    "get_backoff_factor",
    "get_growth_factor",
    "get_growth_interval",
    "get_scale",
    "is_enabled",
    "load_state_dict",
    "scale",
    "set_backoff_factor",
    "set_growth_factor",
    "set_growth_interval",
    "state_dict",
    "step",
    "unscale_",
    "update",
};

// Each of lamp's members under a Python name, used once: the table compiles
// only while lamp has them all.
using Use = std::function<void(lamp::GradScaler&, torch::optim::Optimizer&)>;
const std::vector<std::pair<std::string, Use>>& lamp_names() {
  static const std::vector<std::pair<std::string, Use>> names = {
      {"get_backoff_factor", [](auto& s, auto&) { s.get_backoff_factor(); }},
      {"get_growth_factor", [](auto& s, auto&) { s.get_growth_factor(); }},
      {"get_growth_interval", [](auto& s, auto&) { s.get_growth_interval(); }},
      {"get_scale", [](auto& s, auto&) { s.get_scale(); }},
      {"is_enabled", [](auto& s, auto&) { s.is_enabled(); }},
      {"load_state_dict",
       [](auto& s, auto&) { s.load_state_dict(s.state_dict()); }},
      {"scale", [](auto& s, auto&) { s.scale(torch::ones({})); }},
      {"set_backoff_factor", [](auto& s, auto&) { s.set_backoff_factor(0.5); }},
      {"set_growth_factor", [](auto& s, auto&) { s.set_growth_factor(2.0); }},
      {"set_growth_interval",
       [](auto& s, auto&) { s.set_growth_interval(2000); }},
      {"state_dict", [](auto& s, auto&) { s.state_dict(); }},
      {"step", [](auto& s, auto& o) { s.step(o); }},
      {"unscale_", [](auto& s, auto& o) { s.unscale_(o); }},
      {"update", [](auto& s, auto&) { s.update(); }},
  };
  return names;
}

TEST(GradScalerAccessors, HasEveryPublicNameOfPythons) {
  std::set<std::string> lamp;
  for (const auto& item : lamp_names()) {
    lamp.insert(item.first);
  }
  EXPECT_EQ(lamp, kPythonNames);
  // And each of them runs: one Python iteration, in the table's order of
  // use (scale, unscale_, step, update, then the accessors).
  auto w = torch::ones({2}, torch::requires_grad());
  torch::optim::SGD sgd(std::vector<torch::Tensor>{w},
                        torch::optim::SGDOptions(0.1));
  lamp::GradScaler scaler;
  const auto use = [&](const std::string& name) {
    for (const auto& item : lamp_names()) {
      if (item.first == name) {
        item.second(scaler, sgd);
      }
    }
  };
  use("scale");
  w.mutable_grad() = torch::ones({2});
  for (const auto* name :
       {"unscale_", "step", "update", "get_scale", "is_enabled",
        "get_growth_factor", "set_growth_factor", "get_backoff_factor",
        "set_backoff_factor", "get_growth_interval", "set_growth_interval",
        "state_dict", "load_state_dict"}) {
    SCOPED_TRACE(name);
    use(name);
  }
}

// A scaler whose scale is on the CPU, and one scripted iteration with a
// gradient of ones (finite) or of inf, scaled as backward would.
struct AccessorRig {
  torch::Tensor w = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD opt{std::vector<torch::Tensor>{w},
                        torch::optim::SGDOptions(0.0)};
  void iterate(lamp::GradScaler& scaler, bool finite) {
    const auto scale = scaler.scale(torch::ones({}));
    w.mutable_grad() =
        torch::full({3}, finite ? scale.item<float>()
                                : std::numeric_limits<float>::infinity());
    scaler.step(opt);
    scaler.update();
  }
};

// Python's defaults first (GradScaler.DefaultsArePythons checks the options).
TEST(GradScalerAccessors, GettersReturnTheOptions) {
  for (const auto& o : {lamp::GradScalerOptions(), lamp::GradScalerOptions()
                                                       .init_scale(4.0)
                                                       .growth_factor(3.0)
                                                       .backoff_factor(0.25)
                                                       .growth_interval(7)}) {
    lamp::GradScaler scaler(o);
    EXPECT_EQ(scaler.get_growth_factor(), o.growth_factor());
    EXPECT_EQ(scaler.get_backoff_factor(), o.backoff_factor());
    EXPECT_EQ(scaler.get_growth_interval(), o.growth_interval());
    EXPECT_EQ(scaler.get_scale(), o.init_scale());
    EXPECT_TRUE(scaler.is_enabled());
  }
  EXPECT_FALSE(
      lamp::GradScaler(lamp::GradScalerOptions().enabled(false)).is_enabled());
}

TEST(GradScalerAccessors, SetGrowthFactorGrowsByTheNewFactor) {
  lamp::GradScaler scaler(
      lamp::GradScalerOptions().init_scale(8).growth_interval(1));
  AccessorRig rig;
  rig.iterate(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 16.0);
  scaler.set_growth_factor(4.0);
  EXPECT_EQ(scaler.get_growth_factor(), 4.0);
  EXPECT_EQ(scaler.options().growth_factor(), 4.0);
  rig.iterate(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 64.0);
}

TEST(GradScalerAccessors, SetBackoffFactorBacksOffByTheNewFactor) {
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(1024));
  AccessorRig rig;
  scaler.set_backoff_factor(0.125);
  EXPECT_EQ(scaler.get_backoff_factor(), 0.125);
  rig.iterate(scaler, false);
  EXPECT_EQ(scaler.get_scale(), 128.0);
}

TEST(GradScalerAccessors, SetGrowthIntervalCountsToTheNewInterval) {
  lamp::GradScaler scaler(
      lamp::GradScalerOptions().init_scale(8).growth_interval(10));
  AccessorRig rig;
  for (int i = 0; i < 5; ++i) {
    rig.iterate(scaler, true);
  }
  EXPECT_EQ(scaler.growth_tracker(), 5);
  // Longer: the count goes on to the new interval.
  scaler.set_growth_interval(7);
  EXPECT_EQ(scaler.get_growth_interval(), 7);
  EXPECT_EQ(scaler.growth_tracker(), 5);
  rig.iterate(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 8.0);
  rig.iterate(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 16.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  // Shorter than the count so far (4): the next finite step grows, where
  // Python's tracker would count past the interval and never grow again.
  for (int i = 0; i < 4; ++i) {
    rig.iterate(scaler, true);
  }
  scaler.set_growth_interval(2);
  EXPECT_EQ(scaler.growth_tracker(), 1);
  rig.iterate(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 32.0);
  // Before the first scale() too.
  lamp::GradScaler fresh(lamp::GradScalerOptions().growth_interval(3));
  fresh.set_growth_interval(1);
  EXPECT_EQ(fresh.growth_tracker(), 0);
}

TEST(GradScalerAccessors, SettersRefuseWhatTheOptionsRefuseAndKeepTheValue) {
  lamp::GradScaler scaler;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {1.0, 0.5, -2.0, inf, nan}) {
    SCOPED_TRACE(bad);
    expect_error(
        [&] { scaler.set_growth_factor(bad); },
        "lamp::GradScaler::set_growth_factor: growth_factor must be finite and > 1.0");
  }
  EXPECT_EQ(scaler.get_growth_factor(), 2.0);
  for (double bad : {0.0, 1.0, -0.5, 1.5, nan}) {
    SCOPED_TRACE(bad);
    expect_error(
        [&] { scaler.set_backoff_factor(bad); },
        "lamp::GradScaler::set_backoff_factor: backoff_factor must be in (0, 1)");
  }
  EXPECT_EQ(scaler.get_backoff_factor(), 0.5);
  for (int64_t bad : {int64_t{0}, int64_t{-1}, int64_t{1} << 31}) {
    SCOPED_TRACE(bad);
    expect_error(
        [&] { scaler.set_growth_interval(bad); },
        "lamp::GradScaler::set_growth_interval: growth_interval must be in [1, 2147483647]");
  }
  EXPECT_EQ(scaler.get_growth_interval(), 2000);
}

// Python's state_dict carries the set values; load_state_dict brings them
// back (Python's semantics: the factors and the interval are state, not
// only options).
TEST(GradScalerAccessors, StateDictCarriesTheSetValues) {
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(16));
  AccessorRig rig;
  rig.iterate(scaler, true);
  scaler.set_growth_factor(3.0);
  scaler.set_backoff_factor(0.25);
  scaler.set_growth_interval(9);
  const auto state = scaler.state_dict();
  EXPECT_EQ(state.at("growth_factor").toDouble(), 3.0);
  EXPECT_EQ(state.at("backoff_factor").toDouble(), 0.25);
  EXPECT_EQ(state.at("growth_interval").toInt(), 9);
  lamp::GradScaler other;
  other.load_state_dict(state);
  EXPECT_EQ(other.get_growth_factor(), 3.0);
  EXPECT_EQ(other.get_backoff_factor(), 0.25);
  EXPECT_EQ(other.get_growth_interval(), 9);
  EXPECT_EQ(other.get_scale(), 16.0);
  EXPECT_EQ(other.growth_tracker(), 1);
}

} // namespace
