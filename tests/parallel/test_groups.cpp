// make_groups over MPI: for every mesh shape that fits the world, each rank's communicators hold
// exactly the ranks DeviceMesh says, in mesh-coordinate order; likewise make_group over axis
// sets, make_embedding_group and the tensor sub-grid's make_tensor_grid_groups.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "parallel/mesh.hpp"
#include "parallel/mpi_communicator.hpp"

namespace colossal::parallel {
namespace {

// Every (data, pipeline, tensor, sequence) with product `world`.
std::vector<MeshShape> shapes_of(int world) {
  std::vector<MeshShape> shapes;
  for (int d = 1; d <= world; ++d) {
    for (int p = 1; p <= world; ++p) {
      for (int t = 1; t <= world; ++t) {
        if (world % (d * p * t) != 0) continue;
        shapes.push_back({.data = d, .pipeline = p, .tensor = t, .sequence = world / (d * p * t)});
      }
    }
  }
  return shapes;
}

void check_groups(const Communicator& world, const DeviceMesh& mesh) {
  SCOPED_TRACE(mesh.shape().to_string() + " order " + format_axis_order(mesh.order()));
  const Groups groups = make_groups(world, mesh);
  EXPECT_EQ(groups.coord, mesh.coord_of(world.rank()));
  for (Axis axis : kAllAxes) {
    SCOPED_TRACE(axis_name(axis));
    Communicator& group = groups.on(axis);
    ASSERT_EQ(group.size(), mesh.shape().size(axis));
    EXPECT_EQ(group.rank(), groups.coord[axis]);
    // Gather the world ranks of the group: they must be the mesh's group, in order.
    const float mine = static_cast<float>(world.rank());
    std::vector<float> gathered(static_cast<std::size_t>(group.size()));
    group.all_gather(std::span<const float>(&mine, 1), gathered);
    const std::vector<int> expected = mesh.group_of(world.rank(), axis);
    ASSERT_EQ(gathered.size(), expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(gathered[i], static_cast<float>(expected[i])) << "member " << i;
    }
  }
  EXPECT_EQ(&groups.on(Axis::data), groups.dp.get());
  EXPECT_EQ(&groups.on(Axis::tensor), groups.tp.get());
  EXPECT_EQ(&groups.on(Axis::pipeline), groups.pp.get());
  EXPECT_EQ(&groups.on(Axis::sequence), groups.sp.get());
}

TEST(MakeGroups, EveryShapeOfTheWorld) {
  const auto world = make_world_communicator();
  for (const MeshShape& shape : shapes_of(world->size())) {
    check_groups(*world, DeviceMesh(shape));
  }
}

TEST(MakeGroups, OtherAxisOrders) {
  const auto world = make_world_communicator();
  for (const MeshShape& shape : shapes_of(world->size())) {
    check_groups(*world, DeviceMesh(shape, parse_axis_order("pp-dp-sp-tp")));
  }
}

TEST(MakeGroups, DataParallelGradientSum) {
  // A gradient all-reduce over dp sums exactly the data-parallel replicas of this rank.
  const auto world = make_world_communicator();
  if (world->size() % 2 != 0) GTEST_SKIP() << "needs an even world";
  const DeviceMesh mesh({.data = world->size() / 2, .pipeline = 1, .tensor = 2});
  const Groups groups = make_groups(*world, mesh);
  float gradient = static_cast<float>(world->rank());
  groups.dp->all_reduce_sum(std::span<float>(&gradient, 1));
  float expected = 0.0f;
  for (int r : mesh.group_of(world->rank(), Axis::data)) expected += static_cast<float>(r);
  EXPECT_EQ(gradient, expected);
  EXPECT_EQ(groups.dp->stats().all_reduce.calls, 1u);
  EXPECT_EQ(groups.tp->stats().all_reduce.calls, 0u);
}

// The world ranks of `group`'s members, in communicator-rank order.
std::vector<int> members_of(const Communicator& world, Communicator& group) {
  const float mine = static_cast<float>(world.rank());
  std::vector<float> gathered(static_cast<std::size_t>(group.size()));
  group.all_gather(std::span<const float>(&mine, 1), gathered);
  return std::vector<int>(gathered.begin(), gathered.end());
}

TEST(MakeGroups, AxisSetsAndEmbedding) {
  const auto world = make_world_communicator();
  for (const MeshShape& shape : shapes_of(world->size())) {
    const DeviceMesh mesh(shape);
    SCOPED_TRACE(shape.to_string());
    const std::vector<std::vector<Axis>> sets{{Axis::sequence, Axis::data},
                                              {Axis::tensor, Axis::pipeline}};
    for (const auto& set : sets) {
      const auto group = make_group(*world, mesh, {set[0], set[1]});
      const std::vector<int> expected = mesh.group_of(world->rank(), {set[0], set[1]});
      EXPECT_EQ(members_of(*world, *group), expected);
      EXPECT_EQ(expected[static_cast<std::size_t>(group->rank())], world->rank());
    }
    const auto embedding = make_embedding_group(*world, mesh);
    const std::vector<int> expected = mesh.embedding_group_of(world->rank());
    if (expected.empty()) {
      EXPECT_EQ(embedding, nullptr);
    } else {
      ASSERT_NE(embedding, nullptr);
      EXPECT_EQ(members_of(*world, *embedding), expected);
    }
  }
}

TEST(MakeGroups, TensorGridGroups) {
  const auto world = make_world_communicator();
  std::vector<TensorSubGrid> grids;
  const int n = world->size();
  if (n == 4) grids.emplace_back(core::TensorMode::d2, 4);
  if (n == 8) {
    grids.emplace_back(core::TensorMode::d3, 8);
    grids.emplace_back(core::TensorMode::d2_5, 8, 2);
  }
  if (grids.empty()) GTEST_SKIP() << "needs 4 or 8 ranks";
  for (const TensorSubGrid& grid : grids) {
    SCOPED_TRACE(core::tensor_mode_name(grid.mode()));
    const TensorGridGroups groups = make_tensor_grid_groups(*world, grid);
    for (TensorGridGroup kind : {TensorGridGroup::row, TensorGridGroup::col,
                                 TensorGridGroup::depth, TensorGridGroup::input,
                                 TensorGridGroup::weight, TensorGridGroup::output,
                                 TensorGridGroup::plane_l, TensorGridGroup::plane_j}) {
      SCOPED_TRACE(tensor_grid_group_name(kind));
      const auto needed = grid.needed();
      const bool made = std::find(needed.begin(), needed.end(), kind) != needed.end();
      ASSERT_EQ(groups.has(kind), made);
      if (!made) {
        EXPECT_THROW((void)groups[kind], std::invalid_argument);
        continue;
      }
      Communicator& comm = *groups.comms[static_cast<std::size_t>(kind)];
      EXPECT_EQ(&groups[kind], groups.views[static_cast<std::size_t>(kind)].get());
      EXPECT_EQ(groups[kind].size(), comm.size());
      EXPECT_EQ(members_of(*world, comm), grid.group_of(world->rank(), kind));
    }
  }
  EXPECT_THROW((void)make_tensor_grid_groups(*world, TensorSubGrid(core::TensorMode::d3, 27)),
               std::invalid_argument);
}

TEST(MakeGroups, WrongWorldSizeFailsOnEveryRank) {
  const auto world = make_world_communicator();
  const DeviceMesh mesh({.data = world->size() + 1});
  try {
    (void)make_groups(*world, mesh);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("but the communicator has " + std::to_string(world->size()) + " ranks"),
              std::string::npos)
        << message;
  }
}

}  // namespace
}  // namespace colossal::parallel
