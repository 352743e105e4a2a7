// Uses an installed lamp through <lamp/lamp.h>: converts a small network to
// BF16 with BatchNorm kept in FP32, runs it, builds a GradScaler, and checks
// that the library is the version of the headers.

#include <lamp/lamp.h>
#include <torch/torch.h>

#include <exception>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv(register_module(
            "conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(4))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    return bn->forward(conv->forward(x));
  }

  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
};
TORCH_MODULE(Net);

void expect_dtype(const torch::Tensor& tensor, torch::Dtype dtype,
                  const std::string& what) {
  if (tensor.scalar_type() != dtype) {
    std::ostringstream message;
    message << what << " is " << tensor.scalar_type() << ", expected " << dtype;
    throw std::runtime_error(message.str());
  }
}

} // namespace

int main() {
  try {
    torch::manual_seed(0);
    Net net;
    auto model =
        lamp::network_to_half(net, lamp::HalfOptions(torch::kBFloat16));
    expect_dtype(net->conv->weight, torch::kBFloat16, "conv.weight");
    expect_dtype(net->bn->weight, torch::kFloat, "bn.weight");
    expect_dtype(net->bn->running_mean, torch::kFloat, "bn.running_mean");

    // The InputCast in front takes FP32 input; BF16 conv runs on every
    // supported LibTorch's CPU.
    const auto output = model->forward(torch::randn({2, 3, 8, 8}));
    expect_dtype(output, torch::kBFloat16, "the model's output");

    lamp::GradScaler scaler;
    const auto scaled = scaler.scale(torch::ones({}));
    if (scaler.get_scale() != 65536.0 || scaled.item<float>() != 65536.0f) {
      throw std::runtime_error("GradScaler did not start at a scale of 65536");
    }

    // Headers and library of the same install.
    if (std::string(lamp::version()) != LAMP_VERSION) {
      throw std::runtime_error(std::string("lamp's headers are ") +
                               LAMP_VERSION + " but its library is " +
                               lamp::version());
    }

    std::cout << "lamp consumer OK " << lamp::version() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "lamp consumer FAILED: " << e.what() << std::endl;
    return 1;
  }
}
