#include "io/hdf5_file.hpp"

#include "io/hdf5_detail.hpp"

#include <cstdio>
#include <filesystem>

namespace colossal::io {

using detail::check;
using detail::read_string_attribute;
using detail::silence_hdf5_errors;
using detail::write_int_attribute;
using detail::write_string_attribute;

H5Handle::H5Handle(hid_t id, Closer closer, const std::string& what) : id_(id), closer_(closer) {
  if (id < 0) throw H5Error("HDF5: " + what + " failed");
}

void H5Handle::reset() {
  if (id_ >= 0 && closer_ != nullptr) closer_(id_);
  id_ = -1;
}

herr_t H5Handle::close() {
  const herr_t status = id_ >= 0 && closer_ != nullptr ? closer_(id_) : herr_t(0);
  id_ = -1;
  return status;
}

void write_model_file(const std::string& path, const std::vector<core::ParamSpec>& table,
                      const float* params, const std::string& config_text,
                      const std::string& plan_text) {
  silence_hdf5_errors();
  const std::filesystem::path final_path(path);
  if (final_path.has_parent_path()) std::filesystem::create_directories(final_path.parent_path());
  const std::string tmp = path + ".tmp";
  {
    H5Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose,
                  "creating '" + tmp + "'");
    for (const auto& p : table) {
      std::vector<hsize_t> dims(p.shape.begin(), p.shape.end());
      H5Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                     H5Sclose, "H5Screate_simple");
      H5Handle dset(H5Dcreate2(file.get(), p.name.c_str(), H5T_IEEE_F32LE, space.get(),
                               H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                    H5Dclose, "creating dataset " + p.name);
      check(H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                     params + p.offset),
            "writing dataset " + p.name);
    }
    write_string_attribute(file.get(), "config", config_text);
    write_string_attribute(file.get(), "plan", plan_text);
    write_string_attribute(file.get(), "format", "colossal-model");
    write_int_attribute(file.get(), "format_version", kModelFormatVersion);
    check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "flushing '" + tmp + "'");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, final_path, ec);
  if (ec) throw H5Error("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

std::string read_model_file(const std::string& path, const std::vector<core::ParamSpec>& table,
                            std::vector<float>& params) {
  silence_hdf5_errors();
  if (!std::filesystem::exists(path)) throw H5Error("model file '" + path + "' does not exist");
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose,
                "opening '" + path + "' (not an HDF5 file?)");
  for (const auto& p : table) {
    if (H5Lexists(file.get(), p.name.c_str(), H5P_DEFAULT) <= 0) {
      throw H5Error("model file '" + path + "' has no dataset '" + p.name +
                    "' (was it saved from a different model config?)");
    }
    H5Handle dset(H5Dopen2(file.get(), p.name.c_str(), H5P_DEFAULT), H5Dclose,
                  "opening dataset " + p.name);
    H5Handle space(H5Dget_space(dset.get()), H5Sclose, "H5Dget_space");
    const int rank = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> dims(rank > 0 ? rank : 0);
    if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    const bool same = dims.size() == p.shape.size() &&
                      std::equal(dims.begin(), dims.end(), p.shape.begin(),
                                 [](hsize_t a, int64_t b) { return a == hsize_t(b); });
    if (!same) {
      std::string got, want;
      for (auto d : dims) got += (got.empty() ? "" : ", ") + std::to_string(d);
      for (auto d : p.shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
      throw H5Error("model file '" + path + "': dataset '" + p.name + "' has shape [" + got +
                    "] but the model expects [" + want + "]");
    }
    check(H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                  params.data() + p.offset),
          "reading dataset " + p.name);
  }
  return read_string_attribute(file.get(), "config");
}

}  // namespace colossal::io
