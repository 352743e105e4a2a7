// TrainStep's CUDA-graph step: what a graph bakes in and how a change is
// noticed (detail::CaptureSignature, CPU-visible), the SGD first step that
// needs no host read, and on a GPU the re-captures, `.grad` after replays
// and the pool's memory.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "amp/capture_signature.h"
#include "lamp/amp/train_step.h"
#include "lamp/models/registry.h"
#include "lamp/optim/adam.h"
#include "lamp/optim/sgd.h"
#include "lamp/platform/backends.h"
#include "lamp/platform/parameters.h"
#include "test_util.h"

namespace {

using lamp::Precision;
using lamp_test::AllClose;
using lamp_test::SmallNet;

// ------------------------------------------------------- CaptureSignature

// The fused kernels where this LibTorch has them on the CPU (>= 2.4), so
// that the CPU tests run the path a CUDA graph captures; kAuto otherwise.
lamp::optim::Implementation fused_where_available() {
  const bool fused =
      lamp::optim::SGD({torch::zeros({2}, torch::requires_grad())},
                       torch::optim::SGDOptions(0.1))
          .implementation() == lamp::optim::Implementation::kFused;
  return fused ? lamp::optim::Implementation::kFused
               : lamp::optim::Implementation::kAuto;
}

struct Watched {
  SmallNet model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  lamp::GradScaler scaler;
  lamp::detail::CaptureSignature signature;

  Watched(std::unique_ptr<torch::optim::Optimizer> opt, SmallNet net)
      : model(std::move(net)),
        optimizer(std::move(opt)),
        signature(model.ptr(),
                  lamp::TrainStepOptions(Precision::kFP32).max_grad_norm(1)) {
    signature.record(*optimizer, scaler);
  }

  // `change` makes changed() name `fragment`; `undo` makes it empty again.
  void expect(const std::string& fragment, const std::function<void()>& change,
              const std::function<void()>& undo) {
    SCOPED_TRACE(fragment);
    EXPECT_EQ(signature.changed(*optimizer, scaler), "");
    change();
    const auto what = signature.changed(*optimizer, scaler);
    EXPECT_NE(what.find(fragment), std::string::npos) << what;
    undo();
    EXPECT_EQ(signature.changed(*optimizer, scaler), "");
  }
};

template <typename Options>
Options& options_of(torch::optim::Optimizer& optimizer, size_t group = 0) {
  return static_cast<Options&>(optimizer.param_groups()[group].options());
}

TEST(CaptureSignature, EachSgdSettingFlipsItTheLearningRateDoesNot) {
  SmallNet net;
  Watched w(std::make_unique<lamp::optim::SGD>(
                lamp::unique_parameters(*net),
                torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-4)),
            net);
  auto& o = options_of<torch::optim::SGDOptions>(*w.optimizer);
  // The learning rate is read from a device tensor: no re-capture.
  o.lr(0.05);
  EXPECT_EQ(w.signature.changed(*w.optimizer, w.scaler), "");

  w.expect(
      "param group 0's momentum (0.9 -> 0.5)", [&] { o.momentum(0.5); },
      [&] { o.momentum(0.9); });
  w.expect(
      "param group 0's dampening (0 -> 0.1)", [&] { o.dampening(0.1); },
      [&] { o.dampening(0.0); });
  w.expect(
      "param group 0's weight_decay (0.0001 -> 0)", [&] { o.weight_decay(0); },
      [&] { o.weight_decay(1e-4); });
  w.expect(
      "param group 0's nesterov (false -> true)", [&] { o.nesterov(true); },
      [&] { o.nesterov(false); });

  // Param groups: how many, their sizes, which tensors.
  auto extra = torch::zeros({3}, torch::requires_grad());
  w.expect(
      "the number of param groups (1 -> 2)",
      [&] {
        w.optimizer->add_param_group(torch::optim::OptimizerParamGroup(
            {extra}, std::make_unique<torch::optim::SGDOptions>(0.1)));
      },
      [&] { w.optimizer->param_groups().pop_back(); });
  auto& params = w.optimizer->param_groups()[0].params();
  const auto last = params.back();
  w.expect(
      "the number of parameters in param group 0", [&] { params.pop_back(); },
      [&] { params.push_back(last); });
  w.expect(
      "the tensor of parameter", [&] { params.back() = extra; },
      [&] { params.back() = last; });

