#include "lamp/training/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "distributed/on_every_rank.h"
#include "distributed/rendezvous.h"
#include "lamp/amp/precision_support.h"
#include "lamp/distributed/data_parallel.h"
#include "lamp/optim/optimizer.h"
#include "lamp/platform/backends.h"
#include "lamp/platform/checkpoint_file.h"
#include "lamp/training/checkpoint_weights.h"
#include "platform/archive.h"
#include "platform/checkpoint_io.h"
#include "platform/paths.h"
#include "training/divergence_watch.h"
#include "training/epoch_run.h"
#include "training/run_settings.h"
#include "training/shard_files.h"
#include "training/stop_cadence.h"

namespace lamp {
namespace training {
namespace {

namespace F = torch::nn::functional;
using detail::DivergenceWatch;
using distributed::detail::on_every_rank;

// A rank's sum of finite losses and count of inf/NaN ones, as the means
// over the ranks: the mean loss they give is every rank's finite losses
// over every rank's finite steps, the same on each whatever its own count.
struct RanksMean {
  double loss_sum;
  double non_finite;
};

RanksMean ranks_mean(const std::shared_ptr<distributed::ProcessGroup>& group,
                     const torch::Tensor& loss_sum, int64_t non_finite,
                     const std::string& purpose) {
  if (!group || !group->is_distributed()) {
    return {loss_sum.item<double>(), static_cast<double>(non_finite)};
  }
  // Stacked where the group reduces: one copy to the host, after it.
  const auto on_group =
      torch::TensorOptions().dtype(torch::kDouble).device(group->device());
  auto both = torch::stack(
      {loss_sum.reshape({}).to(on_group),
       torch::full({}, static_cast<double>(non_finite), on_group)});
  group->all_reduce_(both, distributed::ReduceOp::kSum, purpose);
  // Divided as the means were before: a count the ranks share stays exact.
  both = both.div(group->world_size()).cpu();
  return {both[0].item<double>(), both[1].item<double>()};
}

NamedOptimizerFactory optimizer_factory(const optim::OptimizerOptions& o) {
  return [o](const NamedParameters& params) {
    return optim::make_optimizer(params.values(), o);
  };
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

} // namespace

// One cross-entropy in the library: the tasks' (task.cpp), picked by the
// labels' shape.
torch::Tensor classifier_loss(const torch::Tensor& output,
                              const torch::Tensor& labels, bool sum) {
  return (labels.dim() == 2 ? Task::language_model() : Task::classification())
      .loss(output, labels, sum);
}

torch::Tensor classifier_correct(const torch::Tensor& output,
                                 const torch::Tensor& labels) {
  return Task::classification().correct(output, labels);
}

std::string name_option(const TrainerOptions& options, const std::string& key,
                        const std::string& library_name) {
  return options.option_name() ? options.option_name()(key, library_name)
                               : library_name;
}

Trainer::Trainer(std::shared_ptr<torch::nn::Module> model, Forward forward,
                 std::string model_name, data::DeviceLoader train_loader,
                 data::DeviceLoader test_loader, TrainerOptions options)
    : model_(std::move(model)),
      forward_(std::move(forward)),
      model_name_(std::move(model_name)),
      train_loader_(std::move(train_loader)),
      test_loader_(std::move(test_loader)),
      options_(std::move(options)) {
  // "auto" becomes the mode it chooses here, so that the run's settings, the
  // ranks' comparison and the checkpoint all name a real mode.
  options_.step().precision(
      resolve_precision(options_.step().precision(), train_loader_.device()));
  const auto& o = options_;
  const auto name = [&](const char* key, const char* library_name) {
    return name_option(o, key, library_name);
  };
  TORCH_CHECK(
      o.resume().empty() || o.init_from().empty(),
      "lamp: ", name("resume", "TrainerOptions::resume"), " and ",
      name("init_from", "TrainerOptions::init_from"),
      " exclude each other: the first continues a run (its optimizer, scaler, schedule and position), the second starts a new one from a checkpoint's weights alone; give one of them.");
  TORCH_CHECK(!o.reshard() || !o.resume().empty(),
              "lamp: ", name("reshard", "TrainerOptions::reshard"),
              " applies to a resumed run; give ",
              name("resume", "TrainerOptions::resume"),
              " too, or leave it out.");
  TORCH_CHECK(o.epochs() > 0,
              "lamp: ", name("epochs", "TrainerOptions::epochs"),
              " must be positive, got ", o.epochs(), ".");
  TORCH_CHECK(o.max_steps() >= 0,
              "lamp: ", name("max_steps", "TrainerOptions::max_steps"),
              " must be >= 0 (0 = no limit), got ", o.max_steps(), ".");
  TORCH_CHECK(o.limit_eval_batches() >= 0, "lamp: ",
              name("limit_eval_batches", "TrainerOptions::limit_eval_batches"),
              " must be >= 0 (0 = all), got ", o.limit_eval_batches(), ".");
  TORCH_CHECK(
      o.divergence_patience() > 0, "lamp: ",
      name("divergence_patience", "TrainerOptions::divergence_patience"),
      " must be positive, got ", o.divergence_patience(), ".");
  // Before the step converts the model (make_optimizer checks them too,
  // after the conversion).
  const auto& optimizer = o.optimizer();
  TORCH_CHECK(optimizer.lr() > 0 && std::isfinite(optimizer.lr()),
              "lamp: ", name("lr", "TrainerOptions::optimizer().lr"),
              " must be positive and finite, got ", optimizer.lr(), ".");
  TORCH_CHECK(
      optimizer.momentum() >= 0 && optimizer.weight_decay() >= 0 &&
          std::isfinite(optimizer.momentum()) &&
          std::isfinite(optimizer.weight_decay()),
      "lamp: ", name("momentum", "TrainerOptions::optimizer().momentum"),
      " and ", name("weight_decay", "TrainerOptions::optimizer().weight_decay"),
      " must be finite and >= 0, got ", optimizer.momentum(), " and ",
      optimizer.weight_decay(), ".");
  const int64_t accumulation = o.step().accumulation_steps();
  TORCH_CHECK(
      accumulation >= 1, "lamp: ",
      name("accumulation_steps", "TrainerOptions::step().accumulation_steps"),
      " must be >= 1, got ", accumulation, ".");
  TORCH_CHECK(o.zero_stage() >= 0 && o.zero_stage() <= 2,
              "lamp: ", name("zero_stage", "TrainerOptions::zero_stage"),
              " must be 0 (optimizer state whole on every rank), 1 (sharded "
              "over the ranks) or 2 (sharded, gradients reduce-scattered), "
              "got ",
              o.zero_stage(), ".");
  TORCH_CHECK(forward_ != nullptr, "lamp: no forward function given.");
  const int64_t batches = train_loader_.batches_per_epoch();
  TORCH_CHECK(batches > 0, "lamp: the training loader has no batches (",
              train_loader_.samples_per_epoch(), " samples per epoch, ",
              name("batch_size", "LoaderOptions::batch_size"), " ",
              train_loader_.options().batch_size(),
              ", drop_last); use a smaller batch size.");
  if (batches % accumulation != 0) {
    std::string divisors;
    for (int64_t d = 1; d <= std::min<int64_t>(batches, 64); ++d) {
      if (batches % d == 0) {
        divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
      }
    }
    TORCH_CHECK(
        false, "lamp: ", accumulation, " accumulation steps do not divide the ",
        batches,
        " batches of an epoch, so an epoch (and its checkpoint) would end inside an accumulation cycle; use one of ",
        divisors, batches > 64 ? ", ..." : "",
        ", or another batch size (or drop_last) that makes the batches per epoch a multiple of it.");
  }
  // A run cut inside an accumulation cycle would drop its last gradients,
  // and one shorter than a cycle would take no optimizer step at all and
  // end as if it had trained.
  TORCH_CHECK(
      o.max_steps() % accumulation == 0,
      "lamp: ", name("max_steps", "TrainerOptions::max_steps"), " ",
      o.max_steps(), " is not a multiple of the ", accumulation, " ",
      name("accumulation_steps", "TrainerOptions::step().accumulation_steps"),
      ": the run would end inside an accumulation cycle",
      o.max_steps() < accumulation ? ", before its first optimizer step"
                                   : ", dropping its last gradients",
      "; use ",
      accumulation * std::max<int64_t>(1, o.max_steps() / accumulation),
      " or another multiple of ", accumulation, ".");
  TORCH_CHECK(o.epochs() <= std::numeric_limits<int64_t>::max() / batches,
              "lamp: ", o.epochs(), " epochs of ", batches,
              " steps overflow the step counter; use fewer epochs.");
  check_step_options(batches);
  total_steps_ = o.steps() > 0 ? o.steps() : o.epochs() * batches;
  o.task().check(train_loader_.data(), "the training data");
  o.task().check(test_loader_.data(), "the test data");
  // The test set is scored whole, each example once and as it is: the
  // evaluation splits its batches over the ranks itself, so a sharded test
  // loader would score a part of it (a rank's share of a share), and
  // drop_last or augmentation other examples, under the whole set's name.
  {
    const auto& t = test_loader_.options();
    std::string why;
    const auto add = [&why](const std::string& what) {
      why += (why.empty() ? "" : ", ") + what;
    };
    if (t.num_shards() != 1) {
      add("num_shards(" + std::to_string(t.num_shards()) +
          ") (the evaluation shares the test batches among the ranks itself)");
    }
    if (t.drop_last()) {
      add("drop_last(true) (the last partial batch would go unscored)");
    }
    if (t.crop_padding() != 0 || t.horizontal_flip()) {
      add("crop_padding or horizontal_flip (the test images would be "
          "altered at random)");
    }
    TORCH_CHECK(why.empty(), "lamp: the test loader has ", why,
                "; build it with LoaderOptions' defaults for these, as the "
                "training loader's augmentation and sharding are for "
                "training only.");
  }
  train_data_ = data::fingerprint(train_loader_.data());
  test_data_ = data::fingerprint(test_loader_.data());
  const auto& group = o.process_group();
  const bool sharded_files = !o.checkpoint().empty() && group &&
                             group->is_distributed() && o.zero_stage() > 0;
  const auto check_paths = [&] {
    // Before any training: a bad path, an unwritable folder or another run
    // writing the same checkpoint fail now, not after the first epoch.
    // Sharded, every rank writes its shard into the folder (each node's
    // own, where it is not shared).
    if (!o.checkpoint().empty() &&
        (!group || group->is_main() || sharded_files)) {
      check_checkpoint_path(o.checkpoint(), "checkpoint");
    }
    if (!o.checkpoint().empty() && (!group || group->is_main())) {
      lock_ = std::make_unique<CheckpointLock>(o.checkpoint());
    }
    if (sharded_files) {
      // The shards' names are longer (their step's digits at most those
      // of the run's last step).
      const int world = group->world_size();
      const auto shard =
          detail::shard_path(o.checkpoint(), world - 1, world, total_steps_);
      lamp::detail::check_name_length(o.checkpoint(), "checkpoint",
                                      shard.substr(o.checkpoint().size()));
    }
    if (!o.best_checkpoint().empty() && (!group || group->is_main())) {
      check_checkpoint_path(o.best_checkpoint(), "best_checkpoint");
      best_lock_ = std::make_unique<CheckpointLock>(o.best_checkpoint());
    }
  };
  // Rank 0 alone checks (and locks) the files it alone writes: one refusal
  // stops every rank, the others naming it.
  on_every_rank(group, "checking the checkpoint's path", check_paths);
  if (group) {
    check_ranks_agree(*group);
  }
  auto step_options =
      TrainStepOptions(o.step()).gradient_sync(distributed::data_parallel(
          o.process_group(),
          distributed::DataParallelOptions().zero_stage(o.zero_stage())));
  if (o.check_numerics()) {
    // The check observes ops as they run; a replayed graph runs none.
    TORCH_CHECK(step_options.cuda_graph() != CudaGraphMode::kOn, "lamp: ",
                name("check_numerics", "TrainerOptions::check_numerics"),
                " observes eager steps, but ",
                name("cuda_graph", "TrainerOptions::step().cuda_graph"),
                " is on; leave it to auto (then off) or turn it off.");
    step_options.cuda_graph(CudaGraphMode::kOff);
    numerics_ = std::make_unique<NumericsCheck>(model_);
  }
  step_ = std::make_unique<TrainStep>(model_, optimizer_factory(o.optimizer()),
                                      step_options);
  TORCH_CHECK(step_->device() == train_loader_.device(),
              "lamp: the model is on ", step_->device(),
              " but the training data on ", train_loader_.device(),
              "; build the loaders for the model's device.");
  warmup_steps_left_ = step_->cuda_graph_enabled()
                           ? step_->options().graph_warmup_steps() + 1
                           : 1;
  if (!o.init_from().empty()) {
    // After the step converted the model: a half or bf16 run's master
    // weights get the checkpoint's FP32 values, not the model's rounding.
    CheckpointWeights weights;
    const auto read = [&] { weights = read_checkpoint_weights(o.init_from()); };
    // Each rank reads its own copy: one missing or damaged stops every rank
    // now, not the others in their first collective.
    on_every_rank(group, "reading its copy of the checkpoint", read);
    auto* sharding = step_->optimizer_sharding();
    if (sharding != nullptr) {
      // The shards were copied from the initial weights: load the FP32
      // values into whole masters, then each rank takes its pieces.
      const auto masters = trainable_masters(*model_);
      load_weights_from_checkpoint(*model_, weights, masters.get());
      sharding->set_masters(masters->master_params());
    } else {
      load_weights_from_checkpoint(*model_, weights, step_->master_weights());
    }
    history_ = weights.history;
    history_.push_back(
        {detail::kInitFrom, 0, weights.epochs_done, o.epochs(), o.init_from()});
  }
  if (!o.resume().empty()) {
    load_checkpoint(o.resume());
    if (group) {
      // Each rank read its own copy of the checkpoint.
      group->check_same(
          "the checkpoint they resume from",
          {{"the epoch it ends", std::to_string(start_epoch_)},
           {"its step count", std::to_string(global_step_)}},
          "Give every rank the same checkpoint (a shared folder, or the same copy on each node).");
    }
  }
}

void Trainer::check_step_options(int64_t batches) const {
  const auto& o = options_;
  const auto name = [&](const char* key, const char* library_name) {
    return name_option(o, key, library_name);
  };
  const int64_t accumulation = o.step().accumulation_steps();
  const auto accumulation_name =
      name("accumulation_steps", "TrainerOptions::step().accumulation_steps");
  // Counts of steps that must be >= 0 and land on optimizer steps: an
  // evaluation or checkpoint inside an accumulation cycle would see (or
  // save) half-summed gradients.
  const std::vector<std::pair<std::string, int64_t>> counts = {
      {name("steps", "TrainerOptions::steps"), o.steps()},
      {name("eval_every", "TrainerOptions::eval_every"), o.eval_every()},
      {name("checkpoint_every", "TrainerOptions::checkpoint_every"),
       o.checkpoint_every()}};
  for (const auto& count : counts) {
    TORCH_CHECK(count.second >= 0, "lamp: ", count.first,
                " must be >= 0 (0 = off), got ", count.second, ".");
    TORCH_CHECK(
        count.second % accumulation == 0, "lamp: ", count.first, " ",
        count.second, " is not a multiple of the ", accumulation, " ",
        accumulation_name, ": it would fall inside an accumulation cycle; use ",
        accumulation * std::max<int64_t>(1, count.second / accumulation),
        " or another multiple of ", accumulation, ".");
  }
  const int64_t epoch_steps = o.epochs() * batches;
  TORCH_CHECK(o.steps() <= epoch_steps,
              "lamp: ", name("steps", "TrainerOptions::steps"), " ", o.steps(),
              " is more than the ", o.epochs(), " ",
              name("epochs", "TrainerOptions::epochs"), " of ", batches,
              " steps hold (", epoch_steps, "); give ",
              name("epochs", "TrainerOptions::epochs"), " ",
              (o.steps() + batches - 1) / batches, " or more.");
  const int64_t total = o.steps() > 0 ? o.steps() : epoch_steps;
  const auto schedule = name("schedule", "TrainerOptions::schedule");
  if (o.schedule() == Schedule::kWarmupCosine) {
    TORCH_CHECK(o.warmup_steps() >= 0 && o.warmup_steps() < total,
                "lamp: ", name("warmup_steps", "TrainerOptions::warmup_steps"),
                " ", o.warmup_steps(),
                " must be >= 0 and shorter than the run's ", total,
                " steps; give fewer warm-up steps or a longer run.");
    TORCH_CHECK(
        std::isfinite(o.min_lr()) && o.min_lr() >= 0 &&
            o.min_lr() <= o.optimizer().lr(),
        "lamp: ", name("min_lr", "TrainerOptions::min_lr"), " ", o.min_lr(),
        " must be in [0, ", name("lr", "TrainerOptions::optimizer().lr"), " ",
        o.optimizer().lr(), "]: the cosine decays from the peak to it.");
  } else {
    TORCH_CHECK(o.warmup_steps() == 0 && o.min_lr() == 0,
                "lamp: ", name("warmup_steps", "TrainerOptions::warmup_steps"),
                " and ", name("min_lr", "TrainerOptions::min_lr"), " shape ",
                schedule, " warmup-cosine, not ", to_string(o.schedule()),
                "; give ", schedule, " warmup-cosine or leave them out.");
  }
  const auto checkpoint = name("checkpoint", "TrainerOptions::checkpoint");
  TORCH_CHECK(
      o.checkpoint_every() == 0 || !o.checkpoint().empty(),
      "lamp: ", name("checkpoint_every", "TrainerOptions::checkpoint_every"),
      " says how often to write ", checkpoint, ", which is not given; give ",
      checkpoint, " PATH or leave it out.");
  TORCH_CHECK(!o.eval_at_start() || o.eval_every() > 0,
              "lamp: ", name("eval_at_start", "TrainerOptions::eval_at_start"),
              " adds an evaluation before the first step to those of ",
              name("eval_every", "TrainerOptions::eval_every"),
              ", which is off; give it too.");
  const auto best = name("best_checkpoint", "TrainerOptions::best_checkpoint");
  if (!o.best_checkpoint().empty()) {
    TORCH_CHECK(o.eval_every() > 0, "lamp: ", best,
                " is written after the evaluations of ",
                name("eval_every", "TrainerOptions::eval_every"),
                ", which is off; give it too.");
    TORCH_CHECK(
        o.checkpoint().empty() ||
            !lamp::detail::same_file(o.best_checkpoint(), o.checkpoint()),
        "lamp: ", best, " ", o.best_checkpoint(), " and ", checkpoint, " ",
        o.checkpoint(),
        " are the same file; give the best checkpoint its own name.");
    // A new run's first evaluation is its best so far (a resume's is
    // measured against the best it resumes with).
    TORCH_CHECK(
        o.init_from().empty() ||
            !lamp::detail::same_file(o.best_checkpoint(), o.init_from()),
        "lamp: ", best, " ", o.best_checkpoint(), " and ",
        name("init_from", "TrainerOptions::init_from"), " ", o.init_from(),
        " are the same file, which the run's first evaluation would "
        "write over; give the best checkpoint another name.");
    // Its shard files would be cleaned up as the last checkpoint's.
    TORCH_CHECK(o.zero_stage() == 0, "lamp: ", best,
                " is not available with sharded optimizer state (",
                name("zero_stage", "TrainerOptions::zero_stage"), " ",
                o.zero_stage(), "); leave it out, or shard nothing.");
  }
}

void Trainer::check_ranks_agree(distributed::ProcessGroup& group) const {
  const auto& o = options_;
  const auto name = [&](const char* key, const char* library_name) {
    return name_option(o, key, library_name);
  };
  const auto given = [](const std::string& path) {
    return path.empty() ? "not given" : "given";
  };
  // Every setting a checkpoint stores (the data's fingerprints among them),
  // and those that differ across ranks although a resume may change them:
  // another evaluation batch size makes the ranks' evaluations disagree,
  // another max_steps makes one rank stop while the other waits, another
  // limit_eval_batches or eval_train makes one rank evaluate batches the
  // other skips.
  auto settings = detail::describe_run_settings(
      {o, train_loader_.options(), train_data_, test_data_});
  settings.insert(
      settings.end(),
      {{name("eval_batch_size", "TrainerOptions::eval_batch_size"),
        std::to_string(o.eval_batch_size())},
       {name("max_steps", "TrainerOptions::max_steps"),
        std::to_string(o.max_steps())},
       {name("eval_every", "TrainerOptions::eval_every"),
        std::to_string(o.eval_every())},
       {name("checkpoint_every", "TrainerOptions::checkpoint_every"),
        std::to_string(o.checkpoint_every())},
       {name("limit_eval_batches", "TrainerOptions::limit_eval_batches"),
        std::to_string(o.limit_eval_batches())},
       {name("eval_train", "TrainerOptions::eval_train"),
        o.eval_train() ? "on" : "off"},
       {name("divergence_patience", "TrainerOptions::divergence_patience"),
        std::to_string(o.divergence_patience())},
       {name("check_numerics", "TrainerOptions::check_numerics"),
        o.check_numerics() ? "on" : "off"},
       {name("checkpoint", "TrainerOptions::checkpoint"),
        given(o.checkpoint())},
       {name("resume", "TrainerOptions::resume"), given(o.resume())},
       {name("reshard", "TrainerOptions::reshard"), o.reshard() ? "on" : "off"},
       {name("init_from", "TrainerOptions::init_from"), given(o.init_from())}});
  group.check_same(
      "the trainer's settings", settings,
      "Give every rank the same options and the same data (the fingerprints are of the files' contents).");
}

std::vector<EpochStats> Trainer::fit(
    const std::function<void(const EpochStats&)>& on_epoch,
    const std::function<void(const BatchProgress&)>& on_batch,
    const std::function<void(const EvalProgress&)>& on_eval_batch,
    const std::function<void(const StepEvaluation&)>& on_evaluation) {
  if (const auto& group = options_.process_group()) {
    group->leave_word(""); // an earlier fit()'s reason, if it left one
  }
  try {
    return fit_epochs(on_epoch, on_batch, on_eval_batch, on_evaluation);
  } catch (const std::exception& e) {
    // This rank's own error (its step, its callbacks, a file it writes):
    // the other ranks, whose next collective fails or waits for it, name
    // it, rank 0 among them.
    if (const auto& group = options_.process_group()) {
      group->leave_word(lamp::detail::error_text(e));
    }
    throw;
  }
}

std::vector<EpochStats> Trainer::fit_epochs(
    const std::function<void(const EpochStats&)>& on_epoch,
    const std::function<void(const BatchProgress&)>& on_batch,
    const std::function<void(const EvalProgress&)>& on_eval_batch,
    const std::function<void(const StepEvaluation&)>& on_evaluation) {
  const auto& o = options_;
  const auto device = train_loader_.device();
  // Divergence is tracked across epochs, so that it is caught however short
  // the epochs are.
  // Over the ranks, a window of non-finite losses on one of them stops
  // them all (one alone would leave the others waiting in a collective).
  DivergenceWatch::ReduceMax reduce_max;
  if (const auto& group = o.process_group(); group && group->is_distributed()) {
    reduce_max = [group](int64_t count) {
      auto value = torch::full(
          {1}, count,
          torch::TensorOptions().dtype(torch::kLong).device(group->device()));
      group->all_reduce_(value, lamp::distributed::ReduceOp::kMax,
                         "the most inf/NaN losses of a rank in the last "
                         "divergence_patience steps");
      return value.item<int64_t>();
    };
  }
  DivergenceWatch watch(
      device, o, step_->scaler(), [this] { return locate_numerics(); },
      std::move(reduce_max));
  std::vector<EpochStats> history;
  stop_point_ = StopPoint();
  restart_stop_checks();
  // The schedule spans the whole run even where max_steps stops early, so
  // that a run cut short and resumed follows the same learning rates.
  // The interval since the last evaluation goes on from where the resumed
  // checkpoint (or the last fit()) left it; the watch counts from 0.
  interval_loss_sum_ =
      torch::full({}, resumed_interval_loss_sum_,
                  torch::TensorOptions().device(device).dtype(torch::kDouble));
  interval_steps_ = resumed_interval_steps_;
  interval_non_finite_before_ = -resumed_interval_non_finite_;
  const int64_t end_step =
      o.max_steps() > 0 ? std::min(total_steps_, o.max_steps()) : total_steps_;
  // What save_checkpoint() reads inside an epoch; cleared however the
  // epoch ends (an error unwinding through it too).
  struct ActiveRun {
    const EpochRun*& slot;
    ~ActiveRun() { slot = nullptr; }
  };
  const bool pending = evaluation_pending_ && o.eval_every() > 0;
  if (pending && global_step_ >= end_step) {
    // The run's last evaluation was stopped: every step is trained, and
    // no epoch runs to hold it.
    EpochRun run;
    run.epoch = start_step_in_epoch_ > 0 ? start_epoch_ : start_epoch_ - 1;
    run.batches = train_loader_.batches_per_epoch();
    run.end_step = end_step;
    run.watch = &watch;
    run.loss_sum = torch::full(
        {}, resumed_loss_sum_,
        torch::TensorOptions().device(device).dtype(torch::kDouble));
    run.non_finite_resumed = resumed_non_finite_;
    ActiveRun active{active_run_ = &run};
    if (!pending_evaluation(run, watch, on_eval_batch, on_evaluation)) {
      save_at_stop();
    }
    keep_interval_sums(watch);
    return history;
  }
  // start_epoch_ moves on as epochs end (the checkpoint's position).
  bool first_epoch_of_fit = true;
  for (int64_t epoch = start_epoch_; epoch < o.epochs(); ++epoch) {
    if (global_step_ >= end_step) {
      break;
    }
    EpochRun run;
    run.epoch = epoch;
    run.batches = train_loader_.batches_per_epoch();
    run.first_batch = epoch == start_epoch_ ? start_step_in_epoch_ : 0;
    run.end_step = end_step;
    // The evaluation a stop interrupted stands for eval_at_start's (the
    // same step and weights).
    run.evaluate_pending = first_epoch_of_fit && pending;
    run.evaluate_first = first_epoch_of_fit && !pending && o.eval_at_start() &&
                         o.eval_every() > 0;
    first_epoch_of_fit = false;
    run.watch = &watch;
    run.last_batch =
        std::min(run.batches, run.first_batch + (end_step - global_step_));
    ActiveRun active{active_run_ = &run};
    if (!train_epoch(run, watch, on_batch, on_eval_batch, on_evaluation)) {
      keep_epoch_sums(run);
      break; // stopped on request, its checkpoint written where asked for
    }
    finish_epoch(run, watch);
    const bool evaluated =
        o.eval_every() > 0 || evaluate_epoch(run, watch, on_eval_batch);
    run.stats.evaluated = o.eval_every() == 0;
    end_epoch(run);
    if (!evaluated) {
      break; // trained whole: its checkpoint is written
    }
    history.push_back(run.stats);
    if (on_epoch) {
      on_epoch(run.stats);
    }
  }
  keep_interval_sums(watch);
  return history;
}

bool Trainer::stop_here(const EpochRun& run, int64_t steps,
                        bool in_evaluation) {
  const int asked_by = rank_asking_to_stop(in_evaluation);
  if (asked_by < 0) {
    return false;
  }
  stop_point_ = {
      true,         run.epoch + 1,    steps,   run.batches, in_evaluation,
      global_step_, checkpoint_step_, asked_by};
  return true;
}

void Trainer::restart_stop_checks() {
  if (!stop_cadence_) {
    stop_cadence_ = std::make_shared<detail::StopCadence>();
  }
  stop_cadence_->restart();
  stop_cadence_in_evaluation_ = false;
  stop_asked_ = false;
}

int Trainer::rank_asking_to_stop(bool in_evaluation) {
  const auto& stop = options_.stop_requested();
  if (!stop) {
    return -1;
  }
  if (single_process()) {
    return stop() ? 0 : -1;
  }
  // The ranks stop at one step, all of them: a rank that stopped alone
  // left the others in a collective it never called, or in another one
  // than its own (Gloo ends the process on the sizes that differ). In an
  // evaluation, at one turn (run_evaluation() gives every rank as many).
  // The question is asked at every cycle and its answer kept until the
  // ranks check, at the cycles stop_cadence_ makes due on every rank
  // alike: each cycle of a CPU group's training, whose step all-reduces
  // anyway; about every 0.1 s of a CPU group's evaluation (StopCadence);
  // every 32nd cycle or turn of a CUDA group, where reading the answer
  // waits for the GPU.
  stop_asked_ = stop() || stop_asked_;
  if (in_evaluation != stop_cadence_in_evaluation_) {
    // Every rank starts and ends its evaluations at the same cycle.
    stop_cadence_->restart();
    stop_cadence_in_evaluation_ = in_evaluation;
  }
  if (!stop_cadence_->due()) {
    return -1;
  }
  const bool cuda = options_.process_group()->device().is_cuda();
  const auto now = detail::StopCadence::Clock::now();
  const int64_t proposal = cuda            ? 32
                           : in_evaluation ? stop_cadence_->proposal(now)
                                           : 1;
  const int asked_by = rank_asked_to_stop(stop_asked_, proposal, in_evaluation);
  stop_asked_ = false;
  return asked_by;
}

int Trainer::rank_asked_to_stop(bool asked, int64_t proposal,
                                bool in_evaluation) {
  auto& group = *options_.process_group();
  // One tensor for the run's checks, not one a step.
  if (!stop_answer_.defined()) {
    stop_answer_ = torch::empty(
        {2},
        torch::TensorOptions().dtype(torch::kFloat).device(group.device()));
  }
  // Rank + 1, or 0; and minus the cycles proposed until the next check,
  // whose maximum is minus the fewest: exact in FP32 for every WORLD_SIZE
  // lamp accepts, and every proposal (at most StopCadence::kMostCycles).
  stop_answer_.select(0, 0).fill_(asked ? group.rank() + 1 : 0);
  stop_answer_.select(0, 1).fill_(-proposal);
  group.all_reduce_(stop_answer_, lamp::distributed::ReduceOp::kMax,
                    in_evaluation
                        ? "whether a rank was asked to stop in the evaluation "
                          "(TrainerOptions::stop_requested)"
                        : "whether a rank was asked to stop "
                          "(TrainerOptions::stop_requested)");
  const auto agreed = stop_answer_.cpu();
  const auto* values = agreed.data_ptr<float>();
  stop_cadence_->agree(-static_cast<int64_t>(values[1]),
                       detail::StopCadence::Clock::now());
  return static_cast<int>(values[0]) - 1;
}

bool Trainer::single_process() const {
  const auto& group = options_.process_group();
  return !group || !group->is_distributed();
}

void Trainer::save_at_stop() {
  const auto& o = options_;
  // Every rank of a data-parallel run stops at this step (stop_here()), so
  // they write it together. A fresh run stopped before its first step has
  // trained nothing: a checkpoint of step 0 would be one no resume accepts.
  if (o.checkpoint().empty() || checkpoint_step_ == global_step_ ||
      global_step_ == 0) {
    return;
  }
  write_checkpoint_if_finite();
  stop_point_.checkpoint_step = checkpoint_step_;
}

void Trainer::write_on_main_rank(const std::string& what,
                                 const std::function<void()>& write) {
  const auto& group = options_.process_group();
  if (!group || !group->is_distributed() ||
      step_->optimizer_sharding() != nullptr) {
    write(); // alone, or sharded: every rank writes, agreeing inside
    return;
  }
  // Rank 0 writes; the others wait for its answer here, not in the next
  // step's collective, which a rank 0 stopped by a full disk never reaches
  // (NCCL's peers waited there until --dist-timeout).
  on_every_rank(*group, what, [&] {
    if (group->is_main()) {
      write();
    }
  });
}

void Trainer::write_checkpoint() {
  // Timed after the steps queued before it (training time) are done.
  synchronize(train_loader_.device());
  const auto start = std::chrono::steady_clock::now();
  gather_rank_sums();
  write_on_main_rank("writing the checkpoint",
                     [&] { save_checkpoint(options_.checkpoint()); });
  checkpoint_step_ = global_step_;
  const double took = seconds_since(start);
  checkpoint_seconds_ += took;
}

void Trainer::write_checkpoint_if_finite() {
  if (last_loss_.defined()) {
    auto non_finite = torch::isfinite(last_loss_)
                          .logical_not()
                          .to(torch::kFloat)
                          .reshape({1});
    const auto& group = options_.process_group();
    if (group && group->is_distributed()) {
      // Every rank writes its shard, or agrees on rank 0's write: one
      // answer for all of them.
      group->all_reduce_(non_finite, lamp::distributed::ReduceOp::kMax,
                         "whether a rank's latest loss was inf/NaN, before "
                         "a checkpoint");
    }
    if (non_finite.item<float>() > 0) {
      TORCH_WARN(
          "lamp: the checkpoint of step ", global_step_,
          " was not written: that step's loss was inf/NaN, and a "
          "model whose loss is no longer finite does not replace ",
          options_.checkpoint(),
          checkpoint_step_ >= 0
              ? " (it keeps step " + std::to_string(checkpoint_step_) + ")"
              : std::string(),
          ". The next evaluation or the epoch's end stops a run that "
          "has diverged.");
      return;
    }
  }
  write_checkpoint();
}

bool Trainer::checkpoint_is_mine() const {
  const auto& group = options_.process_group();
  // Sharded, every rank writes its shard (save_checkpoint is then a
  // collective); otherwise rank 0 writes the whole checkpoint (and the
  // others agree on its write).
  return !options_.checkpoint().empty() &&
         (!group || group->is_main() || step_->optimizer_sharding() != nullptr);
}

bool Trainer::train_epoch(
    EpochRun& run, DivergenceWatch& watch,
    const std::function<void(const BatchProgress&)>& on_batch,
    const std::function<void(const EvalProgress&)>& on_eval_batch,
    const std::function<void(const StepEvaluation&)>& on_evaluation) {
  const auto& o = options_;
  const auto device = train_loader_.device();
  train_loader_.set_epoch(run.epoch);
  model_->train();
  reset_peak_device_memory(device);
  // Graphs captured before this epoch hold their intermediates outside the
  // allocated count; a capture in this epoch is in its peak already.
  run.graphs_before_epoch = step_->cuda_graph_pool_bytes() > 0;
  watch.begin_epoch();
  run.stats.epoch = run.epoch + 1;
  run.stats.steps_in_epoch = run.batches;
  run.stats.resumed_steps = run.first_batch;
  const auto fp64 = torch::TensorOptions().device(device).dtype(torch::kDouble);
  // A resume inside the epoch carries on its sums, so that its loss is the
  // one the straight run reports.
  const bool resumed = run.first_batch > 0;
  run.loss_sum = torch::full({}, resumed ? resumed_loss_sum_ : 0.0, fp64);
  run.non_finite_resumed = resumed ? resumed_non_finite_ : 0;
  run.non_finite_before = watch.read_non_finite_losses();
  synchronize(device);
  run.start = std::chrono::steady_clock::now();
  checkpoint_seconds_ = 0;
  if (run.evaluate_first &&
      !evaluate_at_step(run, watch, on_eval_batch, on_evaluation,
                        /*before_training=*/true)) {
    save_at_stop();
    return false;
  }
  if (run.evaluate_pending &&
      !pending_evaluation(run, watch, on_eval_batch, on_evaluation)) {
    save_at_stop();
    return false;
  }
  const int64_t accumulation = o.step().accumulation_steps();
  for (int64_t i = run.first_batch; i < run.last_batch; ++i) {
    // Asked only where an accumulation cycle starts: the train step cannot
    // save the half-summed gradients of a cycle, so a stop inside one
    // finishes it first (epochs and resumes start at a cycle's start).
    if (i % accumulation == 0 && stop_here(run, i, /*in_evaluation=*/false)) {
      save_at_stop();
      return false;
    }
    auto& stats = run.stats;
    stats.lr = next_learning_rate();
    set_learning_rate(step_->optimizer(), stats.lr);
    const auto batch = train_loader_.batch(i);
    // The run's first step (cuDNN autotuning, allocator and cache warm-up;
    // with CUDA graphs also the eager warm-up steps and the capture) is
    // timed on its own: reported as warm-up, not in the steady rate.
    const bool warmup_step = warmup_steps_left_ > 0;
    const auto step_start = std::chrono::steady_clock::now();
    last_inputs_ = batch.inputs;
    last_targets_ = batch.targets;
    StepResult result;
    const auto& task = o.task();
    const auto run_step = [&] {
      result = step_->step(
          batch.inputs, batch.targets,
          [&](const torch::Tensor& inputs, const torch::Tensor& targets) {
            return o.training_loss() ? o.training_loss()(inputs, targets)
                                     : task.loss(forward_(inputs), targets);
          });
    };
    if (numerics_) {
      // Stops at the first module with inf/NaN; an overflow under loss
      // scaling (the scaler skips the step) is kept for the messages while
      // it is the latest step's.
      auto finding =
          numerics_->observe(global_step_ + 1, run_step, loss_scaled());
      last_finding_ = std::move(finding); // the latest step's, or none
    } else {
      run_step();
    }
    if (warmup_step) {
      synchronize(device);
      stats.warmup_seconds += seconds_since(step_start);
      run.warmup_examples += batch.targets.size(0);
      --warmup_steps_left_;
    }
    // The epoch's loss is the mean of its finite losses: a step skipped for
    // overflow is not training on garbage; one that trains on it leaves
    // non-finite weights, checked at the end of the epoch.
    const auto finite_loss = result.loss.nan_to_num(0.0, 0.0, 0.0);
    run.loss_sum += finite_loss;
    if (o.eval_every() > 0) {
      interval_loss_sum_ += finite_loss;
      ++interval_steps_;
    }
    run.examples += batch.targets.size(0);
    ++stats.steps;
    ++global_step_;
    start_step_in_epoch_ = i + 1; // the position a checkpoint holds
    watch.record(run.epoch, result);
    last_loss_ = result.loss;
    if (on_batch) {
      BatchProgress progress;
      progress.epoch = run.epoch + 1;
      progress.batch = i + 1;
      progress.batches = run.last_batch;
      progress.batches_in_epoch = run.batches;
      progress.examples = batch.targets.size(0);
      progress.global_step = global_step_;
      progress.lr = stats.lr;
      progress.loss = result.loss;
      progress.loss_scale = result.scale;
      progress.grad_norm = result.grad_norm;
      progress.epoch_loss_sum = run.loss_sum;
      progress.non_finite_losses = watch.non_finite_losses();
      progress.non_finite_before_epoch = run.non_finite_before;
      progress.resumed_batches = run.first_batch;
      progress.resumed_loss_sum = resumed ? resumed_loss_sum_ : 0.0;
      progress.warmup = warmup_step;
      on_batch(progress);
    }
    if (o.eval_every() > 0 &&
        (global_step_ % o.eval_every() == 0 || global_step_ == run.end_step)) {
      if (!evaluate_at_step(run, watch, on_eval_batch, on_evaluation)) {
        // Its checkpoint says so: the resumed run evaluates this step first.
        evaluation_pending_ = true;
        save_at_stop();
        return false;
      }
    }
    // Inside the epoch only: its end writes its own checkpoint.
    if (o.checkpoint_every() > 0 && global_step_ % o.checkpoint_every() == 0 &&
        i + 1 < run.last_batch && checkpoint_step_ != global_step_) {
      write_checkpoint_if_finite();
    }
  }
  return true;
}

double Trainer::learning_rate_at(int64_t step) const {
  const auto& o = options_;
  return learning_rate(o.schedule(), o.optimizer().lr(), step, total_steps_,
                       o.warmup_steps(), o.min_lr());
}

double Trainer::next_learning_rate() const {
  return learning_rate_at(global_step_);
}

bool Trainer::pending_evaluation(
    EpochRun& run, DivergenceWatch& watch,
    const std::function<void(const EvalProgress&)>& on_eval_batch,
    const std::function<void(const StepEvaluation&)>& on_evaluation) {
  const auto& o = options_;
  // The rate of the step it follows, as the interrupted one reported.
  run.stats.lr = learning_rate_at(std::max<int64_t>(global_step_ - 1, 0));
  const int64_t written_before = checkpoint_step_;
  if (!evaluate_at_step(run, watch, on_eval_batch, on_evaluation)) {
    return false; // still pending
  }
  // The checkpoint of this step said it was pending (evaluate_at_step()
  // writes none at a step written already): written again, so that a later
  // resume does not evaluate it once more.
  if (!o.checkpoint().empty() && written_before == global_step_ &&
      checkpoint_step_ == global_step_) {
    write_checkpoint();
  }
  return true;
}

bool Trainer::evaluate_at_step(
    EpochRun& run, DivergenceWatch& watch,
    const std::function<void(const EvalProgress&)>& on_eval_batch,
    const std::function<void(const StepEvaluation&)>& on_evaluation,
    bool before_training) {
  const auto eval_start = std::chrono::steady_clock::now();
  const auto evaluated = run_evaluations(on_eval_batch, run.epoch + 1, [&] {
    return stop_here(run, start_step_in_epoch_, /*in_evaluation=*/true);
  });
  model_->train();
  if (!evaluated) {
    return false;
  }
  // Done: the checkpoints written from here on hold no pending one.
  evaluation_pending_ = false;
  const auto& o = options_;
  StepEvaluation e;
  e.global_step = global_step_;
  e.epoch = run.epoch + 1;
  const auto& test = evaluated->first;
  e.test_loss = test.loss;
  e.test_accuracy = test.accuracy;
  e.test_batches = test.batches;
  e.test_batches_in_set = test.batches_in_set;
  e.test_examples = test.examples;
  e.train_evaluation = evaluated->second;
  if (before_training) {
    // Nothing trained since the run started: no training loss, nothing to
    // save, no best (a fresh run's untrained model would be its first); the
    // rate of the first step.
    e.before_training = true;
    e.train_loss = std::numeric_limits<double>::quiet_NaN();
    e.lr = next_learning_rate();
    e.eval_seconds = seconds_since(eval_start);
    run.stats.eval_seconds += e.eval_seconds;
    e.best_test_loss = best_test_loss_;
    if (on_evaluation) {
      on_evaluation(e);
    }
    return true;
  }
  const int64_t non_finite = watch.read_non_finite_losses();
  const auto interval =
      ranks_mean(options_.process_group(), interval_loss_sum_,
                 non_finite - interval_non_finite_before_,
                 "the all-reduce of the training loss since the last "
                 "evaluation");
  const double finite_steps =
      static_cast<double>(interval_steps_) - interval.non_finite;
  e.train_loss = finite_steps > 0 ? interval.loss_sum / finite_steps : 0.0;
  interval_loss_sum_.zero_();
  interval_steps_ = 0;
  interval_non_finite_before_ = non_finite;
  e.lr = run.stats.lr;
  e.eval_seconds = seconds_since(eval_start);
  // Inside the epoch's time: not training, so not in its rate.
  run.stats.eval_seconds += e.eval_seconds;
  watch.check_test_loss(run.epoch, e.test_loss);
  if (best_test_examples_ != 0 && best_test_examples_ != e.test_examples) {
    // The best was measured on another subset of the test set (a resume
    // with another limit_eval_batches), no measure of this one's losses:
    // this evaluation starts the best afresh.
    best_test_loss_ = std::numeric_limits<double>::infinity();
  }
  if (e.test_loss < best_test_loss_) {
    best_test_loss_ = e.test_loss;
    best_test_examples_ = e.test_examples;
    if (!o.best_checkpoint().empty()) { // never sharded
      synchronize(train_loader_.device());
      const auto start = std::chrono::steady_clock::now();
      gather_rank_sums();
      write_on_main_rank("writing the best checkpoint",
                         [&] { save_checkpoint(o.best_checkpoint()); });
      checkpoint_seconds_ += seconds_since(start);
      const auto& group = o.process_group();
      e.best_written = !group || group->is_main();
    }
  }
  e.best_test_loss = best_test_loss_;
  // The evaluation's step is the natural point to save, as nanoGPT does;
  // checkpoint_every decides whether it is one.
  const bool checkpoint_due =
      o.checkpoint_every() > 0 && global_step_ % o.checkpoint_every() == 0;
  if (checkpoint_due && checkpoint_step_ != global_step_) {
    write_checkpoint();
    e.checkpoint_written = checkpoint_is_mine();
  }
  if (on_evaluation) {
    on_evaluation(e);
  }
  return true;
}

void Trainer::finish_epoch(EpochRun& run, DivergenceWatch& watch) {
  const auto device = train_loader_.device();
  auto& stats = run.stats;
  synchronize(device);
  // Training time only: the evaluations of eval_every inside the epoch
  // (their time is in eval_seconds) are left out.
  // Nor the checkpoints written inside it.
  stats.checkpoint_seconds = checkpoint_seconds_;
  stats.seconds =
      seconds_since(run.start) - stats.eval_seconds - stats.checkpoint_seconds;
  if (stats.warmup_seconds > 0 && run.examples > run.warmup_examples) {
    stats.seconds -= stats.warmup_seconds;
    run.examples -= run.warmup_examples;
  }
  stats.global_step = global_step_;
  stats.skipped_steps = watch.read_epoch_skipped();
  stats.non_finite_losses = run.non_finite();
  // All ranks together: their finite losses over their finite steps, the
  // same on every rank, and every rank's examples.
  const auto epoch = ranks_mean(options_.process_group(), run.loss_sum,
                                stats.non_finite_losses,
                                "the all-reduce of the epoch's training loss");
  run.loss_sum.fill_(epoch.loss_sum);
  if (const auto& group = options_.process_group();
      group && group->is_distributed()) {
    run.examples *= group->world_size();
  }
  const int64_t steps = stats.resumed_steps + stats.steps;
  const double finite_steps = static_cast<double>(steps) - epoch.non_finite;
  stats.train_loss = finite_steps > 0 ? epoch.loss_sum / finite_steps : 0.0;
  // Every step's loss inf/NaN on every rank (the mean count is `steps` only
  // then): decided alike on each.
  watch.check_epoch(run.epoch, steps,
                    static_cast<int64_t>(std::floor(epoch.non_finite)),
                    stats.train_loss, *model_);
  stats.examples_per_second =
      stats.seconds > 0 ? run.examples / stats.seconds : 0.0;
  if (options_.task().is_language_model()) {
    stats.tokens_per_second =
        stats.examples_per_second *
        static_cast<double>(
            options_.task().predictions_per_example(train_loader_.data()));
  }
  stats.peak_memory_bytes =
      device.is_cuda()
          ? peak_device_memory(device) +
                (run.graphs_before_epoch ? step_->cuda_graph_pool_bytes() : 0)
          : peak_host_memory();
  stats.loss_scale =
      step_->scaler().is_enabled() ? step_->scaler().get_scale() : 1.0;
}

bool Trainer::evaluate_epoch(
    EpochRun& run, DivergenceWatch& watch,
    const std::function<void(const EvalProgress&)>& on_eval_batch) {
  // Timed apart from training and warm-up: the first evaluation's autotuning
  // for its shapes is evaluation time, not the training step's warm-up.
  const auto eval_start = std::chrono::steady_clock::now();
  const auto evaluated = run_evaluations(on_eval_batch, run.stats.epoch, [&] {
    return stop_here(run, run.stats.resumed_steps + run.stats.steps,
                     /*in_evaluation=*/true);
  });
  if (!evaluated) {
    return false;
  }
  const auto& eval = evaluated->first;
  auto& stats = run.stats;
  stats.train_evaluation = evaluated->second;
  stats.eval_seconds = seconds_since(eval_start);
  stats.test_loss = eval.loss;
  stats.test_accuracy = eval.accuracy;
  stats.test_batches = eval.batches;
  stats.test_batches_in_set = eval.batches_in_set;
  stats.test_examples = eval.examples;
  watch.check_test_loss(run.epoch, stats.test_loss);
  return true;
}

bool Trainer::loss_scaled() {
  const auto& scaler = step_->scaler();
  return scaler.is_enabled() && scaler.options().dynamic();
}

std::string Trainer::locate_numerics() {
  if (last_finding_) {
    return last_finding_->to_string();
  }
  const auto& group = options_.process_group();
  if (!last_inputs_.defined() || (group && group->is_distributed())) {
    return ""; // a backward on one rank alone would wait for the others
  }
  const auto finding = detail::rerun_under_check(
      model_, *step_, forward_, options_.task(), last_inputs_, last_targets_,
      global_step_, loss_scaled());
  return finding.empty()
             ? ""
             : "re-running the last batch under the numerics check: " + finding;
}

void Trainer::keep_epoch_sums(const EpochRun& run) {
  resumed_loss_sum_ = run.loss_sum.item<double>();
  resumed_non_finite_ = run.non_finite();
}

void Trainer::keep_interval_sums(const DivergenceWatch& watch) {
  if (options_.eval_every() == 0) {
    return; // no interval between evaluations inside the run
  }
  resumed_interval_loss_sum_ = interval_loss_sum_.item<double>();
  resumed_interval_steps_ = interval_steps_;
  resumed_interval_non_finite_ =
      watch.read_non_finite_losses() - interval_non_finite_before_;
}

void Trainer::end_epoch(EpochRun& run) {
  auto& stats = run.stats;
  if (!stats.partial()) {
    start_epoch_ = stats.epoch;
    start_step_in_epoch_ = 0;
  } else {
    keep_epoch_sums(run); // for a save_checkpoint() after fit()
  }
  // A partial epoch (the run ended inside it) writes the position inside
  // it: a longer run resumes there.
  if (!options_.checkpoint().empty()) {
    if (checkpoint_step_ != global_step_) {
      write_checkpoint(); // else an evaluation at this step wrote it
    }
    stats.checkpoint_written = checkpoint_is_mine();
  }
  if (stop_point_.stopped) { // during the epoch's evaluation
    stop_point_.checkpoint_step = checkpoint_step_;
  }
}

} // namespace training
} // namespace lamp
