// Training-step throughput of lamp's models, in the precision modes given:
//
//   lamp_bench --model resnet18 --batch-size 128 --precision fp32,amp,half
//              --channels-last --cudnn-benchmark --json results.json
//
// Method: a fixed synthetic batch already on the device (speed does not
// depend on pixel values), `--warmup` untimed steps (with --cuda-graph at
// least the graph's eager steps and its capture, so that no timed step pays
// for the capture), then `--steps` timed steps between two device
// synchronisations. Reported: images/s, seconds per
// `--epoch-images` epoch, peak memory (CUDA allocator, or RSS on CPU),
// achieved TFLOP/s from the analytic FLOP count and, with --matmul-peak, the
// fraction of a large matmul's TFLOP/s measured on the same device.
//
// --profile PATH: after the timed steps, `--profile-steps` more steps run
// under LibTorch's profiler; their Chrome trace goes to PATH and a table of
// time per kernel class is printed (bench/profile_table.h).
#include <lamp/lamp.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include "common/cli.h"
#include "common/gpt_kernels.h"
#include "profile_table.h"
#include "profiler.h"

namespace {

// The most timed steps a calibrated run may take (--min-seconds asks for
// more when the steps are fast), and the most --min-seconds may ask for.
constexpr int64_t kMaxTimedSteps = 100000;
constexpr double kMaxMinSeconds = 3600;

struct Config {
  std::string model = "resnet18";
  int64_t batch_size = 128;
  std::string precisions = "fp32,amp-bf16,bf16";
  bool channels_last = false;
  bool cudnn_benchmark = false;
  std::string device;
  int64_t warmup = 5;
  int64_t steps = 20;
  int64_t epoch_images = 0; // 0: 50,000 (CIFAR-10) or 60,000 (cnn)
  std::string json;
  bool matmul_peak = false;
  bool report_precision = false;
  std::string optimizer = "sgd";
  std::string optimizer_impl = "auto";
  bool cuda_graph = false;
  int64_t repeats = 1;
  double min_seconds = 0.0;
  std::string profile;
  int64_t profile_steps = 5;
  std::string fused_bn = "on";
  // --model gpt: the shape (dropout 0).
  int64_t gpt_layers = 6;
  int64_t gpt_heads = 6;
  int64_t gpt_width = 384;
  int64_t gpt_vocab = 256;
  int64_t context = 256;
  // --gpt-shape: a named shape that sets the four above and the context.
  std::string gpt_shape;
  bool fused_head_loss = false;
  // --fused-add-norm: GPTOptions::fused_add_norm.
  bool fused_add_norm = false;
  // --fused-mlp: GPTOptions::fused_mlp.
  bool fused_mlp = false;
  // --fused-weight-cast: GPTOptions::fused_weight_cast.
  bool fused_weight_cast = false;
  // --fused-bias-grad: GPTOptions::fused_bias_grad.
  bool fused_bias_grad = false;
  // --gpt-gelu: GPTOptions::gelu, "exact" or "tanh".
  std::string gpt_gelu = "exact";
  // --fp8-fused-casts: Float8Recipe::fused_casts in fp8.
  bool fp8_fused_casts = false;
  // --peak-tflops: the MFU's denominator where lamp::peak_flops() has no
  // entry for the device (a CPU); 0: the table's.
  double peak_tflops = 0;
  // --attention: the only backend scaled_dot_product_attention may use, or
  // "default" for LibTorch's choice.
  std::string attention = "default";
  std::string keep_host_memory = "on";
  // --threads: 0 keeps LibTorch's default, as the Python peers run with
  // theirs (bench/run.sh compares at equal threads).
  int64_t threads = 0;
};

bool is_gpt(const Config& c) {
  return c.model == "gpt";
}

lamp::models::GPTOptions gpt_options(const Config& c) {
  return lamp::models::GPTOptions()
      .layers(c.gpt_layers)
      .heads(c.gpt_heads)
      .width(c.gpt_width)
      .vocab_size(c.gpt_vocab)
      .context(c.context)
      .dropout(0)
      .fused_head_loss(c.fused_head_loss)
      .fused_add_norm(c.fused_add_norm)
      .fused_mlp(c.fused_mlp)
      .fused_weight_cast(c.fused_weight_cast)
      .fused_bias_grad(c.fused_bias_grad)
      .gelu(c.gpt_gelu == "tanh" ? lamp::models::GPTGelu::kTanh
                                 : lamp::models::GPTGelu::kExact);
}

// The step's options: the precision, the CUDA graph, FP8's recipe where
// --fp8-fused-casts asks for its one-pass casts.
lamp::TrainStepOptions step_options(const Config& c,
                                    const std::string& precision_name,
                                    bool gpt) {
  const auto precision = lamp::parse_precision(precision_name);
  auto options = lamp::TrainStepOptions(precision)
                     .cuda_graph(c.cuda_graph)
                     // GPT trainers clip the gradients' global norm to 1.
                     .max_grad_norm(gpt ? 1.0 : 0.0);
  if (c.fp8_fused_casts && lamp::precision_policy(precision).float8) {
    options.float8(lamp::nn::Float8Recipe().fused_casts(true));
  }
  return options;
}

// The GPT's optimizer: train_gpt's recipe, nanoGPT's for its character
// model (AdamW lr 1e-3, betas (0.9, 0.99), weight decay 0.1 on the tensors
// of 2+ dimensions, embeddings included; lamp's one weight-decay rule,
// OptimizerOptions::no_bias_decay). lamp::optim's AdamW: fused where the
// LibTorch has the kernel.
lamp::optim::OptimizerOptions gpt_optimizer_options(
    lamp::optim::Implementation implementation) {
  return lamp::optim::OptimizerOptions()
      .name("adamw")
      .lr(1e-3)
      .beta1(0.9)
      .beta2(0.99)
      .weight_decay(0.1)
      .no_bias_decay(true)
      .implementation(implementation);
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream stream(list);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (!item.empty())
      out.push_back(item);
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// TFLOP/s of a large square matmul in `dtype`: the achievable ceiling.
double matmul_tflops(const torch::Device& device, torch::Dtype dtype) {
  const int64_t n = device.is_cuda() ? 8192 : 1024;
  const auto options = torch::TensorOptions().device(device).dtype(dtype);
  const auto a = torch::randn({n, n}, options),
             b = torch::randn({n, n}, options);
  torch::mm(a, b);
  lamp::synchronize(device);
  const int reps = device.is_cuda() ? 20 : 3;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i)
    torch::mm(a, b);
  lamp::synchronize(device);
  return 2.0 * n * n * n * reps / seconds_since(start) / 1e12;
}

// The profile's rows as the results JSON keeps them: per step, as the table.
nlohmann::json profile_json(const lamp_bench::ProfileTable& table) {
  const double steps = static_cast<double>(table.run.steps);
  auto rows = nlohmann::json::array();
  for (const auto& row : table.rows) {
    rows.push_back({{"class", lamp_bench::to_string(row.kernel_class)},
                    {"seconds_per_step", row.seconds / steps},
                    {"flops_per_step", row.flops / steps},
                    {"bytes_per_step", row.bytes / steps},
                    {"rated_seconds_per_step", row.rated_seconds / steps}});
  }
  return {{"steps", table.run.steps},
          {"seconds_per_step", table.run.seconds / steps},
          {"unaccounted_seconds_per_step", table.unaccounted_seconds / steps},
          {"classes", rows}};
}

// The kernels the profile lists by name after its table.
constexpr size_t kTopKernels = 15;

// --profile: `c.profile_steps` more steps under LibTorch's profiler, their
// trace written to `trace_path`; the table as JSON rows and as "text".
nlohmann::json profile(const Config& c, const std::string& precision,
                       const torch::Device& device,
                       const std::function<void()>& step,
                       std::vector<int64_t> input_shape,
                       double unprofiled_step_seconds,
                       const std::string& trace_path) {
  const auto capture =
      lamp_bench::profile_steps(device, c.profile_steps, step, trace_path);
  lamp_bench::ProfileRun run;
  run.device_kernels = device.is_cuda();
  run.steps = c.profile_steps;
  run.seconds = capture.seconds;
  run.input_shape = std::move(input_shape);
  const auto table = lamp_bench::summarize(capture.events, run);
  auto out = profile_json(table);
  out["trace"] = trace_path;
  out["trace_writer"] = capture.trace_writer;
  std::ostringstream heading;
  heading << std::fixed << std::setprecision(3) << "profile of "
          << c.profile_steps << " steps (" << precision << ", "
          << (device.is_cuda() ? "CUDA kernels" : "CPU ops")
          << "): " << 1e3 * capture.seconds / c.profile_steps
          << " ms/step under the profiler, " << 1e3 * unprofiled_step_seconds
          << " without; trace by " << capture.trace_writer << ": " << trace_path
          << " (" << capture.trace_events << " events)\n";
  // The kernels themselves, for a comparison with another tool's profile
  // (bench/peer_pytorch.py --profile-steps prints the same list).
  const auto top = lamp_bench::top_kernels(capture.events, run, kTopKernels);
  auto kernels = nlohmann::json::array();
  for (const auto& k : top) {
    kernels.push_back({{"name", k.name},
                       {"seconds_per_step", k.seconds / c.profile_steps},
                       {"launches_per_step",
                        static_cast<double>(k.launches) / c.profile_steps}});
  }
  out["top_kernels"] = kernels;
  out["text"] = heading.str() + lamp_bench::format_table(table) +
                lamp_bench::format_top_kernels(top, run);
  return out;
}

// Whether the run trained on numbers: the last step's loss, and every
// parameter the optimizer updates (the FP32 masters in half/bf16) and the
// model's, finite after the timed steps. One host read, after the timing.
void record_health(nlohmann::json& result, const torch::nn::Module& model,
                   lamp::TrainStep& step, const lamp::StepResult& last,
                   int64_t steps_run) {
  std::vector<torch::Tensor> flags;
  for (const auto& p : model.parameters()) {
    flags.push_back(torch::isfinite(p.detach()).all());
  }
  for (const auto& group : step.optimizer().param_groups()) {
    for (const auto& p : group.params()) {
      flags.push_back(torch::isfinite(p.detach()).all());
    }
  }
  const bool params_finite = torch::stack(flags).all().item<bool>();
  const double loss = last.loss.defined()
                          ? last.loss.to(torch::kDouble).item<double>()
                          : std::nan("");
  const bool loss_finite = std::isfinite(loss);
  result["steps_run"] = steps_run;
  result["final_loss"] =
      loss_finite ? nlohmann::json(loss) : nlohmann::json(nullptr);
  result["finite"] = loss_finite && params_finite;
  if (loss_finite && params_finite) {
    result["garbage"] = nullptr;
  } else if (!loss_finite && !params_finite) {
    result["garbage"] = "non-finite loss and params";
  } else {
    result["garbage"] = loss_finite ? "non-finite params" : "non-finite loss";
  }
}

nlohmann::json run_one(const Config& c, const std::string& precision_name,
                       const torch::Device& device,
                       const std::string& trace_path) {
  nlohmann::json result = {{"model", c.model},
                           {"batch_size", c.batch_size},
                           {"precision", precision_name},
                           {"channels_last", c.channels_last},
                           {"cudnn_benchmark", c.cudnn_benchmark},
                           {"steps", c.steps},
                           {"warmup", c.warmup},
                           {"skipped", nullptr}};
  const bool cnn = c.model == "cnn";
  const bool gpt = is_gpt(c);
  const int64_t channels = cnn ? 1 : 3, side = cnn ? 28 : 32;
  // A GPT's epoch: a million tokens.
  const int64_t epoch_images =
      c.epoch_images > 0 ? c.epoch_images
                         : (gpt ? 1000000 / c.context : (cnn ? 60000 : 50000));
  result["epoch_images"] = epoch_images;
  if (gpt) {
    result["context"] = c.context;
    result["gpt_layers"] = c.gpt_layers;
    result["gpt_heads"] = c.gpt_heads;
    result["gpt_width"] = c.gpt_width;
    result["vocab_size"] = c.gpt_vocab;
    // From the options the model is built with: what ran, not what was
    // asked.
    const auto built = gpt_options(c);
    result["gpt_name"] = built.name();
    result["fused_head_loss"] = built.fused_head_loss();
    result["fused_add_norm"] = built.fused_add_norm();
    result["fused_mlp"] = built.fused_mlp();
    result["fused_weight_cast"] = built.fused_weight_cast();
    result["fused_bias_grad"] = built.fused_bias_grad();
    result["gpt_gelu"] =
        built.gelu() == lamp::models::GPTGelu::kTanh ? "tanh" : "exact";
    // Which code the fused operations ran: a fallback to ATen ops shows.
    result["kernel_paths"] = lamp_examples::gpt_kernel_notes(
        built, device, lamp::parse_precision(precision_name),
        c.fp8_fused_casts);
    result["fp8_fused_casts"] = c.fp8_fused_casts;
    result["attention"] = c.attention;
  }
  result["fused_bn"] = c.fused_bn;
  // What the device held before this configuration: its memory figures are
  // this configuration's own.
  const int64_t allocated_before = lamp::allocated_device_memory(device);
  const int64_t reserved_before = lamp::reserved_device_memory(device);
  torch::manual_seed(0);
  const auto model =
      gpt ? lamp::models::make_gpt(gpt_options(c))
          : lamp::models::make_model(c.model, 10, channels, c.fused_bn != "off",
                                     c.fused_bn == "conv");
  const auto& module = model.module;
  const auto& forward = model.forward;
  module->to(device);
  if (c.channels_last) {
    lamp::models::to_channels_last(*module);
  }
  std::unique_ptr<lamp::TrainStep> step;
  try {
    step = std::make_unique<lamp::TrainStep>(
        module,
        [&c](std::vector<torch::Tensor> params)
            -> std::unique_ptr<torch::optim::Optimizer> {
          const auto implementation =
              lamp::optim::parse_implementation(c.optimizer_impl);
          if (is_gpt(c)) {
            return lamp::optim::make_optimizer(
                std::move(params), gpt_optimizer_options(implementation));
          }
          // OptimizerOptions' defaults (the training programs' too), with
          // Adam's usual learning rate.
          auto options = lamp::optim::OptimizerOptions().name(c.optimizer);
          if (c.optimizer != "sgd") {
            options.lr(1e-3);
          }
          return lamp::optim::make_optimizer(
              std::move(params), options.implementation(implementation));
        },
        step_options(c, precision_name, gpt));
  } catch (const c10::Error& e) {
    result["skipped"] = e.what_without_backtrace();
    return result;
  }
  // The batch is made once, on the device, already in the model's dtype
  // (a GPT's: random token ids and next tokens).
  const auto on_device_long =
      torch::TensorOptions().device(device).dtype(torch::kLong);
  const auto images =
      gpt ? torch::randint(0, c.gpt_vocab, {c.batch_size, c.context},
                           on_device_long)
          : step->cast_input(
                torch::randn({c.batch_size, channels, side, side},
                             torch::TensorOptions().device(device))
                    .contiguous(c.channels_last
                                    ? torch::MemoryFormat::ChannelsLast
                                    : torch::MemoryFormat::Contiguous));
  const auto labels =
      gpt ? torch::randint(0, c.gpt_vocab, {c.batch_size, c.context},
                           on_device_long)
          : torch::randint(0, 10, {c.batch_size}, on_device_long);
  const auto batch_loss = [&](const torch::Tensor& x, const torch::Tensor& y) {
    // The forward phase of a profiled step (a no-op without a profiler).
    RECORD_USER_SCOPE(lamp_bench::kForwardScope);
    // --fused-head-loss: the GPT's head and loss together (the trainer's
    // TrainerOptions::training_loss).
    return model.loss ? model.loss(x, y)
                      : lamp::training::classifier_loss(forward(x), y);
  };
  // The batch form of step(): the one a CUDA graph can capture (eager
  // otherwise, the same work).
  int64_t steps_run = 0;
  lamp::StepResult last;
  const auto run_step = [&] {
    ++steps_run;
    last = step->step(images, labels, batch_loss);
    return last;
  };
  // A CUDA graph is captured after its eager warm-up steps, in the step
  // after them: both belong to the warm-up, as peer_pytorch.py's graph
  // tool captures in its own.
  const int64_t warmup =
      step->cuda_graph_enabled()
          ? std::max(c.warmup, step->options().graph_warmup_steps() + 1)
          : c.warmup;
  result["warmup"] = warmup;
  lamp::reset_peak_device_memory(device);
  for (int64_t i = 0; i < warmup; ++i)
    run_step();
  lamp::synchronize(device);
  // The steady state's memory: the warm-up's peak includes cuDNN's
  // autotuning workspaces and the eager steps before a capture. Their cached
  // blocks go back to the driver, and one untimed step fills the cache again
  // before the timing.
  const int64_t warmup_peak = lamp::peak_device_memory(device);
  if (device.is_cuda()) {
    lamp::release_cached_device_memory();
    lamp::reset_peak_device_memory(device);
    run_step();
    lamp::synchronize(device);
  }
  // Calibrated: at least --min-seconds of timed steps, so that launch jitter
  // and clock changes average out. The repeats reuse the calibrated count.
  int64_t steps = c.steps;
  double seconds = 0;
  while (true) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i)
      run_step();
    lamp::synchronize(device);
    seconds = seconds_since(start);
    if (seconds >= c.min_seconds || steps >= kMaxTimedSteps) {
      break;
    }
    // Capped before the run, and as a double: the count --min-seconds asks
    // for can exceed int64.
    const double wanted =
        steps * 1.2 * c.min_seconds / std::max(seconds, 1e-6) + 1;
    steps = wanted >= static_cast<double>(kMaxTimedSteps)
                ? kMaxTimedSteps
                : static_cast<int64_t>(wanted);
  }
  std::vector<double> rates = {steps * c.batch_size / seconds};
  for (int64_t r = 1; r < c.repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i)
      run_step();
    lamp::synchronize(device);
    rates.push_back(steps * c.batch_size / seconds_since(start));
  }
  // The median repeat (the lower middle one of an even count).
  auto sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  const double images_per_second = sorted[(sorted.size() - 1) / 2];
  result["steps"] = steps;
  result["seconds"] = steps * c.batch_size / images_per_second;
  result["images_per_second"] = images_per_second;
  result["repeats_images_per_second"] = rates;
  result["seconds_per_epoch"] = epoch_images / images_per_second;
  result["peak_memory_bytes"] =
      device.is_cuda() ? std::max(warmup_peak, lamp::peak_device_memory(device))
                       : lamp::peak_host_memory();
  if (device.is_cuda()) {
    result["steady_peak_bytes"] =
        lamp::peak_device_memory(device) - allocated_before;
    result["reserved_bytes"] =
        lamp::reserved_device_memory(device) - reserved_before;
  } else {
    result["steady_peak_bytes"] = nullptr;
    result["reserved_bytes"] = nullptr;
  }
  record_health(result, *module, *step, last, steps_run);
  result["tflops"] = images_per_second *
                     (gpt ? lamp::models::gpt_training_flops(gpt_options(c))
                          : static_cast<double>(lamp::models::training_flops(
                                c.model, channels, side, side))) /
                     1e12;
  if (gpt) {
    result["tokens_per_second"] =
        images_per_second * static_cast<double>(c.context);
  }
  // Model FLOPs utilisation: the model's FLOP/s over the device's dense peak
  // for the precision (lamp::peak_flops(), or --peak-tflops); null where
  // neither knows it.
  const double peak =
      c.peak_tflops > 0
          ? c.peak_tflops * 1e12
          : lamp::peak_flops(lamp::device_name(device),
                             lamp::parse_precision(precision_name));
  result["peak_tflops"] =
      peak > 0 ? nlohmann::json(peak / 1e12) : nlohmann::json(nullptr);
  result["mfu"] =
      peak > 0 ? nlohmann::json(result["tflops"].get<double>() * 1e12 / peak)
               : nlohmann::json(nullptr);
  result["skipped_steps"] = step->scaler().steps_skipped();
  result["optimizer"] = gpt ? std::string("adamw") : c.optimizer;
  result["cuda_graph"] = c.cuda_graph;
  // Captures: one per input shape; more means something baked into the
  // graph changed between steps and forced a re-capture.
  result["graph_captures"] = step->cuda_graph_captures();
  result["graph_pool_reserved_bytes"] = step->cuda_graph_pool_reserved_bytes();
  if (const auto* amp =
          dynamic_cast<const lamp::optim::AmpStep*>(&step->optimizer())) {
    result["sync_free_step"] = amp->skips_on_device();
  }
  if (!trace_path.empty()) {
    result["profile"] =
        profile(c, precision_name, device, run_step, images.sizes().vec(),
                c.batch_size / images_per_second, trace_path);
  }
  if (c.report_precision) {
    // One more training step, observed: which dtype each conv/matmul ran in.
    const auto ops = lamp::op_precision_report([&] { run_step(); });
    for (const auto& op : ops.calls) {
      result["op_dtypes"][op.first] = op.second;
    }
    std::cout << "precision report, " << c.model << " in " << precision_name
              << ":\n"
              << lamp::precision_report(*module).to_string()
              << "ops of one training step:\n"
              << ops.to_string();
  }
  return result;
}

