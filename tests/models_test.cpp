#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "lamp/amp/half.h"
#include "lamp/amp/master_weights.h"
#include "lamp/models/flops.h"
#include "lamp/models/mnist_cnn.h"
#include "lamp/models/registry.h"
#include "lamp/models/resnet.h"
#include "lamp/models/state_dict.h"
#include "lamp/platform/checkpoint_file.h"
#include "test_util.h"

namespace {

using lamp::models::count_parameters;

std::vector<std::string> parameter_names(const torch::nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& item : module.named_parameters()) {
    names.push_back(item.key());
  }
  return names;
}

bool has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

int64_t count_batchnorms(const torch::nn::Module& module) {
  int64_t count = 0;
  for (const auto& m : module.modules()) {
    count +=
        dynamic_cast<const torch::nn::BatchNorm2dImpl*>(m.get()) != nullptr;
  }
  return count;
}

torch::Tensor labels(std::vector<int64_t> values,
                     torch::Device device = torch::kCPU) {
  return torch::tensor(values,
                       torch::TensorOptions(device).dtype(torch::kLong));
}

// One training-mode forward and backward with an FP32 loss (cross-entropy on
// logits, NLL on log-probabilities); every parameter must receive a finite
// gradient of its own dtype.
template <typename Model>
void expect_forward_backward(Model model, const torch::Tensor& images,
                             const torch::Tensor& targets,
                             torch::Dtype output_dtype,
                             bool log_probabilities = false) {
  model->train();
  const torch::Tensor out = model->forward(images);
  ASSERT_EQ(out.scalar_type(), output_dtype);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{images.size(0), 10}));
  const auto logits = out.to(torch::kFloat);
  const auto loss = log_probabilities
                        ? torch::nll_loss(logits, targets)
                        : torch::nn::functional::cross_entropy(logits, targets);
  loss.backward();
  for (const auto& item : model->named_parameters()) {
    const torch::Tensor& grad = item.value().grad();
    ASSERT_TRUE(grad.defined()) << item.key();
    EXPECT_EQ(grad.scalar_type(), item.value().scalar_type()) << item.key();
    EXPECT_TRUE(torch::isfinite(grad).all().item<bool>()) << item.key();
  }
}

// After network_to_half(BF16): every BatchNorm entirely FP32, every
// convolution and linear layer BF16.
void expect_bf16_with_fp32_batchnorm(const torch::nn::Module& model) {
  for (const auto& m : model.modules()) {
    if (dynamic_cast<const torch::nn::BatchNorm2dImpl*>(m.get()) != nullptr) {
      for (const auto& p : m->parameters()) {
        EXPECT_EQ(p.scalar_type(), torch::kFloat);
      }
      for (const auto& b : m->named_buffers()) {
        if (b.key() != "num_batches_tracked") {
          EXPECT_EQ(b.value().scalar_type(), torch::kFloat) << b.key();
        }
      }
    } else if (dynamic_cast<const torch::nn::Conv2dImpl*>(m.get()) ||
               dynamic_cast<const torch::nn::LinearImpl*>(m.get())) {
      for (const auto& p : m->parameters()) {
        EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
      }
    }
  }
}

// ---------------------------------------------------------------- ResNet

TEST(ResNet, Resnet18MapsCifarImagesToLogits) {
  torch::manual_seed(0);
  auto model = lamp::models::resnet18();
  const auto out = model->forward(torch::randn({2, 3, 32, 32}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 10}));
  EXPECT_EQ(out.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
}

TEST(ResNet, OneChannel28x28ImagesWorkThroughTheAdaptivePool) {
  torch::manual_seed(0);
  auto model = lamp::models::resnet18(/*num_classes=*/10, /*in_channels=*/1);
  EXPECT_EQ(model->forward(torch::randn({2, 1, 28, 28})).sizes(),
            (std::vector<int64_t>{2, 10}));
}

TEST(ResNet, Resnet50ForwardOnABatchOfTwo) {
  torch::manual_seed(0);
  auto model = lamp::models::resnet50();
  torch::NoGradGuard no_grad;
  const auto out = model->forward(torch::randn({2, 3, 32, 32}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 10}));
  EXPECT_EQ(model->linear->weight.size(1), 2048); // 512 * expansion 4
}

