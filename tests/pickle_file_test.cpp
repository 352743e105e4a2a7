// lamp::load_pickle on damaged torch.save files, written here byte by byte:
// a tensor whose view reaches beyond its storage (sizes and strides that
// overflow int64 among them), a storage shorter than its pickle says, a
// storage class no torch.save writes, a container that contains itself,
// containers nested without bound. Each is refused with a message that
// names the file and what is wrong, whether LibTorch's unpickler reads the
// file (a plain dict) or lamp's own reader does (an OrderedDict, every
// Python state_dict); none is read out of bounds or overflows the stack.

#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "lamp/platform/checkpoint_file.h"
#include "platform/plain_pickle.h"
#include "test_util.h"
#include "trainer_util.h"

namespace {

using lamp_test::error_of;
using lamp_test::temp_path;

// Pickle opcodes, as Python's pickle (protocol 2) writes them, put
// together by appending (GCC 12 warns falsely about `"X" + std::string`).
std::string cat(std::initializer_list<std::string> parts) {
  std::string out;
  for (const auto& part : parts) {
    out += part;
  }
  return out;
}
// The opcode `op` and `bytes` bytes of `value`, little-endian.
std::string op_with(const std::string& op, uint64_t value, int bytes) {
  std::string out = op;
  for (int i = 0; i < bytes; ++i) {
    out += static_cast<char>((value >> (8 * i)) & 0xff);
  }
  return out;
}
std::string text(const std::string& s) { // BINUNICODE
  return cat({op_with("X", s.size(), 4), s});
}
std::string integer(int64_t value) {
  const auto bits = static_cast<uint64_t>(value);
  if (value >= 0 && value < 256) {
    return op_with("K", bits, 1); // BININT1
  }
  if (value >= INT32_MIN && value <= INT32_MAX) {
    return op_with("J", bits, 4); // BININT
  }
  return op_with("\x8a\x08", bits, 8); // LONG1 of 8 bytes
}
std::string int_tuple(const std::vector<int64_t>& values) {
  std::string out = "(";
  for (const auto v : values) {
    out += integer(v);
  }
  out += "t";
  return out;
}
const std::string kOrderedDict = "ccollections\nOrderedDict\n)R";
const std::string kFloatStorage = "ctorch\nFloatStorage\n";

struct View {
  std::vector<int64_t> size;
  std::vector<int64_t> stride;
  int64_t offset = 0;
};

// torch._utils._rebuild_tensor_v2 of the storage "0" (`storage_class`, an
// opcode that pushes the class, and `numel` elements), as torch.save
// writes a tensor.
std::string tensor(const View& view, int64_t numel,
                   const std::string& storage_class = kFloatStorage) {
  const std::string storage =
      cat({"(", text("storage"), storage_class, text("0"), text("cpu"),
           integer(numel), "tQ"});
  return cat({"ctorch._utils\n_rebuild_tensor_v2\n(", storage,
              integer(view.offset), int_tuple(view.size),
              int_tuple(view.stride), "\x89", kOrderedDict, "tR"});
}

// A pickle of {"w": value}: a plain dict (LibTorch's unpickler reads it) or
// an OrderedDict (LibTorch's refuses it, lamp's own reader reads it).
std::string dict_of(const std::string& value, bool ordered) {
  // SETITEMS, which both readers read (LibTorch's lacks SETITEM).
  return cat(
      {"\x80\x02", ordered ? kOrderedDict : "}", "(", text("w"), value, "u."});
}

// A torch.save zip holding `pickle` and the storage "0" of four floats,
// 1 to 4; its path.
std::string write_torch_save(const std::string& pickle,
                             const std::string& name) {
  std::string zip;
  {
    caffe2::serialize::PyTorchStreamWriter writer(
        [&zip](const void* data, size_t size) {
          zip.append(static_cast<const char*>(data), size);
          return size;
        });
    const float storage[4] = {1, 2, 3, 4};
    writer.writeRecord("data.pkl", pickle.data(), pickle.size());
    writer.writeRecord("byteorder", "little", 6);
    writer.writeRecord("data/0", storage, sizeof(storage));
    writer.writeEndOfFile();
  }
  const auto path = temp_path(name + ".pt");
  std::ofstream(path, std::ios::binary) << zip;
  return path;
}

// load_pickle's error for the file of {"w": value} ("" when it loads).
std::string load_error(const std::string& value, bool ordered,
                       const std::string& name) {
  const auto path =
      write_torch_save(dict_of(value, ordered), name + (ordered ? "_od" : ""));
  const auto error = error_of([&] { lamp::load_pickle(path, "test"); });
  std::remove(path.c_str());
  return error;
}

// load_pickle's error for the file of `pickle` ("" when it loads).
std::string pickle_error(const std::string& pickle, const std::string& name) {
  const auto path = write_torch_save(pickle, name);
  const auto error = error_of([&] { lamp::load_pickle(path, "test"); });
  std::remove(path.c_str());
  return error;
}

// `count` lists, each the only item of the one before: built with APPENDS
// (both readers read it) or APPEND (LibTorch's unpickler lacks it, so lamp's
// reader builds the nesting).
std::string nested_lists(int64_t count, bool appends) {
  std::string pickle = "\x80\x02";
  if (appends) {
    for (int64_t i = 1; i < count; ++i) {
      pickle += "](";
    }
    pickle += "]" + std::string(static_cast<size_t>(count - 1), 'e');
  } else {
    pickle += std::string(static_cast<size_t>(count), ']') +
              std::string(static_cast<size_t>(count - 1), 'a');
  }
  return pickle + ".";
}

// The files themselves are sound: an intact view loads through both readers
// with the storage's values, so the refusals below are of the damage alone.
TEST(DamagedPythonFiles, AnIntactViewLoadsThroughBothReaders) {
  for (const bool ordered : {false, true}) {
    const auto path = write_torch_save(
        dict_of(tensor({{2, 2}, {1, 2}, 0}, 4), ordered), "intact");
    const auto value = lamp::load_pickle(path, "test");
    std::remove(path.c_str());
    ASSERT_TRUE(value.isGenericDict()) << ordered;
    const auto w = value.toGenericDict().at("w").toTensor();
    EXPECT_TRUE(torch::equal(w, torch::tensor({{1.f, 3.f}, {2.f, 4.f}})))
        << ordered << "\n"
        << w;
  }
}

TEST(DamagedPythonFiles, AViewBeyondItsStorageIsRefused) {
  const std::vector<View> damaged = {
      {{3, 2}, {2, 1}, 0},                // 6 elements of 4
      {{2}, {1}, 3},                      // offset 3: the last one past the end
      {{2, 2}, {3, 1}, 0},                // a stride too long
      {{int64_t{1} << 62, 4}, {4, 1}, 0}, // (2^62 - 1) * 4 overflows int64
      {{2}, {1}, INT64_MAX},              // the offset + 1 overflows
      {{int64_t{1} << 40, int64_t{1} << 40}, {0, 0}, 0}, // 2^80 elements
  };
  for (const bool ordered : {false, true}) {
    for (size_t i = 0; i < damaged.size(); ++i) {
      const auto error = load_error(tensor(damaged[i], 4), ordered,
                                    "view_" + std::to_string(i));
      EXPECT_NE(error.find("is damaged: a tensor's sizes"), std::string::npos)
          << "case " << i << (ordered ? ", OrderedDict" : ", dict") << ": "
          << error;
      EXPECT_NE(error.find("reach beyond its storage of 4 elements"),
                std::string::npos)
          << error;
    }
  }
}

// The storage record holds 16 bytes; a pickle that says it holds more
// floats (2^62 + 1 of them: times 4 bytes, 4 modulo 2^64) or a negative
// count is refused by lamp's reader before anything is copied.
TEST(DamagedPythonFiles, AStorageShorterThanItsPickleSaysIsRefused) {
  for (const int64_t numel :
       {int64_t{5}, (int64_t{1} << 62) + 1, int64_t{-1}}) {
    const auto error =
        load_error(tensor({{2}, {1}, 0}, numel), /*ordered=*/true, "numel");
    EXPECT_NE(error.find("is damaged: its storage 0 holds 16 bytes, not the " +
                         std::to_string(numel) + " Float elements"),
              std::string::npos)
        << numel << ": " << error;
  }
}

// A storage class that is a string rather than one of torch's storage
// types, in the form lamp's reader marks its own classes with but naming
// no dtype it reads, is refused as no torch.save file, never read as an
// arbitrary dtype.
TEST(DamagedPythonFiles, AStorageClassNoTorchSaveWritesIsRefused) {
  for (const std::string suffix : {"99", "-1", "6x", "x", ""}) {
    const auto error = load_error(
        tensor({{2}, {1}, 0}, 4,
               text(std::string("\x01lamp-storage-class:") + suffix)),
        /*ordered=*/true, "storage_class");
    EXPECT_NE(error.find("is not a file written by Python's torch.save"),
              std::string::npos)
        << suffix << ": " << error;
  }
}

// BINPUT and BINGET of memo entry `n`.
std::string put(int n) {
  return op_with("q", static_cast<uint64_t>(n), 1);
}
std::string get(int n) {
  return op_with("h", static_cast<uint64_t>(n), 1);
}

// d = {}; d["self"] = d; torch.save(d, path): the memo hands the dict back
// inside itself. Python writes SETITEM, which some LibTorch versions'
// unpicklers lack (lamp's reader reads it then); SETITEMS and an
// OrderedDict put the loop before each reader in turn.
TEST(DamagedPythonFiles, ADictThatContainsItselfIsRefused) {
  const std::vector<std::string> pickles = {
      cat({"\x80\x02}", put(0), text("self"), put(1), get(0), "s."}),
      cat({"\x80\x02}", put(0), "(", text("self"), get(0), "u."}),
      cat({"\x80\x02", kOrderedDict, put(0), "(", text("self"), get(0), "u."}),
  };
  for (size_t i = 0; i < pickles.size(); ++i) {
    const auto error = pickle_error(pickles[i], "dict_loop");
    EXPECT_NE(error.find("test: "), std::string::npos) << i << ": " << error;
    EXPECT_NE(error.find(" holds a container that contains itself"),
              std::string::npos)
        << i << ": " << error;
  }
}

// l = []; l.append(l): APPEND (Python's, which only lamp's reader reads) and
// APPENDS (LibTorch's unpickler builds the loop).
TEST(DamagedPythonFiles, AListThatContainsItselfIsRefused) {
  for (const auto& pickle : {cat({"\x80\x02]", put(0), get(0), "a."}),
                             cat({"\x80\x02]", put(0), "(", get(0), "e."})}) {
    const auto error = pickle_error(pickle, "list_loop");
    EXPECT_NE(error.find(" holds a container that contains itself"),
              std::string::npos)
        << error;
  }
}

// 100,000 nested lists (Python itself stops near 1000, its recursion
// limit): refused, and freed without a recursion that deep, through either
// reader.
TEST(DamagedPythonFiles, ContainersNestedWithoutBoundAreRefused) {
  for (const bool appends : {true, false}) {
    const auto error = pickle_error(nested_lists(100000, appends), "deep");
    EXPECT_NE(error.find(" holds containers (lists, tuples, dicts) nested "
                         "more than 1000 deep"),
              std::string::npos)
        << appends << ": " << error;
  }
}

// Values the read builds and then drops (an object's arguments or state,
// read as None; a dict value set twice; a memo entry put twice), nested a
// million deep: refused as any nesting past the limit, without a recursion
// as deep (freed as they were, they overflowed the stack).
TEST(DamagedPythonFiles, DeepValuesTheReadDropsAreRefusedWithoutRecursion) {
  const std::string deep = "N" + std::string(1000000, '\x85'); // TUPLE1s
  const std::string object = "cfoo\nBar\n";
  const std::vector<std::pair<std::string, std::string>> pickles = {
      {"an object's arguments", cat({"\x80\x02}(", text("args"), object, "(",
                                     deep, "tR", text("a"), "K\x01u."})},
      {"a NEWOBJ's arguments", cat({"\x80\x02}(", text("args"), object, "(",
                                    deep, "t\x81", text("a"), "K\x01u."})},
      {"an object's state (BUILD)",
       cat({"\x80\x02", kOrderedDict, "(", text("a"), "K\x01u", deep, "b."})},
      {"a dict value set twice",
       cat({"\x80\x02}(", text("a"), deep, text("a"), "K\x01u."})},
      {"a memo entry put twice", cat({"\x80\x02}(", text("a"), deep, put(0),
                                      text("a"), "K\x01", put(0), "u."})},
      {"a memo entry left in the memo",
       cat({"\x80\x02}(", text("b"), deep, put(0), "u(", text("b"), "K\x02",
            text("a"), "K\x01u."})},
  };
  for (const auto& pickle : pickles) {
    const auto error = error_of([&] {
      lamp::detail::read_plain_pickle(pickle.second.data(),
                                      pickle.second.size(), pickle.first,
                                      /*objects_as_none=*/true);
    });
    EXPECT_NE(error.find(pickle.first + " holds containers (lists, tuples, "
                                        "dicts) nested more than 1000 deep"),
              std::string::npos)
        << error;
  }
  // Dropped values within the limit are no reason to refuse.
  const std::string shallow = "N" + std::string(999, '\x85');
  const auto pickle =
      cat({"\x80\x02}(", text("a"), shallow, text("a"), "K\x01u."});
  const auto value = lamp::detail::read_plain_pickle(
      pickle.data(), pickle.size(), "shallow", /*objects_as_none=*/true);
  ASSERT_TRUE(value.has_value());
  EXPECT_EQ(value->toGenericDict().at(c10::IValue(std::string("a"))).toInt(),
            1);
}

// Nesting too deep anywhere in a file, not only in the value it holds, is
// refused before LibTorch's reader is given it: that reader, failing after
// it built the nesting (an unknown global after it; an OrderedDict on
// LibTorch 1.13), freed it by a recursion that overflowed the stack.
TEST(DamagedPythonFiles, DeepNestingBeforeWhatLibTorchRefusesIsRefused) {
  const std::string deep = "N" + std::string(1000000, '\x85');
  for (const auto& pickle :
       {dict_of(deep, /*ordered=*/true),
        cat({"\x80\x02}(", text("a"), deep, "cos\nsystem\nu."}),
        cat({"\x80\x02", kOrderedDict, "(", text("a"), "K\x01u", deep,
             "b."})}) {
    const auto error = pickle_error(pickle, "deep_garbage");
    EXPECT_NE(error.find("nested more than 1000 deep"), std::string::npos)
        << error;
  }
}

// The same through LIST and DICT, the container opcodes of protocols 0 and
// 1 that LibTorch's reader reads: lamp's reader reads them too, so that it
// sees the nesting they build before LibTorch's reader is given the file
// (stopping at them, it had seen none of it).
TEST(DamagedPythonFiles, DeepNestingByListAndDictOpcodesIsRefused) {
  constexpr size_t kDeep = 1000000;
  std::string dicts;
  for (size_t i = 0; i < kDeep; ++i) {
    dicts += cat({"(", text("a")});
  }
  dicts += "(d" + std::string(kDeep, 'd');
  const std::string lists = std::string(kDeep, '(') + std::string(kDeep, 'l');
  for (const auto& deep : {lists, dicts}) {
    const auto error = pickle_error(
        cat({"\x80\x02}(", text("a"), deep, "cos\nsystem\nu."}), "deep_old");
    EXPECT_NE(error.find("nested more than 1000 deep"), std::string::npos)
        << error;
  }
}

// LIST and DICT read as EMPTY_LIST and EMPTY_DICT filled from the mark.
TEST(DamagedPythonFiles, ListAndDictOpcodesRead) {
  const auto pickle =
      cat({"\x80\x02(", text("a"), "(K\x01K\x02l", text("b"), "(d", "d."});
  const auto value = lamp::detail::read_plain_pickle(
      pickle.data(), pickle.size(), "protocol 1");
  ASSERT_TRUE(value.has_value());
  const auto dict = value->toGenericDict();
  ASSERT_EQ(dict.size(), 2u);
  const auto list = dict.at(c10::IValue(std::string("a"))).toListRef();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].toInt(), 1);
  EXPECT_EQ(list[1].toInt(), 2);
  EXPECT_EQ(dict.at(c10::IValue(std::string("b"))).toGenericDict().size(), 0u);
  // A DICT whose keys and values do not pair up is not read.
  const auto odd = cat({"\x80\x02(", text("a"), "d."});
  EXPECT_FALSE(lamp::detail::read_plain_pickle(odd.data(), odd.size(), "odd")
                   .has_value());
}

