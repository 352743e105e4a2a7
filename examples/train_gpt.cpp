// Trains a byte-level GPT (nanoGPT's layout) on a text in any of lamp's
// precision modes, then prints a sample of its text:
//
//   train_gpt --precision amp-bf16 --layers 4 --heads 4 --width 128
//             --context 64 --steps 500 --eval-every 100
//   train_gpt --data my_text.txt --precision auto --device cuda
#include <lamp/lamp.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/classifier_program.h"
#include "common/cli.h"
#include "common/stop_signals.h"

namespace {

// train_gpt's own flags: the model's shape and the sample's.
struct GptFlags {
  lamp::models::GPTOptions model;
  int64_t sample_tokens = 300;
  double temperature = 0.8;
  int64_t top_k = 0;
  std::string prompt = "\n";
};

void add_gpt_options(CLI::App& app, GptFlags& f) {
  const auto positive = CLI::Range(int64_t{1}, int64_t{1} << 20);
  app.add_option("--layers", f.model.layers(), "transformer blocks")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--heads", f.model.heads(),
                 "attention heads per block (dividing --width)")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--width", f.model.width(), "embedding width")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--context", f.model.context(),
                 "tokens (bytes) per training sequence, and the longest the "
                 "model attends over")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--dropout", f.model.dropout(),
                 "dropout in training, in [0, 1)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.999999));
  app.add_option("--sample-tokens", f.sample_tokens,
                 "bytes of text to generate after training (0: none; "
                 "Ctrl-C stops it)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--temperature", f.temperature,
                 "the sample's temperature, in [0.001, 100]: below 1 surer, "
                 "above 1 wilder")
      ->capture_default_str()
      ->check(lamp_examples::real_in(1e-3, 100.0));
  app.add_option("--top-k", f.top_k,
                 "sample among the k most likely bytes only (0: all)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{256}));
  app.add_option("--prompt", f.prompt,
                 "the text the sample continues (not empty)")
      ->capture_default_str();
}

// The settings of train_gpt's own that shape the run, by flag: stored in
// the checkpoint, so that --resume alone rebuilds the same model.
std::vector<lamp::training::ProgramSetting> gpt_settings(const GptFlags& f) {
  const auto& m = f.model;
  return {{"--layers", std::to_string(m.layers())},
          {"--heads", std::to_string(m.heads())},
          {"--width", std::to_string(m.width())},
          {"--context", std::to_string(m.context())},
          {"--dropout", lamp_examples::exact_number(m.dropout())}};
}

// The sample: --sample-tokens bytes after --prompt, drawn with --seed, shown
// as valid UTF-8 with other bytes escaped (lamp::data::escape_text); a stop
// signal ends it at the next byte.
void print_sample(const lamp_examples::ProgramConfig& config,
                  const GptFlags& flags, const lamp_examples::BuiltModel& model,
                  lamp::training::Trainer& trainer) {
  if (flags.sample_tokens == 0) {
    return;
  }
  const auto& prompt = flags.prompt;
  // The prompt's bytes are its token ids.
  const auto ids =
      torch::from_blob(const_cast<char*>(prompt.data()),
                       {static_cast<int64_t>(prompt.size())}, torch::kUInt8)
          .to(torch::kLong);
  auto& step = trainer.train_step();
  const auto text = lamp::models::generate(
      *model.module,
      [&](const torch::Tensor& x) { return step.forward(model.forward, x); },
      ids, flags.model.context(),
      lamp::models::GenerateOptions()
          .tokens(flags.sample_tokens)
          .temperature(flags.temperature)
          .top_k(flags.top_k)
          .seed(config.seed)
          .stop_requested([] { return lamp_examples::stop_signal() != 0; }));
  std::string out;
  const auto* p = text.data_ptr<int64_t>();
  for (int64_t i = 0; i < text.size(0); ++i) {
    out.push_back(static_cast<char>(p[i]));
  }
  const int64_t made = text.size(0) - ids.size(0);
  lamp_examples::print_out(
      "train_gpt: sample (--seed %llu, --temperature %g, --top-k %lld%s):\n%s\n",
      static_cast<unsigned long long>(config.seed), flags.temperature,
      static_cast<long long>(flags.top_k),
      made < flags.sample_tokens
          ? (", stopped by " +
             std::string(
                 lamp_examples::signal_name(lamp_examples::stop_signal())) +
             " after " + std::to_string(made) + " of " +
             std::to_string(flags.sample_tokens) + " bytes")
                .c_str()
          : "",
      lamp::data::escape_text(out).c_str());
}

} // namespace

