#include "classifier_program.h"

#include <lamp/version.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>

namespace lamp_examples {
namespace {

constexpr int64_t kMaxEpochs = 1000000;

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", bytes / (1024.0 * 1024.0));
  return text;
}

// Seconds as "1:05" or "1:02:03" for ETAs.
std::string clock_time(double seconds) {
  const auto total = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof(text), "%lld:%02lld:%02lld", total / 3600,
                  total / 60 % 60, total % 60);
  } else {
    std::snprintf(text, sizeof(text), "%lld:%02lld", total / 60, total % 60);
  }
  return text;
}

// The current time in UTC as ISO 8601 with milliseconds.
std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(
                          now.time_since_epoch())
                          .count() %
                      1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[80]; // room for any int the compiler cannot rule out
  std::snprintf(text, sizeof(text), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
                utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday, utc.tm_hour,
                utc.tm_min, utc.tm_sec, static_cast<int>(millis));
  return text;
}

// A run's id: its start time, the process id and 32 random bits, so that
// runs appended to one log file can be told apart.
std::string new_run_id() {
  std::string id = utc_now();
  id.erase(std::remove_if(id.begin(), id.end(),
                          [](char c) { return c == '-' || c == ':'; }),
           id.end());
  id = id.substr(0, id.find('.')) + "Z";
  char tail[32];
  std::snprintf(tail, sizeof(tail), "-%d-%08x", static_cast<int>(getpid()),
                static_cast<unsigned>(std::random_device{}()));
  return id + tail;
}

// The terminal's width in columns (stderr's), COLUMNS, or 80.
int terminal_width() {
  struct winsize size {};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) {
    return size.ws_col;
  }
  if (const char* columns = std::getenv("COLUMNS")) {
    const int n = std::atoi(columns);
    if (n > 0) {
      return n;
    }
  }
  return 80;
}

// The mean of the finite losses and the images of a stretch of steps inside
// one epoch, as differences of the trainer's running totals
// (BatchProgress::epoch_loss_sum, non_finite_losses): nothing is added to the
// steps; take() reads the device once.
class LossWindow {
 public:
  void add(const lamp::training::BatchProgress& p) {
    if (p.batch == 1) { // the epoch's sum starts again: so does the window
      sum_at_ = 0;
      non_finite_at_ = p.non_finite_before_epoch;
      batch_at_ = 0;
      images_ = 0;
    }
    images_ += p.images;
  }
  // {mean finite loss (NaN when none was finite), images} since the last
  // take() in this epoch.
  std::pair<double, int64_t> take(const lamp::training::BatchProgress& p) {
    const auto host = torch::stack({p.epoch_loss_sum.to(torch::kDouble),
                                    p.non_finite_losses.to(torch::kDouble)})
                          .cpu();
    const double sum = host[0].item<double>();
    const auto non_finite = static_cast<int64_t>(host[1].item<double>());
    const int64_t finite =
        (p.batch - batch_at_) - (non_finite - non_finite_at_);
    const double mean = finite > 0 ? (sum - sum_at_) / finite
                                   : std::numeric_limits<double>::quiet_NaN();
    const int64_t images = images_;
    sum_at_ = sum;
    non_finite_at_ = non_finite;
    batch_at_ = p.batch;
    images_ = 0;
    return {mean, images};
  }

 private:
  double sum_at_ = 0;
  int64_t non_finite_at_ = 0;
  int64_t batch_at_ = 0;
  int64_t images_ = 0;
};

