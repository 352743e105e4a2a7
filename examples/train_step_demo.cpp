// Trains lamp's MNIST CNN on a synthetic problem with lamp::TrainStep, in
// the precision given on the command line:
//
//   train_step_demo --precision amp-bf16 --steps 100
//
// It shows the whole library in use: network_to_half and master weights
// ("half", "bf16"), Autocast ("amp", "amp-bf16") and GradScaler ("amp",
// "half"), all behind one step() call.
#include <lamp/lamp.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>

#include "common/cli.h"

namespace {

struct Config {
  std::string precision = "fp32";
  std::string device = "cpu";
  int64_t steps = 50;
  int64_t batch_size = 64;
  double lr = 0.05;
  uint64_t seed = 0;
  int64_t threads = 0; // 0: OMP_NUM_THREADS, else the physical cores
};

int run(const Config& config) {
  const int64_t threads = lamp_examples::use_threads(config.threads);
  const auto device = lamp_examples::resolve_device(config.device);
  // "auto" becomes the mode the device's rule picks, before the model is
  // converted for it.
  const auto requested = lamp::parse_precision(config.precision);
  const auto precision = lamp::resolve_precision(requested, device);
  torch::manual_seed(config.seed);

  // Ten classes by brightness: each image is noise plus an offset whose
  // bucket is the label.
  const auto offsets = torch::rand({config.batch_size}) * 10;
  const auto images = ((torch::randn({config.batch_size, 1, 28, 28}) +
                        offsets.view({-1, 1, 1, 1}) - 5) /
                       3)
                          .to(device);
  const auto labels = offsets.floor().clamp(0, 9).to(torch::kLong).to(device);

  lamp::models::MnistCNN net;
  net->to(device);
  // fastai's recipe in "half"/"bf16": network_to_half converts the network
  // (BatchNorm stays FP32) and puts an input cast in front, so the loss
  // closure feeds FP32 images; TrainStep finds the model converted.
  std::function<torch::Tensor(const torch::Tensor&)> forward =
      [net](const torch::Tensor& x) mutable { return net->forward(x); };
  if (const auto dtype = lamp::precision_policy(precision).model_dtype) {
    auto half_net = lamp::network_to_half(net, lamp::HalfOptions(*dtype));
    forward = [half_net](const torch::Tensor& x) mutable {
      return half_net->forward(x);
    };
  }
  lamp::TrainStep train(
      net.ptr(),
      [&](std::vector<torch::Tensor> params) {
        return std::make_unique<lamp::optim::SGD>(
            params, torch::optim::SGDOptions(config.lr).momentum(0.9));
      },
      lamp::TrainStepOptions(precision).max_grad_norm(5.0));

  const auto start = std::chrono::steady_clock::now();
  lamp::StepResult result;
  for (int64_t step = 1; step <= config.steps; ++step) {
    result = train.step([&] {
      const auto log_probs = forward(images);
      return torch::nn::functional::nll_loss(log_probs.to(torch::kFloat),
                                             labels);
    });
    if (step == 1 || step == config.steps || step % 10 == 0) {
      std::printf("step %4lld  loss %.4f  scale %g%s\n",
                  static_cast<long long>(step), result.loss.item<double>(),
                  result.scale.item<double>(),
                  result.skipped() ? "  (skipped: non-finite gradients)" : "");
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf(
      "%s%s on %s (%lld %s): %lld steps in %.3f s, final loss %.4f, %lld "
      "skipped\n",
      lamp::to_string(precision).c_str(),
      requested == lamp::Precision::kAuto ? " (auto)" : "",
      device.str().c_str(), static_cast<long long>(threads),
      threads == 1 ? "thread" : "threads", static_cast<long long>(config.steps),
      seconds, result.loss.item<double>(),
      static_cast<long long>(train.scaler().steps_skipped()));
  // A run that diverged is a failure, as in the other programs.
  TORCH_CHECK(std::isfinite(result.loss.item<double>()),
              "the final loss is not finite: the run diverged; lower --lr.");
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  namespace cli = lamp_examples;
  Config config;
  CLI::App app{"Train lamp's MNIST CNN on synthetic data with lamp::TrainStep",
               "train_step_demo"};
  app.add_option(
         "--precision", config.precision,
         "fp32 | tf32 | amp | amp-bf16 | half | bf16 (fp16 = half) | fp8 | "
         "auto (the device's fastest mode that keeps fp32's accuracy)")
      ->check(CLI::IsMember(cli::precision_flag_values()))
      ->capture_default_str();
  app.add_option("--device", config.device, "cpu, cuda or cuda:N")
      ->capture_default_str();
  app.add_option("--steps", config.steps, "optimizer steps")
      ->check(cli::integer_in(1, 1000000000))
      ->capture_default_str();
  app.add_option("--batch-size", config.batch_size, "images per step")
      ->check(cli::integer_in(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--lr", config.lr, "SGD learning rate")
      ->check(cli::positive_real())
      ->capture_default_str();
  app.add_option("--seed", config.seed, "random seed")
      ->check(cli::unsigned_integer())
      ->capture_default_str();
  app.add_option("--threads", config.threads,
                 "intra-op CPU threads (0 = OMP_NUM_THREADS where set, else "
                 "the physical cores this process may use)")
      ->check(cli::integer_in(0, 4096))
      ->capture_default_str();
  cli::add_version_flag(app, "train_step_demo");
  cli::SettingsSources sources; // the flags --config set, for the errors
  const int status =
      cli::parse_command_line(app, "train_step_demo", argc, argv, {}, &sources);
  if (status >= 0) {
    return status;
  }
  return cli::guarded_main(
      "train_step_demo", [&] { return run(config); }, sources);
}
