#include "optim/state_snapshot.h"

#include <torch/serialize/output-archive.h>

#include "lamp/optim/optimizer.h"

namespace lamp {
namespace optim {
namespace internal {

StateSnapshot::StateSnapshot(torch::optim::Optimizer& optimizer)
    : optimizer_(optimizer) {
  if (dynamic_cast<const AmpStep*>(&optimizer) != nullptr) {
    // save() writes the step counts a fused step keeps on the device into
    // the host state (the archive holds references, no copies); a load
    // forgets the device ones.
    torch::serialize::OutputArchive scratch;
    optimizer.save(scratch);
  }
  for (const auto& entry : optimizer.state()) {
    state_.emplace(entry.first, entry.second->clone());
  }
  for (const auto& group : optimizer.param_groups()) {
    options_.push_back(group.options().clone());
  }
}

void StateSnapshot::restore() {
  optimizer_.state() = std::move(state_);
  auto& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size() && g < options_.size(); ++g) {
    groups[g].set_options(std::move(options_[g]));
  }
}

} // namespace internal
} // namespace optim
} // namespace lamp
