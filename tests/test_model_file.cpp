// The HDF5 model file: round trip, shape checks, and the config attribute in both string forms;
// the checkpoint file's whole-file integrity header.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "io/checkpoint.hpp"
#include "io/hdf5_file.hpp"
#include "io/init_from.hpp"

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
  // h5py writes a Python str as a variable-length UTF-8 string (ASCII: another writer); HDF5
  // converts no string between the two character sets, so the reader takes the file's.
  for (const H5T_cset_t cset : {H5T_CSET_UTF8, H5T_CSET_ASCII}) {
    io::write_model_file(path, table, params.data(), "fixed");
    {
      // Replace the attributes by variable-length strings, as h5py does for a Python str.
      io::H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose, "open");
      io::H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose, "type");
      ASSERT_GE(H5Tset_size(type.get(), H5T_VARIABLE), 0);
      ASSERT_GE(H5Tset_cset(type.get(), cset), 0);
      io::H5Handle space(H5Screate(H5S_SCALAR), H5Sclose, "space");
      for (const auto& [name, value] : {std::pair{"config", "edited: yes\n"},
                                        std::pair{"format", "colossal-model"}}) {
        if (H5Aexists(file.get(), name) > 0) {
          ASSERT_GE(H5Adelete(file.get(), name), 0);
        }
        io::H5Handle attr(H5Acreate2(file.get(), name, type.get(), space.get(), H5P_DEFAULT,
                                     H5P_DEFAULT),
                          H5Aclose, "attr");
        const char* text = value;
        ASSERT_GE(H5Awrite(attr.get(), type.get(), &text), 0);
      }
    }
    std::vector<float> back(params.size());
    EXPECT_EQ(io::read_model_file(path, table, back), "edited: yes\n") << int(cset);
    EXPECT_EQ(io::check_model_file(path, table), "edited: yes\n") << int(cset);
    // model.init_from and --weights read the tensors through io::read_weights, which reads the
    // file's "format" attribute (a checkpoint's model part has another prefix).
    const auto spec = core::model_spec(core::Arch::gpt2, 1, 8, 2, 16, 10, 4);
    std::vector<float> wte(std::size_t(table.front().count), 0.0f);
    io::read_weights(path, spec, table,
                     {io::TensorRun{0, 0, std::size_t(table.front().count), wte.data()}});
    EXPECT_EQ(wte[3], 1.0f) << int(cset);
  }
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

// A file of more layers (or other tensors) than the model is refused, not read in part: before,
// a 4-layer model.h5 evaluated as 2 layers loaded its first two and printed a wrong loss.
TEST(ModelFile, ExtraLayersOrTensorsAreRefused) {
  const auto deeper = core::parameter_table(core::model_spec(core::Arch::gpt2, 3, 8, 2, 16, 10, 4));
  const auto table = small_table();  // the same model with 1 layer
  std::vector<float> params(flat(deeper), 0.5f);
  const std::string path = (std::filesystem::temp_directory_path() / "colossal_mf_deeper.h5").string();
  io::write_model_file(path, deeper, params.data(), "");
  std::vector<float> back(flat(table));
  try {
    io::read_model_file(path, table, back);
    FAIL() << "read a 3-layer file as 1 layer";
  } catch (const io::H5Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds 3 layers but model.layers is 1; set model.layers: 3"),
              std::string::npos)
        << e.what();
  }
  // Another tensor than the layers': named, with the keys that change the tensor set.
  auto more = table;
  core::ParamSpec extra = more.back();
  extra.name = "lm_head.weight";
  extra.offset = 0;
  more.push_back(extra);
  io::write_model_file(path, more, params.data(), "");
  try {
    io::read_model_file(path, table, back);
    FAIL() << "read a file with an extra tensor";
  } catch (const io::H5Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'lm_head.weight' is not part of this model"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(io::layers_in({"transformer.h.0.ln_1.weight", "transformer.h.11.mlp.c_fc.bias",
                           "transformer.wte.weight"},
                          "h."),
            12);
  EXPECT_EQ(io::layers_in({"model.decoder.layers.3.fc1.weight"}, "layers."), 4);
  EXPECT_EQ(io::layers_in({"transformer.wte.weight"}, "h."), 0);
}

