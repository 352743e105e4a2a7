#pragma once

// Which ops a forward pass recorded: the autograd graph behind a tensor.
#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

namespace lamp_test {

/// Calls f(node) once for every autograd node in the graph behind `root`.
template <typename F>
void for_each_node(const torch::Tensor& root, F&& f) {
  std::set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo{root.grad_fn().get()};
  while (!todo.empty()) {
    auto* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second) {
      continue;
    }
    f(*node);
    for (const auto& edge : node->next_edges()) {
      todo.push_back(edge.function.get());
    }
  }
}

/// The autograd nodes in the graph behind `root` whose name contains
/// `name` ("FusedBatchNorm", "FoldedConvFunction"), each counted once.
inline int count_nodes_named(const torch::Tensor& root,
                             const std::string& name) {
  int count = 0;
  for_each_node(root, [&](const torch::autograd::Node& node) {
    if (node.name().find(name) != std::string::npos) {
      ++count;
    }
  });
  return count;
}

} // namespace lamp_test
