// A small pool of host threads for the bandwidth-bound loops over all parameters (AdamW, the
// gradient norm, zeroing gradients), the element-wise kernels (kernels::for_each), bf16 rounding
// and batches of small GEMMs when Kokkos runs on the Serial backend (Debian's Kokkos 3.4): one
// core cannot saturate memory bandwidth, and those loops were a fifth of a 124M-parameter step
// while the second core waited. With a threaded Kokkos (OpenMP, CUDA) the kernels use Kokkos.
//
// Threads: the programs call set_threads_per_rank() at start-up (cores of this process divided by
// the ranks on its node, unless COLOSSAL_HOST_THREADS or OPENBLAS_NUM_THREADS say otherwise);
// without that call the pool reads the same environment variables, else uses every core.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include <Kokkos_Core.hpp>

namespace colossal::core {

// Which threads run a job's parts. own: the pool's std::thread workers, woken per job (OpenBLAS,
// linked as Debian's pthread build, multiplies on threads of its own). openmp: OpenMP's team
// (libgomp), the threads oneDNN and Debian's BLIS multiply on, which spin for a while after each
// parallel region. Two sets of threads that spin while waiting starve each other on the same
// cores: on 2 cores a bf16 quickstart step took 312 ms with oneDNN's products and the kernels on
// the pool's own threads, 162 ms with the kernels on OpenMP's team; OpenBLAS's products with
// the kernels on OpenMP's team ran at 0.6x. So the team follows the GEMM backend:
// make_default_gemm sets it (Gemm::runs_on_openmp).
enum class HostTeam { own, openmp };

class HostThreads {
 public:
  explicit HostThreads(int threads);
  ~HostThreads();
  HostThreads(const HostThreads&) = delete;
  HostThreads& operator=(const HostThreads&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Calls work(part, begin, end) on contiguous parts of [0, n), one per thread (the caller takes
  // part 0), and returns when all are done. part < size(); n below grain items per thread runs as
  // part 0 alone, and so does a call made from inside a part (no nesting). One caller at a time.
  // Part bounds are multiples of `align` items: 16 for floats (no shared cache line), 1 for
  // items that are rows, column blocks or matrices.
  using Work = std::function<void(std::size_t part, std::size_t begin, std::size_t end)>;
  void run(std::size_t n, const Work& work, std::size_t grain = 4096, std::size_t align = 16);

  // The process's pool: sized by set_threads_per_rank(), else from the environment on first use.
  static HostThreads& shared();
  // Resizes the shared pool (call before kernels run, from the main thread).
  static void resize_shared(int threads);

  // The team every pool's jobs run on from now on (call from the main thread, outside jobs).
  // openmp in a build without OpenMP (openmp_available() false) leaves it own.
  static void set_team(HostTeam team);
  static HostTeam team();
  static bool openmp_available();

 private:
  void run_on_openmp(std::size_t parts, std::size_t n, const Work& work, std::size_t align);
  void work(int index);
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const Work* job_ = nullptr;
  std::size_t n_ = 0, align_ = 16;
  unsigned generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

// Cores this process may run on (its CPU affinity mask, which Slurm and mpirun bindings narrow).
int available_cores();

struct ThreadPlan {
  int cores = 1;          // available_cores()
  int local_ranks = 1;    // ranks sharing this node
  int threads = 1;        // BLAS threads and host threads per rank
  int node_cores = 1;     // cores the node's ranks run on together (see set_threads_per_rank)
  std::string source;     // "cores / ranks", or the environment variable that set it
  bool pinned = false;    // pinned round-robin to the node's cores (pins_ranks_to_cores)
  // More threads on the node than cores (mpirun --oversubscribe): ranks take turns on the cores.
  bool oversubscribed() const { return local_ranks * threads > node_cores; }
  // Nodes of a run of `world` ranks, all with this many ranks.
  int nodes(int world) const { return local_ranks > 0 && world > local_ranks ? world / local_ranks : 1; }
};
// Decides the threads per rank (one place for BLAS and host loops): COLOSSAL_HOST_THREADS, else
// OPENBLAS_NUM_THREADS, else the cores the rank is bound to, else max(1, cores / local_ranks);
// applies it to OpenBLAS and the shared pool. `node_cores`: the cores of the node's ranks together
// (the union of their affinity masks). Ranks bound to a subset whose masks overlap (one taskset
// for all) split that union instead. 0: unknown, taken as local_ranks x cores when bound (disjoint
// bindings) and as cores otherwise.
// `pinned`: this rank was pinned to one core by colossal (pins_ranks_to_cores).
ThreadPlan set_threads_per_rank(int local_ranks, int node_cores = 0, bool pinned = false);
// Whether colossal pins a node's `local_ranks` ranks round-robin to its `node_cores` cores
// (apps/cli.cpp, when they were started unbound): they outnumber the cores and divide evenly over
// them, each runs one thread (COLOSSAL_HOST_THREADS / OPENBLAS_NUM_THREADS may ask for more), and
// COLOSSAL_PIN_RANKS is not 0. The planner assumes it (planner::pinned_step).
bool pins_ranks_to_cores(int local_ranks, int node_cores);
// The last decision of set_threads_per_rank (before any: this process alone on its cores, with
// the shared pool's threads).
ThreadPlan current_thread_plan();

// True when kernels run on the host's Serial backend, where HostThreads adds the parallelism.
constexpr bool kSerialHost = std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::Serial>;

}  // namespace colossal::core
