#include "lamp/platform/checkpoint_file.h"

#include "lamp/platform/out_of_memory.h"
#include "platform/checkpoint_io.h"
#include "platform/memory.h"
#include "platform/paths.h"

#include <torch/torch.h>
#include <zlib.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <tuple>

namespace lamp {
namespace {

// What the envelope around a checked archive holds.
constexpr const char* kEnvelope = "lamp-checked-archive-1";
constexpr const char* kEnvelopeKey = "lamp_envelope";

std::string reason(int error) {
  return io_error_text(error);
}

using detail::base_name;
using detail::folder_names;
using detail::join_path;
using detail::parent_folder;

// Temporary files are named PATH.tmp-<pid>-<n>: unique per process and write,
// so two writers never share one, and recognisable, so that the holder of the
// lock can remove those a killed run left behind.
constexpr const char* kTemporaryInfix = ".tmp-";

// Closes and removes a temporary file unless release()d: every failure path
// of check_writable_path()'s test write leaves nothing behind.
class TemporaryFile {
 public:
  TemporaryFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~TemporaryFile() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
    if (!released_) {
      ::unlink(path_.c_str());
    }
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  /// Closes the file, returning close()'s errno (0 on success).
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }
  void release() { released_ = true; }

 private:
  std::string path_;
  int fd_;
  bool released_ = false;
};

[[noreturn]] void write_failed(const std::string& path, const std::string& what,
                               int error) {
  // The advice that fits the error: space, permission, or either.
  const char* fix =
      error == ENOSPC || error == EDQUOT || error == EFBIG
          ? "free space or choose another folder"
      : error == EACCES || error == EPERM || error == EROFS
          ? "make the folder writable or choose another folder"
      // A file bind-mounted on its own (docker -v ./ckpt.pt:/app/ckpt.pt)
      // cannot be renamed over.
      : error == EBUSY
          ? "the path is a mount point (a file mounted on its own cannot be "
            "replaced); mount its folder instead, or choose another path"
      : error == ENAMETOOLONG ? "choose a shorter path"
      : error == EIO
          ? "check the storage device (an I/O error)"
          : "free space or make the folder writable, or choose another folder";
  TORCH_CHECK(false, "lamp: could not write ", path, ": ", what, ": ",
              reason(error), ". ", path, " keeps its previous content; ", fix,
              ", then run again.");
}

// Writes all of `size` bytes, retrying short writes and EINTR; returns 0 or
// the errno of the write that failed, with `written` the bytes that made it.
int write_all(int fd, const char* data, size_t size, size_t& written) {
  // Chunks of 16 MiB: a signal or a slow device interrupts little at a time.
  constexpr size_t kChunk = size_t{16} << 20;
  written = 0;
  while (written < size) {
    const ssize_t n =
        ::write(fd, data + written, std::min(kChunk, size - written));
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return errno;
    }
    if (n == 0) {
      return EIO;
    }
    written += static_cast<size_t>(n);
  }
  return 0;
}

// Reads the file back and compares it with what was written: the data that
// reached the file system, not the buffer, is what a resume will see.
bool reads_back_the_same(int fd, const std::string& bytes) {
  struct stat info {};
  if (::fstat(fd, &info) != 0 ||
      static_cast<uint64_t>(info.st_size) != bytes.size()) {
    return false;
  }
  std::string chunk(size_t{1} << 20, '\0');
  size_t offset = 0;
  while (offset < bytes.size()) {
    const size_t want = std::min(chunk.size(), bytes.size() - offset);
    const ssize_t n = ::pread(fd, &chunk[0], want, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0 || std::memcmp(chunk.data(), bytes.data() + offset,
                              static_cast<size_t>(n)) != 0) {
      return false;
    }
    offset += static_cast<size_t>(n);
  }
  return true;
}

// A name next to `path` that no other write uses, with the infix that
// remove_stale_temporaries() looks for.
std::string temporary_name(const std::string& path) {
  static std::atomic<uint64_t> writes{0};
  return path + kTemporaryInfix + std::to_string(::getpid()) + "-" +
         std::to_string(++writes);
}

