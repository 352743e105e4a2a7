#include "platform/plain_pickle.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace lamp {
namespace detail {
namespace {

// Whether the view (offset, size, stride) of a storage of `numel` elements
// lies within it and holds at most int64's largest number of elements;
// false, never an overflow, for any sizes and strides a damaged file gives.
bool view_fits(int64_t offset, c10::IntArrayRef size, c10::IntArrayRef stride,
               int64_t numel) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (size.size() != stride.size() || offset < 0) {
    return false;
  }
  int64_t elements = 1;
  for (size_t i = 0; i < size.size(); ++i) {
    if (size[i] < 0 || stride[i] < 0) {
      return false;
    }
    if (size[i] != 0 && elements > kMax / size[i]) {
      return false;
    }
    elements *= size[i];
  }
  if (elements == 0) {
    return true; // an empty view reaches no element
  }
  int64_t last = offset; // the last element the view reaches
  for (size_t i = 0; i < size.size(); ++i) {
    const int64_t steps = size[i] - 1;
    if (stride[i] != 0 && steps > (kMax - last) / stride[i]) {
      return false;
    }
    last += steps * stride[i];
  }
  return last < numel;
}

// Throws, naming `where` as damaged, unless the view lies within its
// storage of `numel` elements.
void check_view(int64_t offset, c10::IntArrayRef size, c10::IntArrayRef stride,
                int64_t numel, const std::string& where) {
  TORCH_CHECK(view_fits(offset, size, stride, numel), where,
              " is damaged: a tensor's sizes ", size, ", strides ", stride,
              " and offset ", offset, " reach beyond its storage of ", numel,
              " elements. Save it again in Python.");
}

// Throws, naming `where` as damaged, unless `tensor` lies within its
// storage.
void check_tensor_view(const at::Tensor& tensor, const std::string& where) {
  if (tensor.defined() && tensor.has_storage()) {
    const auto item = static_cast<size_t>(tensor.element_size());
    check_view(tensor.storage_offset(), tensor.sizes(), tensor.strides(),
               static_cast<int64_t>(tensor.storage().nbytes() / item), where);
  }
}

bool is_container(const c10::IValue& value) {
  return value.isList() || value.isTuple() || value.isGenericDict();
}

// A container's items: a list's or tuple's elements, a dict's keys and
// values, in order.
std::vector<c10::IValue> items_of(const c10::IValue& value) {
  std::vector<c10::IValue> items;
  if (value.isTuple()) {
    const auto& elements = value.toTupleRef().elements();
    items.assign(elements.begin(), elements.end());
  } else if (value.isList()) {
    const auto elements = value.toListRef();
    items.assign(elements.begin(), elements.end());
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) {
      items.push_back(entry.key());
      items.push_back(entry.value());
    }
  }
  return items;
}

