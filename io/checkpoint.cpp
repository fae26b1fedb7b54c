#include "io/checkpoint.hpp"

#include <csignal>
#include <cstdlib>
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <filesystem>
#include <fstream>
#include <regex>
#include <stdexcept>

#include <yaml-cpp/yaml.h>

#include "core/memory.hpp"
#include "io/hdf5_detail.hpp"
#include "io/hdf5_file.hpp"

namespace colossal::io {

namespace fs = std::filesystem;
using detail::check;

namespace {
// The running CRC-32 register (start 0xFFFFFFFF, finish with xor 0xFFFFFFFF), eight bytes per
// step through eight tables (table k: a byte followed by k zero bytes), about four times the
// byte-at-a-time speed: it runs over every byte of every checkpoint twice (the datasets' CRCs
// and the whole-file pass), so it sets much of the cost of a save.
uint32_t crc32_update(uint32_t c, const void* data, std::size_t bytes) {
  static const std::array<std::array<uint32_t, 256>, 8> tables = [] {
    std::array<std::array<uint32_t, 256>, 8> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t r = i;
      for (int k = 0; k < 8; ++k) r = (r & 1) ? 0xEDB88320u ^ (r >> 1) : r >> 1;
      t[0][i] = r;
    }
    for (std::size_t k = 1; k < t.size(); ++k) {
      for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  if constexpr (std::endian::native == std::endian::little) {
    for (; bytes >= 8; bytes -= 8, p += 8) {
      uint32_t lo, hi;
      std::memcpy(&lo, p, 4);
      std::memcpy(&hi, p + 4, 4);
      lo ^= c;
      c = tables[7][lo & 0xFFu] ^ tables[6][(lo >> 8) & 0xFFu] ^ tables[5][(lo >> 16) & 0xFFu] ^
          tables[4][lo >> 24] ^ tables[3][hi & 0xFFu] ^ tables[2][(hi >> 8) & 0xFFu] ^
          tables[1][(hi >> 16) & 0xFFu] ^ tables[0][hi >> 24];
    }
  }
  for (; bytes > 0; --bytes, ++p) c = tables[0][(c ^ *p) & 0xFFu] ^ (c >> 8);
  return c;
}
}  // namespace

uint32_t crc32(const void* data, std::size_t bytes) {
  return crc32_update(0xFFFFFFFFu, data, bytes) ^ 0xFFFFFFFFu;
}

namespace {
// The CRC register is linear over GF(2) once its initial and final xor are set aside: running B
// through the register that ended A gives zeros^|B|(crc(A)) xor crc(B), where zeros^n feeds n
// zero bytes. Such an operator is a 32x32 bit matrix, held as the images of the 32 bits.
using BitMatrix = std::array<uint32_t, 32>;

uint32_t apply(const BitMatrix& m, uint32_t v) {
  uint32_t out = 0;
  for (int bit = 0; v != 0; ++bit, v >>= 1) {
    if (v & 1u) out ^= m[bit];
  }
  return out;
}

// zeros^(2^k) for k = 0..63, built once by squaring the one-zero-byte operator.
const std::array<BitMatrix, 64>& zero_byte_powers() {
  static const std::array<BitMatrix, 64> powers = [] {
    BitMatrix one_bit{};
    for (int bit = 0; bit < 32; ++bit) {
      const uint32_t v = 1u << bit;
      one_bit[bit] = (v & 1u) ? 0xEDB88320u ^ (v >> 1) : v >> 1;
    }
    auto square = [](const BitMatrix& m) {
      BitMatrix out{};
      for (int bit = 0; bit < 32; ++bit) out[bit] = apply(m, m[bit]);
      return out;
    };
    std::array<BitMatrix, 64> p{};
    p[0] = square(square(square(one_bit)));  // eight zero bits
    for (std::size_t k = 1; k < p.size(); ++k) p[k] = square(p[k - 1]);
    return p;
  }();
  return powers;
}
}  // namespace

uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b) {
  const auto& powers = zero_byte_powers();
  for (int k = 0; bytes_b != 0; ++k, bytes_b >>= 1) {
    if (bytes_b & 1u) crc_a = apply(powers[k], crc_a);
  }
  return crc_a ^ crc_b;
}

namespace {
std::atomic<uint64_t> g_elements_read{0};
}  // namespace

uint64_t checkpoint_elements_read() { return g_elements_read.load(); }

std::vector<TensorRun> tensor_runs(const std::vector<core::LogicalRun>& runs,
                                   const std::vector<FlatRange>& ranges, bool writing) {
  std::vector<TensorRun> out;
  for (const core::LogicalRun& run : runs) {
    if (writing && !run.owned) continue;
    for (const FlatRange& range : ranges) {
      const std::size_t a = std::max(range.begin, run.local);
      const std::size_t b = std::min(range.begin + range.length, run.local + run.length);
      if (a >= b) continue;
      out.push_back({std::size_t(run.tensor), run.logical + (a - run.local), b - a,
                     range.data + (a - range.begin)});
    }
  }
  return out;
}

std::vector<SelectionBlock> selection_blocks(const std::vector<int64_t>& shape,
                                             const std::vector<TensorRun>& runs) {
  if (shape.empty() || shape.size() > 2) {
    throw std::invalid_argument("selection_blocks: datasets of rank 1 or 2 only");
  }
  const uint64_t cols = uint64_t(shape.back());
  std::vector<SelectionBlock> blocks;
  for (const TensorRun& run : runs) {
    uint64_t at = run.logical, left = run.length;
    if (left == 0) continue;
    if (at % cols != 0 || left < cols) {  // head: the rest of a row, or a piece inside one
      const uint64_t n = std::min(left, cols - at % cols);
      blocks.push_back({at / cols, at % cols, 1, n});
      at += n;
      left -= n;
    }
    if (left >= cols) {  // whole rows
      blocks.push_back({at / cols, 0, left / cols, cols});
      at += left / cols * cols;
      left %= cols;
    }
    if (left > 0) blocks.push_back({at / cols, 0, 1, left});  // tail
  }
  // Rectangles that continue each other down the same columns become one.
  std::sort(blocks.begin(), blocks.end(), [](const SelectionBlock& a, const SelectionBlock& b) {
    return std::tie(a.col, a.cols, a.row) < std::tie(b.col, b.cols, b.row);
  });
  std::vector<SelectionBlock> merged;
  for (const SelectionBlock& b : blocks) {
    SelectionBlock* last = merged.empty() ? nullptr : &merged.back();
    if (last != nullptr && last->col == b.col && last->cols == b.cols &&
        last->row + last->rows == b.row) {
      last->rows += b.rows;
    } else {
      merged.push_back(b);
    }
  }
  return merged;
}

namespace {

std::string checkpoint_name(int64_t step) { return "ckpt-" + std::to_string(step) + ".h5"; }

// --- the integrity header --------------------------------------------------------------------

std::string hex32(uint32_t v) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", unsigned(v));
  return text;
}

constexpr const char* kIntegrityMagic = "colossal-checkpoint-integrity";
constexpr char kHdf5Signature[8] = {'\211', 'H', 'D', 'F', '\r', '\n', '\032', '\n'};

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// CRC-32 and byte count of `file` from `offset` to its end.
std::pair<uint32_t, uint64_t> crc32_from(std::FILE* file, uint64_t offset, const std::string& path) {
  if (std::fseek(file, long(offset), SEEK_SET) != 0) {
    throw H5Error("cannot seek in '" + path + "': " + std::strerror(errno));
  }
  std::vector<unsigned char> buffer(std::size_t(4) << 20);
  uint32_t c = 0xFFFFFFFFu;
  uint64_t bytes = 0;
  for (;;) {
    const std::size_t n = std::fread(buffer.data(), 1, buffer.size(), file);
    c = crc32_update(c, buffer.data(), n);
    bytes += n;
    if (n < buffer.size()) break;
  }
  if (std::ferror(file)) throw H5Error("cannot read '" + path + "': " + std::strerror(errno));
  return {c ^ 0xFFFFFFFFu, bytes};
}

void write_integrity_header(const std::string& path) {
  File file(std::fopen(path.c_str(), "r+b"));
  if (!file) throw H5Error("cannot reopen '" + path + "': " + std::strerror(errno));
  const auto [crc, bytes] = crc32_from(file.get(), kCheckpointUserBlock, path);
  char header[kCheckpointUserBlock] = {};
  std::snprintf(header, sizeof(header), "%s 1\nhdf5-bytes %llu\ncrc32 %08x\n", kIntegrityMagic,
                (unsigned long long)bytes, unsigned(crc));
  if (std::fseek(file.get(), 0, SEEK_SET) != 0 ||
      std::fwrite(header, 1, sizeof(header), file.get()) != sizeof(header) ||
      std::fflush(file.get()) != 0) {
    throw H5Error("cannot write the integrity header of '" + path + "': " + std::strerror(errno) +
                  " (disk full?)");
  }
  if (std::fclose(file.release()) != 0) {
    throw H5Error("cannot close '" + path + "': " + std::strerror(errno));
  }
}

constexpr int kKinds = 3;  // per tensor: /model/<name>, /optimizer/<name>/m, /optimizer/<name>/v

std::string dataset_name(const core::ParamSpec& p, int kind) {
  return kind == 0 ? "model/" + p.name : "optimizer/" + p.name + (kind == 1 ? "/m" : "/v");
}

// Opens dataset `name` (a path from the file's root) of a checkpoint and checks its shape.
H5Handle open_dataset(hid_t file, const std::string& name, const core::ParamSpec& p,
                      const std::string& path) {
  const htri_t exists = H5Lexists(file, name.c_str(), H5P_DEFAULT);
  if (exists < 0) {
    throw H5Error("checkpoint '" + path + "': cannot look up '" + name + "' (damaged file?)");
  }
  if (exists == 0) {
    throw H5Error("checkpoint '" + path + "' has no dataset '" + name +
                  "' (written for another model, or damaged?)");
  }
  H5Handle dset(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose, "opening " + name);
  H5Handle space(H5Dget_space(dset.get()), H5Sclose, "H5Dget_space " + name);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) throw H5Error("HDF5: the shape of " + name + " cannot be read");
  std::vector<hsize_t> dims(std::size_t(rank), 0);
  if (rank > 0 && H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0) {
    throw H5Error("HDF5: the shape of " + name + " cannot be read");
  }
  if (!std::equal(dims.begin(), dims.end(), p.shape.begin(), p.shape.end(),
                  [](hsize_t a, int64_t b) { return a == hsize_t(b); })) {
    std::string got, want;
    for (auto d : dims) got += (got.empty() ? "" : ", ") + std::to_string(d);
    for (auto d : p.shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
    throw H5Error("checkpoint '" + path + "': '" + name + "' has shape [" + got +
                  "] but the model expects [" + want + "] (another model shape?)");
  }
  return dset;
}

// --- the ranks of a collective save or load ---------------------------------------------------

// The processes of one save or load: an MPI communicator of two or more ranks, or this process
// alone (MPI_COMM_NULL or a communicator of one), which then writes a serial file.
class Group {
 public:
  explicit Group(MPI_Comm comm) {
    if (comm == MPI_COMM_NULL) return;
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    if (size_ > 1) comm_ = comm;
  }
  int rank() const { return rank_; }
  bool parallel() const { return comm_ != MPI_COMM_NULL; }