  // The model: requires_grad, train/eval mode per module, storage.
  w.expect(
      "requires_grad of parameter 'fc.weight' (true -> false)",
      [&] { net->fc->weight.requires_grad_(false); },
      [&] { net->fc->weight.requires_grad_(true); });
  w.expect(
      "the train/eval mode of the model (train -> eval)", [&] { net->eval(); },
      [&] { net->train(); });
  w.expect(
      "the train/eval mode of module 'bn2' (train -> eval)",
      [&] { net->bn2->eval(); }, [&] { net->bn2->train(); });
  const auto rerecord = [&] { w.signature.record(*w.optimizer, w.scaler); };
  w.expect(
      "the storage of parameter 0 of param group 0 ('conv1.weight') (moved or loaded)",
      [&] { net->conv1->weight.set_data(net->conv1->weight.data().clone()); },
      rerecord);
  const auto mean = net->bn1->running_mean.data();
  w.expect(
      "the storage of buffer 'bn1.running_mean'",
      [&] { net->bn1->running_mean.set_data(mean.clone()); },
      [&] { net->bn1->running_mean.set_data(mean); });

  // The scaler's update settings (a load may change them).
  auto state = w.scaler.state_dict();
  state.insert_or_assign("growth_factor", 3.0);
  auto before = w.scaler.state_dict();
  w.expect(
      "the GradScaler's growth_factor (2 -> 3)",
      [&] { w.scaler.load_state_dict(state); },
      [&] { w.scaler.load_state_dict(before); });

  // A load of the optimizer replaces its state tensors.
  torch::serialize::OutputArchive archive;
  w.optimizer->save(archive);
  w.expect(
      "the optimizer's state (loaded)",
      [&] { w.optimizer->load(*lamp_test::reopened(archive)); }, rerecord);
}

TEST(CaptureSignature, EachAdamSettingFlipsIt) {
  for (bool decoupled : {false, true}) {
    SCOPED_TRACE(decoupled ? "AdamW" : "Adam");
    SmallNet net;
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    if (decoupled) {
      optimizer = std::make_unique<lamp::optim::AdamW>(
          lamp::unique_parameters(*net), torch::optim::AdamWOptions(1e-3));
    } else {
      optimizer = std::make_unique<lamp::optim::Adam>(
          lamp::unique_parameters(*net), torch::optim::AdamOptions(1e-3));
    }
    Watched w(std::move(optimizer), net);
    const auto check = [&](auto& o) {
      o.lr(0.5);
      EXPECT_EQ(w.signature.changed(*w.optimizer, w.scaler), "");
      w.expect(
          "param group 0's betas[0] (0.9 -> 0.8)",
          [&] { o.betas(std::make_tuple(0.8, 0.999)); },
          [&] { o.betas(std::make_tuple(0.9, 0.999)); });
      w.expect(
          "param group 0's betas[1] (0.999 -> 0.99)",
          [&] { o.betas(std::make_tuple(0.9, 0.99)); },
          [&] { o.betas(std::make_tuple(0.9, 0.999)); });
      w.expect(
          "param group 0's eps (1e-08 -> 1e-06)", [&] { o.eps(1e-6); },
          [&] { o.eps(1e-8); });
      w.expect(
          "param group 0's amsgrad (false -> true)", [&] { o.amsgrad(true); },
          [&] { o.amsgrad(false); });
      const double decay = o.weight_decay();
      w.expect(
          "param group 0's weight_decay", [&] { o.weight_decay(0.5); },
          [&] { o.weight_decay(decay); });
    };
    if (decoupled) {
      check(options_of<torch::optim::AdamWOptions>(*w.optimizer));
    } else {
      check(options_of<torch::optim::AdamOptions>(*w.optimizer));
    }
  }
}

// The signature asks the optimizer what its captured step bakes in
// (optim::AmpStep::baked_in_options, pure virtual: every optimizer answers).
static_assert(std::is_abstract<lamp::optim::AmpStep>::value,
              "an optimizer must say what a captured step bakes in");

// An SGD with host-side settings of its own, reported to the signature.
class TemperedSgd : public lamp::optim::SGD {
 public:
  using lamp::optim::SGD::SGD;
  void baked_in_options(const torch::optim::OptimizerParamGroup& group,
                        BakedOptionVisitor visit) const override {
    lamp::optim::SGD::baked_in_options(group, visit);
    visit({"temperature", temperature});
    visit({"annealed", annealed ? 1.0 : 0.0, /*flag=*/true});
  }
  double temperature = 1.0;
  bool annealed = false;
};

