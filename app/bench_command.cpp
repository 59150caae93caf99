#include "app/bench_command.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>

#include "app/build_info.h"
#include "app/chart_png.h"
#include "app/cli.h"
#include "app/config.h"
#include "app/system_info.h"

extern char** environ;

namespace trainer {
namespace {

namespace fs = std::filesystem;

const char* kBenchUsage =
    "usage: trainer bench CONFIG --procs 1,2,4 [--precisions fp32,tf32] [--batch 128,512]\n"
    "                    [--steps N] [--warmup N] [--repeats R] [--data synthetic|real] [--out DIR]\n"
    "                    [--set section.key=value ...]\n\n"
    "Measures training throughput of CONFIG at each number of local processes (and precision and per-rank\n"
    "batch): every point is `trainer launch --nproc-per-node P -- train CONFIG` with train.max_steps =\n"
    "warmup + steps, evaluation only at the end (not timed), no checkpoints, optim.lr_scaling = linear and\n"
    "its own train.run_dir under the bench directory. Rank 0's step_times.csv gives the steady-state step\n"
    "time (warm-up steps dropped): img/s = global batch / mean step time, with a 95% interval over the\n"
    "repeats (Student's t; with one repeat, over the steps), and the share of the step spent waiting for\n"
    "the all-reduce after backward and for data. Speedup is over the 1-process point of the same precision\n"
    "and batch (or the fewest processes measured); efficiency = speedup / (P / that count).\n\n"
    "  --procs LIST         processes per point, e.g. 1,2,4 (required)\n"
    "  --precisions LIST    train.precision values (default: the config's)\n"
    "  --batch LIST         per-rank data.batch_size values (default: the config's)\n"
    "  --steps N            timed steps per run (default 20)\n"
    "  --warmup N           untimed steps first (default 5)\n"
    "  --repeats R          runs per point (default 1)\n"
    "  --data synthetic|real  synthetic (default) replaces the dataset by random images of its shape;\n"
    "                       real reads the config's dataset\n"
    "  --out DIR            bench directory (default runs/bench-<config>-<time>)\n"
    "  --set k=v            passed to every run's `train`\n"
    "  --to-accuracy X      NOT IMPLEMENTED YET: time-to-accuracy runs (an error when given)\n\n"
    "Writes bench.csv, bench.json (results + build, host, CPU, GPUs, driver, CUDA/cuDNN versions and every\n"
    "NCCL_* variable) and speedup.png into the bench directory; each run's output is in its\n"
    "<point>/output.log.\n\n"
    "example: trainer bench configs/fashion_mnist_cnn.toml --procs 1,2 --steps 20 --warmup 5\n";

struct BenchArgs {
  std::string config_path;
  std::vector<int> procs, batches;
  std::vector<std::string> precisions;
  int steps = 20, warmup = 5, repeats = 1;
  std::string data = "synthetic";
  std::string out;
  std::vector<std::string> overrides;
  bool help = false;
};

int parse_positive(const std::string& flag, const std::string& value) {
  int v = 0;
  const char* end = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), end, v);
  if (value.empty() || ec != std::errc() || p != end || v < 1)
    throw UsageError(flag + " expects a positive whole number, got '" + value + "'");
  return v;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

BenchArgs parse_bench_args(const std::vector<std::string>& args) {
  BenchArgs a;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i], value;
    bool inline_value = false;
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inline_value = true;
    }
    auto take = [&]() -> std::string {
      if (inline_value) return value;
      if (i + 1 >= args.size()) throw UsageError(arg + " needs a value");
      return args[++i];
    };
    if (arg == "--help" || arg == "-h") {
      a.help = true;
    } else if (arg == "--procs") {
      a.procs.clear();
      for (const auto& p : split_list(take())) a.procs.push_back(parse_positive(arg, p));
    } else if (arg == "--batch") {
      a.batches.clear();
      for (const auto& b : split_list(take())) a.batches.push_back(parse_positive(arg, b));
    } else if (arg == "--precisions") {
      a.precisions = split_list(take());
    } else if (arg == "--steps") {
      a.steps = parse_positive(arg, take());
    } else if (arg == "--warmup") {
      const std::string v = take();
      a.warmup = v == "0" ? 0 : parse_positive(arg, v);
    } else if (arg == "--repeats") {
      a.repeats = parse_positive(arg, take());
    } else if (arg == "--data") {
      a.data = take();
      if (a.data != "synthetic" && a.data != "real")
        throw UsageError("--data expects synthetic or real, got '" + a.data + "'");
    } else if (arg == "--out") {
      a.out = take();
    } else if (arg == "--set") {
      a.overrides.push_back(take());
    } else if (arg == "--to-accuracy") {
      throw UsageError(
          "--to-accuracy is not implemented yet: bench measures steady-state throughput only. "
          "HINT: run `trainer train` to the target and read summary.json, or leave the flag out");
    } else if (arg.rfind("-", 0) == 0) {
      throw UsageError("unknown option " + arg);
    } else if (a.config_path.empty()) {
      a.config_path = arg;
    } else {
      throw UsageError("unexpected argument '" + arg + "' (the config is already " + a.config_path + ")");
    }
  }
  if (a.help) return a;
  if (a.config_path.empty())
    throw UsageError("missing CONFIG (a TOML file, e.g. configs/fashion_mnist_cnn.toml)");
  if (a.procs.empty()) throw UsageError("--procs LIST is required, e.g. --procs 1,2,4");
  std::sort(a.procs.begin(), a.procs.end());
  a.procs.erase(std::unique(a.procs.begin(), a.procs.end()), a.procs.end());
  return a;
}

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
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
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

