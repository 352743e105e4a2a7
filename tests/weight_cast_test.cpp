// lamp::nn::CastWeightsOnce against autocast's own casts: the same bits
// forward and backward, one autograd node for all the casts, nothing cast
// where autocast is off; lamp's GPT with GPTOptions::fused_weight_cast.
#include "lamp/nn/weight_cast.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "autograd_nodes.h"
#include "lamp/amp/autocast.h"
#include "lamp/amp/train_step.h"
#include "lamp/models/gpt.h"
#include "lamp/nn/attention.h"
#include "lamp/nn/float8.h"
#include "lamp/nn/linear.h"
#include "lamp/optim/adam.h"
#include "platform/compat.h"
#include "test_util.h"
#include "tiny_gpt.h"

namespace {

using lamp::nn::cast_weight;
using lamp::nn::CastWeightsOnce;
using lamp_test::BitEqual;

// The autograd node CastWeightsOnce records.
constexpr const char* kNode = "CastAllFunction";

// Two Linear layers with a ReLU between them, the second without a bias;
// random biases so that one left out would show.
struct TwoLayers : torch::nn::Module {
  TwoLayers() {
    first = register_module("first", torch::nn::Linear(12, 20));
    second = register_module(
        "second",
        torch::nn::Linear(torch::nn::LinearOptions(20, 6).bias(false)));
    torch::NoGradGuard no_grad;
    first->bias.normal_(0, 0.3);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return lamp::nn::linear(torch::relu(lamp::nn::linear(x, first)), second);
  }
  torch::nn::Linear first{nullptr}, second{nullptr};
};

struct Step {
  torch::Tensor out, x_grad;
  std::vector<torch::Tensor> grads;
  int nodes = 0;
};

// One forward and backward of `model` under CPU autocast (BF16), with or
// without the guard around the forward.
Step run(TwoLayers& model, const torch::Tensor& input, bool guard) {
  model.zero_grad();
  const auto x = input.clone().requires_grad_(true);
  lamp::Autocast autocast(torch::kCPU, torch::kBFloat16);
  std::optional<CastWeightsOnce> casts;
  if (guard) {
    casts.emplace(model);
  }
  Step s;
  s.out = model.forward(x);
  casts.reset();
  s.nodes = lamp_test::count_nodes_named(s.out, kNode);
  s.out.to(torch::kFloat).square().sum().backward();
  s.x_grad = x.grad();
  for (const auto& p : model.parameters()) {
    s.grads.push_back(p.grad());
  }
  return s;
}

TEST(CastWeightsOnce, MatchesAutocastsCastsToTheBit) {
  // The guard's casts are autocast's: the same output, the same input
  // gradient and the same FP32 parameter gradients, bit for bit; one node
  // holds every cast.
  torch::manual_seed(3);
  TwoLayers model;
  const auto x = torch::randn({5, 7, 12});
  const auto want = run(model, x, /*guard=*/false);
  const auto got = run(model, x, /*guard=*/true);
  EXPECT_EQ(got.out.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(BitEqual(got.out, want.out));
  EXPECT_TRUE(BitEqual(got.x_grad, want.x_grad));
  ASSERT_EQ(got.grads.size(), 3u);
  for (size_t i = 0; i < got.grads.size(); ++i) {
    ASSERT_TRUE(got.grads[i].defined()) << "parameter " << i;
    EXPECT_EQ(got.grads[i].scalar_type(), torch::kFloat) << "parameter " << i;
    EXPECT_TRUE(BitEqual(got.grads[i], want.grads[i])) << "parameter " << i;
  }
  EXPECT_EQ(got.nodes, 1);
  EXPECT_EQ(want.nodes, 0);
}

TEST(CastWeightsOnce, CastsEachLinearTensorOnceWhileItLives) {
  torch::manual_seed(4);
  auto model = std::make_shared<TwoLayers>();
  // The same layer twice in one tree is cast once.
  auto outer = torch::nn::Sequential(model, model);
  lamp::Autocast autocast(torch::kCPU, torch::kBFloat16);
  {
    CastWeightsOnce casts(*outer);
    EXPECT_EQ(casts.size(), 3u); // first.weight, first.bias, second.weight
    const auto w = cast_weight(model->first->weight);
    EXPECT_EQ(w.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(BitEqual(w, model->first->weight.to(torch::kBFloat16)));
    EXPECT_TRUE(BitEqual(casts.find(model->first->bias),
                         model->first->bias.to(torch::kBFloat16)));
    // A tensor it did not cast comes back as itself.
    const auto other = torch::randn({3});
    EXPECT_TRUE(cast_weight(other).is_same(other));
    EXPECT_FALSE(casts.find(other).defined());
    EXPECT_FALSE(cast_weight(torch::Tensor()).defined());
  }
  // Gone with the guard.
  EXPECT_TRUE(cast_weight(model->first->weight).is_same(model->first->weight));
}

TEST(CastWeightsOnce, CastsNothingWithoutAutocast) {
  // Without autocast linear runs in FP32: nothing to cast, no node.
  torch::manual_seed(5);
  TwoLayers model;
  CastWeightsOnce casts(model);
  EXPECT_EQ(casts.size(), 0u);
  EXPECT_TRUE(cast_weight(model.first->weight).is_same(model.first->weight));
  const auto y = model.forward(torch::randn({2, 12}, torch::requires_grad()));
  EXPECT_EQ(y.scalar_type(), torch::kFloat);
  EXPECT_EQ(lamp_test::count_nodes_named(y, kNode), 0);
}

TEST(CastWeightsOnce, LeavesParametersOfItsDtypeToAutocast) {
  // A model already in BF16 (network_to_half's) has nothing autocast casts.
  torch::manual_seed(6);
  TwoLayers model;
  model.to(torch::kBFloat16);
  lamp::Autocast autocast(torch::kCPU, torch::kBFloat16);
  CastWeightsOnce casts(model);
  EXPECT_EQ(casts.size(), 0u);
}

TEST(CastWeightsOnce, SendsNoGradientToALayerLeftOut) {
  // A layer the forward does not use gets no gradient (not a zero one);
  // the one used gets autocast's.
  torch::manual_seed(7);
  TwoLayers model;
  lamp::Autocast autocast(torch::kCPU, torch::kBFloat16);
  torch::Tensor y;
  {
    CastWeightsOnce casts(model);
    EXPECT_EQ(casts.size(), 3u);
    y = lamp::nn::linear(torch::randn({4, 12}), model.first);
  }
  y.to(torch::kFloat).sum().backward();
  EXPECT_TRUE(model.first->weight.grad().defined());
  EXPECT_TRUE(model.first->bias.grad().defined());
  EXPECT_FALSE(model.second->weight.grad().defined());
}

TEST(CastWeightsOnce, NestedGuardsFindTheirOwnCasts) {
  torch::manual_seed(8);
  TwoLayers a, b;
  lamp::Autocast autocast(torch::kCPU, torch::kBFloat16);
  CastWeightsOnce outer(a);
  const auto a_cast = cast_weight(a.first->weight);
  {
    CastWeightsOnce inner(b);
    EXPECT_TRUE(cast_weight(a.first->weight).is_same(a_cast));
    EXPECT_EQ(cast_weight(b.first->weight).scalar_type(), torch::kBFloat16);
  }
  EXPECT_TRUE(cast_weight(a.first->weight).is_same(a_cast));
  EXPECT_TRUE(cast_weight(b.first->weight).is_same(b.first->weight));
}

// Guards destroyed out of order (optionals reset first to last) leave the
// nesting one by one: the others keep handing out their casts, and with
// all gone every parameter is its own again, the forward autocast's.
TEST(CastWeightsOnce, GuardsDestroyedOutOfOrderLeaveTheRestWorking) {
  torch::manual_seed(9);
  TwoLayers a, b, c;
  const auto x = torch::randn({3, 12});
  lamp::Autocast autocast(torch::kCPU, torch::kBFloat16);
  const auto want = c.forward(x);
  const auto cast_of = [](const torch::Tensor& p) {
    return !cast_weight(p).is_same(p);
  };
  std::optional<CastWeightsOnce> outer, middle, inner;
  outer.emplace(a);
  middle.emplace(b);
  inner.emplace(c);
  middle.reset();
  EXPECT_TRUE(cast_of(a.first->weight));
  EXPECT_FALSE(cast_of(b.first->weight));
  EXPECT_TRUE(cast_of(c.first->weight));
  outer.reset(); // before the innermost
  EXPECT_FALSE(cast_of(a.first->weight));
  EXPECT_TRUE(cast_of(c.first->weight));
  inner.reset();
  for (const auto* model : {&a, &b, &c}) {
    EXPECT_FALSE(cast_of(model->first->weight));
    EXPECT_FALSE(cast_of(model->second->weight));
  }
  EXPECT_TRUE(BitEqual(c.forward(x), want));
  // A guard made now is the innermost, and alone.
  CastWeightsOnce again(b);
  EXPECT_TRUE(cast_of(b.first->weight));
  EXPECT_FALSE(cast_of(c.first->weight));
}

TEST(CastWeightsOnce, CastsFrozenLayersWithoutANode) {
  // A frozen layer's casts send no gradient back (no weight gradient is
  // computed for them, as with autocast's own casts); the trainable
  // layer's casts go through the node, and its gradient is autocast's.
  torch::manual_seed(11);
  TwoLayers model;
  const auto x = torch::randn({4, 12});
  const auto want = run(model, x, /*guard=*/false);
  model.zero_grad(/*set_to_none=*/true);
  for (const auto& p : model.first->parameters()) {
    p.requires_grad_(false);
  }
  lamp::Autocast autocast(torch::kCPU, torch::kBFloat16);
  torch::Tensor y;
  {
    CastWeightsOnce casts(model);
    EXPECT_EQ(casts.size(), 3u);
    const auto frozen = cast_weight(model.first->weight);
    EXPECT_EQ(frozen.scalar_type(), torch::kBFloat16);
    EXPECT_FALSE(frozen.requires_grad());
    EXPECT_FALSE(cast_weight(model.first->bias).requires_grad());
    EXPECT_TRUE(cast_weight(model.second->weight).requires_grad());
    y = model.forward(x);
  }
  EXPECT_TRUE(BitEqual(y, want.out));
  EXPECT_EQ(lamp_test::count_nodes_named(y, kNode), 1);
  y.to(torch::kFloat).square().sum().backward();
  EXPECT_FALSE(model.first->weight.grad().defined());
  EXPECT_TRUE(BitEqual(model.second->weight.grad(), want.grads[2]));
}

TEST(CastWeightsOnce, CastsWithoutANodeWhenGradModeIsOff) {
  torch::manual_seed(12);
  TwoLayers model;
  lamp::Autocast autocast(torch::kCPU, torch::kBFloat16);
  torch::NoGradGuard no_grad;
  CastWeightsOnce casts(model);
  EXPECT_EQ(casts.size(), 3u);
  const auto w = cast_weight(model.first->weight);
  EXPECT_FALSE(w.requires_grad());
  EXPECT_TRUE(BitEqual(w, model.first->weight.to(torch::kBFloat16)));
}

TEST(CastWeightsOnce, HandsOutNoCastWhereAutocastNoLongerMakesIt) {
  // Inside the guard, a region with autocast off runs linear in FP32 (a
  // BF16 cast there would make torch::linear refuse FP32 input), and a
  // parameter converted since it was cast is not handed a stale cast.
  torch::manual_seed(13);
  TwoLayers model;
  const auto x = torch::randn({3, 12});
  const auto fp32 = model.forward(x);
  lamp::Autocast autocast(torch::kCPU, torch::kBFloat16);
  CastWeightsOnce casts(model);
  ASSERT_EQ(cast_weight(model.first->weight).scalar_type(), torch::kBFloat16);
  {
    lamp::Autocast off(torch::kCPU, c10::nullopt, /*enabled=*/false);
    EXPECT_TRUE(cast_weight(model.first->weight).is_same(model.first->weight));
    const auto y = model.forward(x);
    EXPECT_EQ(y.scalar_type(), torch::kFloat);
    EXPECT_TRUE(BitEqual(y, fp32));
  }
  EXPECT_EQ(cast_weight(model.first->weight).scalar_type(), torch::kBFloat16);
  model.to(torch::kDouble); // Module::to keeps the parameters' TensorImpls
  EXPECT_TRUE(cast_weight(model.first->weight).is_same(model.first->weight));
}

TEST(CastWeightsOnce, LeavesFP8LayersTheirOwnCasts) {
#if !LAMP_TORCH_FLOAT8
  GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no FP8 dtypes";
#endif
  torch::manual_seed(9);
  auto model = std::make_shared<TwoLayers>();
  // FP8 wants sizes in multiples of 16: only the first layer converts.
  model->first = model->replace_module("first", torch::nn::Linear(16, 32));
  model->second = model->replace_module("second", torch::nn::Linear(32, 6));
  lamp::nn::convert_to_float8(
      *model, {}, [](const std::string& name, const torch::nn::LinearImpl&) {
        return name == "first";
      });
  ASSERT_NE(lamp::nn::float8_state(*model->first), nullptr);
  lamp::Autocast autocast(torch::kCPU, torch::kBFloat16);
  CastWeightsOnce casts(*model);
  EXPECT_EQ(casts.size(), 2u); // second.weight, second.bias
  EXPECT_TRUE(cast_weight(model->first->weight).is_same(model->first->weight));
}

TEST(CastWeightsOnce, PathNamesHowItCasts) {
  // A device needs no GPU to be named.
  if (LAMP_TORCH_FOREACH_COPY) {
    EXPECT_EQ(lamp::nn::cast_weights_once_path(torch::Device(torch::kCUDA, 0)),
              "multi-tensor kernels each way (at::_foreach_copy_)");
    EXPECT_EQ(lamp::nn::cast_weights_once_path(torch::kCPU),
              "at::_foreach_copy_, a copy per tensor on cpu");
  } else {
    for (const auto& device :
         {torch::Device(torch::kCUDA, 0), torch::Device(torch::kCPU)}) {
      EXPECT_EQ(lamp::nn::cast_weights_once_path(device),
                std::string("a copy per tensor: LibTorch ") + TORCH_VERSION +
                    " has no at::_foreach_copy_");
    }
  }
}

// --- lamp's GPT with GPTOptions::fused_weight_cast --------------------------

using lamp::models::GPT;
using lamp::models::GPTOptions;

using lamp_test::tiny_gpt;

struct GptStep {
  torch::Tensor loss;
  std::vector<torch::Tensor> grads;
  int nodes = 0;
  int around = 0;
};

// How many of the Linear layers' parameters the graph behind `root` sends
// a gradient to from a node other than the casts' own: with every weight
// taken from the guard, none (a layer or fused op that cast for itself
// would show here, whatever its bits).
int linear_parameters_fed_around_the_casts(torch::nn::Module& model,
                                           const torch::Tensor& root) {
  std::set<const torch::autograd::Node*> accumulators;
  for (const auto& module : model.modules()) {
    if (const auto* layer =
            dynamic_cast<const torch::nn::LinearImpl*>(module.get())) {
      for (const auto& p : {layer->weight, layer->bias}) {
        if (p.defined()) {
          accumulators.insert(torch::autograd::impl::grad_accumulator(p).get());
        }
      }
    }
  }
  int fed = 0;
  lamp_test::for_each_node(root, [&](const torch::autograd::Node& node) {
    if (node.name().find(kNode) != std::string::npos) {
      return; // the casts' own node
    }
    for (const auto& edge : node.next_edges()) {
      fed += static_cast<int>(accumulators.count(edge.function.get()));
    }
  });
  return fed;
}

GptStep gpt_step(GPT& gpt, const torch::Tensor& tokens,
                 const torch::Tensor& targets) {
  gpt->zero_grad();
  const auto loss = gpt->loss(tokens, targets);
  loss.backward();
  GptStep s{loss.detach(),
            {},
            lamp_test::count_nodes_named(loss, kNode),
            linear_parameters_fed_around_the_casts(*gpt, loss)};
  for (const auto& item : gpt->named_parameters()) {
    EXPECT_TRUE(item.value().grad().defined()) << item.key();
    s.grads.push_back(item.value().grad().defined()
                          ? item.value().grad().clone()
                          : torch::Tensor());
  }
  return s;
}

// The same loss and gradients with the casts in one pass as without, bit
// for bit, on `device`; `fused` adds the GPT's other opt-in fused ops.
void expect_gpt_matches(const torch::Device& device, bool fused,
                        bool checkpointing) {
  const auto options = tiny_gpt()
                           .gelu(lamp::models::GPTGelu::kTanh)
                           .fused_add_norm(fused)
                           .fused_mlp(fused)
                           .fused_head_loss(fused)
                           .activation_checkpointing(checkpointing);
  torch::manual_seed(31);
  GPT plain(options);
  GPT cast(GPTOptions(options).fused_weight_cast(true));
  lamp_test::copy_perturbed_parameters(*plain, *cast);
  plain->to(device);
  cast->to(device);
  const auto tokens = torch::randint(0, 30, {2, 8}, torch::kLong).to(device);
  const auto targets = torch::randint(0, 30, {2, 8}, torch::kLong).to(device);
  lamp::Autocast autocast(device.type(), torch::kBFloat16);
  const auto want = gpt_step(plain, tokens, targets);
  const auto got = gpt_step(cast, tokens, targets);
  SCOPED_TRACE(std::string(fused ? "fused ops" : "stock ops") +
               (checkpointing ? ", checkpointing" : ""));
  if (device.is_cuda()) {
    // The comparison assumes the unfused step repeats its own bits here
    // (no atomic sums): said apart, so that a failure names its cause.
    const auto again = gpt_step(plain, tokens, targets);
    bool repeats = BitEqual(again.loss, want.loss);
    for (size_t i = 0; i < want.grads.size(); ++i) {
      repeats = repeats && BitEqual(again.grads[i], want.grads[i]);
    }
    ASSERT_TRUE(repeats) << "the unfused step does not repeat its own bits "
                            "on this device: the comparison below would say "
                            "nothing of the casts";
  }
  EXPECT_TRUE(BitEqual(got.loss, want.loss));
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < got.grads.size(); ++i) {
    EXPECT_TRUE(BitEqual(got.grads[i], want.grads[i])) << "parameter " << i;
  }
  // One node for all the blocks' casts, through which every Linear
  // parameter's gradient comes (2 layers of 4 Linears, each with a bias);
  // none where the blocks recompute.
  EXPECT_EQ(got.nodes, checkpointing ? 0 : 1);
  EXPECT_EQ(want.nodes, 0);
  if (!checkpointing) {
    EXPECT_EQ(got.around, 0);
    EXPECT_EQ(want.around, 16);
  }
}

TEST(CastWeightsOnce, GptWithFusedWeightCastTrainsAsAutocastsOwn) {
  for (const bool fused : {false, true}) {
    for (const bool checkpointing : {false, true}) {
      expect_gpt_matches(torch::kCPU, fused, checkpointing);
    }
  }
}

TEST(CastWeightsOnce, GptWithFusedWeightCastGeneratesAsWithout) {
  // Generation (eval, no grad, the KV cache): the same logits, the whole
  // prompt and then one token.
  torch::manual_seed(32);
  GPT plain(tiny_gpt());
  GPT cast(GPTOptions(tiny_gpt()).fused_weight_cast(true));
  lamp_test::copy_perturbed_parameters(*plain, *cast);
  plain->eval();
  cast->eval();
  torch::NoGradGuard no_grad;
  lamp::Autocast autocast(torch::kCPU, torch::kBFloat16);
  const auto tokens = torch::randint(0, 30, {1, 6}, torch::kLong);
  lamp::models::GPTKVCache plain_cache(*plain, 1), cast_cache(*cast, 1);
  plain->set_kv_cache(&plain_cache);
  cast->set_kv_cache(&cast_cache);
  for (const auto& part : {tokens.slice(1, 0, 5), tokens.slice(1, 5, 6)}) {
    EXPECT_TRUE(BitEqual(cast->forward(part), plain->forward(part)));
  }
  plain->set_kv_cache(nullptr);
  cast->set_kv_cache(nullptr);
}

// --- CUDA ------------------------------------------------------------------

TEST(CastWeightsOnce, GptWithFusedWeightCastTrainsAsAutocastsOwn_CUDA) {
  // The multi-tensor cast on a GPU (one kernel a list), with every fused op
  // of the GPT; attention by the math backend, whose backward has no atomic
  // adds, so that two runs can agree to the bit.
  LAMP_SKIP_WITHOUT_CUDA();
  lamp::nn::SdpaBackendGuard math({lamp::nn::SdpaBackend::kMath});
  for (const bool fused : {false, true}) {
    expect_gpt_matches(torch::kCUDA, fused, /*checkpointing=*/false);
  }
}

TEST(CastWeightsOnce, GptTrainStepsInACapturedGraphAsAutocastsOwn_CUDA) {
  // TrainStep's CUDA graph replays the guard's casts (allocated in the
  // graph's pool, refilled by each replay from the updated weights): its
  // steps give the graph's weights without the guard, bit for bit, in
  // amp-bf16 and in amp (FP16 with the loss scale). Attention by the math
  // backend and lamp's fused AdamW, so that the runs can agree to the bit.
  LAMP_SKIP_WITHOUT_CUDA();
  lamp::nn::SdpaBackendGuard math({lamp::nn::SdpaBackend::kMath});
  const torch::Device cuda(torch::kCUDA);
  for (const auto precision :
       {lamp::Precision::kAMPBF16, lamp::Precision::kAMP}) {
    SCOPED_TRACE(lamp::to_string(precision));
    // The graph without the guard twice (which must repeat its own bits
    // for the comparison to say anything of the casts), then with it.
    std::vector<std::vector<torch::Tensor>> weights;
    for (const bool cast_once : {false, false, true}) {
      torch::manual_seed(41);
      GPT gpt(GPTOptions(tiny_gpt()).fused_weight_cast(cast_once));
      gpt->to(cuda);
      lamp::TrainStep step(
          gpt.ptr(),
          [](std::vector<torch::Tensor> p) {
            return std::make_unique<lamp::optim::AdamW>(
                std::move(p), torch::optim::AdamWOptions(3e-3));
          },
          lamp::TrainStepOptions(precision).cuda_graph(true));
      torch::manual_seed(42);
      for (int i = 0; i < 6; ++i) {
        const auto tokens = torch::randint(0, 30, {4, 8}, torch::kLong);
        const auto targets = torch::randint(0, 30, {4, 8}, torch::kLong);
        const auto result =
            step.step(tokens.to(cuda), targets.to(cuda),
                      [&](const torch::Tensor& x, const torch::Tensor& y) {
                        return gpt->loss(x, y);
                      });
        ASSERT_TRUE(std::isfinite(result.loss.item<double>())) << "step " << i;
      }
      EXPECT_GE(step.cuda_graph_captures(), 1);
      std::vector<torch::Tensor> w;
      for (const auto& p : gpt->parameters()) {
        w.push_back(p.detach().cpu());
      }
      weights.push_back(w);
    }
    bool repeats = weights[1].size() == weights[0].size();
    for (size_t i = 0; repeats && i < weights[0].size(); ++i) {
      repeats = BitEqual(weights[1][i], weights[0][i]);
    }
    ASSERT_TRUE(repeats) << "the graph's steps without the guard do not "
                            "repeat their own bits on this device: the "
                            "comparison below would say nothing of the casts";
    ASSERT_EQ(weights[2].size(), weights[0].size());
    for (size_t i = 0; i < weights[0].size(); ++i) {
      EXPECT_TRUE(BitEqual(weights[2][i], weights[0][i])) << "parameter " << i;
    }
  }
}

} // namespace