// Tries at most this many temporary names beside a path: a name that exists
// (a killed run's with this process's pid, usual in containers, where the
// trainer is pid 1 every time) is passed over for the next.
constexpr int kTemporaryNameTries = 1000;

// Creates a new temporary file beside `path` (O_EXCL) under the first free
// name, given in `name`; -1 with errno set where none could be created.
int create_temporary(const std::string& path, std::string& name) {
  for (int attempt = 0; attempt < kTemporaryNameTries; ++attempt) {
    name = temporary_name(path);
    const int fd =
        ::open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) {
      return fd;
    }
  }
  return -1; // errno is EEXIST
}

// Removes PATH.tmp-* files in PATH's folder, and the temporaries of its
// ranks' shard files (PATH.rank<r>-of-<n>.step<s>.tmp-*): called by the
// lock's holder, when no other live run can be writing one.
void remove_stale_temporaries(const std::string& path) {
  const std::string prefix = base_name(path) + kTemporaryInfix;
  const std::string shard_prefix = base_name(path) + ".rank";
  const std::string folder = parent_folder(path);
  for (const auto& name : folder_names(folder)) {
    const bool shard_temporary =
        name.compare(0, shard_prefix.size(), shard_prefix) == 0 &&
        name.find(kTemporaryInfix, shard_prefix.size()) != std::string::npos;
    if (name.compare(0, prefix.size(), prefix) == 0 || shard_temporary) {
      ::unlink(join_path(folder, name).c_str());
    }
  }
}

} // namespace

namespace detail {

// The names written beside `path` (`longest_suffix`, then a temporary
// file's, whose counter is given all the digits of a uint64; ".lock" is
// shorter) must fit the folder's file system, or the first write fails
// after an epoch of training.
void check_name_length(const std::string& path, const std::string& what,
                       const std::string& longest_suffix) {
  const long name_max = ::pathconf(parent_folder(path).c_str(), _PC_NAME_MAX);
  if (name_max <= 0) {
    return; // no limit, or none the system can tell
  }
  const std::string name = base_name(path);
  const std::string suffix =
      longest_suffix + kTemporaryInfix + std::to_string(::getpid()) + "-" +
      std::to_string(std::numeric_limits<uint64_t>::max());
  const size_t longest = name.size() + suffix.size();
  TORCH_CHECK(longest <= static_cast<size_t>(name_max), "lamp: ", what, " ",
              path, ": its file name is ", name.size(),
              " characters, and the temporary file written beside it (", name,
              longest_suffix, kTemporaryInfix, "<pid>-<n>) can take ", longest,
              ", more than the ", name_max,
              " characters its file system allows (NAME_MAX of ",
              parent_folder(path), "); use a file name of at most ",
              name_max - static_cast<long>(suffix.size()), " characters.");
}

std::string read_regular_file(const std::string& path) {
  struct stat info {};
  TORCH_CHECK(::stat(path.c_str(), &info) == 0, "lamp: cannot read ", path,
              ": ", reason(errno), ".");
  TORCH_CHECK(S_ISREG(info.st_mode), "lamp: ", path,
              " is not a regular file; give the path of a checkpoint file.");
  const uint64_t memory = lamp::detail::physical_memory_bytes();
  TORCH_CHECK(
      static_cast<uint64_t>(info.st_size) < memory, "lamp: ", path, " is ",
      info.st_size, " bytes, more than this machine's ", memory,
      " bytes of memory: it is not a checkpoint lamp wrote, or it is damaged.");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "lamp: cannot open ", path, ": ", reason(errno), ".");
  std::string bytes(static_cast<size_t>(info.st_size), '\0');
  size_t offset = 0;
  int error = 0;
  while (offset < bytes.size()) {
    const ssize_t n = ::read(fd, &bytes[offset], bytes.size() - offset);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      error = n < 0 ? errno : 0;
      break;
    }
    offset += static_cast<size_t>(n);
  }
  ::close(fd);
  TORCH_CHECK(offset == bytes.size(), "lamp: cannot read ", path, " (", offset,
              " of ", bytes.size(), " bytes",
              error != 0 ? ": " + reason(error) : std::string(), ").");
  return bytes;
}

} // namespace detail

