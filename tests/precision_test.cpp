#include <gtest/gtest.h>

#include <iterator>

#include "lamp/amp/precision.h"

namespace {

using lamp::Precision;

TEST(Precision, ParsesEveryNameAndRoundTrips) {
  for (const auto& name : lamp::precision_names()) {
    EXPECT_EQ(lamp::to_string(lamp::parse_precision(name)), name);
  }
  EXPECT_EQ(lamp::parse_precision("fp16"), Precision::kHalf);
  EXPECT_EQ(lamp::parse_precision("amp-bf16"), Precision::kAMPBF16);
}

TEST(Precision, UnknownNameListsTheValidOnes) {
  try {
    lamp::parse_precision("fp4");
    FAIL();
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'fp4'"), std::string::npos);
    EXPECT_NE(what.find("amp-bf16"), std::string::npos);
  }
}

TEST(Precision, ModesHaveTheDocumentedIngredients) {
  EXPECT_EQ(*lamp::autocast_dtype(Precision::kAMP), torch::kHalf);
  EXPECT_EQ(*lamp::autocast_dtype(Precision::kAMPBF16), torch::kBFloat16);
  EXPECT_FALSE(lamp::autocast_dtype(Precision::kHalf).has_value());
  EXPECT_EQ(*lamp::model_dtype(Precision::kHalf), torch::kHalf);
  EXPECT_EQ(*lamp::model_dtype(Precision::kBF16), torch::kBFloat16);
  EXPECT_FALSE(lamp::model_dtype(Precision::kTF32).has_value());
  EXPECT_TRUE(lamp::uses_loss_scaling(Precision::kAMP));
  EXPECT_TRUE(lamp::uses_loss_scaling(Precision::kHalf));
  EXPECT_FALSE(lamp::uses_loss_scaling(Precision::kBF16));
  EXPECT_FALSE(lamp::uses_loss_scaling(Precision::kAMPBF16));
  EXPECT_TRUE(lamp::uses_master_weights(Precision::kBF16));
  EXPECT_FALSE(lamp::uses_master_weights(Precision::kAMP));
  EXPECT_FALSE(lamp::uses_fp16(Precision::kFP32));
}

// The policy, mode by mode, in full: what TrainStep, the trainer and the
// programs read.
TEST(Precision, PolicyOfEachMode) {
  struct Row {
    Precision precision;
    c10::optional<torch::Dtype> autocast, model;
    bool master, scaling, fp16;
    c10::optional<bool> tf32;
    bool float8 = false;
  };
  const auto none = c10::optional<torch::Dtype>();
  const Row rows[] = {
      {Precision::kFP32, none, none, false, false, false, false},
      {Precision::kTF32, none, none, false, false, false, true},
      {Precision::kAMP, torch::kHalf, none, false, true, true, c10::nullopt},
      {Precision::kAMPBF16, torch::kBFloat16, none, false, false, false,
       c10::nullopt},
      {Precision::kHalf, none, torch::kHalf, true, true, true, c10::nullopt},
      {Precision::kBF16, none, torch::kBFloat16, true, false, false,
       c10::nullopt},
      // amp-bf16 around FP8 products.
      {Precision::kFP8, torch::kBFloat16, none, false, false, false,
       c10::nullopt, true},
  };
  ASSERT_EQ(std::size(rows), lamp::concrete_precisions().size());
  for (const auto& row : rows) {
    SCOPED_TRACE(lamp::to_string(row.precision));
    const auto policy = lamp::precision_policy(row.precision);
    EXPECT_EQ(policy.precision, row.precision);
    EXPECT_EQ(policy.autocast_dtype, row.autocast);
    EXPECT_EQ(policy.model_dtype, row.model);
    EXPECT_EQ(policy.master_weights, row.master);
    EXPECT_EQ(policy.loss_scaling, row.scaling);
    EXPECT_EQ(policy.fp16_math, row.fp16);
    EXPECT_EQ(policy.tf32, row.tf32);
    EXPECT_EQ(policy.float8, row.float8);
  }
}

// "auto" is a choice, not a mode: it has a policy only once resolved for a
// device, and the error says how.
TEST(Precision, AutoHasNoPolicyUntilResolved) {
  EXPECT_EQ(lamp::parse_precision("auto"), Precision::kAuto);
  EXPECT_EQ(lamp::precision_names().back(), "auto");
  for (const auto mode : lamp::concrete_precisions()) {
    EXPECT_NE(mode, Precision::kAuto);
  }
  try {
    lamp::precision_policy(Precision::kAuto);
    FAIL() << "a policy for 'auto'";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("resolve_precision"),
              std::string::npos)
        << e.what();
  }
}

} // namespace
