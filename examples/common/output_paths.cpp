#include "output_paths.h"

#include <c10/util/Exception.h>
#include <libgen.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

namespace lamp_examples {
namespace {

// How messages name the best checkpoint, which no flag of its own names.
const char* const kBestCopy = "--checkpoint's best copy";

// A path the run reads or writes, and how to tell it from the others.
struct NamedPath {
  std::string flag; // "--log-json", "--data" for a data file, kBestCopy
  std::string path;
  bool written = false;
  bool exists = false; // then `device` and `inode` identify it
  dev_t device = 0;
  ino_t inode = 0;
  std::string folder; // the real path of its folder (as given if none)
  std::string name;
};

NamedPath identify(std::string flag, std::string path, bool written) {
  NamedPath named;
  named.flag = std::move(flag);
  named.path = std::move(path);
  named.written = written;
  struct stat info {};
  if (::stat(named.path.c_str(), &info) == 0) {
    named.exists = true;
    named.device = info.st_dev;
    named.inode = info.st_ino;
  }
  // dirname() and basename() may change their argument: copies.
  std::string for_folder = named.path, for_name = named.path;
  const std::string folder = ::dirname(&for_folder[0]);
  named.name = ::basename(&for_name[0]);
  char* real = ::realpath(folder.c_str(), nullptr);
  named.folder = real != nullptr ? real : folder;
  std::free(real);
  return named;
}

bool same_file(const NamedPath& a, const NamedPath& b) {
  if (a.exists && b.exists) {
    return a.device == b.device && a.inode == b.inode;
  }
  return a.folder == b.folder && a.name == b.name;
}

std::string shown(const NamedPath& p) {
  return p.flag + " " + p.path;
}

// `p` is a name the checkpoint's lock or temporary files take.
void check_not_a_companion(const NamedPath& p, const NamedPath& checkpoint) {
  if (p.folder != checkpoint.folder) {
    return;
  }
  TORCH_CHECK(p.name != checkpoint.name + ".lock", shown(p),
              " is the lock file of ", shown(checkpoint),
              ", which the run creates and removes; choose another path.");
  const std::string temporary = checkpoint.name + ".tmp-";
  TORCH_CHECK(p.name.compare(0, temporary.size(), temporary) != 0, shown(p),
              " is named like a temporary file of ", shown(checkpoint), " (",
              temporary, "*), which the run removes; choose another path.");
}

// "9.9 MiB, written 2026-12-07 01:10 UTC": what tells an earlier run's
// file. Binary units, as lamp's other messages ("peak 618 MiB"), in
// integer arithmetic: a decimal point in every locale.
std::string size_and_time(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    return "unreadable";
  }
  const auto bytes = static_cast<uint64_t>(info.st_size);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  uint64_t unit_bytes = 1024;
  int unit = 0;
  while (unit < 3 && bytes >= unit_bytes * 1024) {
    unit_bytes *= 1024;
    ++unit;
  }
  const uint64_t tenths = (bytes * 10 + unit_bytes - 1) / unit_bytes;
  const std::string size = std::to_string(tenths / 10) + "." +
                           std::to_string(tenths % 10) + " " + units[unit];
  std::tm utc{};
  char when[32] = "";
  const time_t written = info.st_mtime;
  if (::gmtime_r(&written, &utc) != nullptr) {
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", &utc);
  }
  return size + ", written " + when;
}

} // namespace

void check_earlier_checkpoints(const ProgramConfig& config) {
  if (config.checkpoint.empty() || config.overwrite_checkpoint) {
    return;
  }
  const auto checkpoint = identify("--checkpoint", config.checkpoint, true);
  // Resuming --checkpoint: it and its best copy are the run's own.
  if (!config.resume.empty() &&
      same_file(checkpoint, identify("--resume", config.resume, false))) {
    return;
  }
  for (const auto& path :
       {checkpoint, identify(kBestCopy, best_checkpoint_path(config), true)}) {
    // Only a regular file can be an earlier run's checkpoint; a device, a
    // FIFO, a folder or a link is refused as a checkpoint path by the
    // trainer's own check (check_checkpoint_path), with its reason.
    struct stat info {};
    if (path.path.empty() || !path.exists ||
        ::lstat(path.path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) {
      continue;
    }
    const bool best = path.flag == kBestCopy;
    TORCH_CHECK(false, shown(path), " is there already (",
                size_and_time(path.path), "): this run would write over it",
                best ? "" : ", and it does not resume it", ". Give ",
                best ? ""
                     : "--resume " + config.checkpoint +
                           " to continue the run that wrote it, ",
                "another --checkpoint, or --overwrite-checkpoint to start "
                "anew over it.");
  }
}

void check_distinct_paths(const ProgramConfig& config,
                          const std::vector<std::string>& data_files) {
  std::vector<NamedPath> paths;
  const auto add = [&](const char* flag, const std::string& path,
                       bool written) {
    if (!path.empty()) {
      paths.push_back(identify(flag, path, written));
    }
  };
  add("--checkpoint", config.checkpoint, true);
  add(kBestCopy, best_checkpoint_path(config), true);
  add("--export-state-dict", config.export_state_dict, true);
  add("--log-json", config.log_json, true);
  add("--resume", config.resume, false);
  add("--init-from", config.init_from, false);
  for (const auto& file : data_files) {
    add("--data", file, false);
  }
  for (size_t i = 0; i < paths.size(); ++i) {
    const auto& a = paths[i];
    // Each checkpoint the run writes has a lock and temporary files.
    if (a.flag == "--checkpoint" || a.flag == kBestCopy) {
      for (size_t j = 0; j < paths.size(); ++j) {
        if (j != i) {
          check_not_a_companion(paths[j], a);
        }
      }
    }
    for (size_t j = i + 1; j < paths.size(); ++j) {
      const auto& b = paths[j];
      const bool resuming = a.flag == "--checkpoint" && b.flag == "--resume";
      if ((!a.written && !b.written) || resuming || !same_file(a, b)) {
        continue;
      }
      TORCH_CHECK(false, shown(a), " and ", shown(b),
                  " are the same file, which the run would ",
                  b.written ? "write twice" : "write over while reading it",
                  "; give each output its own path (only --resume and "
                  "--checkpoint may name the same file).");
    }
  }
}

std::string make_folders(const std::string& path) {
  for (size_t at = path.find('/', 1);; at = path.find('/', at + 1)) {
    const auto part = path.substr(0, at);
    if (!part.empty() && ::mkdir(part.c_str(), 0777) != 0 && errno != EEXIST) {
      return std::strerror(errno);
    }
    if (at == std::string::npos) {
      break;
    }
  }
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)
             ? ""
             : "something that is not a folder is there";
}

} // namespace lamp_examples
