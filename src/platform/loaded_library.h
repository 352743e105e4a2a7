#pragma once

// A CUDA library's functions taken from the copy LibTorch loaded (cuDNN for
// the fused BatchNorm, cuBLASLt for the MLP's epilogues): lamp links
// nothing of them, so a torch wheel's own copies stay the only ones in the
// process, whatever folder they are kept in.

#include <dlfcn.h>

#include <string>

namespace lamp {
namespace detail {

/// `soname` ("libcudnn.so.9") as the process has it loaded (dlopen with
/// RTLD_NOLOAD finds LibTorch's copy), else loaded now; nullptr where
/// neither works.
inline void* loaded_library(const std::string& soname) {
  void* library = dlopen(soname.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  return library != nullptr ? library
                            : dlopen(soname.c_str(), RTLD_LAZY | RTLD_LOCAL);
}

/// Sets `function` to `symbol` of `library`; where it is missing and
/// `unavailable` is still empty, says so there ("the loaded <what> has no
/// <symbol>").
template <typename Function>
void resolve_symbol(void* library, const char* symbol, Function& function,
                    const char* what, std::string& unavailable) {
  function = reinterpret_cast<Function>(dlsym(library, symbol));
  if (function == nullptr && unavailable.empty()) {
    unavailable = std::string("the loaded ") + what + " has no " + symbol;
  }
}

} // namespace detail
} // namespace lamp
