// Python's torch.save files (a pickle in a zip): lamp's export of state
// dicts for Python, and the reader of files Python wrote.

#include "lamp/platform/checkpoint_file.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "platform/checkpoint_io.h"
#include "platform/plain_pickle.h"

namespace lamp {

void save_pickle(const c10::IValue& value, const std::string& path) {
  // torch::pickle_save, less its type tags: it marks typed dicts with
  // torch.jit._pickle.restore_type_tag, a global that Python's torch.load
  // refuses by default since torch 2.6 (weights_only). Without the tags,
  // LibTorch reads the dict back with Any as its key and value types.
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&pickle](const char* data, size_t size) {
        pickle.insert(pickle.end(), data, data + size);
      },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
      /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
      /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::string bytes;
  {
    caffe2::serialize::PyTorchStreamWriter writer(
        [&bytes](const void* data, size_t size) {
          bytes.append(static_cast<const char*>(data), size);
          return size;
        });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(),
                                       pickler.tensorData(), writer);
    writer.writeEndOfFile();
  }
  write_file_atomically(path, bytes);
}

namespace {

// The pickle inside a torch.save zip ("<name>/data.pkl"), or "" when the
// zip cannot be read; `torchscript` (when given) says whether the zip is a
// TorchScript archive (code constants beside the pickle), from the same
// read of the zip.
std::string zip_pickle(const std::string& bytes, bool* torchscript = nullptr) {
  try {
    std::istringstream stream(bytes);
    caffe2::serialize::PyTorchStreamReader reader(&stream);
    if (torchscript != nullptr) {
      *torchscript = reader.hasRecord("constants.pkl");
    }
    const auto record = reader.getRecord("data.pkl");
    return std::string(static_cast<const char*>(std::get<0>(record).get()),
                       std::get<1>(record));
  } catch (const std::exception&) {
    return std::string();
  }
}

// A small record of a torch.save zip ("byteorder") as text.
std::string record_text(caffe2::serialize::PyTorchStreamReader& reader,
                        const std::string& name) {
  const auto record = reader.getRecord(name);
  return std::string(static_cast<const char*>(std::get<0>(record).get()),
                     std::get<1>(record));
}

} // namespace

bool detail::is_torch_save_zip(const std::string& bytes) {
  try {
    std::istringstream stream(bytes);
    caffe2::serialize::PyTorchStreamReader reader(&stream);
    return reader.hasRecord("data.pkl") && !reader.hasRecord("constants.pkl");
  } catch (const std::exception&) {
    return false;
  }
}

bool is_torch_save_file(const std::string& path) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    // torch::save's archives hold their pickle beside code constants.
    const bool pickled = reader.hasRecord("data.pkl");
    return pickled && !reader.hasRecord("constants.pkl");
  } catch (const std::exception&) {
    return false;
  }
}

c10::optional<c10::IValue> detail::read_pickle_skeleton(
    const std::string& path, const std::string& what) {
  const std::string bytes = detail::read_regular_file(path);
  if (!is_torch_save_zip(bytes)) {
    return c10::nullopt; // a TorchScript archive (a lamp checkpoint), ...
  }
  const std::string pickle = zip_pickle(bytes);
  if (pickle.empty()) {
    return c10::nullopt;
  }
  return detail::read_plain_pickle(pickle.data(), pickle.size(),
                                   what + ": " + path,
                                   /*objects_as_none=*/true);
}

