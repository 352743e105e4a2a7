#include "platform/paths.h"

#include <dirent.h>
#include <sys/stat.h>

namespace lamp {
namespace detail {

// POSIX calls rather than std::filesystem: the PyTorch 2.x wheels export
// their own, older copy of libstdc++'s std::filesystem from libtorch.so and
// libtorch_cpu.so, which then replaces the system one in the whole program
// (pytorch/pytorch#133437); its remove_all() crashes with the 2.11 wheel.

PathKind path_kind(const std::string& path, uint64_t* size) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return PathKind::kMissing;
  }
  if (S_ISREG(st.st_mode)) {
    if (size != nullptr) {
      *size = static_cast<uint64_t>(st.st_size);
    }
    return PathKind::kFile;
  }
  return S_ISDIR(st.st_mode) ? PathKind::kDirectory : PathKind::kOther;
}

bool regular_file_exists(const std::string& path) {
  return path_kind(path) == PathKind::kFile;
}

bool directory_exists(const std::string& path) {
  return path_kind(path) == PathKind::kDirectory;
}

std::string join_path(const std::string& directory, const std::string& name) {
  if (directory.empty()) {
    return name;
  }
  return directory.back() == '/' ? directory + name : directory + "/" + name;
}

std::string parent_folder(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) {
    return ".";
  }
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string base_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool same_file(const std::string& a, const std::string& b) {
  if (a == b) {
    return true;
  }
  struct stat sa {};
  struct stat sb {};
  const bool a_there = ::stat(a.c_str(), &sa) == 0;
  const bool b_there = ::stat(b.c_str(), &sb) == 0;
  if (a_there || b_there) {
    return a_there && b_there && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
  }
  // Neither written yet: the same name in the same folder.
  return base_name(a) == base_name(b) &&
         ::stat(parent_folder(a).c_str(), &sa) == 0 &&
         ::stat(parent_folder(b).c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

std::vector<std::string> folder_names(const std::string& folder) {
  std::vector<std::string> names;
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) {
    return names;
  }
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") {
      names.push_back(name);
    }
  }
  ::closedir(dir);
  return names;
}

} // namespace detail
} // namespace lamp