TEST(ResNet, ParameterCountsMatchThePublishedOnes) {
  // /work/shared/CONTEXT.md section 5 (kuangliu/pytorch-cifar's CIFAR ResNets,
  // 10 classes, 3 input channels).
  EXPECT_EQ(count_parameters(*lamp::models::resnet18()), 11173962);
  EXPECT_EQ(count_parameters(*lamp::models::resnet34()), 21282122);
  EXPECT_EQ(count_parameters(*lamp::models::resnet50()), 23520842);
}

// The registry builds every name (the module and a forward that runs it),
// with the FLOP table and the model table the same, and refuses others with
// the list.
TEST(Registry, BuildsEveryNamedModel) {
  ASSERT_EQ(lamp::models::model_names(),
            (std::vector<std::string>{"cnn", "resnet18", "resnet34", "resnet50",
                                      "resnet101", "resnet152"}));
  for (const auto& name : lamp::models::model_names()) {
    SCOPED_TRACE(name);
    const bool cnn = name == "cnn";
    const int64_t channels = cnn ? 1 : 3, side = cnn ? 28 : 32;
    torch::manual_seed(0);
    auto model = lamp::models::make_model(name, 7, channels);
    ASSERT_NE(model.module, nullptr);
    if (!cnn) {
      EXPECT_EQ(
          count_parameters(*model.module),
          count_parameters(*lamp::models::make_resnet(name, 7, channels)));
    }
    model.module->eval();
    torch::NoGradGuard no_grad;
    EXPECT_EQ(model.forward(torch::randn({2, channels, side, side})).sizes(),
              (std::vector<int64_t>{2, 7}));
    EXPECT_GT(lamp::models::forward_flops(name, channels, side, side), 0);
  }
  lamp_test::expect_error(
      [] { lamp::models::make_model("vgg16"); },
      "unknown model 'vgg16'; valid names are cnn, resnet18, resnet34, resnet50, resnet101, resnet152.");
  lamp_test::expect_error(
      [] { lamp::models::forward_flops("vgg16"); },
      "lamp::models::forward_flops: unknown model 'vgg16'; valid names are cnn, resnet18");
}

// network_to_half for a named model: converted in place (BatchNorm kept
// FP32), the input cast in front of the forward, the parameter names and
// objects unchanged, in the module and in the HalfNetwork around it.
TEST(Registry, NetworkToHalfCastsTheInputAndKeepsTheNames) {
  torch::manual_seed(0);
  auto model = lamp::models::make_model("resnet18", 10, 3);
  const auto names_before = model.module->named_parameters().keys();
  const auto buffers_before = model.module->named_buffers().keys();
  const auto fc_before = model.module->named_parameters()["linear.weight"];
  auto half =
      lamp::network_to_half(model.module, model.forward, torch::kBFloat16);
  EXPECT_EQ(half->model().get(), model.module.get());
  EXPECT_EQ(half->named_parameters().keys(), names_before);
  EXPECT_EQ(half->named_buffers().keys(), buffers_before);
  EXPECT_EQ(model.module->named_parameters().keys(), names_before);
  for (const auto& p : half->named_parameters()) {
    SCOPED_TRACE(p.key());
    const bool bn = p.key().find("bn") != std::string::npos ||
                    p.key().find("shortcut.1") != std::string::npos;
    EXPECT_EQ(p.value().scalar_type(), bn ? torch::kFloat : torch::kBFloat16);
  }
  EXPECT_TRUE(half->named_parameters()["linear.weight"].is_same(fc_before));
  // eval() reaches the model itself, whose forward the HalfNetwork runs.
  half->eval();
  EXPECT_FALSE(model.module->is_training());
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, 3, 32, 32});
  const auto out = half->forward(x); // FP32 in: the forward casts
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(lamp_test::BitEqual(out, model.forward(x.to(torch::kBFloat16))));
  // The same state dict as the model: saved from one, loaded into the other.
  std::stringstream saved;
  torch::save(half, saved);
  auto other = lamp::models::make_model("resnet18", 10, 3);
  lamp::convert_network(*other.module, torch::kBFloat16);
  torch::serialize::InputArchive archive;
  archive.load_from(saved);
  other.module->load(archive);
  EXPECT_TRUE(lamp_test::BitEqual(
      other.module->named_parameters()["linear.weight"], fc_before));
  lamp_test::expect_error([] { lamp::network_to_half(nullptr, nullptr); },
                          "the model is null");
}

