#pragma once

// A CUDA library's functions taken from the copy LibTorch loaded (cuDNN for
// the fused BatchNorm and the folded convolutions, cuBLASLt for the MLP's
// epilogues): lamp links nothing of them and loads no copy of its own, so a
// torch wheel's own copies stay the only ones in the process, whatever
// folder they are kept in.

#include <dlfcn.h>

#include <string>

namespace lamp {
namespace detail {

/// `soname` ("libcudnn.so.9") as the process has it loaded already (dlopen
/// with RTLD_NOLOAD finds LibTorch's copy), or nullptr: never a copy of its
/// own. lamp's calls take ATen's handles (cuDNN's) or run beside ATen's
/// products (cuBLASLt's), so a second copy, of another version than
/// LibTorch's, would be handed another library's handles. A CUDA LibTorch
/// loads both at start (they are among libtorch_cuda.so's NEEDED).
inline void* loaded_library(const std::string& soname) {
  return dlopen(soname.c_str(), RTLD_LAZY | RTLD_NOLOAD);
}

/// Why `soname` cannot be used: LibTorch has not loaded it (a phrase, no
/// full stop). `what` names the library ("cuDNN"), `version` the major
/// version lamp was built for.
inline std::string not_loaded_reason(const std::string& soname,
                                     const char* what, int version) {
  return "LibTorch has not loaded " + soname + " (the " + what +
         " this lamp was built for, version " + std::to_string(version) +
         "; lamp uses LibTorch's copy, never one of its own)";
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
