#include "io/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

namespace colossal::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host would need byte swaps");

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The safetensors library refuses headers above 100 MB; so do we (a lying length would
// otherwise make us allocate whatever the first 8 bytes say).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw SafetensorsError(path + ": " + what);
}

std::string errno_text() { return std::strerror(errno); }

// Reads exactly `bytes` at `offset`, or throws naming what was being read.
void pread_exact(int fd, void* out, uint64_t bytes, uint64_t offset, const std::string& path,
                 const std::string& what) {
  auto* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail(path, "cannot read " + what + ": " + errno_text());
    }
    if (got == 0) fail(path, "file ends while reading " + what + " (truncated?)");
    p += got;
    bytes -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

// Dtypes of the safetensors format that we do not read: refused by name, not as "unknown".
bool is_other_safetensors_dtype(const std::string& d) {
  static const char* const others[] = {"F64", "I64", "I32", "I16", "I8", "U64", "U32", "U16",
                                       "U8", "BOOL", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4",
                                       "F6_E2M3", "F6_E3M2", "C64"};
  for (const char* o : others)
    if (d == o) return true;
  return false;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

const char* st_dtype_name(StDtype d) {
  switch (d) {
    case StDtype::F32: return "F32";
    case StDtype::F16: return "F16";
    case StDtype::BF16: return "BF16";
  }
  return "?";
}

std::size_t st_dtype_bytes(StDtype d) { return d == StDtype::F32 ? 4 : 2; }

uint64_t StTensorInfo::elements() const {
  uint64_t n = 1;
  for (int64_t s : shape) n *= static_cast<uint64_t>(s);
  return n;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf, nan (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);  // rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;  // signed zero
  } else {
    // Subnormal half: mant * 2^-24; normalise into a float (always representable).
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

float bf16_to_f32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// --- Reader ------------------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail(path, "cannot open: " + errno_text());
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail(path, "cannot stat: " + errno_text());
    const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
    if (file_bytes < 8)
      fail(path, "file is " + std::to_string(file_bytes) +
                     " bytes, shorter than the 8-byte header length (not a safetensors file, or "
                     "truncated)");
    unsigned char len_bytes[8];
    pread_exact(fd_, len_bytes, 8, 0, path, "the header length");
    uint64_t header_bytes = 0;
    for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | len_bytes[i];
    if (header_bytes > file_bytes - 8)
      fail(path, "header length " + std::to_string(header_bytes) + " exceeds the " +
                     std::to_string(file_bytes - 8) +
                     " bytes after the length field (truncated file, or not safetensors)");
    if (header_bytes > kMaxHeaderBytes)
      fail(path, "header length " + std::to_string(header_bytes) + " is above the 100 MB limit");
    std::string header(header_bytes, '\0');
    pread_exact(fd_, header.data(), header_bytes, 8, path, "the JSON header");
    data_start_ = 8 + header_bytes;
    const uint64_t data_bytes = file_bytes - data_start_;

    json doc;
    try {
      doc = json::parse(header);
    } catch (const json::parse_error& e) {
      fail(path, std::string("the JSON header is not well-formed: ") + e.what());
    }
    if (!doc.is_object()) fail(path, "the JSON header is not an object");
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      const std::string& name = it.key();
      const json& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) fail(path, "__metadata__ is not an object of strings");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string())
            fail(path, "__metadata__ entry '" + m.key() + "' is not a string");
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      const std::string where = "tensor '" + name + "'";
      if (!v.is_object()) fail(path, where + ": entry is not an object");
      if (!v.contains("dtype") || !v["dtype"].is_string())
        fail(path, where + ": missing or non-string \"dtype\"");
      if (!v.contains("shape") || !v["shape"].is_array())
        fail(path, where + ": missing or non-array \"shape\"");
      if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
          v["data_offsets"].size() != 2)
        fail(path, where + ": missing \"data_offsets\" [begin, end]");
      StTensorInfo t;
      t.name = name;
      const std::string dtype = v["dtype"].get<std::string>();
      if (dtype == "F32") t.dtype = StDtype::F32;
      else if (dtype == "F16") t.dtype = StDtype::F16;
      else if (dtype == "BF16") t.dtype = StDtype::BF16;
      else if (is_other_safetensors_dtype(dtype))
        fail(path, where + ": dtype " + dtype + " is not supported (F32, F16 and BF16 are)");
      else
        fail(path, where + ": unknown dtype '" + dtype + "' (F32, F16 and BF16 are supported)");
      uint64_t elements = 1;
      bool overflow = false;
      for (const json& d : v["shape"]) {
        if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
          fail(path, where + ": shape entries must be non-negative integers");
        const uint64_t s = d.get<uint64_t>();
        if (s > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow = true;
        t.shape.push_back(static_cast<int64_t>(s));
        if (s != 0 && elements > std::numeric_limits<uint64_t>::max() / 8 / s) overflow = true;
        elements *= s;
      }
      const json& off = v["data_offsets"];
      for (const json& o : off)
        if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<int64_t>() >= 0))
          fail(path, where + ": data_offsets must be non-negative integers");
      t.begin = off[0].get<uint64_t>();
      t.end = off[1].get<uint64_t>();
      if (t.begin > t.end)
        fail(path, where + ": data_offsets [" + std::to_string(t.begin) + ", " +
                       std::to_string(t.end) + "] end before they begin");
      if (t.end > data_bytes)
        fail(path, where + ": data_offsets [" + std::to_string(t.begin) + ", " +
                       std::to_string(t.end) + "] reach beyond the data section of " +
                       std::to_string(data_bytes) + " bytes (truncated file, or a lying header)");
      const uint64_t want = elements * st_dtype_bytes(t.dtype);
      if (overflow || want != t.end - t.begin)
        fail(path, where + ": shape " + shape_text(t.shape) + " of " + dtype + " needs " +
                       (overflow ? std::string("more than 2^64") : std::to_string(want)) +
                       " bytes but data_offsets span " + std::to_string(t.end - t.begin));
      tensors_.push_back(std::move(t));
    }
    std::sort(tensors_.begin(), tensors_.end(), [](const StTensorInfo& a, const StTensorInfo& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    for (std::size_t i = 1; i < tensors_.size(); ++i) {
      const StTensorInfo& a = tensors_[i - 1];
      const StTensorInfo& b = tensors_[i];
      // Empty tensors occupy no bytes and may share an offset with anything.
      if (b.begin < a.end && b.begin != b.end && a.begin != a.end)
        fail(path, "tensors '" + a.name + "' [" + std::to_string(a.begin) + ", " +
                       std::to_string(a.end) + ") and '" + b.name + "' [" +
                       std::to_string(b.begin) + ", " + std::to_string(b.end) +
                       ") overlap in the data section");
    }
    for (std::size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const StTensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail(path_, "no tensor named '" + name + "'");
  return tensors_[it->second];
}

void SafetensorsFile::read(const std::string& name, uint64_t first, uint64_t count,
                           float* out) const {
  const StTensorInfo& t = info(name);
  const uint64_t n = t.elements();
  if (first > n || count > n - first)
    fail(path_, "tensor '" + name + "': elements [" + std::to_string(first) + ", " +
                    std::to_string(first + count) + ") are outside its " + std::to_string(n));
  const std::size_t es = st_dtype_bytes(t.dtype);
  const uint64_t at = data_start_ + t.begin + first * es;
  const std::string what = "tensor '" + name + "'";
  if (t.dtype == StDtype::F32) {
    pread_exact(fd_, out, count * 4, at, path_, what);
  } else {
    constexpr uint64_t kChunk = 1 << 16;
    std::vector<uint16_t> buf(std::min<uint64_t>(count, kChunk));
    for (uint64_t done = 0; done < count;) {
      const uint64_t k = std::min<uint64_t>(count - done, kChunk);
      pread_exact(fd_, buf.data(), k * 2, at + done * 2, path_, what);
      if (t.dtype == StDtype::F16)
        for (uint64_t i = 0; i < k; ++i) out[done + i] = f16_to_f32(buf[i]);
      else
        for (uint64_t i = 0; i < k; ++i) out[done + i] = bf16_to_f32(buf[i]);
      done += k;
    }
  }
  bytes_read_ += count * es;
}

std::vector<float> SafetensorsFile::read_all(const std::string& name) const {
  std::vector<float> out(info(name).elements());
  read(name, 0, out.size(), out.data());
  return out;
}

// --- Sets of files -------------------------------------------------------------------------------

bool is_safetensors_path(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    return fs::exists(fs::path(path) / "model.safetensors", ec) ||
           fs::exists(fs::path(path) / "model.safetensors.index.json", ec);
  const std::string p = path;
  auto ends = [&](const std::string& s) {
    return p.size() >= s.size() && p.compare(p.size() - s.size(), s.size(), s) == 0;
  };
  return ends(".safetensors") || ends(".safetensors.index.json");
}

SafetensorsSet::SafetensorsSet(const std::string& path) : path_(path) {
  std::error_code ec;
  fs::path p(path);
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "model.safetensors.index.json", ec)) p /= "model.safetensors.index.json";
    else if (fs::exists(p / "model.safetensors", ec)) p /= "model.safetensors";
    else
      fail(path, "directory holds neither model.safetensors nor model.safetensors.index.json");
  }
  const std::string ps = p.string();
  const bool is_index = ps.size() >= 5 && ps.compare(ps.size() - 5, 5, ".json") == 0;
  if (!is_index) {
    files_.push_back(std::make_unique<SafetensorsFile>(ps));
    for (const StTensorInfo& t : files_[0]->tensors()) where_[t.name] = 0;
    return;
  }
  std::ifstream in(ps);
  if (!in) fail(ps, "cannot open the index");
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::parse_error& e) {
    fail(ps, std::string("the index is not well-formed JSON: ") + e.what());
  }
  if (!doc.is_object() || !doc.contains("weight_map") || !doc["weight_map"].is_object())
    fail(ps, "the index has no \"weight_map\" object {tensor name: file}");
  std::map<std::string, std::size_t> file_index;
  for (auto it = doc["weight_map"].begin(); it != doc["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      fail(ps, "weight_map entry '" + it.key() + "' is not a file name");
    const std::string file = it.value().get<std::string>();
    if (file.find('/') != std::string::npos || file == "..")
      fail(ps, "weight_map entry '" + it.key() + "' names '" + file +
                   "', not a file beside the index");
    auto f = file_index.find(file);
    if (f == file_index.end()) {
      files_.push_back(std::make_unique<SafetensorsFile>((p.parent_path() / file).string()));
      f = file_index.emplace(file, files_.size() - 1).first;
    }
    if (!files_[f->second]->has(it.key()))
      fail(ps, "weight_map puts '" + it.key() + "' in " + file + ", which has no such tensor");
    where_[it.key()] = f->second;
  }
}

