#include "platform/archive.h"

#include <torch/optim/lbfgs.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

namespace lamp {
namespace detail {

// Module::save's layout: a module's own parameters and buffers under their
// names, then one archive per serializable child. Module::load would take
// any shape (it replaces each tensor), so every one is checked first.
void check_module_archive(const torch::nn::Module& module,
                          torch::serialize::InputArchive& archive,
                          const std::string& prefix, const char* caller) {
  // What Module::save writes for this module: its own parameters and
  // buffers, one archive per serializable child (and, from older files, a
  // child since made not serializable: FP8's state). Anything else is
  // another model's (a deeper one's blocks), which Module::load would
  // ignore.
  std::vector<std::string> expected;
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    expected.push_back(p.key());
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    expected.push_back(b.key());
  }
  for (const auto& child : module.named_children()) {
    expected.push_back(child.key());
  }
  for (const auto& key : archive.keys()) {
    TORCH_CHECK(
        std::find(expected.begin(), expected.end(), key) != expected.end(),
        caller, ": the archive holds '", prefix, key,
        "', which this model does not have: it was saved from another "
        "model (another depth or architecture). Load it into the "
        "model it was saved from.");
  }
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    if (p.value().defined()) {
      read_checked_tensor(archive, p.key(), p.value(),
                          "model parameter '" + prefix + p.key() + "'",
                          /*finite=*/true, caller);
    }
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    if (b.value().defined()) {
      read_checked_tensor(archive, b.key(), b.value(),
                          "model buffer '" + prefix + b.key() + "'",
                          /*finite=*/false, caller);
    }
  }
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) {
      continue;
    }
    torch::serialize::InputArchive child_archive;
    TORCH_CHECK(archive.try_read(child.key(), child_archive), caller,
                ": the model has '", prefix, child.key(),
                "', which the archive does not hold: it was saved from "
                "another model (another depth or architecture). Load it into "
                "the model it was saved from.");
    check_module_archive(*child.value(), child_archive,
                         prefix + child.key() + ".", caller);
  }
}

namespace {

int64_t read_size(torch::serialize::InputArchive& archive,
                  const std::string& key, const char* caller) {
  torch::Tensor size;
  TORCH_CHECK(archive.try_read(key, size) && size.numel() == 1 &&
                  !size.is_floating_point(),
              caller, ": the optimizer state has no integer '", key,
              "'; it is corrupt or was written by another optimizer.");
  return size.item<int64_t>();
}

} // namespace

// The layout of LibTorch's optimizers (all but LBFGS, and lamp's, which
// derive from them): "param_groups" holds the groups' count and each group's
// parameter keys, "state" one archive of state tensors per key. LibTorch's
// load checks the group sizes one group at a time, after it has loaded the
// ones before, and never the state's shapes.
namespace {

// Whether this LibTorch writes an optimizer's parameter keys as pointers
// print ("0x..."), as 1.x does, rather than in decimal (2.x): asked of the
// LibTorch itself, once, by saving a one-parameter SGD.
bool writes_pointer_keys() {
  static const bool pointer = [] {
    torch::optim::SGD sgd({torch::zeros({1}).requires_grad_()},
                          torch::optim::SGDOptions(0.1));
    torch::serialize::OutputArchive out;
    sgd.save(out);
    std::ostringstream bytes;
    out.save_to(bytes);
    std::istringstream in(bytes.str());
    torch::serialize::InputArchive archive, groups, group;
    archive.load_from(in);
    archive.read("param_groups", groups);
    groups.read("param_groups/0", group);
    c10::IValue key;
    group.read("params/0", key);
    return key.isString() && key.toStringRef().rfind("0x", 0) == 0;
  }();
  return pointer;
}

} // namespace