std::string io_error_text(int error) {
  std::string text = std::strerror(error);
  if (error == ENOSPC) {
    text += " (the disk is full)";
  } else if (error == EDQUOT) {
    text += " (the disk quota is used up)";
  }
  struct rlimit limit {};
  if (error == EFBIG && ::getrlimit(RLIMIT_FSIZE, &limit) == 0 &&
      limit.rlim_cur != RLIM_INFINITY) {
    text += " (this process may write files of at most " +
            std::to_string(limit.rlim_cur) +
            " bytes: ulimit -f; raise the limit)";
  }
  return text;
}

uint32_t crc32(const void* data, size_t size) {
  // zlib's crc32 takes an unsigned int length: larger buffers in pieces.
  uLong crc = ::crc32(0L, Z_NULL, 0);
  const auto* bytes = static_cast<const Bytef*>(data);
  while (size > 0) {
    const auto n = static_cast<uInt>(
        std::min<size_t>(size, std::numeric_limits<uInt>::max()));
    crc = ::crc32(crc, bytes, n);
    bytes += n;
    size -= n;
  }
  return static_cast<uint32_t>(crc);
}

void check_checkpoint_path(const std::string& path, const std::string& what) {
  TORCH_CHECK(!path.empty(), "lamp: ", what, " is empty; give a file path.");
  const std::string folder = parent_folder(path);
  struct stat info {};
  TORCH_CHECK(::stat(folder.c_str(), &info) == 0 && S_ISDIR(info.st_mode),
              "lamp: ", what, " ", path, ": the folder ", folder,
              " does not exist; create it or choose another path.");
  detail::check_name_length(path, what, "");
  if (::lstat(path.c_str(), &info) == 0) {
    TORCH_CHECK(
        S_ISREG(info.st_mode), "lamp: ", what, " ", path,
        " exists and is not a regular file (",
        S_ISLNK(info.st_mode)                            ? "a symbolic link"
        : S_ISDIR(info.st_mode)                          ? "a folder"
        : S_ISFIFO(info.st_mode)                         ? "a FIFO"
        : S_ISCHR(info.st_mode) || S_ISBLK(info.st_mode) ? "a device"
                                                         : "a special file",
        "); lamp writes a new file and renames it over the old one, which would replace it. Give the path of a regular file.");
  }
}

namespace {

// A new file beside `path`, removed when the result goes: proof that files
// can be created in the folder (an existing one, such as a lock file, may
// open in a folder that allows no new one).
std::unique_ptr<TemporaryFile> create_beside(const std::string& path,
                                             const std::string& what) {
  std::string temporary;
  const int fd = create_temporary(path, temporary);
  TORCH_CHECK(fd >= 0, "lamp: ", what, " ", path,
              ": cannot create a file in its folder (", reason(errno),
              "); make the folder writable or choose another path.");
  return std::make_unique<TemporaryFile>(temporary, fd);
}

} // namespace

void check_writable_path(const std::string& path, const std::string& what) {
  check_checkpoint_path(path, what);
  const auto probe = create_beside(path, what);
  const int fd = probe->fd();
  // One block written and synced: a folder on a full disk (or over quota)
  // fails now. It cannot promise the space the file will need later.
  const std::string block(4096, '\0');
  size_t written = 0;
  int error = write_all(fd, block.data(), block.size(), written);
  if (error == 0 && ::fsync(fd) != 0) {
    error = errno;
  }
  TORCH_CHECK(error == 0, "lamp: ", what, " ", path,
              ": a test write of 4096 bytes in its folder failed (",
              reason(error), "); free space or choose another path.");
}

