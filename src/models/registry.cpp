#include "lamp/models/registry.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "lamp/models/mnist_cnn.h"
#include "lamp/models/resnet.h"

namespace lamp {
namespace models {

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out = {"cnn"};
    const auto& resnets = resnet_names();
    out.insert(out.end(), resnets.begin(), resnets.end());
    return out;
  }();
  return names;
}

void check_model_name(const std::string& name, const std::string& caller) {
  const auto& names = model_names();
  if (std::find(names.begin(), names.end(), name) != names.end()) {
    return;
  }
  std::string valid;
  for (const auto& n : names) {
    valid += (valid.empty() ? "" : ", ") + n;
  }
  TORCH_CHECK(false, caller, ": unknown model '", name, "'; valid names are ",
              valid, ".");
}

NamedModel make_model(const std::string& name, int64_t num_classes,
                      int64_t in_channels, bool fused_batch_norm,
                      bool fold_batch_norm) {
  check_model_name(name, "lamp::models::make_model");
  if (name == "cnn") {
    MnistCNN net(num_classes, in_channels);
    return {net.ptr(),
            [net](const torch::Tensor& x) mutable { return net->forward(x); }};
  }
  ResNet net(resnet_options(name, num_classes, in_channels)
                 .fused_batch_norm(fused_batch_norm)
                 .fold_batch_norm(fold_batch_norm));
  return {net.ptr(),
          [net](const torch::Tensor& x) mutable { return net->forward(x); }};
}

torch::nn::Module& to_channels_last(torch::nn::Module& module) {
  for (auto& p : module.parameters()) {
    if (p.dim() == 4) {
      p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
    }
  }
  return module;
}

} // namespace models
} // namespace lamp
