#pragma once

// Comparisons in units of a 16-bit type's precision, for the GPU tests of
// the fused kernels against their references.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace lamp_test {

/// The spacing of `dtype`'s values just above 1: 2^-10 (FP16), 2^-7
/// (BF16), 2^-23 (FP32).
inline double ulp_of_one(torch::ScalarType dtype) {
  return dtype == torch::kHalf       ? std::ldexp(1.0, -10)
         : dtype == torch::kBFloat16 ? std::ldexp(1.0, -7)
                                     : std::ldexp(1.0, -23);
}

/// |actual - expected| <= ulps of `dtype` at the largest |expected| (at
/// least 1), everywhere.
inline ::testing::AssertionResult WithinUlps(const torch::Tensor& actual,
                                             const torch::Tensor& expected,
                                             torch::ScalarType dtype,
                                             double ulps) {
  const double eps = ulp_of_one(dtype);
  const auto a = actual.to(torch::kFloat).cpu();
  const auto e = expected.to(torch::kFloat).cpu();
  const double scale = std::max(1.0, e.abs().max().item<double>());
  const double worst = (a - e).abs().max().item<double>();
  if (worst <= ulps * eps * scale) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "largest difference " << worst << " > " << ulps << " ulps of "
         << dtype << " at magnitude " << scale;
}

} // namespace lamp_test
