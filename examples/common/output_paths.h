#pragma once

// The files a training program reads and writes must be distinct: an output
// written over an input, or two outputs over each other, would lose one of
// them (a state dict exported over the checkpoint, a log appended to it).

#include "options.h"

#include <string>
#include <vector>

namespace lamp_examples {

/// Refuses, before training, any two of --checkpoint, its best copy
/// (best_checkpoint_path(), written with --eval-every), --resume,
/// --init-from, --export-state-dict, --log-json and `data_files` (the files
/// --data names) that are one file, where one of them is written; --resume
/// and --checkpoint may name the same file (continuing a run), the best
/// copy and --resume may not. Files that exist are compared by device and
/// inode (hard links, symbolic links, other spellings), the others by their
/// folder's real path and their name. Any of them named like the lock file
/// (`CHECKPOINT.lock`) or temporary files (`CHECKPOINT.tmp-*`) of either
/// checkpoint, which the run creates and removes, is refused too. Throws
/// c10::Error naming both flags and paths.
void check_distinct_paths(const ProgramConfig& config,
                          const std::vector<std::string>& data_files);

} // namespace lamp_examples
