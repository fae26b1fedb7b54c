#include "apps/launch_env.hpp"

#include <cstdlib>

namespace colossal::apps {

SlurmEnv read_slurm_env(const std::function<const char*(const char*)>& get) {
  auto var = [&](const char* name) {
    const char* v = get ? get(name) : std::getenv(name);
    return std::string(v ? v : "");
  };
  SlurmEnv e;
  e.job_id = var("SLURM_JOB_ID");
  if (e.job_id.empty()) e.job_id = var("SLURM_JOBID");
  e.job_name = var("SLURM_JOB_NAME");
  e.array_job_id = var("SLURM_ARRAY_JOB_ID");
  e.array_task_id = var("SLURM_ARRAY_TASK_ID");
  e.step_id = var("SLURM_STEP_ID");
  e.restart_count = var("SLURM_RESTART_COUNT");
  e.node_name = var("SLURMD_NODENAME");
  e.node_list = var("SLURM_JOB_NODELIST");
  e.node_id = var("SLURM_NODEID");
  e.nnodes = var("SLURM_JOB_NUM_NODES");
  e.proc_id = var("SLURM_PROCID");
  e.ntasks = var("SLURM_STEP_NUM_TASKS");
  if (e.ntasks.empty()) e.ntasks = var("SLURM_NTASKS");
  e.local_id = var("SLURM_LOCALID");
  e.gpus = var("CUDA_VISIBLE_DEVICES");
  return e;
}

std::string SlurmEnv::run_suffix() const {
  if (!in_job()) return "";
  if (!array_job_id.empty() && !array_task_id.empty()) return array_job_id + "_" + array_task_id;
  return job_id;
}

std::string SlurmEnv::describe() const {
  if (!in_job()) return "not in a Slurm job";
  auto or_unknown = [](const std::string& s) { return s.empty() ? std::string("?") : s; };
  std::string out = "job " + job_id;
  if (!array_job_id.empty()) out += " (array " + array_job_id + "_" + array_task_id + ")";
  if (!job_name.empty()) out += " '" + job_name + "'";
  out += ", step " + (step_id.empty() ? std::string("none (not started by srun)") : step_id);
  out += ", restart " + (restart_count.empty() ? std::string("0") : restart_count);
  out += "; node " + or_unknown(node_name);
  if (!node_id.empty() || !nnodes.empty()) {
    std::string index = node_id.empty() ? "?" : node_id;
    out += " (" + index + " of " + or_unknown(nnodes) + (node_list.empty() ? "" : ": " + node_list) +
           ")";
  }
  if (!proc_id.empty() || !ntasks.empty()) {
    out += "; task " + or_unknown(proc_id) + " of " + or_unknown(ntasks);
  }
  if (!local_id.empty()) out += ", local id " + local_id;
  if (!gpus.empty()) out += "; CUDA_VISIBLE_DEVICES=" + gpus;
  return out;
}

std::string slurm_run_dir(const std::string& log_dir, const SlurmEnv& env) {
  const std::string suffix = env.run_suffix();
  if (suffix.empty()) return log_dir;
  std::string dir = log_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (dir.empty()) dir = "runs/colossal";
  return dir + "-" + suffix;
}

}  // namespace colossal::apps
