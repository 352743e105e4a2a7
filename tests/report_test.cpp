#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lamp/amp/autocast.h"
#include "lamp/amp/half.h"
#include "lamp/amp/report.h"
#include "lamp/models/flops.h"
#include "lamp/models/resnet.h"

namespace {

// The anchors of the project's reference table (CIFAR shape, 10 classes):
// ResNet18 1.111, ResNet34 2.319, ResNet50 2.596 forward GFLOP per image,
// i.e. 0.167 / 0.348 / 0.389 training PFLOP per 50,000-image epoch.
TEST(Flops, MatchThePublishedCifarResNetCounts) {
  EXPECT_NEAR(lamp::models::forward_flops("resnet18") / 1e9, 1.111, 0.0005);
  EXPECT_NEAR(lamp::models::forward_flops("resnet34") / 1e9, 2.319, 0.0005);
  EXPECT_NEAR(lamp::models::forward_flops("resnet50") / 1e9, 2.596, 0.0005);
  EXPECT_NEAR(lamp::models::training_flops("resnet18") * 50000 / 1e15, 0.167,
              0.0005);
  EXPECT_NEAR(lamp::models::training_flops("resnet50") * 50000 / 1e15, 0.389,
              0.0005);
}

// The MNIST CNN by hand: conv1 2*1*16*25*28*28 + conv2 2*16*32*25*14*14 +
// linear 2*1568*10.
TEST(Flops, CountTheMnistCnnLayerByLayer) {
  EXPECT_EQ(
      lamp::models::forward_flops("cnn", 1, 28, 28),
      2 * 1 * 16 * 25 * 28 * 28 + 2 * 16 * 32 * 25 * 14 * 14 + 2 * 1568 * 10);
  EXPECT_THROW(lamp::models::forward_flops("vgg16"), c10::Error);
}

TEST(PrecisionReport, ShowsBatchNormKeptFp32AndConvsInLowPrecision) {
  auto model = lamp::models::resnet18();
  lamp::network_to_half(model, torch::kBFloat16);
  const auto report = lamp::precision_report(*model);
  int batchnorm = 0, weights = 0;
  for (const auto& row : report.tensors) {
    const bool in_bn = row.module.find("BatchNorm") != std::string::npos;
    if (row.name.find("num_batches_tracked") != std::string::npos) {
      EXPECT_EQ(row.dtype, torch::kLong) << row.name;
      EXPECT_FALSE(row.kept_fp32);
    } else if (in_bn) {
      EXPECT_EQ(row.dtype, torch::kFloat) << row.name;
      EXPECT_TRUE(row.kept_fp32) << row.name;
      ++batchnorm;
    } else {
      EXPECT_EQ(row.dtype, torch::kBFloat16) << row.name; // conv and linear
      ++weights;
    }
  }
  EXPECT_EQ(batchnorm, 20 * 4); // 20 BatchNorms: weight, bias, mean, var
  EXPECT_EQ(weights, 21 + 1);   // 20 convs + linear weight + linear bias
  EXPECT_EQ(report.kept_fp32_tensors, 80);
  EXPECT_EQ(report.low_precision_tensors, 22);
  int64_t floating = 0;
  for (const auto& t : model->parameters())
    floating += t.numel();
  for (const auto& t : model->buffers())
    floating += t.is_floating_point() ? t.numel() : 0;
  EXPECT_EQ(
      report.numel_by_dtype.at("BFloat16") + report.numel_by_dtype.at("Float"),
      floating);
  EXPECT_EQ(report.numel_by_dtype.at("Long"), 20); // num_batches_tracked
  const auto text = report.to_string();
  EXPECT_NE(text.find("(kept FP32: a norm)"), std::string::npos);
  for (const auto& row : report.tensors) {
    EXPECT_EQ(row.kept_fp32_reason, row.kept_fp32 ? "a norm" : "") << row.name;
  }
  EXPECT_NE(text.find("22 low-precision tensors, 80 kept in FP32"),
            std::string::npos);
}

TEST(PrecisionReport, FullFp32ModelHasNothingKept) {
  auto model = lamp::models::resnet18();
  const auto report = lamp::precision_report(*model);
  EXPECT_EQ(report.kept_fp32_tensors, 0);
  EXPECT_EQ(report.low_precision_tensors, 0);
  // Every parameter and buffer has a row, in FP32 (num_batches_tracked in
  // int64), none of them "kept": nothing was converted around them.
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters())
    names.push_back(item.key());
  for (const auto& item : model->named_buffers())
    names.push_back(item.key());
  ASSERT_EQ(report.tensors.size(), names.size());
  ASSERT_EQ(names.size(), 62u + 60u); // 20 convs, 20 BN x 2, fc x 2; 20 BN x 3
  int64_t parameters = 0;
  for (const auto& row : report.tensors) {
    EXPECT_NE(std::find(names.begin(), names.end(), row.name), names.end())
        << row.name;
    const bool counter =
        row.name.find("num_batches_tracked") != std::string::npos;
    EXPECT_EQ(row.dtype, counter ? torch::kLong : torch::kFloat) << row.name;
    EXPECT_EQ(row.is_buffer,
              counter || row.name.find("running_") != std::string::npos)
        << row.name;
    EXPECT_FALSE(row.kept_fp32) << row.name;
    EXPECT_GT(row.numel, 0) << row.name;
    parameters += row.is_buffer ? 0 : row.numel;
  }
  EXPECT_EQ(parameters, 11173962); // the CIFAR ResNet18's published count
  EXPECT_EQ(report.numel_by_dtype.count("BFloat16"), 0u);
  EXPECT_EQ(report.numel_by_dtype.count("Half"), 0u);
}

