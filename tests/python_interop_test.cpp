// lamp against real Python torch, both ways: scaler states written by
// torch.save load in lamp and the other way round, and exported state_dicts
// load into bench/peer_pytorch.py's models and give lamp's outputs. The
// interpreter is LAMP_PYTHON_TORCH (the environment variable, else the CMake
// cache variable of that name); without one that imports torch, every test
// here is skipped, never passed.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "custom_tree.h"
#include "lamp/amp/grad_scaler.h"
#include "lamp/models/mnist_cnn.h"
#include "lamp/models/resnet.h"
#include "lamp/models/state_dict.h"
#include "lamp/nn/rms_norm.h"
#include "lamp/platform/checkpoint_file.h"
#include "test_util.h"
#include "trainer_util.h"

namespace {

using lamp_test::expect_error;
using lamp_test::temp_path;

std::string python() {
  const char* env = std::getenv("LAMP_PYTHON_TORCH");
  return env != nullptr ? env : LAMP_PYTHON_TORCH;
}

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  }
  return out + "'";
}

// Runs `command` with the shell; its exit status and output together.
std::pair<int, std::string> run(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) {
    return {-1, "popen failed"};
  }
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    output.append(buffer, n);
  }
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// Why there is no Python with torch to test against ("" when there is one),
// asked once.
const std::string& missing_python() {
  static const std::string reason = [] {
    if (python().empty()) {
      return std::string(
          "LAMP_PYTHON_TORCH is empty (no Python with torch was found at configure time)");
    }
    const auto result = run(quoted(python()) + " -W ignore -c 'import torch'");
    return result.first == 0 ? std::string()
                             : "LAMP_PYTHON_TORCH=" + python() +
                                   " cannot import torch: " + result.second;
  }();
  return reason;
}

#define LAMP_SKIP_WITHOUT_PYTHON_TORCH() \
  do {                                   \
    if (!missing_python().empty()) {     \
      GTEST_SKIP() << missing_python();  \
    }                                    \
  } while (0)

// tests/python/lamp_interop.py COMMAND ARGS...; fails the test with the
// script's output when it fails.
void interop(const std::vector<std::string>& args) {
  std::string command =
      quoted(python()) + " -W ignore " +
      quoted(std::string(LAMP_SOURCE_DIR) + "/tests/python/lamp_interop.py");
  for (const auto& arg : args) {
    command += " " + quoted(arg);
  }
  const auto result = run(command);
  EXPECT_EQ(result.first, 0) << command << "\n" << result.second;
  std::cout << result.second; // what the script measured, for the log
}

TEST(PythonInterop, PythonScalerStateLoadsInLamp) {
  LAMP_SKIP_WITHOUT_PYTHON_TORCH();
  const auto path = temp_path("python_scaler.pt");
  interop({"write_scaler", path});
  // What Python wrote: a plain dict of Python's keys and types.
  const auto state = lamp::load_pickle(path, "test");
  ASSERT_TRUE(state.isGenericDict()) << state.tagKind();
  EXPECT_EQ(state.toGenericDict().size(), 5u);

  lamp::GradScaler scaler(lamp::GradScalerOptions().hysteresis(2));
  scaler.load_state_dict(path);
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  EXPECT_EQ(scaler.options().growth_factor(), 3.0);
  EXPECT_EQ(scaler.options().backoff_factor(), 0.25);
  EXPECT_EQ(scaler.options().growth_interval(), 7);
  // Keys Python does not have keep this scaler's options.
  EXPECT_EQ(scaler.options().hysteresis(), 2);
  std::remove(path.c_str());
}

TEST(PythonInterop, LampScalerStateLoadsInPython) {
  LAMP_SKIP_WITHOUT_PYTHON_TORCH();
  const auto path = temp_path("lamp_scaler.pt");
  lamp::GradScaler scaler(lamp::GradScalerOptions()
                              .init_scale(512)
                              .growth_factor(4)
                              .backoff_factor(0.125)
                              .growth_interval(9));
  auto param = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD optimizer({param}, 0.1);
  for (int i = 0; i < 3; ++i) {
    optimizer.zero_grad();
    scaler.scale((param * 2).sum()).backward();
    scaler.step(optimizer);
    scaler.update();
  }
  ASSERT_EQ(scaler.growth_tracker(), 3);
  // A scaler with Python's behaviour writes exactly Python's dict.
  scaler.save_state_dict(path);
  interop({"check_scaler", path,
           R"({"scale": 512.0, "growth_factor": 4.0, "backoff_factor": 0.125,)"
           R"( "growth_interval": 9, "_growth_tracker": 3})"});

  // lamp's own keys, where used, come after Python's; Python ignores them.
  lamp::GradScaler hysteresis(lamp::GradScalerOptions().hysteresis(3));
  hysteresis.save_state_dict(path);
  interop({"check_scaler", path,
           R"({"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,)"
           R"( "growth_interval": 2000, "_growth_tracker": 0,)"
           R"( "min_scale": 0.0, "max_scale": "inf", "hysteresis": 3,)"
           R"( "_overflow_count": 0, "dynamic": true, "min_scale_patience": 0,)"
           R"( "_min_scale_overflows": 0})"});
  std::remove(path.c_str());
}

