// What the programs read from Slurm's and the MPI launcher's environment: the job description,
// the run directory suffix, the local rank and the GPU it selects.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>

#include "apps/launch_env.hpp"
#include "parallel/local_device.hpp"

namespace colossal::apps {
namespace {

std::function<const char*(const char*)> env_of(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(SlurmEnv, RunDirectoryIsSuffixedWithTheJobOrArrayTask) {
  const SlurmEnv none = read_slurm_env(env_of({}));
  EXPECT_FALSE(none.in_job());
  EXPECT_EQ(slurm_run_dir("runs/q", none), "runs/q");
  const SlurmEnv job = read_slurm_env(env_of({{"SLURM_JOB_ID", "1234"}, {"SLURM_JOB_NAME", "q"},
                                              {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "1"},
                                              {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_NTASKS", "8"},
                                              {"SLURM_LOCALID", "1"}, {"SLURMD_NODENAME", "n1"},
                                              {"SLURM_NODEID", "0"}, {"SLURM_JOB_NUM_NODES", "1"}}));
  EXPECT_EQ(slurm_run_dir("runs/q/", job), "runs/q-1234");
  EXPECT_EQ(job.describe(), "job 1234 'q', step 0, restart 0; node n1 (0 of 1); task 1 of 2, local id 1");
  const SlurmEnv task = read_slurm_env(env_of({{"SLURM_JOB_ID", "1237"},
                                               {"SLURM_ARRAY_JOB_ID", "1234"},
                                               {"SLURM_ARRAY_TASK_ID", "3"},
                                               {"SLURM_RESTART_COUNT", "2"}}));
  EXPECT_EQ(slurm_run_dir("runs/q", task), "runs/q-1234_3");
  EXPECT_EQ(task.describe(), "job 1237 (array 1234_3), step none (not started by srun), restart 2; node ?");
}

TEST(LocalDevice, LauncherLocalRankModuloDevices) {
  using parallel::local_rank_from_env;
  EXPECT_EQ(local_rank_from_env(env_of({})).rank, -1);
  // mpirun's variable first: mpirun inside an sbatch job hands every rank SLURM_LOCALID=0.
  auto lr =
      local_rank_from_env(env_of({{"SLURM_LOCALID", "0"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}));
  EXPECT_EQ(lr.rank, 1);
  EXPECT_EQ(lr.source, "OMPI_COMM_WORLD_LOCAL_RANK");
  lr = local_rank_from_env(env_of({{"SLURM_LOCALID", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "x"}}));
  EXPECT_EQ(lr.rank, 3);
  EXPECT_EQ(lr.source, "SLURM_LOCALID");
  lr = local_rank_from_env(env_of({{"SLURM_LOCALID", "3"}, {"MPI_LOCALRANKID", "2"}}));
  EXPECT_EQ(lr.rank, 2);
  EXPECT_EQ(lr.source, "MPI_LOCALRANKID");
  EXPECT_EQ(parallel::device_for(5, 4), 1);
  EXPECT_EQ(parallel::device_for(3, 1), 0);
  EXPECT_EQ(parallel::device_for(0, 0), -1);
}

}  // namespace
}  // namespace colossal::apps