// check_unpickled()'s walk, depth first with its own stack: a recursion
// would overflow the thread's stack on the nesting it is there to refuse.
// A container walked whole is remembered with its nesting (itself and the
// deepest chain below it), so that shared containers are walked once (a
// chain of lists each holding the next one twice has 2^n paths) and their
// depth still counts wherever they are reached from. `whole` false: the
// nesting alone is checked (what a read built and dropped, or built before
// it gave up: no tensors to check, and a cycle there harms nothing).
void walk_unpickled(const c10::IValue& root, const std::string& where,
                    bool whole = true) {
  struct Frame {
    const void* key;
    std::vector<c10::IValue> items;
    size_t next = 0;
    int64_t nesting = 1;
  };
  std::vector<Frame> path;
  std::unordered_set<const void*> on_path;
  std::unordered_map<const void*, int64_t> walked;
  const auto reach = [&](const c10::IValue& value) {
    if (value.isTensor()) {
      if (whole) {
        check_tensor_view(value.toTensor(), where);
      }
      return;
    }
    if (!is_container(value)) {
      return;
    }
    const void* key = value.internalToPointer();
    if (!whole && on_path.count(key) != 0) {
      return;
    }
    TORCH_CHECK(
        on_path.count(key) == 0, where,
        " holds a container that contains itself (a list, tuple or dict among its own items, directly or through others), which lamp does not read. Save it again in Python without the cycle.");
    const auto done = walked.find(key);
    const int64_t nesting = done != walked.end() ? done->second : 1;
    TORCH_CHECK(
        static_cast<int64_t>(path.size()) + nesting <= kMaxPickleNesting, where,
        " holds containers (lists, tuples, dicts) nested more than ",
        kMaxPickleNesting,
        " deep, which lamp does not read. Save it again in Python "
        "with a flatter structure.");
    if (done != walked.end()) {
      if (!path.empty()) {
        path.back().nesting = std::max(path.back().nesting, nesting + 1);
      }
      return;
    }
    on_path.insert(key);
    path.push_back(Frame{key, items_of(value)});
  };
  reach(root);
  while (!path.empty()) {
    Frame& frame = path.back();
    if (frame.next < frame.items.size()) {
      // A copy: reach() may grow `path`, which moves `frame`.
      const c10::IValue item = frame.items[frame.next++];
      reach(item);
      continue;
    }
    const int64_t nesting = frame.nesting;
    walked[frame.key] = nesting;
    on_path.erase(frame.key);
    path.pop_back();
    if (!path.empty()) {
      path.back().nesting = std::max(path.back().nesting, nesting + 1);
    }
  }
}

// Empties every list and dict in `value` and sets every tuple's items to
// None, one container at a time: each is then freed with nothing left
// inside it (no recursion as deep as the nesting), and a container that
// holds itself loses the reference that kept it alive.
void take_apart(const c10::IValue& value) {
  std::vector<c10::IValue> pending;
  if (is_container(value)) {
    pending.push_back(value);
  }
  while (!pending.empty()) {
    const c10::IValue container = std::move(pending.back());
    pending.pop_back();
    for (auto& item : items_of(container)) {
      if (is_container(item)) {
        pending.push_back(std::move(item));
      }
    }
    if (container.isList()) {
      container.toList().clear();
    } else if (container.isGenericDict()) {
      container.toGenericDict().clear();
    } else {
      const auto tuple = container.toTuple();
      for (size_t i = 0; i < tuple->elements().size(); ++i) {
        tuple->unsafeSetElement(i, c10::IValue());
      }
    }
  }
}

// Thrown for what this reader does not read; load_pickle() then reports
// LibTorch's own error.
struct Unsupported {};

class Reader {
 public:
  Reader(const char* data, size_t size, const std::string& where,
         bool objects_as_none, const StorageLoader& storages)
      : data_(data),
        end_(data + size),
        where_(where),
        objects_as_none_(objects_as_none),
        storages_(storages) {}

  // Takes apart what the reader built (see take_apart()): after a failure,
  // whose partial values on the stack and in the memo would otherwise be
  // freed recursively, however deep they are.
  void discard() {
    for (const auto& item : stack_) {
      take_apart(item.value);
    }
    for (const auto& entry : memo_) {
      take_apart(entry.second.value);
    }
    for (const auto& value : dropped_) {
      take_apart(value);
    }
  }

  // Refuses (naming `where`) containers nested too deep anywhere in what the
  // read built, the result or not: Python's pickler cannot write such
  // nesting, and LibTorch's reader, given the file after this one, would
  // overflow the stack freeing it.
  void check_built(const std::string& where) const {
    for (const auto& item : stack_) {
      walk_unpickled(item.value, where, /*whole=*/false);
    }
    for (const auto& entry : memo_) {
      walk_unpickled(entry.second.value, where, /*whole=*/false);
    }
    for (const auto& value : dropped_) {
      walk_unpickled(value, where, /*whole=*/false);
    }
  }

