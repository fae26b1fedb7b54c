#include "parallel/mesh.hpp"

#include <algorithm>
#include <stdexcept>

#include "core/tensor_mode.hpp"

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

// A mixed-radix grid of ranks, `radix` the sizes of its axes innermost first, `mask` bit k set
// for axis k in the set. The members of `rank`'s group over the set: the ranks that share its
// other coordinates, the set's innermost axis fastest (so ascending rank).
std::vector<int> radix_members(const std::vector<int>& radix, unsigned mask, int rank) {
  int base = 0, count = 1, stride = 1;
  std::vector<int> strides(radix.size());
  for (std::size_t k = 0; k < radix.size(); ++k) {
    strides[k] = stride;
    if (((mask >> k) & 1u) != 0) {
      count *= radix[k];
    } else {
      base += rank / stride % radix[k] * stride;
    }
    stride *= radix[k];
  }
  std::vector<int> members(static_cast<std::size_t>(count));
  for (int index = 0; index < count; ++index) {
    int member = base, rest = index;
    for (std::size_t k = 0; k < radix.size(); ++k) {
      if (((mask >> k) & 1u) == 0) continue;
      member += rest % radix[k] * strides[k];
      rest /= radix[k];
    }
    members[static_cast<std::size_t>(index)] = member;
  }
  return members;
}

// The index of `rank`'s group among all groups over the set ordered by their first rank: its
// coordinates outside the set, read as a mixed-radix number innermost first.
int radix_group_index(const std::vector<int>& radix, unsigned mask, int rank) {
  int index = 0, weight = 1, stride = 1;
  for (std::size_t k = 0; k < radix.size(); ++k) {
    if (((mask >> k) & 1u) == 0) {
      index += rank / stride % radix[k] * weight;
      weight *= radix[k];
    }
    stride *= radix[k];
  }
  return index;
}

// Every group over the set, listed by first rank.
std::vector<std::vector<int>> radix_groups(const std::vector<int>& radix, unsigned mask) {
  int world = 1, per_group = 1;
  for (std::size_t k = 0; k < radix.size(); ++k) {
    world *= radix[k];
    if (((mask >> k) & 1u) != 0) per_group *= radix[k];
  }
  std::vector<std::vector<int>> all(static_cast<std::size_t>(world / per_group));
  for (int rank = 0; rank < world; ++rank) {
    auto& group = all[static_cast<std::size_t>(radix_group_index(radix, mask, rank))];
    if (group.empty()) group = radix_members(radix, mask, rank);
  }
  return all;
}

