#include "io/metrics.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace colossal::io {

MetricsCsv::MetricsCsv(const std::string& path, std::vector<std::string> columns, bool append)
    : path_(path), columns_(std::move(columns)) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  const bool header = !append || !std::filesystem::exists(p) || std::filesystem::file_size(p) == 0;
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (file_ == nullptr) {
    throw std::runtime_error("cannot write metrics file '" + path + "': " + std::strerror(errno) +
                             "; check log.dir");
  }
  if (!header) return;
  for (std::size_t i = 0; i < columns_.size(); ++i) {
    std::fprintf(file_, "%s%s", i ? "," : "", columns_[i].c_str());
  }
  std::fprintf(file_, "\n");
  std::fflush(file_);
}

MetricsCsv::~MetricsCsv() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsCsv::row(const std::vector<double>& values) {
  for (std::size_t i = 0; i < columns_.size(); ++i) {
    if (i) std::fputc(',', file_);
    if (i < values.size()) std::fprintf(file_, "%.9g", values[i]);
  }
  std::fputc('\n', file_);
  std::fflush(file_);
}

}  // namespace colossal::io
