#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "lamp/amp/numerics_check.h"
#include "lamp/models/mnist_cnn.h"
#include "lamp/models/resnet.h"
#include "test_util.h"

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// sqrt(x * gain): with gain 0 the forward is 0, finite, and the gradient of
// x * gain (sqrt's derivative at 0) is inf.
struct GateImpl : torch::nn::Module {
  GateImpl() { gain = register_parameter("gain", torch::ones({1})); }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::sqrt(x * gain);
  }
  torch::Tensor gain;
};
TORCH_MODULE(Gate);

struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : fc1(register_module("fc1", torch::nn::Linear(4, 4))),
        gate(register_module("gate", Gate())),
        fc2(register_module("fc2", torch::nn::Linear(4, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2(gate(torch::sigmoid(fc1(x))));
  }
  torch::nn::Linear fc1;
  Gate gate;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Block);

// A user's module tree, two levels deep.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : stem(register_module("stem", torch::nn::Linear(4, 4))),
        block(register_module("block", Block())),
        head(register_module("head", torch::nn::Linear(4, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head(block(stem(x))); }
  torch::nn::Linear stem;
  Block block;
  torch::nn::Linear head;
};
TORCH_MODULE(Net);

// Forward and backward of `net` on a fixed batch.
template <typename Model>
void train_pass(Model& net, const torch::Tensor& x) {
  net->zero_grad();
  net->forward(x).abs().sum().backward();
}

void fill(torch::Tensor t, float value) {
  torch::NoGradGuard no_grad;
  t.fill_(value);
}

TEST(NumericsCheck, CleanStepsAreNotFlagged) {
  torch::manual_seed(0);
  Net net;
  lamp::NumericsCheck check(net.ptr());
  const auto x = torch::rand({8, 4}) + 0.1;
  for (int64_t step = 1; step <= 3; ++step) {
    EXPECT_FALSE(check.observe(step, [&] { train_pass(net, x); }));
  }
  lamp::models::MnistCNN cnn;
  lamp::NumericsCheck cnn_check(cnn.ptr());
  EXPECT_FALSE(cnn_check.observe(1, [&] {
    train_pass(cnn, torch::randn({2, 1, 28, 28}));
  }));
}

// lamp's own ResNet, a NaN planted in one convolution's weight: the
// forward stops there, naming its path in the module tree.
TEST(NumericsCheck, NamesTheModuleWhoseForwardOutputHoldsNaN) {
  torch::manual_seed(0);
  lamp::models::ResNet resnet(lamp::models::ResNetOptions({1, 1, 1, 1}));
  fill(resnet->named_parameters()["layer2.0.conv1.weight"][0][0][0][0], kNaN);
  lamp::NumericsCheck check(resnet.ptr());
  const auto x = torch::randn({2, 3, 32, 32});
  const auto message = lamp_test::error_of(
      [&] { check.observe(7, [&] { train_pass(resnet, x); }); });
  for (const char* part :
       {"lamp::NumericsCheck: step 7, forward: the output of module "
        "'layer2.0.conv1' (",
        "Conv2dImpl, op aten::conv2d) holds inf/NaN (largest magnitude nan, "
        "Float)",
        "Lower the learning rate"}) {
    EXPECT_NE(message.find(part), std::string::npos) << part << "\n" << message;
  }

  const auto finding =
      lamp::NumericsCheck(resnet.ptr(),
                          lamp::NumericsCheckOptions().stop(false))
          .observe(7, [&] { train_pass(resnet, x); });
  ASSERT_TRUE(finding);
  EXPECT_EQ(finding->module, "layer2.0.conv1");
  EXPECT_NE(finding->module_type.find("Conv2dImpl"), std::string::npos);
  EXPECT_TRUE(finding->in_module);
  EXPECT_FALSE(finding->backward);
  EXPECT_TRUE(finding->non_finite);
  EXPECT_TRUE(std::isnan(finding->max_abs));
  EXPECT_EQ(finding->dtype, torch::kFloat);
  EXPECT_TRUE(finding->stops());
}

// The forward is finite; the gradient of the gate's product is inf: the
// backward names the gate, with its autograd node.
TEST(NumericsCheck, NamesTheModuleWhoseGradientHoldsInf) {
  torch::manual_seed(0);
  Net net;
  fill(net->block->gate->gain, 0.0f);
  lamp::NumericsCheck check(net.ptr());
  const auto x = torch::rand({8, 4});
  const auto message = lamp_test::error_of(
      [&] { check.observe(3, [&] { train_pass(net, x); }); });
  EXPECT_NE(message.find("step 3, backward: the gradient of the output of "
                         "module 'block.gate' ("),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("GateImpl, op MulBackward0) holds inf/NaN"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("Clip the gradients"), std::string::npos) << message;

  // Under dynamic loss scaling an overflowing gradient is the scaler's to
  // skip: returned, not stopped on.
  const auto scaled = check.observe(
      4, [&] { train_pass(net, x); },
      /*loss_scaled=*/true);
  ASSERT_TRUE(scaled);
  EXPECT_EQ(scaled->module, "block.gate");
  EXPECT_TRUE(scaled->backward);
  EXPECT_TRUE(scaled->loss_scaled);
  EXPECT_FALSE(scaled->stops());
  EXPECT_TRUE(std::isinf(scaled->max_abs));

  // Forward only: the backward is not checked.
  EXPECT_FALSE(lamp::NumericsCheck(net.ptr(),
                                   lamp::NumericsCheckOptions().backward(false))
                   .observe(5, [&] { train_pass(net, x); }));
}

// A parameter's own gradient, made non-finite by a hook on it, is named by
// its module (and, where the observers cannot see it, by the parameter).
TEST(NumericsCheck, NamesTheModuleWhoseParameterGradientHoldsInf) {
  torch::manual_seed(0);
  Net net;
  net->head->weight.register_hook(
      [](const torch::Tensor& grad) { return grad * kInf; });
  const auto finding =
      lamp::NumericsCheck(net.ptr(), lamp::NumericsCheckOptions().stop(false))
          .observe(1, [&] {
            train_pass(net, torch::rand({8, 4}));
          });
  ASSERT_TRUE(finding);
  EXPECT_TRUE(finding->backward);
  EXPECT_EQ(finding->module, "head");
  // LibTorch 2.x runs the hook before the engine's observers see the
  // gradient (AccumulateGrad's input); 1.13 after it, where the check reads
  // the gradient from the parameter after the step.
  const auto text = finding->to_string();
  if (finding->parameter.empty()) {
    EXPECT_NE(finding->op.find("AccumulateGrad"), std::string::npos) << text;
    EXPECT_NE(text.find("step 1, backward: the gradient of the parameters of "
                        "module 'head' ("),
              std::string::npos)
        << text;
  } else {
    EXPECT_EQ(finding->parameter, "weight");
    EXPECT_NE(text.find("step 1, backward: the gradient of parameter "
                        "'head.weight' ("),
              std::string::npos)
        << text;
  }
}

// A NaN made by a parameter-free op is reported after the module that ran
// before it; a NaN in the input, before any module.
TEST(NumericsCheck, ParameterFreeOpsAndInputsAreNamedByTheirPlace) {
  torch::manual_seed(0);
  Net net;
  lamp::NumericsCheck check(net.ptr(),
                            lamp::NumericsCheckOptions().stop(false));
  auto after = check.observe(1, [&] {
    torch::log(net->stem(torch::rand({8, 4})) - 1e3).sum().backward();
  });
  ASSERT_TRUE(after);
  EXPECT_EQ(after->module, "stem");
  EXPECT_FALSE(after->in_module);
  EXPECT_EQ(after->op, "aten::log");
  EXPECT_NE(after->to_string().find("the output of aten::log, a "
                                    "parameter-free op after module 'stem'"),
            std::string::npos)
      << after->to_string();

  auto input = torch::rand({8, 4});
  input[0][0] = kNaN;
  auto before = check.observe(2, [&] { train_pass(net, input * 2); });
  ASSERT_TRUE(before);
  EXPECT_EQ(before->module, "");
  EXPECT_EQ(before->module_type, "");
  EXPECT_NE(before->to_string().find("before any module with parameters"),
            std::string::npos)
      << before->to_string();
}

// A Linear, then an LSTM, whose forward is one aten::lstm that takes all
// the LSTM's weights as one Tensor[].
struct RecurrentNetImpl : torch::nn::Module {
  RecurrentNetImpl()
      : fc(register_module("fc", torch::nn::Linear(4, 4))),
        lstm(register_module("lstm",
                             torch::nn::LSTM(torch::nn::LSTMOptions(4, 3)))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return std::get<0>(lstm->forward(fc->forward(x)));
  }
  torch::nn::Linear fc;
  torch::nn::LSTM lstm;
};
TORCH_MODULE(RecurrentNet);

TEST(NumericsCheck, NamesAnLstmWhoseWeightsArriveAsOneList) {
  torch::manual_seed(0);
  RecurrentNet net;
  fill(net->lstm->named_parameters()["weight_ih_l0"], kNaN);
  const auto finding =
      lamp::NumericsCheck(net.ptr(), lamp::NumericsCheckOptions().stop(false))
          .observe(1, [&] {
            train_pass(net, torch::rand({3, 2, 4})); // (time, batch, features)
          });
  ASSERT_TRUE(finding);
  EXPECT_FALSE(finding->backward);
  EXPECT_EQ(finding->module, "lstm") << finding->to_string();
  EXPECT_NE(finding->module_type.find("LSTMImpl"), std::string::npos)
      << finding->to_string();
  EXPECT_TRUE(finding->in_module) << finding->to_string();
  EXPECT_EQ(finding->op, "aten::lstm");
}

// Two weights cut from one parameter by chunk(), which returns its pieces
// as one Tensor[]: the op that uses a piece is still the module's own.
struct SplitScaleImpl : torch::nn::Module {
  SplitScaleImpl() { weight = register_parameter("weight", torch::ones({8})); }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto parts = weight.chunk(2);
    return x * parts[0] + parts[1];
  }
  torch::Tensor weight;
};
TORCH_MODULE(SplitScale);

struct SplitNetImpl : torch::nn::Module {
  SplitNetImpl()
      : fc(register_module("fc", torch::nn::Linear(4, 4))),
        split(register_module("split", SplitScale())) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return split->forward(fc->forward(x));
  }
  torch::nn::Linear fc;
  SplitScale split;
};
TORCH_MODULE(SplitNet);

TEST(NumericsCheck, WeightsCutByChunkStillBelongToTheirModule) {
  torch::manual_seed(0);
  SplitNet net;
  fill(net->split->weight[0], kNaN);
  const auto finding =
      lamp::NumericsCheck(net.ptr(), lamp::NumericsCheckOptions().stop(false))
          .observe(1, [&] {
            train_pass(net, torch::rand({2, 4}));
          });
  ASSERT_TRUE(finding);
  EXPECT_FALSE(finding->backward);
  EXPECT_EQ(finding->module, "split") << finding->to_string();
  EXPECT_TRUE(finding->in_module) << finding->to_string();
  EXPECT_EQ(finding->op, "aten::mul");
}

// Half-precision modules: values above half of 65504 are flagged although
// finite; the fraction is an option.
struct ScaleImpl : torch::nn::Module {
  ScaleImpl() {
    weight = register_parameter("weight", torch::ones({4}, torch::kHalf));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x * weight; }
  torch::Tensor weight;
};
TORCH_MODULE(Scale);

struct TwoScalesImpl : torch::nn::Module {
  TwoScalesImpl()
      : first(register_module("first", Scale())),
        second(register_module("second", Scale())) {}
  torch::Tensor forward(const torch::Tensor& x) { return second(first(x)); }
  Scale first, second;
};
TORCH_MODULE(TwoScales);

TEST(NumericsCheck, FlagsFp16ValuesAtTheEdgeOfTheRange) {
  TwoScales net;
  fill(net->second->weight, 200.0f);
  const auto x = torch::full({2, 4}, 150.0f, torch::kHalf);
  // 150 * 200 = 30000: under 32752, not flagged.
  lamp::NumericsCheck check(net.ptr());
  EXPECT_FALSE(check.observe(1, [&] { net->forward(x); }));
  // 300 * 200 = 60000: finite, but above half the range.
  fill(net->first->weight, 2.0f);
  const auto message =
      lamp_test::error_of([&] { check.observe(2, [&] { net->forward(x); }); });
  EXPECT_NE(message.find("step 2, forward: the output of module 'second'"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("holds FP16 values at the edge of its range (65504) "
                         "(largest magnitude 60000, Half)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("--precision amp-bf16"), std::string::npos) << message;
  // At fraction 1 only inf/NaN count.
  EXPECT_FALSE(
      lamp::NumericsCheck(net.ptr(),
                          lamp::NumericsCheckOptions().fp16_range_fraction(1))
          .observe(3, [&] { net->forward(x); }));
  // An overflow to inf is found in the first module.
  fill(net->first->weight, 500.0f);
  const auto overflow =
      lamp::NumericsCheck(net.ptr(), lamp::NumericsCheckOptions().stop(false))
          .observe(4, [&] { net->forward(x); });
  ASSERT_TRUE(overflow);
  EXPECT_EQ(overflow->module, "first");
  EXPECT_TRUE(overflow->non_finite);
  EXPECT_EQ(overflow->dtype, torch::kHalf);
}

// The largest magnitude, not the largest value: large negative FP16 values
// and a -inf beside finite ones are found, and their magnitude quoted.
TEST(NumericsCheck, FindsLargeNegativeValuesByTheirMagnitude) {
  TwoScales net;
  fill(net->second->weight, -200.0f);
  const auto x = torch::full({2, 4}, 300.0f, torch::kHalf);
  lamp::NumericsCheck check(net.ptr(),
                            lamp::NumericsCheckOptions().stop(false));
  const auto edge = check.observe(1, [&] { net->forward(x); });
  ASSERT_TRUE(edge);
  EXPECT_EQ(edge->module, "second");
  EXPECT_FALSE(edge->non_finite);
  EXPECT_EQ(edge->max_abs, 60000.0);
  EXPECT_NE(edge->to_string().find("(largest magnitude 60000, Half)"),
            std::string::npos)
      << edge->to_string();

  fill(net->second->weight, 1.0f);
  {
    torch::NoGradGuard no_grad;
    net->first->weight[2] = -kInf;
  }
  const auto minus_inf = check.observe(2, [&] {
    net->forward(torch::ones({2, 4}, torch::kHalf));
  });
  ASSERT_TRUE(minus_inf);
  EXPECT_EQ(minus_inf->module, "first");
  EXPECT_TRUE(minus_inf->non_finite);
  EXPECT_EQ(minus_inf->max_abs, kInf);
}

// FP64 values are judged in FP64: a finite 1e200 is not inf, and the
// largest magnitude is reported exactly; a real inf still stops.
TEST(NumericsCheck, Fp64ValuesBeyondFp32sRangeAreFinite) {
  torch::manual_seed(0);
  torch::nn::Linear fc(2, 2);
  fc->to(torch::kDouble);
  lamp::NumericsCheck check(fc.ptr(), lamp::NumericsCheckOptions().stop(false));
  const auto x = torch::full({1, 2}, 1e200, torch::kDouble);
  EXPECT_FALSE(check.observe(1, [&] { fc->forward(x).sum().backward(); }));
  auto with_inf = x.clone();
  with_inf[0][1] = std::numeric_limits<double>::infinity();
  const auto finding = check.observe(2, [&] { fc->forward(with_inf); });
  ASSERT_TRUE(finding);
  EXPECT_TRUE(finding->non_finite);
  EXPECT_EQ(finding->dtype, torch::kDouble);
  EXPECT_FALSE(finding->in_module);
  EXPECT_EQ(finding->max_abs, std::numeric_limits<double>::infinity());
}

// Under loss scaling only gradients are scaled: an FP16 activation at the
// edge of the range is reported in a loss-scaled step as in any other, and
// it is not marked loss-scaled.
TEST(NumericsCheck, ForwardFp16EdgesCountUnderLossScaling) {
  TwoScales net;
  fill(net->second->weight, 200.0f);
  const auto x = torch::full({2, 4}, 300.0f, torch::kHalf);
  const auto finding =
      lamp::NumericsCheck(net.ptr(), lamp::NumericsCheckOptions().stop(false))
          .observe(
              1, [&] { net->forward(x); }, /*loss_scaled=*/true);
  ASSERT_TRUE(finding);
  EXPECT_FALSE(finding->backward);
  EXPECT_EQ(finding->module, "second");
  EXPECT_FALSE(finding->loss_scaled);
  EXPECT_FALSE(finding->non_finite);
  // With stop(true) (the default) it ends the step with the FP16 advice.
  const auto message = lamp_test::error_of([&] {
    lamp::NumericsCheck(net.ptr()).observe(
        2, [&] { net->forward(x); }, /*loss_scaled=*/true);
  });
  EXPECT_NE(message.find("step 2, forward: the output of module 'second'"),
            std::string::npos)
      << message;
}

TEST(NumericsCheck, ErrorsInTheStepPassThroughAndLeaveNoObserver) {
  Net net;
  lamp::NumericsCheck check(net.ptr());
  EXPECT_THROW(check.observe(1,
                             [&] {
                               net->forward(torch::rand({8, 4}));
                               TORCH_CHECK(false, "the step failed");
                             }),
               c10::Error);
  // The next observation starts clean.
  EXPECT_FALSE(check.observe(2, [&] { train_pass(net, torch::rand({8, 4})); }));
  EXPECT_THROW(lamp::NumericsCheck(nullptr), c10::Error);
  EXPECT_THROW(
      lamp::NumericsCheck(net.ptr(),
                          lamp::NumericsCheckOptions().fp16_range_fraction(0)),
      c10::Error);
}

} // namespace
