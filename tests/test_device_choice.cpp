// The GPU choice at start-up: local rank mod visible devices (parallel::device_for), handed to
// Kokkos unless the user's --kokkos-* flags choose (apps::kokkos_device_for).
#include <gtest/gtest.h>

#include <mpi.h>

#include <stdexcept>
#include <string>
#include <string_view>
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
