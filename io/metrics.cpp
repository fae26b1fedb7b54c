#include "io/metrics.hpp"

#include <algorithm>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "io/hdf5_detail.hpp"
#include "io/hdf5_file.hpp"

namespace colossal::io {

namespace fs = std::filesystem;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The step a CSV line starts with, or NaN when it does not start with a number.
double leading_number(const std::string& line) {
  const char* begin = line.c_str();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  return end == begin ? kNaN : v;
}

// Keeps the CSV rows of steps up to `resume_step`, and only whole rows: a line cut short by a
// crash or a full disk (the file's last, without its newline, or with another number of cells
// than the header) goes too, or the rows appended next would continue it. Rewrites the file (under a
// temporary name, then renamed) only when some line must go.
void drop_rows_after(const std::string& path, int64_t resume_step) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return;
  std::ostringstream whole;
  whole << in.rdbuf();
  const std::string text = whole.str();
  std::vector<std::string> kept;
  bool dropped = false;
  std::size_t cells = 0;  // the header's
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = text.find('\n', at);
    const bool whole_line = end != std::string::npos;
    const std::string line = text.substr(at, (whole_line ? end : text.size()) - at);
    at = whole_line ? end + 1 : text.size();
    const std::size_t n = std::size_t(std::count(line.begin(), line.end(), ',')) + 1;
    if (kept.empty()) {  // the header; cut short, the file is rewritten empty (a new header)
      cells = n;
      if (whole_line) kept.push_back(line);
      dropped = dropped || !whole_line;
      if (!whole_line) break;
      continue;
    }
    const double step = leading_number(line);
    if (!whole_line || n != cells || (std::isfinite(step) && step > double(resume_step))) {
      dropped = true;
      continue;
    }
    kept.push_back(line);
  }
  if (!dropped) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const std::string& l : kept) out << l << '\n';
    out.flush();
    if (!out) throw std::runtime_error("cannot write '" + tmp + "' (disk full?); check log.dir");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw std::runtime_error("cannot replace '" + path + "': " + ec.message());
}

}  // namespace

MetricsCsv::MetricsCsv(const std::string& path, std::vector<std::string> columns, bool append,
                       int64_t resume_step)
    : path_(path), columns_(std::move(columns)) {
  const fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  if (append) drop_rows_after(path, resume_step >= 0 ? resume_step : INT64_MAX);
  const bool header = !append || !fs::exists(p) || fs::file_size(p) == 0;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd_ < 0) {
    throw std::runtime_error("cannot write metrics file '" + path + "': " + std::strerror(errno) +
                             "; check log.dir");
  }
  if (!header) return;
  for (std::size_t i = 0; i < columns_.size(); ++i) pending_ += (i ? "," : "") + columns_[i];
  pending_ += '\n';
  flush();
}

MetricsCsv::~MetricsCsv() {
  if (fd_ >= 0) ::close(fd_);
}

bool MetricsCsv::row(const std::vector<double>& values) {
  char cell[32];
  for (std::size_t i = 0; i < columns_.size(); ++i) {
    if (i) pending_ += ',';
    if (i >= values.size()) continue;
    // Every NaN as "nan": printf writes a NaN with its sign bit set (the loss of a skipped
    // non-finite step) as "-nan", which the format does not have.
    if (std::isnan(values[i])) {
      pending_ += "nan";
    } else {
      std::snprintf(cell, sizeof cell, "%.9g", values[i]);
      pending_ += cell;
    }
  }
  pending_ += '\n';
  return flush();
}

// Hands the file what it will take; what a full disk refuses stays pending, so the rows reach the
// file whole and in order once there is room.
bool MetricsCsv::flush() {
  std::size_t done = 0;
  while (done < pending_.size()) {
    const ssize_t n = ::write(fd_, pending_.data() + done, pending_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error_ = n < 0 ? std::strerror(errno) : "no byte written";
      break;
    }
    done += std::size_t(n);
  }
  pending_.erase(0, done);
  return pending_.empty();
}

