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
#include <cstdint>
#include <functional>
#include <string>

namespace lamp {
namespace detail {

/// Reads the storage a torch.save pickle names by `key` (the zip's record
/// "data/<key>"): `numel` elements of `dtype`, as a 1-D CPU tensor. The same
/// key must give the same tensor (tied weights share their storage).
using StorageLoader = std::function<at::Tensor(
    const std::string& key, c10::ScalarType dtype, int64_t numel)>;

/// The most containers (lists, tuples, dicts) an unpickled value may hold
/// one inside another. State dicts and checkpoints nest a few levels;
/// Python's pickler stops near its recursion limit (1000 by default); and
/// an IValue is freed recursively, one stack frame or more per level, so a
/// value nested without bound could overflow the stack of the thread that
/// drops it.
constexpr int64_t kMaxPickleNesting = 1000;

/// The value of the pickle `data` (protocols 2 to 5, and the LIST and DICT
/// opcodes of protocols 0 and 1, which LibTorch's unpickler reads too), or
/// nullopt when it holds something other than plain values (tensors, other
/// classes). With
/// `storages`, tensors are read too, as torch.save writes them
/// (torch._utils._rebuild_tensor_v2 of a typed storage, and
/// _rebuild_parameter around one): a Python state_dict (an OrderedDict of
/// tensors with its _metadata), or a checkpoint dict holding one. With
/// `objects_as_none`, every other object (a tensor, its storage, a device)
/// reads as None instead, and the plain values around it are kept: the
/// skeleton of a whole checkpoint, to find one entry in. An integer beyond
/// int64 is a c10::Error that names `where`, the key it is stored under and
/// what to do; so is a value that check_unpickled() refuses, and containers
/// nested more than kMaxPickleNesting deep anywhere in what the read built
/// (values it dropped, or built before it found what it does not read and
/// returned nullopt).
c10::optional<c10::IValue> read_plain_pickle(
    const char* data, size_t size, const std::string& where,
    bool objects_as_none = false, const StorageLoader& storages = {});

/// Throws a c10::Error naming `where` when `value` holds a list, tuple or
/// dict that contains itself (directly or through others), containers
/// nested more than kMaxPickleNesting deep, or a tensor that is a view
/// reaching beyond its storage or whose sizes and strides overflow int64.
/// Pickles can hold all three (a memo entry read back inside its own
/// container; an opcode stream of any depth; a damaged file), and LibTorch's
/// unpickler builds them without a check. Shared containers (tied weights,
/// one list under two keys) are walked once and are no cycle.
/// \warning A refused value is taken apart before the error is thrown (its
/// lists and dicts emptied, its tuples' items set to None, one container at
/// a time), so that freeing it needs no recursion as deep as its nesting,
/// and a container that holds itself is freed at all: whoever shares it
/// sees it empty.
void check_unpickled(const c10::IValue& value, const std::string& where);

} // namespace detail
} // namespace lamp
