// The per-step metrics table, written twice by rank 0: metrics.csv (one line per optimizer step,
// flushed as it goes) and metrics.h5 (the same rows and more columns, for h5py and
// colossal_report). docs/metrics-format.md describes both.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace colossal::io {

class MetricsCsv {
 public:
  // Creates (truncates) `path` and writes the header line; with `append` (a resumed run) adds to
  // an existing file instead, writing the header only when the file is new or empty. With
  // `resume_step` >= 0, rows whose first column (the step) is above it are dropped first: they
  // were trained after the checkpoint the run resumes from and are about to be trained again.
  MetricsCsv(const std::string& path, std::vector<std::string> columns, bool append = false,
             int64_t resume_step = -1);
  ~MetricsCsv();
  MetricsCsv(const MetricsCsv&) = delete;
  MetricsCsv& operator=(const MetricsCsv&) = delete;
  // One row; values in the order of the columns (non-finite values are written as nan/inf).
  // Returns false when the file took less than all of the text so far (a full disk): the rest
  // stays in memory and goes out, in order, with the next row that can be written, so the file
  // never holds a row cut short except at its end. error() says why.
  bool row(const std::vector<double>& values);
  const std::string& path() const { return path_; }
  const std::string& error() const { return error_; }

 private:
  bool flush();
  std::string path_;
  std::vector<std::string> columns_;
  int fd_ = -1;
  std::string pending_;  // text not yet taken by the file
  std::string error_;
};

// metrics.h5: one float64 dataset per column at the root (`/step`, `/loss`, ...), all of one
// length, chunked and extendible, NaN where a value is unknown; root attributes `format`
// ("colossal-metrics"), `format_version`, `columns` (comma-separated, the column order) and any
// set_attribute.
//
// Crash safety: every row opens the file, extends and writes every column, and closes it, so
// between rows (where a training process spends nearly all its time) the file on disk is complete
// and no HDF5 file lock is held (readers may open it while the run trains). A crash inside the
// few milliseconds of a row write can leave it damaged; the next run that continues it repairs
// it: columns of different lengths are cut to the shortest, and a file HDF5 cannot read is moved
// to `<path>.damaged` and rebuilt from metrics.csv. A failed row write (disk full, file locked by
// another writer) does not stop training: the rows are kept and written with the next one.
class MetricsH5 {
 public:
  // Creates `path` (replacing any file there). With `resume_step` >= 0 continues it instead,
  // keeping the rows of steps up to `resume_step`; a missing or unreadable file is rebuilt from
  // the CSV file `csv_path` (when given and present), with NaN in the columns it lacks.
  // Throws H5Error when the file cannot be created.
  MetricsH5(std::string path, std::vector<std::string> columns, int64_t resume_step = -1,
            const std::string& csv_path = "");
  MetricsH5(const MetricsH5&) = delete;
  MetricsH5& operator=(const MetricsH5&) = delete;

  // One row, values in the order of the columns. Returns false when it could not be written now
  // (error() says why); it is kept and written with the next row.
  bool row(const std::vector<double>& values);
  // A root attribute, replaced if present (e.g. the cost model's predictions). Throws H5Error.
  void set_attribute(const std::string& name, double value);
  void set_attribute(const std::string& name, const std::string& value);

  const std::string& path() const { return path_; }
  int64_t rows() const { return rows_; }         // rows in the file
  std::size_t pending() const { return pending_.size(); }  // rows not yet written
  const std::string& error() const { return error_; }  // why the last write failed; "" if it did not
  const std::string& note() const { return note_; }    // what opening repaired, for the log

 private:
  void create(const std::vector<std::vector<double>>& rows);
  bool continue_existing(int64_t resume_step);
  void write_pending();

  std::string path_;
  std::vector<std::string> columns_;
  std::vector<std::string> extra_columns_;  // in the file but not ours (an older writer's)
  int64_t rows_ = 0;
  std::vector<std::vector<double>> pending_;
  std::string error_, note_;
};

// Reads a CSV file written by MetricsCsv: its header and rows ("nan" and empty cells as NaN).
// Throws std::runtime_error naming the file when it cannot be read.
struct CsvTable {
  std::vector<std::string> columns;
  std::vector<std::vector<double>> rows;
};
CsvTable read_metrics_csv(const std::string& path);

}  // namespace colossal::io