  // The error of the lowest failing rank (empty: none failed), on every rank.
  std::string agree(std::string error) const {
    if (!parallel()) return error;
    int mine = error.empty() ? size_ : rank_, first = size_;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm_);
    if (first == size_) return {};
    unsigned long long length = error.size();
    MPI_Bcast(&length, 1, MPI_UNSIGNED_LONG_LONG, first, comm_);
    error.resize(length);
    MPI_Bcast(error.data(), int(length), MPI_CHAR, first, comm_);
    return error;
  }

  // Rank 0: every rank's items in rank order; other ranks: empty.
  template <class T>
  std::vector<T> gather(const std::vector<T>& mine) const {
    static_assert(std::is_trivially_copyable_v<T>);
    if (!parallel()) return mine;
    const int bytes = int(mine.size() * sizeof(T));
    std::vector<int> counts(rank_ == 0 ? size_ : 0), displacements(counts.size());
    MPI_Gather(&bytes, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm_);
    std::size_t total = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      displacements[r] = int(total);
      total += std::size_t(counts[r]);
    }
    std::vector<T> all(total / sizeof(T));
    MPI_Gatherv(mine.data(), bytes, MPI_BYTE, all.data(), counts.data(), displacements.data(),
                MPI_BYTE, 0, comm_);
    return all;
  }

  void broadcast(std::vector<uint32_t>& values) const {
    if (!parallel()) return;
    unsigned long long n = values.size();
    MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, comm_);
    values.resize(n);
    MPI_Bcast(values.data(), int(n), MPI_UINT32_T, 0, comm_);
  }

  // File access: MPI-IO over the group, or the default (serial) driver.
  H5Handle file_access() const {
    H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "H5Pcreate(file access)");