  c10::IValue run() {
    while (true) {
      const auto op = static_cast<uint8_t>(byte());
      switch (op) {
        case 0x80: // PROTO
          byte();
          break;
        case 0x95: // FRAME
          bytes(8);
          break;
        case '.': // STOP
          require(stack_.size() == 1 && !stack_[0].ordered_dict_class);
          return stack_[0].value;
        case '(': // MARK
          marks_.push_back(stack_.size());
          break;
        case '}': // EMPTY_DICT
          push(empty_dict());
          break;
        case ']': // EMPTY_LIST
          push(c10::impl::GenericList(c10::AnyType::get()));
          break;
        case ')': // EMPTY_TUPLE
          push(c10::ivalue::Tuple::create({}));
          break;
        case 't': // TUPLE
          push(tuple(pop_mark()));
          break;
        case 'l': { // LIST: the items since the mark
          const size_t start = pop_mark();
          stack_.insert(stack_.begin() + static_cast<std::ptrdiff_t>(start),
                        Item{c10::impl::GenericList(c10::AnyType::get())});
          append(start + 1);
          break;
        }
        case 'd': { // DICT: the keys and values since the mark
          const size_t start = pop_mark();
          stack_.insert(stack_.begin() + static_cast<std::ptrdiff_t>(start),
                        Item{empty_dict()});
          set_items(start + 1);
          break;
        }
        case 0x85: // TUPLE1
        case 0x86: // TUPLE2
        case 0x87: // TUPLE3
          push(tuple(stack_.size() - require_items(op - 0x84)));
          break;
        case 'N': // NONE
          push(c10::IValue());
          break;
        case 0x88: // NEWTRUE
        case 0x89: // NEWFALSE
          push(c10::IValue(op == 0x88));
          break;
        case 'K': // BININT1
          push(c10::IValue(static_cast<int64_t>(little_endian(1))));
          break;
        case 'M': // BININT2
          push(c10::IValue(static_cast<int64_t>(little_endian(2))));
          break;
        case 'J': // BININT
          push(c10::IValue(static_cast<int64_t>(
              static_cast<int32_t>(static_cast<uint32_t>(little_endian(4))))));
          break;
        case 0x8a: // LONG1
          push(long_int(little_endian(1)));
          break;
        case 0x8b: // LONG4
          push(long_int(little_endian(4)));
          break;
        case 'G': { // BINFLOAT, big-endian
          uint64_t bits = 0;
          for (const char c : bytes(8)) {
            bits = (bits << 8) | static_cast<uint8_t>(c);
          }
          double value;
          std::memcpy(&value, &bits, sizeof(value));
          push(c10::IValue(value));
          break;
        }
        case 0x8c: // SHORT_BINUNICODE
          push(c10::IValue(bytes(little_endian(1))));
          break;
        case 'X': // BINUNICODE
          push(c10::IValue(bytes(little_endian(4))));
          break;
        case 0x8d: // BINUNICODE8
          push(c10::IValue(bytes(little_endian(8))));
          break;
        case 'q': // BINPUT
          memoize(little_endian(1));
          break;
        case 'r': // LONG_BINPUT
          memoize(little_endian(4));
          break;
        case 0x94: // MEMOIZE
          memoize(memo_.size());
          break;
        case 'h':   // BINGET
        case 'j': { // LONG_BINGET
          const auto it = memo_.find(little_endian(op == 'h' ? 1 : 4));
          require(it != memo_.end());
          stack_.push_back(it->second);
          break;
        }
        case 'c': { // GLOBAL "module\nname\n"
          auto module = line();
          global(module, line());
          break;
        }
        case 0x93: { // STACK_GLOBAL
          require_items(2);
          auto name = pop().value;
          auto module = pop().value;
          require(module.isString() && name.isString());
          global(module.toStringRef(), name.toStringRef());
          break;
        }
        case 'R': { // REDUCE: OrderedDict(), or any object as None
          require_items(2);
          auto args = pop();
          auto callable = pop();
          if (callable.tensor_function != TensorFunction::kNone) {
            push(rebuild(callable.tensor_function, args.value));
            drop(std::move(args.value));
            break;
          }
          if (callable.other_class) {
            push(c10::IValue()); // a tensor, a storage, a device...
            drop(std::move(args.value));
            break;
          }
          require(callable.ordered_dict_class && args.value.isTuple() &&
                  args.value.toTupleRef().elements().empty());
          push(empty_dict());
          break;
        }
        case 0x81: { // NEWOBJ: an object as None
          require_items(2);
          drop(pop().value);
          require(pop().other_class);
          push(c10::IValue());
          break;
        }
        case 'Q': { // BINPERSID: a tensor's storage (as None in a skeleton)
          require(objects_as_none_ || storages_);
          require_items(1);
          auto id = pop().value;
          push(storages_ ? storage(id) : c10::IValue());
          break;
        }
        case 'b': // BUILD: an object's attributes (a state dict's _metadata)
          require(objects_as_none_ || storages_);
          require_items(2);
          drop(pop().value);
          break;
        case 's': // SETITEM
          set_items(stack_.size() - require_items(2));
          break;
        case 'u': // SETITEMS
          set_items(pop_mark());
          break;
        case 'a': // APPEND
          append(stack_.size() - require_items(1));
          break;
        case 'e': // APPENDS
          append(pop_mark());
          break;
        default:
          throw Unsupported();
      }
    }
  }

