#include "resume_settings.h"

#include <lamp/lamp.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace lamp_examples {
namespace {

// How a flag holds what a checkpoint stores under `key`.
struct StoredFlag {
  const char* key;  // lamp::training::StoredSetting::key
  const char* flag; // its flag
  bool is_switch;   // a flag without a value (stored "true"/"false")
  std::function<void(ProgramConfig&, const std::string&)> set;
  // Whether the command line's value is the stored one.
  std::function<bool(const ProgramConfig&, const std::string&)> same;
};

// A stored value as the flag's type.
void parse(const std::string& text, std::string& value) {
  value = text;
}
void parse(const std::string& text, int64_t& value) {
  value = std::strtoll(text.c_str(), nullptr, 10);
}
void parse(const std::string& text, uint64_t& value) {
  value = std::strtoull(text.c_str(), nullptr, 10);
}
void parse(const std::string& text, double& value) {
  value = std::strtod(text.c_str(), nullptr);
}
void parse(const std::string& text, bool& value) {
  value = text == "true";
}

// A flag bound to `member`, the same when equal to the stored value (or,
// `at_least`, not below it).
template <typename T>
StoredFlag field(const char* key, const char* flag, T ProgramConfig::*member,
                 bool at_least = false) {
  return {
      key, flag, std::is_same<T, bool>::value,
      [member](ProgramConfig& c, const std::string& v) { parse(v, c.*member); },
      [member, at_least](const ProgramConfig& c, const std::string& v) {
        T stored{};
        parse(v, stored);
        return c.*member == stored || (at_least && stored < c.*member);
      }};
}

// The mode --precision (or --fp16) names (parsed already), as checkpoints
// store it; "auto" is resolved by the run, which the trainer compares.
bool same_precision(const ProgramConfig& c, const std::string& stored) {
  const auto mode = c.requested_precision;
  return mode == lamp::Precision::kAuto || lamp::to_string(mode) == stored;
}

const std::vector<StoredFlag>& stored_flags() {
  using C = ProgramConfig;
  static const std::vector<StoredFlag> flags = {
      field("model_name", "--model", &C::model),
      {"precision", "--precision", false,
       [](C& c, const std::string& v) {
         c.precision = v; // a mode's name, as to_string() wrote it
         c.requested_precision = lamp::parse_precision(v);
       },
       same_precision},
      field("optimizer", "--optimizer", &C::optimizer),
      field("batch_size", "--batch-size", &C::batch_size),
      // More epochs: the trainer continues a constant schedule or says why
      // not; fewer are a difference.
      field("epochs", "--epochs", &C::epochs, /*at_least=*/true),
      field("lr", "--lr", &C::lr),
      field("schedule", "--schedule", &C::schedule),
      field("momentum", "--momentum", &C::momentum),
      field("weight_decay", "--weight-decay", &C::weight_decay),
      field("no_bias_decay", "--no-bias-decay", &C::no_bias_decay),
      field("accumulation_steps", "--accumulation-steps",
            &C::accumulation_steps),
      field("max_grad_norm", "--max-grad-norm", &C::max_grad_norm),
      field("seed", "--seed", &C::seed),
      field("zero_stage", "--zero", &C::zero),
      // The FP8 recipe; "none" stored by a run outside fp8 leaves the flag
      // (check_flag_combination refuses one given without --precision fp8).
      {"fp8_scaling", "--fp8-scaling", false,
       [](C& c, const std::string& v) {
         if (v != "none") {
           c.fp8_scaling = v;
         }
       },
       [](const C& c, const std::string& v) {
         return v == "none" || c.fp8_scaling == v;
       }},
      field("fp8_amax_history", "--fp8-amax-history", &C::fp8_amax_history),
      field("fp8_margin", "--fp8-margin", &C::fp8_margin),
      // More steps: the trainer continues a constant schedule or says why
      // not, as for epochs.
      field("steps", "--steps", &C::steps, /*at_least=*/true),
      field("warmup_steps", "--warmup-steps", &C::warmup_steps),
      field("min_lr", "--min-lr", &C::min_lr),
      field("beta1", "--beta1", &C::beta1),
      field("beta2", "--beta2", &C::beta2),
  };
  return flags;
}

// How many times the command line gave `flag` (--precision counts --fp16).
size_t given_count(const CLI::App& app, const std::string& flag) {
  size_t count = 0;
  for (const auto& name : flag == "--precision"
                              ? std::vector<std::string>{flag, "--fp16"}
                              : std::vector<std::string>{flag}) {
    if (const auto* option = app.get_option_no_throw(name)) {
      count += option->count();
    }
  }
  return count;
}

// The value the command line gave for `flag`, as typed.
std::string given_text(const CLI::App& app, const StoredFlag& flag) {
  if (flag.is_switch) {
    return "given";
  }
  const auto* fp16 = app.get_option_no_throw("--fp16");
  const auto* option = app.get_option_no_throw(flag.flag);
  if (std::string(flag.flag) == "--precision" && fp16 && fp16->count() > 0 &&
      option->count() == 0) {
    return "--fp16";
  }
  const auto& results = option->results();
  return results.empty() ? std::string() : results.back();
}

// What to give instead: "--batch-size 128", "without --no-bias-decay".
std::string stored_flag_text(const StoredFlag& flag, const std::string& value) {
  if (flag.is_switch) {
    return (value == "true" ? "with " : "without ") + std::string(flag.flag);
  }
  return std::string(flag.flag) + " " + value;
}

} // namespace

