#include "core/host_threads.hpp"

#include <sched.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string_view>

#include "core/gemm.hpp"

namespace colossal::core {

namespace {
// Parts end on multiples of `align` items (16 floats: no two threads write the same cache line).
std::size_t part_bound(std::size_t n, std::size_t k, std::size_t parts, std::size_t align) {
  return k == parts ? n : (n * k / parts) / align * align;
}

// The threads per rank the environment asks for (COLOSSAL_HOST_THREADS, else
// OPENBLAS_NUM_THREADS, when 1 or more; `source` gets the variable's name), else 0.
int threads_requested(const char** source = nullptr) {
  for (const char* name : {"COLOSSAL_HOST_THREADS", "OPENBLAS_NUM_THREADS"}) {
    if (const char* v = std::getenv(name); v != nullptr && std::atoi(v) >= 1) {
      if (source != nullptr) *source = name;
      return std::atoi(v);
    }
  }
  return 0;
}

int threads_from_environment() {
  if (const int n = threads_requested(); n > 0) return n;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}
}  // namespace

HostThreads::HostThreads(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
}

HostThreads::~HostThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
std::unique_ptr<HostThreads>& shared_pool() {
  static std::unique_ptr<HostThreads> pool;
  return pool;
}
}  // namespace

HostThreads& HostThreads::shared() {
  auto& pool = shared_pool();
  if (!pool) pool = std::make_unique<HostThreads>(threads_from_environment());
  return *pool;
}

void HostThreads::resize_shared(int threads) {
  shared_pool() = std::make_unique<HostThreads>(threads < 1 ? 1 : threads);
}

namespace {
std::atomic<HostTeam> g_team{HostTeam::own};
}  // namespace

bool HostThreads::openmp_available() {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

void HostThreads::set_team(HostTeam team) {
  g_team = openmp_available() ? team : HostTeam::own;
}

HostTeam HostThreads::team() { return g_team; }

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

namespace {
std::mutex g_thread_plan_mutex;
std::optional<ThreadPlan> g_thread_plan;
}  // namespace

bool pins_ranks_to_cores(int local_ranks, int node_cores) {
  const char* opt_out = std::getenv("COLOSSAL_PIN_RANKS");
  return threads_requested() <= 1 && node_cores > 0 && local_ranks > node_cores &&
         local_ranks % node_cores == 0 && (opt_out == nullptr || std::string_view(opt_out) != "0");
}

ThreadPlan set_threads_per_rank(int local_ranks, int node_cores, bool pinned) {
  ThreadPlan plan;
  plan.pinned = pinned;
  plan.cores = available_cores();
  plan.local_ranks = std::max(1, local_ranks);
  const unsigned hw = std::thread::hardware_concurrency();
  if (hw > 0 && plan.cores < static_cast<int>(hw)) {
    // Already bound to a subset (mpirun --bind-to core, Slurm cpus-per-task): use all of it.
    plan.threads = plan.cores;
    plan.node_cores = plan.cores * plan.local_ranks;  // bindings assumed disjoint
    plan.source = "the cores this rank is bound to";
    if (node_cores > 0 && node_cores < plan.node_cores) {  // overlapping masks: split their union
      plan.threads = std::max(1, node_cores / plan.local_ranks);
      plan.source = "the cores the node's ranks are bound to / ranks";
    }
  } else {
    plan.threads = std::max(1, plan.cores / plan.local_ranks);
    plan.node_cores = plan.cores;
    plan.source = "cores / ranks on the node";
  }
  const char* requested_by = nullptr;
  if (const int n = threads_requested(&requested_by); n > 0) {
    plan.threads = n;
    plan.source = requested_by;
  }
  if (node_cores > 0) plan.node_cores = node_cores;
  if (pinned) plan.source = "one core each: more ranks than cores, pinned round-robin";
  set_blas_threads(plan.threads);
  HostThreads::resize_shared(plan.threads);
  std::lock_guard lock(g_thread_plan_mutex);
  g_thread_plan = plan;
  return plan;
}

ThreadPlan current_thread_plan() {
  std::lock_guard lock(g_thread_plan_mutex);
  if (g_thread_plan) return *g_thread_plan;
  ThreadPlan plan;
  plan.cores = plan.node_cores = available_cores();
  plan.threads = HostThreads::shared().size();
  plan.source = "this process alone";
  return plan;
}

namespace {
// Set while this thread runs a part of a pool job: a run() from inside one (a kernel called by
// work already spread over the threads) runs inline instead of re-entering the busy pool.
thread_local bool t_in_pool_work = false;

struct InPoolWork {
  InPoolWork() { t_in_pool_work = true; }
  ~InPoolWork() { t_in_pool_work = false; }
};
}  // namespace

void HostThreads::run(std::size_t n, const Work& work, std::size_t grain, std::size_t align) {
  const std::size_t parts = static_cast<std::size_t>(size());
  if (parts == 1 || n < grain * parts || t_in_pool_work) {
    work(0, 0, n);
    return;
  }
  if (g_team == HostTeam::openmp) {
    run_on_openmp(parts, n, work, align < 1 ? 1 : align);
    return;
  }
  const InPoolWork inside;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &work;
    n_ = n;
    align_ = align < 1 ? 1 : align;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  work(0, 0, part_bound(n, 1, parts, align_));
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
}

// The same parts on OpenMP's team (fewer if OpenMP grants fewer threads). An exception leaves
// its part, is kept (the first one) and rethrown here after the region: none may cross it.
void HostThreads::run_on_openmp(std::size_t parts, std::size_t n, const Work& work,
                                std::size_t align) {
#ifdef _OPENMP
  std::exception_ptr error;
  std::mutex error_mutex;
#pragma omp parallel num_threads(static_cast<int>(parts))
  {
    const auto k = static_cast<std::size_t>(omp_get_thread_num());
    const auto team = static_cast<std::size_t>(omp_get_num_threads());
    const InPoolWork inside;
    try {
      work(k, part_bound(n, k, team, align), part_bound(n, k + 1, team, align));
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
#else
  (void)parts;
  (void)align;
  work(0, 0, n);
#endif
}

void HostThreads::work(int index) {
  unsigned seen = 0;
  for (;;) {
    const Work* job;
    std::size_t n, align;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = n_;
      align = align_;
    }
    const std::size_t parts = static_cast<std::size_t>(size());
    {
      const InPoolWork inside;
      (*job)(index, part_bound(n, index, parts, align), part_bound(n, index + 1, parts, align));
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --pending_;
    }
    done_.notify_one();
  }
}

}  // namespace colossal::core
