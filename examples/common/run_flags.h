#pragma once

// The programs' one table of the flags that shape a run: how messages name
// a trainer setting (flag_name), what a checkpoint stores and --resume takes
// back (resume_settings.h), what the JSON log's run record holds
// (json_log.h). A row added here reaches all three.

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "options.h"

namespace lamp_examples {

/// One flag of the table.
struct RunFlag {
  /// The flag: "--lr".
  const char* flag;
  /// The trainer's name of the setting (TrainerOptions::option_name's key:
  /// "lr"), which messages turn into `flag`.
  const char* key;
  /// The key a checkpoint stores it under (StoredSetting::key:
  /// "model_name" for --model); nullptr where checkpoints do not store it.
  const char* stored;
  /// Its field in the JSON log's run record; nullptr where the record does
  /// not hold it (or holds it otherwise: the resolved precision).
  const char* recorded;
  /// A flag without a value (a checkpoint stores "true"/"false").
  bool is_switch = false;
  /// Stored rows: sets the flag's value from the stored text, and says
  /// whether the command line's value is the stored one.
  std::function<void(ProgramConfig&, const std::string&)> set;
  std::function<bool(const ProgramConfig&, const std::string&)> same;
  /// Recorded rows: the value the run record holds.
  std::function<nlohmann::ordered_json(const ProgramConfig&)> value;
};

/// The table, in the run record's order.
const std::vector<RunFlag>& run_flags();

} // namespace lamp_examples