TEST(Registry, ToChannelsLastKeepsTheParameterObjects) {
  auto model = lamp::models::make_model("resnet18", 10, 3);
  const auto conv = model.module->named_parameters()["conv1.weight"];
  const auto bias = model.module->named_parameters()["linear.bias"];
  const auto values = conv.detach().clone();
  EXPECT_EQ(&lamp::models::to_channels_last(*model.module), model.module.get());
  for (const auto& p : model.module->parameters()) {
    EXPECT_TRUE(p.dim() == 4
                    ? p.is_contiguous(torch::MemoryFormat::ChannelsLast)
                    : p.is_contiguous());
  }
  EXPECT_TRUE(model.module->named_parameters()["conv1.weight"].is_same(conv));
  EXPECT_TRUE(conv.is_contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(lamp_test::BitEqual(conv, values));
  EXPECT_TRUE(bias.is_contiguous());
}

TEST(ResNet, MakeResnetBuildsEveryNamedDepth) {
  // 18/34/50 as above. 101 and 152: torch 1.13 (/usr/bin/python3) counting
  // kuangliu's models/resnet.py transcribed, cross-checked against
  // torchvision's published ImageNet counts (44,549,160 and 60,192,808) minus
  // the 7x7 stem's extra 3*64*(49-9) = 7,680 weights and the 1000-class
  // head's extra 2048*990 + 990 = 2,028,510.
  const std::map<std::string, int64_t> golden = {{"resnet18", 11173962},
                                                 {"resnet34", 21282122},
                                                 {"resnet50", 23520842},
                                                 {"resnet101", 42512970},
                                                 {"resnet152", 58156618}};
  ASSERT_EQ(lamp::models::resnet_names(),
            (std::vector<std::string>{"resnet18", "resnet34", "resnet50",
                                      "resnet101", "resnet152"}));
  for (const auto& name : lamp::models::resnet_names()) {
    EXPECT_EQ(count_parameters(*lamp::models::make_resnet(name)),
              golden.at(name))
        << name;
  }
}

TEST(ResNet, ClassesAndChannelsChangeOnlyTheStemAndTheHead) {
  // 11,173,962 - 2 * 64 * 3 * 3 (stem) + 90 * (512 + 1) (head); the one-
  // channel and the 100-class counts alone (11,172,810 and 11,220,132) were
  // checked with torch 1.13 on the transcribed kuangliu model.
  auto model = lamp::models::make_resnet("resnet18", /*num_classes=*/100,
                                         /*in_channels=*/1);
  EXPECT_EQ(count_parameters(*model), 11173962 - 2 * 64 * 9 + 90 * 513);
  EXPECT_EQ(model->conv1->weight.sizes(), (std::vector<int64_t>{64, 1, 3, 3}));
  EXPECT_EQ(model->linear->weight.sizes(), (std::vector<int64_t>{100, 512}));
  EXPECT_EQ(model->options().num_classes(), 100);
  EXPECT_EQ(model->options().in_channels(), 1);
}

TEST(ResNet, ModuleTreeUsesKuangliusNames) {
  auto basic = lamp::models::resnet18();
  const auto names = parameter_names(*basic);
  for (const char* name :
       {"conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.conv1.weight",
        "layer1.1.bn2.bias", "layer2.0.shortcut.0.weight",
        "layer2.0.shortcut.1.weight", "layer4.1.conv2.weight", "linear.weight",
        "linear.bias"}) {
    EXPECT_TRUE(has(names, name)) << name;
  }
  // Identity shortcuts are not registered: same shape in and out.
  EXPECT_FALSE(has(names, "layer1.0.shortcut.0.weight"));
  EXPECT_FALSE(has(names, "layer2.1.shortcut.0.weight"));
  EXPECT_FALSE(has(names, "conv1.bias")); // convolutions have no bias
  // Stem, two per block, one per projection shortcut: network_to_half must
  // find all of them.
  EXPECT_EQ(count_batchnorms(*basic), 1 + 2 * 8 + 3);
  EXPECT_NE(
      dynamic_cast<lamp::models::BasicBlockImpl*>(basic->layer3->ptr(0).get()),
      nullptr);

  auto bottleneck = lamp::models::resnet50();
  const auto bottleneck_names = parameter_names(*bottleneck);
  // 64 -> 256 channels: even the first, stride-1 block projects.
  EXPECT_TRUE(has(bottleneck_names, "layer1.0.shortcut.0.weight"));
  EXPECT_TRUE(has(bottleneck_names, "layer1.0.bn3.weight"));
  EXPECT_FALSE(has(bottleneck_names, "layer1.1.shortcut.0.weight"));
  EXPECT_EQ(count_batchnorms(*bottleneck), 1 + 3 * 16 + 4);
  EXPECT_NE(dynamic_cast<lamp::models::BottleneckImpl*>(
                bottleneck->layer1->ptr(0).get()),
            nullptr);
}

TEST(ResNet, MakeResnetRejectsUnknownNamesListingTheValidOnes) {
  try {
    lamp::models::make_resnet("resnet19");
    FAIL() << "make_resnet accepted 'resnet19'";
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'resnet19'"), std::string::npos) << what;
    EXPECT_NE(what.find("resnet18, resnet34, resnet50, resnet101, resnet152"),
              std::string::npos)
        << what;
  }
}

TEST(ResNet, RejectsBadOptionsAndInputsWithAMessage) {
  EXPECT_THROW(lamp::models::ResNet(std::vector<int64_t>{2, 2, 2}, false),
               c10::Error);
  EXPECT_THROW(lamp::models::ResNet(std::vector<int64_t>{2, 0, 2, 2}, false),
               c10::Error);
  EXPECT_THROW(lamp::models::resnet18(/*num_classes=*/0), c10::Error);
  auto model = lamp::models::ResNet(
      lamp::models::ResNetOptions({1, 1, 1, 1}).in_channels(1));
  try {
    model->forward(torch::randn({2, 3, 32, 32}));
    FAIL() << "a 3-channel input reached a 1-channel ResNet";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("in_channels 1"), std::string::npos)
        << e.what();
  }
}