#ifdef COLOSSAL_HDF5_PARALLEL
    if (parallel()) check(H5Pset_fapl_mpio(fapl.get(), comm_, MPI_INFO_NULL), "H5Pset_fapl_mpio");
#endif
    return fapl;
  }
  // Data transfer: collective MPI-IO (every rank takes part in every read and write).
  H5Handle transfer() const {
    H5Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose, "H5Pcreate(transfer)");
#ifdef COLOSSAL_HDF5_PARALLEL
    if (parallel()) check(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE), "H5Pset_dxpl_mpio");
#endif
    return dxpl;
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

// Runs `step` on every rank and throws the first failing rank's error on every rank, so that no
// rank goes on to a collective call that another rank will never make. One step holds at most
// one call that communicates (a collective read or write), last.
template <class Step>
void together(const Group& group, Step&& step) {
  std::string error;
  try {
    step();
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "unknown error";
  }
  error = group.agree(std::move(error));
  if (!error.empty()) throw H5Error(error);
}

// The runs of every dataset (index kKinds * tensor + kind), sorted by logical offset, checked to
// lie inside their tensor and not to overlap.
std::vector<std::vector<TensorRun>> runs_by_dataset(const std::vector<core::ParamSpec>& table,
                                                    const CheckpointShard& shard) {
  std::vector<std::vector<TensorRun>> out(table.size() * kKinds);
  const std::vector<TensorRun>* kinds[kKinds] = {&shard.params, &shard.m, &shard.v};
  for (int kind = 0; kind < kKinds; ++kind) {
    for (const TensorRun& run : *kinds[kind]) {
      if (run.tensor >= table.size() || run.logical + run.length > table[run.tensor].count) {
        throw std::invalid_argument("checkpoint: a run outside its tensor");
      }
      if (run.length > 0) out[run.tensor * kKinds + kind].push_back(run);
    }
  }
  for (auto& runs : out) {
    std::sort(runs.begin(), runs.end(),
              [](const TensorRun& a, const TensorRun& b) { return a.logical < b.logical; });
    for (std::size_t i = 1; i < runs.size(); ++i) {
      if (runs[i - 1].logical + runs[i - 1].length > runs[i].logical) {
        throw std::invalid_argument("checkpoint: overlapping runs of one dataset");
      }
    }
  }
  return out;
}

// One rank's CRC of one contiguous piece of a dataset.
struct CrcPiece {
  uint64_t dataset, logical, length;
  uint32_t crc, unused;
};

