#include "io/checkpoint.hpp"

#include <csignal>
#include <cstdlib>
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <filesystem>
#include <fstream>
#include <regex>
#include <stdexcept>

#include <yaml-cpp/yaml.h>

#include "io/hdf5_detail.hpp"
#include "io/hdf5_file.hpp"

namespace colossal::io {

namespace fs = std::filesystem;
using detail::check;

namespace {
// The running CRC-32 register (start 0xFFFFFFFF, finish with xor 0xFFFFFFFF).
uint32_t crc32_update(uint32_t c, const void* data, std::size_t bytes) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) c = table[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
  return c;
}
}  // namespace

uint32_t crc32(const void* data, std::size_t bytes) {
  return crc32_update(0xFFFFFFFFu, data, bytes) ^ 0xFFFFFFFFu;
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

void write_dataset(hid_t parent, const std::string& name, const core::ParamSpec& p,
                   const float* values) {
  std::vector<hsize_t> dims(p.shape.begin(), p.shape.end());
  H5Handle space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose,
                 "H5Screate_simple");
  H5Handle dset(H5Dcreate2(parent, name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                           H5P_DEFAULT, H5P_DEFAULT),
                H5Dclose, "creating dataset " + name);
  check(H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values),
        "writing dataset " + name);
  detail::write_int_attribute(dset.get(), "crc32", crc32(values, p.count * sizeof(float)));
}