namespace {

// Makes the rename of `path` durable: fsyncs its folder.
void sync_folder_of(const std::string& path) {
  // The rename is durable once the folder is: fsync it (file systems that
  // cannot sync a folder say EINVAL, and have nothing to sync). Only a
  // descriptor opened for reading can be synced (fsync on an O_PATH one
  // fails with EBADF), and a folder that may be written but not read
  // (mode 0300) refuses that: the file is written, but not durably.
  const std::string folder = parent_folder(path);
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    const int error = errno;
    TORCH_CHECK(error == EACCES || error == EPERM, "lamp: wrote ", path,
                " but could not open its folder to sync it: ", reason(error),
                "; the new file may not survive a power loss.");
    TORCH_WARN_ONCE(
        "lamp: wrote ", path, " but could not sync its folder ", folder, " (",
        reason(error),
        ": it may be written but not read), so the new file may not survive a power loss. Give this user read permission on the folder (chmod u+r on a folder of yours) to make lamp's writes durable. (Shown once per process.)");
    return;
  }
  const int rc = ::fsync(dir);
  const int error = errno;
  ::close(dir);
  TORCH_CHECK(rc == 0 || error == EINVAL, "lamp: wrote ", path,
              " but could not sync its folder: ", reason(error),
              "; the new file may not survive a power loss.");
}

} // namespace

void write_file_atomically(const std::string& path, const std::string& bytes) {
  detail::StreamingFile file(path);
  file.write(bytes.data(), bytes.size());
  file.commit(&bytes);
}

namespace detail {

// Its state: the temporary file's descriptor (-1 once closed) and name,
// removed unless renamed into place.
struct StreamingFile::Impl {
  std::string path;
  std::string temporary;  // its name, once it has one
  std::string written_to; // what error messages call it
  int fd = -1;
  bool unnamed = false; // no name until commit() links it as `temporary`
  bool named = false;   // `temporary` is this object's own file
  uint64_t size = 0;
  bool committed = false;
};

StreamingFile::StreamingFile(const std::string& path, bool unnamed)
    : impl_(std::make_unique<Impl>()) {
  check_checkpoint_path(path, "file");
  impl_->path = path;
  impl_->temporary = temporary_name(path);
  impl_->written_to = impl_->temporary;
#ifdef O_TMPFILE
  // commit() names it through /proc/self/fd: where /proc is not mounted, a
  // named one.
  if (unnamed && ::access("/proc/self/fd", F_OK) == 0) {
    const std::string folder = parent_folder(path);
    impl_->fd = ::open(folder.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0666);
    impl_->unnamed = impl_->fd >= 0;
    if (impl_->unnamed) {
      impl_->written_to = "an unnamed temporary file in " + folder;
      return;
    }
    // EOPNOTSUPP (a file system without them), EISDIR or EINVAL (a kernel
    // older than 3.11) and the rest: a named one, whose open() says what
    // is wrong if anything is.
  }
#else
  (void)unnamed;
#endif
  impl_->fd = create_temporary(path, impl_->temporary);
  if (impl_->fd < 0) {
    write_failed(path, "cannot create " + impl_->temporary, errno);
  }
  impl_->named = true;
  impl_->written_to = impl_->temporary;
}

StreamingFile::~StreamingFile() {
  if (impl_->fd >= 0) {
    ::close(impl_->fd);
  }
  // Only a name this object made: another file of that name is not ours.
  if (!impl_->committed && impl_->named) {
    ::unlink(impl_->temporary.c_str());
  }
}

void StreamingFile::write(const void* data, size_t size) {
  TORCH_CHECK(!impl_->committed, "lamp: ", impl_->path,
              " is committed; nothing more can be written to it.");
  size_t written = 0;
  if (const int error =
          write_all(impl_->fd, static_cast<const char*>(data), size, written)) {
    write_failed(impl_->path,
                 "wrote " + std::to_string(impl_->size + written) + " of " +
                     std::to_string(impl_->size + size) + " bytes to " +
                     impl_->written_to,
                 error);
  }
  impl_->size += size;
}

uint64_t StreamingFile::size() const {
  return impl_->size;
}

void StreamingFile::commit(const std::string* written) {
  TORCH_CHECK(!impl_->committed, "lamp: ", impl_->path,
              " is committed already.");
  const std::string& path = impl_->path;
  const std::string& temporary = impl_->temporary;
  const int fd = impl_->fd;
  if (::fsync(fd) != 0) {
    write_failed(path, "fsync of " + impl_->written_to + " failed", errno);
  }
  TORCH_CHECK(
      written == nullptr || reads_back_the_same(fd, *written),
      "lamp: could not write ", path, ": ", impl_->written_to,
      " does not read back as written (the storage lost or changed data). ",
      path, " keeps its previous content.");
  if (impl_->unnamed) {
    // Named through /proc (AT_EMPTY_PATH would need CAP_DAC_READ_SEARCH),
    // then renamed as a named one: linkat() cannot replace a file.
    const std::string self = "/proc/self/fd/" + std::to_string(fd);
    int linked = -1;
    for (int attempt = 0; attempt < kTemporaryNameTries; ++attempt) {
      if (attempt > 0) {
        impl_->temporary = temporary_name(path); // that one exists
      }
      linked = ::linkat(AT_FDCWD, self.c_str(), AT_FDCWD,
                        impl_->temporary.c_str(), AT_SYMLINK_FOLLOW);
      if (linked == 0 || errno != EEXIST) {
        break;
      }
    }
    if (linked != 0) {
      const int error = errno;
      write_failed(path,
                   "cannot give " + impl_->written_to + " the name " +
                       temporary + " (through " + self +
                       ", which needs /proc mounted)",
                   error);
    }
    impl_->unnamed = false;
    impl_->named = true;
  }
  const int rc = ::close(impl_->fd);
  impl_->fd = -1;
  if (rc != 0) {
    write_failed(path, "closing " + temporary + " failed", errno);
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    write_failed(path, "cannot rename " + temporary + " over it", errno);
  }
  impl_->committed = true;
  sync_folder_of(path);
}

} // namespace detail