// Rank 0: the CRC-32 of every dataset's float32 bytes, combined from each rank's CRCs of its
// `owned` runs (adjacent runs merged first), which must tile every dataset exactly once; other
// ranks: empty. No tensor data moves: one gather of 32 bytes per piece.
std::vector<uint32_t> dataset_crcs(const Group& group, const std::vector<core::ParamSpec>& table,
                                   const std::vector<std::vector<TensorRun>>& owned) {
  std::vector<CrcPiece> mine;
  for (std::size_t d = 0; d < owned.size(); ++d) {
    for (const TensorRun& run : owned[d]) {
      const uint32_t crc = crc32(run.data, run.length * sizeof(float));
      CrcPiece* last = mine.empty() ? nullptr : &mine.back();
      if (last != nullptr && last->dataset == d && last->logical + last->length == run.logical) {
        last->crc = crc32_combine(last->crc, crc, run.length * sizeof(float));
        last->length += run.length;
      } else {
        mine.push_back({d, run.logical, run.length, crc, 0});
      }
    }
  }
  std::vector<CrcPiece> all = group.gather(mine);
  if (group.rank() != 0) return {};
  std::sort(all.begin(), all.end(), [](const CrcPiece& a, const CrcPiece& b) {
    return std::tie(a.dataset, a.logical) < std::tie(b.dataset, b.logical);
  });
  std::vector<uint32_t> crcs(owned.size(), 0);
  std::vector<uint64_t> covered(owned.size(), 0);
  for (const CrcPiece& piece : all) {
    if (piece.dataset >= owned.size() || piece.logical != covered[piece.dataset]) {
      throw std::logic_error("checkpoint: the ranks' shards of " +
                             dataset_name(table[piece.dataset / kKinds], piece.dataset % kKinds) +
                             " overlap or leave a gap at element " +
                             std::to_string(covered[piece.dataset]) +
                             " (a bug in the write plan)");
    }
    crcs[piece.dataset] =
        crc32_combine(crcs[piece.dataset], piece.crc, piece.length * sizeof(float));
    covered[piece.dataset] += piece.length;
  }
  for (std::size_t d = 0; d < owned.size(); ++d) {
    if (covered[d] != table[d / kKinds].count) {
      throw std::logic_error("checkpoint: the ranks' shards cover " + std::to_string(covered[d]) +
                             " of the " + std::to_string(table[d / kKinds].count) +
                             " elements of " + dataset_name(table[d / kKinds], d % kKinds) +
                             " (a bug in the write plan)");
    }
  }
  return crcs;
}

// Selects `runs` (sorted, disjoint) of dataset `dset` and moves them between the file and their
// host memory in one call, collective under MPI-IO: a rank with no runs selects none and still
// takes part. HDF5 pairs a file selection with a contiguous memory space in row-major order, the
// order of the sorted runs, so several runs travel through one staging buffer.
void transfer(hid_t dset, hid_t dxpl, const std::vector<int64_t>& shape,
              const std::vector<TensorRun>& runs, bool writing, const std::string& name) {
  H5Handle file_space(H5Dget_space(dset), H5Sclose, "H5Dget_space " + name);
  std::size_t total = 0;
  for (const TensorRun& run : runs) total += run.length;
  if (total == 0) {
    check(H5Sselect_none(file_space.get()), "H5Sselect_none " + name);
  } else {
    H5S_seloper_t op = H5S_SELECT_SET;
    const bool one_dim = shape.size() == 1;
    for (const SelectionBlock& b : selection_blocks(shape, runs)) {
      const hsize_t start[2] = {b.row, b.col}, count[2] = {b.rows, b.cols};
      check(H5Sselect_hyperslab(file_space.get(), op, one_dim ? start + 1 : start, nullptr,
                                one_dim ? count + 1 : count, nullptr),
            "selecting a hyperslab of " + name);
      op = H5S_SELECT_OR;
    }
  }
  const hsize_t elements = std::max<std::size_t>(total, 1);
  H5Handle memory_space(H5Screate_simple(1, &elements, nullptr), H5Sclose, "H5Screate_simple");
  if (total == 0) check(H5Sselect_none(memory_space.get()), "H5Sselect_none");
  std::vector<float> staging;
  float* buffer = runs.size() == 1 ? runs.front().data : nullptr;
  if (buffer == nullptr) {
    staging.resize(elements);
    buffer = staging.data();
  }
  if (writing) {
    if (runs.size() > 1) {
      float* at = buffer;
      for (const TensorRun& run : runs) at = std::copy(run.data, run.data + run.length, at);
    }
    check(H5Dwrite(dset, H5T_NATIVE_FLOAT, memory_space.get(), file_space.get(), dxpl, buffer),
          "writing " + name);
    return;
  }
  check(H5Dread(dset, H5T_NATIVE_FLOAT, memory_space.get(), file_space.get(), dxpl, buffer),
        "reading " + name);
  if (runs.size() > 1) {
    const float* at = buffer;
    for (const TensorRun& run : runs) {
      std::copy(at, at + run.length, run.data);
      at += run.length;
    }
  }
  g_elements_read += total;
}

}  // namespace

