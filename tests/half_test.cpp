#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <sstream>
#include <string>

#include "lamp/amp/half.h"
#include "lamp/amp/master_weights.h"
#include "test_util.h"

namespace {

using lamp_test::SmallNet;

// Every layer kind the conversion must know about.
struct ZooImpl : torch::nn::Module {
  ZooImpl()
      : conv(torch::nn::Conv2dOptions(3, 4, 3)),
        linear(4, 4),
        bn1d(torch::nn::BatchNorm1dOptions(4)),
        bn2d(torch::nn::BatchNorm2dOptions(4).affine(false)),
        bn3d(torch::nn::BatchNorm3dOptions(4)),
        ln(torch::nn::LayerNormOptions({4})),
        gn(torch::nn::GroupNormOptions(2, 4)),
        in2d(torch::nn::InstanceNorm2dOptions(4)
                 .affine(true)
                 .track_running_stats(true)),
        head(torch::nn::Sequential(torch::nn::Linear(4, 2),
                                   torch::nn::BatchNorm1d(2))) {
    register_module("conv", conv);
    register_module("linear", linear);
    register_module("bn1d", bn1d);
    register_module("bn2d", bn2d);
    register_module("bn3d", bn3d);
    register_module("ln", ln);
    register_module("gn", gn);
    register_module("in2d", in2d);
    register_module("head", head);
  }
  torch::Tensor forward(const torch::Tensor& x) { return x; }
  torch::nn::Conv2d conv;
  torch::nn::Linear linear;
  torch::nn::BatchNorm1d bn1d;
  torch::nn::BatchNorm2d bn2d;
  torch::nn::BatchNorm3d bn3d;
  torch::nn::LayerNorm ln;
  torch::nn::GroupNorm gn;
  torch::nn::InstanceNorm2d in2d;
  torch::nn::Sequential head;
};
TORCH_MODULE(Zoo);

std::map<std::string, torch::Dtype> dtypes(const torch::nn::Module& m) {
  std::map<std::string, torch::Dtype> out;
  for (const auto& p : m.named_parameters()) {
    out[p.key()] = p.value().scalar_type();
  }
  for (const auto& b : m.named_buffers()) {
    out[b.key()] = b.value().scalar_type();
  }
  return out;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

class NetworkToHalfDtype : public ::testing::TestWithParam<torch::Dtype> {};

TEST_P(NetworkToHalfDtype, ConvertsEveryTensorAndKeepsBatchNormFP32) {
  const auto low = GetParam();
  Zoo zoo;
  const auto options = lamp::HalfOptions(low).keep_fp32(
      [](const std::string& name, const torch::nn::Module&) {
        return name == "head";
      });
  auto net = lamp::network_to_half(zoo, options);
  const auto got = dtypes(*zoo);
  ASSERT_EQ(got.size(), 33u); // every parameter and buffer, checked below
  for (const auto& item : got) {
    const auto& name = item.first;
    torch::Dtype expected = low;
    if (name.find("num_batches_tracked") != std::string::npos) {
      expected = torch::kLong; // integer buffers keep their dtype
    } else if (starts_with(name, "bn") || starts_with(name, "head.")) {
      expected = torch::kFloat;
    }
    EXPECT_EQ(item.second, expected) << name;
  }
}

TEST_P(NetworkToHalfDtype, KeepNormFP32RefusesNormsThatCannotTakeLowPrecision) {
  if (lamp::mixed_dtype_norm_available(torch::kCPU, GetParam())) {
    GTEST_SKIP() << "this LibTorch's LayerNorm/GroupNorm take " << GetParam()
                 << " input with FP32 parameters on CPU: nothing to refuse";
  }
  Zoo zoo;
  try {
    lamp::network_to_half(zoo,
                          lamp::HalfOptions(GetParam()).keep_norm_fp32(true));
    FAIL() << "kept a LayerNorm in FP32 that cannot take low-precision input";
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("lamp::network_to_half: keep_norm_fp32 keeps 'ln'"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("keep_norm_fp32(false)"), std::string::npos) << what;
  }
  for (const auto& item : dtypes(*zoo)) { // refused before any change
    EXPECT_TRUE(item.second == torch::kFloat || item.second == torch::kLong)
        << item.first;
  }
}

TEST_P(NetworkToHalfDtype, KeepNormFP32KeepsLayerGroupAndInstanceNorm) {
  if (!lamp::mixed_dtype_norm_available(torch::kCPU, GetParam())) {
    GTEST_SKIP()
        << "this LibTorch's LayerNorm/GroupNorm cannot take " << GetParam()
        << " input with FP32 parameters on CPU (see KeepNormFP32RefusesNormsThatCannotTakeLowPrecision)";
  }
  Zoo zoo;
  lamp::network_to_half(zoo,
                        lamp::HalfOptions(GetParam()).keep_norm_fp32(true));
  // The kept norms run on low-precision input.
  const auto x = torch::randn({2, 4}).to(GetParam());
  EXPECT_EQ(zoo->ln(x).scalar_type(), GetParam());
  EXPECT_EQ(zoo->gn(x).scalar_type(), GetParam());
  for (const auto& item : dtypes(*zoo)) {
    const auto& name = item.first;
    if (name.find("num_batches_tracked") != std::string::npos) {
      continue;
    }
    const bool kept = starts_with(name, "bn") || starts_with(name, "ln.") ||
                      starts_with(name, "gn.") || starts_with(name, "in2d.") ||
                      name == "head.1.weight" || name == "head.1.bias" ||
                      name == "head.1.running_mean" ||
                      name == "head.1.running_var";
    EXPECT_EQ(item.second, kept ? torch::kFloat : GetParam()) << name;
  }
}

// A subtree the keep_fp32 predicate keeps casts its own inputs: its
// LayerNorm is kept in FP32 with it, not refused for keep_norm_fp32's
// sake (on LibTorch 1.13's CPU, which refuses a LayerNorm kept alone).
TEST_P(NetworkToHalfDtype, KeepNormFP32LeavesSubtreesTheyKeepToThePredicate) {
  torch::nn::ModuleList block(
      torch::nn::Linear(4, 4),
      torch::nn::LayerNorm(torch::nn::LayerNormOptions({4})));
  torch::nn::ModuleList net(torch::nn::Linear(4, 4), block);
  lamp::convert_network(*net, lamp::HalfOptions(GetParam())
                                  .keep_norm_fp32(true)
                                  .keep_fp32([](const std::string& name,
                                                const torch::nn::Module&) {
                                    return name == "1";
                                  }));
  for (const auto& item : dtypes(*net)) {
    EXPECT_EQ(item.second,
              starts_with(item.first, "1.") ? torch::kFloat : GetParam())
        << item.first;
  }
}

// InstanceNorm needs no mixed-dtype LayerNorm/GroupNorm kernel, so this runs
// on every LibTorch: with keep_norm_fp32 its affine parameters and running
// statistics stay FP32 (and the rest is converted); without, they convert.
TEST_P(NetworkToHalfDtype, KeepNormFP32KeepsInstanceNorm) {
  for (bool keep : {true, false}) {
    torch::nn::Sequential net(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)),
        torch::nn::InstanceNorm1d(torch::nn::InstanceNorm1dOptions(4)
                                      .affine(true)
                                      .track_running_stats(true)),
        torch::nn::InstanceNorm2d(torch::nn::InstanceNorm2dOptions(4)
                                      .affine(true)
                                      .track_running_stats(true)),
        torch::nn::InstanceNorm3d(torch::nn::InstanceNorm3dOptions(4)
                                      .affine(true)
                                      .track_running_stats(true)));
    lamp::convert_network(*net,
                          lamp::HalfOptions(GetParam()).keep_norm_fp32(keep));
    const auto got = dtypes(*net);
    ASSERT_EQ(got.size(), 2u + 3u * 5u);
    for (const auto& item : got) {
      const auto& name = item.first;
      torch::Dtype expected = GetParam();
      if (name.find("num_batches_tracked") != std::string::npos) {
        expected = torch::kLong;
      } else if (keep && !starts_with(name, "0.")) {
        expected = torch::kFloat;
      }
      EXPECT_EQ(item.second, expected) << name << " keep " << keep;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, NetworkToHalfDtype,
                         ::testing::Values(torch::kHalf, torch::kBFloat16),
                         [](const auto& info) {
                           return std::string(
                               info.param == torch::kHalf ? "FP16" : "BF16");
                         });

TEST(NetworkToHalf, KeepBatchnormFalseConvertsBatchNormToo) {
  Zoo zoo;
  lamp::network_to_half(zoo, lamp::HalfOptions().keep_batchnorm_fp32(false));
  EXPECT_EQ(zoo->bn2d->running_mean.scalar_type(), torch::kHalf);
  EXPECT_EQ(zoo->bn1d->weight.scalar_type(), torch::kHalf);
  EXPECT_EQ(zoo->bn1d->num_batches_tracked.scalar_type(), torch::kLong);
}

TEST(NetworkToHalf, HoldsTheSameObjectAndKeepsTheParameterNames) {
  SmallNet model;
  const auto before = model->conv1->weight.unsafeGetTensorImpl();
  const auto names = model->named_parameters().keys();
  auto net = lamp::network_to_half(model, torch::kBFloat16);
  EXPECT_EQ(net->model().get(), model.ptr().get());
  EXPECT_EQ(net->dtype(), torch::kBFloat16);
  EXPECT_EQ(net->named_parameters().keys(), names);
  EXPECT_TRUE(
      net->named_parameters()["conv1.weight"].is_same(model->conv1->weight));
  std::ostringstream printed;
  printed << *net;
  EXPECT_EQ(printed.str().rfind("lamp::HalfNetwork(dtype=BFloat16)", 0), 0u)
      << printed.str();
  // FP32 input is cast in front of the model's forward.
  torch::NoGradGuard no_grad;
  EXPECT_EQ(net->forward(torch::randn({2, 3, 8, 8})).scalar_type(),
            torch::kBFloat16);
  // Converted in place: same parameter object, new dtype.
  EXPECT_EQ(model->conv1->weight.unsafeGetTensorImpl(), before);
  EXPECT_EQ(model->conv1->weight.scalar_type(), torch::kBFloat16);
}

// A second conversion to the other low-precision dtype is refused, naming
// both dtypes, with the model and the first wrapper left working; a second
// one to the same dtype changes nothing.
TEST(NetworkToHalf, RefusesASecondConversionToAnotherDtype) {
  SmallNet model;
  auto bf16 = lamp::network_to_half(model, torch::kBFloat16);
  const auto message =
      lamp_test::error_of([&] { lamp::network_to_half(model, torch::kHalf); });
  EXPECT_NE(message.find("the model is converted to BFloat16 already "
                         "(parameter 'conv1.weight' is BFloat16), and "
                         "converting it to Half would leave"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("build a fresh one and convert that to Half; this "
                         "model is unchanged"),
            std::string::npos)
      << message;
  EXPECT_EQ(model->conv1->weight.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(model->fc->weight.scalar_type(), torch::kBFloat16);
  torch::NoGradGuard no_grad;
  EXPECT_EQ(bf16->forward(torch::randn({2, 3, 8, 8})).scalar_type(),
            torch::kBFloat16);
  auto again = lamp::network_to_half(model, torch::kBFloat16);
  EXPECT_EQ(again->forward(torch::randn({2, 3, 8, 8})).scalar_type(),
            torch::kBFloat16);
}

TEST(NetworkToHalf, ConvertsRecurrentLayers) {
  torch::nn::LSTM lstm(torch::nn::LSTMOptions(4, 8).num_layers(2));
  lamp::convert_network(*lstm, torch::kHalf);
  for (const auto& p : lstm->parameters()) {
    EXPECT_EQ(p.scalar_type(), torch::kHalf);
  }
}

TEST(NetworkToHalf, CastsExistingGradients) {
  SmallNet model;
  model->fc->weight.mutable_grad() = torch::ones_like(model->fc->weight);
  lamp::convert_network(*model, torch::kBFloat16);
  EXPECT_EQ(model->fc->weight.grad().scalar_type(), torch::kBFloat16);
}

TEST(NetworkToHalf, RejectsDtypesOtherThanHalfAndBFloat16) {
  SmallNet model;
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kInt}) {
    try {
      lamp::network_to_half(model, lamp::HalfOptions(dtype));
      FAIL() << "accepted " << dtype;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("torch::kHalf or torch::kBFloat16"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(model->conv1->weight.scalar_type(), torch::kFloat);
  EXPECT_THROW(lamp::InputCast(torch::kFloat), c10::Error);
}

TEST(InputCast, CastsFloatingInputsAndLeavesIntegersAlone) {
  lamp::InputCast cast(torch::kBFloat16);
  EXPECT_EQ(cast(torch::ones({2})).scalar_type(), torch::kBFloat16);
  EXPECT_EQ(cast(torch::ones({2}, torch::kDouble)).scalar_type(),
            torch::kBFloat16);
  const auto labels = torch::arange(3);
  EXPECT_TRUE(cast(labels).is_same(labels));
  const auto mask = torch::ones({2}, torch::kBool);
  EXPECT_TRUE(cast(mask).is_same(mask));
}

TEST(BnConvertFloat, PutsEveryBatchNormBackToFP32) {
  Zoo zoo;
  lamp::convert_network(*zoo, lamp::HalfOptions().keep_batchnorm_fp32(false));
  lamp::bn_convert_float(*zoo);
  for (const auto& item : dtypes(*zoo)) {
    const auto& name = item.first;
    torch::Dtype expected = torch::kHalf;
    if (name.find("num_batches_tracked") != std::string::npos) {
      expected = torch::kLong;
    } else if (starts_with(name, "bn") || starts_with(name, "head.1.")) {
      expected = torch::kFloat;
    }
    EXPECT_EQ(item.second, expected) << name;
  }
}

// The fastai recipe end to end on CPU: BF16 network, FP32 BatchNorm, FP32
// master weights. The loss on a fixed batch must fall.
TEST(NetworkToHalf, Bf16NetworkWithBatchNormTrainsOnCPU) {
  const auto problem = lamp_test::make_problem(32, 4, 0);
  SmallNet model;
  auto net = lamp::network_to_half(model, torch::kBFloat16);
  lamp::MasterWeights master(model->parameters());
  torch::optim::SGD optimizer(master.master_params(),
                              torch::optim::SGDOptions(0.1).momentum(0.9));
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    for (auto& p : model->parameters()) {
      p.mutable_grad() = torch::Tensor();
    }
    auto logits = net->forward(problem.inputs);
    ASSERT_EQ(logits.scalar_type(), torch::kBFloat16);
    auto loss = torch::nn::functional::cross_entropy(logits.to(torch::kFloat),
                                                     problem.targets);
    loss.backward();
    ASSERT_EQ(model->conv1->weight.grad().scalar_type(), torch::kBFloat16);
    ASSERT_EQ(model->bn1->weight.grad().scalar_type(), torch::kFloat);
    master.model_grads_to_master_grads();
    optimizer.step();
    master.master_params_to_model_params();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, 0.5 * first) << "first " << first << ", last " << last;
  EXPECT_EQ(model->bn1->running_mean.scalar_type(), torch::kFloat);
}

TEST(NetworkToHalf, Fp16ForwardOnCpuRunsOrFailsWithLampsMessage) {
  SmallNet model;
  auto net = lamp::network_to_half(model); // converting always works
  const auto x = torch::randn({2, 3, 8, 8});
  if (lamp::fp16_compute_available(torch::kCPU)) {
    EXPECT_EQ(net->forward(x).scalar_type(), torch::kHalf);
    return;
  }
  try {
    net->forward(x);
    FAIL() << "an FP16 forward ran on CPU without FP16 kernels";
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("lamp::InputCast: FP16 convolutions"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("kBFloat16"), std::string::npos) << what;
  }
}

TEST(NetworkToHalf, ConvertsAndRunsOnGpu_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  SmallNet model;
  model->to(torch::kCUDA);
  auto net = lamp::network_to_half(model);
  auto out = net->forward(torch::randn({4, 3, 8, 8}, torch::kCUDA));
  EXPECT_EQ(out.scalar_type(), torch::kHalf);
  EXPECT_EQ(model->bn1->weight.scalar_type(), torch::kFloat);
  out.to(torch::kFloat).sum().backward();
  EXPECT_EQ(model->conv1->weight.grad().scalar_type(), torch::kHalf);
}

// A model converted on the CPU (LibTorch 2.x's CPU LayerNorm takes FP32
// parameters with low-precision inputs) and moved to a GPU: the GPU's
// LayerNorm runs it, or the forward says why it cannot, never ATen's
// "expected scalar type" from inside the model.
TEST(NetworkToHalf, KeptNormsMovedToAGpuRunOrAreRefusedClearly_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  if (!lamp::mixed_dtype_norm_available(torch::kCPU, torch::kBFloat16)) {
    GTEST_SKIP() << "this LibTorch's CPU cannot keep the norm: nothing to move";
  }
  torch::nn::Sequential model(
      torch::nn::Linear(4, 4),
      torch::nn::LayerNorm(torch::nn::LayerNormOptions({4})));
  auto net = lamp::network_to_half(
      model, lamp::HalfOptions(torch::kBFloat16).keep_norm_fp32(true));
  EXPECT_EQ(net->forward(torch::randn({2, 4})).scalar_type(), torch::kBFloat16);
  net->to(torch::kCUDA);
  const auto x = torch::randn({2, 4}, torch::kCUDA);
  if (lamp::mixed_dtype_norm_available(torch::kCUDA, torch::kBFloat16)) {
    EXPECT_EQ(net->forward(x).scalar_type(), torch::kBFloat16);
    return;
  }
  try {
    net->forward(x);
    FAIL() << "ran a kept norm the GPU cannot run";
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("lamp::HalfNetwork: keep_norm_fp32 keeps '1'"),
              std::string::npos)
        << what;
  }
}

} // namespace
