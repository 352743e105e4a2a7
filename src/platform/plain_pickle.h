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
#include <functional>
#include <string>

namespace lamp {
namespace detail {

/// Reads the storage a torch.save pickle names by `key` (the zip's record
/// "data/<key>"): `numel` elements of `dtype`, as a 1-D CPU tensor. The same
/// key must give the same tensor (tied weights share their storage).
using StorageLoader = std::function<at::Tensor(
    const std::string& key, c10::ScalarType dtype, int64_t numel)>;

/// The value of the pickle `data` (protocols 2 to 5), or nullopt when it
/// holds something other than plain values (tensors, other classes). With
/// `storages`, tensors are read too, as torch.save writes them
/// (torch._utils._rebuild_tensor_v2 of a typed storage, and
/// _rebuild_parameter around one): a Python state_dict (an OrderedDict of
/// tensors with its _metadata), or a checkpoint dict holding one. With
/// `objects_as_none`, every other object (a tensor, its storage, a device)
/// reads as None instead, and the plain values around it are kept: the
/// skeleton of a whole checkpoint, to find one entry in. An integer beyond
/// int64 is a c10::Error that names `where`, the key it is stored under and
/// what to do.
c10::optional<c10::IValue> read_plain_pickle(
    const char* data, size_t size, const std::string& where,
    bool objects_as_none = false, const StorageLoader& storages = {});

/// Throws a c10::Error naming `where` as damaged when a tensor in `value`
/// (itself, or inside its lists, tuples and dicts) is a view that reaches
/// beyond its storage, or whose sizes and strides overflow int64. LibTorch's
/// unpickler builds such views from a damaged file without a check;
/// read_plain_pickle() refuses them as it reads.
void check_tensor_views(const c10::IValue& value, const std::string& where);

} // namespace detail
} // namespace lamp