 private:
  // The functions of torch._utils that rebuild a tensor.
  enum class TensorFunction { kNone, kRebuildTensor, kRebuildParameter };

  struct Item {
    c10::IValue value;
    bool ordered_dict_class = false;
    bool other_class = false; // read with objects_as_none only
    TensorFunction tensor_function = TensorFunction::kNone;
  };

  // A typed storage class (torch.FloatStorage) reads as this prefix and its
  // dtype's number, a value that no pickle of plain values holds, so that it
  // survives inside the persistent id's tuple.
  static constexpr const char* kStorageClass = "\x01lamp-storage-class:";

  static c10::optional<c10::ScalarType> storage_dtype(const std::string& name) {
    const auto& types = storage_types();
    const auto it = types.find(name);
    if (it == types.end()) {
      return c10::nullopt;
    }
    return it->second;
  }
  static const std::unordered_map<std::string, c10::ScalarType>&
  storage_types() {
    static const std::unordered_map<std::string, c10::ScalarType> types = {
        {"FloatStorage", c10::kFloat}, {"DoubleStorage", c10::kDouble},
        {"HalfStorage", c10::kHalf},   {"BFloat16Storage", c10::kBFloat16},
        {"LongStorage", c10::kLong},   {"IntStorage", c10::kInt},
        {"ShortStorage", c10::kShort}, {"CharStorage", c10::kChar},
        {"ByteStorage", c10::kByte},   {"BoolStorage", c10::kBool},
        {"UntypedStorage", c10::kByte}};
    return types;
  }

  // ('storage', storage class, key, location, numel): the storage's
  // elements, read through storages_.
  c10::IValue storage(const c10::IValue& id) {
    require(id.isTuple());
    const auto& elements = id.toTupleRef().elements();
    const std::vector<c10::IValue> items(elements.begin(), elements.end());
    require(items.size() == 5 && items[0].isString() &&
            items[0].toStringRef() == "storage" && items[1].isString() &&
            items[2].isString() && items[4].isInt());
    const auto dtype = storage_class_dtype(items[1].toStringRef());
    require(dtype.has_value());
    return c10::IValue(
        storages_(items[2].toStringRef(), *dtype, items[4].toInt()));
  }

  // The dtype of a storage class as global() pushes it, or nullopt for any
  // other string (the pickle's own strings can hold the prefix too).
  static c10::optional<c10::ScalarType> storage_class_dtype(
      const std::string& klass) {
    for (const auto& entry : storage_types()) {
      if (klass == storage_class(entry.second)) {
        return entry.second;
      }
    }
    return c10::nullopt;
  }
  static std::string storage_class(c10::ScalarType dtype) {
    return std::string(kStorageClass) + std::to_string(static_cast<int>(dtype));
  }

