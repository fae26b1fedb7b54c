// Reads a metrics.h5 back for tests: every 1-D dataset by name (docs/metrics-format.md).
#pragma once

#include <gtest/gtest.h>
#include <hdf5.h>

#include <map>
#include <string>
#include <vector>

#include "io/hdf5_file.hpp"

namespace colossal::test {

inline std::map<std::string, std::vector<double>> read_metrics_h5(const std::string& path) {
  using io::H5Handle;
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, "open " + path);
  std::map<std::string, std::vector<double>> columns;
  H5G_info_t info;
  EXPECT_GE(H5Gget_info(file.get(), &info), 0);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    char name[256] = {};
    EXPECT_GT(H5Lget_name_by_idx(file.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name,
                                 sizeof(name), H5P_DEFAULT), 0);
    H5Handle dset(H5Dopen2(file.get(), name, H5P_DEFAULT), H5Dclose, name);
    H5Handle space(H5Dget_space(dset.get()), H5Sclose, "space");
    hsize_t rows = 0;
    EXPECT_EQ(H5Sget_simple_extent_ndims(space.get()), 1) << name;
    H5Sget_simple_extent_dims(space.get(), &rows, nullptr);
    std::vector<double> values(rows);
    if (rows > 0) {
      EXPECT_GE(H5Dread(dset.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                        values.data()), 0);
    }
    columns[name] = values;
  }
  return columns;
}

}  // namespace colossal::test
