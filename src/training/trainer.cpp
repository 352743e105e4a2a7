#include "lamp/training/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "data/files.h"
#include "lamp/optim/optimizer.h"
#include "lamp/platform/backends.h"
#include "lamp/platform/checkpoint_file.h"
#include "platform/archive.h"

namespace lamp {
namespace training {
namespace {

namespace F = torch::nn::functional;
// 2: checksummed (checkpoint_file.h), with the run's settings, which a resume
// must repeat.
constexpr const char* kFormat = "lamp-classifier-trainer-2";

OptimizerFactory optimizer_factory(const TrainerOptions& o) {
  // Nesterov needs momentum; Adam's betas stay at their defaults.
  const auto config = optim::OptimizerConfig()
                          .name(o.optimizer())
                          .lr(o.lr())
                          .momentum(o.momentum())
                          .nesterov(o.nesterov() && o.momentum() > 0)
                          .weight_decay(o.weight_decay())
                          .no_bias_decay(o.no_bias_decay())
                          .implementation(o.optimizer_implementation());
  return [config](std::vector<torch::Tensor> params) {
    return optim::make_optimizer(std::move(params), config);
  };
}

// Anything at `path` (data/files.h: POSIX, not std::filesystem).
bool exists(const std::string& path) {
  return data::internal::path_kind(path) != data::internal::PathKind::kMissing;
}

// A double as text that reads back as the same double ("0.05", not
// "0.050000000000000003", unless that is needed to tell two apart).
std::string exact(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.15g", value);
  if (std::strtod(text, nullptr) != value) {
    std::snprintf(text, sizeof(text), "%.17g", value);
  }
  return text;
}

// Typed reads of a checkpoint's fields (platform/archive.h), and the check
// that a setting is the same as in the run that wrote it.
class FieldReader {
 public:
  FieldReader(torch::serialize::InputArchive& archive, const std::string& path)
      : archive_(archive), where_("lamp: " + path), path_(path) {}

  int64_t integer(const char* key) {
    return detail::read_int(archive_, key, where_.c_str());
  }
  double real(const char* key) {
    return detail::read_number(archive_, key, where_.c_str());
  }
  std::string text(const char* key) {
    return detail::read_string(archive_, key, where_.c_str());
  }
  /// A setting added to the format later: `fallback` (what runs did before
  /// it was stored) where the checkpoint predates it.
  int64_t integer_or(const char* key, int64_t fallback) {
    c10::IValue value;
    return archive_.try_read(key, value) ? integer(key) : fallback;
  }
  bool boolean_or(const char* key, bool fallback) {
    c10::IValue value;
    return archive_.try_read(key, value)
               ? detail::read_bool(archive_, key, where_.c_str())
               : fallback;
  }
  void section(const char* key, torch::serialize::InputArchive& part) {
    detail::read_archive(archive_, key, part, where_.c_str());
  }

  /// A setting the resumed run must repeat: `flag` names it for the user.
  void same(const char* flag, const std::string& stored,
            const std::string& now) {
    TORCH_CHECK(stored == now, "lamp: ", path_, " was trained with ", flag, " ",
                stored, " but this run uses ", now, "; resume with ", flag, " ",
                stored,
                " (a resumed run continues the same schedule and data order).");
  }

