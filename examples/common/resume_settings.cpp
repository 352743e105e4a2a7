#include "resume_settings.h"

#include <lamp/lamp.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "run_flags.h"

namespace lamp_examples {
namespace {

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
std::string given_text(const CLI::App& app, const RunFlag& flag) {
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
std::string stored_flag_text(const RunFlag& flag, const std::string& value) {
  if (flag.is_switch) {
    return (value == "true" ? "with " : "without ") + std::string(flag.flag);
  }
  return std::string(flag.flag) + " " + value;
}

} // namespace

void apply_resume_settings(CLI::App& app, ProgramConfig& config,
                           const std::string& program, bool sampling) {
  if (config.resume.empty()) {
    return;
  }
  const auto checkpoint =
      lamp::training::read_checkpoint_settings(config.resume);
  // train_gpt's models are named by their shape, "gpt(layers=...)".
  const bool gpt_checkpoint = checkpoint.model_name.rfind("gpt(", 0) == 0;
  const bool gpt_program = program == "train_gpt";
  TORCH_CHECK(gpt_checkpoint == gpt_program, "lamp: ", config.resume,
              " is a checkpoint of ",
              gpt_checkpoint ? "train_gpt" : "an image classifier",
              " (its model: ", checkpoint.model_name, "), not of ", program,
              "; resume it with ",
              gpt_checkpoint ? "train_gpt"
                             : "the program that wrote it (train_mnist or "
                               "train_cifar10)",
              ".");
  config.resumed_program_settings = checkpoint.program_settings;
  auto stored = checkpoint.settings;
  stored.push_back({"model_name", checkpoint.model_name});
  // A run measured in steps takes its stored --steps when none is given,
  // which sizes its epochs: an --epochs given would go unheard.
  for (const auto& setting : stored) {
    TORCH_CHECK(setting.key != "steps" ||
                    std::strtoll(setting.value.c_str(), nullptr, 10) == 0 ||
                    given_count(app, "--epochs") == 0,
                "lamp: ", config.resume, " is a run of --steps ", setting.value,
                " (its length in batches), which --epochs ", config.epochs,
                " cannot change: leave --epochs out, and give a larger "
                "--steps to lengthen the run (where its schedule allows: "
                "constant).");
  }
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
      if (setting.value.empty() && option->get_default_str().empty()) {
        // Stored as left out (train_gpt's --tokenizer of a byte-level
        // run): left out again, where the flag's check refuses an empty
        // value typed on the command line.
        continue;
      }
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
  for (const auto& flag : run_flags()) {
    if (flag.stored == nullptr) {
      continue;
    }
    for (const auto& setting : stored) {
      if (setting.key != flag.stored) {
        continue;
      }
      if (given_count(app, flag.flag) == 0) {
        flag.set(config, setting.value);
      } else if (!sampling && !flag.same(config, setting.value)) {
        differences +=
            std::string(differences.empty() ? "" : "; ") + flag.flag + " " +
            (flag.is_switch ? (setting.value == "true" ? "on" : "off")
                            : setting.value) +
            " there, " + given_text(app, flag) + " here";
        fix += (fix.empty() ? "" : " ") + stored_flag_text(flag, setting.value);
      }
    }
  }
  // "auto" on a resume keeps the mode the run chose when it began (stored
  // resolved): a new measurement could choose another.
  if (config.requested_precision == lamp::Precision::kAuto) {
    for (const auto& setting : stored) {
      if (setting.key == "precision") {
        config.auto_stored = setting.value;
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
