#include "parallel/mesh.hpp"

#include <algorithm>
#include <stdexcept>

namespace colossal::parallel {

namespace {

int index_of(Axis axis) { return static_cast<int>(axis); }

[[noreturn]] void fail(const std::string& message) {
  throw std::invalid_argument("colossal::parallel: " + message);
}

// The field of a MeshCoord for an axis; const or not as the coordinate is.
template <class Coord>
auto& field(Coord& coord, Axis axis) {
  switch (axis) {
    case Axis::tensor: return coord.tensor;
    case Axis::sequence: return coord.sequence;
    case Axis::data: return coord.data;
    case Axis::pipeline: return coord.pipeline;
  }
  fail("unknown mesh axis");
}

}  // namespace

const char* axis_name(Axis axis) {
  switch (axis) {
    case Axis::tensor: return "tensor";
    case Axis::sequence: return "sequence";
    case Axis::data: return "data";
    case Axis::pipeline: return "pipeline";
  }
  return "unknown";
}

const char* axis_short_name(Axis axis) {
  switch (axis) {
    case Axis::tensor: return "tp";
    case Axis::sequence: return "sp";
    case Axis::data: return "dp";
    case Axis::pipeline: return "pp";
  }
  return "??";
}

AxisOrder parse_axis_order(std::string_view text) {
  std::vector<std::string_view> names;
  for (std::size_t start = 0;;) {
    const std::size_t end = std::min(text.find('-', start), text.size());
    names.push_back(text.substr(start, end - start));
    if (end == text.size()) break;
    start = end + 1;
  }
  AxisOrder order{};
  std::array<bool, 4> seen{};
  bool valid = names.size() == order.size();
  for (std::size_t i = 0; valid && i < order.size(); ++i) {
    const auto it = std::find_if(kAllAxes.begin(), kAllAxes.end(),
                                 [&](Axis axis) { return names[i] == axis_short_name(axis); });
    valid = it != kAllAxes.end() && !seen[index_of(*it)];
    if (valid) {
      seen[index_of(*it)] = true;
      order[i] = *it;
    }
  }
  if (!valid) {
    fail("axis order \"" + std::string(text) +
         "\" is not a permutation of tp, sp, dp, pp (the mesh needs each axis exactly once); write "
         "it innermost first, e.g. \"tp-sp-dp-pp\"");
  }
  return order;
}

std::string format_axis_order(const AxisOrder& order) {
  std::string text;
  for (Axis axis : order) {
    if (!text.empty()) text += '-';
    text += axis_short_name(axis);
  }
  return text;
}

int MeshShape::size(Axis axis) const {
  switch (axis) {
    case Axis::tensor: return tensor;
    case Axis::sequence: return sequence;
    case Axis::data: return data;
    case Axis::pipeline: return pipeline;
  }
  fail("unknown mesh axis");
}

std::string MeshShape::to_string() const {
  return "data " + std::to_string(data) + " x pipeline " + std::to_string(pipeline) +
         " x tensor " + std::to_string(tensor) + " x sequence " + std::to_string(sequence);
}

int MeshCoord::operator[](Axis axis) const { return field(*this, axis); }

int& MeshCoord::operator[](Axis axis) { return field(*this, axis); }

DeviceMesh::DeviceMesh(MeshShape shape, AxisOrder order) : shape_(shape), order_(order) {
  for (Axis axis : kAllAxes) {
    if (shape_.size(axis) < 1) {
      fail(std::string("device mesh: ") + axis_name(axis) + " size is " +
           std::to_string(shape_.size(axis)) + " (every axis needs at least one rank); use 1 for "
           "an axis that is not split");
    }
  }
  std::array<bool, 4> seen{};
  for (Axis axis : order_) {
    if (seen[index_of(axis)]) {
      fail("device mesh: axis order " + format_axis_order(order_) +
           " repeats an axis (each axis must appear once); use a permutation such as tp-sp-dp-pp");
    }
    seen[index_of(axis)] = true;
  }
  int stride = 1;
  for (Axis axis : order_) {
    stride_[index_of(axis)] = stride;
    stride *= shape_.size(axis);
  }
}

int DeviceMesh::stride(Axis axis) const { return stride_[index_of(axis)]; }

void DeviceMesh::check_rank(int rank) const {
  if (rank < 0 || rank >= world_size()) {
    fail("device mesh: rank " + std::to_string(rank) + " is outside the mesh (" +
         shape_.to_string() + " has ranks 0.." + std::to_string(world_size() - 1) +
         "); pass a rank of the mesh");
  }
}

MeshCoord DeviceMesh::coord_of(int rank) const {
  check_rank(rank);
  MeshCoord coord;
  for (Axis axis : kAllAxes) coord[axis] = rank / stride(axis) % shape_.size(axis);
  return coord;
}

int DeviceMesh::rank_of(const MeshCoord& coord) const {
  int rank = 0;
  for (Axis axis : kAllAxes) {
    if (coord[axis] < 0 || coord[axis] >= shape_.size(axis)) {
      fail(std::string("device mesh: ") + axis_name(axis) + " coordinate " +
           std::to_string(coord[axis]) + " is outside 0.." + std::to_string(shape_.size(axis) - 1) +
           " (" + shape_.to_string() + "); pass a coordinate inside the mesh");
    }
    rank += coord[axis] * stride(axis);
  }
  return rank;
}

int DeviceMesh::group_index(int rank, Axis axis) const {
  check_rank(rank);
  // rank = inner + s * (a + n * outer) with inner < s. Groups ordered by their first rank
  // (a = 0) are ordered by (outer, inner), so the index is inner + s * outer.
  const int s = stride(axis);
  const int n = shape_.size(axis);
  return rank % s + s * (rank / (s * n));
}

std::vector<int> DeviceMesh::group_of(int rank, Axis axis) const {
  MeshCoord coord = coord_of(rank);
  std::vector<int> group(static_cast<std::size_t>(shape_.size(axis)));
  for (int i = 0; i < shape_.size(axis); ++i) {
    coord[axis] = i;
    group[static_cast<std::size_t>(i)] = rank_of(coord);
  }
  return group;
}

std::vector<std::vector<int>> DeviceMesh::groups(Axis axis) const {
  std::vector<std::vector<int>> all(static_cast<std::size_t>(world_size() / shape_.size(axis)));
  for (int rank = 0; rank < world_size(); ++rank) {
    if (coord_of(rank)[axis] == 0) {
      all[static_cast<std::size_t>(group_index(rank, axis))] = group_of(rank, axis);
    }
  }
  return all;
}

Communicator& Groups::on(Axis axis) const {
  const std::unique_ptr<Communicator>* group = nullptr;
  switch (axis) {
    case Axis::tensor: group = &tp; break;
    case Axis::sequence: group = &sp; break;
    case Axis::data: group = &dp; break;
    case Axis::pipeline: group = &pp; break;
  }
  if (group == nullptr || !*group) fail("Groups: no communicator for this axis (make_groups fills all four)");
  return **group;
}

Groups make_groups(const Communicator& world, const DeviceMesh& mesh) {
  if (world.size() != mesh.world_size()) {
    fail("device mesh: data*pipeline*tensor*sequence = " + std::to_string(mesh.world_size()) +
         " (" + mesh.shape().to_string() + ") but the communicator has " +
         std::to_string(world.size()) + " ranks (every rank needs exactly one mesh slot); choose "
         "sizes whose product is " + std::to_string(world.size()));
  }
  Groups groups;
  groups.coord = mesh.coord_of(world.rank());
  // Key = coordinate on the axis, so the new communicator's rank is that coordinate.
  auto split = [&](Axis axis) {
    return world.split(mesh.group_index(world.rank(), axis), groups.coord[axis]);
  };
  groups.tp = split(Axis::tensor);
  groups.sp = split(Axis::sequence);
  groups.dp = split(Axis::data);
  groups.pp = split(Axis::pipeline);
  return groups;
}

}  // namespace colossal::parallel
