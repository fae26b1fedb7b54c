#include "apps/sweep.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "io/config.hpp"
#include "io/metrics.hpp"

namespace colossal::apps::sweep {
namespace {

namespace fs = std::filesystem;

std::string where(const std::string& source, const YAML::Mark& mark) {
  if (mark.is_null()) return source;
  return source + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? separator : "") + parts[i];
  return out;
}

// A dotted config key: parts of letters, digits and underscores.
bool valid_key(const std::string& key) {
  if (key.empty() || key.front() == '.' || key.back() == '.') return false;
  for (std::size_t i = 0; i < key.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    if (c == '.') {
      if (key[i + 1] == '.') return false;
    } else if (!std::isalnum(c) && c != '_') {
      return false;
    }
  }
  return true;
}

const char* kKeyRule = "a dotted config key such as train.optimizer.lr (letters, digits, '_')";

// The text a --set override carries for a value: a scalar as written when it reads back as the
// same scalar, else (quoted punctuation, lists, mappings) as one-line flow YAML.
std::string value_text(const YAML::Node& node, const std::string& here, const std::string& key) {
  if (!node.IsDefined() || node.IsNull()) {
    throw SweepError(here + ": " + key + ": empty value (give a value, e.g. " + key + ": 1)");
  }
  std::string text;
  bool plain = false;
  if (node.IsScalar()) {
    text = node.Scalar();
    try {
      const YAML::Node back = YAML::Load(text);
      plain = back.IsScalar() && back.Scalar() == text;
    } catch (const YAML::Exception&) {
      plain = false;
    }
  }
  if (!plain) {
    YAML::Emitter out;
    out.SetSeqFormat(YAML::Flow);
    out.SetMapFormat(YAML::Flow);
    if (node.IsScalar()) {
      out << YAML::DoubleQuoted << node.Scalar();
    } else {
      out << node;
    }
    if (!out.good()) {
      throw SweepError(here + ": " + key + ": the value cannot be written as YAML (" +
                       out.GetLastError() + ")");
    }
    text = out.c_str();
  }
  if (text.find('\n') != std::string::npos || text.find('\r') != std::string::npos) {
    throw SweepError(here + ": " + key + ": the value spans lines (allowed: a value on one line)");
  }
  return text;
}

// Flattens a mapping of (possibly nested) keys into dotted keys; `leaf` handles each non-mapping
// value. Nested mappings and dotted keys mix: {train: {optimizer.lr: 1}} is train.optimizer.lr.
template <typename Leaf>
void flatten(const YAML::Node& map, const std::string& prefix, const std::string& source,
             const std::string& what, std::set<std::string>& seen, Leaf&& leaf) {
  for (const auto& entry : map) {
    const auto* it = &entry;
    const std::string here = where(source, it->first.Mark());
    if (!it->first.IsScalar()) {
      throw SweepError(here + ": " + what + ": a key must be text (allowed: " + kKeyRule + ")");
    }
    const std::string part = it->first.Scalar();
    const std::string key = prefix.empty() ? part : prefix + "." + part;
    if (!valid_key(part)) {
      throw SweepError(here + ": " + what + ": '" + key + "' is not a key (allowed: " + kKeyRule +
                       ")");
    }
    if (it->second.IsMap() && it->second.size() > 0) {
      flatten(it->second, key, source, what, seen, leaf);
      continue;
    }
    if (!seen.insert(key).second) {
      throw SweepError(here + ": " + what + ": " + key + " is given twice (allowed: each key once)");
    }
    leaf(key, it->second, here);
  }
}

std::vector<Override> overrides_of(const YAML::Node& map, const std::string& source,
                                   const std::string& what) {
  std::vector<Override> out;
  std::set<std::string> seen;
  flatten(map, "", source, what, seen,
          [&](const std::string& key, const YAML::Node& value, const std::string& here) {
            out.push_back({key, value_text(value, here + ": " + what, key)});
          });
  return out;
}

std::string node_kind(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "'" + node.Scalar() + "'";
}

// "--set K=V" or "--set=K=V" tokens of one .sweep line.
std::vector<Override> parse_line_point(const std::string& line, const std::string& here) {
  std::istringstream in(line);
  std::vector<std::string> tokens;
  for (std::string t; in >> t;) tokens.push_back(t);
  std::vector<Override> out;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    std::string text;
    if (tokens[i] == "--set") {
      if (i + 1 >= tokens.size()) {
        throw SweepError(here + ": '--set' at the end of the line needs KEY=VALUE after it");
      }
      text = tokens[++i];
    } else if (tokens[i].rfind("--set=", 0) == 0) {
      text = tokens[i].substr(6);
    } else {
      throw SweepError(here + ": '" + tokens[i] +
                       "' is not an override (allowed: --set KEY=VALUE, repeated)");
    }
    const auto eq = text.find('=');
    const std::string key = text.substr(0, eq);
    if (eq == std::string::npos || !valid_key(key)) {
      throw SweepError(here + ": '" + text + "' is not KEY=VALUE (allowed: " + kKeyRule +
                       ", '=', a value)");
    }
    out.push_back({key, text.substr(eq + 1)});
  }
  return out;
}

