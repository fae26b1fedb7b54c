// The device mesh: a pure function from the parallel sizes and an axis order to rank groups
// (after Megatron-LM's parallel_state), testable without MPI; plus make_groups, which turns a mesh
// into the calling rank's communicators.
//
// Axis order, innermost first (default "tp-sp-dp-pp"):
//   world rank = tensor + T * (sequence + S * (data + D * pipeline))
// Tensor-parallel ranks are adjacent (they talk every layer, so they share a node's fast links),
// then sequence (ring attention, every layer), then data (once per step), and pipeline outermost
// (point-to-point between stages, the least traffic). Another order can be passed for experiments.
//
// Along an axis, a group is the set of ranks that differ only in that axis's coordinate. Each
// group lists its ranks by that coordinate, so a rank's index in its group (and its rank in the
// communicator make_groups builds) equals its coordinate on the axis. Groups of an axis are listed
// in ascending order of their first rank.
//
// Over a set of axes (Megatron-Core's RankGenerator.get_ranks("tp-dp")), a group is the set of
// ranks that share every coordinate outside the set, listed with the set's innermost axis
// fastest (which is ascending world rank); the data x sequence gradient group is
// groups({Axis::sequence, Axis::data}). The embedding group is the first and the last pipeline
// stage of each position on the other axes. The tensor axis has its own sub-grid in 2D, 2.5D and
// 3D (TensorSubGrid, below), with the sub-groups the sharded models need.
#pragma once

#include <array>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor_mode.hpp"
#include "parallel/communicator.hpp"
#include "parallel/tensor_group.hpp"

namespace colossal::parallel {

enum class Axis { tensor, sequence, data, pipeline };

inline constexpr std::array<Axis, 4> kAllAxes{Axis::tensor, Axis::sequence, Axis::data,
                                              Axis::pipeline};

const char* axis_name(Axis axis);        // "tensor", "sequence", "data", "pipeline"
const char* axis_short_name(Axis axis);  // "tp", "sp", "dp", "pp"

// Axes from innermost (fastest-varying rank) to outermost.
using AxisOrder = std::array<Axis, 4>;
inline constexpr AxisOrder kDefaultAxisOrder{Axis::tensor, Axis::sequence, Axis::data,
                                             Axis::pipeline};

// "tp-sp-dp-pp" <-> AxisOrder (innermost first). Throws std::invalid_argument on anything but a
// permutation of the four short names.
AxisOrder parse_axis_order(std::string_view text);
std::string format_axis_order(const AxisOrder& order);

struct MeshShape {
  int data = 1;
  int pipeline = 1;
  int tensor = 1;
  int sequence = 1;

  int size(Axis axis) const;
  int world_size() const { return data * pipeline * tensor * sequence; }
  std::string to_string() const;  // "data 2 x pipeline 1 x tensor 4 x sequence 1"
};

struct MeshCoord {
  int data = 0;
  int pipeline = 0;
  int tensor = 0;
  int sequence = 0;

  int operator[](Axis axis) const;
  int& operator[](Axis axis);
  bool operator==(const MeshCoord&) const = default;
};

class DeviceMesh {
 public:
  // Throws std::invalid_argument if a size is below 1 or `order` is not a permutation.
  explicit DeviceMesh(MeshShape shape, AxisOrder order = kDefaultAxisOrder);

  const MeshShape& shape() const { return shape_; }
  const AxisOrder& order() const { return order_; }
  int world_size() const { return shape_.world_size(); }
  int stride(Axis axis) const;  // rank distance between neighbours along `axis`

  MeshCoord coord_of(int rank) const;
  int rank_of(const MeshCoord& coord) const;

  // Every group along `axis`: world_size() / size(axis) groups of size(axis) ranks each.
  std::vector<std::vector<int>> groups(Axis axis) const;
  // Index, in groups(axis), of the group holding `rank` (the color make_groups splits with).
  int group_index(int rank, Axis axis) const;
  std::vector<int> group_of(int rank, Axis axis) const;

  // The same over a set of axes: groups of the ranks that share every coordinate outside
  // `axes`, members with the innermost axis of the set fastest (ascending world rank), groups by
  // their first rank; a rank's index in its group is its rank in make_group's communicator.
  // groups({axis}) == groups(axis); an empty set gives one group per rank; repeats count once.
  std::vector<std::vector<int>> groups(std::initializer_list<Axis> axes) const;
  int group_index(int rank, std::initializer_list<Axis> axes) const;
  std::vector<int> group_of(int rank, std::initializer_list<Axis> axes) const;

  // The embedding groups (the tied token embedding of the first stage and the LM head of the
  // last): per position on the other axes, {first stage's rank, last stage's rank}, listed like
  // groups(Axis::pipeline); one rank each when the pipeline has a single stage.
  std::vector<std::vector<int>> embedding_groups() const;
  // `rank`'s embedding group; empty for a rank of a middle stage, which holds no embedding.
  std::vector<int> embedding_group_of(int rank) const;

