#pragma once

// A user-defined module tree (a custom module holding a Sequential, a
// ModuleList, a ModuleDict and BatchNorms, one without running statistics)
// for the tests of export_state_dict() on any module; its Python twin is
// tests/python/lamp_interop.py's CustomTree.

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lamp_test {

struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    scale = register_parameter("scale", torch::rand({4}) + 0.5);
    body = register_module("body",
                           torch::nn::Sequential(torch::nn::Linear(4, 4),
                                                 torch::nn::BatchNorm1d(4)));
    offset = register_buffer("offset", torch::randn({4}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return x * scale + body->forward(x) + offset;
  }
  torch::Tensor scale;
  torch::Tensor offset;
  torch::nn::Sequential body{nullptr};
};
TORCH_MODULE(Block);

struct CustomTreeImpl : torch::nn::Module {
  CustomTreeImpl() {
    stem = register_module("stem", torch::nn::Linear(3, 4));
    blocks = register_module("blocks", torch::nn::ModuleList(Block(), Block()));
    heads = register_module(
        "heads",
        torch::nn::ModuleDict(
            std::vector<
                std::pair<std::string, std::shared_ptr<torch::nn::Module>>>{
                {"main", torch::nn::Linear(4, 2).ptr()},
                {"aux",
                 torch::nn::Linear(torch::nn::LinearOptions(4, 3).bias(false))
                     .ptr()}}));
    norm = register_module(
        "norm",
        torch::nn::BatchNorm1d(
            torch::nn::BatchNorm1dOptions(4).track_running_stats(false)));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = stem->forward(x);
    for (const auto& block : *blocks) {
      x = block->as<BlockImpl>()->forward(x);
    }
    x = norm->forward(x);
    return torch::cat({heads["main"]->as<torch::nn::LinearImpl>()->forward(x),
                       heads["aux"]->as<torch::nn::LinearImpl>()->forward(x)},
                      1);
  }
  torch::nn::Linear stem{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::ModuleDict heads{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};
TORCH_MODULE(CustomTree);

// Python's state_dict() of CustomTree, printed by torch 2.11: each module's
// parameters, its buffers, then its children; no None (aux.bias, norm's
// statistics).
inline const std::vector<std::string> kCustomTreeKeys = {
    "stem.weight",
    "stem.bias",
    "blocks.0.scale",
    "blocks.0.offset",
    "blocks.0.body.0.weight",
    "blocks.0.body.0.bias",
    "blocks.0.body.1.weight",
    "blocks.0.body.1.bias",
    "blocks.0.body.1.running_mean",
    "blocks.0.body.1.running_var",
    "blocks.0.body.1.num_batches_tracked",
    "blocks.1.scale",
    "blocks.1.offset",
    "blocks.1.body.0.weight",
    "blocks.1.body.0.bias",
    "blocks.1.body.1.weight",
    "blocks.1.body.1.bias",
    "blocks.1.body.1.running_mean",
    "blocks.1.body.1.running_var",
    "blocks.1.body.1.num_batches_tracked",
    "heads.main.weight",
    "heads.main.bias",
    "heads.aux.weight",
    "norm.weight",
    "norm.bias",
};

} // namespace lamp_test