// An SGD that reports nothing baked in.
class NothingBakedSgd : public lamp::optim::SGD {
 public:
  using lamp::optim::SGD::SGD;
  void baked_in_options(const torch::optim::OptimizerParamGroup& /*group*/,
                        BakedOptionVisitor /*visit*/) const override {}
};

TEST(CaptureSignature, WatchesWhatANewOptimizerReports) {
  SmallNet net;
  auto optimizer = std::make_unique<TemperedSgd>(
      lamp::unique_parameters(*net),
      torch::optim::SGDOptions(0.1).momentum(0.9));
  auto* tempered = optimizer.get();
  Watched w(std::move(optimizer), net);
  w.expect(
      "param group 0's temperature (1 -> 2.5)",
      [&] { tempered->temperature = 2.5; },
      [&] { tempered->temperature = 1.0; });
  w.expect(
      "param group 0's annealed (false -> true)",
      [&] { tempered->annealed = true; }, [&] { tempered->annealed = false; });
  // What the base reports still counts.
  auto& o = options_of<torch::optim::SGDOptions>(*w.optimizer);
  w.expect(
      "param group 0's momentum (0.9 -> 0.5)", [&] { o.momentum(0.5); },
      [&] { o.momentum(0.9); });
}

// The signature has no list of optimizers of its own: an SGD that reports
// nothing is not watched for its momentum (its type, groups and tensors
// still are).
TEST(CaptureSignature, WatchesOnlyWhatTheOptimizerReports) {
  SmallNet net;
  Watched w(std::make_unique<NothingBakedSgd>(
                lamp::unique_parameters(*net),
                torch::optim::SGDOptions(0.1).momentum(0.9)),
            net);
  options_of<torch::optim::SGDOptions>(*w.optimizer).momentum(0.5);
  EXPECT_EQ(w.signature.changed(*w.optimizer, w.scaler), "");
  w.expect(
      "the train/eval mode of the model (train -> eval)", [&] { net->eval(); },
      [&] { net->train(); });
}

// What the check costs per step for a ResNet-50 (161 parameters, 53
// BatchNorms, their buffers and every module): host values only.
TEST(CaptureSignature, CostsMicrosecondsForAResNet50) {
  auto model = lamp::models::make_model("resnet50").module;
  lamp::optim::SGD sgd(lamp::unique_parameters(*model),
                       torch::optim::SGDOptions(0.1).momentum(0.9));
  lamp::GradScaler scaler;
  lamp::detail::CaptureSignature signature(model, lamp::TrainStepOptions());
  signature.record(sgd, scaler);
  EXPECT_EQ(signature.changed(sgd, scaler), "");
  const int calls = 2000;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) {
    if (!signature.changed(sgd, scaler).empty()) {
      FAIL() << "changed without a change";
    }
  }
  const double us = std::chrono::duration<double, std::micro>(
                        std::chrono::steady_clock::now() - start)
                        .count() /
                    calls;
  std::cout << "[ CaptureSignature ] ResNet-50 ("
            << sgd.param_groups()[0].params().size() << " parameters): " << us
            << " us per check\n";
  ::testing::Test::RecordProperty("microseconds_per_check", std::to_string(us));
  // A gross regression guard only (a loaded 2-core machine measured ~10 us).
  EXPECT_LT(us, 2000.0);
}

// ------------------------------------------- SGD's first step, sync-free

torch::optim::SGDOptions dampened(bool nesterov) {
  // Nesterov needs dampening 0 in torch::optim; with it, no dampening.
  return torch::optim::SGDOptions(0.1)
      .momentum(0.9)
      .dampening(nesterov ? 0.0 : 0.3)
      .nesterov(nesterov)
      .weight_decay(0.01);
}

std::vector<torch::Tensor> make_params() {
  torch::manual_seed(3);
  return {torch::randn({4, 3}, torch::requires_grad()),
          torch::randn({5}, torch::requires_grad())};
}

std::vector<torch::Tensor> grads_of_step(int step) {
  torch::manual_seed(100 + step);
  return {torch::randn({4, 3}), torch::randn({5})};
}

void set_grads(std::vector<torch::Tensor>& params,
               const std::vector<torch::Tensor>& grads, double scale) {
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].mutable_grad() = grads[i] * scale;
  }
}

