// What Slurm tells a task about where it runs (job, array task, step, node, task), for the
// start-up log and for naming the run directory of a job.
#pragma once

#include <functional>
#include <string>

namespace colossal::apps {

struct SlurmEnv {
  std::string job_id;         // SLURM_JOB_ID; empty outside Slurm
  std::string job_name;       // SLURM_JOB_NAME
  std::string array_job_id;   // SLURM_ARRAY_JOB_ID (array tasks only)
  std::string array_task_id;  // SLURM_ARRAY_TASK_ID
  std::string step_id;        // SLURM_STEP_ID ("batch" steps have none)
  std::string restart_count;  // SLURM_RESTART_COUNT (set after a requeue)
  std::string node_name;      // SLURMD_NODENAME
  std::string node_list;      // SLURM_JOB_NODELIST
  std::string node_id;        // SLURM_NODEID
  std::string nnodes;         // SLURM_JOB_NUM_NODES
  std::string proc_id;        // SLURM_PROCID
  std::string ntasks;         // SLURM_NTASKS (SLURM_STEP_NUM_TASKS inside a step)
  std::string local_id;       // SLURM_LOCALID
  std::string gpus;           // CUDA_VISIBLE_DEVICES as Slurm left it

  bool in_job() const { return !job_id.empty(); }
  // How the run directory is suffixed: "<array job id>_<array task id>" for an array task (as
  // Slurm's %A_%a), else "<job id>"; "" outside Slurm. Stable across requeues.
  std::string run_suffix() const;
  // One line: "job 12 (array 10_2) 'name', step 0, restart 0; node n1 (1 of 2: n[1-2]); task 3
  // of 4, local id 1".
  std::string describe() const;
};

// From the environment (`get` replaces std::getenv in tests).
SlurmEnv read_slurm_env(const std::function<const char*(const char*)>& get = {});

// The run directory of a Slurm job whose log.dir was not given with --set: "<log.dir>-<suffix>",
// e.g. runs/quickstart-1234 or runs/quickstart-1230_2 (a trailing '/' of log.dir is dropped).
// Unchanged outside Slurm.
std::string slurm_run_dir(const std::string& log_dir, const SlurmEnv& env);

}  // namespace colossal::apps
