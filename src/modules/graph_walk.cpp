#include "modules/graph_walk.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <unordered_map>
#include <unordered_set>

namespace ddp {
namespace detail {

std::vector<bool> reached_accumulators(const std::vector<at::Tensor>& outputs,
                                       const std::vector<NodePtr>& accumulators) {
  using torch::autograd::Node;
  std::unordered_map<const Node*, size_t> index_of;
  for (size_t i = 0; i < accumulators.size(); ++i) index_of[accumulators[i].get()] = i;

  std::vector<bool> reached(accumulators.size(), false);
  std::unordered_set<const Node*> seen;
  std::vector<Node*> stack;
  for (const auto& t : outputs) {
    if (!t.defined() || !t.requires_grad()) continue;
    // A leaf output (a parameter returned as is) has its accumulator as gradient edge.
    auto edge = torch::autograd::impl::gradient_edge(t);
    if (edge.function && seen.insert(edge.function.get()).second) {
      stack.push_back(edge.function.get());
    }
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    auto it = index_of.find(node);
    if (it != index_of.end()) reached[it->second] = true;
    for (const auto& next : node->next_edges()) {
      Node* fn = next.function.get();
      if (fn != nullptr && seen.insert(fn).second) stack.push_back(fn);
    }
  }
  return reached;
}

}  // namespace detail
}  // namespace ddp
