#pragma once

// What lamp's checkpoint readers share (src/platform/checkpoint_file.cpp:
// checked archives; src/platform/pickle_file.cpp: Python's pickles).

#include <ATen/core/ivalue.h>
#include <c10/util/Optional.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace lamp {
namespace detail {

// A file written a piece at a time (write_file_atomically() writes its
// whole through one): into a temporary file beside `path`, every write
// checked; commit() fsyncs it, with `written` (all that was written) reads
// it back and compares, renames it over `path` and fsyncs the folder.
// Destroyed without commit() (an error, an interruption), it removes the
// temporary file, and `path` is as it was. Errors are c10::Errors naming
// `path`, the system's reason and the fix.
//
// `unnamed`: the temporary file has no name until commit() (Linux's
// O_TMPFILE), so that a process killed while writing (SIGKILL, the OOM
// killer: a long write of token files) leaves nothing behind; where the
// folder's file system has no such files, a named one as otherwise.
// Checkpoints keep named ones: the lock's holder removes those a killed
// run left, and the fault tests find them by name.
class StreamingFile {
 public:
  explicit StreamingFile(const std::string& path, bool unnamed = false);
  ~StreamingFile();
  StreamingFile(const StreamingFile&) = delete;
  StreamingFile& operator=(const StreamingFile&) = delete;

  void write(const void* data, size_t size);
  // The bytes written so far.
  uint64_t size() const;
  void commit(const std::string* written = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Throws, naming `what`, `path` and the longest name it may have, when
// `path`'s file name followed by `longest_suffix` (what is written beside
// it: "" for the file itself, ".rank1-of-2.step100" for a rank's shard) and
// a temporary file's suffix is longer than its folder's file system allows.
void check_name_length(const std::string& path, const std::string& what,
                       const std::string& longest_suffix);

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