 private:
  void check_rank(int rank) const;
  unsigned mask_of(std::initializer_list<Axis> axes) const;  // bit k: order()[k] is in `axes`
  std::vector<int> radix() const;                            // sizes in order(), innermost first

  MeshShape shape_;
  AxisOrder order_;
  std::array<int, 4> stride_{};  // indexed by static_cast<int>(Axis)
};

// The calling rank's communicators, one per axis, passed explicitly to layers and schedules.
// In each, rank() == coord[axis] and size() == mesh size along that axis.
struct Groups {
  MeshCoord coord;
  std::unique_ptr<Communicator> dp, tp, pp, sp;

  Communicator& on(Axis axis) const;
};

// Collective over `world`: splits it into the calling rank's group on every axis. Throws
// std::invalid_argument (on every rank alike) if world.size() != mesh.world_size().
Groups make_groups(const Communicator& world, const DeviceMesh& mesh);

// Collective over `world`: the calling rank's group over `axes` (mesh.group_of(rank, axes)), its
// rank in it equal to its index there. Throws like make_groups on a size mismatch.
std::unique_ptr<Communicator> make_group(const Communicator& world, const DeviceMesh& mesh,
                                         std::initializer_list<Axis> axes);

// Collective over `world`: the calling rank's embedding group (rank 0 = first stage, 1 = last
// stage); null on a rank of a middle stage, which takes part in the split but keeps nothing.
std::unique_ptr<Communicator> make_embedding_group(const Communicator& world,
                                                   const DeviceMesh& mesh);

// The sub-groups of a tensor group on its grid, the groups core::Grid2D (with the 2.5D depth
// group) and core::Cube3DGroups hold.
enum class TensorGridGroup { row, col, depth, input, weight, output, plane_l, plane_j };
const char* tensor_grid_group_name(TensorGridGroup group);  // "row", ..., "plane_j"

// A tensor-parallel group of size() ranks as the Colossal-AI layouts see it (pure arithmetic):
//   2D (q x q) and 2.5D (depth x q x q): tensor rank = (d * q + i) * q + j, grid row i, column
//     j, depth layer d (0 in 2D); row = the q ranks of (d, i, *) by j, col = (d, *, j) by i,
//     depth = (*, i, j) by d.
//   3D (q x q x q): tensor rank = (i * q + j) * q + l; input = (i, *, l) by j, weight =
//     (*, j, l) by i, output = (i, j, *) by l, plane_l = (*, *, l) by i q + j, plane_j = (*, j, *)
//     by i q + l.
// Every sub-group lists its members in ascending tensor rank, which is the order above (and the
// order the trainers' splits by (color, key) gave). q comes from core::tensor_grid.
class TensorSubGrid {
 public:
  struct Coord {
    int depth = 0, i = 0, j = 0, l = 0;  // l: 3D only; depth: 2.5D only
    bool operator==(const Coord&) const = default;
  };

  // Throws std::invalid_argument naming parallel.tensor.mode / parallel.tensor.size when the
  // mode is 1d or `size` is not exactly the mode's grid with q >= 2.
  TensorSubGrid(core::TensorMode mode, int size, int depth = 1);

  core::TensorMode mode() const { return mode_; }
  int q() const { return q_; }
  int depth() const { return depth_; }  // 2.5D layers; 1 in 2D and 3D
  int size() const;

  Coord coord_of(int tensor_rank) const;
  // The groups this mode's model needs, in the order make_tensor_grid_groups splits them:
  // 2D/2.5D: row, col, and depth when depth() > 1; 3D: input, weight, output, plane_l, plane_j.
  std::vector<TensorGridGroup> needed() const;
  // Throw std::invalid_argument for a group of the other kind of grid (a 3D group on a 2D grid).
  std::vector<std::vector<int>> groups(TensorGridGroup group) const;
  int group_index(int tensor_rank, TensorGridGroup group) const;
  std::vector<int> group_of(int tensor_rank, TensorGridGroup group) const;

 private:
  void check_rank(int tensor_rank) const;
  unsigned mask_of(TensorGridGroup group) const;

  core::TensorMode mode_;
  int q_ = 1, depth_ = 1;
  std::vector<int> radix_;  // innermost first: 2D (j, i, d), 3D (l, j, i)
};

// The calling rank's sub-group communicators and their core::TensorGroup views, for the groups
// of grid.needed(); the others are absent.
struct TensorGridGroups {
  std::array<std::unique_ptr<Communicator>, 8> comms;  // indexed by TensorGridGroup
  std::array<std::unique_ptr<CommunicatorGroup>, 8> views;

  bool has(TensorGridGroup group) const;
  core::TensorGroup& operator[](TensorGridGroup group) const;  // throws if absent
};

// Collective over the tensor group `tensor` (rank = tensor rank): splits it into the calling
// rank's sub-groups of grid.needed(), in that order. Throws std::invalid_argument (on every rank
// alike) if tensor.size() != grid.size().
TensorGridGroups make_tensor_grid_groups(const Communicator& tensor, const TensorSubGrid& grid);

}  // namespace colossal::parallel