TEST(ResNet, Resnet18TrainsForwardBackwardInFP32) {
  torch::manual_seed(0);
  auto model = lamp::models::resnet18();
  expect_forward_backward(torch::nn::Sequential(model),
                          torch::randn({2, 3, 32, 32}), labels({3, 7}),
                          torch::kFloat);
}

TEST(ResNet, Resnet18Bf16NetworkToHalfKeepsBatchNormFP32AndTrains) {
  torch::manual_seed(0);
  auto model = lamp::models::resnet18();
  auto half = lamp::network_to_half(model, lamp::HalfOptions(torch::kBFloat16));
  expect_bf16_with_fp32_batchnorm(*model);
  EXPECT_EQ(count_batchnorms(*half), 20);
  expect_forward_backward(half, torch::randn({2, 3, 32, 32}), labels({3, 7}),
                          torch::kBFloat16);
}

TEST(ResNet, BottleneckBlocksTrainInFP32AndBf16) {
  // A one-block-per-stage bottleneck ResNet: the Bottleneck backward of
  // resnet50 at a fraction of the cost.
  torch::manual_seed(0);
  const auto images = torch::randn({2, 3, 16, 16});
  const auto targets = labels({1, 9});
  auto fp32 = lamp::models::ResNet(std::vector<int64_t>{1, 1, 1, 1}, true);
  expect_forward_backward(torch::nn::Sequential(fp32), images, targets,
                          torch::kFloat);

  auto bf16 = lamp::models::ResNet(std::vector<int64_t>{1, 1, 1, 1}, true);
  auto half = lamp::network_to_half(bf16, lamp::HalfOptions(torch::kBFloat16));
  expect_bf16_with_fp32_batchnorm(*bf16);
  expect_forward_backward(half, images, targets, torch::kBFloat16);
}

TEST(ResNet, Resnet18Fp16NetworkToHalfTrainsOnGpu_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  torch::manual_seed(0);
  const torch::Device device(torch::kCUDA);
  auto model = lamp::models::resnet18();
  model->to(device);
  auto half = lamp::network_to_half(model); // FP16, BatchNorm FP32
  expect_forward_backward(half, torch::randn({2, 3, 32, 32}, device),
                          labels({3, 7}, device), torch::kHalf);
  for (const auto& m : model->modules()) {
    if (dynamic_cast<const torch::nn::BatchNorm2dImpl*>(m.get()) != nullptr) {
      for (const auto& p : m->parameters()) {
        EXPECT_EQ(p.scalar_type(), torch::kFloat);
      }
    }
  }
}

