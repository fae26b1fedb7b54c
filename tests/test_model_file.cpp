// The HDF5 model file: round trip, shape checks, and the config attribute in both string forms.
#include <gtest/gtest.h>

#include <filesystem>

#include "io/hdf5_file.hpp"

using namespace colossal;

namespace {

std::vector<core::ParamSpec> small_table() {
  return core::parameter_table(core::model_spec(core::Arch::gpt2, 1, 8, 2, 16, 10, 4));
}

std::size_t flat(const std::vector<core::ParamSpec>& t) {
  return t.back().offset + t.back().count;
}

TEST(ModelFile, RoundTripsEveryParameterAndTheConfig) {
  const auto table = small_table();
  std::vector<float> params(flat(table));
  for (std::size_t i = 0; i < params.size(); ++i) params[i] = 0.25f * float(i % 17) - 1.0f;
  const std::string path = (std::filesystem::temp_directory_path() / "colossal_mf.h5").string();
  io::write_model_file(path, table, params.data(), "model: {layers: 1}\n");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::vector<float> back(params.size(), 0.0f);
  EXPECT_EQ(io::read_model_file(path, table, back), "model: {layers: 1}\n");
  for (const auto& p : table) {
    for (std::size_t i = p.offset; i < p.offset + p.count; ++i) ASSERT_EQ(back[i], params[i]) << p.name;
  }
}

TEST(ModelFile, ReadsAVariableLengthConfigAsH5pyWritesIt) {
  const auto table = small_table();
  std::vector<float> params(flat(table), 1.0f);
  const std::string path = (std::filesystem::temp_directory_path() / "colossal_mf_vlen.h5").string();
  io::write_model_file(path, table, params.data(), "fixed");
  {
    // Replace the attribute by a variable-length string, as h5py does for a Python str.
    io::H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose, "open");
    ASSERT_GE(H5Adelete(file.get(), "config"), 0);
    io::H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose, "type");
    ASSERT_GE(H5Tset_size(type.get(), H5T_VARIABLE), 0);
    io::H5Handle space(H5Screate(H5S_SCALAR), H5Sclose, "space");
    io::H5Handle attr(H5Acreate2(file.get(), "config", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                      H5Aclose, "attr");
    const char* text = "edited: yes\n";
    ASSERT_GE(H5Awrite(attr.get(), type.get(), &text), 0);
  }
  std::vector<float> back(params.size());
  EXPECT_EQ(io::read_model_file(path, table, back), "edited: yes\n");
}

TEST(ModelFile, MissingDatasetIsNamed) {
  auto table = small_table();
  std::vector<float> params(flat(table), 1.0f);
  const std::string path = (std::filesystem::temp_directory_path() / "colossal_mf_missing.h5").string();
  auto shorter = table;
  shorter.pop_back();
  io::write_model_file(path, shorter, params.data(), "");
  std::vector<float> back(params.size());
  try {
    io::read_model_file(path, table, back);
    FAIL();
  } catch (const io::H5Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no dataset '" + table.back().name + "'"), std::string::npos)
        << e.what();
  }
}

}  // namespace
