#pragma once

// Checked reads from torch::serialize archives, for the load() functions that
// check everything before they change anything. IValue's toInt() and
// toStringRef() on a value of another type fail with an internal assertion
// that asks for a PyTorch bug report; these name the key and the types.
// The value reads take any source with InputArchive's
// `bool try_read(const std::string&, c10::IValue&)`: an archive, or a
// DictReader over a dict that torch::pickle_load returned (Python's format).

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lamp {
namespace detail {

template <typename Source>
c10::IValue read_value(Source& archive, const std::string& key,
                       const char* caller) {
  c10::IValue value;
  TORCH_CHECK(archive.try_read(key, value), caller, ": the archive has no '",
              key, "'; it is corrupt or was written by something else.");
  return value;
}

/// A dict of string keys (a state read with torch::pickle_load) as a source
/// for the read functions above.
class DictReader {
 public:
  explicit DictReader(c10::impl::GenericDict dict) : dict_(std::move(dict)) {}
  bool try_read(const std::string& key, c10::IValue& value) const {
    const auto it = dict_.find(c10::IValue(key));
    if (it == dict_.end()) {
      return false;
    }
    value = it->value();
    return true;
  }

 private:
  c10::impl::GenericDict dict_;
};

inline void check_type(bool matches, const c10::IValue& value,
                       const std::string& key, const char* expected,
                       const char* caller) {
  TORCH_CHECK(
      matches, caller, ": '", key, "' has type ", value.tagKind(),
      " in the archive where ", expected,
      " is expected; the archive is corrupt or was written by something else.");
}

template <typename Source>
int64_t read_int(Source& archive, const std::string& key, const char* caller) {
  const auto value = read_value(archive, key, caller);
  check_type(value.isInt(), value, key, "an integer", caller);
  return value.toInt();
}

/// A double or an integer (Python writes `growth_factor=2` as an int).
template <typename Source>
double read_number(Source& archive, const std::string& key,
                   const char* caller) {
  const auto value = read_value(archive, key, caller);
  check_type(value.isDouble() || value.isInt(), value, key, "a number", caller);
  return value.isDouble() ? value.toDouble()
                          : static_cast<double>(value.toInt());
}

template <typename Source>
bool read_bool(Source& archive, const std::string& key, const char* caller) {
  const auto value = read_value(archive, key, caller);
  check_type(value.isBool(), value, key, "a bool", caller);
  return value.toBool();
}

template <typename Source>
std::string read_string(Source& archive, const std::string& key,
                        const char* caller) {
  const auto value = read_value(archive, key, caller);
  check_type(value.isString(), value, key, "a string", caller);
  return value.toStringRef();
}

inline void read_archive(torch::serialize::InputArchive& archive,
                         const std::string& key,
                         torch::serialize::InputArchive& part,
                         const char* caller) {
  TORCH_CHECK(archive.try_read(key, part), caller, ": the archive has no '",
              key,
              "' section; it is corrupt or was written by something else.");
}

/// Checks a tensor read from an archive against the live one it is about to
/// replace: the same shape and dtype and, with `finite`, no NaN or inf.
/// `what` names it ("model parameter 'fc.weight'").
inline void check_saved_tensor(const torch::Tensor& saved,
                               const torch::Tensor& live,
                               const std::string& what, bool finite,
                               const char* caller) {
  TORCH_CHECK(saved.sizes() == live.sizes(), caller, ": ", what, " has shape ",
              saved.sizes(), " in the archive but ", live.sizes(),
              " here; load a checkpoint saved from the same model.");
  TORCH_CHECK(saved.dtype() == live.dtype(), caller, ": ", what, " has dtype ",
              saved.dtype(), " in the archive but ", live.dtype(),
              " here; load a checkpoint saved with the same precision.");
  TORCH_CHECK(
      !finite || !saved.is_floating_point() ||
          torch::isfinite(saved).all().item<bool>(),
      caller, ": ", what,
      " holds non-finite values (NaN or inf) in the archive; it was saved after training diverged, or is corrupt. Load an earlier checkpoint.");
}

/// The tensor under `key`, checked against `live` as check_saved_tensor()
/// does; a missing one is an error too.
inline torch::Tensor read_checked_tensor(
    torch::serialize::InputArchive& archive, const std::string& key,
    const torch::Tensor& live, const std::string& what, bool finite,
    const char* caller) {
  torch::Tensor saved;
  TORCH_CHECK(archive.try_read(key, saved), caller, ": the archive has no ",
              what, "; load a checkpoint saved from the same model.");
  check_saved_tensor(saved, live, what, finite, caller);
  return saved;
}

/// Checks every parameter and buffer that `module.load(archive)` would
/// replace, recursively, before anything is replaced: present, the same shape
/// and dtype as the live tensor, and parameters finite. Module::load would
/// take any shape. `prefix` starts the names in messages ("" at the root).
void check_module_archive(const torch::nn::Module& module,
                          torch::serialize::InputArchive& archive,
                          const std::string& prefix, const char* caller);

/// Checks an optimizer archive in LibTorch's layout (every optimizer but
/// LBFGS, and lamp's) against `optimizer` before optimizer.load() changes
/// anything: the number of groups and of parameters per group, and each
/// state tensor's shape, dtype and finiteness against its parameter.
/// LibTorch's load checks the group sizes one group at a time, after it has
/// loaded the ones before, and never the state's shapes. `names` names the
/// parameters in messages (unnamed: "param_groups[g].params[i]"). Archives
/// in another layout are left to the optimizer's own load.
void check_optimizer_archive(
    const torch::optim::Optimizer& optimizer,
    torch::serialize::InputArchive& archive,
    const std::unordered_map<const c10::TensorImpl*, std::string>& names,
    const char* caller);

/// Copies every entry of `from` into `to`: values, tensors and nested
/// archives (recursively), but the keys in `except`. Tensors are copied as
/// values: InputArchive reads a tensor whichever way it was written.
void copy_archive(torch::serialize::InputArchive& from,
                  torch::serialize::OutputArchive& to,
                  const std::vector<std::string>& except = {});

/// `archive` as an InputArchive: written to memory and read back.
torch::serialize::InputArchive reread(torch::serialize::OutputArchive& archive);

} // namespace detail
} // namespace lamp
