#include "dist/process_env.h"

#include <gtest/gtest.h>

#include "dist/error.h"

namespace trainer {
namespace {

std::string error_of(const EnvMap& env) {
  try {
    process_env_from(env);
  } catch (const DistError& e) {
    return e.what();
  }
  return "";
}

TEST(ProcessEnv, NoLauncherIsASingleProcess) {
  const ProcessEnv p = process_env_from({{"HOME", "/root"}});
  EXPECT_EQ(p.launcher, "single");
  EXPECT_EQ(p.rank, 0);
  EXPECT_EQ(p.world_size, 1);
  EXPECT_EQ(p.local_world_size, 1);
  EXPECT_FALSE(p.distributed());
}

TEST(ProcessEnv, Torchrun) {
  const ProcessEnv p = process_env_from({{"RANK", "5"},
                                         {"WORLD_SIZE", "8"},
                                         {"LOCAL_RANK", "1"},
                                         {"LOCAL_WORLD_SIZE", "4"},
                                         {"MASTER_ADDR", "node01"},
                                         {"MASTER_PORT", "29500"},
                                         {"TORCHELASTIC_RUN_ID", "job7"}});
  EXPECT_EQ(p.launcher, "torchrun");
  EXPECT_EQ(p.rank, 5);
  EXPECT_EQ(p.world_size, 8);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.local_world_size, 4);
  EXPECT_EQ(p.master_addr, "node01");
  EXPECT_EQ(p.master_port, 29500);
  // torchrun's agent serves its own store on MASTER_PORT: ours goes next to it.
  EXPECT_EQ(p.store_port, 29501);
  EXPECT_EQ(p.job_id, "job7");
  EXPECT_TRUE(p.notes.empty());
  EXPECT_NE(p.describe().find("rank 5/8 (local 1/4) via torchrun"), std::string::npos) << p.describe();
}

TEST(ProcessEnv, VariablesSetByHandServeOnMasterPort) {
  const ProcessEnv p = process_env_from(
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(p.store_port, 1234);
  EXPECT_EQ(p.local_rank, 1);  // assumed: one node
  EXPECT_EQ(p.local_world_size, 2);
  EXPECT_EQ(p.notes.size(), 2u);
}

TEST(ProcessEnv, StorePortOverride) {
  const ProcessEnv p = process_env_from({{"RANK", "0"},
                                         {"WORLD_SIZE", "2"},
                                         {"MASTER_ADDR", "h"},
                                         {"MASTER_PORT", "29500"},
                                         {"TORCHELASTIC_RUN_ID", "x"},
                                         {"TRAINER_STORE_PORT", "40000"}});
  EXPECT_EQ(p.store_port, 40000);
  EXPECT_EQ(p.store_port_source, "TRAINER_STORE_PORT");
}

TEST(ProcessEnv, TorchrunErrorsNameTheVariable) {
  const EnvMap base{
      {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
  auto with = [&](EnvMap extra) {
    EnvMap env = base;
    for (auto& [k, v] : extra) env[k] = v;
    return error_of(env);
  };
  std::string e = with({{"RANK", "4"}, {"LOCAL_RANK", "0"}});
  EXPECT_NE(e.find("RANK=4 is not below WORLD_SIZE=4"), std::string::npos) << e;
  EXPECT_NE(e.find("HINT"), std::string::npos) << e;
  e = with({{"RANK", "1"}, {"LOCAL_RANK", "4"}});
  EXPECT_NE(e.find("LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"), std::string::npos) << e;
  e = with({{"RANK", "abc"}, {"LOCAL_RANK", "0"}});
  EXPECT_NE(e.find("RANK='abc' is not a non-negative integer"), std::string::npos) << e;
  e = with({{"RANK", "-1"}, {"LOCAL_RANK", "0"}});
  EXPECT_NE(e.find("RANK='-1'"), std::string::npos) << e;
  e = with({{"RANK", "0"}, {"LOCAL_RANK", "0"}, {"MASTER_PORT", "70000"}});
  EXPECT_NE(e.find("MASTER_PORT=70000 is not a TCP port"), std::string::npos) << e;
  e = with({{"RANK", "0"}, {"LOCAL_RANK", "0"}, {"WORLD_SIZE", "0"}});
  EXPECT_NE(e.find("WORLD_SIZE=0"), std::string::npos) << e;
  e = error_of({{"RANK", "0"}});
  EXPECT_NE(e.find("RANK is set but WORLD_SIZE is not set"), std::string::npos) << e;
  e = error_of({{"WORLD_SIZE", "2"}});
  EXPECT_NE(e.find("WORLD_SIZE is set but RANK is not set"), std::string::npos) << e;
  e = error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}});
  EXPECT_NE(e.find("WORLD_SIZE=2 but MASTER_ADDR is not set"), std::string::npos) << e;
  e = error_of({{"RANK", "0"},
                {"WORLD_SIZE", "8"},
                {"LOCAL_WORLD_SIZE", "16"},
                {"MASTER_ADDR", "h"},
                {"MASTER_PORT", "1"}});
  EXPECT_NE(e.find("LOCAL_WORLD_SIZE=16 exceeds WORLD_SIZE=8"), std::string::npos) << e;
  // A world of one needs no master.
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}}), "");
}