TEST(PythonInterop, DisabledScalerStatesAreEmptyBothWays) {
  LAMP_SKIP_WITHOUT_PYTHON_TORCH();
  const auto path = temp_path("disabled_scaler.pt");
  lamp::GradScaler disabled(lamp::GradScalerOptions().enabled(false));
  disabled.save_state_dict(path);
  interop({"check_scaler", path, "{}"});

  interop({"write_disabled_scaler", path});
  lamp::GradScaler enabled;
  expect_error([&] { enabled.load_state_dict(path); }, "disabled GradScaler");
  EXPECT_EQ(enabled.get_scale(), 65536.0);
  disabled.load_state_dict(path); // a no-op, as in Python
  std::remove(path.c_str());
}

// States Python's torch.save writes in forms LibTorch's reader does not
// handle itself, from tests/python/scaler_states (made by
// tests/python/make_scaler_states.py; no Python needed here).
std::string scaler_state(const std::string& name) {
  return std::string(LAMP_SOURCE_DIR) + "/tests/python/scaler_states/" + name;
}

void expect_python_state(const lamp::GradScaler& scaler, double scale) {
  EXPECT_EQ(scaler.get_scale(), scale);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  EXPECT_EQ(scaler.options().growth_factor(), 3.0);
  EXPECT_EQ(scaler.options().backoff_factor(), 0.25);
  EXPECT_EQ(scaler.options().growth_interval(), 7);
}

TEST(PythonScalerFiles, AnOrderedDictLoads) {
  lamp::GradScaler scaler;
  scaler.load_state_dict(scaler_state("ordered_dict.pt"));
  expect_python_state(scaler, 1024.0);
}

TEST(PythonScalerFiles, IntsWhereFloatsAreExpectedLoad) {
  lamp::GradScaler scaler;
  scaler.load_state_dict(scaler_state("ints_for_floats.pt"));
  expect_python_state(scaler, 1024.0);
  lamp::GradScaler large;
  large.load_state_dict(scaler_state("scale_2_pow_40.pt"));
  EXPECT_EQ(large.get_scale(), 1099511627776.0);
}