// torch::optim::SGD taking only the steps `taken` says, on the unscaled
// gradients: what PyTorch computes when the skipped steps never call step().
std::vector<torch::Tensor> reference(const std::vector<bool>& taken,
                                     const torch::optim::SGDOptions& options) {
  auto params = make_params();
  torch::optim::SGD sgd(params, options);
  for (size_t s = 0; s < taken.size(); ++s) {
    if (taken[s]) {
      set_grads(params, grads_of_step(static_cast<int>(s)), 1.0);
      sgd.step();
    }
  }
  return params;
}

// lamp's SGD given GradScaler's scale and flag on the device: skipped steps
// (flag 1, gradients still scaled) leave no trace, and the first step taken
// sets buf = g, as torch::optim's does, also with dampening.
void step_scaled(lamp::optim::SGD& sgd, std::vector<torch::Tensor>& params,
                 int s, bool taken) {
  const double scale = 8.0;
  set_grads(params, grads_of_step(s), scale);
  sgd.step_scaled(torch::full({1}, scale), torch::full({1}, taken ? 0.f : 1.f));
}

TEST(SgdFirstStep, SkippedFirstStepsThenTakenOnesAreTorchOptims) {
  const auto implementation = fused_where_available();
  const std::vector<std::vector<bool>> sequences = {
      {false, false, false, true, true, true}, // every warm-up step overflows
      {false, true, false, true},              // skips between taken steps
      {true, true},
  };
  for (bool nesterov : {false, true}) {
    for (const auto& taken : sequences) {
      SCOPED_TRACE(::testing::Message()
                   << "nesterov " << nesterov << ", steps " << taken.size());
      auto params = make_params();
      lamp::optim::SGD sgd(params, dampened(nesterov), implementation);
      for (size_t s = 0; s < taken.size(); ++s) {
        step_scaled(sgd, params, static_cast<int>(s), taken[s]);
      }
      const auto expected = reference(taken, dampened(nesterov));
      for (size_t i = 0; i < params.size(); ++i) {
        // The fused kernels round in FP32 "opmath" like torch::optim here
        // (FP32 parameters); a few ulps of reordering at most.
        EXPECT_TRUE(
            AllClose(params[i].detach(), expected[i].detach(), 1e-6, 1e-7))
            << "parameter " << i;
      }
    }
  }
}

// A checkpoint written before any step was taken has no momentum buffer (as
// torch::optim's), one written after has it; both resume as torch::optim.
TEST(SgdFirstStep, CheckpointsHoldOnlyTakenBuffers) {
  const auto implementation = fused_where_available();
  const auto options = dampened(false);
  for (int taken_before_save : {0, 1}) {
    SCOPED_TRACE(taken_before_save);
    auto params = make_params();
    lamp::optim::SGD sgd(params, options, implementation);
    step_scaled(sgd, params, 0, false);
    step_scaled(sgd, params, 1, false);
    if (taken_before_save == 1) {
      step_scaled(sgd, params, 2, true);
    }
    const auto state_size = sgd.state().size();
    torch::serialize::OutputArchive archive;
    sgd.save(archive);
    // The live optimizer keeps what it had.
    EXPECT_EQ(sgd.state().size(), state_size);
    // Resumed in torch::optim::SGD over copies of the parameters.
    std::vector<torch::Tensor> copies;
    for (const auto& p : params) {
      copies.push_back(p.detach().clone().requires_grad_(true));
    }
    torch::optim::SGD resumed(copies, options);
    resumed.load(*lamp_test::reopened(archive));
    EXPECT_EQ(resumed.state().size(),
              static_cast<size_t>(taken_before_save) * params.size());
    for (int s = 3; s < 5; ++s) {
      step_scaled(sgd, params, s, true);
      set_grads(copies, grads_of_step(s), 1.0);
      resumed.step();
    }
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(AllClose(params[i].detach(), copies[i].detach(), 1e-6, 1e-7))
          << "parameter " << i;
    }
  }
}

