#include "lamp/models/resnet.h"

#include <torch/types.h>

#include <sstream>
#include <utility>

#include "lamp/ops/batch_norm_relu.h"
#include "lamp/ops/conv_batch_norm.h"
#include "lamp/platform/parameters.h"

namespace lamp {
namespace models {
namespace {

torch::nn::Conv2d conv3x3(int64_t in_planes, int64_t out_planes,
                          int64_t stride) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in_planes, out_planes, 3)
                               .stride(stride)
                               .padding(1)
                               .bias(false));
}

torch::nn::Conv2d conv1x1(int64_t in_planes, int64_t out_planes,
                          int64_t stride) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in_planes, out_planes, 1)
                               .stride(stride)
                               .bias(false));
}

// kuangliu's projection shortcut; an empty holder means the identity.
torch::nn::Sequential make_shortcut(int64_t in_planes, int64_t out_planes,
                                    int64_t stride) {
  if (stride == 1 && in_planes == out_planes) {
    return torch::nn::Sequential(nullptr);
  }
  return torch::nn::Sequential(conv1x1(in_planes, out_planes, stride),
                               torch::nn::BatchNorm2d(out_planes));
}

template <typename Block>
torch::nn::Sequential make_stage(int64_t& in_planes, int64_t planes,
                                 int64_t num_blocks, int64_t stride, bool fused,
                                 bool fold, const std::string& name) {
  torch::nn::Sequential stage;
  for (int64_t i = 0; i < num_blocks; ++i) {
    Block block(in_planes, planes, i == 0 ? stride : 1, fused, fold);
    block->set_label(name + "." + std::to_string(i));
    stage->push_back(block);
    in_planes = planes * Block::Impl::kExpansion;
  }
  return stage;
}

// The folded path applies in training where cuDNN's graphs can run; the
// reference would be slower than the fused_batch_norm level everywhere else.
bool use_folded(bool fold, const torch::nn::Module& block,
                const torch::Tensor& x) {
  return fold && block.is_training() &&
         ops::folded_conv_fallback_reason(x).empty();
}

ops::ConvBatchNormLayer layer(const torch::nn::Conv2d& conv,
                              const torch::nn::BatchNorm2d& bn,
                              const std::string& name) {
  return {conv, bn, name};
}

// The projection shortcut as a folded layer (its Sequential's two
// children).
ops::ConvBatchNormLayer shortcut_layer(const torch::nn::Sequential& shortcut,
                                       const std::string& label) {
  return {torch::nn::Conv2d(std::dynamic_pointer_cast<torch::nn::Conv2dImpl>(
              shortcut->ptr(0))),
          torch::nn::BatchNorm2d(
              std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(
                  shortcut->ptr(1))),
          label + ".shortcut"};
}

// relu(bn(x)) and relu(bn(x) + residual): fused, or the stock ops.
torch::Tensor bn_relu(const torch::Tensor& x, torch::nn::BatchNorm2d& bn,
                      bool fused) {
  return fused ? ops::batch_norm_relu(x, bn) : torch::relu(bn->forward(x));
}

torch::Tensor bn_add_relu(const torch::Tensor& x, const torch::Tensor& residual,
                          torch::nn::BatchNorm2d& bn, bool fused) {
  // Out of place: `x` and `residual` are saved for backward by the
  // BatchNorm and the shortcut, so an in-place add or ReLU would corrupt the
  // autograd graph.
  return fused ? ops::batch_norm_add_relu(x, residual, bn)
               : torch::relu(bn->forward(x) + residual);
}

std::string join_names(const std::vector<std::string>& names) {
  std::ostringstream out;
  for (size_t i = 0; i < names.size(); ++i) {
    out << (i == 0 ? "" : ", ") << names[i];
  }
  return out.str();
}

} // namespace

BasicBlockImpl::BasicBlockImpl(int64_t in_planes, int64_t planes,
                               int64_t stride, bool fused_batch_norm,
                               bool fold_batch_norm)
    : conv1(register_module("conv1", conv3x3(in_planes, planes, stride))),
      bn1(register_module("bn1", torch::nn::BatchNorm2d(planes))),
      conv2(register_module("conv2", conv3x3(planes, planes, 1))),
      bn2(register_module("bn2", torch::nn::BatchNorm2d(planes))),
      shortcut(make_shortcut(in_planes, planes * kExpansion, stride)),
      fused_(fused_batch_norm),
      fold_(fold_batch_norm) {
  if (!shortcut.is_empty()) {
    register_module("shortcut", shortcut);
  }
}