void check_optimizer_archive(
    const torch::optim::Optimizer& optimizer,
    torch::serialize::InputArchive& archive,
    const std::unordered_map<const c10::TensorImpl*, std::string>& names,
    const char* caller) {
  c10::IValue version;
  if (!archive.try_read("pytorch_version", version) ||
      dynamic_cast<const torch::optim::LBFGS*>(&optimizer) != nullptr) {
    return; // another layout, left to the optimizer's own load
  }
  torch::serialize::InputArchive groups_archive;
  torch::serialize::InputArchive state_archive;
  read_archive(archive, "param_groups", groups_archive, caller);
  read_archive(archive, "state", state_archive, caller);
  const auto& groups = optimizer.param_groups();
  const int64_t saved_groups =
      read_size(groups_archive, "param_groups/size", caller);
  TORCH_CHECK(saved_groups == static_cast<int64_t>(groups.size()), caller,
              ": the optimizer state holds ", saved_groups,
              " parameter groups but the optimizer has ", groups.size(),
              "; build the optimizer the same way as the one saved.");
  for (size_t g = 0; g < groups.size(); ++g) {
    torch::serialize::InputArchive group_archive;
    read_archive(groups_archive, "param_groups/" + std::to_string(g),
                 group_archive, caller);
    // Another kind of optimizer (SGD's state into AdamW) has other options:
    // LibTorch's load would stop at an INTERNAL ASSERT reading them.
    torch::serialize::InputArchive saved_options;
    read_archive(group_archive, "options", saved_options, caller);
    torch::serialize::OutputArchive options_out;
    groups[g].options().serialize(options_out);
    auto options = reread(options_out);
    auto saved_keys = saved_options.keys();
    auto keys = options.keys();
    std::sort(saved_keys.begin(), saved_keys.end());
    std::sort(keys.begin(), keys.end());
    const auto joined = [](const std::vector<std::string>& names) {
      std::string text;
      for (const auto& name : names) {
        text += (text.empty() ? "" : ", ") + name;
      }
      return text;
    };
    TORCH_CHECK(saved_keys == keys, caller,
                ": the optimizer state was written by another kind of "
                "optimizer (its options: ",
                joined(saved_keys), "; this optimizer's: ", joined(keys),
                "); build the optimizer the run saved with.");
    const auto& params = groups[g].params();
    const int64_t saved_params =
        read_size(group_archive, "params/size", caller);
    TORCH_CHECK(saved_params == static_cast<int64_t>(params.size()), caller,
                ": parameter group ", g, " of the optimizer state holds ",
                saved_params, " parameters but the optimizer's has ",
                params.size(),
                "; build the optimizer the same way as the one saved.");
    for (size_t i = 0; i < params.size(); ++i) {
      const auto key =
          read_string(group_archive, "params/" + std::to_string(i), caller);
      // LibTorch 1.x wrote each parameter's key as a pointer prints
      // ("0x55d1..."); 2.x reads keys back with std::stoull, which makes
      // every such key 0: all states would land on one parameter and the
      // others get none (a crash in the optimizer's next step).
      TORCH_CHECK(key.rfind("0x", 0) != 0 || writes_pointer_keys(), caller,
                  ": the optimizer state was written by a build on LibTorch "
                  "1.x, whose parameter keys this LibTorch cannot read back "
                  "(every one would load as the same). Resume it with a "
                  "build on LibTorch 1.x, or start a new run from its weights "
                  "(TrainerOptions::init_from; the programs' --init-from).");
      torch::serialize::InputArchive param_state;
      if (!state_archive.try_read(key, param_state)) {
        continue; // no state yet for this parameter
      }
      const auto named = names.find(params[i].unsafeGetTensorImpl());
      const std::string param = named != names.end()
                                    ? "'" + named->second + "'"
                                    : "param_groups[" + std::to_string(g) +
                                          "].params[" + std::to_string(i) + "]";
      for (const auto& field : param_state.keys()) {
        c10::IValue value;
        if (param_state.try_read(field, value) && value.isTensor()) {
          check_saved_tensor(value.toTensor(), params[i],
                             "optimizer state '" + field + "' of " + param,
                             /*finite=*/true, caller);
        }
      }
    }
  }
}

void copy_archive(torch::serialize::InputArchive& from,
                  torch::serialize::OutputArchive& to,
                  const std::vector<std::string>& except) {
  for (const auto& key : from.keys()) {
    if (std::find(except.begin(), except.end(), key) != except.end()) {
      continue;
    }
    // A nested archive first: it is an attribute too.
    torch::serialize::InputArchive nested;
    if (from.try_read(key, nested)) {
      torch::serialize::OutputArchive copy(to.compilation_unit());
      copy_archive(nested, copy);
      to.write(key, copy);
      continue;
    }
    c10::IValue value;
    if (from.try_read(key, value)) {
      to.write(key, value);
    }
  }
}

torch::serialize::InputArchive reread(
    torch::serialize::OutputArchive& archive) {
  std::stringstream buffer;
  archive.save_to(buffer);
  torch::serialize::InputArchive result;
  result.load_from(buffer);
  return result;
}

} // namespace detail
} // namespace lamp
