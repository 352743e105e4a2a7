// Trains a small conv net with BatchNorm on a synthetic problem with
// lamp::TrainStep, in the precision given on the command line:
//
//   train_step_demo --precision amp-bf16 --steps 100
//
// It shows the whole library in use: network_to_half and master weights
// ("half", "bf16"), Autocast ("amp", "amp-bf16") and GradScaler ("amp",
// "half"), all behind one step() call.
#include <CLI/CLI.hpp>
#include <lamp/lamp.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <iostream>

namespace {

struct Config {
  std::string precision = "fp32";
  std::string device = "cpu";
  int steps = 50;
  int batch_size = 64;
  double lr = 0.05;
  uint64_t seed = 0;
};

struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv1(torch::nn::Conv2dOptions(3, 16, 3).padding(1).bias(false)),
        bn1(16),
        conv2(torch::nn::Conv2dOptions(16, 32, 3).stride(2).padding(1).bias(false)),
        bn2(32),
        fc(32, 4) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    register_module("fc", fc);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::relu(bn1(conv1(x)));
    y = torch::relu(bn2(conv2(y)));
    return fc(torch::adaptive_avg_pool2d(y, {1, 1}).flatten(1));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Linear fc;
};
TORCH_MODULE(Net);

int run(const Config& config) {
  const torch::Device device(config.device);
  const auto precision = lamp::parse_precision(config.precision);
  torch::manual_seed(config.seed);

  // Labels follow each image's per-channel offset through a fixed projection.
  const auto offsets = torch::randn({config.batch_size, 3, 1, 1});
  const auto images = (torch::randn({config.batch_size, 3, 16, 16}) + 2 * offsets).to(device);
  const auto labels = offsets.flatten(1).mm(torch::randn({3, 4})).argmax(1).to(device);

  Net net;
  net->to(device);
  lamp::TrainStep train(
      net.ptr(),
      [&](std::vector<torch::Tensor> params) {
        return std::make_unique<torch::optim::SGD>(
            params, torch::optim::SGDOptions(config.lr).momentum(0.9));
      },
      lamp::TrainStepOptions(precision).max_grad_norm(5.0));

  const auto start = std::chrono::steady_clock::now();
  lamp::StepResult result;
  for (int step = 1; step <= config.steps; ++step) {
    result = train.step([&] {
      const auto logits = net->forward(train.cast_input(images));
      return torch::nn::functional::cross_entropy(logits.to(torch::kFloat), labels);
    });
    if (step == 1 || step == config.steps || step % 10 == 0) {
      std::printf("step %4d  loss %.4f  scale %g%s\n", step,
                  result.loss.item<double>(), result.scale.item<double>(),
                  result.skipped ? "  (skipped: non-finite gradients)" : "");
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s on %s: %d steps in %.3f s, final loss %.4f, %lld skipped\n",
              lamp::to_string(precision).c_str(), device.str().c_str(),
              config.steps, seconds, result.loss.item<double>(),
              static_cast<long long>(train.scaler().steps_skipped()));
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  Config config;
  CLI::App app{"Train a small CNN on synthetic data with lamp::TrainStep"};
  app.add_option("--precision", config.precision, "fp32|tf32|amp|amp-bf16|half|bf16")
      ->check(CLI::IsMember({"fp32", "tf32", "amp", "amp-bf16", "half", "fp16", "bf16"}))
      ->capture_default_str();
  app.add_option("--device", config.device, "cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--steps", config.steps, "optimizer steps")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch-size", config.batch_size, "images per step")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", config.lr, "SGD learning rate")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--seed", config.seed, "random seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(config);
  } catch (const c10::Error& e) {
    std::cerr << "train_step_demo: " << e.what_without_backtrace() << "\n";
    return 1;
  }
}
