#include "distributed/reshard.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "platform/archive.h"

namespace lamp {
namespace distributed {
namespace detail {

torch::Tensor reshard_flat(const std::vector<torch::Tensor>& saved,
                           const ReshardSizes& sizes, int rank) {
  const auto flat = torch::cat(saved);
  TORCH_CHECK(flat.numel() >= sizes.numel,
              "lamp::distributed: the saved shards hold ", flat.numel(),
              " elements, fewer than the ", sizes.numel, " laid out.");
  auto shard = torch::zeros({sizes.new_shard}, flat.options());
  const int64_t begin = rank * sizes.new_shard;
  const int64_t end = std::min(begin + sizes.new_shard, sizes.numel);
  if (end > begin) {
    shard.narrow(0, 0, end - begin).copy_(flat.narrow(0, begin, end - begin));
  }
  return shard;
}

namespace {

std::string shown(const c10::IValue& value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// Whether a state value is one of the shard's elements (a momentum, a
// moment): a 1-D tensor of the saved shard's size.
bool per_element(const c10::IValue& value, int64_t shard) {
  return value.isTensor() && value.toTensor().dim() == 1 &&
         value.toTensor().size(0) == shard;
}

bool same(const c10::IValue& a, const c10::IValue& b) {
  if (a.isTensor() || b.isTensor()) {
    return a.isTensor() && b.isTensor() &&
           a.toTensor().sizes() == b.toTensor().sizes() &&
           a.toTensor().scalar_type() == b.toTensor().scalar_type() &&
           torch::equal(a.toTensor(), b.toTensor());
  }
  return a.tagKind() == b.tagKind() && shown(a) == shown(b);
}

} // namespace

void reshard_optimizer(std::vector<torch::serialize::InputArchive>& optimizers,
                       const std::vector<std::vector<ReshardSizes>>& groups,
                       int rank, torch::serialize::OutputArchive& out,
                       const std::string& where) {
  const auto* caller = where.c_str();
  const size_t n = optimizers.size();
  c10::IValue version;
  TORCH_CHECK(
      optimizers.at(0).try_read("pytorch_version", version), where,
      ": the optimizer's state is not in torch::optim's layout; only the state "
      "of torch::optim's optimizers and lamp's (SGD, Adam, AdamW, ...) can be "
      "re-sharded. Resume with the number of ranks it was saved on.");
  out.write("pytorch_version", version);
  std::vector<torch::serialize::InputArchive> group_lists(n);
  std::vector<torch::serialize::InputArchive> states(n);
  for (size_t k = 0; k < n; ++k) {
    lamp::detail::read_archive(optimizers[k], "param_groups", group_lists[k],
                               caller);
    lamp::detail::read_archive(optimizers[k], "state", states[k], caller);
    torch::Tensor size;
    TORCH_CHECK(group_lists[k].try_read("param_groups/size", size) &&
                    size.numel() == 1 &&
                    size.item<int64_t>() == static_cast<int64_t>(groups.size()),
                where, ": rank ", k, "'s optimizer state does not hold ",
                groups.size(),
                " param groups; build the optimizer the same way as the one "
                "saved.");
  }
  // Rank 0's groups (their options, and its keys for the state below).
  torch::serialize::OutputArchive groups_out(out.compilation_unit());
  lamp::detail::copy_archive(group_lists[0], groups_out);
  out.write("param_groups", groups_out);

  torch::serialize::OutputArchive state_out(out.compilation_unit());
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto group_key = "param_groups/" + std::to_string(g);
    for (size_t i = 0; i < groups[g].size(); ++i) {
      const auto& sizes = groups[g][i];
      const auto param_key = "params/" + std::to_string(i);
      std::string key0;
      std::vector<torch::serialize::InputArchive> saved(n);
      size_t with_state = 0;
      for (size_t k = 0; k < n; ++k) {
        torch::serialize::InputArchive group;
        lamp::detail::read_archive(group_lists[k], group_key, group, caller);
        const auto key = lamp::detail::read_string(group, param_key, caller);
        if (k == 0) {
          key0 = key;
        }
        with_state += states[k].try_read(key, saved[k]) ? 1 : 0;
      }
      if (with_state == 0) {
        continue; // no step yet
      }
      TORCH_CHECK(with_state == n, where, ": ", with_state, " of the ", n,
                  " ranks' optimizer states hold state for param group ", g,
                  "'s shard ", i,
                  "; the checkpoint's files come from different runs.");
      torch::serialize::OutputArchive fields(out.compilation_unit());
      for (const auto& field : saved[0].keys()) {
        std::vector<c10::IValue> values(n);
        for (size_t k = 0; k < n; ++k) {
          TORCH_CHECK(saved[k].try_read(field, values[k]), where, ": rank ", k,
                      "'s optimizer state has no '", field,
                      "' for param group ", g, "'s shard ", i, ".");
        }
        if (per_element(values[0], sizes.old_shard)) {
          std::vector<torch::Tensor> pieces;
          for (size_t k = 0; k < n; ++k) {
            TORCH_CHECK(per_element(values[k], sizes.old_shard), where,
                        ": rank ", k, "'s optimizer state '", field,
                        "' of param group ", g, "'s shard ", i, " is not ",
                        sizes.old_shard, " elements like rank 0's.");
            pieces.push_back(values[k].toTensor());
          }
          fields.write(field, c10::IValue(reshard_flat(pieces, sizes, rank)));
          continue;
        }
        for (size_t k = 1; k < n; ++k) {
          TORCH_CHECK(same(values[0], values[k]), where,
                      ": the optimizer state '", field, "' of param group ", g,
                      "'s shard ", i, " differs between rank 0 (",
                      shown(values[0]), ") and rank ", k, " (",
                      shown(values[k]),
                      "); the checkpoint's files come from different steps "
                      "or runs.");
        }
        fields.write(field, values[0]);
      }
      state_out.write(key0, fields);
    }
  }
  out.write("state", state_out);
}

std::vector<std::pair<std::string, torch::Tensor>> gather_saved_masters(
    std::vector<torch::serialize::InputArchive>& shards,
    const std::string& where) {
  const auto* caller = where.c_str();
  std::vector<std::pair<std::string, torch::Tensor>> masters;
  c10::IValue names;
  if (shards.empty() || !shards[0].try_read("names", names)) {
    return masters;
  }
  TORCH_CHECK(names.isList(), where,
              ": the shards' list of parameter names is damaged.");
  const auto world = static_cast<int64_t>(shards.size());
  torch::Tensor layout;
  TORCH_CHECK(shards[0].try_read("layout", layout) &&
                  layout.scalar_type() == torch::kLong && layout.dim() == 1,
              where, ": rank 0's shard layout is missing or damaged.");
  for (int64_t k = 0; k < world; ++k) {
    const auto their_world =
        lamp::detail::read_int(shards[k], "world_size", caller);
    const auto rank = lamp::detail::read_int(shards[k], "rank", caller);
    torch::Tensor theirs;
    TORCH_CHECK(their_world == world && rank == k &&
                    shards[k].try_read("layout", theirs) &&
                    theirs.sizes() == layout.sizes() &&
                    theirs.scalar_type() == torch::kLong &&
                    torch::equal(theirs, layout),
                where, ": shard ", k, " of ", world, " is not rank ", k,
                "'s of the same run (it says rank ", rank, " of ", their_world,
                ").");
  }
  // [group, dtype, count, numel...] per unit (ZeroSharding::layout_tensor).
  const auto values = layout.contiguous();
  const auto* v = values.data_ptr<int64_t>();
  const int64_t n = values.numel();
  const auto& listed = names.toListRef();
  size_t next_name = 0;
  int64_t unit = 0;
  for (int64_t at = 0; at < n; ++unit) {
    TORCH_CHECK(at + 3 <= n && v[at + 2] >= 0 && v[at + 2] <= n - at - 3, where,
                ": the shard layout is damaged.");
    const int64_t count = v[at + 2];
    const auto* numels = v + at + 3;
    at += 3 + count;
    int64_t numel = 0;
    for (int64_t j = 0; j < count; ++j) {
      TORCH_CHECK(numels[j] >= 0 &&
                      numel <= std::numeric_limits<int64_t>::max() - numels[j],
                  where, ": the shard layout is damaged.");
      numel += numels[j];
    }
    const int64_t shard = numel / world + (numel % world != 0 ? 1 : 0);
    std::vector<torch::Tensor> pieces;
    for (int64_t k = 0; k < world; ++k) {
      pieces.push_back(lamp::detail::read_checked_tensor(
          shards[k], "shard_" + std::to_string(unit),
          torch::empty({shard}, torch::kFloat),
          "rank " + std::to_string(k) + "'s shard " + std::to_string(unit),
          /*finite=*/true, caller));
    }
    const auto flat = torch::cat(pieces);
    int64_t offset = 0;
    for (int64_t j = 0; j < count; ++j, ++next_name) {
      TORCH_CHECK(next_name < listed.size() && listed[next_name].isString(),
                  where,
                  ": the shards name fewer parameters than they lay out.");
      masters.emplace_back(listed[next_name].toStringRef(),
                           flat.narrow(0, offset, numels[j]));
      offset += numels[j];
    }
  }
  TORCH_CHECK(next_name == listed.size(), where, ": the shards name ",
              listed.size(), " parameters but lay out ", next_name, ".");
  return masters;
}

} // namespace detail
} // namespace distributed
} // namespace lamp