// One training step of a small conv net: in amp-bf16 its convolutions (forward
// and backward) run in BF16; in fp32 in Float.
TEST(OpPrecisionReport, CountsBf16ConvolutionsUnderCpuAutocast) {
  torch::nn::Sequential net(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)),
      torch::nn::BatchNorm2d(4), torch::nn::ReLU(), torch::nn::Flatten(),
      torch::nn::Linear(4 * 6 * 6, 2));
  const auto x = torch::randn({2, 3, 8, 8});
  const auto step = [&](bool amp) {
    torch::Tensor loss;
    {
      c10::optional<lamp::Autocast> autocast;
      if (amp)
        autocast.emplace(torch::kCPU);
      loss = net->forward(x).to(torch::kFloat).sum();
    }
    loss.backward();
  };
  const auto amp = lamp::op_precision_report([&] { step(true); });
  EXPECT_EQ(amp.count("aten::convolution", torch::kBFloat16), 1)
      << amp.to_string();
  EXPECT_EQ(amp.count("aten::convolution", torch::kFloat), 0)
      << amp.to_string();
  // The linear's addmm computes in BF16; autocast's FP32 entry call into it
  // is not counted as a second, FP32 matmul.
  EXPECT_EQ(amp.count("aten::addmm", torch::kBFloat16), 1) << amp.to_string();
  EXPECT_EQ(amp.count("aten::addmm", torch::kFloat), 0) << amp.to_string();
  EXPECT_EQ(amp.count("aten::convolution_backward", torch::kBFloat16), 1)
      << amp.to_string();
  const auto fp32 = lamp::op_precision_report([&] { step(false); });
  EXPECT_EQ(fp32.count("aten::convolution", torch::kFloat), 1)
      << fp32.to_string();
  EXPECT_EQ(fp32.total(torch::kBFloat16), 0) << fp32.to_string();
  // The observer is gone afterwards.
  const auto nothing = lamp::op_precision_report([] {});
  EXPECT_TRUE(nothing.calls.empty());
}

// backward() called inside the autocast guard: autocast is on for the
// backward ops too. Those it passes through (convolution_backward) are
// counted, once, in the dtype they compute in; those it casts for (the
// linear's matmuls) still once, after the cast.
TEST(OpPrecisionReport, CountsBackwardOpsRunInsideTheAutocastGuard) {
  torch::manual_seed(0);
  torch::nn::Sequential net(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)), torch::nn::ReLU(),
      torch::nn::Flatten(), torch::nn::Linear(4 * 6 * 6, 2));
  const auto x = torch::randn({2, 3, 8, 8});
  const auto ops = lamp::op_precision_report([&] {
    lamp::Autocast autocast(torch::kCPU);
    net->forward(x).to(torch::kFloat).sum().backward();
  });
  EXPECT_EQ(ops.count("aten::convolution", torch::kBFloat16), 1)
      << ops.to_string();
  EXPECT_EQ(ops.count("aten::convolution_backward", torch::kBFloat16), 1)
      << ops.to_string();
  EXPECT_EQ(ops.count("aten::addmm", torch::kBFloat16), 1) << ops.to_string();
  EXPECT_EQ(ops.total(torch::kFloat), 0) << ops.to_string();
}

} // namespace
