#include "classifier_program.h"

#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>

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

// A one-line progress bar with rate and ETA, redrawn in place on a terminal.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled) {}
  void update(const lamp::training::BatchProgress& p) {
    if (!enabled_) {
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (p.batch == 1) {
      start_ = now;
      images_ = 0;
    }
    images_ += p.images;
    if (p.batch != p.batches && now - last_ < std::chrono::milliseconds(100)) {
      return;
    }
    last_ = now;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const double rate = seconds > 0 ? images_ / seconds : 0.0;
    const double eta =
        p.batch > 0 ? seconds * (p.batches - p.batch) / p.batch : 0.0;
    const int width = 30;
    const int filled = static_cast<int>(width * p.batch / p.batches);
    std::string bar(filled, '=');
    bar.resize(width, ' ');
    std::fprintf(stdout,
                 "\r  epoch %lld [%s] %lld/%lld  %.0f img/s  ETA %.0f s ",
                 static_cast<long long>(p.epoch), bar.c_str(),
                 static_cast<long long>(p.batch),
                 static_cast<long long>(p.batches), rate, eta);
    std::fflush(stdout);
  }
  void finish() {
    if (enabled_) {
      std::fprintf(stdout, "\r%*s\r", 100, "");
      std::fflush(stdout);
    }
  }

 private:
  bool enabled_;
  std::chrono::steady_clock::time_point start_, last_;
  int64_t images_ = 0;
};

torch::Device resolve_device(const std::string& name) {
  if (name.empty()) {
    return lamp::cuda_available() ? torch::Device(torch::kCUDA)
                                  : torch::Device(torch::kCPU);
  }
  torch::Device device(torch::kCPU);
  try {
    device = torch::Device(name);
  } catch (const c10::Error&) {
    TORCH_CHECK(false, "--device '", name,
                "' is not a device; use cpu, cuda or cuda:N.");
  }
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), "--device '", name,
              "': only cpu and cuda devices are supported.");
  TORCH_CHECK(!device.is_cpu() || !device.has_index() || device.index() == 0,
              "--device ", name,
              ": there is only one CPU device (LibTorch uses all cores through "
              "it); use --device cpu.");
  TORCH_CHECK(!device.is_cuda() || lamp::cuda_available(), "--device ", name,
              ": no CUDA GPU is available to this process (or this LibTorch "
              "was built without CUDA); use --device cpu.");
  return device;
}

