// Training checkpoints: the whole model and optimizer state as logical (Hugging Face) tensors in
// one HDF5 file per save, so that any parallel layout can restore any checkpoint.
//
// Layout of DIR/ckpt-<step>.h5 (docs/checkpoint-format.md):
//   /model/<name>            float32, Hugging Face shape
//   /optimizer/<name>/m, /v  float32, the same shape (AdamW moments)
//   every dataset carries a "crc32" attribute over its float32 bytes, verified on load
//   root attributes: format "colossal-checkpoint", format_version, step (optimizer steps run),
//   optimizer_step (AdamW updates applied: step minus skipped steps), tokens, seed, config, plan
//   /data attribute "next_step": the sampler is keyed by (seed, step, sample index), so the data
//   position is the step alone.
// The HDF5 file starts after a 512-byte user block holding a text integrity header (HDF5 and
// h5py skip it): "colossal-checkpoint-integrity 1", the byte count and the CRC-32 of everything
// after the block. Readers check it before HDF5 parses a byte, because Debian's HDF5 1.10 can
// crash or read out of bounds on a damaged file (found by tests/fuzz). Files of format 1 have no
// header and are read only with verification off (checkpoint.verify: false).
// A save writes DIR/ckpt-<step>.h5.tmp, flushes and closes it, renames it into place, then
// rewrites DIR/latest (through a temporary name) and removes all but the newest `keep`
// checkpoints: a crash at any moment leaves the previous checkpoint whole. The temporary files of
// an interrupted save are removed by the next one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model_spec.hpp"

namespace colossal::io {

// 2: the integrity header in the user block; 1 (still read, unverified): no header.
constexpr int kCheckpointFormatVersion = 2;
constexpr std::size_t kCheckpointUserBlock = 512;

struct CheckpointState {
  int64_t step = 0;
  int64_t optimizer_step = 0;
  int64_t tokens = 0;
  int64_t seed = 0;
  std::string config, plan;
};

// CRC-32 (IEEE 802.3) of `bytes` bytes.
uint32_t crc32(const void* data, std::size_t bytes);

// Writes one checkpoint of the logical tensors of `table` (flat host buffers at table offsets) and
// returns its path.
std::string write_checkpoint(const std::string& dir, const std::vector<core::ParamSpec>& table,
                             const float* params, const float* m, const float* v,
                             const CheckpointState& state, int keep);

// Checks the whole-file integrity header (size and CRC-32) of a checkpoint without parsing it
// as HDF5. Throws H5Error naming the file and what is wrong; a file without a header (format 1)
// is refused with the hint to set checkpoint.verify: false.
void verify_checkpoint_integrity(const std::string& path);

// Reads a checkpoint written by write_checkpoint into flat host buffers sized for `table`,
// checking every dataset's presence, shape and checksum; with `verify`, the whole file's
// integrity first (verify_checkpoint_integrity). Throws H5Error naming what is wrong.
CheckpointState read_checkpoint(const std::string& path, const std::vector<core::ParamSpec>& table,
                                std::vector<float>& params, std::vector<float>& m,
                                std::vector<float>& v, bool verify = true);

// The config text a checkpoint was written with, after the same integrity check (throws H5Error
// when the file cannot be read).
std::string read_checkpoint_config(const std::string& path, bool verify = true);

// The checkpoints in `dir`, newest first (by step in the file name).
std::vector<std::string> list_checkpoints(const std::string& dir);

}  // namespace colossal::io
