// DeviceMesh without MPI: rank <-> coordinate arithmetic, the groups of every axis and of axis
// sets, the embedding groups, and the tensor axis' 2D/2.5D/3D sub-grid.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <stdexcept>
#include <utility>
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

// What MPI_Comm_split(color, key) gives every rank of a world of `n`: its communicator's members
// (the ranks of its color by key, then old rank), in communicator-rank order. The trainers used
// to build their compound groups this way; the mesh must give the same members in the same order.
GroupList split_members(int n, const std::function<int(int)>& color,
                        const std::function<int(int)>& key) {
  std::map<int, std::vector<std::pair<int, int>>> by_color;
  for (int r = 0; r < n; ++r) by_color[color(r)].push_back({key(r), r});
  GroupList out(static_cast<std::size_t>(n));
  for (auto& [c, members] : by_color) {
    std::sort(members.begin(), members.end());
    std::vector<int> ranks;
    for (const auto& m : members) ranks.push_back(m.second);
    for (int r : ranks) out[static_cast<std::size_t>(r)] = ranks;
  }
  return out;
}

// data 2 x pipeline 2 x tensor 2 x sequence 1: world rank = t + 2 * (d + 2 * p).
TEST(DeviceMeshAxisSets, GroupsWrittenOut) {
  const DeviceMesh mesh({.data = 2, .pipeline = 2, .tensor = 2, .sequence = 1});
  EXPECT_EQ(mesh.groups({Axis::sequence, Axis::data}), (GroupList{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh.groups({Axis::tensor, Axis::data}), (GroupList{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(mesh.groups({Axis::tensor, Axis::pipeline}), (GroupList{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(mesh.groups({Axis::data, Axis::pipeline}), (GroupList{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  // The order of the set does not matter, nor do repeats; members are innermost axis fastest.
  EXPECT_EQ(mesh.groups({Axis::pipeline, Axis::tensor, Axis::tensor}),
            (GroupList{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(mesh.groups({Axis::tensor, Axis::sequence, Axis::data, Axis::pipeline}),
            (GroupList{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(mesh.groups({}), (GroupList{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(mesh.group_of(6, {Axis::tensor, Axis::pipeline}), (std::vector<int>{2, 3, 6, 7}));
  EXPECT_EQ(mesh.group_index(6, {Axis::tensor, Axis::pipeline}), 1);
  EXPECT_EQ(mesh.group_index(7, {Axis::sequence, Axis::data}), 3);
  EXPECT_THROW(mesh.group_of(8, {Axis::data}), std::invalid_argument);
}

// data 2 x pipeline 2 x tensor 2 x sequence 2: world rank = t + 2 * (s + 2 * (d + 2 * p)).
TEST(DeviceMeshAxisSets, GradientGroupIsDataTimesSequence) {
  const DeviceMesh mesh({.data = 2, .pipeline = 2, .tensor = 2, .sequence = 2});
  EXPECT_EQ(mesh.groups({Axis::sequence, Axis::data}),
            (GroupList{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(mesh.group_of(13, {Axis::data, Axis::sequence}), (std::vector<int>{9, 11, 13, 15}));
}

// Every shape and both orders: one axis as a set is that axis; every set partitions the world,
// members share the coordinates outside the set, ascend, and the group index is the group's place.
TEST(DeviceMeshAxisSets, PropertiesOfEverySet) {
  const std::vector<MeshShape> shapes{{.data = 2, .pipeline = 3, .tensor = 2, .sequence = 2},
                                      {.data = 1, .pipeline = 2, .tensor = 4, .sequence = 1},
                                      {.data = 3, .pipeline = 1, .tensor = 1, .sequence = 2}};
  for (const MeshShape& shape : shapes) {
    for (const char* order : {"tp-sp-dp-pp", "pp-dp-sp-tp"}) {
      const DeviceMesh mesh(shape, parse_axis_order(order));
      SCOPED_TRACE(shape.to_string() + " order " + order);
      for (Axis axis : kAllAxes) EXPECT_EQ(mesh.groups({axis}), mesh.groups(axis));
      const std::vector<std::pair<Axis, Axis>> pairs{{Axis::sequence, Axis::data},
                                                     {Axis::tensor, Axis::pipeline},
                                                     {Axis::data, Axis::pipeline}};
      for (const auto& [a, b] : pairs) {
        const GroupList groups = mesh.groups({a, b});
        std::vector<int> seen(static_cast<std::size_t>(mesh.world_size()), 0);
        for (std::size_t g = 0; g < groups.size(); ++g) {
          ASSERT_EQ(int(groups[g].size()), shape.size(a) * shape.size(b));
          EXPECT_TRUE(std::is_sorted(groups[g].begin(), groups[g].end()));
          if (g > 0) {
            EXPECT_LT(groups[g - 1].front(), groups[g].front());
          }
          for (int r : groups[g]) {
            ++seen[static_cast<std::size_t>(r)];
            EXPECT_EQ(mesh.group_index(r, {a, b}), int(g));
            EXPECT_EQ(mesh.group_of(r, {a, b}), groups[g]);
            for (Axis other : kAllAxes) {
              if (other != a && other != b) {
                EXPECT_EQ(mesh.coord_of(r)[other], mesh.coord_of(groups[g].front())[other]);
              }
            }
          }
        }
        for (int count : seen) EXPECT_EQ(count, 1);
      }
    }
  }
}

// The trainer's gradient group used to be world.split(tp + T * pp, world rank): the same members,
// in the same order, as groups({sequence, data}).
TEST(DeviceMeshAxisSets, GradientGroupMatchesTheHandSplit) {
  for (const MeshShape& shape : {MeshShape{.data = 2, .pipeline = 2, .tensor = 2, .sequence = 2},
                                 MeshShape{.data = 3, .pipeline = 2, .tensor = 1, .sequence = 2},
                                 MeshShape{.data = 1, .pipeline = 1, .tensor = 4, .sequence = 2}}) {
    SCOPED_TRACE(shape.to_string());
    const DeviceMesh mesh(shape);
    const GroupList split = split_members(
        mesh.world_size(),
        [&](int r) { return mesh.coord_of(r).tensor + shape.tensor * mesh.coord_of(r).pipeline; },
        [](int r) { return r; });
    for (int r = 0; r < mesh.world_size(); ++r) {
      EXPECT_EQ(mesh.group_of(r, {Axis::sequence, Axis::data}), split[static_cast<std::size_t>(r)])
          << "rank " << r;
    }
  }
}

TEST(DeviceMeshEmbedding, FirstAndLastStage) {
  // data 2 x pipeline 3: world rank = d + 2 p; stage 1 (ranks 2, 3) is in the middle.
  const DeviceMesh mesh({.data = 2, .pipeline = 3});
  EXPECT_EQ(mesh.embedding_groups(), (GroupList{{0, 4}, {1, 5}}));
  EXPECT_EQ(mesh.embedding_group_of(0), (std::vector<int>{0, 4}));
  EXPECT_EQ(mesh.embedding_group_of(5), (std::vector<int>{1, 5}));
  EXPECT_TRUE(mesh.embedding_group_of(2).empty());
  EXPECT_TRUE(mesh.embedding_group_of(3).empty());
  // Two stages: the pipeline groups themselves. One stage: each rank alone.
  const DeviceMesh two({.data = 2, .pipeline = 2, .tensor = 2});
  EXPECT_EQ(two.embedding_groups(), (GroupList{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  const DeviceMesh one({.data = 2, .tensor = 2});
  EXPECT_EQ(one.embedding_groups(), (GroupList{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(one.embedding_group_of(3), (std::vector<int>{3}));
}

// The trainer's tied-embedding group used to be world.split(ends ? rank % inner : inner + rank,
// rank) with inner = world / stages: the same members and order on the first and last stages.
TEST(DeviceMeshEmbedding, MatchesTheHandSplit) {
  for (const MeshShape& shape : {MeshShape{.data = 2, .pipeline = 4, .tensor = 2, .sequence = 1},
                                 MeshShape{.data = 1, .pipeline = 3, .tensor = 2, .sequence = 2},
                                 MeshShape{.data = 2, .pipeline = 2, .tensor = 1, .sequence = 2}}) {
    SCOPED_TRACE(shape.to_string());
    const DeviceMesh mesh(shape);
    const int inner = mesh.world_size() / shape.pipeline;
    auto ends = [&](int r) {
      const int stage = mesh.coord_of(r).pipeline;
      return stage == 0 || stage == shape.pipeline - 1;
    };
    const GroupList split = split_members(
        mesh.world_size(), [&](int r) { return ends(r) ? r % inner : inner + r; },
        [](int r) { return r; });
    for (int r = 0; r < mesh.world_size(); ++r) {
      if (ends(r)) {
        EXPECT_EQ(mesh.embedding_group_of(r), split[static_cast<std::size_t>(r)]) << "rank " << r;
      } else {
        EXPECT_TRUE(mesh.embedding_group_of(r).empty()) << "rank " << r;
      }
    }
  }
}

using core::TensorMode;
using G = TensorGridGroup;

// 3D, q = 2: tensor rank = (i * 2 + j) * 2 + l.
TEST(TensorSubGrid, CubeGroupsWrittenOut) {
  const TensorSubGrid grid(TensorMode::d3, 8);
  EXPECT_EQ(grid.q(), 2);
  EXPECT_EQ(grid.depth(), 1);
  EXPECT_EQ(grid.size(), 8);
  EXPECT_EQ(grid.coord_of(6), (TensorSubGrid::Coord{.depth = 0, .i = 1, .j = 1, .l = 0}));
  EXPECT_EQ(grid.needed(),
            (std::vector<G>{G::input, G::weight, G::output, G::plane_l, G::plane_j}));
  EXPECT_EQ(grid.groups(G::input), (GroupList{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(grid.groups(G::weight), (GroupList{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(grid.groups(G::output), (GroupList{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(grid.groups(G::plane_l), (GroupList{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(grid.groups(G::plane_j), (GroupList{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(grid.group_of(7, G::plane_j), (std::vector<int>{2, 3, 6, 7}));
  EXPECT_EQ(grid.group_index(7, G::plane_j), 1);
  EXPECT_THROW(grid.groups(G::row), std::invalid_argument);
}

// 2.5D, q = 2, depth 2: tensor rank = (d * 2 + i) * 2 + j. 2D, q = 3: rank = i * 3 + j.
TEST(TensorSubGrid, GridGroupsWrittenOut) {
  const TensorSubGrid layers(TensorMode::d2_5, 8, 2);
  EXPECT_EQ(layers.q(), 2);
  EXPECT_EQ(layers.depth(), 2);
  EXPECT_EQ(layers.coord_of(6), (TensorSubGrid::Coord{.depth = 1, .i = 1, .j = 0, .l = 0}));
  EXPECT_EQ(layers.needed(), (std::vector<G>{G::row, G::col, G::depth}));
  EXPECT_EQ(layers.groups(G::row), (GroupList{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(layers.groups(G::col), (GroupList{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(layers.groups(G::depth), (GroupList{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  const TensorSubGrid flat(TensorMode::d2, 9);
  EXPECT_EQ(flat.q(), 3);
  EXPECT_EQ(flat.needed(), (std::vector<G>{G::row, G::col}));
  EXPECT_EQ(flat.groups(G::row), (GroupList{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}}));
  EXPECT_EQ(flat.groups(G::col), (GroupList{{0, 3, 6}, {1, 4, 7}, {2, 5, 8}}));
  EXPECT_EQ(flat.group_of(5, G::depth), (std::vector<int>{5}));
  EXPECT_THROW(flat.groups(G::plane_l), std::invalid_argument);
  // 2d ignores a depth; 2.5d with one layer is the 2D grid.
  EXPECT_EQ(TensorSubGrid(TensorMode::d2, 4, 3).depth(), 1);
  EXPECT_EQ(TensorSubGrid(TensorMode::d2_5, 4, 1).needed(), (std::vector<G>{G::row, G::col}));
}

// The sub-groups TrainerMD used to split by (color, key) on the tensor group: same members, same
// order, for every group of every grid.
TEST(TensorSubGrid, MatchesTheHandSplits) {
  using Formula = std::pair<std::function<int(int)>, std::function<int(int)>>;
  for (int q : {2, 3}) {
    const TensorSubGrid cube(TensorMode::d3, q * q * q);
    auto i = [q](int r) { return r / (q * q); };
    auto j = [q](int r) { return r / q % q; };
    auto l = [q](int r) { return r % q; };
    const std::map<G, Formula> cube_splits{
        {G::input, {[=](int r) { return i(r) * q + l(r); }, j}},
        {G::weight, {[=](int r) { return j(r) * q + l(r); }, i}},
        {G::output, {[=](int r) { return i(r) * q + j(r); }, l}},
        {G::plane_l, {l, [=](int r) { return i(r) * q + j(r); }}},
        {G::plane_j, {j, [=](int r) { return i(r) * q + l(r); }}}};
    for (const auto& [group, formula] : cube_splits) {
      SCOPED_TRACE(std::string("3d q ") + std::to_string(q) + " " + tensor_grid_group_name(group));
      const GroupList split = split_members(cube.size(), formula.first, formula.second);
      for (int r = 0; r < cube.size(); ++r) {
        EXPECT_EQ(cube.group_of(r, group), split[static_cast<std::size_t>(r)]) << "rank " << r;
      }
    }
    for (int depth : {1, 2, 3}) {
      const TensorSubGrid grid(TensorMode::d2_5, q * q * depth, depth);
      auto d = [q](int r) { return r / (q * q); };
      auto gi = [q](int r) { return r / q % q; };
      auto gj = [q](int r) { return r % q; };
      const std::map<G, Formula> grid_splits{
          {G::row, {[=](int r) { return d(r) * q + gi(r); }, gj}},
          {G::col, {[=](int r) { return d(r) * q + gj(r); }, gi}},
          {G::depth, {[=](int r) { return gi(r) * q + gj(r); }, d}}};
      for (const auto& [group, formula] : grid_splits) {
        SCOPED_TRACE("2.5d q " + std::to_string(q) + " depth " + std::to_string(depth) + " " +
                     tensor_grid_group_name(group));
        const GroupList split = split_members(grid.size(), formula.first, formula.second);
        for (int r = 0; r < grid.size(); ++r) {
          EXPECT_EQ(grid.group_of(r, group), split[static_cast<std::size_t>(r)]) << "rank " << r;
        }
      }
    }
  }
}

TEST(TensorSubGrid, RejectsBadInput) {
  EXPECT_THROW(TensorSubGrid(TensorMode::d1, 4), std::invalid_argument);
  EXPECT_THROW(TensorSubGrid(TensorMode::d2, 1), std::invalid_argument);
  EXPECT_THROW(TensorSubGrid(TensorMode::d2_5, 8, 0), std::invalid_argument);
  EXPECT_THROW(TensorSubGrid(TensorMode::d2, 6), std::invalid_argument);
  try {
    (void)TensorSubGrid(TensorMode::d3, 9);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("parallel.tensor.size = 9"), std::string::npos) << message;
    EXPECT_NE(message.find("; use a size such as 8"), std::string::npos) << message;
  }
  const TensorSubGrid grid(TensorMode::d2, 4);
  EXPECT_THROW(grid.coord_of(4), std::invalid_argument);
  EXPECT_THROW(grid.group_of(-1, G::row), std::invalid_argument);
}

}  // namespace
}  // namespace colossal::parallel
