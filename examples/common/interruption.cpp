#include "interruption.h"

#include <nlohmann/json.hpp>

#include "cli.h"
#include "stop_signals.h"

#include <iostream>
#include <vector>

namespace lamp_examples {
namespace {

// The command line that continues the run from `from`: this one, with
// --resume FROM in place of any --resume it had, and without --init-from,
// which --resume excludes (the checkpoint holds the weights it started
// from, trained on), or the program's other flags --resume refuses.
std::string resume_command(const ProgramConfig& config,
                           const std::string& from) {
  std::vector<std::string> dropped = {"--resume", "--init-from"};
  dropped.insert(dropped.end(), config.dropped_on_resume.begin(),
                 config.dropped_on_resume.end());
  std::vector<std::string> args;
  const auto& line = config.command_line;
  for (size_t i = 0; i < line.size(); ++i) {
    bool drop = false;
    for (const auto& flag : dropped) {
      if (line[i] == flag) {
        ++i; // and its value
        drop = true;
        break;
      }
      if (line[i].rfind(flag + "=", 0) == 0) {
        drop = true;
        break;
      }
    }
    if (!drop) {
      args.push_back(line[i]);
    }
  }
  args.push_back("--resume");
  args.push_back(from);
  return shell_command(args);
}

// Where the run stopped: "in epoch 2 after 3 of 7 steps".
std::string where_stopped(const lamp::training::StopPoint& stop) {
  const auto epoch = std::to_string(stop.epoch);
  if (stop.in_evaluation) {
    return "while evaluating at step " + std::to_string(stop.global_step) +
           " (epoch " + epoch + ")";
  }
  if (stop.steps == 0) {
    return "before epoch " + epoch + " began";
  }
  return "in epoch " + epoch + " after " + std::to_string(stop.steps) + " of " +
         std::to_string(stop.steps_in_epoch) + " steps";
}

} // namespace

int report_interruption(const ProgramConfig& config, const std::string& program,
                        const lamp::training::Trainer& trainer,
                        Progress& progress, JsonLog* log, int signal) {
  progress.clear();
  const auto& stop = trainer.stop_point();
  // The step the checkpoint holds: written at the stop, or earlier in this
  // run, or (nothing written) what this run resumed from.
  const int64_t saved = stop.checkpoint_step;
  const bool written = saved >= 0 && !config.checkpoint.empty();
  const std::string from = written ? config.checkpoint : config.resume;
  std::string what;
  if (written) {
    what = config.checkpoint + " holds step " + std::to_string(saved);
    if (saved < stop.global_step) {
      // Not written at the stop: its step's loss was inf/NaN (warned).
      what += " (the " + std::to_string(stop.global_step - saved) +
              " steps after it are not saved)";
    } else {
      what += ": nothing trained is lost";
    }
  } else if (config.checkpoint.empty()) {
    what = "nothing was saved (no --checkpoint)";
  } else {
    what = config.checkpoint + " was not written";
  }
  const std::string next =
      from.empty()
          ? "run the command again to start over" +
                std::string(
                    config.checkpoint.empty()
                        ? " (with --checkpoint PATH to be able to resume)"
                        : "")
          : "continue with: " + resume_command(config, from);
  if (log) {
    log->write_interrupted(
        {{"signal", signal != 0 ? nlohmann::ordered_json(signal_name(signal))
                                : nlohmann::ordered_json(nullptr)},
         {"asked_by_rank", stop.asked_by_rank},
         {"epoch", stop.epoch},
         {"steps", stop.steps},
         {"steps_in_epoch", stop.steps_in_epoch},
         {"global_step", stop.global_step},
         {"phase", stop.in_evaluation ? "evaluation" : "training"},
         {"checkpoint", config.checkpoint.empty()
                            ? nlohmann::ordered_json(nullptr)
                            : nlohmann::ordered_json(config.checkpoint)},
         {"checkpoint_step", written ? nlohmann::ordered_json(saved)
                                     : nlohmann::ordered_json(nullptr)},
         {"resume_command", from.empty() ? nlohmann::ordered_json(nullptr)
                                         : nlohmann::ordered_json(
                                               resume_command(config, from))}});
  }
  std::cout.flush();
  std::cerr << program << ": " << stop_reason(signal, stop.asked_by_rank) << " "
            << where_stopped(stop) << "; " << what << "; " << next << std::endl;
  return interrupted_status(signal);
}

std::string stop_reason(int signal, int asked_by_rank) {
  return signal != 0 ? "interrupted (" + std::string(signal_name(signal)) + ")"
                     : "stopped with rank " + std::to_string(asked_by_rank) +
                           ", which was asked to stop,";
}

int interrupted_status(int signal) {
  return signal != 0 ? 128 + signal : 1;
}

} // namespace lamp_examples