// What HDF5 must never see: every kind of damage is caught by the integrity header first, with a
// message naming the file; an intact checkpoint reads back, also through plain HDF5 (h5py's way).
TEST(CheckpointFile, IntegrityHeaderIsCheckedBeforeHdf5ParsesTheFile) {
  namespace fs = std::filesystem;
  const auto table = small_table();
  const std::size_t n = flat(table);
  std::vector<float> params(n), m(n), v(n);
  for (std::size_t i = 0; i < n; ++i) {
    params[i] = 0.5f * float(i % 13) - 2.0f;
    m[i] = 0.01f * float(i % 7);
    v[i] = 0.001f * float(i % 5);
  }
  const fs::path dir = fs::temp_directory_path() / "colossal_ckpt_integrity";
  fs::remove_all(dir);
  io::CheckpointState state;
  state.step = 7;
  state.optimizer_step = 7;
  state.config = "model: {layers: 1}\n";
  const std::string path = io::write_checkpoint(dir.string(), table, params.data(), m.data(),
                                                v.data(), state, 2);
  std::vector<float> p2(n), m2(n), v2(n);
  // Every tensor read back (the flat buffers have padding between units that is not saved).
  auto expect_tensors = [&](const std::vector<float>& got, const std::vector<float>& want) {
    for (const auto& p : table) {
      for (std::size_t i = p.offset; i < p.offset + p.count; ++i) {
        ASSERT_EQ(got[i], want[i]) << p.name;
      }
    }
  };
  EXPECT_EQ(io::read_checkpoint(path, table, p2, m2, v2).step, 7);
  expect_tensors(p2, params);
  expect_tensors(v2, v);
  {
    // HDF5 itself finds the superblock after the user block.
    io::H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, "open");
    EXPECT_GE(H5Aexists(file.get(), "format"), 1);
  }
  std::ifstream in(path, std::ios::binary);
  const std::string good{std::istreambuf_iterator<char>(in), {}};
  ASSERT_EQ(good.rfind("colossal-checkpoint-integrity 1\nhdf5-bytes ", 0), 0u);

  auto expect_refused = [&](const std::string& bytes, const std::string& what) {
    const std::string damaged = (dir / "damaged.h5").string();
    std::ofstream(damaged, std::ios::binary | std::ios::trunc) << bytes;
    try {
      io::read_checkpoint_config(damaged);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const io::H5Error& e) {
      EXPECT_NE(std::string(e.what()).find(damaged), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << what << ": " << e.what();
    }
  };
  std::string flipped = good;
  flipped[600] = char(flipped[600] ^ 0x10);  // HDF5 metadata, just after the superblock
  expect_refused(flipped, "fail the whole-file checksum");
  expect_refused(good.substr(0, good.size() - 100), "is truncated");
  expect_refused(good + "x", "longer than written");
  std::string header = good;
  header.replace(header.find("crc32"), 5, "crc33");
  expect_refused(header, "integrity header is damaged");
  expect_refused(good.substr(0, 300), "is truncated");
  expect_refused("", "not a colossal checkpoint");
  // Format 1 (no user block): refused unless verification is off.
  expect_refused(good.substr(512), "checkpoint.verify: false");
  const std::string legacy = (dir / "legacy.h5").string();
  std::ofstream(legacy, std::ios::binary | std::ios::trunc) << good.substr(512);
  std::fill(p2.begin(), p2.end(), 0.0f);
  EXPECT_EQ(io::read_checkpoint(legacy, table, p2, m2, v2, /*verify=*/false).step, 7);
  expect_tensors(p2, params);
}

}  // namespace
