// colossal_sweep: reads sweep files for slurm/sweep.sbatch (how many points, the overrides of one)
// and collects the final metrics of a sweep's runs into one table. No MPI, no Kokkos.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apps/sweep.hpp"

using namespace colossal::apps::sweep;

namespace {

const char* kUsage =
    "usage: colossal_sweep count FILE\n"
    "       colossal_sweep list FILE\n"
    "       colossal_sweep point FILE INDEX\n"
    "       colossal_sweep summarize DIR [--out CSV]\n"
    "\n"
    "Sweep files (FILE) for slurm/sweep.sbatch: a base config and points, each a list of\n"
    "--set overrides. A .yaml (or .yml) file holds\n"
    "    base: configs/quickstart.yaml      # the config every point starts from\n"
    "    set: {train.steps: 100}            # optional: overrides of every point\n"
    "and either a list of points\n"
    "    points:\n"
    "      - {train.optimizer.lr: 1.0e-3}\n"
    "      - {train.optimizer.lr: 3.0e-3, train.seed: 2}\n"
    "or a grid, whose points are the cartesian product of its lists (the first key varies\n"
    "slowest, the last fastest)\n"
    "    grid:\n"
    "      train.optimizer.lr: [1.0e-3, 3.0e-3]\n"
    "      train.seed: [1, 2]\n"
    "Any other file is the line format: 'base: CONFIG' on the first line, then one point per\n"
    "line as --set KEY=VALUE ... ('#' starts a comment).\n"
    "\n"
    "Commands:\n"
    "  count FILE             print the number of points, after checking every point's config\n"
    "                         against the schema (a bad key or value fails here, before queueing)\n"
    "                         e.g. sbatch --array=0-$(( $(colossal_sweep count F) - 1 )) ...\n"
    "  list FILE              print every point (index: overrides), after the same check\n"
    "  point FILE INDEX       print point INDEX (0-based, e.g. $SLURM_ARRAY_TASK_ID): the base\n"
    "                         config on the first line, then one KEY=VALUE override per line\n"
    "  summarize DIR          collect every run below DIR (each directory with a metrics.csv):\n"
    "                         run, overrides (the run's point.txt), steps, final train loss,\n"
    "                         best validation loss, best eval.choices accuracy per token\n"
    "                         (log.dir/choices.csv), tokens/s, finished (log.dir/finished);\n"
    "                         written to DIR/summary.csv (or --out CSV) and printed as a table\n"
    "  --help                 this text\n"
    "\n"
    "Exit codes: 0 success, 1 runtime failure, 2 bad command line or sweep file, 3 bad\n"
    "metrics file.\n";

struct Usage : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::size_t parse_index(const std::string& text) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos ||
      text.size() > 9) {
    throw Usage("point: INDEX '" + text + "' must be a non-negative integer (0-based point index)");
  }
  return std::stoul(text);
}

void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!(out << text) || !out.flush()) {
      throw std::runtime_error("cannot write '" + tmp + "': " + std::strerror(errno));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw std::runtime_error("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

int run(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  if (args.empty()) throw Usage("no command given (count, list, point, summarize)");
  const std::string& command = args[0];
  auto want = [&](std::size_t n, const char* synopsis) {
    if (args.size() != n) {
      throw Usage(command + ": expected " + std::to_string(n - 1) + " argument" +
                  (n == 2 ? "" : "s") + " (" + synopsis + "), got " +
                  std::to_string(args.size() - 1));
    }
  };
  if (command == "count" || command == "list") {
    want(2, command == "count" ? "count FILE" : "list FILE");
    const Sweep sweep = load_sweep(args[1]);
    check_configs(sweep);
    if (command == "count") {
      std::printf("%zu\n", sweep.count());
      return 0;
    }
    std::printf("%s: %zu point%s from %s\n", sweep.source.c_str(), sweep.count(),
                sweep.count() == 1 ? "" : "s", sweep.base.c_str());
    for (std::size_t i = 0; i < sweep.count(); ++i) {
      std::string line;
      for (const Override& o : sweep.point(i)) {
        line += ' ';
        line += o.text();
      }
      std::printf("%zu:%s\n", i, line.c_str());
    }
    return 0;
  }
  if (command == "point") {
    want(3, "point FILE INDEX");
    const std::size_t index = parse_index(args[2]);
    const Sweep sweep = load_sweep(args[1]);
    const std::vector<Override> overrides = sweep.point(index);
    std::printf("%s\n", sweep.base.c_str());
    for (const Override& o : overrides) std::printf("%s\n", o.text().c_str());
    return 0;
  }
  if (command == "summarize") {
    std::string dir, out;
    for (std::size_t i = 1; i < args.size(); ++i) {
      if (args[i] == "--out") {
        if (i + 1 >= args.size()) throw Usage("summarize: --out needs a file name");
        out = args[++i];
      } else if (args[i].rfind("--out=", 0) == 0) {
        out = args[i].substr(6);
      } else if (args[i].rfind("-", 0) == 0) {
        throw Usage("summarize: unknown option '" + args[i] + "' (allowed: --out CSV)");
      } else if (dir.empty()) {
        dir = args[i];
      } else {
        throw Usage("summarize: unexpected argument '" + args[i] + "' (the directory is already '" +
                    dir + "')");
      }
    }
    if (dir.empty()) throw Usage("summarize: no directory given (summarize DIR [--out CSV])");
    const std::vector<RunSummary> runs = summarize(dir);
    if (out.empty()) out = (std::filesystem::path(dir) / "summary.csv").string();
    write_file(out, summary_csv(runs));
    std::fputs(summary_table(runs).c_str(), stdout);
    std::printf("%zu run%s; written to %s\n", runs.size(), runs.size() == 1 ? "" : "s",
                out.c_str());
    return 0;
  }
  throw Usage("unknown command '" + command + "' (commands: count, list, point, summarize)");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const Usage& e) {
    std::fprintf(stderr, "colossal_sweep: error: %s; see colossal_sweep --help\n", e.what());
    return 2;
  } catch (const SweepError& e) {
    std::fprintf(stderr, "colossal_sweep: error: %s\n", e.what());
    return e.code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "colossal_sweep: error: %s\n", e.what());
    return 1;
  }
}
