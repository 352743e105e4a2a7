#pragma once

// Numbers as lamp's messages show them, for every layer (the trainer's
// resume checks, the replicas' settings compared across ranks).

#include <string>

namespace lamp {
namespace detail {

/// A double as text that reads back as the same double ("0.05", not
/// "0.050000000000000003", unless that is needed to tell two apart).
std::string exact(double value);

} // namespace detail
} // namespace lamp
