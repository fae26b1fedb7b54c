// DeviceMesh without MPI: rank <-> coordinate arithmetic and the groups of every axis.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "parallel/mesh.hpp"

namespace colossal::parallel {
namespace {

using GroupList = std::vector<std::vector<int>>;

TEST(DeviceMesh, DefaultOrderIsTensorSequenceDataPipeline) {
  const DeviceMesh mesh({.data = 3, .pipeline = 2, .tensor = 4, .sequence = 5});
  EXPECT_EQ(format_axis_order(mesh.order()), "tp-sp-dp-pp");
  EXPECT_EQ(mesh.world_size(), 120);
  EXPECT_EQ(mesh.stride(Axis::tensor), 1);
  EXPECT_EQ(mesh.stride(Axis::sequence), 4);
  EXPECT_EQ(mesh.stride(Axis::data), 20);
  EXPECT_EQ(mesh.stride(Axis::pipeline), 60);
  for (int rank = 0; rank < mesh.world_size(); ++rank) {
    const MeshCoord c = mesh.coord_of(rank);
    EXPECT_EQ(rank, c.tensor + 4 * (c.sequence + 5 * (c.data + 3 * c.pipeline)));
    EXPECT_EQ(mesh.rank_of(c), rank);
  }
}

// The example of Megatron-LM's parallel_state: 16 ranks, tensor 2, pipeline 4, data 2.
TEST(DeviceMesh, MegatronExample) {
  const DeviceMesh mesh({.data = 2, .pipeline = 4, .tensor = 2});
  EXPECT_EQ(mesh.groups(Axis::tensor),
            (GroupList{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(mesh.groups(Axis::data),
            (GroupList{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(mesh.groups(Axis::pipeline),
            (GroupList{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  GroupList singletons;
  for (int r = 0; r < 16; ++r) singletons.push_back({r});
  EXPECT_EQ(mesh.groups(Axis::sequence), singletons);
  EXPECT_EQ(mesh.group_of(13, Axis::pipeline), (std::vector<int>{1, 5, 9, 13}));
  EXPECT_EQ(mesh.coord_of(13), (MeshCoord{.data = 0, .pipeline = 3, .tensor = 1, .sequence = 0}));
}

// Properties that must hold for any shape and order.
void check_mesh(const DeviceMesh& mesh) {
  const MeshShape& shape = mesh.shape();
  SCOPED_TRACE(shape.to_string() + " order " + format_axis_order(mesh.order()));
  for (int rank = 0; rank < mesh.world_size(); ++rank) {
    const MeshCoord c = mesh.coord_of(rank);
    for (Axis axis : kAllAxes) {
      EXPECT_GE(c[axis], 0);
      EXPECT_LT(c[axis], shape.size(axis));
    }
    EXPECT_EQ(mesh.rank_of(c), rank);
  }
  for (Axis axis : kAllAxes) {
    SCOPED_TRACE(axis_name(axis));
    const GroupList groups = mesh.groups(axis);
    ASSERT_EQ(static_cast<int>(groups.size()), mesh.world_size() / shape.size(axis));
    std::vector<int> times_seen(static_cast<std::size_t>(mesh.world_size()), 0);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const std::vector<int>& group = groups[g];
      ASSERT_EQ(static_cast<int>(group.size()), shape.size(axis));
      if (g > 0) {
        EXPECT_LT(groups[g - 1].front(), group.front());  // groups ordered by first rank
      }
      const MeshCoord first = mesh.coord_of(group.front());
      for (std::size_t i = 0; i < group.size(); ++i) {
        const int member = group[i];
        times_seen[static_cast<std::size_t>(member)] += 1;
        // Members are ordered by their coordinate on the axis and agree on every other axis.
        MeshCoord expected = first;
        expected[axis] = static_cast<int>(i);
        EXPECT_EQ(mesh.coord_of(member), expected) << "member " << member;
        EXPECT_EQ(mesh.group_index(member, axis), static_cast<int>(g));
        EXPECT_EQ(mesh.group_of(member, axis), group);
      }
    }
    for (int rank = 0; rank < mesh.world_size(); ++rank) {
      EXPECT_EQ(times_seen[static_cast<std::size_t>(rank)], 1) << "rank " << rank;
    }
  }
}

TEST(DeviceMesh, EveryRankInExactlyOneGroupPerAxis) {
  const std::vector<MeshShape> shapes = {
      {},
      {.data = 8},
      {.tensor = 8},
      {.pipeline = 8},
      {.sequence = 8},
      {.data = 2, .pipeline = 2, .tensor = 2, .sequence = 2},
      {.data = 3, .pipeline = 1, .tensor = 2, .sequence = 1},
      {.data = 2, .pipeline = 3, .tensor = 4, .sequence = 5},
      {.data = 1, .pipeline = 4, .tensor = 1, .sequence = 3},
  };
  for (const MeshShape& shape : shapes) {
    check_mesh(DeviceMesh(shape));
    check_mesh(DeviceMesh(shape, parse_axis_order("pp-dp-sp-tp")));
    check_mesh(DeviceMesh(shape, parse_axis_order("dp-tp-pp-sp")));
  }
}

TEST(DeviceMesh, OtherAxisOrder) {
  // Data innermost: data-parallel peers are adjacent ranks.
  const DeviceMesh mesh({.data = 2, .pipeline = 1, .tensor = 2}, parse_axis_order("dp-tp-sp-pp"));
  EXPECT_EQ(mesh.groups(Axis::data), (GroupList{{0, 1}, {2, 3}}));
  EXPECT_EQ(mesh.groups(Axis::tensor), (GroupList{{0, 2}, {1, 3}}));
}

TEST(DeviceMesh, AxisOrderText) {
  EXPECT_EQ(parse_axis_order("tp-sp-dp-pp"), kDefaultAxisOrder);
  for (const char* text : {"pp-dp-sp-tp", "sp-tp-pp-dp"}) {
    EXPECT_EQ(format_axis_order(parse_axis_order(text)), text);
  }
  for (const char* bad : {"", "tp", "tp-sp-dp", "tp-sp-dp-pp-", "tp-tp-dp-pp", "tp-sp-dp-xx",
                          "tp-sp-dp-pp-tp", "-tp-sp-dp-pp"}) {
    EXPECT_THROW(parse_axis_order(bad), std::invalid_argument) << bad;
  }
}

TEST(DeviceMesh, RejectsBadInput) {
  EXPECT_THROW(DeviceMesh({.data = 0}), std::invalid_argument);
  EXPECT_THROW(DeviceMesh({.tensor = -2}), std::invalid_argument);
  EXPECT_THROW(DeviceMesh({}, AxisOrder{Axis::tensor, Axis::tensor, Axis::data, Axis::pipeline}),
               std::invalid_argument);
  const DeviceMesh mesh({.data = 2, .tensor = 2});
  EXPECT_THROW(mesh.coord_of(4), std::invalid_argument);
  EXPECT_THROW(mesh.coord_of(-1), std::invalid_argument);
  EXPECT_THROW(mesh.rank_of({.data = 2}), std::invalid_argument);
  EXPECT_THROW(mesh.group_of(7, Axis::data), std::invalid_argument);
}

TEST(DeviceMesh, MismatchMessageFollowsConventions) {
  const DeviceMesh mesh({.data = 2, .tensor = 2});
  try {
    (void)mesh.coord_of(9);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("rank 9"), std::string::npos) << message;
    EXPECT_NE(message.find("; "), std::string::npos) << message;  // "...; what to do"
  }
}

}  // namespace
}  // namespace colossal::parallel
