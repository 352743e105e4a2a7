#include "nanogpt_config.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cli.h"
#include "output_paths.h"

namespace lamp_examples {
namespace {

// train.py's globals and their defaults (nanoGPT's train.py: GPT-2 124M on
// OpenWebText), as the reader writes values. device and dtype have none
// here: train.py's are "cuda" and the GPU's best, which train_gpt's own
// defaults (the GPU where there is one; --precision auto) stand for.
const std::vector<std::pair<std::string, std::string>>& train_defaults() {
  static const std::vector<std::pair<std::string, std::string>> defaults = {
      {"out_dir", "out"},
      {"eval_interval", "2000"},
      {"log_interval", "1"},
      {"eval_iters", "200"},
      {"eval_only", "false"},
      {"always_save_checkpoint", "true"},
      {"init_from", "scratch"},
      {"wandb_log", "false"},
      {"wandb_project", "owt"},
      {"wandb_run_name", "gpt2"},
      {"dataset", "openwebtext"},
      {"gradient_accumulation_steps", "40"},
      {"batch_size", "12"},
      {"block_size", "1024"},
      {"n_layer", "12"},
      {"n_head", "12"},
      {"n_embd", "768"},
      {"dropout", "0"},
      {"bias", "false"},
      {"learning_rate", "0.0006"},
      {"max_iters", "600000"},
      {"weight_decay", "0.1"},
      {"beta1", "0.9"},
      {"beta2", "0.95"},
      {"grad_clip", "1"},
      {"decay_lr", "true"},
      {"warmup_iters", "2000"},
      {"lr_decay_iters", "600000"},
      {"min_lr", "6e-05"},
      {"backend", "nccl"},
      {"device", ""},
      {"dtype", ""},
      {"compile", "true"},
  };
  return defaults;
}

// sample.py's own globals, set only where the file sets them.
const std::vector<std::pair<std::string, const char*>>& sample_flags() {
  static const std::vector<std::pair<std::string, const char*>> flags = {
      {"start", "--prompt"},
      {"num_samples", "--num-samples"},
      {"max_new_tokens", "--sample-tokens"},
      {"temperature", "--temperature"},
      {"top_k", "--top-k"},
      {"seed", "--seed"},
  };
  return flags;
}

// train.py's names as train_gpt's flags, for the hint of a --key=value
// override on the command line (sample.py's: sample_flags()).
const std::vector<std::pair<std::string, const char*>>& flag_of_name() {
  static const std::vector<std::pair<std::string, const char*>> flags = {
      {"n_layer", "--layers"},
      {"n_head", "--heads"},
      {"n_embd", "--width"},
      {"block_size", "--context"},
      {"dropout", "--dropout"},
      {"bias", "--bias"},
      {"batch_size", "--batch-size (and --eval-batch-size)"},
      {"learning_rate", "--lr"},
      {"weight_decay", "--weight-decay"},
      {"beta1", "--beta1"},
      {"beta2", "--beta2"},
      {"grad_clip", "--max-grad-norm"},
      {"min_lr", "--min-lr"},
      {"gradient_accumulation_steps", "--accumulation-steps"},
      {"max_iters",
       "--steps, counted in batches (max_iters x gradient_accumulation_steps)"},
      {"lr_decay_iters",
       "no flag: the schedule decays over the whole run, --steps"},
      {"warmup_iters", "--warmup-steps, counted in batches"},
      {"eval_interval", "--eval-every, counted in batches"},
      {"log_interval", "--log-every, counted in batches"},
      {"eval_iters", "--eval-batches"},
      {"eval_only", "--eval-only"},
      {"decay_lr", "--schedule (decay_lr=False: --schedule constant)"},
      {"dataset", "--data (dataset=NAME: --data data/NAME)"},
      {"out_dir", "--checkpoint (out_dir=DIR: --checkpoint DIR/lamp.pt)"},
      {"init_from",
       "--resume CHECKPOINT (init_from=resume), or --init-from FILE for "
       "GPT-2's weights"},
      {"dtype", "--precision"},
      {"device", "--device"},
      {"compile", "no flag: CUDA graphs stand for torch.compile"},
  };
  return flags;
}

// GPT-2's shapes by init_from's name, as nanoGPT's GPT.from_pretrained.
struct Gpt2Shape {
  const char* name;
  int layers, heads, width;
};
const Gpt2Shape kGpt2Shapes[] = {{"gpt2", 12, 12, 768},
                                 {"gpt2-medium", 24, 16, 1024},
                                 {"gpt2-large", 36, 20, 1280},
                                 {"gpt2-xl", 48, 25, 1600}};

[[noreturn]] void refuse(const std::string& message) {
  throw ConfigFileError(message);
}

// Paths through POSIX calls, not std::filesystem: a program linked with a
// torch wheel's LibTorch gets the wheel's older copy of it
// (pytorch/pytorch#133437), whose remove_all() crashes.

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// Python's os.path.join(a, b): b alone where it is absolute.
std::string join(const std::string& a, const std::string& b) {
  if (a.empty() || (!b.empty() && b[0] == '/')) {
    return b;
  }
  return a.back() == '/' ? a + b : a + "/" + b;
}

bool whole_number(const std::string& text, int64_t& value) {
  if (text.empty() ||
      text.find_first_not_of("0123456789") != std::string::npos ||
      text.size() > 18) {
    return false;
  }
  value = std::strtoll(text.c_str(), nullptr, 10);
  return true;
}

// The file's settings over train.py's defaults, and the flags they make.
class Translation {
 public:
  Translation(const ConfigFile& file, const GivenFlag& given)
      : file_(file), given_(given) {
    std::vector<std::string> names;
    for (const auto& [key, value] : train_defaults()) {
      names.push_back(key);
    }
    for (const auto& [key, flag] : sample_flags()) {
      names.push_back(key);
    }
    for (const auto& setting : file.settings) {
      bool known = false;
      for (const auto& name : names) {
        known = known || name == setting.key;
      }
      if (!known) {
        const auto nearest = nearest_name(names, setting.key);
        refuse(file.where(setting) + ": nanoGPT's train.py and sample.py " +
               "have no setting " + setting.key +
               (nearest.empty() ? "" : "; did you mean " + nearest + "?") +
               " (train_gpt refuses it rather than train without it)");
      }
    }
  }