TEST(ProcessEnv, Slurm) {
  const ProcessEnv p = process_env_from({{"SLURM_PROCID", "5"},
                                         {"SLURM_NTASKS", "8"},
                                         {"SLURM_LOCALID", "1"},
                                         {"SLURM_NTASKS_PER_NODE", "4"},
                                         {"SLURM_JOB_ID", "123456"},
                                         {"SLURM_JOB_NODELIST", "gpu[07-08]"}});
  EXPECT_EQ(p.launcher, "slurm");
  EXPECT_EQ(p.rank, 5);
  EXPECT_EQ(p.world_size, 8);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.local_world_size, 4);
  EXPECT_EQ(p.master_addr, "gpu07");
  EXPECT_EQ(p.master_port, 15000 + 123456 % 20000);  // per-job port: two jobs on a node do not collide
  EXPECT_EQ(p.job_id, "123456.");
  EXPECT_EQ(p.store_port, p.master_port);
}

TEST(ProcessEnv, SlurmStepVariablesAndTaskListFormat) {
  const ProcessEnv p = process_env_from({{"SLURM_PROCID", "10"},
                                         {"SLURM_NTASKS", "64"},  // the job's; the step is smaller
                                         {"SLURM_STEP_NUM_TASKS", "11"},
                                         {"SLURM_LOCALID", "2"},
                                         {"SLURM_NODEID", "2"},
                                         {"SLURM_STEP_TASKS_PER_NODE", "4(x2),3"},
                                         {"SLURM_STEP_NODELIST", "a-[3,5-6]"},
                                         {"SLURM_JOB_NODELIST", "b[1-9]"},
                                         {"MASTER_PORT", "4000"}});
  EXPECT_EQ(p.world_size, 11);
  EXPECT_EQ(p.local_world_size, 3);
  EXPECT_EQ(p.master_addr, "a-3");  // the step's first node, not the job's
  EXPECT_EQ(p.master_port, 4000);
}

TEST(ProcessEnv, SlurmMasterAddrOverridesTheNodeList) {
  const ProcessEnv p = process_env_from({{"SLURM_PROCID", "0"},
                                         {"SLURM_NTASKS", "2"},
                                         {"SLURM_LOCALID", "0"},
                                         {"SLURM_NTASKS_PER_NODE", "2"},
                                         {"SLURM_JOB_NODELIST", "n[1-2]"},
                                         {"MASTER_ADDR", "10.0.0.9"}});
  EXPECT_EQ(p.master_addr, "10.0.0.9");
}

