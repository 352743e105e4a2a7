// Fault injection against checkpoint writing and reading (ctest label
// `faults`). Runs with liblamp_fail_io preloaded (fail_io.c), which makes
// writes, fsync, close or open fail on the checkpoint's files on request:
// a full disk at every offset of the file, failing syncs, a folder that
// cannot be written, a second run on the same checkpoint, and damaged bytes
// everywhere in it. Each case asserts a clear message naming the problem and
// the last good checkpoint byte for byte. And a folder that may be written
// but not read, whose sync after the rename cannot be done.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <dirent.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "lamp/platform/checkpoint_file.h"
#include "trainer_util.h"

extern "C" int lamp_fail_io_loaded(void) __attribute__((weak));

namespace {

using lamp::training::TrainerOptions;
using lamp_test::error_of;
using lamp_test::file_bytes;
using lamp_test::make_run;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::set<std::string> folder_entries(const std::string& folder) {
  std::set<std::string> names;
  DIR* dir = ::opendir(folder.c_str());
  while (const dirent* entry = dir != nullptr ? ::readdir(dir) : nullptr) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") {
      names.insert(name);
    }
  }
  if (dir != nullptr) {
    ::closedir(dir);
  }
  return names;
}

// Sets the preloaded library's variables for one scope.
class Fault {
 public:
  Fault(const std::string& path, const char* name, const std::string& value)
      : name_(name) {
    ::setenv("LAMP_FAULT_PATH", path.c_str(), 1);
    ::setenv(name, value.c_str(), 1);
  }
  ~Fault() {
    ::unsetenv(name_);
    ::unsetenv("LAMP_FAULT_PATH");
  }
  Fault(const Fault&) = delete;
  Fault& operator=(const Fault&) = delete;

 private:
  const char* name_;
};

// Each test in its own folder, holding a good checkpoint of one epoch.
class CheckpointFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(lamp_fail_io_loaded, nullptr)
        << "run with LD_PRELOAD naming liblamp_fail_io (ctest does)";
    std::string pattern = ::testing::TempDir() + "lamp_faults_XXXXXX";
    ASSERT_NE(::mkdtemp(&pattern[0]), nullptr);
    folder_ = pattern;
    checkpoint_ = folder_ + "/run.pt";
    run_ = make_run(lamp::Precision::kAMPBF16, options().max_steps(6));
    run_->trainer->fit();
    good_ = file_bytes(checkpoint_);
    ASSERT_GT(good_.size(), 1000u);
  }
  void TearDown() override {
    run_.reset();
    for (const auto& name : folder_entries(folder_)) {
      ::unlink((folder_ + "/" + name).c_str());
    }
    ::rmdir(folder_.c_str());
  }

  TrainerOptions options() const {
    return TrainerOptions().epochs(2).checkpoint(checkpoint_);
  }

  // The checkpoint is the good one, and nothing else is left in the folder
  // but the live run's lock.
  void expect_intact(const std::string& context) const {
    EXPECT_TRUE(file_bytes(checkpoint_) == good_) << context;
    EXPECT_EQ(folder_entries(folder_),
              (std::set<std::string>{"run.pt", "run.pt.lock"}))
        << context;
  }

  std::string folder_, checkpoint_, good_;
  std::unique_ptr<lamp_test::Run> run_;
};

// A disk that fills up at byte N of the new checkpoint, for N over the whole
// file: a clear error, the old checkpoint unchanged, no temporary file left.
TEST_F(CheckpointFaults, FullDiskAtAnyOffsetKeepsTheLastCheckpoint) {
  const size_t size = good_.size();
  std::set<size_t> offsets = {0, 1, size / 2, size - 1};
  for (size_t n = 0; n < size; n += size / 61 + 1) {
    offsets.insert(n);
  }
  for (size_t n = size - 64; n < size; n += 7) {
    offsets.insert(n); // the zip's central directory and end record
  }
  for (const size_t n : offsets) {
    const Fault fault(checkpoint_, "LAMP_FAULT_WRITE_AFTER", std::to_string(n));
    const auto message =
        error_of([&] { run_->trainer->save_checkpoint(checkpoint_); });
    EXPECT_NE(message.find("No space left on device"), std::string::npos)
        << "at byte " << n << ": " << message;
    EXPECT_NE(message.find(checkpoint_ + " keeps its previous content"),
              std::string::npos)
        << message;
    expect_intact("full at byte " + std::to_string(n));
  }
  EXPECT_GE(offsets.size(), 60u);
  // Short writes (a legal outcome of write(2)) are completed, not lost.
  {
    const Fault fault(checkpoint_, "LAMP_FAULT_WRITE_CHUNK", "1000");
    run_->trainer->save_checkpoint(checkpoint_);
  }
  EXPECT_EQ(file_bytes(checkpoint_), good_);
}

