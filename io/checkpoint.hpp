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
// Written collectively (parallel HDF5 over MPI-IO): every rank writes the elements it owns
// straight from its own layout as hyperslabs of the logical datasets, and reads back only the
// hyperslabs its layout holds (docs/checkpoint-format.md, "Who writes and reads what"). The
// per-dataset CRC-32 is combined on rank 0 from every rank's CRCs of its own runs, so no tensor
// is ever gathered. With one rank (or MPI_COMM_NULL) the same code runs on a serial file.
// A save writes DIR/ckpt-<step>.h5.tmp, flushes and closes it, renames it into place, then
// rewrites DIR/latest (through a temporary name) and removes all but the newest `keep`
// checkpoints: a crash at any moment leaves the previous checkpoint whole. The temporary files of
// an interrupted save are removed by the next one.
#pragma once

#include <mpi.h>

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
  // Where the learning-rate schedule stands after `step`: step itself, plus the steps a fine-tune
  // continued from (train.reset_schedule: false), so an interrupted fine-tune resumes on its LR
  // curve. -1 when writing means `step`; files written before it existed read as `step`.
  int64_t schedule_step = -1;
};

// CRC-32 (IEEE 802.3) of `bytes` bytes.
uint32_t crc32(const void* data, std::size_t bytes);

// CRC-32 of the concatenation A + B from crc32(A), crc32(B) and the length of B in bytes
// (GF(2) matrix powers of the one-zero-bit shift; what zlib calls crc32_combine).
uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b);

// --- Which elements a rank writes and reads ----------------------------------------------------

// Elements [logical, logical + length) (row-major) of logical tensor `tensor` (an index into the
// logical table), held in host memory at data[0, length): the source of a write, the target of
// a read.
struct TensorRun {
  std::size_t tensor = 0, logical = 0, length = 0;
  float* data = nullptr;
};

// The runs one rank writes or reads of each kind of dataset: /model/<name> and the AdamW moments
// /optimizer/<name>/m and /v. Runs of one dataset must not overlap.
struct CheckpointShard {
  std::vector<TensorRun> params, m, v;
};

// Flat elements [begin, begin + length) of a chunk's local buffer, held at data[0, length).
struct FlatRange {
  std::size_t begin = 0, length = 0;
  float* data = nullptr;
};

// The runs of the logical tensors that `ranges` of a model's local flat buffer hold, through the
// model's map into them (core::StageModel::logical_runs, or core::logical_runs of a 1D table):
// every run intersected with every range. With `writing`, runs another rank or chunk writes
// (LogicalRun::owned false: replicated copies, the LM head's tied embedding) are left out.
std::vector<TensorRun> tensor_runs(const std::vector<core::LogicalRun>& runs,
                                   const std::vector<FlatRange>& ranges, bool writing);

// A rectangle of a dataset viewed as [rows, columns] (a 1-D dataset is one row).
struct SelectionBlock {
  uint64_t row = 0, col = 0, rows = 0, cols = 0;
  bool operator==(const SelectionBlock&) const = default;
};
// The rectangles whose union is exactly the elements of `runs` (each a flat run of a dataset of
// `shape`, rank 1 or 2): a run becomes a partial head row, whole middle rows and a partial tail
// row, and rectangles that continue each other down the same columns are merged (a column split
// over the tensor group is one rectangle, not one per row).
std::vector<SelectionBlock> selection_blocks(const std::vector<int64_t>& shape,
                                             const std::vector<TensorRun>& runs);

// Float elements this process has read from checkpoint datasets so far (tests check that a rank
// reads only its own hyperslabs).
uint64_t checkpoint_elements_read();

// --- Writing and reading -----------------------------------------------------------------------

// Writes one checkpoint and returns its path; collective over `comm` (every rank calls it with
// the same dir, table, state and keep; MPI_COMM_NULL or one rank: a serial file). Each rank
// writes `mine`; together the ranks' runs must cover every dataset exactly once (checked before
// the file is created). Errors are thrown on every rank, and the previous checkpoint is kept.
std::string write_checkpoint(const std::string& dir, const std::vector<core::ParamSpec>& table,
                             const CheckpointShard& mine, const CheckpointState& state, int keep,
                             MPI_Comm comm);

// Reads a checkpoint collectively: each rank reads exactly the runs of `wanted`. `owned` are runs
// of the same buffers that tile every dataset exactly once over the ranks (a layout's write
// runs): their CRCs, combined on rank 0, are checked against each dataset's crc32 attribute, so
// every dataset is verified without any rank reading more than it needs. With `verify`, rank 0
// checks the whole-file integrity header before any rank lets HDF5 parse the file. Errors are
// thrown on every rank alike.
CheckpointState read_checkpoint(const std::string& path, const std::vector<core::ParamSpec>& table,
                                const CheckpointShard& wanted, const CheckpointShard& owned,
                                MPI_Comm comm, bool verify = true);

// One process: writes the logical tensors of `table` from flat host buffers at table offsets.
std::string write_checkpoint(const std::string& dir, const std::vector<core::ParamSpec>& table,
                             const float* params, const float* m, const float* v,
                             const CheckpointState& state, int keep);

// Checks the whole-file integrity header (size and CRC-32) of a checkpoint without parsing it
// as HDF5. Throws H5Error naming the file and what is wrong; a file without a header (format 1)
// is refused with the hint to set checkpoint.verify: false.
void verify_checkpoint_integrity(const std::string& path);

// One process: reads a checkpoint into flat host buffers sized for `table`,
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

// The checkpoints in `dir` numbered after `step`, where a run that starts at `step` finds them:
// another run's (a fresh start, or a resume from an earlier checkpoint), which the retention
// (newest by step) and checkpoint.resume: auto would otherwise take for this run's. Moves them
// into a new folder `dir`/superseded-at-step<step>-<UTC time> (nothing is deleted) and returns
// what it did as one line, or "" when there were none. Throws H5Error when a move fails.
std::string set_aside_later_checkpoints(const std::string& dir, int64_t step);

}  // namespace colossal::io
