// Python's torch.save files (a pickle in a zip): lamp's export of state
// dicts for Python, and the reader of files Python wrote.

#include "lamp/platform/checkpoint_file.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/torch.h>

#include <sstream>
#include <string>
#include <tuple>
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
// zip cannot be read.
std::string zip_pickle(const std::string& bytes) {
  try {
    std::istringstream stream(bytes);
    caffe2::serialize::PyTorchStreamReader reader(&stream);
    const auto record = reader.getRecord("data.pkl");
    return std::string(static_cast<const char*>(std::get<0>(record).get()),
                       std::get<1>(record));
  } catch (const std::exception&) {
    return std::string();
  }
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
  std::string error;
  try {
    return torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    // A damaged zip can make the reader throw anything (see below).
    error = e.what();
  }
  // Python's legacy format (torch.save(..., _use_new_zipfile_serialization=
  // False), and PyTorch before 1.6) is a bare pickle of a magic number, not
  // a zip.
  TORCH_CHECK(
      bytes.compare(0, 2, "PK") == 0 || bytes.empty() ||
          static_cast<uint8_t>(bytes[0]) != 0x80,
      what, ": ", path,
      " was written in PyTorch's legacy (non-zip) format (torch.save with _use_new_zipfile_serialization=False, or PyTorch < 1.6), which LibTorch cannot read. Re-save it in Python in the zip format, the default: torch.save(torch.load(path), path).");
  // LibTorch's unpickler refuses some plain values Python writes (an
  // OrderedDict, integers of 5 to 7 bytes): read those here.
  const std::string pickle = zip_pickle(bytes);
  if (!pickle.empty()) {
    auto plain = detail::read_plain_pickle(pickle.data(), pickle.size(),
                                           what + ": " + path);
    if (plain) {
      return *plain;
    }
  }
  // torch::save archives and TorchScript modules keep their pickle under
  // "constants.pkl"/"data.pkl" next to code, which pickle_load does not read
  // as a plain torch.save file.
  TORCH_CHECK(
      false, what, ": ", path,
      " is not a file written by Python's torch.save (", error,
      "). A torch::serialize archive (a lamp checkpoint, torch::save's files) is read with torch::serialize::InputArchive or torch::load instead.");
}

} // namespace lamp