TEST_F(CheckpointFaults, FailingSyncOrCloseKeepsTheLastCheckpoint) {
  for (const char* which : {"LAMP_FAULT_FSYNC", "LAMP_FAULT_CLOSE"}) {
    const Fault fault(checkpoint_, which, "1");
    const auto message =
        error_of([&] { run_->trainer->save_checkpoint(checkpoint_); });
    EXPECT_NE(message.find("Input/output error"), std::string::npos)
        << which << ": " << message;
    EXPECT_NE(
        message.find(std::string(which) == "LAMP_FAULT_FSYNC" ? "fsync"
                                                              : "closing"),
        std::string::npos)
        << message;
    expect_intact(which);
  }
}

// The folder is checked before training: no epoch is spent on a run whose
// checkpoint cannot be written.
TEST_F(CheckpointFaults, UnwritableFolderFailsBeforeTraining) {
  run_.reset(); // releases the lock
  const Fault fault(checkpoint_, "LAMP_FAULT_OPEN", "1");
  const auto message =
      error_of([&] { make_run(lamp::Precision::kAMPBF16, options()); });
  EXPECT_NE(
      message.find("cannot create the lock file " + checkpoint_ + ".lock"),
      std::string::npos)
      << message;
  EXPECT_NE(message.find("Permission denied"), std::string::npos) << message;
  EXPECT_EQ(file_bytes(checkpoint_), good_);
}

// A lock file a killed run left in a folder that has become read-only opens
// without creating anything: the folder is still refused before training,
// and a write refused for permission says to make the folder writable, not
// to free space.
TEST_F(CheckpointFaults, AStaleLockInAnUnwritableFolderFailsBeforeTraining) {
  run_.reset(); // releases the lock
  write_bytes(checkpoint_ + ".lock", "999999");
  {
    const Fault fault(checkpoint_, "LAMP_FAULT_OPEN", "2");
    lamp_test::expect_error(
        [&] { make_run(lamp::Precision::kAMPBF16, options()); },
        "checkpoint " + checkpoint_ +
            ": cannot create a file in its folder (Permission denied); make "
            "the folder writable");
  }
  EXPECT_EQ(file_bytes(checkpoint_), good_);
  const Fault fault(checkpoint_, "LAMP_FAULT_OPEN", "1");
  lamp_test::expect_error(
      [&] { lamp::write_file_atomically(checkpoint_, "new content"); },
      "Permission denied. " + checkpoint_ +
          " keeps its previous content; make the folder writable or choose "
          "another folder");
  EXPECT_EQ(file_bytes(checkpoint_), good_);
}

// Two live runs on one checkpoint: the second is refused, naming the first's
// pid. A lock left by a killed run is stale and taken over, and the
// temporary files a killed writer left are removed.
TEST_F(CheckpointFaults, ASecondRunOnTheSameCheckpointIsRefused) {
  const auto message = error_of([&] {
    make_run(lamp::Precision::kAMPBF16, options().resume(checkpoint_));
  });
  EXPECT_NE(
      message.find("another run (pid " + std::to_string(::getpid()) + ")"),
      std::string::npos)
      << message;
  expect_intact("refused second run");

  run_.reset();
  EXPECT_EQ(folder_entries(folder_), std::set<std::string>{"run.pt"});
  write_bytes(checkpoint_ + ".lock", "999999"); // a dead run's lock
  write_bytes(checkpoint_ + ".tmp-999999-1",
              "partial"); // its half-written file
  run_ = make_run(lamp::Precision::kAMPBF16, options().resume(checkpoint_));
  EXPECT_EQ(file_bytes(checkpoint_ + ".lock"), std::to_string(::getpid()));
  expect_intact("stale lock taken over");
}

// Paths that are not regular files are refused before anything is written:
// renaming over /dev/full would replace the device node.
TEST_F(CheckpointFaults, NonRegularCheckpointPathsAreRefused) {
  const std::string fifo = folder_ + "/fifo.pt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string link = folder_ + "/link.pt";
  ASSERT_EQ(::symlink(checkpoint_.c_str(), link.c_str()), 0);
  for (const std::string& path :
       {std::string("/dev/full"), std::string("/dev/null"), fifo, link,
        folder_}) {
    const auto message = error_of([&] {
      make_run(lamp::Precision::kAMPBF16, TrainerOptions().checkpoint(path));
    });
    EXPECT_NE(message.find(path + " exists and is not a regular file"),
              std::string::npos)
        << message;
  }
  struct stat info {};
  ASSERT_EQ(::stat("/dev/full", &info), 0);
  EXPECT_TRUE(S_ISCHR(info.st_mode));
}

