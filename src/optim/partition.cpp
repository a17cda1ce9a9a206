#include "optim/partition.h"

#include "distributed/comm.h"

#include <ddp/errors.h>

#include <ATen/core/Tensor.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <sstream>

namespace ddp {
namespace detail {

std::vector<int> partition_parameters(const std::vector<std::vector<int64_t>>& numels,
                                      int world_size) {
  std::vector<int> owners;
  std::vector<int64_t> totals(static_cast<size_t>(world_size), 0);
  for (const auto& group : numels) {
    std::vector<size_t> order(group.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return group[a] > group[b]; });
    std::vector<int> group_owners(group.size(), 0);
    for (const size_t i : order) {
      const auto least = std::min_element(totals.begin(), totals.end());
      group_owners[i] = static_cast<int>(least - totals.begin());
      *least += group[i];
    }
    owners.insert(owners.end(), group_owners.begin(), group_owners.end());
  }
  return owners;
}

std::vector<std::string> describe_parameters(
    const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  std::vector<std::string> lines;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      std::ostringstream os;
      os << "group " << g << " parameter " << i << ": " << params[i].scalar_type() << " "
         << params[i].sizes();
      lines.push_back(os.str());
    }
  }
  return lines;
}

namespace {

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& line : lines) out += line + "\n";
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

void check_same_everywhere(ProcessGroup& group, const std::vector<std::string>& description,
                           const std::string& what) {
  // A digest first (one small exchange); the full lists only when digests differ.
  const std::string text = join_lines(description);
  const std::string digest =
      std::to_string(description.size()) + " " + std::to_string(std::hash<std::string>{}(text));
  const std::vector<std::string> digests = group.all_gather_bytes(digest);
  if (std::all_of(digests.begin(), digests.end(),
                  [&](const std::string& d) { return d == digests[0]; })) {
    return;
  }
  const std::vector<std::string> all = group.all_gather_bytes(text);
  const std::vector<std::string> first = split_lines(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    const std::vector<std::string> theirs = split_lines(all[r]);
    const size_t common = std::min(first.size(), theirs.size());
    for (size_t i = 0; i < common; ++i) {
      if (first[i] == theirs[i]) continue;
      throw MismatchError(
          c10::str(what, ": rank ", r, " has ", theirs[i], " where rank 0 has ", first[i],
                   " (seen on rank ", group.rank(), " of ", group.size(),
                   "). Every rank must pass the same parameters, in the same order and param "
                   "groups, with the same shapes and dtypes: build the model identically on every "
                   "rank before creating the optimizer."));
    }
    if (first.size() != theirs.size()) {
      throw MismatchError(c10::str(
          what, ": rank ", r, " has ", theirs.size(), " parameter(s) but rank 0 has ", first.size(),
          " (seen on rank ", group.rank(), " of ", group.size(), "); the first ",
          first.size() > theirs.size() ? "missing on rank " + std::to_string(r) + " is "
                                       : "extra on rank " + std::to_string(r) + " is ",
          first.size() > theirs.size() ? first[common] : theirs[common],
          ". Every rank must pass the same parameters, in the same order and param groups."));
    }
  }
}

}  // namespace detail
}  // namespace ddp