torch::Tensor BasicBlockImpl::forward_folded(const torch::Tensor& x,
                                             ops::FoldedBackend backend) {
  const std::vector<ops::ConvBatchNormLayer> chain = {
      layer(conv1, bn1, label_ + ".conv1"),
      layer(conv2, bn2, label_ + ".conv2")};
  if (shortcut.is_empty()) {
    return ops::folded_residual_block(x, chain, nullptr, backend);
  }
  const auto projection = shortcut_layer(shortcut, label_);
  return ops::folded_residual_block(x, chain, &projection, backend);
}

torch::Tensor BasicBlockImpl::forward(torch::Tensor x) {
  if (use_folded(fold_, *this, x)) {
    return forward_folded(x);
  }
  auto out = bn_relu(conv1->forward(x), bn1, fused_);
  return bn_add_relu(conv2->forward(out),
                     shortcut.is_empty() ? x : shortcut->forward(x), bn2,
                     fused_);
}

BottleneckImpl::BottleneckImpl(int64_t in_planes, int64_t planes,
                               int64_t stride, bool fused_batch_norm,
                               bool fold_batch_norm)
    : conv1(register_module("conv1", conv1x1(in_planes, planes, 1))),
      bn1(register_module("bn1", torch::nn::BatchNorm2d(planes))),
      conv2(register_module("conv2", conv3x3(planes, planes, stride))),
      bn2(register_module("bn2", torch::nn::BatchNorm2d(planes))),
      conv3(register_module("conv3", conv1x1(planes, planes * kExpansion, 1))),
      bn3(register_module("bn3", torch::nn::BatchNorm2d(planes * kExpansion))),
      shortcut(make_shortcut(in_planes, planes * kExpansion, stride)),
      fused_(fused_batch_norm),
      fold_(fold_batch_norm) {
  if (!shortcut.is_empty()) {
    register_module("shortcut", shortcut);
  }
}

torch::Tensor BottleneckImpl::forward_folded(const torch::Tensor& x,
                                             ops::FoldedBackend backend) {
  const std::vector<ops::ConvBatchNormLayer> chain = {
      layer(conv1, bn1, label_ + ".conv1"),
      layer(conv2, bn2, label_ + ".conv2"),
      layer(conv3, bn3, label_ + ".conv3")};
  if (shortcut.is_empty()) {
    return ops::folded_residual_block(x, chain, nullptr, backend);
  }
  const auto projection = shortcut_layer(shortcut, label_);
  return ops::folded_residual_block(x, chain, &projection, backend);
}

torch::Tensor BottleneckImpl::forward(torch::Tensor x) {
  if (use_folded(fold_, *this, x)) {
    return forward_folded(x);
  }
  auto out = bn_relu(conv1->forward(x), bn1, fused_);
  out = bn_relu(conv2->forward(out), bn2, fused_);
  return bn_add_relu(conv3->forward(out),
                     shortcut.is_empty() ? x : shortcut->forward(x), bn3,
                     fused_);
}

ResNetImpl::ResNetImpl(const std::vector<int64_t>& blocks, bool bottleneck,
                       int64_t num_classes, int64_t in_channels)
    : ResNetImpl(ResNetOptions(blocks, bottleneck)
                     .num_classes(num_classes)
                     .in_channels(in_channels)) {}