// Damage anywhere in the file: either the load fails with a message naming
// the file (the checksum, the envelope or the zip catches it), or the byte
// was one the reader never uses (zip padding) and the state loads exactly.
TEST_F(CheckpointFaults, DamageAnywhereIsDetectedOrHarmless) {
  run_.reset();
  const auto reference =
      make_run(lamp::Precision::kAMPBF16,
               TrainerOptions().epochs(2).resume(checkpoint_));
  const auto damaged = folder_ + "/damaged.pt";
  int detected = 0, harmless = 0;
  const auto check = [&](const std::string& bytes, const std::string& what) {
    write_bytes(damaged, bytes);
    std::unique_ptr<lamp_test::Run> loaded;
    const auto message = error_of([&] {
      loaded = make_run(lamp::Precision::kAMPBF16,
                        TrainerOptions().epochs(2).resume(damaged));
    });
    if (!message.empty()) {
      ++detected;
      EXPECT_NE(message.find(damaged), std::string::npos)
          << what << ": " << message;
      return;
    }
    ++harmless;
    EXPECT_EQ(loaded->trainer->start_epoch(),
              reference->trainer->start_epoch());
    const auto expected = reference->model->parameters();
    const auto actual = loaded->model->parameters();
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(lamp_test::BitEqual(actual[i], expected[i])) << what;
    }
  };
  const size_t size = good_.size();
  for (size_t at = 0; at < size; at += size / 300 + 1) {
    auto bytes = good_;
    bytes[at] = static_cast<char>(bytes[at] ^ 0x5A);
    check(bytes, "byte " + std::to_string(at) + " flipped");
  }
  // The failures seen in the field: 64 flipped bytes in the middle (inside a
  // weight tensor), a stretch filled with 0xFF, a truncated file.
  auto flipped = good_;
  for (size_t i = size / 2; i < size / 2 + 64; ++i) {
    flipped[i] = static_cast<char>(~flipped[i]);
  }
  check(flipped, "64 bytes flipped");
  auto filled = good_;
  std::fill(filled.begin() + static_cast<std::ptrdiff_t>(size / 3),
            filled.begin() + static_cast<std::ptrdiff_t>(size / 3 + 4096),
            '\xff');
  check(filled, "4 KiB of 0xFF");
  for (const size_t keep : {size_t{0}, size_t{100}, size / 2, size - 1}) {
    check(good_.substr(0, keep), "truncated to " + std::to_string(keep));
  }
  EXPECT_GE(detected, 250);
  std::cout << "damaged checkpoints: " << detected << " detected, " << harmless
            << " harmless (bytes the reader does not use)\n";
}

// A folder that may be written but not read (mode 0300): the file is
// written, but the folder's fsync after the rename needs a descriptor opened
// for reading, so the rename is not durable, which a warning says, naming
// the folder and the fix. root reads every folder: where the tests run as
// root the write runs in a child process as nobody (65534), the folder's
// owner.
TEST(CheckpointFolder, AFolderWithoutReadPermissionWarnsTheRenameIsNotDurable) {
  std::string pattern = ::testing::TempDir() + "lamp_no_read_XXXXXX";
  ASSERT_NE(::mkdtemp(&pattern[0]), nullptr);
  const std::string folder = pattern;
  const std::string path = folder + "/state.pt";
  constexpr uid_t kNobody = 65534;
  const bool root = ::geteuid() == 0;
  if (root) {
    ASSERT_EQ(::chown(folder.c_str(), kNobody, kNobody), 0);
  }
  ASSERT_EQ(::chmod(folder.c_str(), 0300), 0);
  // The child's exit status: 0 warned as expected, 1 no such warning, 2 the
  // write failed, 3 it could not run as an unprivileged user that reaches
  // the folder.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (root && (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0)) {
      ::_exit(3);
    }
    if (::access(folder.c_str(), W_OK | X_OK) != 0) {
      ::_exit(3);
    }
    int status = 1;
    try {
      const lamp_test::Warnings warnings;
      lamp::write_file_atomically(path, "written");
      const auto warned =
          warnings.containing("could not sync its folder " + folder);
      if (warned.size() == 1 &&
          warned[0].find("may not survive a power loss") != std::string::npos &&
          warned[0].find("chmod u+r") != std::string::npos) {
        status = 0;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      status = 2;
    }
    ::_exit(status);
  }
  int status = 0;
  const pid_t waited = ::waitpid(child, &status, 0);
  ::chmod(folder.c_str(), 0700);
  const std::string written = file_bytes(path);
  ::unlink(path.c_str());
  ::rmdir(folder.c_str());
  ASSERT_EQ(waited, child);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  if (WEXITSTATUS(status) == 3) {
    GTEST_SKIP() << "cannot run a write as an unprivileged user in " << folder;
  }
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "1: no warning naming the folder, 2: the write failed";
  EXPECT_EQ(written, "written");
}

} // namespace