// A torch.save file of a Python object (torch.save(scaler, path), not its
// state_dict()) is named as such, with the fix, not as "not a file written
// by Python's torch.save".
TEST(DamagedPythonFiles, APythonObjectIsNamedWithTheFix) {
  const auto error = pickle_error(
      cat({"\x80\x02", "ctorch.amp.grad_scaler\nGradScaler\n)\x81}(",
           text("_scale"), "G?\xf0\x00\x00\x00\x00\x00\x00", "ub."}),
      "object");
  EXPECT_NE(error.find("is a file of Python's torch.save, but it holds a "
                       "Python object lamp does not read"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("torch.save(obj.state_dict(), path)"), std::string::npos)
      << error;
}

// 1000 levels load, 1001 do not.
TEST(DamagedPythonFiles, NestingUpToTheLimitLoads) {
  for (const bool appends : {true, false}) {
    const auto path =
        write_torch_save(nested_lists(1000, appends), "nesting_limit");
    c10::IValue value = lamp::load_pickle(path, "test");
    std::remove(path.c_str());
    int64_t depth = 1;
    while (value.isList() && value.toListRef().size() == 1) {
      value = c10::IValue(value.toListRef()[0]);
      ++depth;
    }
    EXPECT_EQ(depth, 1000) << appends;
    EXPECT_NE(pickle_error(nested_lists(1001, appends), "nesting_over")
                  .find("nested more than 1000 deep"),
              std::string::npos)
        << appends;
  }
}

// A list shared by several others is no cycle: [l0, l1, ..., l60] with
// l(i) = [l(i-1), l(i-1)] loads, although it has 2^60 paths to l0 (each
// container is walked once).
TEST(DamagedPythonFiles, SharedContainersLoad) {
  std::string pickle = cat({"\x80\x02](]", put(0)});
  for (int i = 1; i <= 60; ++i) {
    pickle += cat({"](", get(i - 1), get(i - 1), "e", put(i)});
  }
  pickle += "e.";
  const auto path = write_torch_save(pickle, "shared");
  const auto value = lamp::load_pickle(path, "test");
  std::remove(path.c_str());
  ASSERT_TRUE(value.isList());
  const auto lists = value.toListRef();
  ASSERT_EQ(lists.size(), 61u);
  const auto last = lists[60].toListRef();
  ASSERT_EQ(last.size(), 2u);
  EXPECT_TRUE(last[0].is(last[1]));
  EXPECT_TRUE(last[0].is(lists[59]));
}

} // namespace