// The --log-json file: one JSON object per line, every write checked, so a
// full disk or a vanished file stops the run instead of losing the log.
class JsonLog {
 public:
  // Refuses what is not (or would not become) a regular file before opening
  // it: opening a FIFO without a reader blocks forever, and a device such as
  // /dev/full or /dev/null would swallow the log.
  JsonLog(const std::string& path, std::string run_id)
      : path_(path), run_id_(std::move(run_id)) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      TORCH_CHECK(S_ISREG(st.st_mode), "--log-json ", path,
                  " exists and is not a regular file (a ",
                  file_kind(st.st_mode),
                  "); give the path of a JSON Lines file to append to.");
    }
    errno = 0;
    out_.open(path, std::ios::app);
    TORCH_CHECK(out_.is_open(), "--log-json: cannot open ", path,
                " for appending (", std::strerror(errno),
                "); check that its folder exists and is writable.");
  }

  // One record: {"record": kind, "run_id": ..., "time": ..., fields...}.
  void write(const char* kind, const nlohmann::ordered_json& fields) {
    nlohmann::ordered_json line = {
        {"record", kind}, {"run_id", run_id_}, {"time", utc_now()}};
    for (const auto& item : fields.items()) {
      line[item.key()] = item.value();
    }
    errno = 0;
    out_ << line.dump() << "\n";
    out_.flush();
    TORCH_CHECK(out_.good(), "--log-json: writing to ", path_, " failed (",
                errno != 0 ? std::strerror(errno) : "stream error",
                "); the log is incomplete. Free space on its disk or give "
                "another --log-json.");
  }

 private:
  static const char* file_kind(mode_t mode) {
    if (S_ISDIR(mode))
      return "directory";
    if (S_ISFIFO(mode))
      return "FIFO";
    if (S_ISCHR(mode))
      return "character device";
    if (S_ISBLK(mode))
      return "block device";
    if (S_ISSOCK(mode))
      return "socket";
    return "special file";
  }

  std::string path_;
  std::string run_id_;
  std::ofstream out_;
};

// Progress inside an epoch, as people expect from tqdm:
//  - on a terminal, a bar on stderr fitted to its width, redrawn at most ten
//    times a second: batches, running loss, img/s, loss scale, ETA;
//  - every `log_every` steps (or, on a non-terminal without --log-every,
//    every 30 s) a plain line on stdout, and with --log-json a "step" record;
//  - clear() erases the bar before any other output (epoch lines, errors).
class Progress {
 public:
  Progress(bool bar, bool timed_lines, int64_t log_every, bool show_scale,
           int64_t epochs, JsonLog* log)
      : bar_(bar),
        timed_lines_(timed_lines),
        log_every_(log_every),
        show_scale_(show_scale),
        epochs_(epochs),
        log_(log) {}