namespace {

// Where an archive's bytes are written in memory. It never throws into
// LibTorch's zip writer: one that fails part-way is finalized again by its
// destructor (LibTorch 1.13), which then throws too and ends the process.
// An allocation that fails is remembered, the rest of the bytes dropped,
// and bytes() throws it once the writer is done.
class MemorySink {
 public:
  size_t write(const void* data, size_t size) {
    if (!failed_) {
      try {
        bytes_.append(static_cast<const char*>(data), size);
      } catch (const std::bad_alloc&) {
        failed_ = true;
        std::string().swap(bytes_);
      }
    }
    return size;
  }
  std::function<size_t(const void*, size_t)> writer() {
    return [this](const void* data, size_t size) { return write(data, size); };
  }
  std::string& bytes() {
    if (failed_) {
      throw std::bad_alloc();
    }
    return bytes_;
  }

 private:
  std::string bytes_;
  bool failed_ = false;
};

uint32_t save_in_memory_then_write(torch::serialize::OutputArchive& archive,
                                   const std::string& path) {
  MemorySink archive_sink;
  archive.save_to(archive_sink.writer());
  auto& payload = archive_sink.bytes();
  torch::serialize::OutputArchive envelope;
  envelope.write(kEnvelopeKey, c10::IValue(std::string(kEnvelope)));
  envelope.write("payload_bytes",
                 c10::IValue(static_cast<int64_t>(payload.size())));
  const uint32_t crc = crc32(payload.data(), payload.size());
  envelope.write("payload_crc32", c10::IValue(static_cast<int64_t>(crc)));
  envelope.write(
      "payload",
      torch::from_blob(&payload[0], {static_cast<int64_t>(payload.size())},
                       torch::kUInt8));
  MemorySink envelope_sink;
  envelope.save_to(envelope_sink.writer());
  write_file_atomically(path, envelope_sink.bytes());
  return crc;
}

} // namespace