  // Whether train.py and sample.py take `key` as a number.
  static bool numeric(const std::string& key) {
    static const char* const kNumbers[] = {
        "eval_interval",  "log_interval",
        "eval_iters",     "gradient_accumulation_steps",
        "batch_size",     "block_size",
        "n_layer",        "n_head",
        "n_embd",         "dropout",
        "learning_rate",  "max_iters",
        "weight_decay",   "beta1",
        "beta2",          "grad_clip",
        "warmup_iters",   "lr_decay_iters",
        "min_lr",         "num_samples",
        "max_new_tokens", "temperature",
        "top_k",          "seed"};
    for (const char* name : kNumbers) {
      if (key == name) {
        return true;
      }
    }
    return false;
  }

  const ConfigSetting* setting(const std::string& key) const {
    for (const auto& s : file_.settings) {
      if (s.key == key) {
        return &s;
      }
    }
    return nullptr;
  }
  bool set(const std::string& key) const { return setting(key) != nullptr; }
  // Whether the file sets `key` to None.
  bool none(const std::string& key) const {
    const auto* s = setting(key);
    return s != nullptr && s->none;
  }

  // The key's value: the file's (which must be a value, not an expression
  // left unevaluated), else train.py's default.
  std::string value(const std::string& key) const {
    if (const auto* s = setting(key)) {
      if (!s->evaluated || s->none) {
        refuse(file_.where(*s) + ": train_gpt reads numbers, strings, " +
               "True and False (and the numbers' arithmetic) here; write " +
               "the value itself.");
      }
      // A number in quotes: train.py would fail on it (a TypeError in its
      // arithmetic), where a flag would read it as the number.
      if (s->quoted && numeric(key)) {
        refuse(file_.where(*s) + ": " + key + " is a number in nanoGPT, " +
               "but this is a string; write it without quotes.");
      }
      return s->value;
    }
    for (const auto& [name, value] : train_defaults()) {
      if (name == key) {
        return value;
      }
    }
    return "";
  }

  // Where a key's value comes from.
  std::string source(const std::string& key) const {
    if (const auto* s = setting(key)) {
      return file_.where(*s);
    }
    auto shown = value(key);
    if (shown.find_first_not_of("0123456789.e-") != std::string::npos &&
        shown != "true" && shown != "false") {
      shown = "'" + shown + "'";
    } else if (shown == "true" || shown == "false") {
      shown = shown == "true" ? "True" : "False";
    }
    return "nanoGPT's train.py default (" + key + " = " + shown + ")";
  }

