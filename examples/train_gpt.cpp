// Trains a byte-level GPT (nanoGPT's layout) on a text in any of lamp's
// precision modes, then prints a sample of its text:
//
//   train_gpt --precision amp-bf16 --layers 4 --heads 4 --width 128
//             --context 64 --steps 500 --eval-every 100
//   train_gpt --data my_text.txt --precision auto --device cuda
//   train_gpt --init-from gpt2_state_dict.pt --heads 12 --gelu tanh
//             --context 256 --export-state-dict tuned.pt
#include <lamp/lamp.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "common/classifier_program.h"
#include "common/cli.h"
#include "common/stop_signals.h"

namespace {

// train_gpt's own flags: the model's shape and the sample's.
struct GptFlags {
  lamp::models::GPTOptions model;
  lamp::models::GPTLayout export_layout = lamp::models::GPTLayout::kNanoGPT;
  const CLI::App* app = nullptr; // which flags were given
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
  app.add_option("--vocab-size", f.model.vocab_size(),
                 "token ids the model embeds and predicts (256: bytes; "
                 "--init-from a Python state dict: its wte's rows)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 31));
  app.add_option("--bias", f.model.bias(),
                 "biases in the Linears and LayerNorms (false: none, as "
                 "nanoGPT's bias=False)")
      ->capture_default_str();
  app.add_option("--norm", f.model.norm(), "layernorm or rmsnorm")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, lamp::models::GPTNorm>{
              {"layernorm", lamp::models::GPTNorm::kLayerNorm},
              {"rmsnorm", lamp::models::GPTNorm::kRMSNorm}},
          CLI::ignore_case))
      ->default_str("layernorm");
  app.add_option("--gelu", f.model.gelu(),
                 "the MLP's GELU: exact (erf, nanoGPT's) or tanh (GPT-2's "
                 "own weights were trained with it)")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, lamp::models::GPTGelu>{
              {"exact", lamp::models::GPTGelu::kExact},
              {"tanh", lamp::models::GPTGelu::kTanh}},
          CLI::ignore_case))
      ->default_str("exact");
  app.add_option("--export-layout", f.export_layout,
                 "the names of --export-state-dict's file: nanogpt "
                 "(nanoGPT's model.py loads it strictly), huggingface "
                 "(GPT2LMHeadModel's, Conv1D weights transposed) or lamp "
                 "(the module's own)")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, lamp::models::GPTLayout>{
              {"nanogpt", lamp::models::GPTLayout::kNanoGPT},
              {"huggingface", lamp::models::GPTLayout::kHuggingFace},
              {"lamp", lamp::models::GPTLayout::kLamp}},
          CLI::ignore_case))
      ->default_str("nanogpt");
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
                 "sample among the k most likely tokens only (0: all)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 31));
  app.add_option("--prompt", f.prompt,
                 "the text the sample continues (not empty)")
      ->capture_default_str();
}

// The settings of train_gpt's own that shape the run, by flag: stored in
// the checkpoint, so that --resume alone rebuilds the same model.
std::vector<lamp::training::ProgramSetting> gpt_settings(const GptFlags& f) {
  const auto& m = f.model;
  return {
      {"--layers", std::to_string(m.layers())},
      {"--heads", std::to_string(m.heads())},
      {"--width", std::to_string(m.width())},
      {"--context", std::to_string(m.context())},
      {"--dropout", lamp_examples::exact_number(m.dropout())},
      {"--vocab-size", std::to_string(m.vocab_size())},
      {"--bias", m.bias() ? "true" : "false"},
      {"--norm",
       m.norm() == lamp::models::GPTNorm::kRMSNorm ? "rmsnorm" : "layernorm"},
      {"--gelu", m.gelu() == lamp::models::GPTGelu::kTanh ? "tanh" : "exact"}};
}