const StTensorInfo& SafetensorsSet::info(const std::string& name) const {
  return file_of(name).info(name);
}

const SafetensorsFile& SafetensorsSet::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail(path_, "no tensor named '" + name + "'");
  return *files_[it->second];
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

void SafetensorsSet::read(const std::string& name, uint64_t first, uint64_t count,
                          float* out) const {
  file_of(name).read(name, first, count, out);
}

std::vector<float> SafetensorsSet::read_all(const std::string& name) const {
  return file_of(name).read_all(name);
}

uint64_t SafetensorsSet::bytes_read() const {
  uint64_t n = 0;
  for (const auto& f : files_) n += f->bytes_read();
  return n;
}

// --- Writer --------------------------------------------------------------------------------------

namespace {

void write_all(int fd, const void* data, uint64_t bytes, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t put = ::write(fd, p, std::min<uint64_t>(bytes, 1u << 30));
    if (put < 0) {
      if (errno == EINTR) continue;
      fail(path, "cannot write: " + errno_text());
    }
    p += put;
    bytes -= static_cast<uint64_t>(put);
  }
}

uint64_t tensor_elements(const StTensorOut& t, const std::string& path) {
  uint64_t n = 1;
  for (int64_t s : t.shape) {
    if (s < 0) fail(path, "tensor '" + t.name + "' has a negative dimension");
    n *= static_cast<uint64_t>(s);
  }
  if (n > 0 && t.data == nullptr) fail(path, "tensor '" + t.name + "' has no data");
  return n;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<StTensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  uint64_t offset = 0;
  for (const StTensorOut& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      fail(path, "tensor name '" + t.name + "' is not allowed");
    if (header.contains(t.name)) fail(path, "tensor '" + t.name + "' is written twice");
    const uint64_t bytes = tensor_elements(t, path) * 4;
    header[t.name] = {{"dtype", "F32"},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(tmp, "cannot create: " + errno_text());
  try {
    write_all(fd, len, 8, tmp);
    write_all(fd, text.data(), text.size(), tmp);
    for (const StTensorOut& t : tensors)
      write_all(fd, t.data, tensor_elements(t, path) * 4, tmp);
    if (::fsync(fd) != 0) fail(tmp, "cannot flush: " + errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail(tmp, "cannot close: " + errno_text());
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    fail(path, "cannot rename " + tmp + " into place: " + why);
  }
}

std::vector<std::string> write_safetensors_dir(
    const std::string& dir, const std::vector<StTensorOut>& tensors, uint64_t shard_bytes,
    const std::map<std::string, std::string>& metadata) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(dir, "cannot create the directory: " + ec.message());
  const fs::path d(dir);
  uint64_t total = 0;
  std::vector<std::vector<StTensorOut>> shards(1);
  uint64_t in_shard = 0;
  for (const StTensorOut& t : tensors) {
    const uint64_t bytes = tensor_elements(t, dir) * 4;
    if (shard_bytes > 0 && in_shard > 0 && in_shard + bytes > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += bytes;
    total += bytes;
  }
  // Stale files of an earlier save (either form) would confuse a loader: remove them first.
  const std::regex shard_name(R"(model-\d{5}-of-\d{5}\.safetensors)");
  for (const auto& e : fs::directory_iterator(d, ec)) {
    const std::string n = e.path().filename().string();
    if (std::regex_match(n, shard_name) || n == "model.safetensors" ||
        n == "model.safetensors.index.json")
      fs::remove(e.path(), ec);
  }
  std::vector<std::string> written;
  if (shards.size() == 1) {
    const std::string p = (d / "model.safetensors").string();
    write_safetensors(p, shards[0], metadata);
    written.push_back(p);
    return written;
  }
  json weight_map = json::object();
  const std::size_t n = shards.size();
  for (std::size_t i = 0; i < n; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    const std::string p = (d / name).string();
    write_safetensors(p, shards[i], metadata);
    written.push_back(p);
    for (const StTensorOut& t : shards[i]) weight_map[t.name] = name;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  const std::string ip = (d / "model.safetensors.index.json").string();
  const std::string tmp = ip + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << index.dump(2) << "\n";
    out.close();
    if (!out) {
      fs::remove(tmp, ec);
      fail(tmp, "cannot write the index");
    }
  }
  fs::rename(tmp, ip, ec);
  if (ec) fail(ip, "cannot rename the index into place: " + ec.message());
  written.push_back(ip);
  return written;
}

}  // namespace colossal::io