uint32_t save_checked_archive(torch::serialize::OutputArchive& archive,
                              const std::string& path) {
  // The checkpoint is built in memory twice (the archive, then the envelope
  // holding it) before it is written: a host that cannot hold that says so
  // in lamp's words, the previous checkpoint left as it was.
  return with_memory_context(
      "the checkpoint " + path +
          " in host memory (twice its size, before "
          "it is written; the previous checkpoint is left as it was)",
      -1, [&] { return save_in_memory_then_write(archive, path); });
}

uint32_t load_checked_archive(torch::serialize::InputArchive& archive,
                              const std::string& path) {
  const std::string bytes = detail::read_regular_file(path);
  torch::serialize::InputArchive envelope;
  // A damaged zip can make the reader throw anything, including bad_alloc
  // for a size read from flipped bits: all of it means "damaged".
  const auto damaged = [&path](const std::string& what) {
    TORCH_CHECK(
        false, "lamp: ", path,
        " is damaged or not a checkpoint written by lamp (", what,
        "). Give an intact copy of it (a resume, --init-from), or start "
        "a new run.");
  };
  TORCH_CHECK(!detail::is_torch_save_zip(bytes), "lamp: ", path,
              " is a state dict in PyTorch's own format (written by "
              "--export-state-dict or Python's torch.save), not a lamp "
              "checkpoint: it is for Python (torch.load, then "
              "model.load_state_dict). --resume and --init-from take the "
              "checkpoints that --checkpoint writes.");
  try {
    envelope.load_from(bytes.data(), bytes.size(), torch::Device(torch::kCPU));
  } catch (const c10::Error& e) {
    damaged(e.what_without_backtrace());
  } catch (const std::exception& e) {
    damaged(e.what());
  }
  c10::IValue value;
  if (!envelope.try_read(kEnvelopeKey, value)) {
    // An archive without the envelope: lamp's first checkpoint format.
    TORCH_CHECK(
        !envelope.try_read("format", value) || !value.isString(),
        "lamp: ", path, " is a '", value.toStringRef(),
        "' checkpoint from an earlier lamp, written without a checksum; this lamp resumes only checkpoints it can verify. Start a new run.");
    damaged("no lamp envelope");
  }
  if (!value.isString() || value.toStringRef() != kEnvelope) {
    damaged("unknown envelope");
  }
  c10::IValue size_value, crc_value;
  torch::Tensor payload;
  try {
    envelope.read("payload_bytes", size_value);
    envelope.read("payload_crc32", crc_value);
    envelope.read("payload", payload);
  } catch (const c10::Error& e) {
    damaged(e.what_without_backtrace());
  }
  if (!size_value.isInt() || !crc_value.isInt() ||
      payload.scalar_type() != torch::kUInt8 || payload.dim() != 1 ||
      !payload.is_contiguous()) {
    damaged("malformed envelope");
  }
  if (payload.numel() != size_value.toInt()) {
    damaged("the payload has " + std::to_string(payload.numel()) +
            " bytes, the envelope says " + std::to_string(size_value.toInt()));
  }
  const uint32_t crc =
      crc32(payload.data_ptr(), static_cast<size_t>(payload.numel()));
  if (static_cast<int64_t>(crc) != crc_value.toInt()) {
    damaged("checksum mismatch: CRC-32 " + std::to_string(crc) +
            " where the checkpoint recorded " +
            std::to_string(crc_value.toInt()));
  }
  try {
    archive.load_from(static_cast<const char*>(payload.data_ptr()),
                      static_cast<size_t>(payload.numel()),
                      torch::Device(torch::kCPU));
  } catch (const c10::Error& e) {
    damaged(e.what_without_backtrace());
  }
  return crc;
}

