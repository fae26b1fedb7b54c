#include "apps/cli.hpp"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include <Kokkos_Core.hpp>

#include "apps/launch_env.hpp"
#include "apps/memory_fit.hpp"
#include "apps/trainer.hpp"
#include "io/dataset.hpp"
#include "io/hdf5_file.hpp"
#include "core/host_threads.hpp"
#include "parallel/comm_choice.hpp"
#include "parallel/local_device.hpp"
#include "parallel/mpi_communicator.hpp"
#include "planner/hardware.hpp"

namespace colossal::apps {

bool Invocation::has(const std::string& s) const {
  return std::find(switches.begin(), switches.end(), s) != switches.end() || flags.count(s) > 0;
}

std::string Invocation::flag(const std::string& name, const std::string& fallback) const {
  auto it = flags.find(name);
  return it == flags.end() ? fallback : it->second;
}

int kokkos_device_for(int chosen, const std::vector<std::string_view>& kokkos_flags) {
  for (std::string_view f : kokkos_flags) {
    for (std::string_view user : {"--kokkos-device-id", "--kokkos-num-devices",
                                  "--kokkos-ndevices", "--kokkos-device"}) {
      if (f == user || (f.starts_with(user) && f.size() > user.size() && f[user.size()] == '=')) {
        return -1;
      }
    }
  }
  return chosen < 0 ? -1 : chosen;
}

namespace {

struct ParsedArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  std::map<std::string, std::string> flags;
  std::vector<std::string> switches;
  bool help = false;
  bool print_config = false;
};

std::string common_help() {
  return "Common options:\n"
         "  CONFIG                 experiment YAML (keys documented in configs/README.md)\n"
         "  --set KEY=VALUE        override a config key, e.g. --set train.steps=100 (repeatable)\n"
         "  --print-config         print the resolved config and exit\n"
         "  --help                 this text\n";
}

ParsedArgs parse_args(int argc, char** argv, const ProgramInfo& info) {
  ParsedArgs args;
  auto is = [](const std::vector<std::string>& list, const std::string& s) {
    return std::find(list.begin(), list.end(), s) != list.end();
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string value;
    const auto eq = a.find('=');
    const bool inline_value = a.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    auto take_value = [&]() {
      if (inline_value) return value;
      if (i + 1 >= argc) throw UsageError(a + " needs a value; see --help");
      return std::string(argv[++i]);
    };
    if (a == "--help" || a == "-h") {
      args.help = true;
    } else if (a == "--print-config") {
      args.print_config = true;
    } else if (a == "--set") {
      args.overrides.push_back(take_value());
    } else if (is(info.flags, a)) {
      args.flags[a] = take_value();
    } else if (is(info.switches, a)) {
      args.switches.push_back(a);
    } else if (a.rfind("-", 0) == 0) {
      throw UsageError("unknown option '" + a + "'; see " + info.name + " --help");
    } else if (args.config_path.empty()) {
      args.config_path = a;
    } else {
      throw UsageError("unexpected argument '" + a + "' (the config is already '" +
                       args.config_path + "'); see " + info.name + " --help");
    }
  }
  const bool optional = std::any_of(info.config_optional_with.begin(),
                                    info.config_optional_with.end(),
                                    [&](const std::string& s) { return is(args.switches, s); });
  if (!args.help && args.config_path.empty() && !optional) {
    throw UsageError("no config file given; usage: " + info.name +
                     " CONFIG [options], e.g. configs/quickstart.yaml (see --help)");
  }
  return args;
}

bool overrides_key(const std::vector<std::string>& overrides, const std::string& key) {
  return std::any_of(overrides.begin(), overrides.end(), [&](const std::string& text) {
    std::string k = text.substr(0, text.find('='));
    k.erase(0, k.find_first_not_of(" \t"));
    k.erase(k.find_last_not_of(" \t") + 1);
    return k == key;
  });
}

// Rank 0 loads and validates; the resolved text (or the error) is broadcast, so every rank parses
// identical text and fails identically: nothing hangs on a bad config. With `slurm` (a Slurm job
// whose command line does not set log.dir) log.dir is suffixed with the job id first.
io::Config load_and_broadcast(const ParsedArgs& args, int rank, const SlurmEnv* slurm,
                              io::ParseOptions options) {
  if (args.config_path.empty()) return io::Config{};  // a mode that needs no config
  std::string text, error;
  if (rank == 0) {
    try {
      io::Config config = io::load_config(args.config_path, args.overrides, options);
      bool changed = false;
      if (slurm != nullptr) {
        config.log.dir = slurm_run_dir(config.log.dir, *slurm);
        changed = true;
      }
      // hardware.preset: host (the default) on a build whose tensors live on a GPU (Kokkos
      // CUDA): the preset of rank 0's GPU instead (the planner's choices, predictions and MFU
      // are that device's; the host's rates mean nothing for it, so host is not kept even when
      // given).
      if (device_resident_build() && config.hardware.file.empty() &&
          config.hardware.preset == "host") {
        const std::string name = parallel::current_gpu_name();
        const std::string preset = planner::preset_for_gpu(name);
        if (!preset.empty()) {
          config.hardware.preset = preset;
          changed = true;
          std::fprintf(stderr,
                       "hardware: preset %s for this GPU (%s); another GPU preset in "
                       "hardware.preset, or hardware.file, overrides it\n",
                       preset.c_str(), name.c_str());
        } else if (!name.empty()) {
          std::fprintf(stderr,
                       "hardware: no preset for this GPU (%s): the planner keeps 'host' rates; "
                       "'colossal_plan --calibrate --out hw.yaml' measures it for "
                       "hardware.file\n",
                       name.c_str());
        }
      }
      if (changed) config.text = io::to_yaml(config);
      text = config.text;
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  for (std::string* s : {&error, &text}) {
    unsigned long long size = s->size();
    MPI_Bcast(&size, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    s->resize(size);
    MPI_Bcast(s->data(), static_cast<int>(size), MPI_CHAR, 0, MPI_COMM_WORLD);
  }
  if (!error.empty()) throw io::ConfigError(error);
  io::Config config = io::parse_config(text, args.config_path, {}, options);
  return config;
}

// Errors raised identically on every rank: reported collectively instead of aborting.
bool collective(const std::exception& e) {
  return dynamic_cast<const UsageError*>(&e) || dynamic_cast<const io::ConfigError*>(&e) ||
         dynamic_cast<const io::DataError*>(&e) || dynamic_cast<const io::H5Error*>(&e) ||
         dynamic_cast<const CollectiveError*>(&e);
}

int classify(const std::exception& e) {
  if (dynamic_cast<const UsageError*>(&e) || dynamic_cast<const io::ConfigError*>(&e)) {
    return kUsageError;
  }
  if (dynamic_cast<const io::DataError*>(&e) || dynamic_cast<const io::H5Error*>(&e) ||
      dynamic_cast<const DataFileError*>(&e)) {
    return kDataError;
  }
  return kRuntimeError;
}

// Ranks that outnumber their node's cores and were started unbound (mpirun --oversubscribe binds
// none) are left by Linux where they start: a pipeline's ready stages can queue on one core while
// the other core runs ranks that only poll in MPI, and such runs measured 0.32 s or 0.47 s a step
// by chance. Pinning the node's rank i to its i-th core modulo the cores makes the placement
// fixed and spreads each group of consecutive ranks (a tensor group, the stages in turn) over the
// cores. Only as core::pins_ranks_to_cores says (ranks dividing evenly over the cores: 3 ranks on
// 2 cores pinned would leave one core half as loaded; one thread each; COLOSSAL_PIN_RANKS not 0).
// Returns the core, or -1.
int pin_shared_core(const cpu_set_t& node_cpus, bool unbound, int local_rank, int local_ranks) {
  const int cores = CPU_COUNT(&node_cpus);
  if (!unbound || !core::pins_ranks_to_cores(local_ranks, cores)) return -1;
  int seen = 0;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &node_cpus) || seen++ != local_rank % cores) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(c, &one);
    return sched_setaffinity(0, sizeof one, &one) == 0 ? c : -1;
  }
  return -1;
}

}  // namespace