// The steady-state rows of a run's step_times.csv: column name -> values, steps after `warmup` only.
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

struct Point {
  int procs = 1, batch = 0;
  int64_t global_batch = 0;
  std::string precision;
  double lr = 0.0;
  std::vector<double> repeat_ips;                                     // img/s of each repeat
  std::vector<double> step_seconds;                                   // every steady step of every repeat
  double allreduce_exposed = 0.0, data_wait = 0.0, step_total = 0.0;  // summed seconds
  double ips = 0.0, ips_half_width = 0.0, speedup = 0.0, efficiency = 0.0;
  std::vector<std::string> run_dirs;
};

void summarise(Point& p) {
  if (p.repeat_ips.size() >= 2) {
    const MeanInterval m = mean_interval95(p.repeat_ips);
    p.ips = m.mean;
    p.ips_half_width = m.half_width;
  } else {
    // One repeat: the interval of the mean step time over the steps, carried through G / t.
    const MeanInterval t = mean_interval95(p.step_seconds);
    const double g = static_cast<double>(p.global_batch);
    p.ips = g / t.mean;
    const double lo = g / (t.mean + t.half_width);
    const double hi = t.half_width < t.mean ? g / (t.mean - t.half_width) : 2 * p.ips - lo;
    p.ips_half_width = (hi - lo) / 2;
  }
}

std::string fmt(const char* f, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

std::string environment_json(const SystemInfo& s, const TrainerBuild& b) {
  std::ostringstream o;
  o << "{\n    \"build\": " << json_quote(b.str()) << ",\n    \"version\": " << json_quote(b.version)
    << ",\n    \"cuda_version\": " << json_quote(b.cuda_version)
    << ",\n    \"cudnn_version\": " << json_quote(b.cudnn_version)
    << ",\n    \"nccl_version\": " << json_quote(b.nccl_version)
    << ",\n    \"hostname\": " << json_quote(s.hostname)
    << ",\n    \"cpu_model\": " << json_quote(s.cpu_model) << ",\n    \"cpu_cores\": " << s.cpu_cores
    << ",\n    \"blas_core\": " << json_quote(s.blas_core)
    << ",\n    \"cuda_driver_version\": " << json_quote(s.cuda_driver_version)
    << ",\n    \"cuda_visible_devices\": " << json_quote(s.cuda_visible_devices) << ",\n    \"gpus\": [";
  for (size_t i = 0; i < s.gpus.size(); ++i)
    o << (i ? ", " : "") << "{\"index\": " << s.gpus[i].index << ", \"name\": " << json_quote(s.gpus[i].name)
      << ", \"memory_bytes\": " << s.gpus[i].total_memory_bytes << "}";
  o << "],\n    \"nccl_env\": {";
  for (size_t i = 0; i < s.nccl_env.size(); ++i)
    o << (i ? ", " : "") << json_quote(s.nccl_env[i].first) << ": " << json_quote(s.nccl_env[i].second);
  o << "}\n  }";
  return o.str();
}

// Overrides that make `config` train on random images of its dataset's shape.
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

}  // namespace