  // An error unwinding through the run erases the bar before it is printed.
  ~Progress() { clear(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  bool active() const { return bar_ || timed_lines_ || log_every_ > 0; }

  void update(const lamp::training::BatchProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (p.batch == 1) {
      epoch_start_ = line_start_ = last_line_ = now;
      epoch_images_ = 0;
    }
    epoch_images_ += p.images;
    if (bar_) {
      bar_window_.add(p);
    }
    if (log_every_ > 0 || timed_lines_) {
      line_window_.add(p); // a line covers steps of one epoch only
      if (log_every_ > 0 ? p.global_step % log_every_ == 0
                         : now - last_line_ >= std::chrono::seconds(30)) {
        write_line(p, now);
      }
    }
    if (bar_ && (p.batch == p.batches ||
                 now - last_draw_ >= std::chrono::milliseconds(100))) {
      draw(p, now);
    }
  }

  void clear() {
    if (drawn_) {
      std::fprintf(stderr, "\r%*s\r", terminal_width() - 1, "");
      std::fflush(stderr);
      drawn_ = false;
    }
  }

 private:
  static double seconds(std::chrono::steady_clock::duration d) {
    return std::chrono::duration<double>(d).count();
  }

  std::string scale_text(const lamp::training::BatchProgress& p) const {
    return show_scale_ && p.loss_scale.defined()
               ? "scale " + short_number(p.loss_scale.item<double>())
               : "";
  }

  void write_line(const lamp::training::BatchProgress& p,
                  std::chrono::steady_clock::time_point now) {
    const auto window = line_window_.take(p);
    const double elapsed = seconds(now - line_start_);
    const double rate = elapsed > 0 ? window.second / elapsed : 0.0;
    const auto scale = scale_text(p);
    clear();
    std::printf(
        "epoch %lld/%lld  step %lld/%lld  loss %.4f  %.0f img/s  lr %.4g%s%s\n",
        static_cast<long long>(p.epoch), static_cast<long long>(epochs_),
        static_cast<long long>(p.batch), static_cast<long long>(p.batches),
        window.first, rate, p.lr, scale.empty() ? "" : "  ", scale.c_str());
    std::fflush(stdout);
    if (log_ && log_every_ > 0) {
      log_->write("step",
                  {{"epoch", p.epoch},
                   {"batch", p.batch},
                   {"global_step", p.global_step},
                   {"loss", window.first},
                   {"images_per_second", rate},
                   {"loss_scale",
                    p.loss_scale.defined() ? p.loss_scale.item<double>() : 1.0},
                   {"lr", p.lr},
                   {"warmup", p.warmup}});
    }
    line_start_ = last_line_ = now;
  }

  void draw(const lamp::training::BatchProgress& p,
            std::chrono::steady_clock::time_point now) {
    last_draw_ = now;
    const double elapsed = seconds(now - epoch_start_);
    const double rate = elapsed > 0 ? epoch_images_ / elapsed : 0.0;
    const double eta = elapsed * (p.batches - p.batch) / p.batch;
    const double loss = bar_window_.take(p).first;
    const auto left =
        "epoch " + std::to_string(p.epoch) + "/" + std::to_string(epochs_);
    // The parts after the bar, dropped from the end while they do not fit.
    std::vector<std::string> parts = {
        std::to_string(p.batch) + "/" + std::to_string(p.batches),
        "loss " + (std::isfinite(loss) ? fixed(loss, 4) : std::string("nan")),
        // Nothing is timed yet after the first batch (as tqdm's "?").
        (p.batch > 1 ? fixed(rate, 0) : std::string("?")) + " img/s",
        scale_text(p),
        "ETA " + (p.batch > 1 ? clock_time(eta) : std::string("?"))};
    const int width = terminal_width() - 1;
    std::string right;
    for (const auto& part : parts) {
      if (!part.empty()) {
        right += " " + part;
      }
    }
    while (static_cast<int>(left.size() + right.size()) + 12 > width &&
           right.find(' ', 1) != std::string::npos) {
      right.erase(right.rfind(' '));
    }
    const int bar_width =
        width - static_cast<int>(left.size() + right.size()) - 3;
    std::string line = left;
    if (bar_width >= 5) {
      const int filled = static_cast<int>(bar_width * p.batch / p.batches);
      std::string bar(filled, '=');
      if (filled < bar_width) {
        bar += '>';
      }
      bar.resize(bar_width, ' ');
      line += " [" + bar + "]";
    }
    line += right;
    line.resize(std::min<size_t>(line.size(), width));
    std::fprintf(stderr, "\r%-*s", width, line.c_str());
    std::fflush(stderr);
    drawn_ = true;
  }

  const bool bar_;
  const bool timed_lines_;
  const int64_t log_every_;
  const bool show_scale_;
  const int64_t epochs_;
  JsonLog* log_;
  LossWindow bar_window_, line_window_;
  std::chrono::steady_clock::time_point epoch_start_, line_start_, last_line_,
      last_draw_;
  int64_t epoch_images_ = 0;
  bool drawn_ = false;
};

} // namespace

void add_options(CLI::App& app, ProgramConfig& c) {
  app.add_option("--model", c.model, "network")
      ->check(CLI::IsMember(c.models))
      ->capture_default_str();
  app.add_option("--precision", c.precision,
                 "fp32 | tf32 | amp | amp-bf16 | half | bf16 (fp16 = half)")
      ->check(CLI::IsMember(precision_flag_values()))
      ->capture_default_str();
  app.add_flag("--fp16", c.fp16, "same as --precision half (the seed's flag)");
  // At most a million epochs: epochs times steps per epoch (the length of
  // the learning-rate schedule) then stays far inside int64.
  app.add_option("--epochs", c.epochs, "epochs, 1..1000000")
      ->check(integer_in(1, kMaxEpochs))
      ->capture_default_str();
  app.add_option("--batch-size", c.batch_size,
                 "images per step (at most the training images, per rank)")
      ->check(integer_at_least(1))
      ->capture_default_str();
  app.add_option("--eval-batch-size", c.eval_batch_size,
                 "images per evaluation batch (larger than the test set: the "
                 "whole test set in one batch)")
      ->check(integer_at_least(1))
      ->capture_default_str();
  app.add_option("--optimizer", c.optimizer,
                 "sgd | adam | adamw (fused kernels where available)")
      ->check(CLI::IsMember(lamp::optim::optimizer_names()))
      ->capture_default_str();
  app.add_option("--lr", c.lr, "peak learning rate (e.g. 1e-3 for adam/adamw)")
      ->check(positive_real())
      ->capture_default_str();
  app.add_option("--momentum", c.momentum, "SGD momentum (Nesterov), in [0, 1]")
      ->check(real_in(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay,
                 "L2 weight decay (decoupled for adamw)")
      ->check(non_negative_real())
      ->capture_default_str();
  app.add_flag("--no-bias-decay", c.no_bias_decay,
               "no weight decay on biases and norm parameters (tensors of at "
               "most one dimension)");
  app.add_option("--max-grad-norm", c.max_grad_norm,
                 "clip the gradients' global L2 norm to this (0 = off)")
      ->check(non_negative_real())
      ->capture_default_str();
  app.add_option("--accumulation-steps", c.accumulation_steps,
                 "batches per optimizer step (gradients summed), 1..1048576; "
                 "must divide the batches per epoch")
      ->check(integer_in(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--schedule", c.schedule, "onecycle | cosine | constant")
      ->check(CLI::IsMember({"onecycle", "cosine", "constant"}))
      ->capture_default_str();
  app.add_flag("--cudnn-benchmark", c.cudnn_benchmark,
               "let cuDNN pick its fastest algorithms");
  app.add_option("--cudnn-benchmark-limit", c.cudnn_benchmark_limit,
                 "algorithms cuDNN's benchmark mode tries per shape (0 = all)")
      ->check(integer_in(0, INT_MAX))
      ->capture_default_str();
  app.add_option("--cuda-graph", c.cuda_graph,
                 "capture the training step in CUDA graphs: auto (where they "
                 "apply: CUDA, fused optimizer, no accumulation, one process; "
                 "the reason is printed where not), on (refuse a run where "
                 "they cannot), off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--drop-last", c.drop_last,
                 "drop the last partial training batch: auto (on CUDA, where "
                 "a new shape means autotuning and a new graph), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_flag("--channels-last", c.channels_last,
               "NHWC memory format for images and model");
  app.add_option("--data", c.data, "dataset directory")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            return value.empty()
                       ? "the folder name is empty; give the dataset folder"
                       : "";
          },
          "DIR"))
      ->capture_default_str();
  app.add_option("--device", c.device,
                 "cpu, cuda or cuda:N (default: cuda when available)");
  app.add_option("--seed", c.seed,
                 "seed of initialisation, data order and augmentation")
      ->check(unsigned_integer())
      ->capture_default_str();
  app.add_option("--checkpoint", c.checkpoint,
                 "write a checkpoint here after every epoch");
  app.add_option("--export-state-dict", c.export_state_dict,
                 "after training, write the weights here as a Python "
                 "state_dict (FP32) for torch.load + model.load_state_dict");
  app.add_option("--resume", c.resume, "resume from this checkpoint");
  app.add_option("--log-json", c.log_json,
                 "append JSON Lines records to this file: a run header, one "
                 "per epoch, one per --log-every steps");
  app.add_option("--log-every", c.log_every,
                 "every N steps print a progress line (and with --log-json "
                 "write a step record); 0 = a line every 30 s when the output "
                 "is not a terminal")
      ->check(integer_at_least(0))
      ->capture_default_str();
  app.add_option("--max-steps", c.max_steps,
                 "stop after this many steps, 0 = no limit (smoke runs)")
      ->check(integer_at_least(0))
      ->capture_default_str();
  app.add_flag_callback(
      "--no-progress", [&c] { c.progress = false; },
      "no progress bar or timed progress lines");
  app.add_flag(
      "--report-precision", c.report_precision,
      "before training, print every parameter's and buffer's dtype "
      "and the dtypes of the convolutions/matmuls of one evaluation pass");
}

std::pair<std::vector<double>, std::vector<double>> channel_stats(
    const torch::Tensor& images, const std::string& what) {
  std::vector<double> mean, std;
  for (int64_t c = 0; c < images.size(1); ++c) {
    const auto x = images.select(1, c).to(torch::kDouble).div_(255.0);
    mean.push_back(x.mean().item<double>());
    std.push_back(x.std().item<double>());
    TORCH_CHECK(std.back() > 0, what, " have zero variance in channel ", c,
                " (every pixel is ", static_cast<int>(mean.back() * 255 + 0.5),
                ", e.g. all black), so they cannot be normalised; the data is "
                "blank or corrupt.");
  }
  return {mean, std};
}

void run(const ProgramConfig& config, const RunSpec& spec) {
  // Under torchrun: one rank per process, the CUDA device of LOCAL_RANK;
  // otherwise a single-process group.
  auto group = lamp::distributed::ProcessGroup::from_environment(
      resolve_device(config.device));
  const auto device = group->device();
  const bool main_rank = group->is_main();
  const auto precision = lamp::parse_precision(config.fp16 ? std::string("half")
                                                           : config.precision);
  if (!config.export_state_dict.empty() && main_rank) {
    lamp::check_writable_path(config.export_state_dict, "--export-state-dict");
  }
  TORCH_CHECK(!config.fp16 || config.precision == "fp32" ||
                  config.precision == "half" || config.precision == "fp16",
              "--fp16 and --precision ", config.precision,
              " contradict each other; give one of them.");
  lamp::set_cudnn_benchmark(config.cudnn_benchmark);
  lamp::set_cudnn_benchmark_limit(
      static_cast<int>(config.cudnn_benchmark_limit));
  torch::manual_seed(config.seed);

  auto model = spec.make_model(config.model);
  model.module->to(device);
  if (config.channels_last) {
    lamp::models::to_channels_last(*model.module);
  }
  // "half"/"bf16": fastai's network_to_half, BatchNorm kept FP32, with the
  // input cast in front of the forward (the trainer's TrainStep then finds
  // the model converted). The parameter names stay the model's own.
  if (const auto dtype = lamp::precision_policy(precision).model_dtype) {
    model = lamp::models::network_to_half(std::move(model),
                                          lamp::HalfOptions(*dtype));
  }
  // The flags' limits, said in the flags' words before the loaders say them
  // in the library's.
  const int64_t world = group->world_size();
  const int64_t train_images = spec.train.size();
  const int64_t per_rank = train_images / world + (train_images % world != 0);
  TORCH_CHECK(config.batch_size <= per_rank, "--batch-size ", config.batch_size,
              " is larger than the ", train_images, " training images",
              world > 1 ? " (" + std::to_string(per_rank) + " per rank)"
                        : std::string(),
              "; use --batch-size ", per_rank, " or less.");
  // One evaluation batch can hold at most the whole test set.
  const int64_t eval_batch_size =
      std::min(config.eval_batch_size, spec.test.size());
  auto train_options =
      lamp::data::LoaderOptions(config.batch_size)
          .seed(config.seed)
          .crop_padding(spec.crop_padding)
          .horizontal_flip(spec.horizontal_flip)
          .mean(spec.mean)
          .std(spec.std)
          .channels_last(config.channels_last)
          .drop_last(config.drop_last == "on" ||
                     (config.drop_last == "auto" && device.is_cuda()))
          .num_shards(group->world_size())
          .shard(group->rank());
  auto test_options = lamp::data::LoaderOptions(eval_batch_size)
                          .shuffle(false)
                          .mean(spec.mean)
                          .std(spec.std)
                          .channels_last(config.channels_last);
  lamp::data::DeviceLoader train_loader(spec.train, device, train_options);
  // --epochs is at most kMaxEpochs, so this holds unless a dataset has
  // billions of batches; the schedule's length must fit int64.
  TORCH_CHECK(config.epochs <= std::numeric_limits<int64_t>::max() /
                                   train_loader.batches_per_epoch(),
              "--epochs ", config.epochs, " times ",
              train_loader.batches_per_epoch(),
              " steps per epoch overflows the step count; use fewer epochs.");
  const int64_t total_steps = config.epochs * train_loader.batches_per_epoch();
  TORCH_CHECK(config.max_steps <= total_steps, "--max-steps ", config.max_steps,
              " is more than the run's ", total_steps, " steps (",
              config.epochs, " epochs of ", train_loader.batches_per_epoch(),
              "); give at most ", total_steps, ", or 0 for no limit.");
  lamp::training::ClassifierTrainer trainer(
      model.module, model.forward, config.model, std::move(train_loader),
      lamp::data::DeviceLoader(spec.test, device, test_options),
      lamp::training::TrainerOptions()
          .precision(precision)
          .epochs(config.epochs)
          .optimizer(config.optimizer)
          .cuda_graph(lamp::parse_cuda_graph_mode(config.cuda_graph))
          .lr(config.lr)
          .momentum(config.momentum)
          .weight_decay(config.weight_decay)
          .no_bias_decay(config.no_bias_decay)
          .max_grad_norm(config.max_grad_norm)
          .accumulation_steps(config.accumulation_steps)
          .schedule(lamp::training::parse_schedule(config.schedule))
          .eval_batch_size(eval_batch_size)
          .max_steps(config.max_steps)
          .checkpoint(config.checkpoint)
          .resume(config.resume)
          .process_group(group));

  if (trainer.start_epoch() >= config.epochs) {
    if (main_rank) {
      const auto done = std::to_string(trainer.start_epoch());
      const auto epochs = std::to_string(config.epochs);
      std::printf(
          "%s: the run is complete (%s in %s); nothing to train.\n",
          spec.program.c_str(),
          trainer.start_epoch() == config.epochs
              ? (done + " of " + epochs + " epochs").c_str()
              : (done + " epochs, more than --epochs " + epochs).c_str(),
          config.resume.c_str());
      std::fflush(stdout);
    }
    return;
  }
  if (config.report_precision && main_rank) {
    // Evaluation changes nothing, so observing it leaves the run as it was.
    const auto ops = lamp::op_precision_report([&] { trainer.evaluate(); });
    std::printf("%s\nops of one evaluation pass:\n%s\n",
                lamp::precision_report(*model.module).to_string().c_str(),
                ops.to_string().c_str());
  }
  std::unique_ptr<JsonLog> log;
  if (!config.log_json.empty() && main_rank) {
    log = std::make_unique<JsonLog>(config.log_json, new_run_id());
    const auto cuda = lamp::cuda_versions();
    log->write("run",
               {{"program", spec.program},
                {"command_line", config.command_line},
                {"lamp_version", LAMP_VERSION},
                {"torch_version", TORCH_VERSION},
                {"libtorch", lamp::libtorch_version()},
                {"cuda", cuda.empty() ? nlohmann::ordered_json(nullptr)
                                      : nlohmann::ordered_json(cuda)},
                {"device", device.str()},
                {"device_name", lamp::device_name(device)},
                {"world_size", group->world_size()},
                {"model", config.model},
                {"precision", lamp::to_string(precision)},
                {"optimizer", config.optimizer},
                {"batch_size", config.batch_size},
                {"accumulation_steps", config.accumulation_steps},
                {"epochs", config.epochs},
                {"lr", config.lr},
                {"schedule", config.schedule},
                {"momentum", config.momentum},
                {"weight_decay", config.weight_decay},
                {"no_bias_decay", config.no_bias_decay},
                {"max_grad_norm", config.max_grad_norm},
                {"cuda_graph", trainer.train_step().cuda_graph_enabled()},
                {"seed", config.seed},
                {"train_images", spec.train.size()},
                {"test_images", spec.test.size()},
                {"start_epoch", trainer.start_epoch() + 1},
                {"resume", config.resume}});
  }
  if (main_rank) {
    const auto& step = trainer.train_step();
    std::printf(
        "%s: %s, %s on %s, %lld train / %lld test images, batch %lld, "
        "%lld epochs%s%s%s\n",
        spec.program.c_str(), config.model.c_str(),
        lamp::to_string(precision).c_str(), device.str().c_str(),
        static_cast<long long>(spec.train.images.size(0)),
        static_cast<long long>(spec.test.images.size(0)),
        static_cast<long long>(config.batch_size),
        static_cast<long long>(config.epochs),
        trainer.start_epoch() > 0 ? (", resuming at epoch " +
                                     std::to_string(trainer.start_epoch() + 1))
                                        .c_str()
                                  : "",
        group->is_distributed()
            ? (", data-parallel over " + std::to_string(group->world_size()) +
               " ranks (" + group->backend() + "), batch per rank")
                  .c_str()
            : "",
        step.cuda_graph_enabled() ? ", CUDA graphs" : "");
    if (device.is_cuda() && !step.cuda_graph_enabled() &&
        config.cuda_graph == "auto") {
      std::printf("%s: CUDA graphs off: %s\n", spec.program.c_str(),
                  step.cuda_graph_unavailable_reason().c_str());
    }
    std::fflush(stdout);
  }
  // The bar goes to stderr when it is a terminal; plain progress lines to
  // stdout, every --log-every steps, or every 30 s when stdout is not a
  // terminal (a CI log, `| tee`).
  Progress progress(main_rank && config.progress && isatty(STDERR_FILENO),
                    main_rank && config.progress && !isatty(STDOUT_FILENO),
                    main_rank ? config.log_every : 0,
                    trainer.train_step().scaler().is_enabled(), config.epochs,
                    log.get());

  trainer.fit(
      [&](const lamp::training::EpochStats& s) {
        if (!main_rank) {
          return;
        }
        progress.clear();
        std::printf(
            "epoch %lld/%lld  train loss %.4f  test loss %.4f  test acc %.2f%% "
            " "
            "%.2f s  %.0f img/s  peak %s  scale %g  skipped %lld%s\n",
            static_cast<long long>(s.epoch),
            static_cast<long long>(config.epochs), s.train_loss, s.test_loss,
            100.0 * s.test_accuracy, s.seconds, s.images_per_second,
            mib(s.peak_memory_bytes).c_str(), s.loss_scale,
            static_cast<long long>(s.skipped_steps),
            s.warmup_seconds > 0
                ? ("  warm-up " + fixed(s.warmup_seconds, 2) + " s").c_str()
                : "");
        std::fflush(stdout);
        if (log) {
          log->write("epoch", {{"program", spec.program},
                               {"model", config.model},
                               {"precision", lamp::to_string(precision)},
                               {"device", device.str()},
                               {"batch_size", config.batch_size},
                               {"epoch", s.epoch},
                               {"steps", s.steps},
                               {"global_step", s.global_step},
                               {"train_loss", s.train_loss},
                               {"test_loss", s.test_loss},
                               {"test_accuracy", s.test_accuracy},
                               {"seconds", s.seconds},
                               {"warmup_seconds", s.warmup_seconds},
                               {"images_per_second", s.images_per_second},
                               {"peak_memory_bytes", s.peak_memory_bytes},
                               {"loss_scale", s.loss_scale},
                               {"skipped_steps", s.skipped_steps},
                               {"non_finite_losses", s.non_finite_losses},
                               {"lr", s.lr}});
        }
      },
      progress.active()
          ? std::function<void(const lamp::training::BatchProgress&)>(
                [&](const lamp::training::BatchProgress& p) {
                  progress.update(p);
                })
          : nullptr);
  if (!config.export_state_dict.empty() && main_rank) {
    lamp::models::export_state_dict(
        *model.module, config.model, config.export_state_dict,
        lamp::models::StateDictOptions().master_weights(
            trainer.train_step().master_weights()));
  }
}

int program_main(int argc, char** argv, const std::string& program,
                 const std::string& description, ProgramConfig& config,
                 const std::function<RunSpec()>& make_spec) {
  CLI::App app{description, program};
  add_options(app, config);
  add_version_flag(app, program);
  const int status = parse_command_line(app, program, argc, argv);
  if (status >= 0) {
    return status;
  }
  config.command_line.assign(argv, argv + argc);
  return guarded_main(program, [&] {
    auto spec = make_spec();
    spec.program = program;
    run(config, spec);
    return 0;
  });
}

} // namespace lamp_examples