int run_program(int argc, char** argv, const ProgramInfo& info,
                const std::function<int(Invocation&)>& body) {
  MPI_Init(&argc, &argv);
  Invocation inv;
  MPI_Comm_rank(MPI_COMM_WORLD, &inv.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &inv.world_size);
  int code = kOk;
  // This process's rank on its node and the node's rank count: for the GPU (chosen before Kokkos,
  // cuBLAS or NCCL start) and the host threads.
  int local_rank = 0, local_ranks = 1, node_cores = 0;
  parallel::LocalRank gpu_rank;  // the local rank that picks the GPU (the launcher's, if sound)
  std::vector<int> pinned;  // the core each rank of this node was pinned to (empty: not pinned)
  {
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, inv.rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_ranks);
    gpu_rank = parallel::node_local_rank(node);
    // The node's cores: the union of its ranks' affinity masks (ranks started under one taskset
    // share the same cores; ranks bound one per core own theirs). Unknown (0) if any rank cannot
    // read its mask (an empty mask stands for that).
    cpu_set_t mine;
    CPU_ZERO(&mine);
    if (sched_getaffinity(0, sizeof mine, &mine) != 0) CPU_ZERO(&mine);
    // A named struct around cpu_set_t: nvcc 13's front end crashes (lexical.c) on
    // std::vector<cpu_set_t> under C++20.
    struct CpuMask {
      cpu_set_t set;
    };
    static_assert(sizeof(CpuMask) == sizeof(cpu_set_t));
    std::vector<CpuMask> masks(static_cast<std::size_t>(local_ranks));
    MPI_Allgather(&mine, int(sizeof mine), MPI_BYTE, masks.data(), int(sizeof mine), MPI_BYTE,
                  node);
    cpu_set_t all = masks.front().set;
    bool known = true, unbound = true;
    for (CpuMask& m : masks) {
      CPU_OR(&all, &all, &m.set);
      known = known && CPU_COUNT(&m.set) > 0;
      unbound = unbound && CPU_EQUAL(&m.set, &masks.front().set);
    }
    node_cores = known ? CPU_COUNT(&all) : 0;
    const int core = pin_shared_core(all, known && unbound, local_rank, local_ranks);
    pinned.resize(std::size_t(local_ranks));
    MPI_Allgather(&core, 1, MPI_INT, pinned.data(), 1, MPI_INT, node);
    // The cost model assumes the whole node pinned, or none of it.
    if (std::ranges::count(pinned, -1) != 0) {
      if (core >= 0) sched_setaffinity(0, sizeof mine, &mine);
      pinned.clear();
    }
    MPI_Comm_free(&node);
  }
  const parallel::DeviceChoice device = parallel::select_local_device(gpu_rank);
  const SlurmEnv slurm = read_slurm_env();
  // Kokkos sees only its own --kokkos-* flags: given --help it would print its help before ours.
  std::vector<char*> kokkos_argv{argv[0]}, own_argv{argv[0]};
  for (int i = 1; i < argc; ++i) {
    const bool kokkos_flag = std::string_view(argv[i]).starts_with("--kokkos-");
    (kokkos_flag ? kokkos_argv : own_argv).push_back(argv[i]);
  }
  // A CUDA Kokkos starts on the GPU this rank chose (local rank mod devices), unless the user
  // chose with --kokkos-device-id / --kokkos-num-devices.
  std::vector<std::string_view> kokkos_flags(kokkos_argv.begin() + 1, kokkos_argv.end());
  const int kokkos_device = kokkos_device_for(device.device, kokkos_flags);
  std::string device_flag = "--kokkos-device-id=" + std::to_string(kokkos_device);
