#include "app/commands/bench/bench_runs.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "app/common/c_string_array.h"
#include "app/common/chart_png.h"

extern char** environ;

namespace trainer::bench {
namespace {

namespace fs = std::filesystem;

// A TCP port nothing listens on now, for one run's rendezvous store (concurrent benches and tests
// must not meet on 29500).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 29500;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 29500;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

std::string self_executable() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "/proc/self/exe";
}

std::string last_lines(const fs::path& path, size_t n) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::string out;
  for (size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i)
    out += "  " + lines[i] + "\n";
  return out;
}

// Runs this binary with `args`, stdout and stderr into `log`; returns the wait status.
int run_self(const std::vector<std::string>& args, const fs::path& log) {
  const std::string exe = self_executable();
  std::vector<std::string> argv_s{exe};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  CStringArray argv(std::move(argv_s));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("bench: cannot start " + exe + ": " + std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

}  // namespace

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::map<std::string, std::vector<double>> read_step_times(const fs::path& path, int warmup) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("bench: " + path.string() + " is missing: the run wrote no step times");
  std::string line;
  std::getline(in, line);
  const std::vector<std::string> header = split_list(line);
  std::map<std::string, std::vector<double>> cols;
  while (std::getline(in, line)) {
    const std::vector<std::string> cells = split_list(line);
    if (cells.size() != header.size() || std::atoll(cells[0].c_str()) <= warmup) continue;
    for (size_t i = 0; i < cells.size(); ++i) cols[header[i]].push_back(std::atof(cells[i].c_str()));
  }
  return cols;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

double sum_of(const std::vector<double>& v) { return mean_of(v) * static_cast<double>(v.size()); }

nlohmann::ordered_json environment_json(const SystemInfo& s, const TrainerBuild& b) {
  nlohmann::ordered_json j;
  j["build"] = b.str();
  j["version"] = b.version;
  j["cuda_version"] = b.cuda_version;
  j["cudnn_version"] = b.cudnn_version;
  j["nccl_version"] = b.nccl_version;
  j["hostname"] = s.hostname;
  j["cpu_model"] = s.cpu_model;
  j["cpu_cores"] = s.cpu_cores;
  j["blas_core"] = s.blas_core;
  j["nccl_runtime_version"] = s.nccl_runtime_version;
  j["cuda_driver_version"] = s.cuda_driver_version;
  j["cuda_visible_devices"] = s.cuda_visible_devices;
  j["gpus"] = nlohmann::ordered_json::array();
  for (const GpuInfo& gpu : s.gpus)
    j["gpus"].push_back({{"index", gpu.index}, {"name", gpu.name}, {"memory_bytes", gpu.total_memory_bytes}});
  j["nccl_env"] = nlohmann::ordered_json::object();
  for (const auto& [name, value] : s.nccl_env) j["nccl_env"][name] = value;
  return j;
}

void write_bench_json(const fs::path& out, const BenchArgs& a, const nlohmann::ordered_json& settings,
                      const nlohmann::ordered_json& points) {
  nlohmann::ordered_json j;
  j["config"] = a.config_path;
  j["data"] = a.data;
  j["repeats"] = a.repeats;
  j["overrides"] = a.overrides;
  for (const auto& [key, value] : settings.items()) j[key] = value;
  j["environment"] = environment_json(system_info(), trainer_build());
  j["points"] = points;
  std::ofstream(out / "bench.json") << json_text(j);
}

std::vector<std::string> synthetic_overrides(const Config& c, int64_t samples) {
  std::vector<std::string> o = {"data.dataset=synthetic",
                                "data.synthetic_samples=" + std::to_string(samples)};
  const std::string& d = c.data.dataset;
  if (d == "fashion_mnist") {
    o.push_back("data.synthetic_image_size=28");
    if (c.model.in_channels == 0) o.push_back("model.in_channels=1");
  } else if (d == "cifar10" || d == "cifar100") {
    o.push_back("data.synthetic_image_size=32");
    o.push_back(std::string("data.synthetic_classes=") + (d == "cifar100" ? "100" : "10"));
  } else if (d == "image_folder") {
    o.push_back("data.synthetic_image_size=" +
                std::to_string(c.data.image_size > 0 ? c.data.image_size : 224));
  }
  return o;
}

std::vector<std::string> point_overrides(int batch, const std::string& precision, const fs::path& dir) {
  return {"data.batch_size=" + std::to_string(batch),
          "train.precision=" + precision,
          "train.run_dir=" + fs::absolute(dir).string(),
          "optim.lr_scaling=linear",
          "checkpoint.save_final=false",
          "checkpoint.every_epochs=0",
          "checkpoint.every_steps=0",
          "metrics.port=0"};
}

double run_point(const std::string& config_path, int procs, const std::vector<std::string>& sets,
                 const fs::path& dir) {
  std::vector<std::string> cmd = {
      "launch", "--nproc-per-node", std::to_string(procs), "--master-port", std::to_string(free_port()), "--",
      "train",  config_path};
  for (const std::string& s : sets) {
    cmd.push_back("--set");
    cmd.push_back(s);
  }
  const auto start = std::chrono::steady_clock::now();
  const int status = run_self(cmd, dir / "output.log");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
    throw std::runtime_error(fmt("bench: the run in %s failed (%s %d) after %.1fs; its last lines:\n",
                                 dir.c_str(), WIFEXITED(status) ? "exit status" : "signal",
                                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), secs) +
                             last_lines(dir / "output.log", 8) + "HINT: the whole output is in " +
                             (dir / "output.log").string());
  return secs;
}

