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

/// Refuses, before training, a run that would write --checkpoint or its
/// best copy over a regular file that is there already and is not the
/// run's own (other kinds of file are the trainer's to refuse):
/// the run does not resume --checkpoint (--resume names another file, or
/// none), and --overwrite-checkpoint is not given. A new run started where
/// `--resume` was meant would otherwise replace the earlier run's
/// checkpoint at its first save. Throws c10::Error naming the file, its
/// size and time, and the three ways on (--resume it, another
/// --checkpoint, --overwrite-checkpoint).
void check_earlier_checkpoints(const ProgramConfig& config);

/// `path` and the folders above it, made as Python's os.makedirs(path,
/// exist_ok=True) makes them; "" where `path` is a folder then, else why
/// not (the system's words).
std::string make_folders(const std::string& path);

} // namespace lamp_examples