double student_t975(int dof) {
  static const double t[] = {0,     12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                             2.201, 2.179,  2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080,
                             2.074, 2.069,  2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (dof < 1) return 0.0;
  return dof <= 30 ? t[dof] : 1.96;
}

MeanInterval mean_interval95(const std::vector<double>& v) {
  MeanInterval m;
  m.mean = mean_of(v);
  if (v.size() < 2) return m;
  double ss = 0;
  for (double x : v) ss += (x - m.mean) * (x - m.mean);
  const double sd = std::sqrt(ss / static_cast<double>(v.size() - 1));
  m.half_width = student_t975(static_cast<int>(v.size()) - 1) * sd / std::sqrt(static_cast<double>(v.size()));
  return m;
}

int bench_command(const std::vector<std::string>& args) {
  const BenchArgs a = parse_bench_args(args);
  if (a.help) {
    std::cout << kBenchUsage;
    return 0;
  }
  const Config config = load_config(a.config_path, a.overrides);
  const std::vector<std::string> precisions =
      a.precisions.empty() ? std::vector<std::string>{config.train.precision} : a.precisions;
  const std::vector<int> batches = a.batches.empty() ? std::vector<int>{config.data.batch_size} : a.batches;
  for (const std::string& p : precisions) load_config(a.config_path, {"train.precision=" + p});  // validates
  const fs::path out = a.out.empty()
                           ? fs::path("runs") / ("bench-" + fs::path(a.config_path).stem().string() +
                                                 fmt("-%lld", static_cast<long long>(std::time(nullptr))))
                           : fs::path(a.out);
  fs::create_directories(out);
  const int accum = config.train.grad_accum_steps;
  const int total_steps = a.warmup + a.steps;

  std::vector<Point> points;
  const size_t n_runs = precisions.size() * batches.size() * a.procs.size() * static_cast<size_t>(a.repeats);
  size_t run_index = 0;
  std::printf("bench: %s, %zu runs of %d steps (%d warm-up), data %s, into %s\n", a.config_path.c_str(),
              n_runs, total_steps, a.warmup, a.data.c_str(), out.c_str());
  std::fflush(stdout);
  for (const std::string& precision : precisions)
    for (int batch : batches)
      for (int procs : a.procs) {
        Point p;
        p.procs = procs;
        p.batch = batch;
        p.precision = precision;
        p.global_batch = static_cast<int64_t>(batch) * accum * procs;
        p.lr = config.optim.lr * static_cast<double>(p.global_batch) / config.optim.base_batch_size;
        for (int r = 1; r <= a.repeats; ++r) {
          const fs::path dir = out / fmt("p%d-b%d-%s-r%d", procs, batch, precision.c_str(), r);
          fs::remove_all(dir);
          fs::create_directories(dir);
          std::vector<std::string> sets = a.overrides;
          if (a.data == "synthetic" && config.data.dataset != "synthetic") {
            const auto s = synthetic_overrides(config, p.global_batch * total_steps);
            sets.insert(sets.end(), s.begin(), s.end());
            sets.push_back("train.epochs=1");
          } else if (a.data == "synthetic") {
            sets.push_back("data.synthetic_samples=" + std::to_string(p.global_batch * total_steps));
            sets.push_back("train.epochs=1");
          } else {
            sets.push_back("train.epochs=1000000");
          }
          const std::vector<std::string> fixed = {"data.batch_size=" + std::to_string(batch),
                                                  "train.precision=" + precision,
                                                  "train.max_steps=" + std::to_string(total_steps),
                                                  "train.eval_every_epochs=0",
                                                  "train.run_dir=" + fs::absolute(dir).string(),
                                                  "optim.lr_scaling=linear",
                                                  "checkpoint.save_final=false",
                                                  "checkpoint.every_epochs=0",
                                                  "checkpoint.every_steps=0",
                                                  "metrics.port=0"};
          sets.insert(sets.end(), fixed.begin(), fixed.end());
          std::vector<std::string> cmd = {"launch",
                                          "--nproc-per-node",
                                          std::to_string(procs),
                                          "--master-port",
                                          std::to_string(free_port()),
                                          "--",
                                          "train",
                                          a.config_path};
          for (const std::string& s : sets) {
            cmd.push_back("--set");
            cmd.push_back(s);
          }
          ++run_index;
          std::printf("bench: [%zu/%zu] %d process%s, batch %d/rank, %s, repeat %d/%d ... ", run_index,
                      n_runs, procs, procs == 1 ? "" : "es", batch, precision.c_str(), r, a.repeats);
          std::fflush(stdout);
          const auto start = std::chrono::steady_clock::now();
          const int status = run_self(cmd, dir / "output.log");
          const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            std::printf("failed\n");
            throw std::runtime_error(fmt("bench: the run in %s failed (%s %d) after %.1fs; its last lines:\n",
                                         dir.c_str(), WIFEXITED(status) ? "exit status" : "signal",
                                         WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), secs) +
                                     last_lines(dir / "output.log", 8) + "HINT: the whole output is in " +
                                     (dir / "output.log").string());
          }
          auto cols = read_step_times(dir / "step_times.csv", a.warmup);
          const std::vector<double>& steps = cols["step_seconds"];
          if (steps.empty())
            throw std::runtime_error(
                "bench: " + (dir / "step_times.csv").string() +
                " has no step after the warm-up. HINT: the dataset may be smaller than " +
                std::to_string(total_steps) + " global batches; lower --steps/--warmup");
          const double mean_step = mean_of(steps);
          p.repeat_ips.push_back(static_cast<double>(p.global_batch) / mean_step);
          p.step_seconds.insert(p.step_seconds.end(), steps.begin(), steps.end());
          p.step_total += sum_of(steps);
          p.allreduce_exposed += sum_of(cols["allreduce_exposed_seconds"]);
          p.data_wait += sum_of(cols["data_wait_seconds"]);
          p.run_dirs.push_back(dir.string());
          std::printf("%.0f img/s (%.1fs)\n", p.repeat_ips.back(), secs);
          std::fflush(stdout);
        }
        summarise(p);
        points.push_back(p);
      }

  // Speedup over the fewest processes of the same precision and batch (1 when measured).
  for (Point& p : points) {
    const Point* base = nullptr;
    for (const Point& q : points)
      if (q.precision == p.precision && q.batch == p.batch && (!base || q.procs < base->procs)) base = &q;
    p.speedup = p.ips / base->ips;
    p.efficiency = p.speedup / (static_cast<double>(p.procs) / base->procs);
  }

  // ---- table
  std::printf("\n%5s %10s %7s %9s %9s %20s %8s %10s %18s %9s\n", "procs", "batch/rank", "global", "precision",
              "lr", "img/s (95% CI)", "speedup", "efficiency", "allreduce_exposed", "data_wait");
  std::ostringstream csv;
  csv << "procs,batch_per_rank,global_batch,precision,lr,img_per_s,img_per_s_ci95,speedup,efficiency,"
         "allreduce_exposed_pct,data_wait_pct,mean_step_seconds,repeats,steps,warmup\n";
  for (const Point& p : points) {
    const double ar = 100 * p.allreduce_exposed / p.step_total, dw = 100 * p.data_wait / p.step_total;
    std::string ips = fmt("%.1f ± %.1f", p.ips, p.ips_half_width);
    ips.insert(0, ips.size() - 1 < 20 ? 20 - (ips.size() - 1) : 0, ' ');  // '±' is 2 bytes, 1 column
    std::printf("%5d %10d %7lld %9s %9.4g %s %8.2f %9.1f%% %17.1f%% %8.1f%%\n", p.procs, p.batch,
                static_cast<long long>(p.global_batch), p.precision.c_str(), p.lr, ips.c_str(), p.speedup,
                100 * p.efficiency, ar, dw);
    csv << p.procs << ',' << p.batch << ',' << p.global_batch << ',' << p.precision << ','
        << fmt("%.6g", p.lr) << ',' << fmt("%.2f", p.ips) << ',' << fmt("%.2f", p.ips_half_width) << ','
        << fmt("%.4f", p.speedup) << ',' << fmt("%.4f", p.efficiency) << ',' << fmt("%.2f", ar) << ','
        << fmt("%.2f", dw) << ',' << fmt("%.6g", mean_of(p.step_seconds)) << ',' << a.repeats << ','
        << a.steps << ',' << a.warmup << '\n';
  }
  std::ofstream(out / "bench.csv") << csv.str();

  // ---- JSON
  const TrainerBuild build = trainer_build();
  const SystemInfo sys = system_info();
  std::ostringstream js;
  js << "{\n  \"config\": " << json_quote(a.config_path) << ",\n  \"data\": " << json_quote(a.data)
     << ",\n  \"steps\": " << a.steps << ",\n  \"warmup\": " << a.warmup << ",\n  \"repeats\": " << a.repeats
     << ",\n  \"overrides\": [";
  for (size_t i = 0; i < a.overrides.size(); ++i) js << (i ? ", " : "") << json_quote(a.overrides[i]);
  js << "],\n  \"environment\": " << environment_json(sys, build) << ",\n  \"points\": [\n";
  for (size_t i = 0; i < points.size(); ++i) {
    const Point& p = points[i];
    js << "    {\"procs\": " << p.procs << ", \"batch_per_rank\": " << p.batch
       << ", \"global_batch\": " << p.global_batch << ", \"precision\": " << json_quote(p.precision)
       << ", \"lr\": " << fmt("%.6g", p.lr) << ", \"img_per_s\": " << fmt("%.3f", p.ips)
       << ", \"img_per_s_ci95\": " << fmt("%.3f", p.ips_half_width) << ", \"repeat_img_per_s\": [";
    for (size_t r = 0; r < p.repeat_ips.size(); ++r) js << (r ? ", " : "") << fmt("%.3f", p.repeat_ips[r]);
    js << "], \"speedup\": " << fmt("%.4f", p.speedup) << ", \"efficiency\": " << fmt("%.4f", p.efficiency)
       << ", \"mean_step_seconds\": " << fmt("%.6g", mean_of(p.step_seconds))
       << ", \"allreduce_exposed_fraction\": " << fmt("%.4f", p.allreduce_exposed / p.step_total)
       << ", \"data_wait_fraction\": " << fmt("%.4f", p.data_wait / p.step_total) << ", \"run_dirs\": [";
    for (size_t r = 0; r < p.run_dirs.size(); ++r) js << (r ? ", " : "") << json_quote(p.run_dirs[r]);
    js << "]}" << (i + 1 < points.size() ? "," : "") << "\n";
  }
  js << "  ]\n}\n";
  std::ofstream(out / "bench.json") << js.str();

  // ---- chart: one line per (precision, batch)
  static const uint8_t colours[][3] = {
      {31, 119, 180}, {214, 39, 40}, {44, 160, 44}, {148, 103, 189}, {255, 127, 14}};
  ChartPanel sp{"speedup", "processes", static_cast<double>(a.procs.back()), 1.0, true, {}};
  ChartPanel ef{"efficiency", "processes", static_cast<double>(a.procs.back()), 1.2, true, {}};
  sp.series.push_back({{0, sp.x_max}, {0, sp.x_max}, 150, 150, 150, true, false});
  ef.series.push_back({{0, ef.x_max}, {1, 1}, 150, 150, 150, true, false});
  size_t k = 0;
  for (const std::string& precision : precisions)
    for (int batch : batches) {
      const uint8_t* c = colours[k++ % 5];
      ChartSeries s{{}, {}, c[0], c[1], c[2], false, true}, e = s;
      for (const Point& p : points)
        if (p.precision == precision && p.batch == batch) {
          s.x.push_back(p.procs);
          s.y.push_back(p.speedup);
          e.x.push_back(p.procs);
          e.y.push_back(p.efficiency);
          sp.y_max = std::max(sp.y_max, p.speedup * 1.1);
          ef.y_max = std::max(ef.y_max, p.efficiency * 1.1);
        }
      sp.series.push_back(s);
      ef.series.push_back(e);
    }
  sp.y_max = std::max(sp.y_max, sp.x_max);
  std::ofstream(out / "speedup.png", std::ios::binary) << render_chart_png({sp, ef});
  std::printf("\nwrote %s, %s, %s\n", (out / "bench.csv").c_str(), (out / "bench.json").c_str(),
              (out / "speedup.png").c_str());
  return 0;
}

}  // namespace trainer
