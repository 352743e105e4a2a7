#pragma once

// Paths and file kinds through POSIX calls, for every part of lamp that
// names or checks files (the dataset readers, checkpoint files, the trainer).
// Not std::filesystem: programs linked with a torch wheel's LibTorch get
// its older copy of libstdc++'s std::filesystem (pytorch/pytorch#133437).

#include <cstdint>
#include <string>
#include <vector>

namespace lamp {
namespace detail {

enum class PathKind { kMissing, kFile, kDirectory, kOther };
// What is at `path`, and a regular file's size in `size` when given.
PathKind path_kind(const std::string& path, uint64_t* size = nullptr);
bool regular_file_exists(const std::string& path);
bool directory_exists(const std::string& path);
// `directory`/`name`, with one slash between.
std::string join_path(const std::string& directory, const std::string& name);
// The folder holding `path` ("." for a bare name, "/" at the root).
std::string parent_folder(const std::string& path);
// The last component of `path`.
std::string base_name(const std::string& path);
// The names in `folder` (not "." and ".."), in the order the folder lists
// them; empty where it cannot be listed.
std::vector<std::string> folder_names(const std::string& folder);
// Whether `a` and `b` name one file: the same file where either exists (by
// device and inode: "./x" and "x", a hard link, a symbolic link), else the
// same name in the same folder.
bool same_file(const std::string& a, const std::string& b);

} // namespace detail
} // namespace lamp