CheckpointLock::CheckpointLock(const std::string& path)
    : lock_path_(path + ".lock") {
  check_checkpoint_path(path, "checkpoint");
  // The lock file may be removed by its previous holder between our open and
  // our flock: then the lock is on a file no one else will find, so open the
  // path again until the file locked is the one the path names.
  for (int attempt = 0;; ++attempt) {
    // Not through a symbolic link: truncating the lock would write over
    // whatever it points at.
    fd_ = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
                 0666);
    const int open_error = errno;
    TORCH_CHECK(fd_ >= 0 || open_error != ELOOP, "lamp: ", lock_path_,
                " is a symbolic link; the checkpoint's lock file must be a "
                "file of its own: remove the link.");
    TORCH_CHECK(fd_ >= 0 || open_error != EISDIR, "lamp: ", lock_path_,
                " is a folder; the checkpoint's lock file takes that name: "
                "remove or rename the folder.");
    TORCH_CHECK(
        fd_ >= 0 || open_error != EACCES ||
            lamp::detail::path_kind(lock_path_) !=
                lamp::detail::PathKind::kFile,
        "lamp: cannot open the lock file ", lock_path_, ": ",
        reason(open_error),
        ". Another user's run may have left it (its run wrote the pid in "
        "it): remove it if no run writes to ",
        path, ".");
    TORCH_CHECK(
        fd_ >= 0, "lamp: cannot create the lock file ", lock_path_,
        " for the checkpoint ", path, ": ", reason(open_error),
        ". Checkpoints are written into that folder; make it writable or choose another path.");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      char owner[32] = {0};
      const ssize_t n = ::pread(fd_, owner, sizeof(owner) - 1, 0);
      ::close(fd_);
      fd_ = -1;
      TORCH_CHECK(
          error != EWOULDBLOCK, "lamp: another run (pid ",
          n > 0 ? std::string(owner, static_cast<size_t>(n)) : "unknown",
          ") is writing checkpoints to ", path,
          "; two runs would overwrite each other's. Wait for it to end or choose another checkpoint path.");
      // A file system without flock() (Lustre without -o flock, NFS
      // without a lock manager) answers so.
      TORCH_CHECK(false, "lamp: cannot lock ", lock_path_, ": ", reason(error),
                  error == ENOSYS || error == ENOLCK || error == EOPNOTSUPP ||
                          error == EINVAL
                      ? ". Its file system takes no file locks (Lustre "
                        "mounted without -o flock, NFS without a lock "
                        "manager): mount it with locking, or write "
                        "checkpoints to a local folder."
                      : ".");
    }
    struct stat held {
    }, named{};
    if (::fstat(fd_, &held) == 0 && ::stat(lock_path_.c_str(), &named) == 0 &&
        held.st_ino == named.st_ino && held.st_dev == named.st_dev) {
      break;
    }
    ::close(fd_);
    fd_ = -1;
    TORCH_CHECK(attempt < 100, "lamp: cannot take the lock ", lock_path_,
                ": it keeps being replaced by another process.");
  }
  // Held: any temporary file beside the checkpoint is a killed run's.
  remove_stale_temporaries(path);
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) !=
                                      static_cast<ssize_t>(pid.size())) {
    const int error = errno;
    ::close(fd_);
    fd_ = -1;
    TORCH_CHECK(false, "lamp: cannot write the lock file ", lock_path_, ": ",
                reason(error),
                ". Free space or choose another checkpoint folder.");
  }
  // A lock file a killed run left opens without creating anything: the
  // folder's writability is shown by a file created in it (nothing written
  // to it), now, not by the first checkpoint's write an epoch later.
  try {
    create_beside(path, "checkpoint");
  } catch (...) {
    ::unlink(lock_path_.c_str());
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

CheckpointLock::~CheckpointLock() {
  if (fd_ >= 0) {
    // Removed while still held, so no other run can take a lock on a file
    // that is about to disappear and then find the folder without one.
    ::unlink(lock_path_.c_str());
    ::close(fd_);
  }
}

} // namespace lamp
