// Hugging Face safetensors files (docs/safetensors.md): an 8-byte little-endian header length N,
// N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {..}}
// and the raw little-endian tensor bytes, offsets counted from the end of the header.
//
// The reader validates the whole header when it opens a file (length within the file, JSON
// well-formed, every dtype known, offsets inside the data section and not overlapping, byte count
// equal to product(shape) * dtype size) and then reads tensors, or a contiguous range of their
// row-major elements, with pread: a rank that owns a shard of a tensor reads only that shard, and
// no reader ever loads the whole file. F32 is read as is; F16 and BF16 are widened to fp32
// exactly (the caller can ask whether a conversion happened and say so); every other dtype is
// refused by name.
//
// The writer writes F32 tensors, pads the header with spaces to a multiple of 8 bytes (the
// format allows it, and it keeps the data 8-byte aligned), writes to PATH.tmp and renames it into
// place, so an error never leaves a partial file. Above a size limit it shards into
// model-0000i-of-0000n.safetensors plus model.safetensors.index.json ({"metadata":
// {"total_size"}, "weight_map": {name: file}}), as transformers' save_pretrained does.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace colossal::io {

class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class StDtype { F32, F16, BF16 };
const char* st_dtype_name(StDtype d);
std::size_t st_dtype_bytes(StDtype d);

struct StTensorInfo {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets within the data section
  uint64_t elements() const;
};

// Exact widening of IEEE half and bfloat16 bit patterns to float.
float f16_to_f32(uint16_t bits);
float bf16_to_f32(uint16_t bits);

// One open safetensors file (validated header, open descriptor; reads are pread, thread-safe).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Tensors in file order of their data offsets.
  const std::vector<StTensorInfo>& tensors() const { return tensors_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // Throws SafetensorsError naming the file and the tensor when it is absent.
  const StTensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Reads elements [first, first + count) (row-major) of `name` into out[0, count) as fp32.
  void read(const std::string& name, uint64_t first, uint64_t count, float* out) const;
  std::vector<float> read_all(const std::string& name) const;

  // Bytes read from tensor data so far by this object (tests check shard-only reads).
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::vector<StTensorInfo> tensors_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
  mutable uint64_t bytes_read_ = 0;
};

// A checkpoint of one file or a sharded set (model.safetensors.index.json): tensors by name
// across all its files. `path` is a .safetensors file, an index json, or a directory holding
// model.safetensors or model.safetensors.index.json.
class SafetensorsSet {
 public:
  explicit SafetensorsSet(const std::string& path);
  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  const StTensorInfo& info(const std::string& name) const;
  const SafetensorsFile& file_of(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  void read(const std::string& name, uint64_t first, uint64_t count, float* out) const;
  std::vector<float> read_all(const std::string& name) const;
  uint64_t bytes_read() const;

 private:
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::size_t> where_;  // tensor name -> index into files_
};

// True when `path` names a safetensors file, an index json, or a directory holding either.
bool is_safetensors_path(const std::string& path);

// One tensor to write: F32 data of product(shape) elements.
struct StTensorOut {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

// Writes one safetensors file (temporary name, then rename). Throws SafetensorsError.
void write_safetensors(const std::string& path, const std::vector<StTensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes DIR/model.safetensors, or, when the tensor bytes exceed `shard_bytes` (0: never shard),
// DIR/model-0000i-of-0000n.safetensors shards of at most shard_bytes each (a tensor larger than
// the limit gets a shard of its own) plus DIR/model.safetensors.index.json. Returns the files
// written (the index last). Stale files of the other form are removed.
std::vector<std::string> write_safetensors_dir(
    const std::string& dir, const std::vector<StTensorOut>& tensors, uint64_t shard_bytes,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace colossal::io
