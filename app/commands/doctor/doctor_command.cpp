#include "app/commands/doctor/doctor_command.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "app/commands/doctor/doctor_collectives.h"
#include "app/commands/doctor/doctor_report.h"
#include "app/common/build_info.h"
#include "app/common/cli.h"
#include "app/common/system_info.h"
#include "app/config/config.h"
#include "app/run/datasets.h"
#include "app/run/device_setup.h"
#include "dist/process_env.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

const char* kDoctorUsage =
    "usage: trainer doctor [CONFIG] [--set section.key=value ...]\n\n"
    "Checks this machine (and CONFIG, when given) before a run and prints one PASS / WARN / FAIL line per\n"
    "check, with a HINT for what to do: build, CPU and OpenBLAS kernels, GPUs and driver (CUDA builds),\n"
    "CUDA_VISIBLE_DEVICES and NCCL_* variables, the peer-to-peer matrix of the GPUs, a collective smoke\n"
    "test (an all-reduce whose result is checked, with its bus bandwidth at a few sizes: NCCL across every\n"
    "visible GPU when there are 2 or more, else the CPU communicator between 2 local ranks; it gives up\n"
    "after 60 s), launcher variables (RANK, WORLD_SIZE, ... / SLURM / OpenMPI) and MASTER_PORT; with\n"
    "CONFIG: the config loads, the dataset opens, the device is usable, the run directory is writable\n"
    "with at least 1 GiB free, and the metrics ports are free. SKIP marks a check this machine cannot run.\n"
    "Exit status 0 when nothing FAILs, 1 otherwise.\n";

using Report = DoctorReport;

