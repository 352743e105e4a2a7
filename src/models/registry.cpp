#include "lamp/models/registry.h"

#include <c10/util/Exception.h>

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

NamedModel make_model(const std::string& name, int64_t num_classes,
                      int64_t in_channels) {
  if (name == "cnn") {
    MnistCNN net(num_classes, in_channels);
    return {net.ptr(), [net](const torch::Tensor& x) mutable { return net->forward(x); }};
  }
  bool known = false;
  for (const auto& resnet : resnet_names()) {
    known = known || resnet == name;
  }
  if (!known) {
    std::string valid;
    for (const auto& n : model_names()) {
      valid += (valid.empty() ? "" : ", ") + n;
    }
    TORCH_CHECK(false, "lamp::models::make_model: unknown model '", name,
                "'; valid names are ", valid, ".");
  }
  auto net = make_resnet(name, num_classes, in_channels);
  return {net.ptr(), [net](const torch::Tensor& x) mutable { return net->forward(x); }};
}

} // namespace models
} // namespace lamp
