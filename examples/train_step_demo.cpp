// Trains lamp's MNIST CNN on a synthetic problem with lamp::TrainStep, in
// the precision given on the command line:
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


int run(const Config& config) {
  const torch::Device device(config.device);
  TORCH_CHECK(!device.is_cpu() || !device.has_index() || device.index() == 0,
              "--device ", config.device,
              ": there is only one CPU device; use --device cpu.");
  const auto precision = lamp::parse_precision(config.precision);
  torch::manual_seed(config.seed);

  // Ten classes by brightness: each image is noise plus an offset whose
  // bucket is the label.
  const auto offsets = torch::rand({config.batch_size}) * 10;
  const auto images =
      ((torch::randn({config.batch_size, 1, 28, 28}) + offsets.view({-1, 1, 1, 1}) - 5) / 3)
          .to(device);
  const auto labels = offsets.floor().clamp(0, 9).to(torch::kLong).to(device);

  lamp::models::MnistCNN net;
  net->to(device);
  lamp::TrainStep train(
      net.ptr(),
      [&](std::vector<torch::Tensor> params) {
        return std::make_unique<lamp::optim::SGD>(
            params, torch::optim::SGDOptions(config.lr).momentum(0.9));
      },
      lamp::TrainStepOptions(precision).max_grad_norm(5.0));

  const auto start = std::chrono::steady_clock::now();
  lamp::StepResult result;
  for (int step = 1; step <= config.steps; ++step) {
    result = train.step([&] {
      const auto log_probs = net->forward(train.cast_input(images));
      return torch::nn::functional::nll_loss(log_probs.to(torch::kFloat), labels);
    });
    if (step == 1 || step == config.steps || step % 10 == 0) {
      std::printf("step %4d  loss %.4f  scale %g%s\n", step,
                  result.loss.item<double>(), result.scale.item<double>(),
                  result.skipped() ? "  (skipped: non-finite gradients)" : "");
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
  CLI::App app{"Train lamp's MNIST CNN on synthetic data with lamp::TrainStep"};
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
    std::cerr << "train_step_demo: error: " << e.what_without_backtrace()
              << "\n";
    return 1;
  }
}