double summary_number(const fs::path& path, const std::string& key) {
  const std::string hint = ". HINT: the run ended before writing its summary; see output.log beside it";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("bench: cannot read " + path.string() + hint);
  nlohmann::json summary;
  try {
    summary = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("bench: " + path.string() + " is not valid JSON (" + e.what() + ")" + hint);
  }
  if (!summary.is_object() || !summary.contains(key))
    throw std::runtime_error("bench: " + path.string() + " has no \"" + key + "\"" + hint);
  const nlohmann::json& value = summary[key];
  if (value.is_null()) return std::nan("");  // app/train/summary.cpp writes NaN as null
  if (!value.is_number())
    throw std::runtime_error("bench: " + path.string() + ": \"" + key + "\" is " + value.dump() +
                             ", not a number");
  return value.get<double>();
}

std::string speedup_chart_png(double max_procs, const std::vector<SpeedupCurve>& curves) {
  static const uint8_t colours[][3] = {
      {31, 119, 180}, {214, 39, 40}, {44, 160, 44}, {148, 103, 189}, {255, 127, 14}};
  ChartPanel sp{"speedup", "processes", max_procs, 1.0, true, {}};
  ChartPanel ef{"efficiency", "processes", max_procs, 1.2, true, {}};
  sp.series.push_back({{0, sp.x_max}, {0, sp.x_max}, 150, 150, 150, true, false});  // ideal
  ef.series.push_back({{0, ef.x_max}, {1, 1}, 150, 150, 150, true, false});
  size_t k = 0;
  for (const SpeedupCurve& c : curves) {
    const uint8_t* rgb = colours[k++ % 5];
    ChartSeries s{c.procs, c.speedup, rgb[0], rgb[1], rgb[2], false, true};
    ChartSeries e{c.procs, c.efficiency, rgb[0], rgb[1], rgb[2], false, true};
    for (double v : c.speedup) sp.y_max = std::max(sp.y_max, v * 1.1);
    for (double v : c.efficiency) ef.y_max = std::max(ef.y_max, v * 1.1);
    sp.series.push_back(s);
    ef.series.push_back(e);
  }
  sp.y_max = std::max(sp.y_max, sp.x_max);
  return render_chart_png({sp, ef});
}

fs::path fresh_run_dir(const fs::path& out, const GridPoint& p, int repeat) {
  const fs::path dir = out / fmt("p%d-b%d-%s-r%d", p.procs, p.batch, p.precision.c_str(), repeat);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<GridPoint> measurement_grid(const Config& config, const BenchArgs& a,
                                        const std::vector<std::string>& precisions,
                                        const std::vector<int>& batches) {
  std::vector<GridPoint> grid;
  for (const std::string& precision : precisions)
    for (int batch : batches)
      for (int procs : a.procs) {
        GridPoint p;
        p.procs = procs;
        p.batch = batch;
        p.precision = precision;
        p.global_batch = static_cast<int64_t>(batch) * config.train.grad_accum_steps * procs;
        p.lr = config.optim.lr * static_cast<double>(p.global_batch) / config.optim.base_batch_size;
        grid.push_back(p);
      }
  return grid;
}

nlohmann::ordered_json grid_point_json(const GridPoint& p) {
  nlohmann::ordered_json j;
  j["procs"] = p.procs;
  j["batch_per_rank"] = p.batch;
  j["global_batch"] = p.global_batch;
  j["precision"] = p.precision;
  j["lr"] = significant(p.lr, 6);
  return j;
}

void print_run_start(size_t index, size_t count, const GridPoint& p, int repeat, int repeats) {
  std::printf("bench: [%zu/%zu] %d process%s, batch %d/rank, %s, repeat %d/%d ... ", index, count, p.procs,
              p.procs == 1 ? "" : "es", p.batch, p.precision.c_str(), repeat, repeats);
  std::fflush(stdout);
}

void write_chart_file(const std::filesystem::path& path, const std::string& png) {
  std::ofstream(path, std::ios::binary) << png;
}

}  // namespace trainer::bench