// A whole Python training checkpoint: the scaler's state is found where
// Python keeps it, checkpoint["scaler"], beside the model's and optimizer's
// tensors; one without it is refused naming the keys it has.
TEST(PythonScalerFiles, TheStateInsideAPythonCheckpointLoads) {
  lamp::GradScaler scaler;
  scaler.load_state_dict(scaler_state("in_checkpoint.pt"));
  expect_python_state(scaler, 1024.0);
  lamp::GradScaler other;
  const auto path = scaler_state("checkpoint_without_scaler.pt");
  const auto error = lamp_test::error_of([&] { other.load_state_dict(path); });
  EXPECT_NE(error.find(path + " holds no GradScaler state"), std::string::npos)
      << error;
  EXPECT_NE(error.find("its keys are 'model', 'optimizer', 'epoch'"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("checkpoint['scaler']"), std::string::npos) << error;
  EXPECT_EQ(other.get_scale(), 65536.0);
}

// What LibTorch cannot read is refused with the file, the problem and the
// fix, and the scaler is left as it was.
TEST(PythonScalerFiles, UnreadableFilesAreRefusedWithTheFix) {
  lamp::GradScaler scaler;
  const auto legacy = scaler_state("legacy_format.pt");
  auto error = lamp_test::error_of([&] { scaler.load_state_dict(legacy); });
  EXPECT_NE(error.find(legacy), std::string::npos) << error;
  EXPECT_NE(error.find("legacy (non-zip) format"), std::string::npos) << error;
  EXPECT_NE(error.find("torch.save(torch.load(path), path)"), std::string::npos)
      << error;
  const auto big = scaler_state("tracker_2_pow_70.pt");
  error = lamp_test::error_of([&] { scaler.load_state_dict(big); });
  EXPECT_NE(error.find(big), std::string::npos) << error;
  EXPECT_NE(error.find("'_growth_tracker' is an integer of 71 bits"),
            std::string::npos)
      << error;
  EXPECT_EQ(scaler.get_scale(), 65536.0);
}

// Exports `model` (moved off its initial BatchNorm statistics by a few
// training-mode passes) and checks that Python's model of that name, loaded
// with it, gives lamp's eval-mode outputs on the same input.
void expect_same_outputs_in_python(
    torch::nn::Module& model,
    const std::function<torch::Tensor(const torch::Tensor&)>& forward,
    const std::string& name, std::vector<int64_t> input_shape) {
  torch::NoGradGuard no_grad;
  model.train();
  for (int i = 0; i < 3; ++i) {
    forward(torch::randn(input_shape));
  }
  model.eval();
  const auto input = torch::randn(input_shape);
  const auto output = forward(input);
  const auto state_path = temp_path(name + "_state_dict.pt");
  const auto io_path = temp_path(name + "_io.pt");
  lamp::models::export_state_dict(model, name, state_path);
  c10::Dict<std::string, torch::Tensor> io;
  io.insert("input", input);
  io.insert("output", output);
  lamp::save_pickle(io, io_path);
  interop({"check_model", name, state_path, io_path});
  std::remove(state_path.c_str());
  std::remove(io_path.c_str());
}

TEST(PythonInterop, ExportedCnnGivesLampsOutputsInPython) {
  LAMP_SKIP_WITHOUT_PYTHON_TORCH();
  torch::manual_seed(1);
  lamp::models::MnistCNN model;
  expect_same_outputs_in_python(
      *model, [&](const torch::Tensor& x) { return model->forward(x); }, "cnn",
      {4, 1, 28, 28});
}

TEST(PythonInterop, ExportedResNetsGiveLampsOutputsInPython) {
  LAMP_SKIP_WITHOUT_PYTHON_TORCH();
  for (const std::string name : {"resnet18", "resnet50"}) {
    SCOPED_TRACE(name);
    torch::manual_seed(2);
    auto model = lamp::models::make_resnet(name);
    expect_same_outputs_in_python(
        *model, [&](const torch::Tensor& x) { return model->forward(x); }, name,
        {2, 3, 32, 32});
  }
}

// A user's module tree (not one of lamp's models) loads with strict=True
// into the same tree written in Python, and gives the same outputs.
TEST(PythonInterop, ExportedCustomModuleLoadsStrictlyInPython) {
  LAMP_SKIP_WITHOUT_PYTHON_TORCH();
  torch::manual_seed(6);
  lamp_test::CustomTree tree;
  torch::NoGradGuard no_grad;
  tree->train();
  for (int i = 0; i < 3; ++i) {
    tree->forward(torch::randn({8, 3})); // moves the running statistics
  }
  tree->eval();
  const auto input = torch::randn({5, 3});
  const auto output = tree->forward(input);
  const auto state_path = temp_path("custom_tree_state_dict.pt");
  const auto io_path = temp_path("custom_tree_io.pt");
  lamp::models::export_state_dict(*tree, state_path);
  c10::Dict<std::string, torch::Tensor> io;
  io.insert("input", input);
  io.insert("output", output);
  lamp::save_pickle(io, io_path);
  interop({"check_custom", state_path, io_path});
  std::remove(state_path.c_str());
  std::remove(io_path.c_str());
}

// lamp::nn::RMSNorm against Python's torch.nn.RMSNorm (torch 2.4 and
// later): the state dict loads strictly, and the outputs agree in FP32 and
// on a BF16 input.
TEST(PythonInterop, RmsNormGivesPythonsValues) {
  LAMP_SKIP_WITHOUT_PYTHON_TORCH();
  torch::manual_seed(12);
  const double eps = 1e-5;
  lamp::nn::RMSNorm norm(lamp::nn::RMSNormOptions({6}).eps(eps));
  {
    torch::NoGradGuard no_grad;
    norm->weight.uniform_(0.5, 1.5);
  }
  const auto input = torch::randn({4, 3, 6}) * 3;
  torch::NoGradGuard no_grad;
  const auto state_path = temp_path("rms_norm_state_dict.pt");
  const auto io_path = temp_path("rms_norm_io.pt");
  lamp::models::export_state_dict(*norm, state_path);
  c10::Dict<std::string, torch::Tensor> io;
  io.insert("input", input);
  io.insert("output", norm->forward(input));
  io.insert("output_bf16", norm->forward(input.to(torch::kBFloat16)));
  io.insert("eps", torch::tensor(eps, torch::kDouble));
  lamp::save_pickle(io, io_path);
  interop({"check_rms_norm", state_path, io_path});
  std::remove(state_path.c_str());
  std::remove(io_path.c_str());
}

} // namespace