void check_world(const Communicator& world, const DeviceMesh& mesh) {
  if (world.size() != mesh.world_size()) {
    fail("device mesh: data*pipeline*tensor*sequence = " + std::to_string(mesh.world_size()) +
         " (" + mesh.shape().to_string() + ") but the communicator has " +
         std::to_string(world.size()) + " ranks (every rank needs exactly one mesh slot); choose "
         "sizes whose product is " + std::to_string(world.size()));
  }
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

unsigned DeviceMesh::mask_of(std::initializer_list<Axis> axes) const {
  unsigned mask = 0;
  for (Axis axis : axes) {
    for (std::size_t k = 0; k < order_.size(); ++k) {
      if (order_[k] == axis) mask |= 1u << k;
    }
  }
  return mask;
}

std::vector<int> DeviceMesh::radix() const {
  std::vector<int> sizes;
  for (Axis axis : order_) sizes.push_back(shape_.size(axis));
  return sizes;
}

std::vector<std::vector<int>> DeviceMesh::groups(std::initializer_list<Axis> axes) const {
  return radix_groups(radix(), mask_of(axes));
}

int DeviceMesh::group_index(int rank, std::initializer_list<Axis> axes) const {
  check_rank(rank);
  return radix_group_index(radix(), mask_of(axes), rank);
}

std::vector<int> DeviceMesh::group_of(int rank, std::initializer_list<Axis> axes) const {
  check_rank(rank);
  return radix_members(radix(), mask_of(axes), rank);
}

std::vector<std::vector<int>> DeviceMesh::embedding_groups() const {
  std::vector<std::vector<int>> all = groups(Axis::pipeline);
  for (auto& group : all) {
    if (group.size() > 1) group = {group.front(), group.back()};
  }
  return all;
}

std::vector<int> DeviceMesh::embedding_group_of(int rank) const {
  const int stage = coord_of(rank).pipeline, last = shape_.pipeline - 1;
  if (stage != 0 && stage != last) return {};
  const std::vector<int> stages = group_of(rank, Axis::pipeline);
  if (last == 0) return {rank};
  return {stages.front(), stages.back()};
}

Communicator& Groups::on(Axis axis) const {
  const std::unique_ptr<Communicator>* group = nullptr;
  switch (axis) {
    case Axis::tensor: group = &tp; break;
    case Axis::sequence: group = &sp; break;
    case Axis::data: group = &dp; break;
    case Axis::pipeline: group = &pp; break;
  }
  if (group == nullptr || !*group) {
    fail("Groups: no communicator for this axis (make_groups fills all four)");
  }
  return **group;
}

Groups make_groups(const Communicator& world, const DeviceMesh& mesh) {
  check_world(world, mesh);
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

std::unique_ptr<Communicator> make_group(const Communicator& world, const DeviceMesh& mesh,
                                         std::initializer_list<Axis> axes) {
  check_world(world, mesh);
  const int rank = world.rank();
  const std::vector<int> members = mesh.group_of(rank, axes);
  const auto index = std::find(members.begin(), members.end(), rank) - members.begin();
  return world.split(mesh.group_index(rank, axes), static_cast<int>(index));
}

std::unique_ptr<Communicator> make_embedding_group(const Communicator& world,
                                                   const DeviceMesh& mesh) {
  check_world(world, mesh);
  const int rank = world.rank();
  const std::vector<int> members = mesh.embedding_group_of(rank);
  if (members.empty()) {
    // A middle stage: a color of its own, past every embedding group's, and nothing kept.
    world.split(mesh.world_size() / mesh.shape().pipeline + rank, 0);
    return nullptr;
  }
  const auto index = std::find(members.begin(), members.end(), rank) - members.begin();
  return world.split(mesh.group_index(rank, Axis::pipeline), static_cast<int>(index));
}

const char* tensor_grid_group_name(TensorGridGroup group) {
  switch (group) {
    case TensorGridGroup::row: return "row";
    case TensorGridGroup::col: return "col";
    case TensorGridGroup::depth: return "depth";
    case TensorGridGroup::input: return "input";
    case TensorGridGroup::weight: return "weight";
    case TensorGridGroup::output: return "output";
    case TensorGridGroup::plane_l: return "plane_l";
    case TensorGridGroup::plane_j: return "plane_j";
  }
  return "unknown";
}

TensorSubGrid::TensorSubGrid(core::TensorMode mode, int size, int depth) : mode_(mode) {
  if (mode == core::TensorMode::d1) {
    fail("tensor sub-grid: parallel.tensor.mode is 1d, which has no grid (sub-groups exist for "
         "2d, 2.5d and 3d); use the tensor group itself");
  }
  if (mode == core::TensorMode::d2_5 && depth < 1) {
    fail("tensor sub-grid: parallel.tensor.depth = " + std::to_string(depth) +
         " (2.5d needs at least one depth layer); use depth >= 1");
  }
  const core::TensorGrid grid = core::tensor_grid(mode, size, depth);
  if (!grid.exact) {
    fail("tensor sub-grid: parallel.tensor.size = " + std::to_string(size) + " is not a " +
         core::tensor_mode_name(mode) + " grid with side q >= 2 (" +
         (mode == core::TensorMode::d3 ? std::string("q^3")
                                       : "q^2 x depth " + std::to_string(grid.depth)) +
         " ranks); use a size such as " + std::to_string(grid.ranks(std::max(grid.q, 2))));
  }
  q_ = grid.q;
  depth_ = grid.depth;
  radix_ = mode == core::TensorMode::d3 ? std::vector<int>{q_, q_, q_}
                                        : std::vector<int>{q_, q_, depth_};
}

int TensorSubGrid::size() const { return radix_[0] * radix_[1] * radix_[2]; }

void TensorSubGrid::check_rank(int tensor_rank) const {
  if (tensor_rank < 0 || tensor_rank >= size()) {
    fail("tensor sub-grid: tensor rank " + std::to_string(tensor_rank) + " is outside 0.." +
         std::to_string(size() - 1) + "; pass a rank of the tensor group");
  }
}

TensorSubGrid::Coord TensorSubGrid::coord_of(int r) const {
  check_rank(r);
  const int q = q_;
  if (mode_ == core::TensorMode::d3) return Coord{0, r / (q * q), r / q % q, r % q};
  return Coord{r / (q * q), r / q % q, r % q, 0};
}

std::vector<TensorGridGroup> TensorSubGrid::needed() const {
  using G = TensorGridGroup;
  if (mode_ == core::TensorMode::d3) {
    return {G::input, G::weight, G::output, G::plane_l, G::plane_j};
  }
  if (depth_ > 1) return {G::row, G::col, G::depth};
  return {G::row, G::col};
}

unsigned TensorSubGrid::mask_of(TensorGridGroup group) const {
  // Axis bits, innermost first: 2D (j, i, d); 3D (l, j, i).
  const bool cube = mode_ == core::TensorMode::d3;
  const bool cube_group = group != TensorGridGroup::row && group != TensorGridGroup::col &&
                          group != TensorGridGroup::depth;
  if (cube != cube_group) {
    fail(std::string("tensor sub-grid: a ") + core::tensor_mode_name(mode_) + " grid has no " +
         tensor_grid_group_name(group) + " group (2d and 2.5d: row, col, depth; 3d: input, "
         "weight, output, plane_l, plane_j)");
  }
  switch (group) {
    case TensorGridGroup::row: return 0b001;      // j
    case TensorGridGroup::col: return 0b010;      // i
    case TensorGridGroup::depth: return 0b100;    // d
    case TensorGridGroup::input: return 0b010;    // j
    case TensorGridGroup::weight: return 0b100;   // i
    case TensorGridGroup::output: return 0b001;   // l
    case TensorGridGroup::plane_l: return 0b110;  // i, j
    case TensorGridGroup::plane_j: return 0b101;  // i, l
  }
  fail("tensor sub-grid: unknown group");
}

std::vector<std::vector<int>> TensorSubGrid::groups(TensorGridGroup group) const {
  return radix_groups(radix_, mask_of(group));
}

int TensorSubGrid::group_index(int tensor_rank, TensorGridGroup group) const {
  check_rank(tensor_rank);
  return radix_group_index(radix_, mask_of(group), tensor_rank);
}

std::vector<int> TensorSubGrid::group_of(int tensor_rank, TensorGridGroup group) const {
  check_rank(tensor_rank);
  return radix_members(radix_, mask_of(group), tensor_rank);
}

bool TensorGridGroups::has(TensorGridGroup group) const {
  return views[static_cast<std::size_t>(group)] != nullptr;
}

core::TensorGroup& TensorGridGroups::operator[](TensorGridGroup group) const {
  if (!has(group)) {
    fail(std::string("tensor grid groups: no ") + tensor_grid_group_name(group) +
         " group (make_tensor_grid_groups makes the grid's needed() groups only)");
  }
  return *views[static_cast<std::size_t>(group)];
}

TensorGridGroups make_tensor_grid_groups(const Communicator& tensor, const TensorSubGrid& grid) {
  if (tensor.size() != grid.size()) {
    fail("tensor sub-grid: the grid has " + std::to_string(grid.size()) +
         " ranks but the tensor group has " + std::to_string(tensor.size()) +
         " (every tensor rank needs one grid slot); build the grid from parallel.tensor.size");
  }
  TensorGridGroups out;
  const int rank = tensor.rank();
  for (TensorGridGroup group : grid.needed()) {
    const std::vector<int> members = grid.group_of(rank, group);
    const auto index = std::find(members.begin(), members.end(), rank) - members.begin();
    const auto slot = static_cast<std::size_t>(group);
    out.comms[slot] = tensor.split(grid.group_index(rank, group), static_cast<int>(index));
    out.views[slot] = std::make_unique<CommunicatorGroup>(*out.comms[slot]);
  }
  return out;
}

}  // namespace colossal::parallel
