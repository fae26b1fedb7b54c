// The GPU choice at start-up: local rank mod visible devices (parallel::device_for), handed to
// Kokkos unless the user's --kokkos-* flags choose (apps::kokkos_device_for).
#include <gtest/gtest.h>

#include <mpi.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "apps/cli.hpp"
#include "parallel/local_device.hpp"

using colossal::apps::kokkos_device_for;
using colossal::parallel::device_for;

TEST(DeviceChoice, LocalRankModuloDevices) {
  EXPECT_EQ(device_for(0, 4), 0);
  EXPECT_EQ(device_for(3, 4), 3);
  EXPECT_EQ(device_for(5, 4), 1);
  EXPECT_EQ(device_for(7, 1), 0);
  EXPECT_EQ(device_for(2, 0), -1);   // no GPU visible
  EXPECT_EQ(device_for(-1, 4), -1);  // no local rank
}

TEST(DeviceChoice, KokkosGetsTheChosenDevice) {
  EXPECT_EQ(kokkos_device_for(device_for(6, 4), {}), 2);
  EXPECT_EQ(kokkos_device_for(device_for(1, 8), {"--kokkos-threads=2"}), 1);
  EXPECT_EQ(kokkos_device_for(device_for(1, 0), {}), -1);  // no device: Kokkos' default
}

TEST(DeviceChoice, UserFlagsOverride) {
  for (std::string_view flag : {"--kokkos-device-id=3", "--kokkos-device-id",
                                "--kokkos-num-devices=2", "--kokkos-ndevices=2",
                                "--kokkos-device=1"}) {
    EXPECT_EQ(kokkos_device_for(2, {"--kokkos-threads=1", flag}), -1) << flag;
  }
  // A flag that merely starts like one of them is not an override.
  EXPECT_EQ(kokkos_device_for(2, {"--kokkos-device-idx=3"}), 2);
}

