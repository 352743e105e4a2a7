#include "lamp/models/state_dict.h"

#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <algorithm>
#include <unordered_map>

#include "lamp/amp/half.h"
#include "lamp/amp/master_weights.h"
#include "lamp/models/mnist_cnn.h"
#include "lamp/models/resnet.h"
#include "lamp/platform/checkpoint_file.h"

namespace lamp {
namespace models {
namespace {

constexpr const char* kCaller = "lamp::models::python_state_dict";

// network_to_half() returns a HalfNetwork around the model (lamp 0.2's, a
// Sequential(InputCast, model)); Python's model is the one inside.
const torch::nn::Module& unwrap(const torch::nn::Module& model) {
  if (const auto* half = dynamic_cast<const HalfNetworkImpl*>(&model)) {
    return *half->model();
  }
  if (const auto* sequential =
          dynamic_cast<const torch::nn::SequentialImpl*>(&model)) {
    const auto children = sequential->children();
    if (children.size() == 2 &&
        dynamic_cast<const InputCastImpl*>(children[0].get()) != nullptr) {
      return *children[1];
    }
  }
  return model;
}

void check_model(const torch::nn::Module& model, const std::string& name) {
  if (name == "cnn") {
    TORCH_CHECK(
        dynamic_cast<const MnistCNNImpl*>(&model) != nullptr, kCaller,
        ": model_name 'cnn' is Python's MnistCNN, which needs a lamp::models::MnistCNN, got a ",
        model.name(), "; pass the name the model was built with.");
    return;
  }
  const auto* resnet = dynamic_cast<const ResNetImpl*>(&model);
  TORCH_CHECK(
      resnet != nullptr, kCaller, ": model_name '", name,
      "' is Python's ResNet, which needs a lamp::models::ResNet, got a ",
      model.name(), "; pass the name the model was built with.");
  const auto expected = resnet_options(name);
  TORCH_CHECK(resnet->options().blocks() == expected.blocks() &&
                  resnet->options().bottleneck() == expected.bottleneck(),
              kCaller, ": the model is a ResNet with blocks ",
              c10::IntArrayRef(resnet->options().blocks()),
              resnet->options().bottleneck() ? " (bottleneck)" : "", ", not a ",
              name, "; pass the name the model was built with.");
}

// The module types that have a counterpart of the same name and layout in
// bench/peer_pytorch.py.
bool has_python_counterpart(const torch::nn::Module& module) {
  return dynamic_cast<const torch::nn::Conv2dImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::LinearImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::SequentialImpl*>(&module) != nullptr ||
         dynamic_cast<const BasicBlockImpl*>(&module) != nullptr ||
         dynamic_cast<const BottleneckImpl*>(&module) != nullptr ||
         dynamic_cast<const ResNetImpl*>(&module) != nullptr ||
         dynamic_cast<const MnistCNNImpl*>(&module) != nullptr;
}

// Walks a module tree in Python's state_dict order. With a model name, every
// module must be one Python's model of that name has.
class Collector {
 public:
  Collector(const std::string& model_name, const StateDictOptions& options)
      : model_name_(model_name), options_(options) {
    if (options.master_weights() != nullptr && options.fp32()) {
      const auto& models = options.master_weights()->model_params();
      const auto& masters = options.master_weights()->master_params();
      for (size_t i = 0; i < models.size(); ++i) {
        masters_.emplace(models[i].unsafeGetTensorImpl(), masters[i]);
      }
    }
  }

