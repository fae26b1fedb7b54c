// Small HDF5 helpers shared by the model-file and checkpoint writers (not part of the io API).
#pragma once

#include <hdf5.h>

#include <string>
#include <vector>

#include "io/hdf5_file.hpp"

namespace colossal::io::detail {

// The names of the datasets directly in `group` (a file or group id), in name order.
std::vector<std::string> datasets_in(hid_t group);

inline void check(herr_t status, const std::string& what) {
  if (status < 0) throw H5Error("HDF5: " + what + " failed");
}

// HDF5 prints its own error stack on failure; we report errors ourselves, so silence it once.
inline void silence_hdf5_errors() {
  static const bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

inline void write_string_attribute(hid_t object, const char* name, const std::string& value) {
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose, "H5Tcopy");
  check(H5Tset_size(type.get(), value.empty() ? 1 : value.size()), "H5Tset_size");
  check(H5Tset_strpad(type.get(), H5T_STR_NULLTERM), "H5Tset_strpad");
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
  H5Handle attr(H5Acreate2(object, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                H5Aclose, std::string("H5Acreate2 ") + name);
  check(H5Awrite(attr.get(), type.get(), value.empty() ? "" : value.c_str()),
        std::string("H5Awrite ") + name);
}

inline void write_int_attribute(hid_t object, const char* name, long long value) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
  H5Handle attr(H5Acreate2(object, name, H5T_NATIVE_LLONG, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                H5Aclose, std::string("H5Acreate2 ") + name);
  check(H5Awrite(attr.get(), H5T_NATIVE_LLONG, &value), std::string("H5Awrite ") + name);
}

inline std::string read_string_attribute(hid_t object, const char* name) {
  if (H5Aexists(object, name) <= 0) return {};
  H5Handle attr(H5Aopen(object, name, H5P_DEFAULT), H5Aclose, std::string("H5Aopen ") + name);
  H5Handle type(H5Aget_type(attr.get()), H5Tclose, "H5Aget_type");
  if (H5Tget_class(type.get()) != H5T_STRING) {
    throw H5Error(std::string("HDF5: attribute '") + name + "' is not a string");
  }
  H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose, "H5Tcopy");
  // The file's character set (h5py writes a Python str as UTF-8): HDF5 converts no string
  // between ASCII and UTF-8, so reading one into the other fails.
  check(H5Tset_cset(mem.get(), H5Tget_cset(type.get())), "H5Tset_cset");
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
  // The size comes from the file: refuse what no colossal file holds rather than allocate it.
  constexpr std::size_t kLargest = std::size_t(64) << 20;
  if (size == 0 || size > kLargest) {
    throw H5Error(std::string("HDF5: string attribute '") + name + "' has a size of " +
                  std::to_string(size) + " bytes (at most 64 MiB expected)");
  }
  std::string value(size, '\0');
  check(H5Tset_size(mem.get(), size), "H5Tset_size");
  check(H5Aread(attr.get(), mem.get(), value.data()), std::string("H5Aread ") + name);
  value.resize(value.find('\0') == std::string::npos ? size : value.find('\0'));
  return value;
}


inline long long read_int_attribute(hid_t object, const char* name) {
  const htri_t exists = H5Aexists(object, name);
  if (exists == 0) throw H5Error(std::string("attribute '") + name + "' is missing");
  if (exists < 0) throw H5Error(std::string("attribute '") + name + "' cannot be looked up");
  H5Handle attr(H5Aopen(object, name, H5P_DEFAULT), H5Aclose, std::string("H5Aopen ") + name);
  long long value = 0;
  check(H5Aread(attr.get(), H5T_NATIVE_LLONG, &value), std::string("H5Aread ") + name);
  return value;
}

}  // namespace colossal::io::detail
