// DeviceMesh (ddp/distributed/device_mesh.h): torch.distributed.device_mesh's layout and
// groups, over new_group.

#include <ddp/distributed/device_mesh.h>

#include "distributed/common/check.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

namespace ddp {

struct DeviceMesh::Root {
  std::string device_type;
  at::Tensor mesh;  // the root's global ranks
  std::vector<std::string> names;
  std::shared_ptr<ProcessGroup> parent;  // new_group's parent for flatten's groups
  GroupOptions options;
  int self = -1;  // this process's global rank
  // flatten()'s meshes by name: this rank's row and its group.
  std::map<std::string, std::pair<at::Tensor, std::shared_ptr<ProcessGroup>>> flattened;
};

namespace {

std::string shape_of(const at::Tensor& t) {
  std::ostringstream os;
  os << "(";
  for (int64_t d = 0; d < t.dim(); ++d) os << (d ? ", " : "") << t.size(d);
  os << (t.dim() == 1 ? ",)" : ")");
  return os.str();
}

std::vector<int> ranks_of(const at::Tensor& row) {
  std::vector<int> out;
  const at::Tensor c = row.contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  for (int64_t i = 0; i < c.numel(); ++i) out.push_back(static_cast<int>(p[i]));
  return out;
}

// Where `rank` stands in `mesh`, or nullopt.
std::optional<std::vector<int64_t>> coordinate_of(const at::Tensor& mesh, int rank) {
  const at::Tensor hits = (mesh == rank).nonzero();
  if (hits.size(0) == 0) return std::nullopt;
  std::vector<int64_t> out;
  for (int64_t d = 0; d < hits.size(1); ++d) out.push_back(hits[0][d].item<int64_t>());
  return out;
}

// This rank's group of each row of `rows` ([groups, members]), made on every rank.
std::shared_ptr<ProcessGroup> groups_of_rows(const at::Tensor& rows, const GroupOptions& options,
                                             const std::shared_ptr<ProcessGroup>& parent) {
  std::shared_ptr<ProcessGroup> mine;
  for (int64_t i = 0; i < rows.size(0); ++i) {
    auto g = new_group(ranks_of(rows[i]), options, parent);
    if (g->is_member()) mine = g;
  }
  return mine;
}

}  // namespace

DeviceMesh::DeviceMesh(std::string device_type, const at::Tensor& mesh,
                       std::vector<std::string> dim_names,
                       const std::shared_ptr<ProcessGroup>& parent, const GroupOptions& options) {
  std::shared_ptr<ProcessGroup> p = parent ? parent : default_group();
  DDP_CHECK(p->is_member(), "DeviceMesh: this rank is not a member of the parent group; make "
                            "the mesh from a group it belongs to.");
  const int self = p->ranks()[static_cast<size_t>(p->rank())];
  DDP_CHECK(mesh.defined() && mesh.numel() > 0 && mesh.dim() >= 1 &&
                !at::isFloatingType(mesh.scalar_type()),
            "DeviceMesh: the mesh must be a tensor of integer ranks with at least one "
            "dimension and one rank, on rank ",
            self, ".");
  const at::Tensor m = mesh.to(at::kLong).cpu().contiguous();
  std::set<int> seen;
  for (int r : ranks_of(m)) {
    DDP_CHECK(seen.insert(r).second, "DeviceMesh: rank ", r, " appears twice in the mesh, on rank ",
              self, ".");
    DDP_CHECK(std::find(p->ranks().begin(), p->ranks().end(), r) != p->ranks().end(),
              "DeviceMesh: rank ", r, " of the mesh is not in the parent group, on rank ", self,
              ".");
  }
  DDP_CHECK(dim_names.empty() || static_cast<int64_t>(dim_names.size()) == m.dim(),
            "DeviceMesh: ", dim_names.size(), " dimension name(s) for a mesh of ", m.dim(),
            " dimension(s) ", shape_of(m), "; give one name per dimension, or none.");
  DDP_CHECK(std::set<std::string>(dim_names.begin(), dim_names.end()).size() == dim_names.size(),
            "DeviceMesh: the dimension names must all differ.");
  DDP_CHECK(device_type == "cpu" || device_type == "cuda", "DeviceMesh: device_type \"",
            device_type, "\" is not \"cpu\" or \"cuda\".");
  const bool cuda_parent = p->device().is_cuda();
  DDP_CHECK(device_type == "cpu" || cuda_parent,
            "DeviceMesh(\"cuda\") needs a parent group on "
            "GPUs (nccl), but the parent's backend is \"",
            p->backend(), "\".");
  GroupOptions opts = options;
  if (device_type == "cpu" && cuda_parent && opts.backend().empty()) opts.backend("gloo");

  root_ = std::make_shared<Root>();
  root_->device_type = std::move(device_type);
  root_->mesh = m;
  root_->names = dim_names;
  root_->parent = p;
  root_->options = opts;
  root_->self = self;
  mesh_ = m;
  names_ = std::move(dim_names);
  const bool whole_parent = m.dim() == 1 && ranks_of(m) == p->ranks();
  for (int64_t d = 0; d < m.dim(); ++d) {
    root_dims_.push_back(d);
    if (whole_parent) {
      groups_.push_back(p);  // as PyTorch: a 1-D mesh of the whole group uses the group
      continue;
    }
    // PyTorch's order: the rows of mesh.swapdims(-1, d), each one group.
    const at::Tensor rows = m.transpose(d, m.dim() - 1).reshape({-1, m.size(d)});
    groups_.push_back(groups_of_rows(rows, opts, p));
  }
}

DeviceMesh DeviceMesh::from_group(const std::shared_ptr<ProcessGroup>& group,
                                  std::string device_type, std::string dim_name) {
  DDP_CHECK(group, "DeviceMesh::from_group got no group.");
  DeviceMesh out;
  out.root_ = std::make_shared<Root>();
  out.root_->device_type = std::move(device_type);
  std::vector<int64_t> ranks(group->ranks().begin(), group->ranks().end());
  out.root_->mesh = at::tensor(ranks, at::kLong);
  if (!dim_name.empty()) out.root_->names = {dim_name};
  out.root_->parent = group;
  out.root_->self = group->is_member() ? group->ranks()[static_cast<size_t>(group->rank())] : -1;
  out.mesh_ = out.root_->mesh;
  out.names_ = out.root_->names;
  out.root_dims_ = {0};
  out.groups_ = {group->is_member() ? group : nullptr};
  return out;
}

const std::string& DeviceMesh::device_type() const { return root_->device_type; }
const at::Tensor& DeviceMesh::mesh() const { return mesh_; }
int64_t DeviceMesh::ndim() const { return mesh_.dim(); }
std::vector<int64_t> DeviceMesh::shape() const { return mesh_.sizes().vec(); }
int64_t DeviceMesh::size() const { return mesh_.numel(); }
int64_t DeviceMesh::size(int64_t dim) const { return mesh_.size(dim_index(dim, "size")); }
int64_t DeviceMesh::size(const std::string& dim) const {
  return mesh_.size(dim_index(dim, "size"));
}
const std::vector<std::string>& DeviceMesh::mesh_dim_names() const { return names_; }

int64_t DeviceMesh::dim_index(int64_t dim, const char* what) const {
  if (dim == -1) {
    DDP_CHECK(ndim() == 1, "DeviceMesh::", what, ": this mesh has ", ndim(),
              " dimensions; say which one.");
    return 0;
  }
  DDP_CHECK(dim >= 0 && dim < ndim(), "DeviceMesh::", what, ": dimension ", dim,
            " is not one of this mesh's 0..", ndim() - 1, ".");
  return dim;
}

int64_t DeviceMesh::dim_index(const std::string& name, const char* what) const {
  const auto it = std::find(names_.begin(), names_.end(), name);
  if (it != names_.end()) return it - names_.begin();
  std::string known;
  for (const auto& n : names_) known += (known.empty() ? "\"" : ", \"") + n + "\"";
  detail::throw_error(c10::str("DeviceMesh::", what, ": no dimension is named \"", name,
                               "\"; this mesh's are ", known.empty() ? "unnamed" : known, "."));
}

std::shared_ptr<ProcessGroup> DeviceMesh::get_group(int64_t dim) const {
  const int64_t d = dim_index(dim, "get_group");
  DDP_CHECK(groups_[static_cast<size_t>(d)], "DeviceMesh::get_group: global rank ", root_->self,
            " is not in this mesh ", to_string(), ".");
  return groups_[static_cast<size_t>(d)];
}

std::shared_ptr<ProcessGroup> DeviceMesh::get_group(const std::string& dim) const {
  return get_group(dim_index(dim, "get_group"));
}

std::vector<std::shared_ptr<ProcessGroup>> DeviceMesh::get_all_groups() const {
  std::vector<std::shared_ptr<ProcessGroup>> out;
  for (int64_t d = 0; d < ndim(); ++d) out.push_back(get_group(d));
  return out;
}

int64_t DeviceMesh::get_local_rank(int64_t dim) const { return get_group(dim)->rank(); }
int64_t DeviceMesh::get_local_rank(const std::string& dim) const { return get_group(dim)->rank(); }

std::optional<std::vector<int64_t>> DeviceMesh::get_coordinate() const {
  return coordinate_of(mesh_, root_->self);
}

DeviceMesh DeviceMesh::operator[](const std::string& dim) const {
  if (std::find(names_.begin(), names_.end(), dim) == names_.end()) {
    const auto it = root_->flattened.find(dim);
    if (it != root_->flattened.end()) {
      DeviceMesh out;
      out.root_ = root_;
      out.mesh_ = it->second.first;
      out.names_ = {dim};
      out.root_dims_ = {-1};
      out.groups_ = {it->second.second};
      return out;
    }
  }
  return (*this)[std::vector<std::string>{dim}];
}

DeviceMesh DeviceMesh::operator[](const std::vector<std::string>& dims) const {
  DDP_CHECK(!dims.empty(), "DeviceMesh[]: name at least one dimension.");
  std::vector<int64_t> idx;
  for (const auto& name : dims) idx.push_back(dim_index(name, "operator[]"));
  DDP_CHECK(std::set<int64_t>(idx.begin(), idx.end()).size() == idx.size(),
            "DeviceMesh[]: a dimension is named twice.");
  const auto coord = get_coordinate();
  DDP_CHECK(coord, "DeviceMesh[]: global rank ", root_->self, " is not in this mesh ", to_string(),
            ".");
  at::Tensor t = mesh_;
  for (int64_t d = ndim() - 1; d >= 0; --d) {
    if (std::find(idx.begin(), idx.end(), d) == idx.end()) t = t.select(d, (*coord)[d]);
  }
  // t's dimensions are idx's in increasing order; put them in the order asked.
  std::vector<int64_t> sorted = idx;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> perm;
  for (int64_t d : idx) perm.push_back(std::find(sorted.begin(), sorted.end(), d) - sorted.begin());
  DeviceMesh out;
  out.root_ = root_;
  out.mesh_ = t.permute(perm).contiguous();
  for (int64_t d : idx) {
    out.names_.push_back(names_[static_cast<size_t>(d)]);
    out.root_dims_.push_back(root_dims_[static_cast<size_t>(d)]);
    out.groups_.push_back(groups_[static_cast<size_t>(d)]);
  }
  return out;
}

DeviceMesh DeviceMesh::flatten(const std::string& name) const {
  std::string flat = name;
  if (flat.empty()) {
    for (const auto& n : names_) flat += (flat.empty() ? "" : "_") + n;
  }
  DDP_CHECK(!flat.empty(), "DeviceMesh::flatten: name the flattened dimension (this mesh's "
                           "dimensions have no names to join).");
  const auto cached = root_->flattened.find(flat);
  if (cached == root_->flattened.end()) {
    for (int64_t d : root_dims_) {
      DDP_CHECK(d >= 0, "DeviceMesh::flatten: this mesh is already flattened.");
    }
    // Every slice of the root along the flattened dimensions is a group, on every rank.
    const at::Tensor& root = root_->mesh;
    std::vector<int64_t> perm;
    for (int64_t d = 0; d < root.dim(); ++d) {
      if (std::find(root_dims_.begin(), root_dims_.end(), d) == root_dims_.end()) perm.push_back(d);
    }
    perm.insert(perm.end(), root_dims_.begin(), root_dims_.end());
    const at::Tensor rows = root.permute(perm).reshape({-1, mesh_.numel()});
    std::shared_ptr<ProcessGroup> mine = groups_of_rows(rows, root_->options, root_->parent);
    at::Tensor my_row;
    for (int64_t i = 0; i < rows.size(0); ++i) {
      if (coordinate_of(rows[i], root_->self)) my_row = rows[i].clone();
    }
    root_->flattened[flat] = {my_row, mine};
  }
  const auto& entry = root_->flattened[flat];
  DeviceMesh out;
  out.root_ = root_;
  out.mesh_ = entry.first.defined() ? entry.first : mesh_.reshape({-1});
  out.names_ = {flat};
  out.root_dims_ = {-1};
  out.groups_ = {entry.second};
  return out;
}

std::string DeviceMesh::to_string() const {
  std::ostringstream os;
  os << "DeviceMesh('" << root_->device_type << "', ";
  std::function<void(const at::Tensor&)> put = [&](const at::Tensor& t) {
    if (t.dim() == 0) {
      os << t.item<int64_t>();
      return;
    }
    os << "[";
    for (int64_t i = 0; i < t.size(0); ++i) {
      if (i) os << ", ";
      put(t[i]);
    }
    os << "]";
  };
  put(mesh_);
  if (!names_.empty()) {
    os << ", mesh_dim_names=(";
    for (size_t i = 0; i < names_.size(); ++i) os << (i ? ", " : "") << "'" << names_[i] << "'";
    os << (names_.size() == 1 ? ",)" : ")");
  }
  os << ")";
  return os.str();
}

DeviceMesh init_device_mesh(const std::string& device_type, const std::vector<int64_t>& mesh_shape,
                            const std::vector<std::string>& mesh_dim_names) {
  std::shared_ptr<ProcessGroup> world = default_group();
  DDP_CHECK(!mesh_shape.empty(), "init_device_mesh: the mesh shape is empty.");
  int64_t n = 1;
  for (int64_t s : mesh_shape) {
    DDP_CHECK(s > 0,
              "init_device_mesh: every dimension needs at least one rank, but the shape "
              "holds ",
              s, ".");
    n *= s;
  }
  DDP_CHECK(n == world->size(), "init_device_mesh: a mesh of ", n, " rank(s) for a world of ",
            world->size(), "; the shape's product must be the world size.");
  return DeviceMesh(device_type, at::arange(n, at::kLong).view(mesh_shape), mesh_dim_names, world);
}

}  // namespace ddp
