#include "lamp/training/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>

#include "detail/archive.h"
#include "lamp/autocast.h"
#include "lamp/backends.h"
#include "lamp/optim/optimizer.h"

namespace lamp {
namespace training {
namespace {

namespace F = torch::nn::functional;
constexpr const char* kFormat = "lamp-classifier-trainer-1";

OptimizerFactory optimizer_factory(const TrainerOptions& o) {
  // Nesterov needs momentum; Adam's betas stay at their defaults.
  const auto config = optim::OptimizerConfig()
                          .name(o.optimizer())
                          .lr(o.lr())
                          .momentum(o.momentum())
                          .nesterov(o.nesterov() && o.momentum() > 0)
                          .weight_decay(o.weight_decay())
                          .implementation(o.optimizer_implementation());
  return [config](std::vector<torch::Tensor> params) {
    return optim::make_optimizer(std::move(params), config);
  };
}

// POSIX calls rather than std::filesystem: the torch wheel's libtorch exports
// its own copy of std::filesystem, which breaks programs that use the
// system's (pytorch/pytorch#133437).
bool is_directory(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

bool is_regular_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

void check_writable_parent(const std::string& path, const char* what) {
  const auto slash = path.find_last_of('/');
  const std::string parent =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  TORCH_CHECK(is_directory(parent), "lamp: the ", what, " folder ", parent,
              " does not exist; create it or choose another path for ", path,
              ".");
}

} // namespace

ClassifierTrainer::ClassifierTrainer(std::shared_ptr<torch::nn::Module> model,
                                     Forward forward, std::string model_name,
                                     data::DeviceLoader train_loader,
                                     data::DeviceLoader test_loader,
                                     TrainerOptions options)
    : model_(std::move(model)),
      forward_(std::move(forward)),
      model_name_(std::move(model_name)),
      train_loader_(std::move(train_loader)),
      test_loader_(std::move(test_loader)),
      options_(std::move(options)) {
  const auto& o = options_;
  TORCH_CHECK(o.epochs() > 0, "lamp: epochs must be positive, got ", o.epochs(), ".");
  TORCH_CHECK(o.lr() > 0 && std::isfinite(o.lr()),
              "lamp: the learning rate must be positive, got ", o.lr(), ".");
  TORCH_CHECK(o.momentum() >= 0 && o.weight_decay() >= 0,
              "lamp: momentum and weight decay must be >= 0.");
  TORCH_CHECK(o.max_steps() >= 0, "lamp: max_steps must be >= 0 (0 = no limit).");
  TORCH_CHECK(o.divergence_patience() > 0, "lamp: divergence_patience must be positive.");
  TORCH_CHECK(forward_ != nullptr, "lamp: no forward function given.");
  if (!o.checkpoint().empty()) {
    check_writable_parent(o.checkpoint(), "checkpoint");
  }
  step_ = std::make_unique<TrainStep>(
      model_, optimizer_factory(o),
      TrainStepOptions(o.precision())
          .max_grad_norm(o.max_grad_norm())
          .skip_non_finite(o.skip_non_finite())
          .cuda_graph(o.cuda_graph())
          .process_group(o.process_group()));
  TORCH_CHECK(step_->device() == train_loader_.device(),
              "lamp: the model is on ", step_->device(),
              " but the training data on ", train_loader_.device(),
              "; build the loaders for the model's device.");
  warmup_steps_left_ =
      o.cuda_graph() ? step_->options().graph_warmup_steps() + 1 : 1;
  if (!o.resume().empty()) {
    load_checkpoint(o.resume());
  }
}

std::vector<EpochStats> ClassifierTrainer::fit(
    const std::function<void(const EpochStats&)>& on_epoch,
    const std::function<void(const BatchProgress&)>& on_batch) {
  const auto& o = options_;
  const auto device = train_loader_.device();
  const int64_t batches = train_loader_.batches_per_epoch();
  // The schedule spans all epochs even when max_steps stops early, so that a
  // run cut short and resumed follows the same learning rates.
  const int64_t total_steps = o.epochs() * batches;
  const int64_t patience = o.divergence_patience();
  std::vector<EpochStats> history;
  for (int64_t epoch = start_epoch_; epoch < o.epochs(); ++epoch) {
    if (o.max_steps() > 0 && global_step_ >= o.max_steps()) {
      break;
    }
    train_loader_.set_epoch(epoch);
    model_->train();
    reset_peak_device_memory(device);
    synchronize(device);
    const auto start = std::chrono::steady_clock::now();

    EpochStats stats;
    stats.epoch = epoch + 1;
    const auto float_on_device = torch::TensorOptions().device(device);
    auto loss_sum = torch::zeros({}, float_on_device.dtype(torch::kDouble));
    auto non_finite = torch::zeros({}, float_on_device.dtype(torch::kLong));
    // Skipped steps are counted on the device (a sync-free step's flag lives
    // there) and read once per window of `patience` steps, like the loss.
    const auto flags_on_device = float_on_device.dtype(torch::kFloat);
    auto skipped = torch::zeros({}, flags_on_device);
    auto consecutive_skips = torch::zeros({}, flags_on_device);
    auto longest_skip_run = torch::zeros({}, flags_on_device);
    int64_t images = 0, window = 0, warmup_images = 0;
    const auto check_skip_run = [&](int64_t at_epoch) {
      TORCH_CHECK(longest_skip_run.item<float>() < patience,
                  "lamp: training diverged in epoch ", at_epoch + 1, ": ",
                  patience,
                  " optimizer steps in a row had inf/NaN gradients (loss "
                  "scale now ", step_->scaler().get_scale(),
                  "). Lower the learning rate (--lr), clip gradients, or "
                  "train in bf16/amp-bf16.");
    };
    for (int64_t i = 0; i < batches; ++i) {
      if (o.max_steps() > 0 && global_step_ >= o.max_steps()) {
        break;
      }
      stats.lr = learning_rate(o.schedule(), o.lr(), global_step_, total_steps);
      set_learning_rate(step_->optimizer(), stats.lr);
      const auto batch = train_loader_.batch(i);
      // The run's first step (cuDNN autotuning, allocator and cache warm-up;
      // with CUDA graphs also the eager warm-up steps and the capture) is
      // timed on its own: reported as warm-up, not in the steady rate.
      const bool warmup_step = warmup_steps_left_ > 0;
      const auto step_start = std::chrono::steady_clock::now();
      const auto result = step_->step(
          batch.images, batch.labels,
          [&](const torch::Tensor& images, const torch::Tensor& labels) {
            return F::cross_entropy(forward_(images).to(torch::kFloat), labels);
          });
      if (warmup_step) {
        synchronize(device);
        stats.warmup_seconds += std::chrono::duration<double>(
            std::chrono::steady_clock::now() - step_start).count();
        warmup_images += batch.labels.size(0);
        --warmup_steps_left_;
      }
      loss_sum += result.loss;
      non_finite += torch::isfinite(result.loss).logical_not();
      images += batch.labels.size(0);
      ++stats.steps;
      ++global_step_;
      if (result.cycle_ended) {
        const auto flag = result.found_inf.to(device, /*non_blocking=*/true);
        skipped += flag;
        consecutive_skips.add_(flag).mul_(flag);
        torch::maximum_out(longest_skip_run, longest_skip_run, consecutive_skips);
      }
      // Divergence, read once per window: a run of `patience` skipped steps,
      // or a loss that stayed non-finite for the whole window.
      if (++window == patience) {
        check_skip_run(epoch);
        TORCH_CHECK(non_finite.item<int64_t>() < patience,
                    "lamp: training diverged in epoch ", epoch + 1,
                    ": the loss was inf/NaN for ", patience,
                    " steps in a row. Lower the learning rate (--lr) or clip "
                    "gradients.");
        non_finite.zero_();
        window = 0;
      }
      if (on_batch) {
        on_batch({epoch + 1, i + 1, batches, batch.labels.size(0)});
      }
    }
    synchronize(device);
    stats.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (stats.warmup_seconds > 0 && images > warmup_images) {
      stats.seconds -= stats.warmup_seconds;
      images -= warmup_images;
    }
    const auto& group = o.process_group();
    if (group && group->is_distributed()) {
      // All ranks together: the mean of the ranks' mean losses, every
      // rank's images.
      group->all_reduce_(loss_sum);
      loss_sum.div_(group->world_size());
      images *= group->world_size();
    }
    stats.global_step = global_step_;
    stats.skipped_steps = static_cast<int64_t>(skipped.item<float>());
    check_skip_run(epoch);  // a run that reached `patience` in the last window
    stats.train_loss = stats.steps > 0 ? loss_sum.item<double>() / stats.steps : 0.0;
    stats.images_per_second = stats.seconds > 0 ? images / stats.seconds : 0.0;
    stats.peak_memory_bytes =
        device.is_cuda() ? peak_device_memory(device) : peak_host_memory();
    stats.loss_scale = step_->scaler().is_enabled() ? step_->scaler().get_scale() : 1.0;
    const auto eval_start = std::chrono::steady_clock::now();
    const bool first_evaluation = !evaluated_;
    const auto eval = evaluate();
    if (first_evaluation) {
      // The first evaluation meets the evaluation shapes first (autotuning).
      stats.warmup_seconds += std::chrono::duration<double>(
          std::chrono::steady_clock::now() - eval_start).count();
    }
    stats.test_loss = eval.first;
    stats.test_accuracy = eval.second;
    const bool epoch_complete = stats.steps == batches;
    if (epoch_complete) {
      start_epoch_ = epoch + 1;
      if (!o.checkpoint().empty() &&
          (!o.process_group() || o.process_group()->is_main())) {
        save_checkpoint(o.checkpoint());
      }
    }
    history.push_back(stats);
    if (on_epoch) {
      on_epoch(stats);
    }
  }
  return history;
}

std::pair<double, double> ClassifierTrainer::evaluate() {
  torch::NoGradGuard no_grad;
  model_->eval();
  c10::optional<Autocast> autocast;
  if (const auto dtype = autocast_dtype(options_.precision())) {
    autocast.emplace(test_loader_.device().type(), *dtype);
  }
  const auto on_device = torch::TensorOptions().device(test_loader_.device());
  auto loss_sum = torch::zeros({}, on_device.dtype(torch::kDouble));
  auto correct = torch::zeros({}, on_device.dtype(torch::kLong));
  // Data-parallel: rank r evaluates batches r, r + world, ...; the sums
  // are then added up over the ranks (each test image counted once).
  const auto& group = options_.process_group();
  const int64_t ranks = group ? group->world_size() : 1;
  const int64_t rank = group ? group->rank() : 0;
  // On CUDA every evaluation batch has the same shape: the last one is padded
  // with zero images whose outputs are dropped (eval-mode BatchNorm treats
  // each image alone), so cuDNN autotunes once instead of twice.
  const int64_t full = test_loader_.options().batch_size();
  const bool pad = test_loader_.device().is_cuda();
  for (int64_t i = rank; i < test_loader_.batches_per_epoch(); i += ranks) {
    const auto batch = test_loader_.batch(i);
    auto images = batch.images;
    const int64_t n = images.size(0);
    if (pad && n < full) {
      auto padding_sizes = images.sizes().vec();
      padding_sizes[0] = full - n;
      images = torch::cat({images, torch::zeros(padding_sizes, images.options())})
                   .contiguous(images.suggest_memory_format());
    }
    auto output = forward_(step_->cast_input(images)).to(torch::kFloat);
    if (output.size(0) != n) {
      output = output.slice(0, 0, n);
    }
    loss_sum += F::cross_entropy(output, batch.labels,
                                 F::CrossEntropyFuncOptions().reduction(torch::kSum));
    correct += output.argmax(1).eq(batch.labels).sum();
  }
  model_->train();
  evaluated_ = true;
  if (ranks > 1) {
    group->all_reduce_(loss_sum);
    auto correct_double = correct.to(torch::kDouble);
    group->all_reduce_(correct_double);
    correct = correct_double.to(torch::kLong);
  }
  const double n = static_cast<double>(test_loader_.size());
  return {loss_sum.item<double>() / n, correct.item<int64_t>() / n};
}

void ClassifierTrainer::save_checkpoint(const std::string& path) const {
  torch::serialize::OutputArchive archive;
  archive.write("format", c10::IValue(std::string(kFormat)));
  archive.write("model_name", c10::IValue(model_name_));
  archive.write("optimizer", c10::IValue(options_.optimizer()));
  archive.write("next_epoch", c10::IValue(start_epoch_));
  archive.write("global_step", c10::IValue(global_step_));
  archive.write("seed", c10::IValue(static_cast<int64_t>(train_loader_.options().seed())));
  // The data order and augmentation come from (seed, epoch); the global CPU
  // generator (weight init, dropout in users' models) is saved as well.
  archive.write("cpu_rng_state", at::detail::getDefaultCPUGenerator().get_state());
  torch::serialize::OutputArchive step_archive;
  step_->save(step_archive);
  archive.write("train_step", step_archive);
  // Written next to the target and renamed over it: a crash mid-write leaves
  // the previous checkpoint intact.
  const std::string temporary = path + ".partial";
  archive.save_to(temporary);
  TORCH_CHECK(std::rename(temporary.c_str(), path.c_str()) == 0,
              "lamp: could not move the new checkpoint ", temporary, " over ",
              path, ": ", std::strerror(errno), ".");
}

void ClassifierTrainer::load_checkpoint(const std::string& path) {
  TORCH_CHECK(is_regular_file(path), "lamp: no checkpoint at ",
              path, " to resume from.");
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "lamp: ", path, " is not a readable lamp checkpoint (",
                e.what_without_backtrace(), ").");
  }
  const std::string where_string = "lamp: " + path;
  const char* where = where_string.c_str();
  c10::IValue value;
  TORCH_CHECK(archive.try_read("format", value) && value.isString() &&
                  value.toStringRef() == kFormat,
              "lamp: ", path, " is not a checkpoint written by lamp's trainer.");
  // Everything is read and checked before the first part is loaded.
  const auto model_name =
      lamp::detail::read_string(archive, "model_name", where);
  TORCH_CHECK(model_name == model_name_, "lamp: ", path, " holds a '",
              model_name, "' model but this run trains '", model_name_,
              "'; resume with the same --model.");
  // Checkpoints from before --optimizer existed were all SGD.
  const std::string optimizer = archive.try_read("optimizer", value)
      ? lamp::detail::read_string(archive, "optimizer", where)
      : "sgd";
  TORCH_CHECK(optimizer == options_.optimizer(), "lamp: ", path,
              " was trained with the '", optimizer,
              "' optimizer but this run uses '", options_.optimizer(),
              "'; resume with --optimizer ", optimizer, ".");
  const int64_t seed = lamp::detail::read_int(archive, "seed", where);
  TORCH_CHECK(seed == static_cast<int64_t>(train_loader_.options().seed()),
              "lamp: ", path, " was trained with seed ", seed,
              " but this run uses ", train_loader_.options().seed(),
              "; resume with the same --seed to continue the same data order.");
  const int64_t next_epoch =
      lamp::detail::read_int(archive, "next_epoch", where);
  const int64_t global_step =
      lamp::detail::read_int(archive, "global_step", where);
  torch::Tensor rng_state;
  TORCH_CHECK(archive.try_read("cpu_rng_state", rng_state), "lamp: ", path,
              " has no 'cpu_rng_state'; it is corrupt.");
  // A generator of its own takes the state first: set_state refuses a
  // malformed one there, before anything of this run has changed.
  at::detail::createCPUGenerator().set_state(rng_state);
  torch::serialize::InputArchive step_archive;
  lamp::detail::read_archive(archive, "train_step", step_archive, where);
  step_->load(step_archive);
  at::Generator generator = at::detail::getDefaultCPUGenerator();  // a handle
  generator.set_state(rng_state);
  start_epoch_ = next_epoch;
  global_step_ = global_step;
}

} // namespace training
} // namespace lamp
