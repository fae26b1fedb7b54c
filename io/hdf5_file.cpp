#include "io/hdf5_file.hpp"

#include <atomic>

#include "io/hdf5_detail.hpp"
#include "io/init_from.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <set>

namespace colossal::io {

using detail::check;
using detail::read_string_attribute;
using detail::silence_hdf5_errors;
using detail::write_int_attribute;
using detail::write_string_attribute;

H5Handle::H5Handle(hid_t id, Closer closer, const std::string& what) : id_(id), closer_(closer) {
  if (id < 0) throw H5Error("HDF5: " + what + " failed");
}

namespace {
std::atomic<bool> g_file_close_failed{false};
}  // namespace

bool hdf5_file_close_failed() {
  // Only while such a file is still among HDF5's open ones: a later successful close (a
  // metrics.h5 row written again) leaves nothing for the shutdown to trip on.
  return g_file_close_failed.load() && H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_FILE) > 0;
}

void H5Handle::reset() { close(); }

herr_t H5Handle::close() {
  const herr_t status = id_ >= 0 && closer_ != nullptr ? closer_(id_) : herr_t(0);
  // HDF5 1.10 keeps the ID of a file whose close failed (a flush to a full disk) over a freed
  // file, and its own shutdown at MPI_Finalize then crashes on it.
  if (status < 0 && closer_ == &H5Fclose) g_file_close_failed = true;
  id_ = -1;
  return status;
}

namespace detail {
std::vector<std::string> datasets_in(hid_t group) {
  H5G_info_t info;
  check(H5Gget_info(group, &info), "H5Gget_info");
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t size =
        H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (size < 0) throw H5Error("HDF5: H5Lget_name_by_idx failed");
    std::string name(std::size_t(size) + 1, '\0');
    if (H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(),
                           H5P_DEFAULT) < 0) {
      throw H5Error("HDF5: H5Lget_name_by_idx failed");
    }
    name.resize(std::size_t(size));
#if H5_VERSION_GE(1, 12, 0)
    H5O_info2_t object;
    check(H5Oget_info_by_name3(group, name.c_str(), &object, H5O_INFO_BASIC, H5P_DEFAULT),
          "H5Oget_info_by_name '" + name + "'");
#else
    H5O_info_t object;
    check(H5Oget_info_by_name2(group, name.c_str(), &object, H5O_INFO_BASIC, H5P_DEFAULT),
          "H5Oget_info_by_name '" + name + "'");
#endif
    if (object.type == H5O_TYPE_DATASET) names.push_back(name);
  }
  return names;
}
}  // namespace detail

int layers_in(const std::vector<std::string>& names, const std::string& stem) {
  int layers = 0;
  for (const std::string& n : names) {
    const auto at = n.find(stem);
    if (at == std::string::npos || (at != 0 && n[at - 1] != '.')) continue;
    const std::size_t from = at + stem.size();
    std::size_t end = from;
    while (end < n.size() && std::isdigit(static_cast<unsigned char>(n[end]))) ++end;
    if (end == from || end >= n.size() || n[end] != '.') continue;
    layers = std::max(layers, std::stoi(n.substr(from, end - from)) + 1);
  }
  return layers;
}

std::string unexpected_tensors(const std::vector<std::string>& file_names,
                               const std::vector<core::ParamSpec>& table) {
  std::set<std::string> ours;
  std::vector<std::string> table_names;
  for (const core::ParamSpec& p : table) {
    ours.insert(p.name);
    table_names.push_back(p.name);
  }
  std::vector<std::string> extra;
  for (const std::string& n : file_names)
    if (!ours.count(n)) extra.push_back(n);
  if (extra.empty()) return {};
  for (const char* stem : {"h.", "layers."}) {
    const int in_file = layers_in(file_names, stem), in_model = layers_in(table_names, stem);
    if (in_file > in_model && in_model > 0) {
      return "the file holds " + std::to_string(in_file) + " layers but model.layers is " +
             std::to_string(in_model) + "; set model.layers: " + std::to_string(in_file);
    }
  }
  return "tensor '" + extra.front() + "'" +
         (extra.size() > 1 ? " (and " + std::to_string(extra.size() - 1) + " more)" : "") +
         " is not part of this model; was the file saved from another model? (model.arch, "
         "model.tie_embeddings)";
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

namespace {
// The checks of check_model_file; with `params`, each dataset is read into it as it is checked.
std::string open_model_file(const std::string& path, const std::vector<core::ParamSpec>& table,
                            float* params, const core::ModelSpec* spec) {
  silence_hdf5_errors();
  if (!std::filesystem::exists(path)) throw H5Error("model file '" + path + "' does not exist");
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose,
                "opening '" + path + "' (not an HDF5 file?)");
  for (const auto& p : table) {
    if (H5Lexists(file.get(), p.name.c_str(), H5P_DEFAULT) <= 0) {
      if (H5Lexists(file.get(), "model", H5P_DEFAULT) > 0) {
        throw H5Error("'" + path + "' is a training checkpoint, not a model file: its weights "
                      "are read by model.init_from (or resumed with checkpoint.resume); a "
                      "model file is log.dir/model.h5");
      }
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
                    "] but the model expects [" + want + "]" +
                    (spec != nullptr
                         ? "; " + shape_mismatch_hint(p, *spec, {dims.begin(), dims.end()})
                         : std::string()));
    }
    if (params != nullptr) {
      check(H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                    params + p.offset),
            "reading dataset " + p.name);
    }
  }
  const std::string extra = unexpected_tensors(detail::datasets_in(file.get()), table);
  if (!extra.empty()) throw H5Error("model file '" + path + "': " + extra);
  return read_string_attribute(file.get(), "config");
}
}  // namespace

std::string check_model_file(const std::string& path, const std::vector<core::ParamSpec>& table,
                             const core::ModelSpec* spec) {
  return open_model_file(path, table, nullptr, spec);
}

std::string read_model_file(const std::string& path, const std::vector<core::ParamSpec>& table,
                            std::vector<float>& params) {
  return open_model_file(path, table, params.data(), nullptr);
}

}  // namespace colossal::io