TEST(ProcessEnv, SlurmErrors) {
  std::string e = error_of({{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}});
  EXPECT_NE(e.find("SLURM_NTASKS is not set"), std::string::npos) << e;
  EXPECT_NE(e.find("srun"), std::string::npos) << e;
  e = error_of({{"SLURM_PROCID", "4"},
                {"SLURM_NTASKS", "4"},
                {"SLURM_LOCALID", "0"},
                {"SLURM_NTASKS_PER_NODE", "4"},
                {"SLURM_JOB_NODELIST", "n1"}});
  EXPECT_NE(e.find("SLURM_PROCID=4 is not below SLURM_NTASKS=4"), std::string::npos) << e;
  e = error_of({{"SLURM_PROCID", "1"},
                {"SLURM_NTASKS", "4"},
                {"SLURM_LOCALID", "2"},
                {"SLURM_NTASKS_PER_NODE", "2"},
                {"SLURM_JOB_NODELIST", "n1"}});
  EXPECT_NE(e.find("SLURM_LOCALID=2 is not below SLURM_NTASKS_PER_NODE=2"), std::string::npos) << e;
  e = error_of(
      {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS_PER_NODE", "2"}});
  EXPECT_NE(e.find("MASTER_ADDR"), std::string::npos) << e;
  e = error_of({{"SLURM_PROCID", "1"},
                {"SLURM_NTASKS", "4"},
                {"SLURM_LOCALID", "0"},
                {"SLURM_NTASKS_PER_NODE", "2"},
                {"SLURM_JOB_NODELIST", "n[1-"}});
  EXPECT_NE(e.find("SLURM_JOB_NODELIST"), std::string::npos) << e;
}

TEST(ProcessEnv, OpenMpi) {
  const EnvMap base{{"OMPI_COMM_WORLD_RANK", "3"},
                    {"OMPI_COMM_WORLD_SIZE", "4"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  std::string e = error_of(base);
  EXPECT_NE(e.find("MASTER_ADDR is not set"), std::string::npos) << e;
  EXPECT_NE(e.find("mpirun"), std::string::npos) << e;
  EnvMap env = base;
  env["MASTER_ADDR"] = "host0";
  const ProcessEnv p = process_env_from(env);
  EXPECT_EQ(p.launcher, "openmpi");
  EXPECT_EQ(p.rank, 3);
  EXPECT_EQ(p.world_size, 4);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.local_world_size, 2);
  EXPECT_EQ(p.master_addr, "host0");
  EXPECT_EQ(p.master_port, 29500);
  env["OMPI_COMM_WORLD_LOCAL_SIZE"] = "x";
  e = error_of(env);
  EXPECT_NE(e.find("OMPI_COMM_WORLD_LOCAL_SIZE='x'"), std::string::npos) << e;
}

TEST(SlurmNodeList, Expands) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_nodelist("node[01-04]"), (V{"node01", "node02", "node03", "node04"}));
  EXPECT_EQ(expand_slurm_nodelist("node[01-02,07],login"), (V{"node01", "node02", "node07", "login"}));
  EXPECT_EQ(expand_slurm_nodelist("gpu-a100-[009-011]"), (V{"gpu-a100-009", "gpu-a100-010", "gpu-a100-011"}));
  EXPECT_EQ(expand_slurm_nodelist("r[1-2]n[3-4]"), (V{"r1n3", "r1n4", "r2n3", "r2n4"}));
  EXPECT_EQ(expand_slurm_nodelist("a[8-11].cluster"),
            (V{"a8.cluster", "a9.cluster", "a10.cluster", "a11.cluster"}));
  EXPECT_EQ(expand_slurm_nodelist("single"), (V{"single"}));
  EXPECT_EQ(expand_slurm_nodelist(""), V{});
  EXPECT_THROW(expand_slurm_nodelist("node[01-"), DistError);
  EXPECT_THROW(expand_slurm_nodelist("node[3-1]"), DistError);
  EXPECT_THROW(expand_slurm_nodelist("node[a-b]"), DistError);
  EXPECT_THROW(expand_slurm_nodelist("node]"), DistError);
}

}  // namespace
}  // namespace trainer