// -------------------------------------------------------------- MnistCNN

TEST(MnistCNN, OutputsLogProbabilitiesPerImage) {
  torch::manual_seed(0);
  lamp::models::MnistCNN model;
  const auto out = model->forward(torch::randn({3, 1, 28, 28}));
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{3, 10}));
  EXPECT_TRUE((out <= 0).all().item<bool>());
  EXPECT_TRUE(
      lamp_test::AllClose(out.exp().sum(1), torch::ones({3}), 0.0, 1e-5));
}

TEST(MnistCNN, ParameterCountIsTheLayerArithmetic) {
  // conv1 + conv2 + fc, weights and biases:
  // (1*16*25 + 16) + (16*32*25 + 32) + (32*7*7*10 + 10) = 28,938, which is
  // also what Python's torch 1.13 counts for the same layers.
  const int64_t expected = 28938;
  EXPECT_EQ(count_parameters(*lamp::models::MnistCNN()), expected);
  // Three input channels add 2 * 16 * 25 conv1 weights; 100 classes add
  // 90 * (32 * 7 * 7 + 1) to fc.
  EXPECT_EQ(count_parameters(*lamp::models::MnistCNN(100, 3)),
            expected + 2 * 16 * 25 + 90 * (32 * 7 * 7 + 1));
}

TEST(MnistCNN, RejectsImagesThatAreNot28x28) {
  lamp::models::MnistCNN model;
  try {
    model->forward(torch::randn({2, 1, 32, 32}));
    FAIL() << "a 32x32 image reached the 32*7*7 linear layer";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[N, 1, 28, 28]"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(model->forward(torch::randn({2, 3, 28, 28})), c10::Error);
}

TEST(MnistCNN, Bf16NetworkToHalfTrains) {
  torch::manual_seed(0);
  lamp::models::MnistCNN model;
  auto half = lamp::network_to_half(model, lamp::HalfOptions(torch::kBFloat16));
  expect_bf16_with_fp32_batchnorm(*model);
  expect_forward_backward(half, torch::randn({4, 1, 28, 28}),
                          labels({0, 1, 2, 3}), torch::kBFloat16,
                          /*log_probabilities=*/true);
}

// ---------------------------------------------------------------- Models

TEST(Models, CountParametersSkipsFrozenParameters) {
  lamp::models::MnistCNN model;
  const int64_t all = count_parameters(*model);
  model->conv1->weight.requires_grad_(false);
  EXPECT_EQ(count_parameters(*model), all - 16 * 25);
  torch::nn::Sequential empty;
  EXPECT_EQ(count_parameters(*empty), 0);
}

TEST(Models, ResnetOptionsAreWhatMakeResnetBuilds) {
  const auto options = lamp::models::resnet_options("resnet50", 7, 1);
  EXPECT_EQ(options.blocks(), (std::vector<int64_t>{3, 4, 6, 3}));
  EXPECT_TRUE(options.bottleneck());
  EXPECT_EQ(options.num_classes(), 7);
  EXPECT_EQ(options.in_channels(), 1);
  EXPECT_FALSE(lamp::models::resnet_options("resnet34").bottleneck());
  lamp_test::expect_error([] { lamp::models::resnet_options("resnet19"); },
                          "valid names are resnet18, resnet34");
}

// ------------------------------------------------------- Python state_dict

// Python's Module.state_dict order for a BatchNorm model: each module's
// parameters, then its buffers, then its children.
TEST(PythonStateDict, HasPythonsKeysInPythonsOrderInFp32) {
  torch::manual_seed(0);
  auto model = lamp::models::resnet18();
  auto half = lamp::network_to_half(model, lamp::HalfOptions(torch::kBFloat16));
  const auto state = lamp::models::python_state_dict(*half, "resnet18");
  std::vector<std::string> keys;
  for (const auto& item : state) {
    keys.push_back(item.key());
  }
  ASSERT_EQ(keys.size(),
            model->named_parameters().size() + model->named_buffers().size());
  EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + 7),
            (std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias",
                                      "bn1.running_mean", "bn1.running_var",
                                      "bn1.num_batches_tracked",
                                      "layer1.0.conv1.weight"}));
  EXPECT_TRUE(has(keys, "layer2.0.shortcut.0.weight"));
  EXPECT_TRUE(has(keys, "layer2.0.shortcut.1.num_batches_tracked"));
  EXPECT_FALSE(has(keys, "layer1.0.shortcut.0.weight")); // the identity
  EXPECT_EQ(keys.back(), "linear.bias");
  const auto live = model->named_parameters();
  for (const auto& item : state) {
    const auto& tensor = item.value();
    EXPECT_TRUE(tensor.device().is_cpu()) << item.key();
    EXPECT_EQ(tensor.scalar_type(),
              item.key().find("num_batches_tracked") != std::string::npos
                  ? torch::kLong
                  : torch::kFloat)
        << item.key();
    if (const auto* p = live.find(item.key())) {
      EXPECT_TRUE(lamp_test::BitEqual(tensor, p->to(torch::kFloat)))
          << item.key();
      EXPECT_NE(tensor.data_ptr(), p->data_ptr()) << item.key();
    }
  }
  // fp32(false): the model's own dtypes (BF16 convolutions, FP32 BatchNorm).
  const auto kept = lamp::models::python_state_dict(
      *model, "resnet18", lamp::models::StateDictOptions().fp32(false));
  EXPECT_EQ(kept.at("conv1.weight").scalar_type(), torch::kBFloat16);
  EXPECT_EQ(kept.at("bn1.weight").scalar_type(), torch::kFloat);
}

