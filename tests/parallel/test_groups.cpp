// make_groups over MPI: for every mesh shape that fits the world, each rank's communicators hold
// exactly the ranks DeviceMesh says, in mesh-coordinate order.
#include <gtest/gtest.h>

#include <stdexcept>
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