  // Python's Module.state_dict order: a module's parameters, its buffers,
  // then its children, depth first.
  void collect(const torch::nn::Module& module, const std::string& prefix) {
    TORCH_CHECK(
        model_name_.empty() || has_python_counterpart(module), kCaller,
        ": module '",
        prefix.empty() ? std::string("(root)")
                       : prefix.substr(0, prefix.size() - 1),
        "' is a ", module.name(), ", which Python's '", model_name_,
        "' (bench/peer_pytorch.py) does not have; only lamp's MnistCNN and ResNet, as lamp builds them, can be exported.");
    // Undefined tensors are Python's None, which state_dict leaves out.
    for (const auto& item : module.named_parameters(/*recurse=*/false)) {
      if (item.value().defined()) {
        add(prefix + item.key(), item.value());
      }
    }
    for (const auto& item : module.named_buffers(/*recurse=*/false)) {
      if (item.value().defined()) {
        add(prefix + item.key(), item.value());
      }
    }
    for (const auto& item : module.named_children()) {
      collect(*item.value(), prefix + item.key() + ".");
    }
  }

  c10::Dict<std::string, torch::Tensor> result() && { return std::move(dict_); }

 private:
  void add(const std::string& key, const torch::Tensor& tensor) {
    // A tensor registered under several names (a tied weight) is one tensor
    // under each of them, as in Python's state_dict: torch.save then stores
    // it once, and Python's load_state_dict ties the copies again.
    const auto exported = exported_.find(tensor.unsafeGetTensorImpl());
    if (exported != exported_.end()) {
      dict_.insert(key, exported->second);
      return;
    }
    torch::Tensor source = tensor;
    const auto master = masters_.find(tensor.unsafeGetTensorImpl());
    if (master != masters_.end()) {
      TORCH_CHECK(master->second.sizes() == tensor.sizes(), kCaller,
                  ": the master weight of '", key, "' has shape ",
                  master->second.sizes(), " but the parameter ", tensor.sizes(),
                  "; pass the master weights of this model.");
      source = master->second;
    }
    auto dtype = source.scalar_type();
    if (options_.fp32() && source.is_floating_point()) {
      dtype = torch::kFloat;
    }
    // A copy of its own: flat master weights and channels-last weights are
    // views and strided layouts that Python should not inherit.
    const auto copy = source.detach()
                          .to(torch::kCPU, dtype)
                          .contiguous()
                          .clone(torch::MemoryFormat::Contiguous);
    exported_.emplace(tensor.unsafeGetTensorImpl(), copy);
    dict_.insert(key, copy);
  }

  const std::string model_name_; // empty: any module tree
  const StateDictOptions& options_;
  std::unordered_map<const c10::TensorImpl*, torch::Tensor> masters_;
  std::unordered_map<const c10::TensorImpl*, torch::Tensor> exported_;
  c10::Dict<std::string, torch::Tensor> dict_;
};

} // namespace

const std::vector<std::string>& python_model_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out = {"cnn"};
    out.insert(out.end(), resnet_names().begin(), resnet_names().end());
    return out;
  }();
  return names;
}

c10::Dict<std::string, torch::Tensor> python_state_dict(
    const torch::nn::Module& model, const std::string& model_name,
    const StateDictOptions& options) {
  const auto& names = python_model_names();
  TORCH_CHECK(std::find(names.begin(), names.end(), model_name) != names.end(),
              kCaller, ": no Python model is named '", model_name,
              "'; valid names are ", c10::Join(", ", names), ".");
  const auto& inner = unwrap(model);
  check_model(inner, model_name);
  Collector collector(model_name, options);
  collector.collect(inner, "");
  return std::move(collector).result();
}

c10::Dict<std::string, torch::Tensor> python_state_dict(
    const torch::nn::Module& module, const StateDictOptions& options) {
  Collector collector("", options);
  collector.collect(unwrap(module), "");
  return std::move(collector).result();
}

void export_state_dict(const torch::nn::Module& module, const std::string& path,
                       const StateDictOptions& options) {
  check_checkpoint_path(path, "lamp::models::export_state_dict");
  save_pickle(python_state_dict(module, options), path);
}

void export_state_dict(const torch::nn::Module& model,
                       const std::string& model_name, const std::string& path,
                       const StateDictOptions& options) {
  check_checkpoint_path(path, "lamp::models::export_state_dict");
  save_pickle(python_state_dict(model, model_name, options), path);
}

} // namespace models
} // namespace lamp