void read_dataset(hid_t parent, const std::string& name, const core::ParamSpec& p, float* out,
                  const std::string& path) {
  const htri_t exists = H5Lexists(parent, name.c_str(), H5P_DEFAULT);
  if (exists < 0) {
    throw H5Error("checkpoint '" + path + "': cannot look up '" + name + "' (damaged file?)");
  }
  if (exists == 0) {
    throw H5Error("checkpoint '" + path + "' has no dataset '" + name +
                  "' (written for another model, or damaged?)");
  }
  // Any failure below is damage: name the file and the tensor.
  try {
    H5Handle dset(H5Dopen2(parent, name.c_str(), H5P_DEFAULT), H5Dclose, "opening " + name);
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
    check(H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out),
          "reading " + name + " from '" + path + "'");
    const auto want = uint32_t(detail::read_int_attribute(dset.get(), "crc32"));
    if (crc32(out, p.count * sizeof(float)) != want) {
      throw H5Error("checkpoint '" + path + "': '" + name + "' fails its checksum (corrupted)");
    }
  } catch (const H5Error& e) {
    if (std::string(e.what()).find(path) != std::string::npos) throw;
    throw H5Error("checkpoint '" + path + "': '" + name + "' cannot be read (" + e.what() +
                  "; damaged file?)");
  }
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
H5Handle open_checkpoint(const std::string& path) {
  detail::silence_hdf5_errors();
  std::error_code ec;
  if (!fs::exists(path, ec)) throw H5Error("checkpoint '" + path + "' does not exist");
  if (!fs::is_regular_file(path, ec)) throw H5Error("checkpoint '" + path + "' is not a file");
  return H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose,
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

std::string write_checkpoint(const std::string& dir, const std::vector<core::ParamSpec>& table,
                             const float* params, const float* m, const float* v,
                             const CheckpointState& state, int keep) {
  detail::silence_hdf5_errors();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw H5Error("cannot create checkpoint.dir '" + dir + "': " + ec.message());
  const std::string path = (fs::path(dir) / checkpoint_name(state.step)).string();
  const std::string tmp = path + ".tmp";
  // Temporary files of saves that a crash interrupted are never read; remove them now.
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".tmp") fs::remove(entry.path(), ec);
  }
  try {
    // The user block holds the integrity header, written once the HDF5 part is complete.
    H5Handle fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose, "H5Pcreate(file create)");
    check(H5Pset_userblock(fcpl.get(), kCheckpointUserBlock), "H5Pset_userblock");
    H5Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT), H5Fclose,
                  "creating '" + tmp + "' (is checkpoint.dir writable?)");
    H5Handle model(H5Gcreate2(file.get(), "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                   H5Gclose, "creating /model");
    H5Handle optimizer(H5Gcreate2(file.get(), "optimizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                       H5Gclose, "creating /optimizer");
    for (const auto& p : table) {
      write_dataset(model.get(), p.name, p, params + p.offset);
      H5Handle group(H5Gcreate2(optimizer.get(), p.name.c_str(), H5P_DEFAULT, H5P_DEFAULT,
                                H5P_DEFAULT),
                     H5Gclose, "creating /optimizer/" + p.name);
      write_dataset(group.get(), "m", p, m + p.offset);
      write_dataset(group.get(), "v", p, v + p.offset);
    }
    // Testing hook: die here, half-way through writing the checkpoint of step STEP (as a node
    // failure would), to show that the previous checkpoint stays the one to resume from.
    if (const char* kill = std::getenv("COLOSSAL_INJECT_KILL_IN_CHECKPOINT")) {
      if (std::atoll(kill) == state.step) std::raise(SIGKILL);
    }
    H5Handle data(H5Gcreate2(file.get(), "data", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
                  "creating /data");
    detail::write_int_attribute(data.get(), "next_step", state.step);
    detail::write_string_attribute(file.get(), "format", "colossal-checkpoint");
    detail::write_int_attribute(file.get(), "format_version", kCheckpointFormatVersion);
    detail::write_int_attribute(file.get(), "step", state.step);
    detail::write_int_attribute(file.get(), "optimizer_step", state.optimizer_step);
    detail::write_int_attribute(file.get(), "tokens", state.tokens);
    detail::write_int_attribute(file.get(), "seed", state.seed);
    detail::write_string_attribute(file.get(), "config", state.config);
    detail::write_string_attribute(file.get(), "plan", state.plan);
    detail::write_string_attribute(file.get(), "hdf5_version",
                                   std::to_string(H5_VERS_MAJOR) + "." +
                                       std::to_string(H5_VERS_MINOR) + "." +
                                       std::to_string(H5_VERS_RELEASE));
    check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "flushing '" + tmp + "'");
    optimizer.reset();
    model.reset();
    data.reset();
    check(file.close(), "closing '" + tmp + "'");
    write_integrity_header(tmp);
  } catch (...) {
    fs::remove(tmp, ec);  // never leave a partial file behind
    throw;
  }
  fs::rename(tmp, path, ec);
  if (ec) throw H5Error("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
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
  return path;
}

CheckpointState read_checkpoint(const std::string& path, const std::vector<core::ParamSpec>& table,
                                std::vector<float>& params, std::vector<float>& m,
                                std::vector<float>& v, bool verify) {
  if (verify) verify_checkpoint_integrity(path);
  return naming_the_file(path, [&] {
    H5Handle file = open_checkpoint(path);
    if (detail::read_string_attribute(file.get(), "format") != "colossal-checkpoint") {
      throw H5Error("'" + path + "' is not a colossal checkpoint");
    }
    const long long version = detail::read_int_attribute(file.get(), "format_version");
    if (version != 1 && version != kCheckpointFormatVersion) {
      throw H5Error("checkpoint '" + path + "' has format version " + std::to_string(version) +
                    "; this build reads versions 1 and " +
                    std::to_string(kCheckpointFormatVersion));
    }
    for (const auto& p : table) {
      if (p.offset + p.count > params.size() || p.offset + p.count > m.size() ||
          p.offset + p.count > v.size()) {
        throw std::invalid_argument("read_checkpoint: buffers smaller than the table");
      }
      read_dataset(file.get(), "model/" + p.name, p, params.data() + p.offset, path);
      read_dataset(file.get(), "optimizer/" + p.name + "/m", p, m.data() + p.offset, path);
      read_dataset(file.get(), "optimizer/" + p.name + "/v", p, v.data() + p.offset, path);
    }
    CheckpointState state;
    state.step = detail::read_int_attribute(file.get(), "step");
    state.optimizer_step = detail::read_int_attribute(file.get(), "optimizer_step");
    state.tokens = detail::read_int_attribute(file.get(), "tokens");
    state.seed = detail::read_int_attribute(file.get(), "seed");
    state.config = checked_config(file.get(), path);
    state.plan = detail::read_string_attribute(file.get(), "plan");
    // Counters that are not counts would send the resumed run to a nonsensical step.
    if (state.step < 0 || state.optimizer_step < 0 || state.optimizer_step > state.step ||
        state.tokens < 0) {
      throw H5Error("checkpoint '" + path + "': step " + std::to_string(state.step) +
                    ", optimizer_step " + std::to_string(state.optimizer_step) + ", tokens " +
                    std::to_string(state.tokens) +
                    " are not the counters of a run (damaged file?)");
    }
    return state;
  });
}

std::string read_checkpoint_config(const std::string& path, bool verify) {
  if (verify) verify_checkpoint_integrity(path);
  return naming_the_file(path, [&] {
    H5Handle file = open_checkpoint(path);
    return checked_config(file.get(), path);
  });
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
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
  std::vector<std::string> paths;
  for (auto& [step, path] : found) paths.push_back(std::move(path));
  return paths;
}

}  // namespace colossal::io