CsvTable read_metrics_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read '" + path + "': " + std::strerror(errno));
  CsvTable table;
  std::string line;
  auto split = [](const std::string& text) {
    std::vector<std::string> cells;
    std::size_t start = 0;
    for (std::size_t comma; (comma = text.find(',', start)) != std::string::npos;
         start = comma + 1) {
      cells.push_back(text.substr(start, comma - start));
    }
    cells.push_back(text.substr(start));
    return cells;
  };
  if (!std::getline(in, line)) return table;
  table.columns = split(line);
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::vector<double> row(table.columns.size(), kNaN);
    const auto cells = split(line);
    for (std::size_t i = 0; i < row.size() && i < cells.size(); ++i) {
      const char* begin = cells[i].c_str();
      char* end = nullptr;
      const double v = std::strtod(begin, &end);
      if (end != begin) row[i] = v;
    }
    table.rows.push_back(std::move(row));
  }
  return table;
}

// --- metrics.h5 ------------------------------------------------------------------------------

namespace {

using detail::check;

constexpr hsize_t kChunkRows = 256;  // 2 KiB per column chunk
constexpr const char* kFormat = "colossal-metrics";
constexpr long long kFormatVersion = 1;

// No HDF5 file lock: the writer holds the file for milliseconds per row, and a reader that keeps
// it open (h5py in a notebook, colossal_report) must not stop the run's writes.
H5Handle file_access() {
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "H5Pcreate(file access)");
#if H5_VERSION_GE(1, 10, 7)
  check(H5Pset_file_locking(fapl.get(), false, true), "H5Pset_file_locking");
#endif
  return fapl;
}

H5Handle open_for_writing(const std::string& path) {
  detail::silence_hdf5_errors();
  const H5Handle fapl = file_access();
  return H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl.get()), H5Fclose,
                  "opening '" + path + "' for writing");
}

void close_checked(H5Handle& file, const std::string& path) {
  check(file.close(), "closing (flushing) '" + path + "'");
}

// A 1-D, extendible, chunked float64 dataset of `rows` NaN.
void create_column(hid_t file, const std::string& name, hsize_t rows) {
  const hsize_t dims[1] = {rows}, max_dims[1] = {H5S_UNLIMITED}, chunk[1] = {kChunkRows};
  H5Handle space(H5Screate_simple(1, dims, max_dims), H5Sclose, "H5Screate_simple");
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "H5Pcreate(dataset create)");
  check(H5Pset_chunk(dcpl.get(), 1, chunk), "H5Pset_chunk");
  const double fill = kNaN;
  check(H5Pset_fill_value(dcpl.get(), H5T_NATIVE_DOUBLE, &fill), "H5Pset_fill_value");
  check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_ALLOC), "H5Pset_fill_time");
  H5Handle dset(H5Dcreate2(file, name.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT,
                           dcpl.get(), H5P_DEFAULT),
                H5Dclose, "creating column '" + name + "'");
}

// The length of a column; throws unless it is a 1-D floating-point dataset.
hsize_t column_length(hid_t file, const std::string& name) {
  H5Handle dset(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose, "opening '" + name + "'");
  H5Handle type(H5Dget_type(dset.get()), H5Tclose, "H5Dget_type");
  if (H5Tget_class(type.get()) != H5T_FLOAT) {
    throw H5Error("'" + name + "' is not a floating-point column");
  }
  H5Handle space(H5Dget_space(dset.get()), H5Sclose, "H5Dget_space");
  if (H5Sget_simple_extent_ndims(space.get()) != 1) {
    throw H5Error("'" + name + "' is not a 1-D column");
  }
  hsize_t dims[1] = {0};
  if (H5Sget_simple_extent_dims(space.get(), dims, nullptr) < 0) {
    throw H5Error("HDF5: H5Sget_simple_extent_dims '" + name + "' failed");
  }
  return dims[0];
}

std::vector<double> read_column(hid_t file, const std::string& name, hsize_t rows) {
  std::vector<double> values(rows);
  if (rows == 0) return values;
  H5Handle dset(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose, "opening '" + name + "'");
  H5Handle file_space(H5Dget_space(dset.get()), H5Sclose, "H5Dget_space");
  const hsize_t start[1] = {0}, count[1] = {rows};
  check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr),
        "H5Sselect_hyperslab");
  H5Handle mem_space(H5Screate_simple(1, count, nullptr), H5Sclose, "H5Screate_simple");
  check(H5Dread(dset.get(), H5T_NATIVE_DOUBLE, mem_space.get(), file_space.get(), H5P_DEFAULT,
                values.data()),
        "reading '" + name + "'");
  return values;
}

