#include "io/hdf5_file.hpp"

#include <cstdio>
#include <filesystem>

namespace colossal::io {

namespace {

void check(herr_t status, const std::string& what) {
  if (status < 0) throw H5Error("HDF5: " + what + " failed");
}

// HDF5 prints its own error stack on failure; we report errors ourselves, so silence it once.
void silence_hdf5_errors() {
  static const bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

void write_string_attribute(hid_t object, const char* name, const std::string& value) {
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose, "H5Tcopy");
  check(H5Tset_size(type.get(), value.empty() ? 1 : value.size()), "H5Tset_size");
  check(H5Tset_strpad(type.get(), H5T_STR_NULLTERM), "H5Tset_strpad");
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
  H5Handle attr(H5Acreate2(object, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                H5Aclose, std::string("H5Acreate2 ") + name);
  check(H5Awrite(attr.get(), type.get(), value.empty() ? "" : value.c_str()),
        std::string("H5Awrite ") + name);
}

void write_int_attribute(hid_t object, const char* name, long long value) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
  H5Handle attr(H5Acreate2(object, name, H5T_NATIVE_LLONG, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                H5Aclose, std::string("H5Acreate2 ") + name);
  check(H5Awrite(attr.get(), H5T_NATIVE_LLONG, &value), std::string("H5Awrite ") + name);
}

std::string read_string_attribute(hid_t object, const char* name) {
  if (H5Aexists(object, name) <= 0) return {};
  H5Handle attr(H5Aopen(object, name, H5P_DEFAULT), H5Aclose, std::string("H5Aopen ") + name);
  H5Handle type(H5Aget_type(attr.get()), H5Tclose, "H5Aget_type");
  if (H5Tget_class(type.get()) != H5T_STRING) {
    throw H5Error(std::string("HDF5: attribute '") + name + "' is not a string");
  }
  H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose, "H5Tcopy");
  if (H5Tis_variable_str(type.get()) > 0) {
    // What h5py writes for a Python str: read through a char* that HDF5 allocates.
    check(H5Tset_size(mem.get(), H5T_VARIABLE), "H5Tset_size");
    char* text = nullptr;
    check(H5Aread(attr.get(), mem.get(), &text), std::string("H5Aread ") + name);
    std::string value = text ? text : "";
    H5free_memory(text);
    return value;
  }
  const std::size_t size = H5Tget_size(type.get());
  std::string value(size, '\0');
  check(H5Tset_size(mem.get(), size), "H5Tset_size");
  check(H5Aread(attr.get(), mem.get(), value.data()), std::string("H5Aread ") + name);
  value.resize(value.find('\0') == std::string::npos ? size : value.find('\0'));
  return value;
}

}  // namespace

H5Handle::H5Handle(hid_t id, Closer closer, const std::string& what) : id_(id), closer_(closer) {
  if (id < 0) throw H5Error("HDF5: " + what + " failed");
}

void H5Handle::reset() {
  if (id_ >= 0 && closer_ != nullptr) closer_(id_);
  id_ = -1;
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
