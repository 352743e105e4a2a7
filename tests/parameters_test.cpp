// Tied weights: a tensor registered under two names (LibTorch's
// parameters() lists it twice, Python's once) is trained, clipped, counted,
// converted and exported once, exactly as if it were registered once.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "lamp/amp/grad_scaler.h"
#include "lamp/amp/half.h"
#include "lamp/amp/master_weights.h"
#include "lamp/amp/report.h"
#include "lamp/amp/train_step.h"
#include "lamp/distributed/data_parallel.h"
#include "lamp/distributed/process_group.h"
#include "lamp/models/mnist_cnn.h"
#include "lamp/models/resnet.h"
#include "lamp/models/state_dict.h"
#include "lamp/optim/clip.h"
#include "lamp/optim/optimizer.h"
#include "lamp/optim/sgd.h"
#include "lamp/platform/parameters.h"
#include "test_util.h"

namespace {

using lamp::Precision;
using lamp_test::BitEqual;

// The output layer reuses the encoder's weight (a tied embedding/output
// pair). `register_twice` registers it as the head's parameter too, the way
// such models are written; without, it is registered once (the reference).
struct TiedProjectionImpl : torch::nn::Module {
  torch::Tensor out_weight;
};
TORCH_MODULE(TiedProjection);

struct TiedNetImpl : torch::nn::Module {
  explicit TiedNetImpl(bool register_twice) {
    enc = register_module("enc", torch::nn::Linear(4, 3));
    head = register_module("head", TiedProjection());
    head->out_weight = enc->weight;
    if (register_twice) {
      head->register_parameter("out_weight", enc->weight);
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::tanh(enc(x)).matmul(head->out_weight);
  }
  torch::nn::Linear enc{nullptr};
  TiedProjection head{nullptr};
};
TORCH_MODULE(TiedNet);

// The tied net and its once-registered twin, with equal weights.
std::pair<TiedNet, TiedNet> tied_and_twin() {
  torch::manual_seed(7);
  TiedNet tied(true);
  TiedNet twin(false);
  torch::NoGradGuard no_grad;
  twin->enc->weight.copy_(tied->enc->weight);
  twin->enc->bias.copy_(tied->enc->bias);
  return {tied, twin};
}

// Gradients of one backward on a fixed batch.
void backward(TiedNet& net) {
  torch::manual_seed(8);
  const auto x = torch::randn({5, 4});
  const auto y = torch::randn({5, 4});
  torch::mse_loss(net->forward(x), y).backward();
}

TEST(TiedParameters, LibTorchListsATiedWeightTwice) {
  // What every test below guards against.
  TiedNet tied(true);
  EXPECT_EQ(tied->parameters().size(), 3u);
  EXPECT_TRUE(tied->parameters()[0].is_same(tied->parameters()[2]));
}

TEST(TiedParameters, UniqueParametersKeepTheFirstOfEach) {
  TiedNet tied(true);
  const auto params = lamp::unique_parameters(*tied);
  ASSERT_EQ(params.size(), 2u);
  EXPECT_TRUE(params[0].is_same(tied->enc->weight));
  EXPECT_TRUE(params[1].is_same(tied->enc->bias));
  const auto named = lamp::unique_named_parameters(*tied);
  EXPECT_EQ(named.keys(), (std::vector<std::string>{"enc.weight", "enc.bias"}));
  EXPECT_TRUE(
      lamp::unique_named_parameters(*tied->head, false)["out_weight"].is_same(
          tied->enc->weight));
  // Views of one storage are different tensors.
  const auto a = torch::zeros({4});
  const auto unique =
      lamp::unique_tensors({a, a.view({2, 2}), a, tied->enc->bias, a});
  ASSERT_EQ(unique.size(), 3u);
  EXPECT_TRUE(unique[0].is_same(a));
  EXPECT_TRUE(unique[2].is_same(tied->enc->bias));
}

class TiedTrainStep : public ::testing::TestWithParam<std::string> {};

lamp::TrainStepOptions tied_options(const std::string& mode) {
  if (mode == "bf16-flat") {
    return lamp::TrainStepOptions(Precision::kBF16).flat_master(true);
  }
  return lamp::TrainStepOptions(lamp::parse_precision(mode));
}

// One step moves the tied weight exactly as the twin's: the same ops on the
// same values in the same order, so bit for bit. (Stepped twice, the update
// is 2x in FP32 and ~1.99x in BF16.)
TEST_P(TiedTrainStep, StepsATiedWeightOnce) {
  auto nets = tied_and_twin();
  const auto before =
      nets.first->enc->weight.detach().to(torch::kFloat).clone();
  std::vector<torch::Tensor> after;
  for (auto* net : {&nets.first, &nets.second}) {
    lamp::TrainStep step(
        net->ptr(),
        // torch::optim's SGD keeps what it is given: the step itself must
        // hand the tied weight over once.
        [](std::vector<torch::Tensor> params) {
          return std::make_unique<torch::optim::SGD>(
              params, torch::optim::SGDOptions(0.5));
        },
        tied_options(GetParam()));
    torch::manual_seed(8);
    const auto x = torch::randn({5, 4});
    const auto y = torch::randn({5, 4});
    const auto result = step.step(x, y, [&](const auto& in, const auto& tgt) {
      return torch::mse_loss((*net)->forward(in).to(torch::kFloat), tgt);
    });
    ASSERT_TRUE(result.optimizer_stepped());
    after.push_back(step.master_weights() != nullptr
                        ? step.master_weights()->master_params()[0].detach()
                        : (*net)->enc->weight.detach().clone());
    EXPECT_EQ(step.optimizer().param_groups()[0].params().size(), 2u);
  }
  EXPECT_TRUE(nets.first->enc->weight.is_same(nets.first->head->out_weight));
  EXPECT_GT((after[1] - before).abs().max().item<double>(), 1e-3);
  EXPECT_TRUE(BitEqual(after[0], after[1]))
      << "tied update / single update = "
      << ((after[0] - before).norm() / (after[1] - before).norm())
             .item<double>();
}

INSTANTIATE_TEST_SUITE_P(, TiedTrainStep,
                         ::testing::Values("fp32", "amp-bf16", "bf16",
                                           "bf16-flat"),
                         [](const auto& info) {
                           auto name = info.param;
                           for (auto& c : name) {
                             c = c == '-' ? '_' : c;
                           }
                           return name;
                         });

TEST(TiedParameters, MasterWeightsHoldATiedWeightOnce) {
  TiedNet tied(true);
  for (bool flat : {false, true}) {
    lamp::MasterWeights master(tied->parameters(), flat);
    EXPECT_EQ(master.master_params().size(), 2u) << "flat " << flat;
    EXPECT_EQ(master.model_params().size(), 2u);
    // The names of all three registrations are accepted, the duplicate's
    // dropped with its tensor.
    master.set_parameter_names(tied->named_parameters().keys());
    if (flat) {
      EXPECT_EQ(master.flat_buffer().numel(), 15);
    }
  }
  const auto lists = lamp::prep_param_lists(*tied);
  EXPECT_EQ(lists.first.size(), 2u);
  EXPECT_EQ(lists.second.size(), 2u);
}

// An optimizer given parameters() (or groups built from it) steps the tied
// weight once: w - lr * g.
TEST(TiedParameters, OptimizersStepATiedWeightOnce) {
  for (const std::string name : {"sgd", "adam", "adamw"}) {
    for (bool no_bias_decay : {false, true}) {
      SCOPED_TRACE(name + (no_bias_decay ? " no_bias_decay" : ""));
      auto nets = tied_and_twin();
      std::vector<torch::Tensor> moved;
      for (auto* net : {&nets.first, &nets.second}) {
        auto optimizer = lamp::optim::make_optimizer(
            (*net)->parameters(), lamp::optim::OptimizerOptions()
                                      .name(name)
                                      .lr(0.1)
                                      .weight_decay(0.01)
                                      .no_bias_decay(no_bias_decay));
        size_t count = 0;
        for (const auto& group : optimizer->param_groups()) {
          count += group.params().size();
        }
        EXPECT_EQ(count, 2u);
        backward(*net);
        optimizer->step();
        moved.push_back((*net)->enc->weight.detach().clone());
      }
      EXPECT_TRUE(BitEqual(moved[0], moved[1]));
    }
  }
  TiedNet tied(true);
  lamp::optim::SGD sgd(tied->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_EQ(sgd.param_groups()[0].params().size(), 2u);
}

TEST(TiedParameters, OptimizersRefuseATensorInTwoGroups) {
  TiedNet tied(true);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{tied->enc->weight});
  groups.emplace_back(std::vector<torch::Tensor>{tied->head->out_weight});
  lamp_test::expect_error(
      [&] { lamp::optim::SGD(groups, torch::optim::SGDOptions(0.1)); },
      "in param groups 0 and 1");
}

// The norm is the twin's (the tied gradient counted once), and clipping
// scales it once.
TEST(TiedParameters, ClippingCountsATiedGradientOnce) {
  auto nets = tied_and_twin();
  backward(nets.first);
  backward(nets.second);
  const auto twin_norm =
      lamp::optim::clip_grad_norm_(nets.second->parameters(), 1e9);
  const auto norm = lamp::optim::clip_grad_norm_(nets.first->parameters(), 1e9);
  EXPECT_TRUE(BitEqual(norm, twin_norm));
  lamp::optim::clip_grad_norm_(nets.first->parameters(), 0.01);
  lamp::optim::clip_grad_norm_(nets.second->parameters(), 0.01);
  EXPECT_TRUE(BitEqual(nets.first->enc->weight.grad(),
                       nets.second->enc->weight.grad()));
}

// Unscaling divides a tied gradient once, also for an optimizer that lists
// it twice (torch::optim's keep what they are given).
TEST(TiedParameters, GradScalerUnscalesATiedGradientOnce) {
  auto nets = tied_and_twin();
  backward(nets.second);
  torch::optim::SGD optimizer(nets.first->parameters(), 0.1);
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(4.0));
  torch::manual_seed(8);
  const auto x = torch::randn({5, 4});
  const auto y = torch::randn({5, 4});
  scaler.scale(torch::mse_loss(nets.first->forward(x), y)).backward();
  scaler.unscale_(optimizer);
  EXPECT_TRUE(lamp_test::AllClose(nets.first->enc->weight.grad(),
                                  nets.second->enc->weight.grad(), 1e-6, 1e-7));
}

TEST(TiedParameters, DataParallelBucketsATiedWeightOnce) {
  auto nets = tied_and_twin();
  auto group = std::make_shared<lamp::distributed::ProcessGroup>(torch::kCPU);
  // A cap below every parameter's size: one bucket per parameter.
  const auto options =
      lamp::distributed::DataParallelOptions().bucket_cap_mb(1e-6);
  lamp::distributed::DataParallel tied(nets.first.ptr(), group, options);
  lamp::distributed::DataParallel twin(nets.second.ptr(), group, options);
  EXPECT_EQ(tied.bucket_count(), twin.bucket_count());
  EXPECT_EQ(tied.bucket_count(), 2);
  backward(nets.first);
  tied.finish_gradient_sync();
  backward(nets.second);
  twin.finish_gradient_sync();
  EXPECT_TRUE(BitEqual(nets.first->enc->weight.grad(),
                       nets.second->enc->weight.grad()));
}

TEST(TiedParameters, ReportAndCountListATiedWeightOnce) {
  TiedNet tied(true);
  const auto report = lamp::precision_report(*tied);
  ASSERT_EQ(report.tensors.size(), 2u);
  EXPECT_EQ(report.tensors[0].name, "enc.weight");
  EXPECT_EQ(report.tensors[1].name, "enc.bias");
  EXPECT_EQ(report.numel_by_dtype.at("Float"), 15);
  EXPECT_EQ(lamp::models::count_parameters(*tied), 15);
}

// Converted once, by the module that lists it first (here one converted to
// BF16, not the head kept in FP32), and still one tensor.
TEST(TiedParameters, NetworkToHalfConvertsATiedWeightOnce) {
  TiedNet tied(true);
  lamp::convert_network(*tied, lamp::HalfOptions(torch::kBFloat16)
                                   .keep_fp32([](const std::string& name,
                                                 const torch::nn::Module&) {
                                     return name == "head";
                                   }));
  EXPECT_EQ(tied->enc->weight.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(tied->enc->weight.is_same(tied->head->out_weight));
  EXPECT_TRUE(
      tied->enc->weight.is_same(tied->named_parameters()["head.out_weight"]));
}

// As Python's state_dict: both names, one tensor.
TEST(TiedParameters, StateDictExportKeepsBothNamesOfOneTensor) {
  lamp::models::MnistCNN model;
  model->fc->register_parameter("tied", model->conv1->weight);
  const auto dict = lamp::models::python_state_dict(*model, "cnn");
  ASSERT_TRUE(dict.contains("conv1.weight"));
  ASSERT_TRUE(dict.contains("fc.tied"));
  EXPECT_TRUE(dict.at("conv1.weight").is_same(dict.at("fc.tied")));
  EXPECT_EQ(dict.size(),
            model->named_parameters().size() + model->named_buffers().size());
}

} // namespace
