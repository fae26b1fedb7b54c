// The per-step metrics table, written as CSV (one row per optimizer step, flushed as it goes so a
// crashed run keeps its history).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace colossal::io {

class MetricsCsv {
 public:
  // Creates (truncates) `path` and writes the header line; with `append` (a resumed run) adds to
  // an existing file instead, writing the header only when the file is new or empty.
  MetricsCsv(const std::string& path, std::vector<std::string> columns, bool append = false);
  ~MetricsCsv();
  MetricsCsv(const MetricsCsv&) = delete;
  MetricsCsv& operator=(const MetricsCsv&) = delete;
  // One row; values in the order of the columns (non-finite values are written as nan/inf).
  void row(const std::vector<double>& values);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> columns_;
  std::FILE* file_ = nullptr;
};

}  // namespace colossal::io