// Sets a column's length to `first + values.size()` and writes `values` from row `first`.
void write_column(hid_t file, const std::string& name, hsize_t first,
                  const std::vector<double>& values) {
  H5Handle dset(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose, "opening '" + name + "'");
  const hsize_t rows[1] = {first + values.size()};
  check(H5Dset_extent(dset.get(), rows), "extending '" + name + "'");
  if (values.empty()) return;
  H5Handle file_space(H5Dget_space(dset.get()), H5Sclose, "H5Dget_space");
  const hsize_t start[1] = {first}, count[1] = {values.size()};
  check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr),
        "H5Sselect_hyperslab");
  H5Handle mem_space(H5Screate_simple(1, count, nullptr), H5Sclose, "H5Screate_simple");
  check(H5Dwrite(dset.get(), H5T_NATIVE_DOUBLE, mem_space.get(), file_space.get(), H5P_DEFAULT,
                 values.data()),
        "writing '" + name + "'");
}

void replace_attribute(hid_t object, const std::string& name) {
  const htri_t exists = H5Aexists(object, name.c_str());
  if (exists < 0) throw H5Error("HDF5: H5Aexists '" + name + "' failed");
  if (exists > 0) check(H5Adelete(object, name.c_str()), "H5Adelete '" + name + "'");
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ",") + p;
  return out;
}

}  // namespace

MetricsH5::MetricsH5(std::string path, std::vector<std::string> columns, int64_t resume_step,
                     const std::string& csv_path)
    : path_(std::move(path)), columns_(std::move(columns)) {
  detail::silence_hdf5_errors();
  const fs::path p(path_);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  if (resume_step < 0) {
    create({});
    return;
  }
  if (fs::exists(p) && continue_existing(resume_step)) return;
  // Rebuild: a file that cannot be read is kept aside, and the rows come from the CSV file.
  std::error_code ec;
  if (fs::exists(p)) {
    fs::rename(p, path_ + ".damaged", ec);
    if (ec) {
      throw H5Error("cannot move the unreadable '" + path_ + "' aside: " + ec.message());
    }
    note_ += "; moved it to " + path_ + ".damaged";
  }
  std::vector<std::vector<double>> rows;
  if (!csv_path.empty() && fs::exists(csv_path)) {
    CsvTable table;
    try {
      table = read_metrics_csv(csv_path);
    } catch (const std::exception& e) {
      throw H5Error(std::string("rebuilding '") + path_ + "': " + e.what());
    }
    std::vector<int> from(columns_.size(), -1);
    for (std::size_t c = 0; c < columns_.size(); ++c) {
      for (std::size_t k = 0; k < table.columns.size(); ++k) {
        if (table.columns[k] == columns_[c]) from[c] = int(k);
      }
    }
    for (const auto& csv_row : table.rows) {
      if (!csv_row.empty() && csv_row[0] > double(resume_step)) continue;
      std::vector<double> row(columns_.size(), kNaN);
      for (std::size_t c = 0; c < columns_.size(); ++c) {
        if (from[c] >= 0) row[c] = csv_row[std::size_t(from[c])];
      }
      rows.push_back(std::move(row));
    }
    note_ += "; rebuilt " + std::to_string(rows.size()) + " rows from " + csv_path;
  }
  create(rows);
  if (!note_.empty()) note_ = path_ + ": " + note_.substr(2);
}

void MetricsH5::create(const std::vector<std::vector<double>>& rows) {
  const std::string tmp = path_ + ".tmp";
  try {
    const H5Handle fapl = file_access();
    H5Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose,
                  "creating '" + tmp + "' (is log.dir writable?)");
    for (std::size_t c = 0; c < columns_.size(); ++c) {
      create_column(file.get(), columns_[c], 0);
      std::vector<double> values(rows.size());
      for (std::size_t r = 0; r < rows.size(); ++r) values[r] = rows[r][c];
      write_column(file.get(), columns_[c], 0, values);
    }
    detail::write_string_attribute(file.get(), "format", kFormat);
    detail::write_int_attribute(file.get(), "format_version", kFormatVersion);
    detail::write_string_attribute(file.get(), "columns", join(columns_));
    close_checked(file, tmp);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  std::error_code ec;
  fs::rename(tmp, path_, ec);
  if (ec) throw H5Error("cannot rename '" + tmp + "' to '" + path_ + "': " + ec.message());
  rows_ = int64_t(rows.size());
}