// Through TrainStep: warm-up-like overflowing steps first, then finite ones,
// with lamp's sync-free SGD equal to torch::optim::SGD's synchronous skip.
TEST(SgdFirstStep, TrainStepAfterOverflowingStepsIsTorchOptims) {
  const auto problem = lamp_test::make_problem(32, 4, 7);
  const auto options = dampened(false);
  std::vector<std::vector<torch::Tensor>> weights;
  for (bool lamp_sgd : {true, false}) {
    torch::manual_seed(4);
    SmallNet model;
    lamp::TrainStep step(
        model.ptr(),
        [&](std::vector<torch::Tensor> params)
            -> std::unique_ptr<torch::optim::Optimizer> {
          if (lamp_sgd) {
            return std::make_unique<lamp::optim::SGD>(
                std::move(params), options, fused_where_available());
          }
          return std::make_unique<torch::optim::SGD>(std::move(params),
                                                     options);
        },
        lamp::TrainStepOptions(Precision::kFP32)
            .force_loss_scaling(true)
            .scaler(lamp::GradScalerOptions().init_scale(1024).dynamic(false)));
    for (int i = 0; i < 6; ++i) {
      const auto input =
          i < 3 ? problem.inputs * std::numeric_limits<float>::infinity()
                : problem.inputs;
      step.step(input, problem.targets,
                [&](const torch::Tensor& x, const torch::Tensor& y) {
                  return torch::nn::functional::cross_entropy(model->forward(x),
                                                              y);
                });
    }
    EXPECT_EQ(step.scaler().steps_skipped(), 3);
    std::vector<torch::Tensor> w;
    for (const auto& p : model->parameters()) {
      w.push_back(p.detach().clone());
    }
    weights.push_back(w);
  }
  for (size_t i = 0; i < weights[0].size(); ++i) {
    EXPECT_TRUE(AllClose(weights[0][i], weights[1][i], 1e-5, 1e-6))
        << "parameter " << i;
  }
}

// ---------------------------------------------------------------- on a GPU

using StepHook =
    std::function<void(int step, SmallNet& model, lamp::TrainStep& train)>;

struct Run {
  std::vector<torch::Tensor> weights; // parameters, then buffers
  int64_t captures = 0;
};

// Trains SmallNet on the GPU for `steps` steps with CUDA graphs or eagerly,
// calling `hook` before each step (where it changes what a graph baked in).
Run train_on_gpu(bool graph, int steps, const lamp::OptimizerFactory& make,
                 const StepHook& hook, Precision precision = Precision::kAMP,
                 const std::function<torch::Tensor(int)>& inf_at = nullptr) {
  const auto problem = lamp_test::make_problem(64, 4, 6);
  const auto images = problem.inputs.to(torch::kCUDA);
  const auto labels = problem.targets.to(torch::kCUDA);
  torch::manual_seed(9);
  SmallNet model;
  model->to(torch::kCUDA);
  lamp::TrainStep train(
      model.ptr(), make,
      lamp::TrainStepOptions(precision).cuda_graph(graph).scaler(
          lamp::GradScalerOptions().init_scale(1024).growth_interval(10)));
  for (int i = 0; i < steps; ++i) {
    hook(i, model, train);
    auto input = images;
    if (inf_at && inf_at(i).defined()) {
      input = images * inf_at(i);
    }
    train.step(input, labels,
               [&](const torch::Tensor& x, const torch::Tensor& y) {
                 return torch::nn::functional::cross_entropy(
                     model->forward(x).to(torch::kFloat), y);
               });
  }
  Run run;
  for (const auto& p : model->parameters()) {
    run.weights.push_back(p.detach().cpu());
  }
  for (const auto& b : model->buffers()) {
    run.weights.push_back(b.detach().cpu());
  }
  run.captures = train.cuda_graph_captures();
  return run;
}

lamp::OptimizerFactory gpu_sgd(double momentum, double dampening = 0) {
  return [=](std::vector<torch::Tensor> params) {
    return std::make_unique<lamp::optim::SGD>(std::move(params),
                                              torch::optim::SGDOptions(0.05)
                                                  .momentum(momentum)
                                                  .dampening(dampening)
                                                  .weight_decay(1e-3));
  };
}

void expect_same_training(const Run& graph, const Run& eager) {
  ASSERT_EQ(graph.weights.size(), eager.weights.size());
  for (size_t i = 0; i < graph.weights.size(); ++i) {
    const auto& expected = eager.weights[i];
    if (expected.scalar_type() != torch::kHalf) {
      // The same kernels in the same order; only cuDNN's and cuBLAS's
      // choice of algorithm may differ between the runs (a few ulps).
      EXPECT_TRUE(AllClose(graph.weights[i].to(torch::kDouble),
                           expected.to(torch::kDouble), 1e-3, 1e-5))
          << "tensor " << i;
      continue;
    }
    // A model kept in half computes each step's gradients in half from
    // half weights: where the algorithms differ, the gradients differ in
    // their last half ulps, and lr times that difference adds up in every
    // weight, small or large. So half weights agree to the tensor's scale,
    // not element by element: within 2^-8 of its largest magnitude (4 to 8
    // ulps of half there; an H200 showed 1). The kAMP runs of the same
    // tests check the optimizer step itself with float weights at 1e-3.
    const double atol =
        std::ldexp(expected.abs().max().item<double>(), -8) + 1e-7;
    EXPECT_TRUE(AllClose(graph.weights[i].to(torch::kDouble),
                         expected.to(torch::kDouble), 0.0, atol))
        << "tensor " << i;
  }
}

