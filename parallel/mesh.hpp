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
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/communicator.hpp"

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

 private:
  void check_rank(int rank) const;

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

}  // namespace colossal::parallel
