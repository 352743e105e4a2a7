#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "autograd_nodes.h"
#include "lamp/amp/train_step.h"
#include "lamp/models/registry.h"
#include "lamp/models/resnet.h"
#include "lamp/ops/batch_norm_relu.h"
#include "lamp/optim/optimizer.h"
#include "lamp/platform/backends.h"
#include "test_util.h"
#include "ulps.h"

namespace {

using lamp_test::BitEqual;

// What one forward and backward of relu(bn(x) [+ z]) leaves behind.
struct Outcome {
  torch::Tensor output, grad_input, grad_residual, grad_weight, grad_bias;
  torch::Tensor running_mean, running_var, num_batches_tracked;
};

torch::nn::BatchNorm2d make_bn(int64_t channels, c10::optional<double> momentum,
                               const torch::Device& device) {
  torch::nn::BatchNorm2d bn(
      torch::nn::BatchNorm2dOptions(channels).momentum(momentum).eps(1e-4));
  torch::NoGradGuard no_grad;
  // Not the defaults (1 and 0): a wrong parameter routing shows.
  bn->weight.uniform_(0.5, 1.5);
  bn->bias.uniform_(-0.5, 0.5);
  bn->running_mean.uniform_(-0.1, 0.1);
  bn->running_var.uniform_(0.9, 1.1);
  bn->to(device);
  return bn;
}

torch::nn::BatchNorm2d copy_bn(const torch::nn::BatchNorm2d& bn) {
  return torch::nn::BatchNorm2d(
      std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(bn->clone()));
}

// `steps` forward/backward passes through `op` (which sees a leaf input, a
// leaf residual or none, and the BatchNorm); the last one's results.
Outcome run(const std::function<torch::Tensor(const torch::Tensor&,
                                              const torch::Tensor&,
                                              torch::nn::BatchNorm2d&)>& op,
            torch::nn::BatchNorm2d bn, const torch::Tensor& x,
            const torch::Tensor& z, const torch::Tensor& grad, int steps = 1) {
  Outcome o;
  for (int i = 0; i < steps; ++i) {
    bn->zero_grad();
    auto input = x.detach().clone().requires_grad_();
    auto residual =
        z.defined() ? z.detach().clone().requires_grad_() : torch::Tensor();
    o.output = op(input, residual, bn);
    o.output.backward(grad);
    o.grad_input = input.grad();
    o.grad_residual = residual.defined() ? residual.grad() : torch::Tensor();
  }
  o.grad_weight = bn->weight.grad().clone();
  o.grad_bias = bn->bias.grad().clone();
  o.running_mean = bn->running_mean.clone();
  o.running_var = bn->running_var.clone();
  o.num_batches_tracked = bn->num_batches_tracked.clone();
  return o;
}

torch::Tensor stock(const torch::Tensor& x, const torch::Tensor& z,
                    torch::nn::BatchNorm2d& bn) {
  auto out = bn->forward(x);
  return torch::relu(z.defined() ? out + z : out);
}

torch::Tensor lamp_op(const torch::Tensor& x, const torch::Tensor& z,
                      torch::nn::BatchNorm2d& bn) {
  return z.defined() ? lamp::ops::batch_norm_add_relu(x, z, bn)
                     : lamp::ops::batch_norm_relu(x, bn);
}

void expect_bit_equal(const Outcome& actual, const Outcome& expected) {
  EXPECT_TRUE(BitEqual(actual.output, expected.output));
  EXPECT_TRUE(BitEqual(actual.grad_input, expected.grad_input));
  EXPECT_EQ(actual.grad_residual.defined(), expected.grad_residual.defined());
  if (expected.grad_residual.defined()) {
    EXPECT_TRUE(BitEqual(actual.grad_residual, expected.grad_residual));
  }
  EXPECT_TRUE(BitEqual(actual.grad_weight, expected.grad_weight));
  EXPECT_TRUE(BitEqual(actual.grad_bias, expected.grad_bias));
  EXPECT_TRUE(BitEqual(actual.running_mean, expected.running_mean));
  EXPECT_TRUE(BitEqual(actual.running_var, expected.running_var));
  EXPECT_TRUE(
      BitEqual(actual.num_batches_tracked, expected.num_batches_tracked));
}

struct BnReluCase {
  bool residual;
  c10::optional<double> momentum;
  bool training;
};

std::vector<BnReluCase> bn_relu_cases() {
  return {{false, 0.1, true},          {true, 0.1, true},
          {false, c10::nullopt, true}, {true, c10::nullopt, true},
          {false, 0.1, false},         {true, 0.1, false}};
}

// The autograd nodes of the fused op in the graph behind `root`.
int count_fused_nodes(const torch::Tensor& root) {
  return lamp_test::count_nodes_named(root, "FusedBatchNorm");
}

// Compares lamp's op with the stock composition over three steps (so the
// running statistics' updates compound), every case, bit for bit.
void expect_matches_stock_on_cpu(bool expect_fused_node) {
  for (const auto& c : bn_relu_cases()) {
    SCOPED_TRACE(std::string(c.residual ? "add+relu" : "relu") +
                 (c.momentum ? " momentum 0.1" : " cumulative") +
                 (c.training ? " train" : " eval"));
    torch::manual_seed(3);
    const auto x = torch::randn({4, 8, 5, 3});
    const auto z = c.residual ? torch::randn({4, 8, 5, 3}) : torch::Tensor();
    const auto grad = torch::randn({4, 8, 5, 3});
    auto bn = make_bn(8, c.momentum, torch::kCPU);
    bn->train(c.training);
    auto bn_copy = copy_bn(bn);
    bn_copy->train(c.training);
    const auto expected = run(stock, bn, x, z, grad, 3);
    const auto actual = run(lamp_op, bn_copy, x, z, grad, 3);
    expect_bit_equal(actual, expected);
    EXPECT_EQ(count_fused_nodes(actual.output),
              expect_fused_node && c.training ? 1 : 0);
  }
}

TEST(BatchNormRelu, FallbackIsTheStockCompositionOnTheCpu) {
  expect_matches_stock_on_cpu(/*expect_fused_node=*/false);
}

// The fused path's own code (autograd node, saved tensors, gradient routing
// to input, residual, weight and bias, the running-statistics factor and
// num_batches_tracked) with ATen's kernels in cuDNN's place.
TEST(BatchNormRelu, FusedPathWithReferenceKernelsMatchesStock) {
  lamp::ops::detail::ScopedReferenceKernels reference;
  expect_matches_stock_on_cpu(/*expect_fused_node=*/true);
}

TEST(BatchNormRelu, FusedPathKeepsWhatBackwardNeeds) {
  lamp::ops::detail::ScopedReferenceKernels reference;
  auto bn = make_bn(8, 0.1, torch::kCPU);
  const auto x = torch::randn({2, 8, 3, 3}, torch::requires_grad());
  const auto z = torch::randn({2, 8, 3, 3});
  const auto out = lamp::ops::batch_norm_add_relu(x, z, bn);
  const auto saved = lamp::ops::detail::batch_norm_relu_saved_tensors(out);
  ASSERT_EQ(saved.size(), 8u);
  EXPECT_TRUE(saved[0].is_same(x));
  EXPECT_TRUE(saved[1].is_same(z));
  EXPECT_TRUE(saved[2].is_same(bn->weight));
  EXPECT_TRUE(saved[3].is_same(bn->bias));
  EXPECT_TRUE(BitEqual(saved[4], out.detach()));
  EXPECT_EQ(saved[5].sizes(), torch::IntArrayRef({8}));
  EXPECT_EQ(saved[6].sizes(), torch::IntArrayRef({8}));
  // Without a residual, none is kept.
  const auto relu_only = lamp::ops::batch_norm_relu(x, bn);
  EXPECT_FALSE(
      lamp::ops::detail::batch_norm_relu_saved_tensors(relu_only)[1].defined());
  // Nothing recorded without autograd.
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(lamp::ops::detail::batch_norm_relu_saved_tensors(
                  lamp::ops::batch_norm_relu(x, bn))
                  .empty());
}

TEST(BatchNormRelu, FunctionalFormsMatchTorchBatchNorm) {
  for (bool reference : {false, true}) {
    SCOPED_TRACE(reference ? "reference kernels" : "fallback");
    c10::optional<lamp::ops::detail::ScopedReferenceKernels> scope;
    if (reference) {
      scope.emplace();
    }
    torch::manual_seed(4);
    const auto x = torch::randn({3, 4, 2, 5});
    const auto z = torch::randn({3, 4, 2, 5});
    const auto w = torch::rand({4}) + 0.5, b = torch::randn({4});
    auto mean_a = torch::randn({4}), var_a = torch::rand({4}) + 0.5;
    auto mean_b = mean_a.clone(), var_b = var_a.clone();
    const auto expected = torch::relu(
        torch::batch_norm(x, w, b, mean_a, var_a, true, 0.3, 1e-3, false) + z);
    const auto actual = lamp::ops::batch_norm_add_relu(x, z, w, b, mean_b,
                                                       var_b, true, 0.3, 1e-3);
    EXPECT_TRUE(BitEqual(actual, expected));
    EXPECT_TRUE(BitEqual(mean_b, mean_a));
    EXPECT_TRUE(BitEqual(var_b, var_a));
    // No running statistics: batch statistics, nothing to update.
    const auto plain = lamp::ops::batch_norm_relu(
        x, w, b, torch::Tensor(), torch::Tensor(), true, 0.1, 1e-5);
    EXPECT_TRUE(BitEqual(plain, torch::relu(torch::batch_norm(
                                    x, w, b, torch::Tensor(), torch::Tensor(),
                                    true, 0.1, 1e-5, false))));
  }
}

// Reasons for the stock path, one condition at a time, with the
// device-independent checks driven through the reference kernels.
TEST(BatchNormRelu, FallbackReasonNamesTheCondition) {
  const auto x = torch::randn({2, 8, 3, 3});
  const auto w = torch::ones({8}), b = torch::zeros({8});
  const auto m = torch::zeros({8}), v = torch::ones({8});
  const auto reason = [&](const torch::Tensor& input,
                          const torch::Tensor& residual,
                          const torch::Tensor& weight, bool training) {
    return lamp::ops::batch_norm_relu_fallback_reason(input, residual, weight,
                                                      b, m, v, training);
  };
  // On this CPU tensor: not fused, and the reason says why (the build when
  // it has no cuDNN, the device otherwise).
  std::string built;
  const auto cpu = reason(x, {}, w, true);
  if (lamp::ops::batch_norm_relu_fusion_built(&built)) {
    EXPECT_NE(cpu.find("not CUDA"), std::string::npos) << cpu;
  } else {
    EXPECT_EQ(cpu, built);
    EXPECT_NE(built.find("lamp was built"), std::string::npos) << built;
  }

  lamp::ops::detail::ScopedReferenceKernels scope;
  EXPECT_EQ(reason(x, {}, w, true), "");
  EXPECT_EQ(reason(x, x.clone(), w, true), "");
  EXPECT_NE(reason(x, {}, w, false).find("evaluation mode"), std::string::npos);
  // An empty batch takes the stock op: the empty output, the running
  // statistics untouched (the kernels would average over no value).
  const auto empty = torch::randn({0, 8, 3, 3});
  EXPECT_NE(reason(empty, {}, w, true).find("the input is empty"),
            std::string::npos);
  torch::nn::BatchNorm2d bn(8);
  const auto mean = bn->running_mean.clone(), var = bn->running_var.clone();
  EXPECT_EQ(lamp::ops::batch_norm_relu(empty, bn).sizes(), empty.sizes());
  EXPECT_TRUE(lamp_test::BitEqual(bn->running_mean, mean));
  EXPECT_TRUE(lamp_test::BitEqual(bn->running_var, var));
  EXPECT_NE(reason(x.flatten(2), {}, w, true).find("not 4-D"),
            std::string::npos);
  EXPECT_NE(reason(x, {}, w.to(torch::kHalf), true).find("float vectors"),
            std::string::npos);
  EXPECT_NE(reason(x, {}, torch::ones({4}), true).find("C = 8"),
            std::string::npos);
  // A parameter on another device (the meta device stands for one here)
  // is not handed to the kernels.
  EXPECT_NE(reason(x, {}, torch::empty({8}, torch::kMeta), true)
                .find("on the input's device"),
            std::string::npos);
  EXPECT_NE(lamp::ops::batch_norm_relu_fallback_reason(
                x, {}, w, b, m, torch::empty({8}, torch::kMeta), true)
                .find("running statistics"),
            std::string::npos);
  EXPECT_NE(reason(x, x.to(torch::kDouble), w, true).find("residual differs"),
            std::string::npos);
  EXPECT_NE(reason(x, x.contiguous(at::MemoryFormat::ChannelsLast), w, true)
                .find("residual differs"),
            std::string::npos);
  EXPECT_NE(lamp::ops::batch_norm_relu_fallback_reason(x, {}, w, b, m,
                                                       torch::Tensor(), true)
                .find("running statistics"),
            std::string::npos);
}

TEST(BatchNormRelu, ClearErrors) {
  auto bn = make_bn(4, 0.1, torch::kCPU);
  const auto x = torch::randn({2, 4, 3, 3});
  lamp_test::expect_error(
      [&] {
        lamp::ops::batch_norm_add_relu(x, torch::randn({2, 4, 3}), bn);
      },
      "the residual must have the input's shape");
  lamp_test::expect_error(
      [&] { lamp::ops::batch_norm_add_relu(x, torch::Tensor(), bn); },
      "the residual is an undefined tensor");
  lamp_test::expect_error(
      [&] { lamp::ops::batch_norm_relu(torch::Tensor(), bn); },
      "the input is an undefined tensor");
  lamp_test::expect_error(
      [&] { lamp::ops::batch_norm_relu(x, torch::nn::BatchNorm2d(nullptr)); },
      "the BatchNorm2d is empty");
  // One value per channel: the stock op's error, on either path.
  lamp::ops::detail::ScopedReferenceKernels scope;
  lamp_test::expect_error(
      [&] {
        lamp::ops::batch_norm_relu(torch::randn({1, 4, 1, 1}), bn);
      },
      "Expected more than 1 value per channel");
  // Differentiable once; the error names the switches that exist (the
  // programs' flag is checked against their command line by
  // example.cli.message_flags).
  auto input = x.clone().requires_grad_();
  const auto message = lamp_test::error_of([&] {
    auto out = lamp::ops::batch_norm_relu(input, bn);
    torch::autograd::grad({out.sum()}, {input}, {}, true, true);
  });
  EXPECT_NE(message.find("differentiable once"), std::string::npos) << message;
  EXPECT_NE(message.find("--fused-bn off"), std::string::npos) << message;
  EXPECT_NE(message.find("ResNetOptions::fused_batch_norm(false)"),
            std::string::npos)
      << message;
}

// ResNets route every BatchNorm + ReLU (+ add) through lamp::ops when
// fused_batch_norm is on (the default), with the same parameters, buffers and
// names, and the same values and gradients as the stock blocks.
TEST(BatchNormRelu, ResNetsUseTheFusedOpsWithTheSameNamesAndValues) {
  for (const char* name : {"resnet18", "resnet50"}) {
    SCOPED_TRACE(name);
    torch::manual_seed(0);
    auto fused = lamp::models::ResNet(lamp::models::resnet_options(name));
    torch::manual_seed(0);
    auto stock_net = lamp::models::ResNet(
        lamp::models::resnet_options(name).fused_batch_norm(false));
    EXPECT_TRUE(fused->options().fused_batch_norm());
    const auto a = fused->named_parameters(), b = stock_net->named_parameters();
    ASSERT_EQ(a.keys(), b.keys());
    ASSERT_EQ(fused->named_buffers().keys(), stock_net->named_buffers().keys());
    for (const auto& item : a) {
      ASSERT_TRUE(BitEqual(item.value(), b[item.key()]));
    }
    const auto x = torch::randn({2, 3, 8, 8});
    lamp::ops::detail::ScopedReferenceKernels scope;
    const auto out_fused = fused->forward(x);
    const auto out_stock = stock_net->forward(x);
    EXPECT_TRUE(BitEqual(out_fused, out_stock));
    // The stem, and two (ResNet18) or three (ResNet50) per block.
    EXPECT_EQ(count_fused_nodes(out_fused),
              std::string(name) == "resnet18" ? 1 + 8 * 2 : 1 + 16 * 3);
    EXPECT_EQ(count_fused_nodes(out_stock), 0);
    out_fused.sum().backward();
    out_stock.sum().backward();
    for (const auto& item : a) {
      SCOPED_TRACE(item.key());
      EXPECT_TRUE(BitEqual(item.value().grad(), b[item.key()].grad()));
    }
    const auto buffers = stock_net->named_buffers();
    for (const auto& item : fused->named_buffers()) {
      SCOPED_TRACE(item.key());
      EXPECT_TRUE(BitEqual(item.value(), buffers[item.key()]));
    }
  }
}

// The programs and lamp_bench build their model with make_model and
// --fused-bn's choice: off builds a network without a fused node, on (the
// default) one whose every BatchNorm + ReLU is fused; "cnn" has no BatchNorm.
TEST(BatchNormRelu, MakeModelBuildsTheFusionAsAsked) {
  lamp::ops::detail::ScopedReferenceKernels scope;
  const auto x = torch::randn({2, 3, 8, 8});
  for (const bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused" : "stock");
    auto model = lamp::models::make_model("resnet18", 10, 3, fused);
    const auto resnet =
        std::dynamic_pointer_cast<lamp::models::ResNetImpl>(model.module);
    ASSERT_TRUE(resnet);
    EXPECT_EQ(resnet->options().fused_batch_norm(), fused);
    EXPECT_EQ(count_fused_nodes(model.forward(x)), fused ? 1 + 8 * 2 : 0);
  }
  EXPECT_TRUE(lamp::models::make_model("resnet18")
                  .module->as<lamp::models::ResNetImpl>()
                  ->options()
                  .fused_batch_norm());
  auto cnn = lamp::models::make_model("cnn", 10, 1, true);
  EXPECT_EQ(count_fused_nodes(cnn.forward(torch::randn({2, 1, 28, 28}))), 0);
}

// ---------------------------------------------------------------------------
// CUDA: cuDNN's fused kernels against the stock ops
// ---------------------------------------------------------------------------

using lamp_test::ulp_of_one;
using lamp_test::WithinUlps;

TEST(BatchNormRelu, CudnnMatchesStockOps_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  for (auto dtype : {torch::kHalf, torch::kBFloat16}) {
    for (bool residual : {false, true}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) +
                   (residual ? " add+relu" : " relu"));
      torch::manual_seed(5);
      const auto shape = std::vector<int64_t>{32, 64, 16, 16};
      const auto cl = at::MemoryFormat::ChannelsLast;
      const auto x = torch::randn(shape, cuda).to(dtype).contiguous(cl);
      const auto z = residual
                         ? torch::randn(shape, cuda).to(dtype).contiguous(cl)
                         : torch::Tensor();
      auto grad = torch::randn(shape, cuda).to(dtype).contiguous(cl);
      auto bn = make_bn(64, 0.1, cuda);
      auto bn_copy = copy_bn(bn);
      if (residual) {
        // The stock ops round BatchNorm's output to `dtype` before the add;
        // cuDNN adds in float and rounds once. Where the sum lies within
        // that rounding of 0 the two ReLU masks may disagree, each right
        // for its own arithmetic, and a flipped mask moves the gradients by
        // the whole incoming value (about 150 of these 524288 elements in
        // half, 8 times more in bfloat16). The incoming gradient is 0
        // there, so that what follows compares the kernels, not the
        // rounding; a wrong mask anywhere else still shows.
        torch::NoGradGuard no_grad;
        auto mean = bn->running_mean.clone();
        auto var = bn->running_var.clone();
        const auto normalised =
            torch::batch_norm(x.to(torch::kFloat), bn->weight, bn->bias, mean,
                              var, /*training=*/true, 0.1, 1e-4,
                              /*cudnn_enabled=*/false);
        const auto pre = normalised + z.to(torch::kFloat);
        const auto margin = normalised.abs() * ulp_of_one(dtype) + 1e-3;
        grad = torch::where(pre.abs() <= margin, torch::zeros_like(grad), grad)
                   .contiguous(cl);
      }
      EXPECT_EQ(lamp::ops::batch_norm_relu_fallback_reason(
                    x, z, bn->weight, bn->bias, bn->running_mean,
                    bn->running_var, true),
                "");
      const auto expected = run(stock, bn, x, z, grad, 2);
      const auto actual = run(lamp_op, bn_copy, x, z, grad, 2);
      if (count_fused_nodes(actual.output) == 0) {
        // cuDNN refused (a warning said so): the stock path ran.
        ADD_FAILURE_AT(__FILE__, __LINE__)
            << "cuDNN did not fuse " << dtype
            << (dtype == torch::kHalf ? ""
                                      : " (bfloat16 may be unsupported "
                                        "by this cuDNN)");
        continue;
      }
      // Outputs and input gradients are rounded once to the 16-bit type
      // on both sides from float intermediates that differ only in
      // summation order: within 2 ulps at the largest magnitude.
      EXPECT_TRUE(WithinUlps(actual.output, expected.output, dtype, 2));
      EXPECT_TRUE(WithinUlps(actual.grad_input, expected.grad_input, dtype, 2));
      if (residual) {
        // The incoming gradient through the ReLU's mask: exact where the
        // masks agree, which the gradient chosen above makes everywhere.
        EXPECT_TRUE(
            WithinUlps(actual.grad_residual, expected.grad_residual, dtype, 0));
      }
      // Float sums over N*H*W = 8192 products of 16-bit values in another
      // order: relative error of order 8192 * 2^-24, far below 1e-3.
      EXPECT_TRUE(lamp_test::AllClose(actual.grad_weight, expected.grad_weight,
                                      1e-3, 1e-2));
      EXPECT_TRUE(lamp_test::AllClose(actual.grad_bias, expected.grad_bias,
                                      1e-3, 1e-2));
      // Batch mean and unbiased variance in float, momentum 0.1.
      EXPECT_TRUE(lamp_test::AllClose(actual.running_mean,
                                      expected.running_mean, 1e-5, 1e-5));
      EXPECT_TRUE(lamp_test::AllClose(actual.running_var, expected.running_var,
                                      1e-4, 1e-4));
      EXPECT_TRUE(
          BitEqual(actual.num_batches_tracked, expected.num_batches_tracked));
    }
  }
}