// GPUs are told apart by what every process of a node sees alike (PCI bus id, UUID), not by
// device ordinals, which are all 0 under Slurm's --gpus-per-task=1.
TEST(DeviceChoice, RanksOnTheSameGpuCountedByIdentity) {
  using colossal::parallel::ranks_on_same_gpu;
  EXPECT_EQ(ranks_on_same_gpu({"0000:3B:00.0", "0000:86:00.0", "0000:3B:00.0", ""}),
            (std::vector<int>{2, 1, 2, 1}));
  EXPECT_EQ(ranks_on_same_gpu({"", ""}), (std::vector<int>{1, 1}));  // no GPUs: none shared
  EXPECT_EQ(ranks_on_same_gpu({"a", "b", "c", "d"}), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_TRUE(ranks_on_same_gpu({}).empty());
}

TEST(DeviceChoice, RanksGroupedByGpuInOrderOfTheirFirstRank) {
  using colossal::parallel::group_by_gpu;
  EXPECT_EQ(group_by_gpu({"u2", "u1", "", "u2", "u1", "u3"}),
            (std::vector<std::vector<int>>{{0, 3}, {1, 4}, {5}}));
  EXPECT_TRUE(group_by_gpu({"", ""}).empty());
}

// Without CUDA (or a GPU) this process has no identity; with one, a UUID of 32 hex digits.
// Gathering over a communicator gives
// every rank's record back in rank order, the strings intact.
TEST(DeviceChoice, IdentitiesGatherInRankOrder) {
  using colossal::parallel::GpuIdentity;
  const GpuIdentity here = colossal::parallel::current_gpu_identity();
  if (here.bus_id.empty()) {  // no CUDA in the build, or no GPU visible
    EXPECT_TRUE(here.uuid.empty());
    EXPECT_EQ(here.ordinal, -1);
  } else {
    EXPECT_EQ(here.uuid.size(), 32u);
    EXPECT_GE(here.ordinal, 0);
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const GpuIdentity mine{"0000:0" + std::to_string(rank) + ":00.0",
                         std::string(32, char('a' + rank % 6)), 0};
  const std::vector<GpuIdentity> all =
      colossal::parallel::all_gather_gpu_identities(MPI_COMM_WORLD, mine);
  ASSERT_EQ(all.size(), std::size_t(size));
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(all[std::size_t(r)].bus_id, "0000:0" + std::to_string(r) + ":00.0");
    EXPECT_EQ(all[std::size_t(r)].uuid, std::string(32, char('a' + r % 6)));
    EXPECT_EQ(all[std::size_t(r)].ordinal, 0);
  }
  EXPECT_THROW(colossal::parallel::all_gather_gpu_identities(
                   MPI_COMM_WORLD, GpuIdentity{std::string(40, 'x'), "", 0}),
               std::invalid_argument);
}

// A launcher's local ranks are used only when they number the node's ranks 0..n-1.
TEST(DeviceChoice, LauncherLocalRanksUsedOnlyWhenTheyNumberTheNode) {
  using colossal::parallel::env_local_ranks_usable;
  EXPECT_TRUE(env_local_ranks_usable({0}));
  EXPECT_TRUE(env_local_ranks_usable({1, 0, 2}));
  EXPECT_FALSE(env_local_ranks_usable({0, 0, 0}));  // mpirun in sbatch: the batch step's 0
  EXPECT_FALSE(env_local_ranks_usable({0, -1}));    // one rank has none
  EXPECT_FALSE(env_local_ranks_usable({-1}));
  EXPECT_FALSE(env_local_ranks_usable({}));
  EXPECT_FALSE(env_local_ranks_usable({0, 4}));     // distinct, but not the node's 0..1
}

// Over the node's ranks (ctest runs this at 1 and 3 ranks on one node): mpirun's local rank wins
// over a SLURM_LOCALID every rank inherited, and numbers that do not count the node's ranks
// 0..n-1 (repeated, or missing on some rank) fall back to the rank in the node, saying why.
TEST(DeviceChoice, NodeLocalRankDistrustsARepeatedSlurmLocalId) {
  MPI_Comm node;
  ASSERT_EQ(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
            MPI_SUCCESS);
  int local = 0, locals = 1;
  MPI_Comm_rank(node, &local);
  MPI_Comm_size(node, &locals);
  struct Restore {  // the launcher's variables as they were
    std::vector<std::pair<std::string, std::string>> saved;
    Restore() {
      for (const char* n : colossal::parallel::kLauncherLocalRankVariables) {
        const char* v = std::getenv(n);
        saved.emplace_back(n, v == nullptr ? "\x01" : v);
        unsetenv(n);
      }
    }
    ~Restore() {
      for (auto& [n, v] : saved) {
        if (v == "\x01") unsetenv(n.c_str());
        else setenv(n.c_str(), v.c_str(), 1);
      }
    }
  } restore;
  using colossal::parallel::node_local_rank;
  // The launcher's distinct numbers, in another order than the node's ranks: used as given.
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(locals - 1 - local).c_str(), 1);
  setenv("SLURM_LOCALID", "0", 1);
  auto got = node_local_rank(node);
  EXPECT_EQ(got.rank, locals - 1 - local);
  EXPECT_EQ(got.source, "OMPI_COMM_WORLD_LOCAL_RANK");
  // Only the inherited SLURM_LOCALID: fine alone, not beside other ranks.
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  got = node_local_rank(node);
  EXPECT_EQ(got.rank, local);
  EXPECT_EQ(got.source, locals == 1 ? std::string("SLURM_LOCALID")
                                    : "MPI shared-memory split (the launcher's local ranks, "
                                      "SLURM_LOCALID here, do not number this node's " +
                                          std::to_string(locals) + " ranks 0.." +
                                          std::to_string(locals - 1) + ")");
  // On one rank only: the others have none.
  if (locals > 1) {
    if (local == 1) setenv("SLURM_LOCALID", "1", 1);
    else unsetenv("SLURM_LOCALID");
    got = node_local_rank(node);
    EXPECT_EQ(got.rank, local);
    EXPECT_EQ(got.source,
              "MPI shared-memory split (not every rank of this node has a launcher's local rank)");
  }
  // None at all: the rank in the node.
  unsetenv("SLURM_LOCALID");
  got = node_local_rank(node);
  EXPECT_EQ(got.rank, local);
  EXPECT_EQ(got.source, "MPI shared-memory split");
  MPI_Comm_free(&node);
}
