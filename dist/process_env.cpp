#include "dist/process_env.h"

#include <cctype>
#include <cstdint>
#include <optional>

#include "dist/error.h"

extern char** environ;

namespace trainer {
namespace {

std::optional<std::string> get(const EnvMap& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

bool parse_uint(const std::string& text, int64_t* value) {
  if (text.empty() || text.size() > 9) return false;
  int64_t v = 0;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    v = v * 10 + (c - '0');
  }
  *value = v;
  return true;
}

// A non-negative integer variable; throws naming the variable when it is not one.
int int_var(const std::string& name, const std::string& text, const std::string& hint) {
  int64_t v = 0;
  if (!parse_uint(text, &v))
    throw DistError("environment variable " + name + "='" + text +
                    "' is not a non-negative integer. HINT: " + hint);
  return static_cast<int>(v);
}

int required_int(const EnvMap& env, const std::string& name, const std::string& why,
                 const std::string& hint) {
  auto text = get(env, name);
  if (!text) throw DistError(why + " but " + name + " is not set. HINT: " + hint);
  return int_var(name, *text, hint);
}

std::optional<int> optional_int(const EnvMap& env, const std::string& name, const std::string& hint) {
  auto text = get(env, name);
  if (!text) return std::nullopt;
  return int_var(name, *text, hint);
}

int port_var(const std::string& name, const std::string& text, const std::string& hint) {
  const int port = int_var(name, text, hint);
  if (port < 1 || port > 65535)
    throw DistError(name + "=" + text + " is not a TCP port (1-65535). HINT: " + hint);
  return port;
}

struct VarNames {
  std::string rank, world, local_rank, local_world;
};

void validate(const ProcessEnv& p, const VarNames& v, const std::string& hint) {
  auto eq = [](const std::string& name, int value) { return name + "=" + std::to_string(value); };
  if (p.world_size < 1)
    throw DistError(eq(v.world, p.world_size) + ": the world needs at least one process. HINT: " + hint);
  if (p.rank >= p.world_size)
    throw DistError(eq(v.rank, p.rank) + " is not below " + eq(v.world, p.world_size) +
                    " (ranks count from 0). HINT: " + hint);
  if (p.local_world_size < 1)
    throw DistError(eq(v.local_world, p.local_world_size) +
                    ": a node runs at least one process. HINT: " + hint);
  if (p.local_rank >= p.local_world_size)
    throw DistError(eq(v.local_rank, p.local_rank) + " is not below " +
                    eq(v.local_world, p.local_world_size) + ". HINT: " + hint);
  if (p.local_world_size > p.world_size)
    throw DistError(eq(v.local_world, p.local_world_size) + " exceeds " + eq(v.world, p.world_size) +
                    ". HINT: " + hint);
}

// MASTER_ADDR / MASTER_PORT when set (they override any launcher), or the launcher's defaults.
void read_master(const EnvMap& env, ProcessEnv* p, const std::string& hint) {
  if (auto addr = get(env, "MASTER_ADDR")) {
    if (addr->empty()) throw DistError("MASTER_ADDR is set but empty. HINT: " + hint);
    p->master_addr = *addr;
  }
  if (auto port = get(env, "MASTER_PORT")) p->master_port = port_var("MASTER_PORT", *port, hint);
}

void choose_store_port(const EnvMap& env, ProcessEnv* p) {
  const std::string hint = "set TRAINER_STORE_PORT to a free TCP port, the same on every rank";
  if (auto port = get(env, "TRAINER_STORE_PORT")) {
    p->store_port = port_var("TRAINER_STORE_PORT", *port, hint);
    p->store_port_source = "TRAINER_STORE_PORT";
  } else if (get(env, "TORCHELASTIC_RUN_ID")) {
    if (p->master_port == 65535)
      throw DistError(
          "MASTER_PORT=65535 leaves no port for the trainer's store, which serves on MASTER_PORT+1 "
          "under torchrun. HINT: pick a lower --master-port, or " +
          hint);
    p->store_port = p->master_port + 1;
    p->store_port_source = "MASTER_PORT+1 (torchrun's own store holds MASTER_PORT)";
  } else {
    p->store_port = p->master_port;
    p->store_port_source = "MASTER_PORT";
  }
}

ProcessEnv from_torchrun(const EnvMap& env) {
  const std::string hint =
      "launch with torchrun (or `trainer launch`), which sets RANK, WORLD_SIZE, LOCAL_RANK, "
      "LOCAL_WORLD_SIZE, "
      "MASTER_ADDR and MASTER_PORT consistently; when setting them by hand, give every rank the same "
      "WORLD_SIZE, MASTER_ADDR and MASTER_PORT and a distinct RANK in [0, WORLD_SIZE)";
  ProcessEnv p;
  p.launcher = get(env, "TORCHELASTIC_RUN_ID") ? "torchrun" : "env";
  const bool has_rank = get(env, "RANK").has_value();
  p.rank = required_int(env, "RANK", has_rank ? "" : "WORLD_SIZE is set", hint);
  p.world_size = required_int(env, "WORLD_SIZE", "RANK is set", hint);
  const auto local_rank = optional_int(env, "LOCAL_RANK", hint);
  const auto local_world = optional_int(env, "LOCAL_WORLD_SIZE", hint);
  if (local_rank) {
    p.local_rank = *local_rank;
  } else {
    p.local_rank = p.rank;
    p.notes.push_back("LOCAL_RANK is not set: assuming one node (LOCAL_RANK = RANK)");
  }
  if (local_world) {
    p.local_world_size = *local_world;
  } else {
    p.local_world_size = p.world_size;
    p.notes.push_back("LOCAL_WORLD_SIZE is not set: assuming one node (LOCAL_WORLD_SIZE = WORLD_SIZE)");
  }
  if (p.world_size > 1) {
    if (!get(env, "MASTER_ADDR"))
      throw DistError("WORLD_SIZE=" + std::to_string(p.world_size) +
                      " but MASTER_ADDR is not set. HINT: " + hint);
    if (!get(env, "MASTER_PORT"))
      throw DistError("WORLD_SIZE=" + std::to_string(p.world_size) +
                      " but MASTER_PORT is not set. HINT: " + hint);
  }
  read_master(env, &p, hint);
  validate(p, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}, hint);
  return p;
}

// SLURM_TASKS_PER_NODE style "2(x3),1": tasks on node `node` (0-based), or nullopt when malformed.
std::optional<int> tasks_on_node(const std::string& spec, int node) {
  int index = 0;
  size_t pos = 0;
  while (pos <= spec.size()) {
    const size_t comma = spec.find(',', pos);
    const std::string item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const size_t paren = item.find("(x");
    int64_t count = 0, repeat = 1;
    if (!parse_uint(item.substr(0, paren), &count)) return std::nullopt;
    if (paren != std::string::npos) {
      if (item.back() != ')' || !parse_uint(item.substr(paren + 2, item.size() - paren - 3), &repeat))
        return std::nullopt;
    }
    if (node < index + repeat) return static_cast<int>(count);
    index += static_cast<int>(repeat);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return std::nullopt;
}

ProcessEnv from_slurm(const EnvMap& env) {
  const std::string hint =
      "start one trainer per task with srun (e.g. `srun --ntasks-per-node=4 trainer train ...`); inside an "
      "sbatch "
      "script, call srun rather than running trainer directly";
  ProcessEnv p;
  p.launcher = "slurm";
  p.rank = required_int(env, "SLURM_PROCID", "", hint);
  if (get(env, "SLURM_STEP_NUM_TASKS")) {
    p.world_size = required_int(env, "SLURM_STEP_NUM_TASKS", "", hint);
  } else {
    p.world_size = required_int(env, "SLURM_NTASKS", "SLURM_PROCID is set", hint);
  }
  p.local_rank = required_int(env, "SLURM_LOCALID", "SLURM_PROCID is set", hint);
  std::string local_world_var = "SLURM_NTASKS_PER_NODE";
  if (auto per_node = optional_int(env, "SLURM_NTASKS_PER_NODE", hint)) {
    p.local_world_size = *per_node;
  } else {
    std::optional<std::string> spec;
    for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
      if ((spec = get(env, name))) {
        local_world_var = name;
        break;
      }
    }
    const int node = optional_int(env, "SLURM_NODEID", hint).value_or(0);
    std::optional<int> count = spec ? tasks_on_node(*spec, node) : std::nullopt;
    if (spec && !count)
      throw DistError(local_world_var + "='" + *spec +
                      "' is not a SLURM task count list like '4(x2),3'. HINT: " + hint);
    if (count) {
      p.local_world_size = *count;
    } else {
      p.local_world_size = p.world_size;
      p.notes.push_back("SLURM_NTASKS_PER_NODE is not set: assuming one node");
    }
  }
  if (!get(env, "MASTER_ADDR")) {
    std::optional<std::string> list;
    std::string list_var;
    for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if ((list = get(env, name))) {
        list_var = name;
        break;
      }
    }
    if (list) {
      std::vector<std::string> hosts;
      try {
        hosts = expand_slurm_nodelist(*list);
      } catch (const DistError& e) {
        throw DistError(list_var + ": " + e.what());
      }
      if (hosts.empty()) throw DistError(list_var + " is empty. HINT: " + hint);
      p.master_addr = hosts.front();
    } else if (p.world_size > 1) {
      throw DistError(
          "SLURM_PROCID is set but neither MASTER_ADDR nor SLURM_STEP_NODELIST / SLURM_JOB_NODELIST "
          "names the master host. HINT: " +
          hint + ", or export MASTER_ADDR");
    }
  }
  if (!get(env, "MASTER_PORT")) {
    // Two jobs sharing a node must not both pick 29500: derive the port from the job id.
    if (auto job = optional_int(env, "SLURM_JOB_ID", "SLURM_JOB_ID should be the numeric job id")) {
      p.master_port = 15000 + *job % 20000;
      p.notes.push_back("MASTER_PORT is not set: using " + std::to_string(p.master_port) +
                        " = 15000 + SLURM_JOB_ID % 20000");
    }
  }
  read_master(env, &p, hint);
  validate(p,
           {"SLURM_PROCID", get(env, "SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS",
            "SLURM_LOCALID", local_world_var},
           hint);
  return p;
}

ProcessEnv from_openmpi(const EnvMap& env) {
  const std::string hint =
      "OpenMPI does not say where rank 0 runs: pass its host and a free port to every rank, e.g. "
      "`mpirun -np 4 -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29500 trainer train ...`";
  ProcessEnv p;
  p.launcher = "openmpi";
  p.rank = required_int(env, "OMPI_COMM_WORLD_RANK", "", hint);
  p.world_size = required_int(env, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK is set", hint);
  p.local_rank = required_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_RANK is set", hint);
  p.local_world_size = required_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_RANK is set", hint);
  if (p.world_size > 1 && !get(env, "MASTER_ADDR"))
    throw DistError("running under OpenMPI (OMPI_COMM_WORLD_SIZE=" + std::to_string(p.world_size) +
                    ") but MASTER_ADDR is not set. HINT: " + hint);
  read_master(env, &p, hint);
  validate(p,
           {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE"},
           hint);
  return p;
}

// Splits at top-level commas (not those inside brackets).
std::vector<std::string> split_top_level(const std::string& list) {
  std::vector<std::string> parts;
  std::string current;
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) throw DistError("unbalanced ']' in host list '" + list + "'");
    if (c == ',' && depth == 0) {
      parts.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (depth != 0) throw DistError("unbalanced '[' in host list '" + list + "'");
  parts.push_back(current);
  return parts;
}

// Expands one host pattern with zero or more bracket groups.
void expand_pattern(const std::string& pattern, const std::string& list, std::vector<std::string>* out) {
  const size_t open = pattern.find('[');
  if (open == std::string::npos) {
    if (pattern.empty()) throw DistError("empty host name in host list '" + list + "'");
    out->push_back(pattern);
    return;
  }
  const size_t close = pattern.find(']', open);
  const std::string prefix = pattern.substr(0, open);
  const std::string body = pattern.substr(open + 1, close - open - 1);
  const std::string rest = pattern.substr(close + 1);
  if (body.empty()) throw DistError("empty brackets in host list '" + list + "'");
  size_t pos = 0;
  while (pos <= body.size()) {
    const size_t comma = body.find(',', pos);
    const std::string item = body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const size_t dash = item.find('-');
    const std::string lo_text = item.substr(0, dash);
    const std::string hi_text = dash == std::string::npos ? lo_text : item.substr(dash + 1);
    int64_t lo = 0, hi = 0;
    if (!parse_uint(lo_text, &lo) || !parse_uint(hi_text, &hi) || hi < lo || hi - lo > 100000)
      throw DistError("bad range '" + item + "' in host list '" + list + "'");
    const size_t width = lo_text.size();  // "01-04" keeps two digits
    for (int64_t i = lo; i <= hi; ++i) {
      std::string number = std::to_string(i);
      if (number.size() < width) number.insert(0, width - number.size(), '0');
      expand_pattern(prefix + number + rest, list, out);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& list) {
  std::vector<std::string> hosts;
  if (list.empty()) return hosts;
  for (const std::string& part : split_top_level(list)) expand_pattern(part, list, &hosts);
  return hosts;
}

std::string ProcessEnv::describe() const {
  std::string s = "rank " + std::to_string(rank) + "/" + std::to_string(world_size) + " (local " +
                  std::to_string(local_rank) + "/" + std::to_string(local_world_size) + ") via " + launcher;
  if (world_size > 1) s += ", master " + master_addr + ":" + std::to_string(master_port);
  if (world_size > 1 && store_port != master_port) s += ", store port " + std::to_string(store_port);
  return s;
}

ProcessEnv process_env_from(const EnvMap& env) {
  ProcessEnv p;
  if (get(env, "RANK") || get(env, "WORLD_SIZE")) {
    p = from_torchrun(env);
  } else if (get(env, "SLURM_PROCID")) {
    p = from_slurm(env);
  } else if (get(env, "OMPI_COMM_WORLD_RANK")) {
    p = from_openmpi(env);
  } else {
    p.launcher = "single";
    read_master(env, &p, "unset MASTER_ADDR / MASTER_PORT or give them valid values");
  }
  choose_store_port(env, &p);
  if (auto id = get(env, "TRAINER_RUN_ID")) {
    p.job_id = *id;
  } else if (p.launcher == "torchrun") {
    p.job_id = *get(env, "TORCHELASTIC_RUN_ID");
  } else if (p.launcher == "slurm" && get(env, "SLURM_JOB_ID")) {
    p.job_id = *get(env, "SLURM_JOB_ID") + "." + get(env, "SLURM_STEP_ID").value_or("");
  } else if (p.launcher == "openmpi" && get(env, "OMPI_MCA_ess_base_jobid")) {
    p.job_id = *get(env, "OMPI_MCA_ess_base_jobid");
  }
  return p;
}

EnvMap current_environment() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

}  // namespace trainer