// Natural order: digit runs compare as numbers, so run 2 comes before run 10.
bool natural_less(const std::string& a, const std::string& b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      std::size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      std::string x = a.substr(i, ie - i), y = b.substr(j, je - j);
      x.erase(0, std::min(x.find_first_not_of('0'), x.size() - 1));
      y.erase(0, std::min(y.find_first_not_of('0'), y.size() - 1));
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ',')) out.push_back(trim(field));
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// As the trainer writes a metrics value (9 significant digits), so it reads as it was written.
std::string format_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string format_rate(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

RunSummary summarize_run(const fs::path& metrics, const fs::path& root) {
  RunSummary r;
  const fs::path run_dir = metrics.parent_path();
  r.run = fs::relative(run_dir, root).generic_string();
  if (r.run.empty()) r.run = ".";
  // log.dir/finished: removed when a run continues in the directory, written when it reaches
  // train.steps (a model.h5 may be an earlier, shorter run's: it is no sign of this one).
  r.finished = fs::exists(run_dir / "finished");
  if (std::ifstream point(run_dir / "point.txt"); point) {
    std::vector<std::string> parts;
    for (std::string line; std::getline(point, line);) {
      line = trim(line);
      if (!line.empty() && line[0] != '#') parts.push_back(line);
    }
    r.overrides = join(parts, " ");
  }
  std::ifstream in(metrics);
  if (!in) throw SweepError(metrics.string() + ": cannot be read", 3);
  std::string line;
  if (!std::getline(in, line)) return r;  // empty: the run has not written a step yet
  const std::vector<std::string> header = split_csv_line(line);
  auto column = [&](const std::string& name) {
    const auto it = std::find(header.begin(), header.end(), name);
    if (it == header.end()) {
      throw SweepError(metrics.string() + ":1: no column '" + name + "' (columns: " +
                       join(header, ", ") + "); is this a colossal_train metrics.csv?", 3);
    }
    return std::size_t(it - header.begin());
  };
  const std::size_t step_col = column("step"), loss_col = column("loss"),
                    rate_col = column("tokens_per_s"), val_col = column("val_loss");
  // tokens/s as the trainer's summary has it: the tokens over the seconds of the steps after the
  // first (a warm-up), each step's tokens its rate times its seconds; a file without
  // step_seconds (older runs) averages the rates.
  const auto seconds_it = std::find(header.begin(), header.end(), "step_seconds");
  const bool timed = seconds_it != header.end();
  const std::size_t seconds_col = timed ? std::size_t(seconds_it - header.begin()) : 0;
  double best = 0, rate_sum = 0, tokens = 0, seconds = 0, first_tokens = 0, first_seconds = 0;
  bool have_best = false;
  long long rates = 0;
  for (int number = 2; std::getline(in, line); ++number) {
    if (trim(line).empty() || line.rfind("step,", 0) == 0) continue;
    const std::vector<std::string> row = split_csv_line(line);
    const std::string here = metrics.string() + ":" + std::to_string(number);
    if (row.size() <= std::max({step_col, loss_col, rate_col, val_col})) {
      throw SweepError(here + ": " + std::to_string(row.size()) + " fields, the header has " +
                       std::to_string(header.size()), 3);
    }
    char* end = nullptr;
    const long long step = std::strtoll(row[step_col].c_str(), &end, 10);
    if (end == row[step_col].c_str() || *end != '\0') {
      throw SweepError(here + ": step '" + row[step_col] + "' is not an integer", 3);
    }
    r.steps = step;
    r.final_loss = row[loss_col];
    const double rate = std::strtod(row[rate_col].c_str(), &end);
    if (end != row[rate_col].c_str() && std::isfinite(rate)) {
      rate_sum += rate;
      const double s = timed && seconds_col < row.size()
                           ? std::strtod(row[seconds_col].c_str(), nullptr)
                           : 0.0;
      if (std::isfinite(s) && s > 0) {
        (rates == 0 ? first_tokens : tokens) += rate * s;
        (rates == 0 ? first_seconds : seconds) += s;
      }
      ++rates;
    }
    const double val = std::strtod(row[val_col].c_str(), &end);
    if (end != row[val_col].c_str() && std::isfinite(val) && (!have_best || val < best)) {
      best = val;
      have_best = true;
      r.best_val_loss = row[val_col];
    }
  }
  // eval.choices' passes (log.dir/choices.csv), when the run scored a multiple-choice file.
  if (const fs::path choices = run_dir / "choices.csv"; fs::exists(choices)) {
    io::CsvTable table;
    try {
      table = io::read_metrics_csv(choices.string());
    } catch (const std::exception& e) {
      throw SweepError(std::string(e.what()), 3);
    }
    const auto it = std::find(table.columns.begin(), table.columns.end(), "accuracy_per_token");
    if (!table.columns.empty() && it == table.columns.end()) {
      throw SweepError(choices.string() + ":1: no column 'accuracy_per_token' (columns: " +
                       join(table.columns, ", ") + "); is this a colossal_train choices.csv?", 3);
    }
    double most = std::nan("");
    for (const std::vector<double>& row : table.rows) {  // (a row cut short reads as NaN)
      const double accuracy = row[std::size_t(it - table.columns.begin())];
      if (std::isfinite(accuracy) && (std::isnan(most) || accuracy > most)) most = accuracy;
    }
    if (std::isfinite(most)) r.best_choices_accuracy = format_number(most);
  }
  if (seconds > 0) {
    r.tokens_per_s = tokens / seconds;
  } else if (first_seconds > 0) {  // one step only
    r.tokens_per_s = first_tokens / first_seconds;
  } else {
    r.tokens_per_s = rates ? rate_sum / double(rates) : 0.0;
  }
  return r;
}

}  // namespace