#ifdef KOKKOS_ENABLE_CUDA
  if (kokkos_device >= 0) kokkos_argv.push_back(device_flag.data());
#endif
  int kokkos_argc = int(kokkos_argv.size());
  kokkos_argv.push_back(nullptr);
  {
    Kokkos::ScopeGuard kokkos(kokkos_argc, kokkos_argv.data());
    std::string message;
    try {
      ParsedArgs args = parse_args(int(own_argv.size()), own_argv.data(), info);
      if (args.help) {
        if (inv.rank == 0) std::printf("%s\n%s", info.usage.c_str(), common_help().c_str());
      } else {
        const bool rename = info.slurm_run_dir && slurm.in_job() &&
                            !overrides_key(args.overrides, "log.dir");
        inv.config = load_and_broadcast(args, inv.rank, rename ? &slurm : nullptr,
                                         io::ParseOptions{.require_data = info.needs_data});
        inv.flags = args.flags;
        inv.switches = args.switches;
        if (args.print_config) {
          if (inv.rank == 0) std::printf("%s", inv.config.text.c_str());
        } else {
          const auto& par = inv.config.parallel;
          if (!info.any_world_size && par.mode != io::ParallelMode::automatic &&
              inv.world_size != par.world_size()) {
            const int want = par.world_size();
            const int other = par.tensor * par.sequence * par.pipeline;
            std::string fix = "start " + std::to_string(want) + (want == 1 ? " rank" : " ranks") +
                              " (mpirun -np " + std::to_string(want) + ")";
            if (inv.world_size % other == 0) {
              fix = "set --set parallel.data=" + std::to_string(inv.world_size / other) +
                    " or " + fix;
            }
            throw UsageError(
                "parallel.data = " + std::to_string(par.data) + " x parallel.tensor.size = " +
                std::to_string(par.tensor) + " x parallel.sequence = " +
                std::to_string(par.sequence) + " x parallel.pipeline.size = " +
                std::to_string(par.pipeline) + " needs " + std::to_string(want) +
                " ranks but " + std::to_string(inv.world_size) + " ranks were started; " + fix);
          }
          // The transport (parallel.comm; parallel/comm_choice.hpp): an impossible request is a
          // usage error on every rank alike.
          parallel::RunCommunicator run_comm;
          try {
            run_comm = parallel::make_run_communicator(inv.config.parallel.comm);
          } catch (const std::invalid_argument& e) {
            // A planner (colossal_plan on a CPU login node) plans runs of other machines: a
            // transport this build cannot run is theirs to run; it talks over what it has.
            if (!info.any_world_size) throw UsageError(e.what());
            run_comm = parallel::make_run_communicator("auto");
            if (inv.rank == 0) {
              // stderr: stdout may be --json's.
              std::fprintf(stderr, "note: %s; planning only, so this build's own transport is "
                           "used\n", e.what());
            }
          }
          // The bf16 sums' MPI op reads its buffers on the host: CUDA-aware MPI would hand it
          // device pointers. NCCL and the staged path sum bf16 where the data is.
          if (inv.config.parallel.bf16_grad_reduce() &&
              run_comm.choice.transport == parallel::Transport::cuda_aware_mpi) {
            throw UsageError(
                "parallel.grad_reduce: bf16 is not supported over CUDA-aware MPI (its bf16 sum "
                "runs on the host); set parallel.grad_reduce: fp32, or parallel.comm: nccl (one "
                "GPU per rank)");
          }
          auto world = std::move(run_comm.world);
          inv.world = world.get();
          // One decision for BLAS and host threads: the cores of this process split among the
          // ranks of its node, so mpirun -np 2 on 2 cores does not start 4 busy threads.
          const core::ThreadPlan threads =
              core::set_threads_per_rank(local_ranks, node_cores, !pinned.empty());
          if (inv.rank == 0 && info.print_threads) {
            if (slurm.in_job()) {
              std::printf("slurm: %s\n", slurm.describe().c_str());
              if (rename) {
                std::printf("slurm: run directory %s (the config's log.dir + '-%s'; --set "
                            "log.dir=DIR chooses it)\n",
                            inv.config.log.dir.c_str(), slurm.run_suffix().c_str());
              }
            }
            if (slurm.in_job() || device.cuda_built) {
              std::printf("gpu (rank 0): %s\n", device.describe().c_str());
            }
            std::printf("comm: %s\n", run_comm.choice.describe().c_str());
            std::printf("threads: %d per rank for BLAS and host loops (%d usable core%s, %d rank%s "
                        "on this node; from %s)\n",
                        threads.threads, threads.cores, threads.cores == 1 ? "" : "s",
                        threads.local_ranks,
                        threads.local_ranks == 1 ? "" : "s", threads.source.c_str());
            if (threads.oversubscribed()) {
              std::printf("threads: oversubscribed, %d ranks x %d thread(s) take turns on %d "
                          "core%s; host work runs about %.1fx slower than with a core each\n",
                          threads.local_ranks, threads.threads, threads.node_cores,
                          threads.node_cores == 1 ? "" : "s",
                          double(threads.local_ranks * threads.threads) / threads.node_cores);
              if (!pinned.empty()) {
                std::string cores;
                for (int c : pinned) cores += (cores.empty() ? "" : " ") + std::to_string(c);
                std::printf("threads: ranks pinned round-robin to the cores (no binding was given): "
                            "this node's ranks on cores %s; COLOSSAL_PIN_RANKS=0 leaves placement "
                            "to the OS\n", cores.c_str());
              }
            }
          }
          try {
            code = body(inv);
          } catch (const std::exception& e) {
            if (inv.world_size > 1 && !collective(e)) {
              std::fprintf(stderr, "%s: error (rank %d): %s; aborting every rank\n",
                           info.name.c_str(), inv.rank, e.what());
              std::fflush(stderr);
              MPI_Abort(MPI_COMM_WORLD, kRuntimeError);
            }
            throw;
          }
        }
      }
    } catch (const std::exception& e) {
      message = e.what();
      code = classify(e);
    }
    // Every rank exits with the worst code seen anywhere. Errors that every rank shares (a bad
    // config) are printed once, by rank 0; an error on another rank alone is printed there.
    int worst = code;
    MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    int root_code = code;
    MPI_Bcast(&root_code, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!message.empty() && (inv.rank == 0 || root_code == kOk)) {
      const std::string where = inv.rank == 0 ? "" : " (rank " + std::to_string(inv.rank) + ")";
      std::fprintf(stderr, "%s: error%s: %s\n", info.name.c_str(), where.c_str(), message.c_str());
    }
    code = worst;
  }
  // HDF5 1.10's shutdown inside MPI_Finalize crashes on a file whose close failed (a flush to a
  // full disk; io::hdf5_file_close_failed), turning a reported error into a segfault on every
  // rank: then every rank ends here, its messages out, without MPI_Finalize.
  int close_failed = io::hdf5_file_close_failed() ? 1 : 0, any_failed = 0;
  MPI_Allreduce(&close_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_failed != 0) {
    if (close_failed != 0) {
      std::fprintf(stderr, "%s: note: an HDF5 file could not be closed (a full disk?); ending "
                   "without MPI_Finalize, in which HDF5 would crash on it\n", info.name.c_str());
    }
    std::fflush(nullptr);
    std::_Exit(code);
  }
  MPI_Finalize();
  return code;
}

}  // namespace colossal::apps
