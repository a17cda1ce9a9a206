#pragma once

// DeviceMesh: the ranks laid out in named dimensions, each dimension with its groups, as
// torch.distributed.device_mesh. The layout is PyTorch's (row-major): in a 2 x 4 mesh
// ("dp", "tp") of 8 ranks, the "tp" groups are {0, 1, 2, 3} and {4, 5, 6, 7} and the "dp"
// groups {0, 4}, {1, 5}, {2, 6} and {3, 7}.
//
// Example:
//   auto mesh = ddp::init_device_mesh("cpu", {2, 4}, {"dp", "tp"});
//   auto tp = mesh.get_group("tp");       // this rank's tensor-parallel group
//   ddp::DeviceMesh dp = mesh["dp"];      // a 1-D submesh
//   int i = mesh.get_local_rank("tp");    // this rank's coordinate along "tp"
//
// The groups of every dimension are made once, when the mesh is made (collective over
// the parent group: every rank makes the same meshes in the same order). Submeshes reuse
// them; flatten() makes the groups of the flattened dimension.

#include <ddp/distributed/groups.h>
#include <ddp/distributed/process_group.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddp {

class DeviceMesh {
 public:
  /// A mesh over `mesh` (global ranks, any shape, each rank once; every rank of the
  /// mesh is in `parent`, the default group when null). `dim_names`: one per dimension,
  /// all different, or none. Collective over the parent: makes every dimension's groups.
  DeviceMesh(std::string device_type, const at::Tensor& mesh,
             std::vector<std::string> dim_names = {},
             const std::shared_ptr<ProcessGroup>& parent = nullptr,
             const GroupOptions& options = GroupOptions());

  /// DeviceMesh.from_group: a 1-D mesh over `group`'s ranks, whose dimension's group is
  /// `group` itself. Not collective.
  static DeviceMesh from_group(const std::shared_ptr<ProcessGroup>& group, std::string device_type,
                               std::string dim_name = "");

  const std::string& device_type() const;
  /// The global ranks, in the mesh's shape.
  const at::Tensor& mesh() const;
  int64_t ndim() const;
  std::vector<int64_t> shape() const;
  /// The number of ranks; with a dimension, its length.
  int64_t size() const;
  int64_t size(int64_t dim) const;
  int64_t size(const std::string& dim) const;
  const std::vector<std::string>& mesh_dim_names() const;

  /// This rank's group along `dim` (the only dimension when there is one).
  std::shared_ptr<ProcessGroup> get_group(int64_t dim = -1) const;
  std::shared_ptr<ProcessGroup> get_group(const std::string& dim) const;
  /// One group per dimension, in order.
  std::vector<std::shared_ptr<ProcessGroup>> get_all_groups() const;
  /// This rank's coordinate along `dim`: its rank in get_group(dim).
  int64_t get_local_rank(int64_t dim = -1) const;
  int64_t get_local_rank(const std::string& dim) const;
  /// This rank's coordinates, or nullopt when it is not in the mesh.
  std::optional<std::vector<int64_t>> get_coordinate() const;

  /// mesh["tp"]: the 1-D submesh along "tp" that holds this rank; its group is this
  /// mesh's "tp" group. Not collective.
  DeviceMesh operator[](const std::string& dim) const;
  /// mesh[{"dp", "cp"}]: the submesh of those dimensions, in that order, that holds this
  /// rank. Not collective.
  DeviceMesh operator[](const std::vector<std::string>& dims) const;
  /// DeviceMesh._flatten: a 1-D mesh of all of this mesh's dimensions together, named
  /// `name` (default: the names joined by "_"). Collective over the root mesh's parent:
  /// every rank makes the groups of every such slice of the root mesh.
  DeviceMesh flatten(const std::string& name = "") const;

  /// "DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))"
  std::string to_string() const;

 private:
  struct Root;
  DeviceMesh() = default;
  int64_t dim_index(const std::string& name, const char* what) const;
  int64_t dim_index(int64_t dim, const char* what) const;

  std::shared_ptr<Root> root_;                         // the mesh that made the groups
  at::Tensor mesh_;                                    // this (sub)mesh's global ranks
  std::vector<std::string> names_;                     // one per dimension, or none
  std::vector<int64_t> root_dims_;                     // which root dimension each dimension is
  std::vector<std::shared_ptr<ProcessGroup>> groups_;  // this rank's, per dimension
};

/// torch.distributed.device_mesh.init_device_mesh: a mesh of `mesh_shape` over the ranks
/// of the default group (their product must be its size), row-major.
DeviceMesh init_device_mesh(const std::string& device_type, const std::vector<int64_t>& mesh_shape,
                            const std::vector<std::string>& mesh_dim_names = {});

}  // namespace ddp