std::size_t Sweep::count() const {
  if (!points.empty()) return points.size();
  if (grid.empty()) return 0;
  std::size_t n = 1;
  for (const auto& [key, values] : grid) n *= values.size();
  return n;
}

std::vector<Override> Sweep::point(std::size_t index) const {
  const std::size_t n = count();
  if (index >= n) {
    throw SweepError(source + " has " + std::to_string(n) + (n == 1 ? " point" : " points") +
                     (n ? " (indices 0-" + std::to_string(n - 1) + ")" : std::string()) +
                     "; there is no point " + std::to_string(index));
  }
  std::vector<Override> own;
  if (!points.empty()) {
    own = points[index];
  } else {
    std::vector<std::size_t> digits(grid.size());
    std::size_t rest = index;
    for (std::size_t k = grid.size(); k-- > 0;) {
      digits[k] = rest % grid[k].second.size();
      rest /= grid[k].second.size();
    }
    for (std::size_t k = 0; k < grid.size(); ++k) {
      own.push_back({grid[k].first, grid[k].second[digits[k]]});
    }
  }
  std::vector<Override> out;
  for (const Override& o : common) {
    const bool replaced = std::any_of(own.begin(), own.end(),
                                      [&](const Override& p) { return p.key == o.key; });
    if (!replaced) out.push_back(o);
  }
  out.insert(out.end(), own.begin(), own.end());
  return out;
}

