#pragma once

/// \file
/// Checkpoint files that a crash, a full disk, a second run or a flipped bit
/// cannot turn into a silently wrong resume:
///  - write_file_atomically() writes a unique temporary file next to the
///    target, checks every write, `fsync`s it, reads it back, renames it over
///    the target and `fsync`s the folder; on any failure the target is left as
///    it was and the temporary file is removed;
///  - save_checked_archive() / load_checked_archive() wrap a
///    torch::serialize archive in an envelope that stores the payload's size
///    and CRC-32, checked before anything is read from it;
///  - CheckpointLock keeps two live runs from writing the same checkpoint;
///  - save_pickle() / load_pickle() write and read the files of Python's
///    `torch.save` (state dicts for Python).

#include <ATen/core/ivalue.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <string>

namespace lamp {

/// Checks that `path` can be a checkpoint written by write_file_atomically():
/// its folder exists, and `path` is either absent or a regular file (not a
/// device such as /dev/full or /dev/null, a FIFO, a folder or a symbolic
/// link, which renaming a new file over would replace), and its name leaves
/// room for the temporary files written beside it (`PATH.tmp-<pid>-<n>`)
/// within the file system's NAME_MAX (pathconf). `what` names the path in
/// messages (e.g. "--checkpoint").
void check_checkpoint_path(const std::string& path, const std::string& what);

/// check_checkpoint_path(), and that a file can be created in the folder
/// and can take a write: it creates a temporary file there, writes 4096
/// bytes, `fsync`s and removes it. For a file written at the end of a run,
/// checked before the run starts: a full disk or an unwritable folder fails
/// then (it cannot promise the space the file will need at the end). Throws
/// c10::Error naming `what`, the path and the system's reason.
void check_writable_path(const std::string& path, const std::string& what);

/// Replaces `path` with `bytes` atomically and durably (see the file comment).
/// Throws c10::Error naming the path and the system's reason (e.g. "No space
/// left on device"); `path` then still holds its previous content, unless
/// the error is the folder's sync after the rename.
/// \warning The folder is synced through a descriptor opened for reading: in
/// a folder that may be written but not read (mode 0300) the file is
/// written and renamed, but its rename is not made durable, and a warning
/// (once per process) says so and names the folder.
void write_file_atomically(const std::string& path, const std::string& bytes);

/// Serialises `archive` into a checksummed envelope and writes it with
/// write_file_atomically(). Returns the payload's CRC-32, the checksum the
/// envelope records: a file that names others (a sharded checkpoint's
/// manifest) records theirs to prove they belong together.
uint32_t save_checked_archive(torch::serialize::OutputArchive& archive,
                              const std::string& path);

/// Reads a file written by save_checked_archive() into `archive`, after
/// checking the envelope, the payload's size and its CRC-32: a damaged file
/// throws c10::Error naming the path and the damage, whatever the damage.
/// Returns the payload's CRC-32 (save_checked_archive()'s).
uint32_t load_checked_archive(torch::serialize::InputArchive& archive,
                              const std::string& path);

/// Writes `value` in the format of Python's `torch.save` (a zip holding a
/// pickle: torch::pickle_save) with write_file_atomically(), for files that
/// Python reads with `torch.load(path)`, weights_only (its default) included:
/// dicts, strings, numbers, bools and tensors (written from the CPU with
/// their dtype) load there. \warning Typed lists (`c10::List<int64_t>`) are
/// written as calls to torch.jit helpers that weights_only refuses; use
/// tensors instead.
void save_pickle(const c10::IValue& value, const std::string& path);

/// Reads a file written by Python's `torch.save` or by save_pickle()
/// (torch::pickle_load), tensors on the CPU. Throws c10::Error naming the
/// path when it cannot be read or is not such a file: a torch::serialize
/// archive (checkpoints, torch::save's files) is refused with a message
/// saying so. So is a file whose value holds a container that contains
/// itself (`d["self"] = d`), containers nested more than 1000 deep, or a
/// tensor view beyond its storage: values whose use or freeing could
/// overflow the stack or read out of bounds. `what` names the caller in
/// messages.
c10::IValue load_pickle(const std::string& path, const std::string& what);

/// Whether `path` is a file of Python's `torch.save` (a zip holding
/// data.pkl, which load_pickle() reads) rather than a lamp checkpoint or
/// anything else; false for a file that cannot be read. Reads the zip's
/// directory only.
bool is_torch_save_file(const std::string& path);

/// The system's words for errno `error` as lamp's write errors show them:
/// strerror(), for ENOSPC and EDQUOT what they mean ("No space left on
/// device (the disk is full)"), and for EFBIG the limit the system does not
/// name ("File too large (this process may write files of at most 65536
/// bytes: ulimit -f; raise the limit)").
std::string io_error_text(int error);

/// CRC-32 (zlib's, the polynomial of gzip and zip) of `size` bytes.
uint32_t crc32(const void* data, size_t size);

/// An exclusive lock on a checkpoint path, held for the object's lifetime:
/// `PATH.lock` holds the owner's pid and is locked with flock(2), which the
/// kernel releases when the owner exits or is killed, so a lock file left by
/// a dead run is stale and taken over. Taking it also proves the folder is
/// writable, and removes temporary files that a killed run left behind.
///
/// Throws c10::Error when another live process holds the lock (naming its
/// pid) or the lock file cannot be created (naming the reason).
class CheckpointLock {
 public:
  /// Takes the lock on checkpoint `path` (the lock file is `path` + ".lock");
  /// `path` is checked first as check_checkpoint_path() does.
  explicit CheckpointLock(const std::string& path);
  /// Removes the lock file, then releases the lock.
  ~CheckpointLock();
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

  /// The lock file: the checkpoint path + ".lock".
  const std::string& lock_path() const { return lock_path_; }

 private:
  std::string lock_path_;
  int fd_ = -1;
};

} // namespace lamp