// The --log-json file: one JSON object per line, every write checked, so a
// full disk or a vanished file stops the run instead of losing the log.
class JsonLog {
 public:
  // Refuses what is not (or would not become) a regular file before opening
  // it: opening a FIFO without a reader blocks forever, and a device such as
  // /dev/full or /dev/null would swallow the log.
  explicit JsonLog(const std::string& path) : path_(path) {
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

  void write(const nlohmann::json& line) {
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
  std::ofstream out_;
};

} // namespace

// CLI11 converts an out-of-range or negative value for a uint64_t to a
// wrapped or saturated number without a word: check the text first.
const CLI::Validator kUnsignedInteger(
    [](std::string& text) -> std::string {
      const bool digits =
          !text.empty() && text.size() <= 20 &&
          text.find_first_not_of("0123456789") == std::string::npos;
      if (digits && (text.size() < 20 || text <= "18446744073709551615")) {
        return "";
      }
      return "'" + text + "' is not an integer in 0..18446744073709551615";
    },
    "UINT64");

void add_options(CLI::App& app, ProgramConfig& c) {
  app.add_option("--model", c.model, "network")
      ->check(CLI::IsMember(c.models))
      ->capture_default_str();
  app.add_option("--precision", c.precision,
                 "fp32 | tf32 | amp | amp-bf16 | half | bf16 (fp16 = half)")
      ->check(CLI::IsMember(
          {"fp32", "tf32", "amp", "amp-bf16", "half", "fp16", "bf16"}))
      ->capture_default_str();
  app.add_flag("--fp16", c.fp16, "same as --precision half (the seed's flag)");
  // At most a million epochs: epochs times steps per epoch (the length of
  // the learning-rate schedule) then stays far inside int64.
  app.add_option("--epochs", c.epochs, "epochs (1 to 1000000)")
      ->check(CLI::Range(int64_t{1}, kMaxEpochs))
      ->capture_default_str();
  app.add_option("--batch-size", c.batch_size,
                 "images per step (at most the training images, per rank)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--eval-batch-size", c.eval_batch_size,
                 "images per evaluation batch (larger than the test set: the "
                 "whole test set in one batch)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--optimizer", c.optimizer,
                 "sgd | adam | adamw (fused kernels where available)")
      ->check(CLI::IsMember(lamp::optim::optimizer_names()))
      ->capture_default_str();
  app.add_option("--lr", c.lr,
                 "peak learning rate (e.g. 1e-3 for adam/adamw)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--momentum", c.momentum, "SGD momentum (Nesterov)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay,
                 "L2 weight decay (decoupled for adamw)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--schedule", c.schedule, "onecycle | cosine | constant")
      ->check(CLI::IsMember({"onecycle", "cosine", "constant"}))
      ->capture_default_str();
  app.add_flag("--cudnn-benchmark", c.cudnn_benchmark,
               "let cuDNN pick its fastest algorithms");
  app.add_option("--cudnn-benchmark-limit", c.cudnn_benchmark_limit,
                 "algorithms cuDNN's benchmark mode tries per shape (0 = all)")
      ->check(CLI::Range(int64_t{0}, int64_t{INT_MAX}))
      ->capture_default_str();
  app.add_flag("--cuda-graph", c.cuda_graph,
               "capture the training step in CUDA graphs (CUDA, fused "
               "optimizer; experimental)");
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
      ->check(kUnsignedInteger)
      ->capture_default_str();
  app.add_option("--checkpoint", c.checkpoint,
                 "write a checkpoint here after every epoch");
  app.add_option("--export-state-dict", c.export_state_dict,
                 "after training, write the weights here as a Python "
                 "state_dict (FP32) for torch.load + model.load_state_dict");
  app.add_option("--resume", c.resume, "resume from this checkpoint");
  app.add_option("--log-json", c.log_json,
                 "append one JSON object per epoch to this file");
  app.add_option("--max-steps", c.max_steps,
                 "stop after this many steps (smoke runs)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("!--no-progress", c.progress, "no progress bar");
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
    lamp::training::check_writable_path(config.export_state_dict,
                                        "--export-state-dict");
  }
  TORCH_CHECK(!config.fp16 || config.precision == "fp32" ||
                  config.precision == "half" || config.precision == "fp16",
              "--fp16 and --precision ", config.precision,
              " contradict each other; give one of them.");
  lamp::set_cudnn_benchmark(config.cudnn_benchmark);
  lamp::set_cudnn_benchmark_limit(static_cast<int>(config.cudnn_benchmark_limit));
  torch::manual_seed(config.seed);

  auto model = spec.make_model(config.model);
  model.module->to(device);
  if (config.channels_last) {
    for (auto& p : model.module->parameters()) {
      if (p.dim() == 4) {
        p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
      }
    }
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
  auto train_options = lamp::data::LoaderOptions(config.batch_size)
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
          .cuda_graph(config.cuda_graph)
          .lr(config.lr)
          .momentum(config.momentum)
          .weight_decay(config.weight_decay)
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
    log = std::make_unique<JsonLog>(config.log_json);
  }
  if (main_rank) {
    std::printf(
        "%s: %s, %s on %s, %lld train / %lld test images, batch %lld, "
        "%lld epochs%s%s\n",
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
            : "");
    std::fflush(stdout);
  }
  ProgressBar bar(main_rank && config.progress && isatty(STDOUT_FILENO));
  trainer.fit(
      [&](const lamp::training::EpochStats& s) {
        if (!main_rank) {
          return;
        }
        bar.finish();
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
          nlohmann::json line = {{"program", spec.program},
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
                                 {"lr", s.lr}};
          log->write(line);
        }
      },
      [&](const lamp::training::BatchProgress& p) { bar.update(p); });
  if (!config.export_state_dict.empty() && main_rank) {
    lamp::models::export_state_dict(
        *model.module, config.model, config.export_state_dict,
        lamp::models::StateDictOptions().master_weights(
            trainer.train_step().master_weights()));
  }
}

int guarded_main(const std::string& program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const c10::Error& e) {
    std::cerr << program << ": error: " << e.what_without_backtrace() << "\n";
  } catch (const std::exception& e) {
    std::cerr << program << ": error: " << e.what() << "\n";
  }
  return 1;
}

} // namespace lamp_examples