// --init-from a Python file (nanoGPT's or GPT-2's weights): the model takes
// the file's shape, and a shape flag given with another value is refused.
// Returns the weights, to load once the model is built.
lamp::models::GPTWeights python_weights(lamp_examples::ProgramConfig& config,
                                        GptFlags& flags) {
  auto weights = lamp::models::read_gpt_weights(config.init_from);
  const auto& file = weights.options;
  auto& model = flags.model;
  const auto given = [&](const char* flag) {
    return flags.app->get_option(flag)->count() > 0;
  };
  std::string differences;
  const auto take = [&](const char* flag, int64_t there, int64_t& here,
                        bool may_be_smaller) {
    if (given(flag) && here != there && !(may_be_smaller && here < there)) {
      differences += std::string(differences.empty() ? "" : "; ") + flag + " " +
                     std::to_string(here) + " here, " + std::to_string(there) +
                     " there";
    }
    if (!given(flag)) {
      here = there;
    }
  };
  take("--layers", file.layers(), model.layers(), false);
  take("--width", file.width(), model.width(), false);
  take("--vocab-size", file.vocab_size(), model.vocab_size(), false);
  // A shorter context takes the position embedding's first rows.
  take("--context", file.context(), model.context(), true);
  if (weights.heads_known) {
    take("--heads", file.heads(), model.heads(), false);
  } else {
    TORCH_CHECK(given("--heads"), "--init-from ", config.init_from,
                " is a state dict, which does not record the attention "
                "heads of its ",
                file.layers(), " layers of width ", file.width(),
                "; give --heads (GPT-2 124M: 12; nanoGPT's ckpt.pt records "
                "them).");
  }
  if (given("--bias") && model.bias() != file.bias()) {
    differences += std::string(differences.empty() ? "" : "; ") + "--bias " +
                   (model.bias() ? "true" : "false") + " here, " +
                   (file.bias() ? "true" : "false") + " there";
  }
  model.bias(file.bias());
  TORCH_CHECK(
      differences.empty(), "--init-from ", config.init_from,
      " holds a GPT of another shape than the flags give: ", differences,
      ". Leave these flags out: the model takes the file's shape (a "
      "--context may be shorter).");
  return weights;
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
    // Ids beyond the bytes (a model of a larger --vocab-size, GPT-2's) have
    // no text without their tokenizer: shown as <id>.
    if (p[i] < 256) {
      out.push_back(static_cast<char>(p[i]));
    } else {
      out += "<" + std::to_string(p[i]) + ">";
    }
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
        // --resume took the stored shape flags (gpt_settings); a checkpoint
        // of a model named otherwise is not train_gpt's.
        TORCH_CHECK(config.resume.empty() || config.model == "gpt" ||
                        config.model == flags.model.name(),
                    "--resume ", config.resume, " holds a '", config.model,
                    "' model, not a GPT of train_gpt; resume it with the "
                    "program that wrote it.");
        config.model = "gpt";
        // --init-from a Python file: its shape now, its weights once the
        // model is built; the trainer reads lamp's checkpoints only.
        auto python = std::make_shared<lamp::models::GPTWeights>();
        if (!config.init_from.empty() &&
            lamp::is_torch_save_file(config.init_from)) {
          TORCH_CHECK(config.resume.empty(),
                      "give --resume or --init-from, not both.");
          *python = python_weights(config, flags);
          config.init_from_python = config.init_from;
          config.init_from.clear();
        }
        const auto name = flags.model.name();
        TORCH_CHECK(
            flags.model.vocab_size() >= 256, "--vocab-size ",
            flags.model.vocab_size(),
            " is smaller than the text's 256 byte values; give at least "
            "256.");
        config.sequence_length = flags.model.context();
        config.flops_per_example =
            lamp::models::gpt_training_flops(flags.model);
        auto text =
            lamp::data::read_text_windows(config.data, flags.model.context());
        lamp_examples::RunSpec spec;
        spec.train = std::move(text.train);
        spec.test = std::move(text.validation);
        spec.data_files = {config.data};
        if (!config.init_from_python.empty()) {
          spec.data_files.push_back(config.init_from_python);
        }
        spec.model_name = name;
        spec.parameters = lamp::models::gpt_parameter_count(flags.model);
        spec.size_flags = "--width, --layers or --context";
        spec.task = lamp::training::Task::language_model();
        const auto options = flags.model;
        spec.make_model = [options, python](const std::string&,
                                            const std::string&) {
          auto built = lamp::models::make_gpt(options);
          if (!python->path.empty()) {
            lamp::models::load_gpt_weights(
                *std::dynamic_pointer_cast<lamp::models::GPTImpl>(built.module),
                *python);
          }
          return built;
        };
        const auto layout = flags.export_layout;
        spec.export_weights =
            [layout](const torch::nn::Module& module, const std::string& path,
                     const lamp::models::StateDictOptions& o) {
              lamp::models::export_gpt_state_dict(module, path, layout, o);
            };
        spec.after_training = [&](const lamp_examples::BuiltModel& model,
                                  lamp::training::Trainer& trainer) {
          print_sample(config, flags, model, trainer);
        };
        return spec;
      },
      [&](CLI::App& app) {
        add_gpt_options(app, flags);
        flags.app = &app;
        app.add_option(
               "--peak-tflops", config.peak_tflops,
               "the device's peak TFLOP/s for the precision, for MFU (model "
               "FLOPs utilisation) in the epoch line and log: known for H100, "
               "H200 and A100 (their datasheets' dense peaks), needed for a "
               "CPU or another GPU (default 0: the table's, or no MFU)")
            ->check(lamp_examples::non_negative_real());
      });
}