 private:
  torch::serialize::InputArchive& archive_;
  const std::string where_;
  const std::string& path_;
};

// The first parameter or floating-point buffer with inf/NaN values, as
// "parameter 'fc.weight'", or "" when all are finite.
std::string first_non_finite(const torch::nn::Module& model) {
  for (const auto& item : model.named_parameters()) {
    if (!torch::isfinite(item.value()).all().item<bool>()) {
      return "parameter '" + item.key() + "'";
    }
  }
  for (const auto& item : model.named_buffers()) {
    const auto& b = item.value();
    if (b.is_floating_point() && !torch::isfinite(b).all().item<bool>()) {
      return "buffer '" + item.key() + "'";
    }
  }
  return "";
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
  TORCH_CHECK(o.epochs() > 0, "lamp: epochs must be positive, got ", o.epochs(),
              ".");
  TORCH_CHECK(o.lr() > 0 && std::isfinite(o.lr()),
              "lamp: the learning rate must be positive, got ", o.lr(), ".");
  TORCH_CHECK(o.momentum() >= 0 && o.weight_decay() >= 0,
              "lamp: momentum and weight decay must be >= 0.");
  TORCH_CHECK(o.max_steps() >= 0,
              "lamp: max_steps must be >= 0 (0 = no limit).");
  TORCH_CHECK(o.divergence_patience() > 0,
              "lamp: divergence_patience must be positive.");
  TORCH_CHECK(o.accumulation_steps() >= 1,
              "lamp: accumulation_steps must be >= 1, got ",
              o.accumulation_steps(), ".");
  TORCH_CHECK(forward_ != nullptr, "lamp: no forward function given.");
  const int64_t batches = train_loader_.batches_per_epoch();
  TORCH_CHECK(batches > 0, "lamp: the training loader has no batches (",
              train_loader_.samples_per_epoch(),
              " samples per epoch, batch size ",
              train_loader_.options().batch_size(),
              ", drop_last); use a smaller batch size.");
  if (batches % o.accumulation_steps() != 0) {
    std::string divisors;
    for (int64_t d = 1; d <= std::min<int64_t>(batches, 64); ++d) {
      if (batches % d == 0) {
        divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
      }
    }
    TORCH_CHECK(false, "lamp: ", o.accumulation_steps(),
                " accumulation steps do not divide the ", batches,
                " batches of an epoch, so an epoch (and its checkpoint) would "
                "end inside an accumulation cycle; use one of ",
                divisors, batches > 64 ? ", ..." : "",
                ", or another batch size (or drop_last) that makes the "
                "batches per epoch a multiple of it.");
  }
  TORCH_CHECK(o.epochs() <= std::numeric_limits<int64_t>::max() / batches,
              "lamp: ", o.epochs(), " epochs of ", batches,
              " steps overflow the step counter; use fewer epochs.");
  const auto& group = o.process_group();
  if (!o.checkpoint().empty() && (!group || group->is_main())) {
    // Before any training: a bad path, an unwritable folder or another run
    // writing the same checkpoint fail now, not after the first epoch.
    check_checkpoint_path(o.checkpoint(), "checkpoint");
    lock_ = std::make_unique<CheckpointLock>(o.checkpoint());
  }
  step_ = std::make_unique<TrainStep>(
      model_, optimizer_factory(o),
      TrainStepOptions(o.precision())
          .max_grad_norm(o.max_grad_norm())
          .accumulation_steps(o.accumulation_steps())
          .skip_non_finite(o.skip_non_finite())
          .cuda_graph(o.cuda_graph())
          .gradient_sync(distributed::data_parallel(o.process_group())));
  TORCH_CHECK(step_->device() == train_loader_.device(),
              "lamp: the model is on ", step_->device(),
              " but the training data on ", train_loader_.device(),
              "; build the loaders for the model's device.");
  warmup_steps_left_ = step_->cuda_graph_enabled()
                           ? step_->options().graph_warmup_steps() + 1
                           : 1;
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
  const auto float_on_device = torch::TensorOptions().device(device);
  // Divergence is tracked across epochs, so that it is caught however short
  // the epochs are: skipped steps and non-finite losses are counted on the
  // device (a sync-free step's flag lives there) and read once per window of
  // `patience` steps and at the end of each epoch.
  const auto flags_on_device = float_on_device.dtype(torch::kFloat);
  auto consecutive_skips = torch::zeros({}, flags_on_device);
  auto longest_skip_run = torch::zeros({}, flags_on_device);
  // Non-finite losses of the whole fit, one device counter: a window's and an
  // epoch's counts are differences of its host reads.
  auto non_finite = torch::zeros({}, float_on_device.dtype(torch::kLong));
  int64_t non_finite_at_window = 0;
  int64_t window = 0;
  const auto diverged = [&](int64_t at_epoch, const std::string& why,
                            const std::string& fix) {
    TORCH_CHECK(false, "lamp: training diverged in epoch ", at_epoch + 1, ": ",
                why, ". ", fix,
                o.checkpoint().empty() ? std::string()
                                       : " The checkpoint " + o.checkpoint() +
                                             " was left as it was.");
  };
  const auto check_skip_run = [&](int64_t at_epoch) {
    if (longest_skip_run.item<float>() >= patience) {
      diverged(at_epoch,
               std::to_string(patience) +
                   " optimizer steps in a row had inf/NaN gradients (loss "
                   "scale now " +
                   exact(step_->scaler().get_scale()) + ")",
               "Lower the learning rate (--lr), clip gradients, or train in "
               "bf16/amp-bf16.");
    }
  };
  std::vector<EpochStats> history;
  for (int64_t epoch = start_epoch_; epoch < o.epochs(); ++epoch) {
    if (o.max_steps() > 0 && global_step_ >= o.max_steps()) {
      break;
    }
    train_loader_.set_epoch(epoch);
    model_->train();
    reset_peak_device_memory(device);
    // Graphs captured before this epoch hold their intermediates outside the
    // allocated count; a capture in this epoch is in its peak already.
    const bool graphs_before_epoch = step_->cuda_graph_pool_bytes() > 0;
    synchronize(device);
    const auto start = std::chrono::steady_clock::now();

    EpochStats stats;
    stats.epoch = epoch + 1;
    auto loss_sum = torch::zeros({}, float_on_device.dtype(torch::kDouble));
    const int64_t non_finite_at_epoch = non_finite.item<int64_t>();
    auto skipped = torch::zeros({}, flags_on_device);
    int64_t images = 0, warmup_images = 0;
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
        stats.warmup_seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                          step_start)
                .count();
        warmup_images += batch.labels.size(0);
        --warmup_steps_left_;
      }
      // The epoch's loss is the mean of its finite losses: a step skipped
      // for overflow is not training on garbage; one that trains on it
      // leaves non-finite weights, checked at the end of the epoch.
      const auto bad_loss = torch::isfinite(result.loss).logical_not();
      loss_sum += result.loss.nan_to_num(0.0, 0.0, 0.0);
      non_finite += bad_loss;
      images += batch.labels.size(0);
      ++stats.steps;
      ++global_step_;
      if (result.cycle_ended) {
        const auto flag = result.found_inf.to(device, /*non_blocking=*/true);
        skipped += flag;
        consecutive_skips.add_(flag).mul_(flag);
        torch::maximum_out(longest_skip_run, longest_skip_run,
                           consecutive_skips);
      }
      // Divergence, read once per window: a run of `patience` skipped steps,
      // or a loss that stayed non-finite for the whole window.
      if (++window == patience) {
        check_skip_run(epoch);
        const int64_t seen = non_finite.item<int64_t>();
        if (seen - non_finite_at_window >= patience) {
          diverged(epoch,
                   "the loss was inf/NaN for " + std::to_string(patience) +
                       " steps in a row",
                   "Lower the learning rate (--lr) or clip gradients.");
        }
        non_finite_at_window = seen;
        window = 0;
      }
      if (on_batch) {
        BatchProgress progress;
        progress.epoch = epoch + 1;
        progress.batch = i + 1;
        progress.batches = batches;
        progress.images = batch.labels.size(0);
        progress.global_step = global_step_;
        progress.lr = stats.lr;
        progress.loss = result.loss;
        progress.loss_scale = result.scale;
        progress.epoch_loss_sum = loss_sum;
        progress.non_finite_losses = non_finite;
        progress.non_finite_before_epoch = non_finite_at_epoch;
        progress.warmup = warmup_step;
        on_batch(progress);
      }
    }
    synchronize(device);
    stats.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
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
    check_skip_run(epoch); // a run that reached `patience` in the last window
    stats.non_finite_losses = non_finite.item<int64_t>() - non_finite_at_epoch;
    const int64_t finite_steps = stats.steps - stats.non_finite_losses;
    stats.train_loss =
        finite_steps > 0 ? loss_sum.item<double>() / finite_steps : 0.0;
    // However few its steps: an epoch without a finite loss, or with a
    // non-finite mean, or that leaves inf/NaN weights, ends the run before
    // evaluation and checkpoint.
    if (stats.steps > 0 &&
        (finite_steps == 0 || !std::isfinite(stats.train_loss))) {
      diverged(epoch,
               finite_steps == 0
                   ? "the loss was inf/NaN in all its " +
                         std::to_string(stats.steps) + " steps"
                   : "its mean training loss is " + exact(stats.train_loss),
               "Lower the learning rate (--lr), clip gradients, or train in "
               "bf16/amp-bf16.");
    }
    const auto bad = first_non_finite(*model_);
    if (!bad.empty()) {
      diverged(epoch, bad + " has inf/NaN values",
               "Lower the learning rate (--lr) or clip gradients.");
    }
    stats.images_per_second = stats.seconds > 0 ? images / stats.seconds : 0.0;
    stats.peak_memory_bytes =
        device.is_cuda()
            ? peak_device_memory(device) +
                  (graphs_before_epoch ? step_->cuda_graph_pool_bytes() : 0)
            : peak_host_memory();
    stats.loss_scale =
        step_->scaler().is_enabled() ? step_->scaler().get_scale() : 1.0;
    const auto eval_start = std::chrono::steady_clock::now();
    const bool first_evaluation = !evaluated_;
    const auto eval = evaluate();
    if (first_evaluation) {
      // The first evaluation meets the evaluation shapes first (autotuning).
      stats.warmup_seconds += std::chrono::duration<double>(
                                  std::chrono::steady_clock::now() - eval_start)
                                  .count();
    }
    stats.test_loss = eval.first;
    stats.test_accuracy = eval.second;
    // Finite but huge weights show here: their logits overflow.
    if (!std::isfinite(stats.test_loss)) {
      diverged(epoch,
               "the test loss is " + exact(stats.test_loss) +
                   " (the model's outputs overflow)",
               "Lower the learning rate (--lr) or clip gradients.");
    }
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
      images =
          torch::cat({images, torch::zeros(padding_sizes, images.options())})
              .contiguous(images.suggest_memory_format());
    }
    // Cast and autocast as the training step runs the model.
    auto output = step_->forward(forward_, images).to(torch::kFloat);
    if (output.size(0) != n) {
      output = output.slice(0, 0, n);
    }
    loss_sum +=
        F::cross_entropy(output, batch.labels,
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
  // A diverged model never replaces a good checkpoint.
  const auto bad = first_non_finite(*model_);
  TORCH_CHECK(
      bad.empty(), "lamp: not writing the checkpoint ", path, ": ", bad,
      " has inf/NaN values; the previous checkpoint was left as it was.");
  const auto& o = options_;
  torch::serialize::OutputArchive archive;
  archive.write("format", c10::IValue(std::string(kFormat)));
  archive.write("model_name", c10::IValue(model_name_));
  archive.write("optimizer", c10::IValue(o.optimizer()));
  archive.write("precision", c10::IValue(to_string(o.precision())));
  // The settings a resumed run must repeat to continue the same run.
  archive.write("batch_size",
                c10::IValue(train_loader_.options().batch_size()));
  archive.write("epochs", c10::IValue(o.epochs()));
  archive.write("lr", c10::IValue(o.lr()));
  archive.write("schedule", c10::IValue(to_string(o.schedule())));
  archive.write("momentum", c10::IValue(o.momentum()));
  archive.write("weight_decay", c10::IValue(o.weight_decay()));
  archive.write("no_bias_decay", c10::IValue(o.no_bias_decay()));
  archive.write("accumulation_steps", c10::IValue(o.accumulation_steps()));
  archive.write("train_images", c10::IValue(train_loader_.size()));
  archive.write("steps_per_epoch",
                c10::IValue(train_loader_.batches_per_epoch()));
  archive.write("next_epoch", c10::IValue(start_epoch_));
  archive.write("global_step", c10::IValue(global_step_));
  archive.write(
      "seed",
      c10::IValue(static_cast<int64_t>(train_loader_.options().seed())));
  // The data order and augmentation come from (seed, epoch); the global CPU
  // generator (weight init, dropout in users' models) is saved as well.
  archive.write("cpu_rng_state",
                at::detail::getDefaultCPUGenerator().get_state());
  torch::serialize::OutputArchive step_archive;
  step_->save(step_archive);
  archive.write("train_step", step_archive);
  save_checked_archive(archive, path);
}

void ClassifierTrainer::load_checkpoint(const std::string& path) {
  TORCH_CHECK(exists(path), "lamp: no checkpoint at ", path,
              " to resume from.");
  torch::serialize::InputArchive archive;
  load_checked_archive(archive, path);
  // Everything is read and checked before anything of this run changes.
  FieldReader read(archive, path);
  const auto format = read.text("format");
  TORCH_CHECK(format == kFormat, "lamp: ", path, " is a '", format,
              "' checkpoint, not one of lamp's trainer ('", kFormat, "').");
  const auto model_name = read.text("model_name");
  TORCH_CHECK(model_name == model_name_, "lamp: ", path, " holds a '",
              model_name, "' model but this run trains '", model_name_,
              "'; resume with the same --model.");
  const auto& o = options_;
  const auto train_images = read.integer("train_images");
  TORCH_CHECK(train_images == train_loader_.size(), "lamp: ", path,
              " was trained on ", train_images,
              " training images but this run's dataset has ",
              train_loader_.size(), "; resume with the same --data.");
  read.same("--precision", read.text("precision"), to_string(o.precision()));
  read.same("--optimizer", read.text("optimizer"), o.optimizer());
  read.same("--batch-size", std::to_string(read.integer("batch_size")),
            std::to_string(train_loader_.options().batch_size()));
  read.same("--epochs", std::to_string(read.integer("epochs")),
            std::to_string(o.epochs()));
  read.same("--lr", exact(read.real("lr")), exact(o.lr()));
  read.same("--schedule", read.text("schedule"), to_string(o.schedule()));
  read.same("--momentum", exact(read.real("momentum")), exact(o.momentum()));
  read.same("--weight-decay", exact(read.real("weight_decay")),
            exact(o.weight_decay()));
  const bool no_bias_decay = read.boolean_or("no_bias_decay", false);
  TORCH_CHECK(no_bias_decay == o.no_bias_decay(), "lamp: ", path,
              " was trained ", no_bias_decay ? "with" : "without",
              " --no-bias-decay; resume ", no_bias_decay ? "with" : "without",
              " it (a resumed run continues the same optimizer).");
  read.same("--accumulation-steps",
            std::to_string(read.integer_or("accumulation_steps", 1)),
            std::to_string(o.accumulation_steps()));
  read.same("--seed",
            std::to_string(static_cast<uint64_t>(read.integer("seed"))),
            std::to_string(train_loader_.options().seed()));
  const int64_t batches = train_loader_.batches_per_epoch();
  const auto steps_per_epoch = read.integer("steps_per_epoch");
  TORCH_CHECK(steps_per_epoch == batches, "lamp: ", path, " was trained with ",
              steps_per_epoch, " steps per epoch but this run has ", batches,
              " (another --drop-last or number of ranks); resume with the "
              "same settings.");
  // Written only after complete epochs: the position is (epoch, epoch*steps).
  const auto next_epoch = read.integer("next_epoch");
  const auto global_step = read.integer("global_step");
  TORCH_CHECK(next_epoch >= 1 && next_epoch <= o.epochs() &&
                  global_step == next_epoch * batches,
              "lamp: ", path, " is at epoch ", next_epoch, ", step ",
              global_step, ", which a run of ", o.epochs(), " epochs of ",
              batches, " steps cannot reach; the checkpoint is damaged.");
  torch::Tensor rng_state;
  try {
    archive.read("cpu_rng_state", rng_state);
    // On a scratch generator first: a bad state must not half-change ours.
    at::detail::createCPUGenerator().set_state(rng_state);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "lamp: ", path,
                ": the saved random number generator state is damaged (",
                e.what_without_backtrace(), ").");
  }
  torch::serialize::InputArchive step_archive;
  read.section("train_step", step_archive);
  step_->load(step_archive);
  at::Generator generator = at::detail::getDefaultCPUGenerator(); // a handle
  generator.set_state(rng_state);
  start_epoch_ = next_epoch;
  global_step_ = global_step;
}

} // namespace training
} // namespace lamp
