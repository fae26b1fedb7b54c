// Sweeps: a base config and a set of points, each a list of `--set` overrides, read from a YAML
// sweep file (a list of points or a grid whose cartesian product is the points) or from the older
// line-based .sweep file; and the summary of the runs a sweep produced (colossal_sweep).
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace colossal::apps::sweep {

// A bad sweep file, index or directory: the message names the file, line, key and value, and
// what is allowed. `code` is the exit status (2: bad sweep file or argument, 3: bad metrics file).
class SweepError : public std::runtime_error {
 public:
  explicit SweepError(const std::string& message, int code = 2)
      : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

struct Override {
  std::string key;    // dotted, e.g. "train.optimizer.lr"
  std::string value;  // YAML text, e.g. "1.0e-3" or "[0.9, 0.95]"
  std::string text() const { return key + "=" + value; }
  bool operator==(const Override&) const = default;
};

struct Sweep {
  std::string source;                // the file it was read from
  std::string base;                  // the base config, as written (relative to the cwd)
  std::string base_where;            // "file:line:column" of the base entry, for messages
  std::vector<Override> common;      // `set:`, given to every point (a point's own value wins)
  std::vector<std::vector<Override>> points;                        // `points:` (or .sweep lines)
  std::vector<std::pair<std::string, std::vector<std::string>>> grid;  // `grid:` key -> values

  std::size_t count() const;
  // Point i's overrides: `set:` first, then the point's own (grid: the first key varies slowest,
  // the last fastest, as nested loops in the order written). Throws SweepError when i >= count().
  std::vector<Override> point(std::size_t index) const;
};

// The largest number of points a sweep may have (a grid multiplies quickly).
constexpr std::size_t kMaxPoints = 100000;

// A .yaml/.yml file is read as a YAML sweep, anything else as the line-based format.
Sweep load_sweep(const std::string& path);
// YAML:   base: CONFIG
//         set: {KEY: VALUE, ...}                      (optional)
//         points: [{KEY: VALUE, ...}, ...]   or   grid: {KEY: [VALUE, ...], ...}
// Keys are dotted config keys; nested mappings are flattened (train: {seed: 1} is train.seed=1).
Sweep parse_yaml_sweep(const std::string& text, const std::string& source);
// Lines:  base: CONFIG
//         --set KEY=VALUE [--set KEY=VALUE ...]       (one point per line; # comments)
Sweep parse_line_sweep(const std::string& text, const std::string& source);

// Resolves every point's config (the base with the point's overrides) through the config schema,
// so a typo in a key or a bad value is reported before anything is queued. Throws SweepError
// naming the point.
void check_configs(const Sweep& sweep);

// One run of a summary: a directory below the summarized one that holds a metrics.csv.
struct RunSummary {
  std::string run;            // path relative to the summarized directory ("." for itself)
  std::string overrides;      // the point's overrides (its point.txt), space-separated
  long long steps = 0;        // last step in metrics.csv
  std::string final_loss;     // loss of the last step, as written
  std::string best_val_loss;  // smallest finite val_loss, "" when never validated
  // largest finite accuracy_per_token of log.dir/choices.csv (eval.choices), as written; ""
  // when the run scored none
  std::string best_choices_accuracy;
  double tokens_per_s = 0;    // tokens over seconds of the rows after the first
  bool finished = false;      // log.dir/finished written (the run reached train.steps)
};

// Every run below `dir` (recursively, in natural order: 2 before 10). Throws SweepError when dir
// is not a directory, holds no run, or a metrics.csv lacks a column.
std::vector<RunSummary> summarize(const std::string& dir);
std::string summary_csv(const std::vector<RunSummary>& runs);    // RFC 4180, with a header
std::string summary_table(const std::vector<RunSummary>& runs);  // aligned columns, for people

}  // namespace colossal::apps::sweep
