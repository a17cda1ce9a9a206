#include "parallel/model_check.h"

#include <ddp/errors.h>

#include "distributed/comm.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace ddp {
namespace detail {
namespace {

// One line per entry: kind, name, then attributes. Tabs cannot occur in names.
struct Entry {
  std::string kind;  // "parameter", "buffer", "option"
  std::string name;
  std::string dtype;
  std::string shape;
  std::string extra;  // requires_grad for parameters, the value for options

  std::string what() const { return kind + " '" + name + "'"; }
  std::string attributes() const {
    if (kind == "option") return "= " + extra;
    std::string s = "shape " + shape + " " + dtype;
    if (kind == "parameter") s += extra == "1" ? " (requires grad)" : " (frozen)";
    return s;
  }
};

std::string shape_of(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

std::vector<Entry> parse(const std::string& text) {
  std::vector<Entry> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::string field;
    std::istringstream ls(line);
    while (std::getline(ls, field, '\t')) f.push_back(field);
    f.resize(5);
    out.push_back(Entry{f[0], f[1], f[2], f[3], f[4]});
  }
  return out;
}

bool same(const Entry& a, const Entry& b) {
  return a.kind == b.kind && a.name == b.name && a.dtype == b.dtype && a.shape == b.shape &&
         a.extra == b.extra;
}

}  // namespace

std::string describe_model(const ModelDescription& model) {
  std::ostringstream os;
  for (const auto& p : model.parameters) {
    os << "parameter\t" << p.first << '\t' << p.second.scalar_type() << '\t' << shape_of(p.second)
       << '\t' << (p.second.requires_grad() ? "1" : "0") << '\n';
  }
  for (const auto& b : model.buffers) {
    os << "buffer\t" << b.first << '\t' << b.second.scalar_type() << '\t' << shape_of(b.second)
       << "\t\n";
  }
  for (const auto& o : model.options) os << "option\t" << o.first << "\t\t\t" << o.second << '\n';
  return os.str();
}

std::string compare_descriptions(const std::vector<std::string>& per_rank) {
  // Parameters first, then buffers, then options: a missing layer is reported as a
  // missing parameter, not as a parameter standing where an option should be.
  for (const char* kind : {"parameter", "buffer", "option"}) {
    std::vector<std::vector<Entry>> lists;
    for (const auto& text : per_rank) {
      std::vector<Entry> mine;
      for (auto& e : parse(text)) {
        if (e.kind == kind) mine.push_back(std::move(e));
      }
      lists.push_back(std::move(mine));
    }
    const auto& ref = lists[0];
    auto differs_at = [&](const std::vector<Entry>& e, size_t k) {
      const bool has = k < e.size(), ref_has = k < ref.size();
      return has != ref_has || (has && !same(e[k], ref[k]));
    };
    // The first position where any rank differs from rank 0.
    size_t first = SIZE_MAX;
    for (size_t r = 1; r < lists.size(); ++r) {
      const size_t n = std::max(lists[r].size(), ref.size());
      for (size_t k = 0; k < n && k < first; ++k) {
        if (differs_at(lists[r], k)) first = k;
      }
    }
    if (first == SIZE_MAX) continue;
    std::vector<int> differing;
    for (size_t r = 1; r < lists.size(); ++r) {
      if (differs_at(lists[r], first)) differing.push_back(static_cast<int>(r));
    }

    std::ostringstream msg;
    msg << "DistributedDataParallel: the wrapped model differs across ranks, so its "
           "gradients cannot be averaged. Ranks differing from rank 0: "
        << join_ranks(differing) << ". First difference: ";
    const int r = differing.front();
    const auto& e = lists[r];
    if (first < ref.size() && first < e.size()) {
      if (ref[first].name == e[first].name) {
        msg << ref[first].what() << " has " << ref[first].attributes() << " on rank 0 but "
            << e[first].attributes() << " on rank " << r << ".";
      } else {
        msg << kind << " #" << first << " is " << ref[first].what() << " ("
            << ref[first].attributes() << ") on rank 0 but " << e[first].what() << " ("
            << e[first].attributes() << ") on rank " << r << ".";
      }
    } else {
      const bool rank0_longer = first < ref.size();
      const auto& longer = rank0_longer ? ref : e;
      msg << "rank 0 has " << ref.size() << " " << kind << "s, rank " << r << " has " << e.size()
          << "; " << longer[first].what() << " exists only on rank " << (rank0_longer ? 0 : r)
          << ".";
    }
    msg << " Build the same model (same architecture and constructor arguments) with the "
           "same DDP options on every rank before wrapping it.";
    return msg.str();
  }
  return "";
}

void verify_model_across_ranks(ProcessGroup& pg, const ModelDescription& model) {
  std::vector<std::string> all;
  try {
    all = pg.all_gather_bytes(describe_model(model));
  } catch (const TimeoutError& e) {
    throw TimeoutError(
        "DistributedDataParallel on rank " + std::to_string(pg.rank()) + " of " +
        std::to_string(pg.size()) + ": waited " + std::to_string(pg.timeout().count()) +
        " ms for every rank to describe its model at construction, and not all did. Every "
        "rank must construct DistributedDataParallel at the same point (it is a "
        "collective); check that no rank failed or skipped it, or raise the process "
        "group's timeout. Cause: " +
        std::string(e.what()));
  }
  const std::string problem = compare_descriptions(all);
  if (!problem.empty()) {
    throw MismatchError(problem + " (reported on rank " + std::to_string(pg.rank()) + ")");
  }
}

void verify_parameters_agree(ProcessGroup& pg,
                             const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                             int64_t iteration) {
  const int64_t n = static_cast<int64_t>(parameters.size());
  at::Tensor sums = at::empty({n}, at::kDouble);
  {
    at::NoGradGuard no_grad;
    for (int64_t i = 0; i < n; ++i) {
      sums[i] = parameters[i].second.to(at::kDouble).sum().cpu();
    }
  }
  const at::Tensor all = all_gather_host(pg, sums);  // [world, n]
  const double* a = all.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) {
    for (int r = 1; r < pg.size(); ++r) {
      const double mine = a[r * n + i];
      const double ref = a[i];
      if (mine == ref || (std::isnan(mine) && std::isnan(ref))) continue;
      std::ostringstream os;
      os.precision(17);
      os << "DistributedDataParallel on rank " << pg.rank() << " of " << pg.size()
         << " (DDP_DEBUG=detail): before iteration " << iteration << ", parameter '"
         << parameters[i].first << "' has diverged: its checksum is " << mine << " on rank " << r
         << " but " << ref << " on rank 0. The replicas no longer hold the same "
         << "weights: a rank changed them outside the optimizer step, or ranks step "
         << "different optimizers.";
      throw MismatchError(os.str());
    }
  }
}

}  // namespace detail
}  // namespace ddp
