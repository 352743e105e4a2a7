#include "resume_settings.h"

#include <lamp/lamp.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
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

// The value `flag` has among the checkpoint's program settings ("" where it
// holds none: a run without the flag, or a checkpoint written before it was
// stored).
std::string stored_value(
    const std::vector<lamp::training::ProgramSetting>& settings,
    const std::string& flag) {
  for (const auto& setting : settings) {
    if (setting.name == flag) {
      return setting.value;
    }
  }
  return "";
}

// --resume PATH without --checkpoint or --log-json continues the run's own
// outputs: its checkpoint is PATH where PATH has the name of the file the
// run wrote (not its .best copy, or a copy under another name), and its log
// where that file is still there. What is not continued, and why, goes on
// config.resume_line.
void continue_outputs(
    const CLI::App& app, ProgramConfig& config,
    const std::vector<lamp::training::ProgramSetting>& settings) {
  std::vector<std::string> said;
  if (given_count(app, "--checkpoint") == 0) {
    const auto run_checkpoint = stored_value(settings, "--checkpoint");
    if (!run_checkpoint.empty() &&
        std::filesystem::path(run_checkpoint).filename() ==
            std::filesystem::path(config.resume).filename()) {
      config.checkpoint = config.resume;
      said.push_back("checkpoints to " + config.resume);
    } else {
      said.push_back("no checkpoint is written: " +
                     (run_checkpoint.empty()
                          ? std::string("the run's checkpoint is not known")
                          : config.resume + " is not the run's checkpoint (" +
                                run_checkpoint + ")") +
                     "; give --checkpoint PATH to save this run");
    }
  }
  if (given_count(app, "--log-json") == 0) {
    const auto run_log = stored_value(settings, "--log-json");
    if (!run_log.empty()) {
      std::error_code error;
      if (std::filesystem::is_regular_file(run_log, error)) {
        config.log_json = run_log;
        said.push_back("logs to " + run_log);
      } else {
        said.push_back("no log is written: the run's log " + run_log +
                       " is not there; give --log-json PATH to write one");
      }
    }
  }
  for (const auto& part : said) {
    config.resume_line += (config.resume_line.empty() ? "" : "; ") + part;
  }
}

} // namespace

void apply_resume_settings(CLI::App& app, ProgramConfig& config,
                           const std::string& program,
                           const char* not_training) {
  const bool trains = not_training == nullptr;
  if (config.resume.empty()) {
    return;
  }
  const bool gpt_program = program == "train_gpt";
  // A file Python wrote holds weights, no run to continue: a GPT's start a
  // new run (train_gpt's --init-from takes nanoGPT's ckpt.pt and state
  // dicts).
  TORCH_CHECK(!lamp::is_torch_save_file(config.resume), "lamp: ", config.resume,
              " is a file in PyTorch's own format (Python's torch.save, or "
              "--export-state-dict), not a checkpoint lamp's --checkpoint "
              "wrote: it holds weights, no run to continue. ",
              gpt_program ? "To start a new run from a GPT's weights in it "
                            "(nanoGPT's ckpt.pt, a state dict), give "
                            "--init-from " +
                                config.resume + "."
                          : std::string("Python reads it (torch.load, then "
                                        "model.load_state_dict)."));
  const auto checkpoint =
      lamp::training::read_checkpoint_settings(config.resume);
  // train_gpt's models are named by their shape, "gpt(layers=...)".
  const bool gpt_checkpoint = checkpoint.model_name.rfind("gpt(", 0) == 0;
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
  if (trains) {
    continue_outputs(app, config, checkpoint.program_settings);
  }
  for (const auto& setting : checkpoint.program_settings) {
    auto* option = app.get_option_no_throw(setting.name);
    if (option == nullptr || setting.name == "--checkpoint" ||
        setting.name == "--log-json" ||
        std::find(config.resumed_by_program.begin(),
                  config.resumed_by_program.end(),
                  setting.name) != config.resumed_by_program.end()) {
      // Another program's flag (the model name tells it apart), the
      // outputs, which continue_outputs() continued, or what the program
      // takes back itself.
      continue;
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
      } else if (trains && !flag.same(config, setting.value)) {
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
  // Training nothing, only the model's settings are compared: they come
  // with the checkpoint.
  TORCH_CHECK(differences.empty() || trains, "lamp: ", config.resume,
              " holds a model of other settings than this command line "
              "gives: ",
              differences, ". ", not_training,
              " takes them from the checkpoint: leave these flags out.");
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