  int64_t count(const std::string& key, int64_t at_least) const {
    int64_t n = 0;
    if (!whole_number(value(key), n) || n < at_least) {
      refuse(source(key) + ": " + key + " must be a whole number of at " +
             "least " + std::to_string(at_least) + ".");
    }
    return n;
  }

  bool truth(const std::string& key) const {
    const auto v = value(key);
    if (v != "true" && v != "false") {
      refuse(source(key) + ": " + key + " must be True or False.");
    }
    return v == "true";
  }

  const std::string* given(const std::string& flag) const {
    return given_(flag);
  }
  // Whether the command line turns the switch `flag` on: given bare, or
  // with a value CLI11 reads as on (--sample-only=false is off).
  bool switched_on(const std::string& flag) const {
    const auto* typed = given(flag);
    if (typed == nullptr) {
      return false;
    }
    for (const char* off : {"false", "0", "off", "no", "disable"}) {
      if (*typed == off) {
        return false;
      }
    }
    return true;
  }

  void emit(const std::string& flag, const std::string& value,
            const std::string& source) {
    flags_.push_back({flag, value, source});
  }
  void emit_key(const std::string& flag, const std::string& key) {
    emit(flag, value(key), source(key));
  }

  std::vector<ConfigFlag> flags() const { return flags_; }

