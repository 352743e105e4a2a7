#pragma once

/// \file
/// Forwarding header: checkpoint files moved to lamp/platform/checkpoint_file.h
/// in lamp 0.2, from namespace lamp::training to namespace lamp (the AMP
/// core writes them too). Include that one; the names below keep
/// lamp::training::... compiling. Both go in lamp 0.3.

#include "lamp/platform/checkpoint_file.h"

namespace lamp {
namespace training {
using lamp::check_checkpoint_path;
using lamp::check_writable_path;
using lamp::CheckpointLock;
using lamp::crc32;
using lamp::load_checked_archive;
using lamp::load_pickle;
using lamp::save_checked_archive;
using lamp::save_pickle;
using lamp::write_file_atomically;
} // namespace training
} // namespace lamp
