// The GPU choice at start-up: local rank mod visible devices (parallel::device_for), handed to
// Kokkos unless the user's --kokkos-* flags choose (apps::kokkos_device_for).
#include <gtest/gtest.h>

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