// With master weights the FP32 values are the masters', not the BF16
// model's rounded copies.
TEST(PythonStateDict, TakesParametersFromTheMasterWeights) {
  torch::manual_seed(0);
  lamp::models::MnistCNN model;
  lamp::convert_network(*model, lamp::HalfOptions(torch::kBFloat16));
  lamp::MasterWeights masters(model->parameters());
  {
    torch::NoGradGuard no_grad;
    for (auto& master : masters.master_params()) {
      master.add_(1e-4); // below BF16's resolution near most weights
    }
  }
  const auto state = lamp::models::python_state_dict(
      *model, "cnn", lamp::models::StateDictOptions().master_weights(&masters));
  const auto names = parameter_names(*model);
  ASSERT_EQ(static_cast<size_t>(state.size()), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_TRUE(
        lamp_test::BitEqual(state.at(names[i]), masters.master_params()[i]))
        << names[i];
  }
}

TEST(PythonStateDict, RefusesWhatPythonsModelsDoNotHave) {
  auto resnet = lamp::models::resnet18();
  lamp::models::MnistCNN cnn;
  lamp_test::expect_error(
      [&] { lamp::models::python_state_dict(*resnet, "vgg16"); },
      "no Python model is named 'vgg16'; valid names are cnn, resnet18");
  lamp_test::expect_error(
      [&] { lamp::models::python_state_dict(*resnet, "cnn"); },
      "needs a lamp::models::MnistCNN");
  lamp_test::expect_error(
      [&] { lamp::models::python_state_dict(*cnn, "resnet18"); },
      "needs a lamp::models::ResNet");
  lamp_test::expect_error(
      [&] { lamp::models::python_state_dict(*resnet, "resnet34"); },
      "not a resnet34");
  cnn->register_module("dropout", torch::nn::Dropout(0.5));
  lamp_test::expect_error([&] { lamp::models::python_state_dict(*cnn, "cnn"); },
                          "module 'dropout' is a torch::nn::Dropout");
}

TEST(PythonStateDict, ExportWritesAFileThatLoadsBack) {
  torch::manual_seed(0);
  lamp::models::MnistCNN model;
  const auto path = ::testing::TempDir() + "lamp_export_" +
                    std::to_string(::getpid()) + ".pt";
  lamp::models::export_state_dict(*model, "cnn", path);
  const auto loaded = lamp::load_pickle(path, "test");
  ASSERT_TRUE(loaded.isGenericDict());
  const auto dict = loaded.toGenericDict();
  const auto expected = lamp::models::python_state_dict(*model, "cnn");
  ASSERT_EQ(dict.size(), expected.size());
  for (const auto& item : expected) {
    EXPECT_TRUE(
        lamp_test::BitEqual(dict.at(item.key()).toTensor(), item.value()))
        << item.key();
  }
  lamp_test::expect_error(
      [&] { lamp::models::export_state_dict(*model, "cnn", path + ".d/x.pt"); },
      "does not exist");
  std::remove(path.c_str());
}

} // namespace