bool MetricsH5::continue_existing(int64_t resume_step) {
  try {
    H5Handle file = open_for_writing(path_);
    if (detail::read_string_attribute(file.get(), "format") != kFormat) {
      throw H5Error("not a colossal metrics file (no format attribute '" + std::string(kFormat) +
                    "')");
    }
    const std::vector<std::string> names = detail::datasets_in(file.get());
    hsize_t shortest = std::numeric_limits<hsize_t>::max(), longest = 0;
    for (const std::string& name : names) {
      const hsize_t length = column_length(file.get(), name);
      shortest = std::min(shortest, length);
      longest = std::max(longest, length);
    }
    hsize_t rows = names.empty() ? 0 : shortest;
    std::string repairs;
    if (rows != longest) {
      repairs += "; columns of " + std::to_string(rows) + " to " + std::to_string(longest) +
                 " rows (a write was interrupted) cut to " + std::to_string(rows);
    }
    if (std::find(names.begin(), names.end(), "step") != names.end()) {
      const std::vector<double> steps = read_column(file.get(), "step", rows);
      hsize_t keep = 0;
      while (keep < rows && !(steps[keep] > double(resume_step))) ++keep;
      if (keep < rows) {
        repairs += "; dropped " + std::to_string(rows - keep) + " rows after step " +
                   std::to_string(resume_step) + " (trained after the checkpoint)";
      }
      rows = keep;
    }
    extra_columns_.clear();
    for (const std::string& name : names) {
      if (std::find(columns_.begin(), columns_.end(), name) == columns_.end()) {
        extra_columns_.push_back(name);
      }
    }
    for (const std::string& name : columns_) {
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        create_column(file.get(), name, rows);  // NaN for the rows before this writer
      }
    }
    for (const std::string& name : names) write_column(file.get(), name, rows, {});
    std::vector<std::string> all = columns_;
    all.insert(all.end(), extra_columns_.begin(), extra_columns_.end());
    replace_attribute(file.get(), "columns");
    detail::write_string_attribute(file.get(), "columns", join(all));
    close_checked(file, path_);
    rows_ = int64_t(rows);
    if (!repairs.empty()) note_ = path_ + ": " + repairs.substr(2);
    return true;
  } catch (const H5Error& e) {
    note_ = "; cannot be continued (" + std::string(e.what()) + ")";
    return false;
  }
}

bool MetricsH5::row(const std::vector<double>& values) {
  std::vector<double> row(values.begin(), values.begin() + std::min(values.size(), columns_.size()));
  row.resize(columns_.size(), kNaN);
  pending_.push_back(std::move(row));
  try {
    write_pending();
    error_.clear();
    return true;
  } catch (const H5Error& e) {
    error_ = e.what();
    return false;
  }
}

void MetricsH5::write_pending() {
  H5Handle file = open_for_writing(path_);
  // Absolute extents: a retry after a partial failure rewrites the same rows.
  const hsize_t first = hsize_t(rows_);
  for (std::size_t c = 0; c < columns_.size(); ++c) {
    std::vector<double> values(pending_.size());
    for (std::size_t r = 0; r < pending_.size(); ++r) values[r] = pending_[r][c];
    write_column(file.get(), columns_[c], first, values);
  }
  const std::vector<double> unknown(pending_.size(), kNaN);
  for (const std::string& name : extra_columns_) write_column(file.get(), name, first, unknown);
  close_checked(file, path_);
  rows_ += int64_t(pending_.size());
  pending_.clear();
}

void MetricsH5::set_attribute(const std::string& name, double value) {
  H5Handle file = open_for_writing(path_);
  replace_attribute(file.get(), name);
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
  H5Handle attr(H5Acreate2(file.get(), name.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT,
                           H5P_DEFAULT),
                H5Aclose, "creating attribute '" + name + "' in '" + path_ + "'");
  check(H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &value), "writing attribute '" + name + "'");
  attr.reset();
  close_checked(file, path_);
}

void MetricsH5::set_attribute(const std::string& name, const std::string& value) {
  H5Handle file = open_for_writing(path_);
  replace_attribute(file.get(), name);
  detail::write_string_attribute(file.get(), name.c_str(), value);
  close_checked(file, path_);
}

}  // namespace colossal::io