// A change of momentum and weight decay after the capture re-captures (with
// a warning): the graph run trains as the eager one with the new values.
TEST(TrainStepGraph, RecapturesWhenMomentumOrWeightDecayChange_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const StepHook hook = [](int i, SmallNet&, lamp::TrainStep& train) {
    auto& o = static_cast<torch::optim::SGDOptions&>(
        train.optimizer().param_groups()[0].options());
    if (i == 10) {
      o.momentum(0.5);
    }
    if (i == 20) {
      o.weight_decay(0.0);
    }
  };
  const auto graph = train_on_gpu(true, 30, gpu_sgd(0.9), hook);
  const auto eager = train_on_gpu(false, 30, gpu_sgd(0.9), hook);
  expect_same_training(graph, eager);
  EXPECT_EQ(graph.captures, 3);
  EXPECT_EQ(eager.captures, 0);
}

// Training steps in eval mode (BatchNorm on its running statistics) and a
// frozen layer are captured as such, and back again.
TEST(TrainStepGraph, FollowsTrainEvalAndRequiresGrad_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const StepHook hook = [](int i, SmallNet& model, lamp::TrainStep&) {
    if (i == 8) {
      model->eval();
    }
    if (i == 16) {
      model->train();
    }
    if (i == 24) {
      model->conv1->weight.requires_grad_(false);
    }
    if (i == 32) {
      model->conv1->weight.requires_grad_(true);
    }
  };
  for (auto precision : {Precision::kAMP, Precision::kHalf}) {
    SCOPED_TRACE(lamp::to_string(precision));
    const auto graph = train_on_gpu(true, 40, gpu_sgd(0.9), hook, precision);
    const auto eager = train_on_gpu(false, 40, gpu_sgd(0.9), hook, precision);
    expect_same_training(graph, eager);
    EXPECT_EQ(graph.captures, 5);
  }
}

// Gradients of two runs of the same steps: FP16 rounding of a few ulps
// (cuDNN may choose other algorithms), relative to the largest.
::testing::AssertionResult close_gradients(const torch::Tensor& graph,
                                           const torch::Tensor& eager) {
  const auto a = graph.to(torch::kDouble);
  const auto b = eager.to(torch::kDouble);
  return AllClose(a, b, 1e-2, 1e-2 * b.abs().max().item<double>());
}

// After each step, the parameters' (and masters') `.grad` are that step's
// gradients, also when two captured shapes alternate: equal to an eager
// TrainStep's in lockstep.
TEST(TrainStepGraph, GradsAreThoseOfTheLastStepAcrossShapes_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const auto problem = lamp_test::make_problem(48, 4, 2);
  const auto images = problem.inputs.to(torch::kCUDA);
  const auto labels = problem.targets.to(torch::kCUDA);
  for (auto precision : {Precision::kAMP, Precision::kHalf}) {
    SCOPED_TRACE(lamp::to_string(precision));
    std::vector<SmallNet> models;
    std::vector<std::unique_ptr<lamp::TrainStep>> steps;
    for (bool graph : {true, false}) {
      torch::manual_seed(5);
      models.emplace_back();
      models.back()->to(torch::kCUDA);
      steps.push_back(std::make_unique<lamp::TrainStep>(
          models.back().ptr(), gpu_sgd(0.9),
          lamp::TrainStepOptions(precision).cuda_graph(graph).scaler(
              lamp::GradScalerOptions().init_scale(1024))));
    }
    for (int i = 0; i < 16; ++i) {
      // 32 and 16 images, alternating once both are captured.
      const int64_t n = (i < 4 || i % 2 == 0) ? 32 : 16;
      for (size_t k = 0; k < 2; ++k) {
        auto& model = models[k];
        steps[k]->step(images.narrow(0, 0, n), labels.narrow(0, 0, n),
                       [&](const torch::Tensor& x, const torch::Tensor& y) {
                         return torch::nn::functional::cross_entropy(
                             model->forward(x).to(torch::kFloat), y);
                       });
      }
      const auto graph_params = models[0]->parameters();
      const auto eager_params = models[1]->parameters();
      for (size_t p = 0; p < graph_params.size(); ++p) {
        ASSERT_TRUE(graph_params[p].grad().defined()) << "step " << i;
        EXPECT_TRUE(
            close_gradients(graph_params[p].grad(), eager_params[p].grad()))
            << "step " << i << " parameter " << p;
      }
      if (auto* masters = steps[0]->master_weights()) {
        const auto graph_masters = masters->master_params();
        const auto eager_masters = steps[1]->master_weights()->master_params();
        for (size_t p = 0; p < graph_masters.size(); ++p) {
          EXPECT_TRUE(
              close_gradients(graph_masters[p].grad(), eager_masters[p].grad()))
              << "step " << i << " master " << p;
        }
      }
    }
    EXPECT_EQ(steps[0]->cuda_graph_captures(), 2);
  }
}