void verify_checkpoint_integrity(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw H5Error("checkpoint '" + path + "' does not exist");
  if (!fs::is_regular_file(path, ec)) throw H5Error("checkpoint '" + path + "' is not a file");
  File file(std::fopen(path.c_str(), "rb"));
  if (!file) throw H5Error("cannot open checkpoint '" + path + "': " + std::strerror(errno));
  char block[kCheckpointUserBlock] = {};
  const std::size_t got = std::fread(block, 1, sizeof(block), file.get());
  if (got >= sizeof(kHdf5Signature) &&
      std::memcmp(block, kHdf5Signature, sizeof(kHdf5Signature)) == 0) {
    throw H5Error("'" + path + "' is an HDF5 file without the integrity header of a checkpoint: "
                  "a model file, or a checkpoint of format 1 (written by an older "
                  "colossal_train), which cannot be checked before HDF5 parses it (HDF5 may "
                  "crash on a damaged file); to resume from such a checkpoint anyway set "
                  "checkpoint.verify: false");
  }
  const std::string magic = kIntegrityMagic;
  if (got < magic.size() || std::memcmp(block, magic.data(), magic.size()) != 0) {
    throw H5Error("'" + path + "' is not a colossal checkpoint (" +
                  (got == 0 ? std::string("empty file") : "no integrity header, no HDF5 signature") +
                  ")");
  }
  if (got < sizeof(block)) {
    throw H5Error("checkpoint '" + path + "' is truncated (" + std::to_string(got) +
                  " bytes, shorter than its header)");
  }
  // "colossal-checkpoint-integrity 1\nhdf5-bytes N\ncrc32 XXXXXXXX\n", NUL-padded.
  const std::string text(block, strnlen(block, sizeof(block)));
  unsigned version = 0;
  unsigned long long bytes = 0;
  unsigned crc = 0;
  int consumed = 0;
  const std::string format = magic + " %u\nhdf5-bytes %llu\ncrc32 %8x\n%n";
  if (std::sscanf(text.c_str(), format.c_str(), &version, &bytes, &crc, &consumed) != 3 ||
      std::size_t(consumed) != text.size() || version != 1) {
    throw H5Error("checkpoint '" + path + "': its integrity header is damaged or of an unknown "
                  "version");
  }
  const auto [actual_crc, actual_bytes] = crc32_from(file.get(), kCheckpointUserBlock, path);
  if (actual_bytes != bytes) {
    throw H5Error("checkpoint '" + path + "' is " +
                  (actual_bytes < bytes ? "truncated" : "longer than written") + ": " +
                  std::to_string(actual_bytes) + " bytes after its header, " +
                  std::to_string(bytes) + " written");
  }
  if (actual_crc != crc) {
    throw H5Error("checkpoint '" + path + "' is damaged: its bytes fail the whole-file checksum "
                  "(CRC-32 " + hex32(actual_crc) + ", written " + hex32(crc) + ")");
  }
}

namespace {

// Opens a checkpoint for reading; the errors say what a user can do about it.
H5Handle open_checkpoint(const std::string& path, hid_t fapl = H5P_DEFAULT) {
  detail::silence_hdf5_errors();
  std::error_code ec;
  if (!fs::exists(path, ec)) throw H5Error("checkpoint '" + path + "' does not exist");
  if (!fs::is_regular_file(path, ec)) throw H5Error("checkpoint '" + path + "' is not a file");
  return H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), H5Fclose,
                  "opening checkpoint '" + path + "' (truncated, damaged, or not an HDF5 file?)");
}

// The config attribute, which resume compares key by key with the run's config: it must be a
// YAML mapping.
std::string checked_config(hid_t file, const std::string& path) {
  const std::string text = detail::read_string_attribute(file, "config");
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw H5Error("checkpoint '" + path + "': its config attribute is not valid YAML (" +
                  (e.msg == "bad file" ? std::string("nested too deeply") : e.msg) +
                  "; damaged file?)");
  }
  if (!root.IsMap()) {
    throw H5Error("checkpoint '" + path + "': its config attribute is not a YAML mapping of "
                  "config sections (damaged file, or not written by colossal_train?)");
  }
  return text;
}

// Runs `read`, naming the file in any HDF5 error that does not name it yet.
template <typename Read>
auto naming_the_file(const std::string& path, Read&& read) {
  try {
    return read();
  } catch (const H5Error& e) {
    if (std::string(e.what()).find(path) != std::string::npos) throw;
    throw H5Error("checkpoint '" + path + "': " + e.what() + " (damaged file?)");
  }
}

}  // namespace