// Whether `port` can be bound on 127.0.0.1 now; errno-style reason otherwise.
std::string port_problem(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::strerror(errno);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  const int err = errno;
  ::close(fd);
  if (rc == 0) return "";
  return err == EADDRINUSE ? "in use" : std::strerror(err);
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

void check_machine(Report& r, const SystemInfo& s) {
  r.pass("build", trainer_build().str());
  r.pass("cpu", std::to_string(s.cpu_cores) + " cores, " +
                    (s.cpu_model.empty() ? "unknown model" : s.cpu_model) +
                    (s.avx512 ? ", AVX-512"
                     : s.avx2 ? ", AVX2"
                              : ""));
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  const bool generic = s.blas_core == "Prescott" || s.blas_core == "prescott";
  if (generic && (s.avx512 || s.avx2) && !coretype)
    r.warn("openblas",
           "kernels " + s.blas_core + " (generic) on a CPU with " + (s.avx512 ? "AVX-512" : "AVX2"),
           std::string("export OPENBLAS_CORETYPE=") + (s.avx512 ? "SkylakeX" : "Haswell") +
               " (about 5x faster sgemm); `trainer train` sets it itself by re-executing");
  else if (std::getenv("TRAINER_BLAS_REEXEC") && coretype)
    r.pass("openblas", "kernels " + s.blas_core + " (OPENBLAS_CORETYPE=" + coretype +
                           " set by trainer: the library fell back to its generic kernels)");
  else
    r.pass("openblas",
           "kernels " + s.blas_core + (coretype ? std::string(" (OPENBLAS_CORETYPE=") + coretype + ")" : ""));

  if (!s.cuda_build) {
    r.pass("gpu", "CPU-only build (no CUDA backend); CUDA_VISIBLE_DEVICES " + s.cuda_visible_devices);
  } else if (s.gpus.empty()) {
    r.warn("gpu",
           "no GPU visible (driver " + (s.cuda_driver_version.empty() ? "absent" : s.cuda_driver_version) +
               ", CUDA_VISIBLE_DEVICES " + s.cuda_visible_devices + ")",
           "check nvidia-smi and CUDA_VISIBLE_DEVICES; training runs on the CPU with train.device = auto");
  } else {
    std::string names;
    for (const GpuInfo& g : s.gpus)
      names += (names.empty() ? "" : "; ") + std::to_string(g.index) + ": " + g.name + " " +
               gib(static_cast<double>(g.total_memory_bytes)) + " sm_" + std::to_string(g.compute_major) +
               std::to_string(g.compute_minor);
    r.pass("gpu", std::to_string(s.gpus.size()) + " visible (" + names + "), driver CUDA " +
                      s.cuda_driver_version + ", runtime " + s.cuda_runtime_version + ", NCCL " +
                      (s.nccl_runtime_version.empty() ? "unknown" : s.nccl_runtime_version) +
                      ", CUDA_VISIBLE_DEVICES " + s.cuda_visible_devices);
  }
  std::string nccl;
  std::string nvls;
  for (const auto& [k, v] : s.nccl_env) {
    nccl += (nccl.empty() ? "" : " ") + k + "=" + v;
    if (k == "NCCL_NVLS_ENABLE") nvls = v;
  }
  if (s.gpus.size() > 1 && nvls != "0")
    r.warn("nccl env", nccl.empty() ? "no NCCL_* variable set" : nccl,
           "on multi-GPU hosts lent here NVLink multicast must stay off: export NCCL_NVLS_ENABLE=0");
  else
    r.pass("nccl env", nccl.empty() ? "no NCCL_* variable set" : nccl);
}

ProcessEnv check_launcher(Report& r) {
  ProcessEnv env;
  try {
    env = process_env();
    r.pass("launcher", env.describe());
    for (const std::string& n : env.notes)
      r.warn("launcher", n, "set the variable explicitly if that is wrong");
  } catch (const std::exception& e) {
    r.fail("launcher", e.what(), "fix or unset the launcher variables (RANK, WORLD_SIZE, LOCAL_RANK, ...)");
    return env;
  }
  // Only rank 0 serves the store; a single process uses no port at all.
  if (env.distributed() && env.rank == 0) {
    const std::string why = port_problem(env.store_port);
    if (why.empty())
      r.pass("master port", std::to_string(env.store_port) + " free (" + env.store_port_source + ")");
    else
      r.fail("master port", std::to_string(env.store_port) + " " + why + " (" + env.store_port_source + ")",
             "another job listens there: choose another MASTER_PORT (trainer launch --master-port)");
  } else if (!env.distributed()) {
    const std::string why = port_problem(29500);
    if (why.empty())
      r.pass("master port", "29500 (trainer launch's default) free");
    else
      r.warn("master port", "29500 (trainer launch's default) " + why,
             "pass --master-port PORT to trainer launch");
  }
  return env;
}

// The nearest existing directory at or above `p`.
fs::path existing_ancestor(fs::path p) {
  p = fs::absolute(p);
  while (!p.empty() && !fs::exists(p) && p != p.parent_path()) p = p.parent_path();
  return p;
}

void check_writable_dir(Report& r, const std::string& what, const fs::path& dir) {
  const fs::path base = existing_ancestor(dir);
  const fs::path probe = base / (".trainer_doctor_" + std::to_string(::getpid()));
  bool ok = false;
  {
    std::ofstream f(probe);
    ok = static_cast<bool>(f << "x");
  }
  std::error_code ec;
  fs::remove(probe, ec);
  if (!ok) {
    r.fail(what, dir.string() + ": cannot write in " + base.string(),
           "choose a writable directory (train.run_dir / checkpoint.dir) or fix its permissions");
    return;
  }
  struct statvfs st {};
  if (::statvfs(base.c_str(), &st) != 0) {
    r.warn(what, dir.string() + " writable; free space unknown (" + std::strerror(errno) + ")", "");
    return;
  }
  const double free_bytes = static_cast<double>(st.f_bavail) * st.f_frsize;
  const std::string detail = dir.string() + " writable, " + gib(free_bytes) + " free";
  if (free_bytes < 1024.0 * 1024 * 1024)
    r.warn(what, detail, "checkpoints and logs need room: free space or point the directory elsewhere");
  else
    r.pass(what, detail);
}

void check_config(Report& r, const std::string& path, const std::vector<std::string>& overrides,
                  const ProcessEnv& env) {
  Config config;
  try {
    config = load_config(path, overrides);
    r.pass("config", path + " loads (model " + config.model.name + ", dataset " + config.data.dataset + ")");
  } catch (const std::exception& e) {
    r.fail("config", e.what(),
           "`trainer config " + path + "` shows every key; configs/reference.toml documents them");
    return;
  }
  try {
    const Datasets d = open_datasets(config, env.local_world_size);
    r.pass("dataset", d.train->fingerprint() + "; test " + std::to_string(d.test->size()) + " images");
  } catch (const std::exception& e) {
    r.fail("dataset", e.what(), "fix data.root / data.dataset, or benchmark with data.dataset = synthetic");
  }
  try {
    const Device device = setup_device(config, env.local_rank).device;  // checks the precision too
    r.pass("device", device.str() + ", precision " + std::string(precision_name(config.train.precision)));
  } catch (const std::exception& e) {
    r.fail("device", e.what(), "set train.device / train.precision to what this machine has");
  }
  const fs::path run_dir = config.train.run_dir.empty()
                               ? fs::path(default_run_dir(config, std::time(nullptr)))
                               : fs::path(config.train.run_dir);
  check_writable_dir(r, "run dir", run_dir);
  if (!config.checkpoint.dir.empty()) check_writable_dir(r, "checkpoint dir", config.checkpoint.dir);
  if (config.metrics.port > 0) {
    const int ranks = std::max(1, env.local_world_size);
    std::string busy;
    for (int i = 0; i < ranks; ++i) {
      const std::string why = port_problem(config.metrics.port + i);
      if (!why.empty())
        busy += (busy.empty() ? "" : ", ") + std::to_string(config.metrics.port + i) + " " + why;
    }
    const std::string range = std::to_string(config.metrics.port) +
                              (ranks > 1 ? "-" + std::to_string(config.metrics.port + ranks - 1) : "");
    if (busy.empty())
      r.pass("metrics port", range + " free");
    else
      r.fail("metrics port", busy,
             "set metrics.port to another base port (rank r uses metrics.port + LOCAL_RANK), "
             "or 0 to turn the exporter off");
  } else {
    r.pass("metrics port", "exporter off (metrics.port = 0)");
  }
}

}  // namespace

int doctor_command(const std::vector<std::string>& args) {
  std::string config_path;
  std::vector<std::string> overrides;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::cout << kDoctorUsage;
      return 0;
    }
    if (a == "--set") {
      if (i + 1 >= args.size()) throw UsageError("--set needs a value");
      overrides.push_back(set_override(args[++i]));
    } else if (a.rfind("--set=", 0) == 0) {
      overrides.push_back(set_override(a.substr(6)));
    } else if (a.rfind("-", 0) == 0) {
      throw UsageError("unknown option " + a);
    } else if (config_path.empty()) {
      config_path = a;
    } else {
      throw UsageError("unexpected argument '" + a + "'");
    }
  }
  Report r;
  const SystemInfo sys = system_info();
  check_machine(r, sys);
  check_peer_topology(r, sys);
  check_collectives(r, sys, std::chrono::seconds(60));
  const ProcessEnv env = check_launcher(r);
  if (!config_path.empty()) check_config(r, config_path, overrides, env);
  std::printf("%s\n", r.failures() ? (std::to_string(r.failures()) + " check(s) FAILED").c_str()
                                   : "all checks passed");
  return r.failures() ? 1 : 0;
}

}  // namespace trainer
