// The programs' normalisation statistics (examples/common/classifier_program.h,
// channel_stats()): what train_mnist measures and its checkpoints store.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "../test_util.h"
#include "common/classifier_program.h"

namespace {

using lamp_test::error_of;

// Each channel's mean and unbiased standard deviation of pixels in [0, 1],
// as torch computes them over an FP64 copy: the histogram's values agree to
// 1e-13 (FP64 sums of 10^5 terms in another order; a wrong divisor, a
// biased estimate or another channel's pixels are 1e-5 and more apart).
TEST(ChannelStats, AreTheImagesMeanAndStd) {
  torch::manual_seed(3);
  const auto images =
      torch::randint(0, 256, {40, 3, 30, 30}, torch::kLong).to(torch::kByte);
  const auto [mean, std] = lamp_examples::channel_stats(images, "images");
  ASSERT_EQ(mean.size(), 3u);
  ASSERT_EQ(std.size(), 3u);
  for (int64_t c = 0; c < 3; ++c) {
    const auto x = images.select(1, c).to(torch::kDouble) / 255.0;
    EXPECT_NEAR(mean[c], x.mean().item<double>(), 1e-13) << c;
    EXPECT_NEAR(std[c], x.std().item<double>(), 1e-13) << c;
  }
  // Channels with other contents give other values (each channel's own).
  EXPECT_NE(mean[0], mean[1]);
}

// The same images give the same bits whatever the thread count: a
// checkpoint stores them, and a resume elsewhere and the ranks of a run
// compare them.
TEST(ChannelStats, TheSameBitsOnAnyNumberOfThreads) {
  torch::manual_seed(4);
  const auto images =
      torch::randint(0, 256, {200, 1, 28, 28}, torch::kLong).to(torch::kByte);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = lamp_examples::channel_stats(images, "images");
  at::set_num_threads(4);
  const auto four = lamp_examples::channel_stats(images, "images");
  at::set_num_threads(threads);
  EXPECT_EQ(one.first, four.first);
  EXPECT_EQ(one.second, four.second);
}

TEST(ChannelStats, RefusesBlankImagesAndOtherTensors) {
  EXPECT_NE(error_of([] {
              lamp_examples::channel_stats(
                  torch::full({4, 1, 2, 2}, 7, torch::kByte), "the images");
            })
                .find("the images have zero variance in channel 0 (every "
                      "pixel is 7"),
            std::string::npos);
  EXPECT_NE(
      error_of([] {
        lamp_examples::channel_stats(torch::zeros({4, 1, 2, 2}), "the images");
      }).find("the images must be uint8 [N, C, H, W], got Float"),
      std::string::npos);
}

} // namespace