namespace {

// The HDF5 part of a save, between create and close; every step collective (see `together`).
void write_file(const Group& group, const std::string& tmp,
                const std::vector<core::ParamSpec>& table,
                const std::vector<std::vector<TensorRun>>& runs,
                const std::vector<uint32_t>& crcs, const CheckpointState& state) {
  const H5Handle fapl = group.file_access();
  const H5Handle dxpl = group.transfer();
  // The user block holds the integrity header, written once the HDF5 part is complete.
  H5Handle fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose, "H5Pcreate(file create)");
  check(H5Pset_userblock(fcpl.get(), kCheckpointUserBlock), "H5Pset_userblock");
  // Every element is written by some rank: filling datasets first would write them twice.
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "H5Pcreate(dataset create)");
  check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
  H5Handle file, model, optimizer;
  together(group, [&] {
    file = H5Handle(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()), H5Fclose,
                    "creating '" + tmp + "' (is checkpoint.dir writable?)");
    model = H5Handle(H5Gcreate2(file.get(), "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                     H5Gclose, "creating /model");
    optimizer = H5Handle(H5Gcreate2(file.get(), "optimizer", H5P_DEFAULT, H5P_DEFAULT,
                                    H5P_DEFAULT),
                         H5Gclose, "creating /optimizer");
  });
  for (std::size_t t = 0; t < table.size(); ++t) {
    const core::ParamSpec& p = table[t];
    const std::vector<hsize_t> dims(p.shape.begin(), p.shape.end());
    H5Handle moments, dsets[kKinds];
    together(group, [&] {  // metadata: identical arguments on every rank
      moments = H5Handle(H5Gcreate2(optimizer.get(), p.name.c_str(), H5P_DEFAULT, H5P_DEFAULT,
                                    H5P_DEFAULT),
                         H5Gclose, "creating /optimizer/" + p.name);
      H5Handle space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose,
                     "H5Screate_simple");
      for (int kind = 0; kind < kKinds; ++kind) {
        const hid_t parent = kind == 0 ? model.get() : moments.get();
        const char* name = kind == 0 ? p.name.c_str() : kind == 1 ? "m" : "v";
        dsets[kind] = H5Handle(H5Dcreate2(parent, name, H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                                          dcpl.get(), H5P_DEFAULT),
                               H5Dclose, "creating dataset " + dataset_name(p, kind));
      }
    });
    for (int kind = 0; kind < kKinds; ++kind) {
      together(group, [&] {
        transfer(dsets[kind].get(), dxpl.get(), p.shape, runs[t * kKinds + kind],
                 /*writing=*/true, dataset_name(p, kind));
      });
    }
    together(group, [&] {
      for (int kind = 0; kind < kKinds; ++kind) {
        detail::write_int_attribute(dsets[kind].get(), "crc32", crcs[t * kKinds + kind]);
      }
    });
  }
  // Testing hook: die here, half-way through writing the checkpoint of step STEP (as a node
  // failure would), to show that the previous checkpoint stays the one to resume from.
  if (const char* kill = std::getenv("COLOSSAL_INJECT_KILL_IN_CHECKPOINT")) {
    if (std::atoll(kill) == state.step) std::raise(SIGKILL);
  }
  together(group, [&] {
    H5Handle data(H5Gcreate2(file.get(), "data", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                  H5Gclose, "creating /data");
    detail::write_int_attribute(data.get(), "next_step", state.step);
    detail::write_string_attribute(file.get(), "format", "colossal-checkpoint");
    detail::write_int_attribute(file.get(), "format_version", kCheckpointFormatVersion);
    detail::write_int_attribute(file.get(), "step", state.step);
    detail::write_int_attribute(file.get(), "optimizer_step", state.optimizer_step);
    detail::write_int_attribute(file.get(), "schedule_step",
                                state.schedule_step < 0 ? state.step : state.schedule_step);
    detail::write_int_attribute(file.get(), "tokens", state.tokens);
    detail::write_int_attribute(file.get(), "seed", state.seed);
    detail::write_string_attribute(file.get(), "config", state.config);
    detail::write_string_attribute(file.get(), "plan", state.plan);
    detail::write_string_attribute(file.get(), "hdf5_version",
                                   std::to_string(H5_VERS_MAJOR) + "." +
                                       std::to_string(H5_VERS_MINOR) + "." +
                                       std::to_string(H5_VERS_RELEASE));
  });
  together(group, [&] {
    check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "flushing '" + tmp + "'");
  });
  // MPI-IO files refuse to close while objects in them are open.
  optimizer.reset();
  model.reset();
  together(group, [&] { check(file.close(), "closing '" + tmp + "'"); });
}

// Every tensor whole, from flat buffers at the offsets of `table` (one process).
CheckpointShard whole_tensors(const std::vector<core::ParamSpec>& table, float* params, float* m,
                              float* v) {
  CheckpointShard shard;
  for (std::size_t t = 0; t < table.size(); ++t) {
    const core::ParamSpec& p = table[t];
    shard.params.push_back({t, 0, p.count, params + p.offset});
    shard.m.push_back({t, 0, p.count, m + p.offset});
    shard.v.push_back({t, 0, p.count, v + p.offset});
  }
  return shard;
}

}  // namespace

namespace {
// A checkpoint's size, a little over: three fp32 arrays of every tensor and the metadata (the
// user block, the config and about 2.3 KiB per tensor measured; 4 KiB counted).
double checkpoint_bytes(const std::vector<core::ParamSpec>& table) {
  double bytes = double(kCheckpointUserBlock) + 256.0 * 1024.0;
  for (const core::ParamSpec& p : table) bytes += 3.0 * 4.0 * double(p.count) + 4096.0;
  return bytes;
}
}  // namespace

