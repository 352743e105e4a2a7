#pragma once

// What lamp's checkpoint readers share (src/platform/checkpoint_file.cpp:
// checked archives; src/platform/pickle_file.cpp: Python's pickles).

#include <ATen/core/ivalue.h>
#include <c10/util/Optional.h>

#include <string>

namespace lamp {
namespace detail {

// The whole of a regular file, checked against the memory there is to hold
// it; a TORCH_CHECK error naming the path otherwise.
std::string read_regular_file(const std::string& path);

// Whether `bytes` are a zip of Python's torch.save (its pickle, data.pkl,
// without the constants.pkl of the TorchScript archives lamp's checkpoints
// are): a state dict from --export-state-dict or Python, which a checkpoint
// reader names instead of calling it damaged.
bool is_torch_save_zip(const std::string& bytes);

// The plain values of the torch.save file at `path` (a whole training
// checkpoint: dicts, numbers, strings) with every tensor and other object
// read as None, to find one entry in; nullopt when it is not such a file
// (is_torch_save_zip) or holds what the plain reader does not read.
c10::optional<c10::IValue> read_pickle_skeleton(const std::string& path,
                                                const std::string& what);

} // namespace detail
} // namespace lamp
