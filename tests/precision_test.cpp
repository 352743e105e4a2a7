#include <gtest/gtest.h>

#include "lamp/precision.h"

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
    lamp::parse_precision("fp8");
    FAIL();
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'fp8'"), std::string::npos);
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

} // namespace
