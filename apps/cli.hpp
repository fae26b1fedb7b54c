// Start-up shared by the programs: MPI and Kokkos, arguments, the config read and validated on
// rank 0 and broadcast as text, and error reporting that exits every rank the same way.
#pragma once

#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "io/config.hpp"
#include "parallel/communicator.hpp"

namespace colossal::apps {

// Exit codes: 0 success, 1 runtime failure, 2 bad command line or config, 3 bad data or model file.
enum ExitCode : int { kOk = 0, kRuntimeError = 1, kUsageError = 2, kDataError = 3 };

// A bad command line: exit code 2 on every rank (every rank parses the same arguments).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ProgramInfo {
  std::string name;
  std::string usage;                 // synopsis and description, printed by --help
  std::vector<std::string> flags;    // value-taking flags this program accepts (e.g. "--weights")
  std::vector<std::string> switches; // boolean flags (e.g. "--eval-only")
  bool print_threads = false;        // print the thread decision at start-up (long-running programs)
  bool any_world_size = false;       // plans a layout without running it: any number of ranks
  std::vector<std::string> config_optional_with{};  // switches that need no CONFIG
  // Inside a Slurm job, unless --set log.dir=... was given: log.dir becomes
  // "<log.dir>-<job id>" ("<log.dir>-<array job id>_<task id>" for an array task), so jobs of one
  // config do not share (or resume from) one directory, and a requeued job finds its own.
  bool slurm_run_dir = false;
  bool needs_data = true;  // false: the config may omit data.path (io::ParseOptions::require_data)
};

struct Invocation {
  int rank = 0;
  int world_size = 1;
  io::Config config;
  parallel::Communicator* world = nullptr;   // every rank started (MPI_COMM_WORLD, duplicated)
  std::map<std::string, std::string> flags;  // value flags given
  std::vector<std::string> switches;         // switches given
  bool has(const std::string& s) const;  // a switch or a value flag was given
  std::string flag(const std::string& name, const std::string& fallback = "") const;
};

// Runs `body` inside MPI + Kokkos after parsing the command line and loading the config
// (CONFIG [--set key=value ...] [--print-config] [--help] plus the program's own flags).
// Errors every rank raises alike (usage, config, data, model file, CollectiveError) are reported
// once by rank 0 as "<program>: error: <message>" and every rank returns the same non-zero code;
// any other error on a multi-rank run is printed by its rank and aborts the job (MPI_Abort), since
// the other ranks may be waiting in a collective.
// The device Kokkos is initialised on: `chosen` (parallel::select_local_device's local rank mod
// devices), or -1 (Kokkos' own choice) when there is none or the user's --kokkos-* flags pick
// one (--kokkos-device-id, --kokkos-num-devices, --kokkos-ndevices, --kokkos-device; bare or =N).
int kokkos_device_for(int chosen, const std::vector<std::string_view>& kokkos_flags);

int run_program(int argc, char** argv, const ProgramInfo& info,
                const std::function<int(Invocation&)>& body);

}  // namespace colossal::apps