void apply_resume_settings(CLI::App& app, ProgramConfig& config) {
  if (config.resume.empty()) {
    return;
  }
  const auto checkpoint =
      lamp::training::read_checkpoint_settings(config.resume);
  auto stored = checkpoint.settings;
  stored.push_back({"model_name", checkpoint.model_name});
  std::string differences, fix;
  // The program's own settings, by flag: a flag left out takes the stored
  // value (as if given), a checked one given with another value is a
  // difference. The run's --epochs follow a stored --steps.
  const auto now = config.program_settings
                       ? config.program_settings()
                       : std::vector<lamp::training::ProgramSetting>{};
  for (const auto& setting : checkpoint.program_settings) {
    auto* option = app.get_option_no_throw(setting.name);
    if (option == nullptr) {
      continue; // another program's flag: the model name tells it apart
    }
    if (option->count() == 0) {
      option->clear();
      option->add_result(setting.value);
      option->run_callback();
      continue;
    }
    std::string value;
    for (const auto& is : now) {
      if (is.name == setting.name) {
        value = is.value;
      }
    }
    if (setting.checked && value != setting.value) {
      differences += std::string(differences.empty() ? "" : "; ") +
                     setting.name + " " + setting.value + " there, " +
                     option->results().back() + " here";
      fix += (fix.empty() ? "" : " ") + setting.name + " " + setting.value;
    }
  }
  for (const auto& flag : stored_flags()) {
    for (const auto& setting : stored) {
      if (setting.key != flag.key) {
        continue;
      }
      if (given_count(app, flag.flag) == 0) {
        flag.set(config, setting.value);
      } else if (!flag.same(config, setting.value)) {
        differences +=
            std::string(differences.empty() ? "" : "; ") + flag.flag + " " +
            (flag.is_switch ? (setting.value == "true" ? "on" : "off")
                            : setting.value) +
            " there, " + given_text(app, flag) + " here";
        fix += (fix.empty() ? "" : " ") + stored_flag_text(flag, setting.value);
      }
    }
  }
  TORCH_CHECK(
      differences.empty(), "lamp: ", config.resume,
      " was trained with other settings than this command line gives: ",
      differences,
      ". A resumed run continues the same schedule and data order: leave "
      "these flags out (--resume alone takes the checkpoint's values) or "
      "resume with ",
      fix,
      "; to train from these weights with new settings, start a new run "
      "with --init-from ",
      config.resume, ".");
}

} // namespace lamp_examples