std::string write_checkpoint(const std::string& dir, const std::vector<core::ParamSpec>& table,
                             const CheckpointShard& mine, const CheckpointState& state, int keep,
                             MPI_Comm comm) {
  detail::silence_hdf5_errors();
  const Group group(comm);
  const std::string path = (fs::path(dir) / checkpoint_name(state.step)).string();
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  together(group, [&] {
    if (group.rank() != 0) return;
    fs::create_directories(dir, ec);
    if (ec) throw H5Error("cannot create checkpoint.dir '" + dir + "': " + ec.message());
    // Temporary files of saves that a crash interrupted are never read; remove them now.
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (entry.path().extension() == ".tmp") fs::remove(entry.path(), ec);
    }
    // Room for the whole file first: HDF5 does not recover from a disk that fills under it
    // (its file stays open, and closing it at MPI_Finalize crashed every rank).
    fs::space_info space = fs::space(dir, ec);
    // Testing hook: pretend the disk has this many bytes free.
    if (const char* free = std::getenv("COLOSSAL_TEST_CHECKPOINT_FREE_BYTES")) {
      space.available = std::uintmax_t(std::atoll(free));
    }
    const double needed = checkpoint_bytes(table);
    if (!ec && double(space.available) < needed) {
      throw H5Error("checkpoint.dir '" + dir + "' has " +
                    core::format_bytes(double(space.available)) +
                    " free but a checkpoint takes about " + core::format_bytes(needed) +
                    " (parameters and both AdamW moments in fp32); free space there (older "
                    "runs' ckpt-*.h5 or superseded-* folders), or point checkpoint.dir at a "
                    "larger disk");
    }
  });
  // The CRCs come first: they need only memory, and a plan that does not tile the tensors is
  // refused before a file exists.
  std::vector<std::vector<TensorRun>> runs;
  std::vector<uint32_t> crcs;
  together(group, [&] { runs = runs_by_dataset(table, mine); });
  together(group, [&] { crcs = dataset_crcs(group, table, runs); });
  group.broadcast(crcs);
  try {
    write_file(group, tmp, table, runs, crcs, state);
    together(group, [&] {
      if (group.rank() != 0) return;
      write_integrity_header(tmp);
      fs::rename(tmp, path, ec);
      if (ec) throw H5Error("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
    });
  } catch (...) {
    if (group.rank() == 0) fs::remove(tmp, ec);  // never leave a partial file behind
    throw;
  }
  together(group, [&] {
    if (group.rank() != 0) return;
    // The latest pointer, replaced atomically too.
    const std::string latest = (fs::path(dir) / "latest").string();
    {
      std::ofstream out(latest + ".tmp");
      out << checkpoint_name(state.step) << "\n";
      if (!out) throw H5Error("cannot write '" + latest + ".tmp' (disk full?)");
    }
    fs::rename(latest + ".tmp", latest, ec);
    if (ec) throw H5Error("cannot update '" + latest + "': " + ec.message());
    const auto all = list_checkpoints(dir);
    for (std::size_t i = std::max(1, keep); i < all.size(); ++i) fs::remove(all[i], ec);
  });
  return path;
}

std::string write_checkpoint(const std::string& dir, const std::vector<core::ParamSpec>& table,
                             const float* params, const float* m, const float* v,
                             const CheckpointState& state, int keep) {
  // A write only reads through the runs' pointers.
  const CheckpointShard all = whole_tensors(table, const_cast<float*>(params),
                                            const_cast<float*>(m), const_cast<float*>(v));
  return write_checkpoint(dir, table, all, state, keep, MPI_COMM_NULL);
}