// A whole training step of ResNet18 (amp, channels_last) with the fused ops,
// eagerly and replayed from a CUDA graph: the graph runs the same kernels.
TEST(BatchNormRelu, CudaGraphStepEqualsEagerStep_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  std::vector<std::vector<torch::Tensor>> weights;
  for (bool graph : {false, true}) {
    SCOPED_TRACE(graph ? "CUDA graph" : "eager");
    torch::manual_seed(0);
    auto model = lamp::models::resnet18();
    model->to(cuda);
    lamp::models::to_channels_last(*model);
    lamp::TrainStep step(
        model.ptr(),
        [](std::vector<torch::Tensor> params) {
          return lamp::optim::make_optimizer(
              std::move(params),
              lamp::optim::OptimizerOptions().name("sgd").lr(0.01).momentum(
                  0.9));
        },
        lamp::TrainStepOptions(lamp::Precision::kAMP).cuda_graph(graph));
    EXPECT_EQ(step.cuda_graph_enabled(), graph);
    torch::manual_seed(1);
    const auto x = torch::randn({16, 3, 32, 32}, cuda)
                       .contiguous(at::MemoryFormat::ChannelsLast);
    // Class indices: LibTorch's randint makes floats unless told.
    const auto y =
        torch::randint(10, {16}, torch::dtype(torch::kLong).device(cuda));
    for (int i = 0; i < 6; ++i) {
      step.step(x, y, [&](const torch::Tensor& in, const torch::Tensor& t) {
        const auto out = model->forward(in);
        EXPECT_GT(count_fused_nodes(out), 0);
        return torch::nn::functional::cross_entropy(out.to(torch::kFloat), t);
      });
    }
    std::vector<torch::Tensor> w;
    for (const auto& p : model->parameters()) {
      w.push_back(p.detach().cpu());
    }
    for (const auto& b : model->buffers()) {
      w.push_back(b.detach().cpu());
    }
    weights.push_back(w);
  }
  for (size_t i = 0; i < weights[0].size(); ++i) {
    // The same kernels in the same order; only cuDNN's choice of
    // convolution algorithm may differ between the two runs (a few ulps).
    EXPECT_TRUE(lamp_test::AllClose(weights[1][i], weights[0][i], 1e-3, 1e-5))
        << "tensor " << i;
  }
}

} // namespace