Sweep parse_yaml_sweep(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw SweepError(where(source, e.mark) + ": YAML syntax error: " + e.msg +
                     " (check indentation, brackets and quotes at or just before this point)");
  }
  const std::string layout =
      "a mapping with 'base: CONFIG' and either 'points:' (a list of {KEY: VALUE} maps) or "
      "'grid:' ({KEY: [VALUES]}), optionally 'set:' ({KEY: VALUE} for every point)";
  if (!root.IsMap()) {
    throw SweepError(source + ": a sweep file is " + layout + "; this one is " + node_kind(root));
  }
  Sweep s;
  s.source = source;
  YAML::Node points, grid;
  bool have_points = false, have_grid = false;
  for (const auto& entry : root) {
    const auto* it = &entry;
    const std::string key = it->first.IsScalar() ? it->first.Scalar() : "?";
    const std::string here = where(source, it->first.Mark());
    const YAML::Node& value = it->second;
    if (key == "base") {
      if (!value.IsScalar() || trim(value.Scalar()).empty()) {
        throw SweepError(here + ": base: expected the path of a config file, got " +
                         node_kind(value) + " (e.g. base: configs/quickstart.yaml)");
      }
      s.base = trim(value.Scalar());
      s.base_where = here;
    } else if (key == "set") {
      if (!value.IsMap()) {
        throw SweepError(here + ": set: expected a mapping of overrides for every point, got " +
                         node_kind(value) + " (e.g. set: {train.steps: 100})");
      }
      s.common = overrides_of(value, source, "set");
    } else if (key == "points") {
      points = value;
      have_points = true;
      if (!value.IsSequence() || value.size() == 0) {
        throw SweepError(here + ": points: expected a non-empty list of {KEY: VALUE} maps, got " +
                         node_kind(value) + " (e.g. points: [{train.seed: 1}, {train.seed: 2}])");
      }
    } else if (key == "grid") {
      grid = value;
      have_grid = true;
      if (!value.IsMap() || value.size() == 0) {
        throw SweepError(here + ": grid: expected a non-empty mapping of KEY: [VALUES], got " +
                         node_kind(value) + " (e.g. grid: {train.seed: [1, 2]})");
      }
    } else {
      throw SweepError(here + ": unknown key '" + key + "' (keys of a sweep file: base, set, " +
                       "points, grid)");
    }
  }
  if (s.base.empty()) {
    throw SweepError(source + ": base: missing; a sweep file is " + layout);
  }
  if (have_points && have_grid) {
    throw SweepError(where(source, grid.Mark()) + ": grid: give either points or grid, not both");
  }
  if (!have_points && !have_grid) {
    throw SweepError(source + ": no points: add 'points:' or 'grid:'; a sweep file is " + layout);
  }
  if (have_points) {
    for (std::size_t i = 0; i < points.size(); ++i) {
      const YAML::Node p = points[i];
      const std::string what = "points[" + std::to_string(i) + "]";
      if (!p.IsMap() || p.size() == 0) {
        throw SweepError(where(source, p.Mark()) + ": " + what +
                         ": expected a non-empty mapping of KEY: VALUE, got " + node_kind(p) +
                         " (e.g. - {train.optimizer.lr: 1.0e-3, train.seed: 1})");
      }
      s.points.push_back(overrides_of(p, source, what));
    }
  } else {
    std::set<std::string> seen;
    std::size_t n = 1;
    flatten(grid, "", source, "grid", seen,
            [&](const std::string& key, const YAML::Node& values, const std::string& here) {
              if (!values.IsSequence() || values.size() == 0) {
                throw SweepError(here + ": grid: " + key + ": expected a non-empty list of "
                                 "values, got " + node_kind(values) + " (e.g. " + key +
                                 ": [1, 2]; a single value belongs in set:)");
              }
              std::vector<std::string> texts;
              for (std::size_t i = 0; i < values.size(); ++i) {
                texts.push_back(value_text(values[i], here + ": grid", key));
              }
              n *= texts.size();
              if (n > kMaxPoints) {
                throw SweepError(here + ": grid: the product of the lists exceeds " +
                                 std::to_string(kMaxPoints) + " points");
              }
              s.grid.emplace_back(key, std::move(texts));
            });
  }
  return s;
}

