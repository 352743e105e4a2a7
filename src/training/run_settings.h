#pragma once

// The settings a trainer's checkpoint stores and a resumed run must repeat,
// listed once: writing a checkpoint and checking one both read this table,
// so a setting cannot be written and forgotten by the check, or the other
// way round.

#include <torch/serialize/archive.h>

#include <string>
#include <utility>
#include <vector>

#include "lamp/data/loader.h"
#include "lamp/training/checkpoint_weights.h"
#include "lamp/training/trainer.h"

namespace lamp {
namespace training {
namespace detail {

/// The format tag of Trainer's checkpoints. 2: checksummed
/// (checkpoint_file.h), with the run's settings, which a resume must repeat.
constexpr const char* kCheckpointFormat = "lamp-classifier-trainer-2";

/// RunHistoryEntry::kind's values.
constexpr const char* kContinued = "continued";
constexpr const char* kInitFrom = "init_from";
constexpr const char* kResharded = "resharded";

/// What the settings are read from: the trainer's options, its training
/// loader's, and the fingerprints (data::fingerprint()) of its training and
/// test data.
struct RunContext {
  const TrainerOptions& options;
  const data::LoaderOptions& loader;
  const std::string& train_data;
  const std::string& test_data;
};

/// Writes every setting of the table under its key.
void write_run_settings(torch::serialize::OutputArchive& archive,
                        const RunContext& run);

/// Reads every setting of the table from `archive` (the checkpoint at
/// `path`) and refuses the first that differs from `run`'s, naming it
/// (TrainerOptions::option_name) with both values and what to resume with.
/// Settings added to the format later read as what runs did before they
/// were stored, where a checkpoint predates them. The number of ranks
/// (num_shards) may differ with TrainerOptions::reshard. One more is allowed:
/// more epochs than the checkpoint's run was given, where its schedule does
/// not depend on the run's length (depends_on_length()); with a schedule
/// that does, the refusal says why and what to do instead. Returns the
/// checkpoint's epochs (fewer than run.options.epochs() when this run
/// continues it).
int64_t check_run_settings(torch::serialize::InputArchive& archive,
                           const std::string& path, const RunContext& run);

/// Every setting of the table stored in `archive` (the checkpoint at
/// `path`), as check_run_settings() shows it; those the checkpoint predates
/// are left out.
std::vector<StoredSetting> read_stored_settings(
    torch::serialize::InputArchive& archive, const std::string& path);

/// Writes `history` under "history" (a count and one archive per entry).
void write_history(torch::serialize::OutputArchive& archive,
                   const std::vector<RunHistoryEntry>& history);

/// The history write_history() stored in `archive` (the checkpoint at
/// `path`), every field checked; empty for a checkpoint written before
/// checkpoints had one.
std::vector<RunHistoryEntry> read_history(
    torch::serialize::InputArchive& archive, const std::string& path);

/// Writes TrainerOptions::program_settings under "program_settings".
void write_program_settings(torch::serialize::OutputArchive& archive,
                            const std::vector<ProgramSetting>& settings);

/// The program settings write_program_settings() stored in `archive` (the
/// checkpoint at `path`); empty for a checkpoint written before they were
/// stored.
std::vector<ProgramSetting> read_program_settings(
    torch::serialize::InputArchive& archive, const std::string& path);

/// Refuses a resume whose checked program settings differ from the stored
/// ones (the checkpoint at `path`), every difference named in one message.
void check_program_settings(const std::vector<ProgramSetting>& stored,
                            const std::vector<ProgramSetting>& now,
                            const std::string& path);

/// Every setting of the table, in its order: (its name as the messages show
/// it, name_option(), its value as they show it), e.g. {"--lr", "0.05"} or,
/// without an option_name, {"TrainerOptions::optimizer().lr", "0.05"}. For
/// comparing runs, or ranks, setting by setting.
std::vector<std::pair<std::string, std::string>> describe_run_settings(
    const RunContext& run);

} // namespace detail
} // namespace training
} // namespace lamp