c10::IValue load_pickle(const std::string& path, const std::string& what) {
  const std::string bytes = detail::read_regular_file(path);
  bool torchscript = false;
  const std::string pickle = zip_pickle(bytes, &torchscript);
  if (!pickle.empty() && !torchscript) {
    // lamp's reader first, its objects and tensors as None: it refuses
    // containers nested too deep anywhere in the pickle, which LibTorch's
    // reader, failing after it built them, would free by a recursion that
    // overflows the stack.
    detail::read_plain_pickle(pickle.data(), pickle.size(), what + ": " + path,
                              /*objects_as_none=*/true);
  }
  std::string error;
  c10::optional<c10::IValue> loaded;
  try {
    loaded = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    // A damaged zip can make the reader throw anything (see below).
    error = e.what();
  }
  if (loaded) {
    detail::check_unpickled(*loaded, what + ": " + path);
    return *loaded;
  }
  // Python's legacy format (torch.save(..., _use_new_zipfile_serialization=
  // False), and PyTorch before 1.6) is a bare pickle of a magic number, not
  // a zip.
  TORCH_CHECK(
      bytes.compare(0, 2, "PK") == 0 || bytes.empty() ||
          static_cast<uint8_t>(bytes[0]) != 0x80,
      what, ": ", path,
      " was written in PyTorch's legacy (non-zip) format (torch.save with _use_new_zipfile_serialization=False, or PyTorch < 1.6), which LibTorch cannot read. Re-save it in Python in the zip format, the default: torch.save(torch.load(path), path).");
  // LibTorch's unpickler refuses some values Python writes (an OrderedDict,
  // so every state_dict; integers of 5 to 7 bytes): read those here, with
  // their tensors.
  if (!pickle.empty()) {
    c10::optional<c10::IValue> plain;
    try {
      std::istringstream stream(bytes);
      caffe2::serialize::PyTorchStreamReader reader(&stream);
      TORCH_CHECK(!reader.hasRecord("byteorder") ||
                      record_text(reader, "byteorder") == "little",
                  what, ": ", path,
                  " was written on a big-endian machine; load and save it "
                  "again in Python on a little-endian one.");
      std::unordered_map<std::string, torch::Tensor> storages;
      const detail::StorageLoader load = [&](const std::string& key,
                                             c10::ScalarType dtype,
                                             int64_t numel) {
        auto& storage = storages[key];
        if (!storage.defined()) {
          const auto record = reader.getRecord("data/" + key);
          const size_t element_bytes = c10::elementSize(dtype);
          const uint64_t record_bytes = std::get<1>(record);
          // Compared as a count of elements: a damaged numel times the
          // element size could wrap around.
          const bool fits = numel >= 0 && static_cast<uint64_t>(numel) <=
                                              record_bytes / element_bytes;
          TORCH_CHECK(fits, what, ": ", path, " is damaged: its storage ", key,
                      " holds ", record_bytes, " bytes, not the ", numel, " ",
                      dtype, " elements its pickle gives it.");
          const size_t bytes_needed =
              static_cast<size_t>(numel) * element_bytes;
          storage = torch::empty({numel}, dtype);
          std::memcpy(storage.data_ptr(), std::get<0>(record).get(),
                      bytes_needed);
        }
        TORCH_CHECK(storage.scalar_type() == dtype && storage.numel() == numel,
                    what, ": ", path, " is damaged: storage ", key,
                    " is read as two different types.");
        return storage;
      };
      plain = detail::read_plain_pickle(pickle.data(), pickle.size(),
                                        what + ": " + path,
                                        /*objects_as_none=*/false, load);
    } catch (const c10::Error&) {
      throw;
    } catch (const std::exception& e) {
      error = e.what(); // a damaged zip record
    }
    if (plain) {
      return *plain;
    }
  }
  // A torch.save file of a Python object (not its state_dict()): the
  // object's class is what neither reader knows.
  TORCH_CHECK(
      pickle.empty() || torchscript ||
          error.find("found unknown type") == std::string::npos,
      what, ": ", path,
      " is a file of Python's torch.save, but it holds a Python object lamp "
      "does not read (",
      error,
      "). Save plain values instead: an object's state_dict() "
      "(torch.save(obj.state_dict(), path)), not the object itself.");
  // torch::save archives and TorchScript modules keep their pickle under
  // "constants.pkl"/"data.pkl" next to code, which pickle_load does not read
  // as a plain torch.save file.
  TORCH_CHECK(
      false, what, ": ", path,
      " is not a file written by Python's torch.save (", error,
      "). A torch::serialize archive (a lamp checkpoint, torch::save's files) is read with torch::serialize::InputArchive or torch::load instead.");
}

} // namespace lamp