// The pool's memory is reported once a graph exists; a load re-captures.
TEST(TrainStepGraph, ReportsThePoolsMemory_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  torch::manual_seed(1);
  SmallNet model;
  model->to(torch::kCUDA);
  lamp::TrainStep train(
      model.ptr(), gpu_sgd(0.9),
      lamp::TrainStepOptions(Precision::kAMP).cuda_graph(true));
  const auto images = torch::randn({32, 3, 8, 8}, torch::kCUDA);
  const auto labels =
      torch::zeros({32}, torch::dtype(torch::kLong).device(torch::kCUDA));
  const auto step = [&] {
    train.step(images, labels,
               [&](const torch::Tensor& x, const torch::Tensor& y) {
                 return torch::nn::functional::cross_entropy(
                     model->forward(x).to(torch::kFloat), y);
               });
  };
  for (int i = 0; i < 3; ++i) {
    step();
  }
  EXPECT_EQ(train.cuda_graph_captures(), 0);
  EXPECT_EQ(train.cuda_graph_pool_reserved_bytes(), 0);
  step();
  EXPECT_EQ(train.cuda_graph_captures(), 1);
  EXPECT_GT(train.cuda_graph_pool_bytes(), 0);
  EXPECT_GT(train.cuda_graph_pool_reserved_bytes(),
            train.cuda_graph_pool_bytes());
  torch::serialize::OutputArchive archive;
  train.save(archive);
  train.load(*lamp_test::reopened(archive));
  EXPECT_EQ(train.cuda_graph_pool_reserved_bytes(), 0);
  for (int i = 0; i < 4; ++i) {
    step();
  }
  EXPECT_EQ(train.cuda_graph_captures(), 2);
  EXPECT_GT(train.cuda_graph_pool_bytes(), 0);
}

// SGD with dampening whose warm-up steps all overflow: the captured step
// makes the first step taken on the device (no host read, which a capture
// refuses) and trains as eager steps and as torch::optim do.
TEST(TrainStepGraph, DampenedSgdAfterAnOverflowingWarmUp_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const auto inf_at = [](int i) {
    return i < 3 ? torch::full({}, std::numeric_limits<float>::infinity(),
                               torch::kCUDA)
                 : torch::Tensor();
  };
  const StepHook none = [](int, SmallNet&, lamp::TrainStep&) {};
  for (auto precision : {Precision::kAMP, Precision::kHalf}) {
    SCOPED_TRACE(lamp::to_string(precision));
    const auto graph =
        train_on_gpu(true, 12, gpu_sgd(0.9, 0.3), none, precision, inf_at);
    const auto eager =
        train_on_gpu(false, 12, gpu_sgd(0.9, 0.3), none, precision, inf_at);
    const auto torch_optim = train_on_gpu(
        false, 12,
        [](std::vector<torch::Tensor> params) {
          return std::make_unique<torch::optim::SGD>(
              std::move(params), torch::optim::SGDOptions(0.05)
                                     .momentum(0.9)
                                     .dampening(0.3)
                                     .weight_decay(1e-3));
        },
        none, precision, inf_at);
    expect_same_training(graph, eager);
    expect_same_training(graph, torch_optim);
    EXPECT_EQ(graph.captures, 1);
  }
}

} // namespace