CheckpointState read_checkpoint(const std::string& path, const std::vector<core::ParamSpec>& table,
                                const CheckpointShard& wanted, const CheckpointShard& owned,
                                MPI_Comm comm, bool verify) {
  detail::silence_hdf5_errors();
  const Group group(comm);
  // HDF5 parses nothing before the integrity header has been checked (rank 0 reads the file once
  // for it); the tensors' own CRCs are checked below from the ranks' parts.
  together(group, [&] {
    if (verify && group.rank() == 0) verify_checkpoint_integrity(path);
  });
  std::vector<std::vector<TensorRun>> wanted_runs, owned_runs;
  together(group, [&] {
    wanted_runs = runs_by_dataset(table, wanted);
    owned_runs = runs_by_dataset(table, owned);
  });
  return naming_the_file(path, [&] {
    const H5Handle fapl = group.file_access();
    const H5Handle dxpl = group.transfer();
    H5Handle file;
    together(group, [&] {
      file = open_checkpoint(path, fapl.get());
      if (detail::read_string_attribute(file.get(), "format") != "colossal-checkpoint") {
        throw H5Error("'" + path + "' is not a colossal checkpoint");
      }
      const long long version = detail::read_int_attribute(file.get(), "format_version");
      if (version != 1 && version != kCheckpointFormatVersion) {
        throw H5Error("checkpoint '" + path + "' has format version " + std::to_string(version) +
                      "; this build reads versions 1 and " +
                      std::to_string(kCheckpointFormatVersion));
      }
    });
    std::vector<uint32_t> written(table.size() * kKinds, 0);
    for (std::size_t d = 0; d < written.size(); ++d) {
      const core::ParamSpec& p = table[d / kKinds];
      const std::string name = dataset_name(p, int(d % kKinds));
      H5Handle dset;
      together(group, [&] {
        dset = open_dataset(file.get(), name, p, path);
        if (group.rank() == 0) written[d] = uint32_t(detail::read_int_attribute(dset.get(), "crc32"));
      });
      together(group, [&] {
        transfer(dset.get(), dxpl.get(), p.shape, wanted_runs[d], /*writing=*/false, name);
      });
    }
    together(group, [&] {
      const std::vector<uint32_t> actual = dataset_crcs(group, table, owned_runs);
      for (std::size_t d = 0; d < actual.size(); ++d) {
        if (actual[d] != written[d]) {
          throw H5Error("checkpoint '" + path + "': '" +
                        dataset_name(table[d / kKinds], int(d % kKinds)) +
                        "' fails its checksum (corrupted)");
        }
      }
    });
    CheckpointState state;
    together(group, [&] {
      state.step = detail::read_int_attribute(file.get(), "step");
      state.optimizer_step = detail::read_int_attribute(file.get(), "optimizer_step");
      state.schedule_step = H5Aexists(file.get(), "schedule_step") > 0
                                ? detail::read_int_attribute(file.get(), "schedule_step")
                                : state.step;
      state.tokens = detail::read_int_attribute(file.get(), "tokens");
      state.seed = detail::read_int_attribute(file.get(), "seed");
      state.config = checked_config(file.get(), path);
      state.plan = detail::read_string_attribute(file.get(), "plan");
      // Counters that are not counts would send the resumed run to a nonsensical step. (A
      // fine-tune that keeps its moments counts AdamW updates from before its step 0, so
      // optimizer_step may exceed step; the schedule likewise.)
      if (state.step < 0 || state.optimizer_step < 0 || state.tokens < 0 ||
          state.schedule_step < state.step) {
        throw H5Error("checkpoint '" + path + "': step " + std::to_string(state.step) +
                      ", optimizer_step " + std::to_string(state.optimizer_step) + ", tokens " +
                      std::to_string(state.tokens) +
                      " are not the counters of a run (damaged file?)");
      }
    });
    return state;
  });
}

CheckpointState read_checkpoint(const std::string& path, const std::vector<core::ParamSpec>& table,
                                std::vector<float>& params, std::vector<float>& m,
                                std::vector<float>& v, bool verify) {
  for (const auto& p : table) {
    if (p.offset + p.count > params.size() || p.offset + p.count > m.size() ||
        p.offset + p.count > v.size()) {
      throw std::invalid_argument("read_checkpoint: buffers smaller than the table");
    }
  }
  const CheckpointShard all = whole_tensors(table, params.data(), m.data(), v.data());
  return read_checkpoint(path, table, all, all, MPI_COMM_NULL, verify);
}

std::string read_checkpoint_config(const std::string& path, bool verify) {
  if (verify) verify_checkpoint_integrity(path);
  return naming_the_file(path, [&] {
    H5Handle file = open_checkpoint(path);
    return checked_config(file.get(), path);
  });
}

namespace {
// The checkpoints in `dir` with their steps (from the file names), newest first.
std::vector<std::pair<int64_t, std::string>> checkpoints_by_step(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  static const std::regex name("ckpt-([0-9]+)\\.h5");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch match;
    const std::string file = entry.path().filename().string();
    if (std::regex_match(file, match, name)) {
      found.emplace_back(std::stoll(match[1].str()), entry.path().string());
    }
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return found;
}
}  // namespace

std::string set_aside_later_checkpoints(const std::string& dir, int64_t step) {
  std::vector<fs::path> later;
  for (const auto& [at, path] : checkpoints_by_step(dir)) {
    if (at > step) later.emplace_back(path);
  }
  if (later.empty()) return "";
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &utc);
  fs::path to = fs::path(dir) / ("superseded-at-step" + std::to_string(step) + "-" + stamp);
  for (int n = 2; fs::exists(to); ++n) {  // two starts within a second
    to = fs::path(dir) / ("superseded-at-step" + std::to_string(step) + "-" + stamp + "-" +
                          std::to_string(n));
  }
  std::error_code ec;
  fs::create_directory(to, ec);
  if (ec) throw H5Error("cannot create '" + to.string() + "': " + ec.message());
  for (const fs::path& p : later) {
    fs::rename(p, to / p.filename(), ec);
    if (ec) throw H5Error("cannot move '" + p.string() + "' to '" + to.string() + "': " +
                          ec.message());
  }
  // A `latest` that names one of them goes with them; the next save writes a new one.
  const fs::path latest = fs::path(dir) / "latest";
  std::string named;
  std::getline(std::ifstream(latest), named);
  for (const fs::path& p : later) {
    if (p.filename().string() == named) fs::rename(latest, to / "latest", ec);
  }
  // later is newest first.
  return std::to_string(later.size()) + " checkpoint(s) numbered after step " +
         std::to_string(step) + " (" + later.back().filename().string() +
         (later.size() > 1 ? " to " + later.front().filename().string() : std::string()) +
         ") are another run's, or this run's from after the step it resumes from: moved to " +
         to.string() + " (nothing deleted)";
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::string> paths;
  for (auto& [step, path] : checkpoints_by_step(dir)) paths.push_back(std::move(path));
  return paths;
}

}  // namespace colossal::io