  static std::vector<int64_t> ints(const c10::IValue& value) {
    require(value.isTuple());
    std::vector<int64_t> out;
    for (const auto& v : value.toTupleRef().elements()) {
      require(v.isInt());
      out.push_back(v.toInt());
    }
    return out;
  }

  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad,
  // backward_hooks[, metadata]) and _rebuild_parameter(data, requires_grad,
  // backward_hooks): the tensor, a view of its storage.
  c10::IValue rebuild(TensorFunction function, const c10::IValue& args) {
    require(args.isTuple());
    const auto& elements = args.toTupleRef().elements();
    const std::vector<c10::IValue> items(elements.begin(), elements.end());
    if (function == TensorFunction::kRebuildParameter) {
      require(items.size() >= 1 && items[0].isTensor());
      return items[0];
    }
    require(items.size() >= 4 && items[0].isTensor() && items[1].isInt());
    const auto& storage = items[0].toTensor();
    const auto size = ints(items[2]);
    const auto stride = ints(items[3]);
    require(size.size() == stride.size());
    const int64_t offset = items[1].toInt();
    check_view(offset, size, stride, storage.numel(), where_);
    return c10::IValue(storage.as_strided(size, stride, offset));
  }

  static void require(bool condition) {
    if (!condition) {
      throw Unsupported();
    }
  }
  char byte() {
    require(data_ < end_);
    return *data_++;
  }
  std::string bytes(uint64_t n) {
    require(n <= static_cast<uint64_t>(end_ - data_));
    std::string out(data_, static_cast<size_t>(n));
    data_ += n;
    return out;
  }
  uint64_t little_endian(int n) {
    uint64_t value = 0;
    for (int i = 0; i < n; ++i) {
      value |= static_cast<uint64_t>(static_cast<uint8_t>(byte())) << (8 * i);
    }
    return value;
  }
  std::string line() {
    std::string out;
    for (char c = byte(); c != '\n'; c = byte()) {
      out += c;
    }
    return out;
  }
  static c10::IValue empty_dict() {
    return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
  }
  void push(c10::IValue value) { stack_.push_back(Item{std::move(value)}); }
  // Kept until the read ends, for check_built(): a value the read drops.
  void drop(c10::IValue value) {
    if (is_container(value)) {
      dropped_.push_back(std::move(value));
    }
  }
  void memoize(uint64_t key) {
    const auto old = memo_.find(key);
    if (old != memo_.end()) {
      drop(old->second.value);
    }
    memo_[key] = top();
  }
  Item pop() {
    require(!stack_.empty());
    auto item = std::move(stack_.back());
    stack_.pop_back();
    return item;
  }
  const Item& top() const {
    require(!stack_.empty());
    return stack_.back();
  }
  size_t require_items(size_t n) const {
    require(stack_.size() >= n + (marks_.empty() ? 0 : marks_.back()));
    return n;
  }
  size_t pop_mark() {
    require(!marks_.empty());
    const size_t start = marks_.back();
    marks_.pop_back();
    return start;
  }
  c10::IValue tuple(size_t start) {
    std::vector<c10::IValue> items;
    for (size_t i = start; i < stack_.size(); ++i) {
      items.push_back(std::move(stack_[i].value));
    }
    stack_.resize(start);
    return c10::ivalue::Tuple::create(std::move(items));
  }
  void global(const std::string& module, const std::string& name) {
    if (module == "collections" && name == "OrderedDict") {
      stack_.push_back(Item{c10::IValue(), true, false});
      return;
    }
    if (storages_ && module == "torch._utils" &&
        (name == "_rebuild_tensor_v2" || name == "_rebuild_parameter")) {
      Item item;
      item.tensor_function = name == "_rebuild_tensor_v2"
                                 ? TensorFunction::kRebuildTensor
                                 : TensorFunction::kRebuildParameter;
      stack_.push_back(std::move(item));
      return;
    }
    if (storages_ && module == "torch") {
      if (const auto dtype = storage_dtype(name)) {
        push(c10::IValue(storage_class(*dtype)));
        return;
      }
    }
    require(objects_as_none_);
    stack_.push_back(Item{c10::IValue(), false, true});
  }
  void set_items(size_t start) {
    require(start >= 1 && (stack_.size() - start) % 2 == 0 &&
            stack_[start - 1].value.isGenericDict());
    auto dict = stack_[start - 1].value.toGenericDict();
    for (size_t i = start; i < stack_.size(); i += 2) {
      const auto& key = stack_[i].value;
      require(key.isString() || key.isInt() || key.isBool());
      const auto replaced = dict.find(key);
      if (replaced != dict.end()) {
        drop(replaced->value());
      }
      dict.insert_or_assign(key, stack_[i + 1].value);
    }
    stack_.resize(start);
  }
  void append(size_t start) {
    require(start >= 1 && stack_[start - 1].value.isList());
    auto list = stack_[start - 1].value.toList();
    for (size_t i = start; i < stack_.size(); ++i) {
      list.push_back(stack_[i].value);
    }
    stack_.resize(start);
  }
  // A little-endian two's complement integer of `n` bytes.
  c10::IValue long_int(uint64_t n) {
    const std::string raw = bytes(n);
    if (n == 0) {
      return c10::IValue(static_cast<int64_t>(0));
    }
    const bool negative = (static_cast<uint8_t>(raw[n - 1]) & 0x80) != 0;
    const uint8_t fill = negative ? 0xff : 0x00;
    // Significant bits of the magnitude: bytes above the last one that
    // differs from the sign fill, plus that byte's bits.
    size_t top = n;
    while (top > 0 && static_cast<uint8_t>(raw[top - 1]) == fill) {
      --top;
    }
    int bits = 0;
    if (top > 0) {
      uint8_t last = static_cast<uint8_t>(raw[top - 1]) ^ fill;
      bits = 8 * static_cast<int>(top - 1);
      while (last != 0) {
        ++bits;
        last >>= 1;
      }
    }
    if (bits > 63) {
      const auto& key = stack_.empty() ? c10::IValue() : stack_.back().value;
      TORCH_CHECK(
          false, where_, ": ",
          key.isString() ? "the value of '" + key.toStringRef() + "'"
                         : std::string("a value"),
          " is an integer of ", bits,
          " bits, which does not fit in LibTorch's 64-bit integers. Save it in Python as a float, or as an int within +-2**63.");
    }
    uint64_t value = negative ? ~uint64_t(0) : 0;
    for (size_t i = 0; i < std::min<uint64_t>(n, 8); ++i) {
      value &= ~(uint64_t(0xff) << (8 * i));
      value |= static_cast<uint64_t>(static_cast<uint8_t>(raw[i])) << (8 * i);
    }
    return c10::IValue(static_cast<int64_t>(value));
  }

  const char* data_;
  const char* end_;
  const std::string& where_;
  const bool objects_as_none_;
  const StorageLoader& storages_;
  std::vector<Item> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Item> memo_;
  std::vector<c10::IValue> dropped_;
};

} // namespace

c10::optional<c10::IValue> read_plain_pickle(const char* data, size_t size,
                                             const std::string& where,
                                             bool objects_as_none,
                                             const StorageLoader& storages) {
  Reader reader(data, size, where, objects_as_none, storages);
  try {
    auto value = reader.run();
    check_unpickled(value, where);
    reader.check_built(where); // then freed as deep as it is: 1000 at most
    return value;
  } catch (const Unsupported&) {
    // What this reader does not read may still be nested too deep for
    // LibTorch's reader: refused here, before that reader is given it.
    try {
      reader.check_built(where);
    } catch (...) {
      reader.discard();
      throw;
    }
    reader.discard();
    return c10::nullopt;
  } catch (...) {
    reader.discard();
    throw;
  }
}

void check_unpickled(const c10::IValue& value, const std::string& where) {
  try {
    walk_unpickled(value, where);
  } catch (...) {
    take_apart(value);
    throw;
  }
}

} // namespace detail
} // namespace lamp
