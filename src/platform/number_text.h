#pragma once

// Numbers as lamp's messages show them, for every layer (the trainer's
// resume checks, the replicas' settings compared across ranks).

#include <cstdint>
#include <string>

namespace lamp {
namespace detail {

/// A double as text that reads back as the same double ("0.05", not
/// "0.050000000000000003", unless that is needed to tell two apart):
/// printf's "%.15g", or "%.17g" where 15 digits do not read back. Always
/// with a decimal point, whatever locale the host program set with
/// setlocale(): the texts are stored (checkpoints' settings) and compared
/// as text.
std::string exact(double value);

/// A size in bytes as messages show it: "1.5 GiB (1610612736 bytes)", or
/// "512 bytes" below a KiB; with a decimal point in every locale.
std::string byte_count(uint64_t bytes);

} // namespace detail
} // namespace lamp