ResNetImpl::ResNetImpl(const ResNetOptions& options) : options_(options) {
  const auto& blocks = options_.blocks();
  TORCH_CHECK(
      blocks.size() == 4,
      "lamp::models::ResNet: blocks must hold one count per stage, four in all (ResNet18: {2, 2, 2, 2}), got ",
      blocks.size(), ".");
  for (size_t i = 0; i < blocks.size(); ++i) {
    TORCH_CHECK(blocks[i] >= 1, "lamp::models::ResNet: blocks[", i,
                "] must be at least 1, got ", blocks[i], ".");
  }
  TORCH_CHECK(options_.num_classes() >= 1,
              "lamp::models::ResNet: num_classes must be at least 1, got ",
              options_.num_classes(), ".");
  TORCH_CHECK(options_.in_channels() >= 1,
              "lamp::models::ResNet: in_channels must be at least 1, got ",
              options_.in_channels(), ".");

  conv1 = register_module("conv1", conv3x3(options_.in_channels(), 64, 1));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(64));
  int64_t in_planes = 64;
  const auto stage = [&](int64_t planes, int64_t num_blocks, int64_t stride,
                         const std::string& name) {
    const bool fused = options_.fused_batch_norm();
    const bool fold = options_.fold_batch_norm();
    return options_.bottleneck()
               ? make_stage<Bottleneck>(in_planes, planes, num_blocks, stride,
                                        fused, fold, name)
               : make_stage<BasicBlock>(in_planes, planes, num_blocks, stride,
                                        fused, fold, name);
  };
  layer1 = register_module("layer1", stage(64, blocks[0], 1, "layer1"));
  layer2 = register_module("layer2", stage(128, blocks[1], 2, "layer2"));
  layer3 = register_module("layer3", stage(256, blocks[2], 2, "layer3"));
  layer4 = register_module("layer4", stage(512, blocks[3], 2, "layer4"));
  linear = register_module(
      "linear", torch::nn::Linear(in_planes, options_.num_classes()));
}

torch::Tensor ResNetImpl::forward(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 4 && x.size(1) == options_.in_channels(),
              "lamp::models::ResNet: input must be [N, ",
              options_.in_channels(), ", H, W] (in_channels ",
              options_.in_channels(), "), got ", x.sizes(), ".");
  auto out = bn_relu(conv1->forward(x), bn1, options_.fused_batch_norm());
  out = layer1->forward(out);
  out = layer2->forward(out);
  out = layer3->forward(out);
  out = layer4->forward(out);
  out = torch::adaptive_avg_pool2d(out, {1, 1}).flatten(1);
  return linear->forward(out);
}

namespace {

// He et al.'s depths: blocks per stage and the block type.
struct Depth {
  const char* name;
  std::vector<int64_t> blocks;
  bool bottleneck;
};

const std::vector<Depth>& depths() {
  static const std::vector<Depth> table = {{"resnet18", {2, 2, 2, 2}, false},
                                           {"resnet34", {3, 4, 6, 3}, false},
                                           {"resnet50", {3, 4, 6, 3}, true},
                                           {"resnet101", {3, 4, 23, 3}, true},
                                           {"resnet152", {3, 8, 36, 3}, true}};
  return table;
}

} // namespace

ResNet resnet18(int64_t num_classes, int64_t in_channels) {
  return make_resnet("resnet18", num_classes, in_channels);
}

ResNet resnet34(int64_t num_classes, int64_t in_channels) {
  return make_resnet("resnet34", num_classes, in_channels);
}

ResNet resnet50(int64_t num_classes, int64_t in_channels) {
  return make_resnet("resnet50", num_classes, in_channels);
}

ResNet resnet101(int64_t num_classes, int64_t in_channels) {
  return make_resnet("resnet101", num_classes, in_channels);
}

ResNet resnet152(int64_t num_classes, int64_t in_channels) {
  return make_resnet("resnet152", num_classes, in_channels);
}

const std::vector<std::string>& resnet_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& depth : depths()) {
      out.emplace_back(depth.name);
    }
    return out;
  }();
  return names;
}

ResNetOptions resnet_options(const std::string& name, int64_t num_classes,
                             int64_t in_channels) {
  for (const auto& depth : depths()) {
    if (name == depth.name) {
      return ResNetOptions(depth.blocks, depth.bottleneck)
          .num_classes(num_classes)
          .in_channels(in_channels);
    }
  }
  TORCH_CHECK(false, "lamp::models::make_resnet: unknown model '", name,
              "'; valid names are ", join_names(resnet_names()), ".");
}

ResNet make_resnet(const std::string& name, int64_t num_classes,
                   int64_t in_channels) {
  return ResNet(resnet_options(name, num_classes, in_channels));
}

int64_t count_parameters(const torch::nn::Module& module) {
  int64_t count = 0;
  for (const auto& p : unique_parameters(module)) {
    if (p.requires_grad()) {
      count += p.numel();
    }
  }
  return count;
}

} // namespace models
} // namespace lamp
