// HDF5 model files: one float32 dataset per logical parameter, named by its Hugging Face name
// (`/transformer.h.0.attn.c_attn.weight`, shape as in Hugging Face), with the config text and format
// attributes, readable directly by h5py. Files are written under a temporary name and renamed when
// complete, so a crash never leaves a half-written model behind.
#pragma once

#include <hdf5.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/model_spec.hpp"

namespace colossal::io {

class H5Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Owns one hid_t and closes it with the matching H5*close.
class H5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, Closer closer, const std::string& what);
  ~H5Handle() { reset(); }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  H5Handle(H5Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), closer_(o.closer_) {}
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      closer_ = o.closer_;
    }
    return *this;
  }
  hid_t get() const { return id_; }
  void reset();
  // Closes now and returns the closer's status (a file's close flushes it: check it after writes).
  herr_t close();

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

// Whether closing some HDF5 file failed in this process (a full disk) and HDF5 still counts a file
// open. HDF5 1.10 then crashes in its own shutdown at MPI_Finalize, so the programs end without
// it (apps::run_program).
bool hdf5_file_close_failed();

constexpr int kModelFormatVersion = 1;

// Writes every parameter of `table` from the host memory `params` (flat buffer with table
// offsets).
void write_model_file(const std::string& path, const std::vector<core::ParamSpec>& table,
                      const float* params, const std::string& config_text,
                      const std::string& plan_text = "");

// Checks that `path` is a model file of `table`: each dataset exists with the expected shape and
// the file holds no other (a model of more layers read into fewer would otherwise load without a
// word); a training checkpoint is told apart. Reads no tensor. Returns the config text stored in
// the file; throws H5Error naming the file, the dataset and both shapes, and with `spec` (the
// model `table` is of) the config key and value that would match the file.
std::string check_model_file(const std::string& path, const std::vector<core::ParamSpec>& table,
                             const core::ModelSpec* spec = nullptr);
// check_model_file, then every parameter of `table` into the host flat buffer `params`. Returns
// the config text stored in the file.
std::string read_model_file(const std::string& path, const std::vector<core::ParamSpec>& table,
                            std::vector<float>& params);

// Layers that tensor names hold: one more than the largest N of "<stem>N." (stem "h." for GPT-2,
// "layers." for OPT and LLaMA), 0 where there is none.
int layers_in(const std::vector<std::string>& names, const std::string& stem);

// Empty when every name of `file_names` (a file's tensors) is a tensor of `table`; else what is
// wrong and the key that fixes it (more layers than the model: model.layers).
std::string unexpected_tensors(const std::vector<std::string>& file_names,
                               const std::vector<core::ParamSpec>& table);

}  // namespace colossal::io