int main(int argc, char** argv) {
  lamp_examples::ProgramConfig config;
  config.model = "gpt";
  config.models = {"gpt"};
  // nanoGPT's character-level recipe (config/train_shakespeare_char.py):
  // 5000 steps, warm-up 100 then cosine to lr/10, evaluations of 200
  // batches every 250 steps, AdamW betas (0.9, 0.99).
  config.steps = 5000;
  config.schedule = "warmup-cosine";
  config.warmup_steps = 100;
  config.min_lr = 1e-4;
  config.eval_every = 250;
  config.limit_eval_batches = 200;
  config.checkpoint_every = 250;
  config.batch_size = 64;
  config.eval_batch_size = 64;
  config.optimizer = "adamw";
  config.lr = 1e-3;
  config.beta2 = 0.99;
  config.weight_decay = 0.1;
  config.no_bias_decay = true;
  config.max_grad_norm = 1.0;
  config.data = lamp::data::default_text_path();
  config.data_may_be_file = true;
  config.examples = "sequences";
  GptFlags flags;
  config.program_settings = [&flags] { return gpt_settings(flags); };
  return lamp_examples::program_main(
      argc, argv, "train_gpt",
      "Train a byte-level GPT on a text (default: Debian's fortunes) with "
      "lamp, then print a sample of its text",
      config,
      [&] {
        TORCH_CHECK(
            !config.data.empty(),
            "no --data given and Debian's fortunes are not installed "
            "(apt-get install fortunes); give --data FILE or FOLDER of text.");
        TORCH_CHECK(!config.channels_last,
                    "--channels-last is for images; train_gpt's inputs are "
                    "token ids. Leave it out.");
        TORCH_CHECK(!flags.prompt.empty(),
                    "--prompt is empty; give at least one character.");
        config.sequence_length = flags.model.context();
        config.flops_per_example =
            lamp::models::gpt_training_flops(flags.model);
        const auto name = flags.model.name();
        // --resume took the stored shape flags (gpt_settings); a checkpoint
        // of a model named otherwise is not train_gpt's.
        TORCH_CHECK(config.resume.empty() || config.model == "gpt" ||
                        config.model == name,
                    "--resume ", config.resume, " holds a '", config.model,
                    "' model, not a GPT of train_gpt; resume it with the "
                    "program that wrote it.");
        config.model = "gpt";
        auto text =
            lamp::data::read_text_windows(config.data, flags.model.context());
        lamp_examples::RunSpec spec;
        spec.train = std::move(text.train);
        spec.test = std::move(text.validation);
        spec.data_files = {config.data};
        spec.model_name = name;
        spec.parameters = lamp::models::gpt_parameter_count(flags.model);
        spec.size_flags = "--width, --layers or --context";
        spec.task = lamp::training::Task::language_model();
        const auto options = flags.model;
        spec.make_model = [options](const std::string&, const std::string&) {
          return lamp::models::make_gpt(options);
        };
        spec.after_training = [&](const lamp_examples::BuiltModel& model,
                                  lamp::training::Trainer& trainer) {
          print_sample(config, flags, model, trainer);
        };
        return spec;
      },
      [&](CLI::App& app) {
        add_gpt_options(app, flags);
        app.add_option(
               "--peak-tflops", config.peak_tflops,
               "the device's peak TFLOP/s for the precision, for MFU (model "
               "FLOPs utilisation) in the epoch line and log: known for H100, "
               "H200 and A100 (their datasheets' dense peaks), needed for a "
               "CPU or another GPU (default 0: the table's, or no MFU)")
            ->check(lamp_examples::non_negative_real());
      });
}