std::string today() {
  char text[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(text, sizeof(text), "%Y-%m-%d", std::gmtime(&now));
  return text;
}

// The synthetic batch (FP32 images or token ids, and its labels) must fit
// in the device's memory: a --batch-size that cannot is refused with the
// largest that could, before anything is built.
void check_batch_fits(const Config& c, const torch::Device& device) {
  const bool cnn = c.model == "cnn";
  const uint64_t per_example = is_gpt(c)
                                   ? 2 * 8 * static_cast<uint64_t>(c.context)
                                   : (cnn ? 28 * 28 : 3 * 32 * 32) * 4 + 8;
  const auto batch = static_cast<uint64_t>(c.batch_size);
  const uint64_t memory = lamp::device_memory_bytes(device);
  if (memory == 0 || batch <= memory / per_example) {
    return;
  }
  const uint64_t most = std::numeric_limits<uint64_t>::max();
  const uint64_t bytes =
      batch > most / per_example ? most : batch * per_example;
  lamp::check_fits_in_memory(
      bytes, device,
      "--batch-size " + std::to_string(c.batch_size) + ": one batch of " +
          (is_gpt(c) ? "sequences and their next tokens"
                     : "FP32 images and their labels"),
      "use --batch-size " + std::to_string(memory / per_example) +
          " or less (smaller still, for the activations)");
}

int run(const Config& c) {
  TORCH_CHECK(!(is_gpt(c) && c.channels_last),
              "--channels-last is for the image models; a GPT's inputs are "
              "token ids. Leave it out with --model gpt.");
  std::optional<lamp::nn::SdpaBackendGuard> attention;
  if (c.attention != "default") {
    attention.emplace(std::vector<lamp::nn::SdpaBackend>{
        lamp::nn::parse_sdpa_backend(c.attention)});
  }
  if (c.threads > 0) {
    lamp_examples::use_threads(c.threads);
  }
  const auto device = lamp_examples::resolve_device(c.device);
  check_batch_fits(c, device);
  lamp::set_cudnn_benchmark(c.cudnn_benchmark);
  // As lamp's programs: freed host memory serves the next step.
  const std::string host_memory =
      c.keep_host_memory == "on" ? lamp::to_string(lamp::keep_host_memory())
                                 : "off";
  nlohmann::json out = {{"tool", "lamp"},
                        {"torch_version", TORCH_VERSION},
                        {"libtorch", lamp::libtorch_version()},
                        {"device", device.str()},
                        {"device_name", lamp::device_name(device)},
                        {"date", today()},
                        {"threads", at::get_num_threads()},
                        {"host_memory", host_memory},
                        {"results", nlohmann::json::array()}};
  if (c.matmul_peak) {
    out["matmul_tflops_bf16"] = matmul_tflops(device, torch::kBFloat16);
    out["matmul_tflops_fp32"] = matmul_tflops(device, torch::kFloat);
  }
  const auto precisions = split(c.precisions);
  for (size_t i = 0; i < precisions.size(); ++i) {
    lamp::parse_precision(precisions[i]); // a clear error for a bad name
    TORCH_CHECK(std::find(precisions.begin(), precisions.begin() + i,
                          precisions[i]) == precisions.begin() + i,
                "--precision names ", precisions[i],
                " twice; give each mode once.");
  }
  // The results file, checked before anything runs: a device such as
  // /dev/full, a missing folder or a full disk fails now, not after the
  // measurements.
  if (!c.json.empty()) {
    lamp::check_writable_path(c.json, "--json");
  }
  // One trace per requested precision (named by the name given, so that
  // "auto" and the mode it resolves to are two files), each path checked
  // before anything runs.
  std::map<std::string, std::string> trace_paths;
  for (const auto& requested : precisions) {
    if (c.profile.empty()) {
      break;
    }
    trace_paths[requested] =
        lamp_bench::trace_path_for(c.profile, requested, precisions.size() > 1);
    TORCH_CHECK(c.json.empty() ||
                    !lamp_bench::same_file(trace_paths[requested], c.json),
                "--profile and --json name the same file (",
                trace_paths[requested],
                "): the trace would overwrite the results or they the "
                "trace; give two paths.");
    lamp_bench::check_trace_path(trace_paths[requested]);
  }
  for (const auto& requested : precisions) {
    // "auto" is measured as the mode it resolves to on this device.
    const auto precision = lamp::to_string(
        lamp::resolve_precision(lamp::parse_precision(requested), device));
    auto result = run_one(c, precision, device, trace_paths[requested]);
    if (result["skipped"].is_null()) {
      // A GPT's rate in tokens/s, the image models' in images/s.
      const bool tokens = is_gpt(c);
      std::printf(
          "%-9s %-9s batch %4lld  %9.1f %s  %8.2f s/epoch  %7.3f TFLOP/s  peak %.0f MiB\n",
          c.model.c_str(), precision.c_str(),
          static_cast<long long>(c.batch_size),
          result[tokens ? "tokens_per_second" : "images_per_second"]
              .get<double>(),
          tokens ? "tok/s" : "img/s", result["seconds_per_epoch"].get<double>(),
          result["tflops"].get<double>(),
          result["peak_memory_bytes"].get<int64_t>() / 1048576.0);
    } else {
      std::printf("%-9s %-9s skipped: %s\n", c.model.c_str(), precision.c_str(),
                  result["skipped"].get<std::string>().c_str());
    }
    if (result.contains("profile")) {
      std::printf("%s", result["profile"]["text"].get<std::string>().c_str());
      result["profile"].erase("text");
    }
    std::fflush(stdout);
    out["results"].push_back(result);
  }
  if (!c.json.empty()) {
    // Checked writes, fsync and rename: a full disk is an error naming the
    // file, and an earlier results file survives it.
    lamp::write_file_atomically(c.json, out.dump(2) + "\n");
  }
  // A closed stdout (`lamp_bench | head -1`) fails the prints, not the run
  // (SIGPIPE is ignored in main): the results then live only in --json.
  if (std::ferror(stdout) != 0) {
    if (c.json.empty()) {
      std::fprintf(stderr,
                   "lamp_bench: error: the results could not be printed "
                   "(standard output was closed); give --json FILE to keep "
                   "them.\n");
      return 1;
    }
    std::fprintf(stderr,
                 "lamp_bench: standard output was closed; the results are in "
                 "%s.\n",
                 c.json.c_str());
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{
      "Training-step throughput of lamp's models in its precision modes",
      "lamp_bench"};
  auto models = lamp::models::model_names();
  models.push_back("gpt");
  app.add_option("--model", c.model,
                 "cnn, resnet18..resnet152, or gpt (lamp::models::GPT, "
                 "AdamW recipe, shape by --gpt-*, --context)")
      ->check(CLI::IsMember(models))
      ->capture_default_str();
  app.add_option("--batch-size", c.batch_size)
      ->check(lamp_examples::integer_at_least(1))
      ->capture_default_str();
  app.add_option(
         "--precision", c.precisions,
         "comma-separated: fp32,tf32,amp,amp-bf16,half,bf16,auto (the device's choice)")
      ->check(CLI::Validator(
          [](std::string& list) -> std::string {
            const auto& valid = lamp_examples::precision_flag_values();
            for (const auto& name : split(list)) {
              if (std::find(valid.begin(), valid.end(), name) == valid.end()) {
                return name + " not in {" + CLI::detail::join(valid, ",") + "}";
              }
            }
            return split(list).empty() ? "no precision given" : "";
          },
          ""))
      ->capture_default_str();
  auto* shape_flags = app.add_option_group("GPT shape");
  shape_flags->add_option("--gpt-layers", c.gpt_layers, "--model gpt: blocks")
      ->check(lamp_examples::integer_in(1, 1000))
      ->capture_default_str();
  shape_flags
      ->add_option("--gpt-heads", c.gpt_heads,
                   "--model gpt: attention heads (dividing --gpt-width)")
      ->check(lamp_examples::integer_in(1, 1000))
      ->capture_default_str();
  shape_flags
      ->add_option("--gpt-width", c.gpt_width, "--model gpt: embedding width")
      ->check(lamp_examples::integer_in(1, 1 << 16))
      ->capture_default_str();
  shape_flags
      ->add_option("--gpt-vocab", c.gpt_vocab,
                   "--model gpt: vocabulary (random token ids below it)")
      ->check(lamp_examples::integer_in(1, 1 << 24))
      ->capture_default_str();
  auto* shape =
      app.add_option(
             "--gpt-shape", c.gpt_shape,
             "--model gpt: a named shape instead of the --gpt-* flags "
             "and --context: small (6 layers, 6 heads, width 384, "
             "vocab 256, context 256; the defaults) or gpt2-124m (12, "
             "12, 768, 50304 = GPT-2's 50257 padded to 64, context 1024)")
          ->check(CLI::IsMember({"small", "gpt2-124m"}));
  app.add_flag("--fused-head-loss", c.fused_head_loss,
               "--model gpt: the head and cross-entropy fused, a chunk of "
               "positions at a time (GPTOptions::fused_head_loss)");
  app.add_flag("--fp8-fused-casts", c.fp8_fused_casts,
               "--precision fp8: each FP8 cast in one pass over its tensor "
               "(Float8Recipe::fused_casts)");
  app.add_flag("--fused-add-norm", c.fused_add_norm,
               "--model gpt: each residual add with the norm after it, one "
               "operation (GPTOptions::fused_add_norm)");
  app.add_flag("--fused-mlp", c.fused_mlp,
               "--model gpt: each MLP's biases and GELU in its products' "
               "epilogues (GPTOptions::fused_mlp; fused on a GPU with "
               "--gpt-gelu tanh)");
  app.add_flag("--fused-weight-cast", c.fused_weight_cast,
               "--model gpt: under autocast, the blocks' Linear weights cast "
               "in one multi-tensor operation a step, their gradients back "
               "in one (GPTOptions::fused_weight_cast)");
  app.add_flag("--fused-bias-grad", c.fused_bias_grad,
               "--model gpt: each Linear bias's gradient summed in its "
               "weight-gradient product (GPTOptions::fused_bias_grad; "
               "cuBLASLt's epilogue on a GPU)");
  app.add_option("--gpt-gelu", c.gpt_gelu,
                 "--model gpt: the MLP's GELU, exact (nanoGPT's) or tanh "
                 "(GPT-2's)")
      ->check(CLI::IsMember({"exact", "tanh"}))
      ->capture_default_str();
  app.add_option("--peak-tflops", c.peak_tflops,
                 "the device's dense peak TFLOP/s for the precision, for the "
                 "mfu column where lamp::peak_flops() has no entry (a CPU); "
                 "0: the table's")
      ->check(lamp_examples::non_negative_real())
      ->capture_default_str();
  shape_flags
      ->add_option("--context", c.context,
                   "--model gpt: tokens per sequence (--batch-size sequences)")
      ->check(lamp_examples::integer_in(1, 1 << 20))
      ->capture_default_str();
  shape_flags->excludes(shape);
  app.add_option("--attention", c.attention,
                 "--model gpt: the one attention kernel allowed (flash, "
                 "memory-efficient, cudnn, math), or default for "
                 "LibTorch's choice")
      ->check(CLI::IsMember(
          {"default", "flash", "memory-efficient", "cudnn", "math"}))
      ->capture_default_str();
  app.add_option("--keep-host-memory", c.keep_host_memory,
                 "lamp::keep_host_memory() before the run, as lamp's "
                 "programs do (off: glibc's malloc defaults)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--threads", c.threads,
                 "intra-op CPU threads (0: LibTorch's default, as the Python "
                 "peers run; the training programs default to the cores)")
      ->check(lamp_examples::integer_in(0, 4096))
      ->capture_default_str();
  app.add_flag("--channels-last", c.channels_last);
  app.add_flag("--cudnn-benchmark", c.cudnn_benchmark);
  app.add_option("--device", c.device,
                 "cpu, cuda or cuda:N (default: cuda when available)");
  app.add_option("--warmup", c.warmup,
                 "untimed steps (with --cuda-graph at least the graph's eager "
                 "steps and its capture: 4)")
      ->check(lamp_examples::integer_at_least(0))
      ->capture_default_str();
  app.add_option("--steps", c.steps, "timed steps")
      ->check(lamp_examples::integer_at_least(1))
      ->capture_default_str();
  app.add_option("--min-seconds", c.min_seconds,
                 "time at least this long, 0..3600: more steps than --steps "
                 "when they are faster, up to 100000")
      ->check(lamp_examples::real_in(0, kMaxMinSeconds))
      ->capture_default_str();
  app.add_option(
         "--repeats", c.repeats,
         "timed runs of the calibrated step count after one warm-up; the median is reported, every run in the JSON")
      ->check(lamp_examples::integer_in(1, 100))
      ->capture_default_str();
  app.add_option("--epoch-images", c.epoch_images,
                 "images per epoch, 0 = 50000 (cnn: 60000)")
      ->check(lamp_examples::integer_at_least(0))
      ->capture_default_str();
  app.add_option("--json", c.json, "write the results here")
      ->check(lamp_examples::non_empty_path("the results file"));
  app.add_flag("--matmul-peak", c.matmul_peak,
               "also measure a large matmul's TFLOP/s");
  app.add_option("--optimizer", c.optimizer, "sgd | adam | adamw")
      ->check(CLI::IsMember(lamp::optim::optimizer_names()))
      ->capture_default_str();
  app.add_option(
         "--optimizer-impl", c.optimizer_impl,
         "auto | fused | foreach | per-tensor (lamp::optim::Implementation)")
      ->check(CLI::IsMember(lamp::optim::implementation_table().names()))
      ->capture_default_str();
  app.add_flag(
      "--cuda-graph", c.cuda_graph,
      "replay the step as a CUDA graph (TrainStepOptions::cuda_graph)");
  app.add_option(
         "--profile", c.profile,
         "after the timed steps, profile --profile-steps more with LibTorch's profiler: write their Chrome trace to this file (with several precisions, one file each, named FILE-PRECISION.EXT) and print the time per kernel class")
      ->check(lamp_examples::non_empty_path("the trace file"));
  app.add_option("--profile-steps", c.profile_steps,
                 "steps to profile with --profile, 1..1000")
      ->check(lamp_examples::integer_in(1, 1000))
      ->capture_default_str();
  app.add_option(
         "--fused-bn", c.fused_bn,
         "BatchNorm with its ReLU (and residual add) as one cuDNN kernel where it applies (CUDA, --channels-last, half/bf16 activations): on | off | conv (opt-in: the ResNet blocks' BatchNorms folded into their convolutions, cuDNN's graph API)")
      ->check(CLI::IsMember({"on", "off", "conv"}))
      ->capture_default_str();
  app.add_flag(
      "--report-precision", c.report_precision,
      "print each model's parameter/buffer dtypes and the dtypes its convolutions/matmuls ran in during one training step");
  lamp_examples::add_version_flag(app, "lamp_bench");
  lamp_examples::SettingsSources sources; // the flags --config set
  const int status = lamp_examples::parse_command_line(app, "lamp_bench", argc,
                                                       argv, {}, &sources);
  if (status >= 0) {
    return status;
  }
  if (c.gpt_shape == "gpt2-124m") {
    c.gpt_layers = 12;
    c.gpt_heads = 12;
    c.gpt_width = 768;
    c.gpt_vocab = 50304;
    c.context = 1024;
  }
  // A closed pipe fails the next print instead of killing the run before
  // --json is written; a write beyond `ulimit -f` fails with EFBIG.
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGXFSZ, SIG_IGN);
  return lamp_examples::guarded_main(
      "lamp_bench", [&] { return run(c); }, sources);
}