Sweep parse_line_sweep(const std::string& text, const std::string& source) {
  Sweep s;
  s.source = source;
  std::istringstream in(text);
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    const std::string here = source + ":" + std::to_string(number);
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    if (s.base.empty()) {
      if (line.rfind("base:", 0) != 0 || trim(line.substr(5)).empty()) {
        throw SweepError(here + ": the first line must be 'base: CONFIG' (e.g. base: "
                         "configs/quickstart.yaml), then one point per line: --set KEY=VALUE ...");
      }
      s.base = trim(line.substr(5));
      s.base_where = here;
      continue;
    }
    s.points.push_back(parse_line_point(line, here));
  }
  if (s.base.empty()) {
    throw SweepError(source + ": empty; the first line must be 'base: CONFIG', then one point per "
                     "line: --set KEY=VALUE ...");
  }
  if (s.points.empty()) {
    throw SweepError(source + ": no points: add one line of --set KEY=VALUE overrides per point");
  }
  if (s.points.size() > kMaxPoints) {
    throw SweepError(source + ": more than " + std::to_string(kMaxPoints) + " points");
  }
  return s;
}

Sweep load_sweep(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    throw SweepError(path + ": is a directory; give a sweep file (.yaml or .sweep)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw SweepError(path + ": cannot be opened (relative paths start from " +
                     fs::current_path(ec).string() + ")");
  }
  std::ostringstream text;
  text << in.rdbuf();
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".yaml" || ext == ".yml") return parse_yaml_sweep(text.str(), path);
  return parse_line_sweep(text.str(), path);
}

void check_configs(const Sweep& sweep) {
  std::error_code ec;
  if (!fs::is_regular_file(sweep.base, ec)) {
    throw SweepError(sweep.base_where + ": base: '" + sweep.base + "' is not a file (relative " +
                     "paths start from the current directory, " + fs::current_path(ec).string() +
                     ")");
  }
  for (std::size_t i = 0; i < sweep.count(); ++i) {
    std::vector<std::string> texts;
    for (const Override& o : sweep.point(i)) texts.push_back(o.text());
    try {
      io::load_config(sweep.base, texts);
    } catch (const io::ConfigError& e) {
      throw SweepError(sweep.source + ": point " + std::to_string(i) + " (" + join(texts, " ") +
                       "): " + e.what());
    }
  }
}

std::vector<RunSummary> summarize(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw SweepError("'" + dir + "' is not a directory (give the directory of a sweep, e.g. "
                     "runs/<sweep>-<array job id>)");
  }
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (it->is_regular_file() && it->path().filename() == "metrics.csv") files.push_back(it->path());
  }
  if (ec) throw SweepError("'" + dir + "' cannot be read: " + ec.message(), 1);
  if (files.empty()) {
    throw SweepError("no run below '" + dir + "' (no metrics.csv in it or its subdirectories)");
  }
  std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
    return natural_less(a.generic_string(), b.generic_string());
  });
  std::vector<RunSummary> out;
  for (const fs::path& f : files) out.push_back(summarize_run(f, dir));
  return out;
}

namespace {
const std::vector<std::string> kColumns = {
    "run",          "overrides", "steps", "final_loss", "best_val_loss", "best_choices_accuracy",
    "tokens_per_s", "finished"};

std::vector<std::string> fields_of(const RunSummary& r) {
  return {r.run,           r.overrides,
          std::to_string(r.steps), r.final_loss,
          r.best_val_loss, r.best_choices_accuracy,
          format_rate(r.tokens_per_s), r.finished ? "yes" : "no"};
}
}  // namespace

std::string summary_csv(const std::vector<RunSummary>& runs) {
  std::string out = join(kColumns, ",") + "\n";
  for (const RunSummary& r : runs) {
    std::vector<std::string> fields = fields_of(r);
    for (std::string& f : fields) f = csv_field(f);
    out += join(fields, ",") + "\n";
  }
  return out;
}

std::string summary_table(const std::vector<RunSummary>& runs) {
  std::vector<std::vector<std::string>> rows = {kColumns};
  for (const RunSummary& r : runs) rows.push_back(fields_of(r));
  std::vector<std::size_t> width(kColumns.size(), 0);
  for (const auto& row : rows)
    for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace colossal::apps::sweep
