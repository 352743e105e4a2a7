#pragma once

// A reader for the pickles of plain Python values (dicts, OrderedDicts,
// lists, tuples, strings, numbers, bools, None) that LibTorch's unpickler
// refuses: it turns a collections.OrderedDict into None (it expects one
// only inside tensors), and reads LONG1 integers of 8 bytes only (Python
// writes 2**40 in 6). load_pickle() falls back to it for files such as a
// scaler state saved as `torch.save(OrderedDict(state), path)`.

#include <ATen/core/ivalue.h>
#include <c10/util/Optional.h>

#include <cstddef>
#include <string>

namespace lamp {
namespace detail {

/// The value of the pickle `data` (protocols 2 to 5), or nullopt when it
/// holds something other than plain values (tensors, other classes). With
/// `objects_as_none`, every other object (a tensor, its storage, a device)
/// reads as None instead, and the plain values around it are kept: the
/// skeleton of a whole checkpoint, to find one entry in. An integer beyond
/// int64 is a c10::Error that names `where`, the key it is stored under and
/// what to do.
c10::optional<c10::IValue> read_plain_pickle(const char* data, size_t size,
                                             const std::string& where,
                                             bool objects_as_none = false);

} // namespace detail
} // namespace lamp