 private:
  const ConfigFile& file_;
  GivenFlag given_;
  std::vector<ConfigFlag> flags_;
};

// torchrun's WORLD_SIZE, or 1 (a bad value is refused later, by the ranks'
// own check).
int64_t world_size() {
  int64_t world = 1;
  const char* text = std::getenv("WORLD_SIZE");
  if (text == nullptr || !whole_number(text, world) || world < 1) {
    return 1;
  }
  return world;
}

// The batches of one of nanoGPT's iterations on each rank: the command
// line's --accumulation-steps, else gradient_accumulation_steps over the
// ranks (which train.py asserts it divides).
int64_t batches_per_iteration(Translation& t) {
  if (const auto* typed = t.given("--accumulation-steps")) {
    int64_t batches = 1;
    return whole_number(*typed, batches) && batches > 0 ? batches : 1;
  }
  const auto total = t.count("gradient_accumulation_steps", 1);
  const auto world = world_size();
  if (total % world != 0) {
    refuse(t.source("gradient_accumulation_steps") +
           ": does not divide among WORLD_SIZE=" + std::to_string(world) +
           " ranks (nanoGPT asserts it does): make it a multiple of the "
           "ranks, or give --accumulation-steps (per rank).");
  }
  const auto batches = total / world;
  t.emit("--accumulation-steps", std::to_string(batches),
         t.source("gradient_accumulation_steps") +
             (world > 1 ? " over WORLD_SIZE=" + std::to_string(world) + " ranks"
                        : ""));
  return batches;
}

// n of the file's iterations as batches (steps), refused where the count
// would not fit lamp's 64-bit step counts (Python's integers have no bound).
int64_t steps_of(const Translation& t, const std::string& key, int64_t n,
                 int64_t batches) {
  if (batches > 0 && n > std::numeric_limits<int64_t>::max() / batches) {
    refuse(t.source(key) + ": " + key + " = " + std::to_string(n) +
           " iterations of " + std::to_string(batches) +
           " batches each is more steps than lamp counts (2^63 - 1): give "
           "a smaller " +
           key + ".");
  }
  return n * batches;
}

// A count of iterations as batches.
void emit_iterations(Translation& t, const std::string& flag,
                     const std::string& key, int64_t batches,
                     int64_t at_least) {
  const auto n = t.count(key, at_least);
  t.emit(flag, std::to_string(steps_of(t, key, n, batches)),
         t.source(key) + (batches > 1 ? " times " + std::to_string(batches) +
                                            " batches an iteration"
                                      : ""));
}

// warmup_iters as --warmup-steps. A run the command line makes no longer
// than the file's warm-up (--steps 50 against warmup_iters = 100, a first
// try of a config), or a file whose max_iters is no longer than train.py's
// default warm-up, is not refused: the warm-up becomes the share of the run
// it is of max_iters in the file (2% for train_shakespeare_char.py), or
// train_gpt's own 2% where the file leaves it no share, as the cosine
// already fits the run's steps. A file that sets both itself, the warm-up
// no shorter than its max_iters, is refused by the program (nanoGPT would
// warm up through the whole run and never reach learning_rate).
void emit_warmup(Translation& t, int64_t batches,
                 std::vector<std::string>& notes) {
  const auto warmup = t.count("warmup_iters", 0);
  const auto file_iterations = t.count("max_iters", 1);
  const auto* typed_steps = t.given("--steps");
  // the run's steps, where known
  int64_t run = steps_of(t, "max_iters", file_iterations, batches);
  if (typed_steps != nullptr && !whole_number(*typed_steps, run)) {
    run = 0; // not a count: the parser refuses it
  }
  const bool run_known = t.given("--epochs") == nullptr && run > 0;
  const bool both_in_file = typed_steps == nullptr && t.set("warmup_iters");
  if (t.given("--warmup-steps") != nullptr || !run_known || both_in_file ||
      steps_of(t, "warmup_iters", warmup, batches) < run) {
    emit_iterations(t, "--warmup-steps", "warmup_iters", batches, 0);
    return;
  }
  const bool share = warmup < file_iterations;
  // warmup < file_iterations: the share is below run / batches, though
  // the product before the division may not fit 64 bits.
  const auto iterations =
      share ? static_cast<int64_t>(static_cast<__int128>(run / batches) *
                                   warmup / file_iterations)
            : run / batches / 50;
  const auto steps = std::to_string(iterations * batches);
  const auto percent = share
                           ? short_number(100.0 * static_cast<double>(warmup) /
                                          static_cast<double>(file_iterations))
                           : std::string("2");
  const auto why = t.source("warmup_iters") +
                   " is not shorter than the run's " + std::to_string(run) +
                   " steps";
  t.emit("--warmup-steps", steps, why + ": " + percent + "% of the run");
  notes.push_back(
      why + ": the warm-up is " + steps + (steps == "1" ? " step" : " steps") +
      " instead, " + percent + "% of the run" +
      (share ? ", the share of max_iters = " + std::to_string(file_iterations) +
                   " it is in the file"
             : ", train_gpt's own share (nanoGPT would warm up through the "
               "whole run and never reach learning_rate)") +
      "; give --warmup-steps to choose.");
}

// dtype as --precision: train.py's autocast dtypes.
void emit_precision(Translation& t) {
  if (t.given("--fp16") != nullptr) {
    return;
  }
  if (!t.set("dtype")) {
    t.emit("--precision", "auto",
           "nanoGPT's train.py default (dtype: bfloat16 where the GPU has "
           "it, else float16)");
    return;
  }
  const auto dtype = t.value("dtype");
  const char* precision = dtype == "float32"    ? "fp32"
                          : dtype == "bfloat16" ? "amp-bf16"
                          : dtype == "float16"  ? "amp"
                                                : nullptr;
  if (precision == nullptr) {
    refuse(t.source("dtype") +
           ": dtype is 'float32', 'bfloat16' or 'float16' in nanoGPT.");
  }
  t.emit("--precision", precision, t.source("dtype"));
}

// init_from (`from`, set by `where`): a new model, lamp's checkpoint in
// out_dir, or GPT-2's shape for --init-from's weights. Returns whether the
// file's shape applies (not when it comes from a checkpoint or GPT-2).
bool emit_start(Translation& t, const std::string& checkpoint,
                const std::string& from, const std::string& where) {
  if (from == "scratch") {
    return true;
  }
  if (from == "resume") {
    if (t.given("--resume") == nullptr && t.given("--init-from") == nullptr) {
      // nanoGPT's own checkpoint beside it holds no lamp run to continue;
      // its weights start one.
      const auto folder = checkpoint.substr(0, checkpoint.rfind('/') + 1);
      const auto nanogpt = folder + "ckpt.pt";
      if (!exists(checkpoint) && exists(nanogpt)) {
        refuse(where + ": there is no lamp checkpoint " + checkpoint +
               " to resume; " + nanogpt +
               " is nanoGPT's own, which train_gpt does not continue (its "
               "optimizer state and iteration are PyTorch's). Give "
               "--init-from " +
               nanogpt +
               " to start from its weights (a new run; with --sample-only, "
               "to sample from them).");
      }
      t.emit("--resume", checkpoint, where);
    }
    return false; // the checkpoint's shape, as train.py takes it
  }
  for (const auto& shape : kGpt2Shapes) {
    if (from != shape.name) {
      continue;
    }
    if (t.given("--resume") != nullptr) {
      // A fine-tuning run continued: its checkpoint holds the weights and
      // the shape (and --resume excludes --init-from).
      return false;
    }
    if (t.given("--init-from") == nullptr) {
      refuse(where +
             ": nanoGPT downloads GPT-2's weights; train_gpt downloads "
             "nothing: give --init-from with " +
             from +
             "'s weights (a Hugging Face pytorch_model.bin or "
             "model.safetensors, or nanoGPT's ckpt.pt; docs/gpt.md, "
             "\"Weights from Python\").");
    }
    t.emit("--layers", std::to_string(shape.layers), where);
    t.emit("--heads", std::to_string(shape.heads), where);
    t.emit("--width", std::to_string(shape.width), where);
    t.emit("--bias", "true", where);
    return false;
  }
  refuse(where +
         ": init_from is 'scratch', 'resume', 'gpt2', 'gpt2-medium', "
         "'gpt2-large' or 'gpt2-xl' in nanoGPT.");
}

// The device and dtype, the settings without a flag of their own, and
// sample.py's.
void emit_system_and_sampling(Translation& t, std::vector<std::string>& notes) {
  // The system.
  emit_precision(t);
  if (t.set("device")) {
    t.emit_key("--device", "device");
  }
  // No flag of their own, but a value of the wrong kind is still refused.
  t.truth("compile");
  t.truth("always_save_checkpoint");
  if (t.set("wandb_log") && t.truth("wandb_log")) {
    notes.push_back(t.source("wandb_log") +
                    ": train_gpt does not log to Weights & Biases; "
                    "--log-json FILE writes the losses, learning rate and "
                    "MFU as JSON Lines (scripts/plot.py draws them).");
  }
  // sample.py's.
  for (const auto& [key, flag] : sample_flags()) {
    if (!t.set(key)) {
      continue;
    }
    if (key == "top_k" && t.none(key)) {
      // sample.py's top_k = None: no cut, as --top-k 0.
      t.emit(flag, "0", t.source(key));
      continue;
    }
    const auto value = t.value(key);
    if (key == "start" && value.rfind("FILE:", 0) == 0) {
      t.emit("--prompt-file", value.substr(5), t.source(key));
    } else {
      t.emit(flag, value, t.source(key));
    }
  }
}

} // namespace

std::vector<ConfigFlag> nanogpt_config_flags(const ConfigFile& file,
                                             const GivenFlag& given,
                                             std::vector<std::string>& notes) {
  Translation t(file, given);
  const auto out_dir = t.value("out_dir");
  const auto checkpoint = join(out_dir, "lamp.pt");
  // --sample-only stands for sample.py, whose init_from is 'resume' unless
  // the file says otherwise (train.py's is 'scratch'): a file of sample.py's
  // settings and out_dir samples from out_dir's checkpoint, as there.
  const bool sampling = t.switched_on("--sample-only");
  const bool sample_default = sampling && !t.set("init_from");
  const auto from =
      sample_default ? std::string("resume") : t.value("init_from");
  const bool file_shape = emit_start(
      t, checkpoint, from,
      sample_default ? "nanoGPT's sample.py default (init_from = 'resume')"
                     : t.source("init_from"));
  if (sampling) {
    // sample.py: the checkpoint's model, and its data (for meta.pkl) unless
    // the file sets dataset; train.py's other settings are not used.
    if (t.set("dataset")) {
      t.emit("--data", join("data", t.value("dataset")), t.source("dataset"));
    }
    emit_system_and_sampling(t, notes);
    return t.flags();
  }
  const auto batches = batches_per_iteration(t);
  if (file_shape) {
    t.emit_key("--layers", "n_layer");
    t.emit_key("--heads", "n_head");
    t.emit_key("--width", "n_embd");
    t.emit("--bias", t.truth("bias") ? "true" : "false", t.source("bias"));
  }
  if (from != "resume") {
    t.emit_key("--context", "block_size");
  }
  t.emit_key("--dropout", "dropout");
  t.emit_key("--batch-size", "batch_size");
  // The data: data/DATASET, as train.py reads it, from where it runs.
  const auto data = join("data", t.value("dataset"));
  t.emit("--data", data, t.source("dataset"));
  const auto* typed_data = t.given("--data");
  const auto data_dir = typed_data != nullptr ? *typed_data : data;
  // Token files without a meta.pkl: train.py's GPT-2 vocabulary (a text's
  // bytes, or a folder not there, keep train_gpt's own rules).
  if (from == "scratch" && t.given("--vocab-size") == nullptr &&
      t.given("--tokenizer") == nullptr &&
      exists(join(data_dir, "train.bin")) &&
      !exists(join(data_dir, "meta.pkl"))) {
    t.emit("--vocab-size", "50304",
           "nanoGPT's train.py without a meta.pkl in " + data_dir +
               " (GPT-2's 50,257 padded)");
  }
  // The optimizer and its schedule.
  t.emit_key("--lr", "learning_rate");
  t.emit_key("--weight-decay", "weight_decay");
  t.emit_key("--beta1", "beta1");
  t.emit_key("--beta2", "beta2");
  t.emit_key("--max-grad-norm", "grad_clip");
  if (t.given("--epochs") == nullptr) {
    emit_iterations(t, "--steps", "max_iters", batches, 1);
  }
  // A --schedule the command line gives decides what of the file's
  // schedule applies: warm-up and min_lr shape warmup-cosine alone.
  const auto* typed_schedule = t.given("--schedule");
  if (typed_schedule != nullptr ? *typed_schedule == "warmup-cosine"
                                : t.truth("decay_lr")) {
    t.emit("--schedule", "warmup-cosine", t.source("decay_lr"));
    emit_warmup(t, batches, notes);
    t.emit_key("--min-lr", "min_lr");
    if (t.count("lr_decay_iters", 1) != t.count("max_iters", 1) ||
        t.given("--steps") != nullptr) {
      notes.push_back(t.source("lr_decay_iters") +
                      ": lamp's cosine decays to min_lr over the run's "
                      "steps (--steps), whatever lr_decay_iters says.");
    }
  } else {
    t.emit("--schedule", "constant", t.source("decay_lr"));
  }
  // Evaluations, logs, checkpoints.
  emit_iterations(t, "--eval-every", "eval_interval", batches, 1);
  emit_iterations(t, "--log-every", "log_interval", batches, 1);
  t.emit_key("--eval-batches", "eval_iters");
  // estimate_loss() draws eval_iters batches of batch_size (the command
  // line's --batch-size=N where it gives one).
  const auto* typed_batch = t.given("--batch-size");
  t.emit("--eval-batch-size",
         typed_batch != nullptr ? *typed_batch : t.value("batch_size"),
         typed_batch != nullptr
             ? "--batch-size, as nanoGPT's estimate_loss() draws batches of "
               "batch_size"
             : t.source("batch_size"));
  t.emit("--eval-only", t.truth("eval_only") ? "true" : "false",
         t.source("eval_only"));
  // A run that trains saves in out_dir, which train.py makes; --eval-only
  // writes nothing.
  const bool trains = !t.switched_on("--eval-only") && !t.truth("eval_only");
  const auto* eval_every = t.given("--eval-every");
  if (trains && (eval_every == nullptr || *eval_every != "0")) {
    t.emit("--eval-at-start", "true",
           "nanoGPT's train.py (it evaluates at iteration 0)");
  }
  if (trains) {
    t.emit("--checkpoint", checkpoint, t.source("out_dir"));
    emit_iterations(t, "--checkpoint-every", "eval_interval", batches, 1);
  }
  if (trains && t.given("--checkpoint") == nullptr) {
    const auto why = make_folders(out_dir);
    if (!why.empty()) {
      refuse(t.source("out_dir") + ": cannot make the folder " + out_dir +
             " (" + why + "): choose another out_dir, or give --checkpoint.");
    }
  }
  emit_system_and_sampling(t, notes);
  return t.flags();
}

std::string nanogpt_flag_hint(const std::string& flag) {
  const auto name = flag.rfind("--", 0) == 0 ? flag.substr(2) : flag;
  auto names = flag_of_name();
  names.insert(names.end(), sample_flags().begin(), sample_flags().end());
  for (const auto& [key, flags] : names) {
    if (key == name) {
      const std::string text = flags;
      return text.rfind("no flag", 0) == 0
                 ? "nanoGPT's " + key + " has " + text
                 : "nanoGPT's " + key + " is train_gpt's " + text;
    }
  }
  return "";
}

} // namespace lamp_examples
