#include "dist/process_group.h"

#include <thread>

#include "dist/consistency.h"
#include "dist/cpu_comm.h"
#include "dist/error.h"
#include "dist/nccl_backend.h"
#include "nn/runtime.h"

namespace trainer {
namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

}  // namespace

std::string resolve_comm_backend(const DistOptions& options) {
  const std::string& b = options.backend;
  if (b != "auto" && b != "nccl" && b != "tcp")
    throw DistError("unknown distributed backend '" + b +
                    "'. HINT: use \"auto\" (NCCL on GPUs, our TCP collectives otherwise), "
                    "\"nccl\" or \"tcp\"");
  if (b == "tcp") return "tcp";
  if (!runtime::cuda_built() && (b == "nccl" || options.device.is_cuda()))
    throw DistError("distributed backend \"" + b + "\" with device " + options.device.str() +
                    ": this trainer was built without CUDA, so NCCL is not available. HINT: rebuild with "
                    "-DTRAINER_CUDA=ON on a host with the CUDA toolkit, or train on the CPU with the "
                    "\"tcp\" backend");
  if (options.device.is_cuda()) return "nccl";
  if (b == "nccl")
    throw DistError("distributed backend \"nccl\" needs the model on a GPU, but the device is " +
                    options.device.str() +
                    ". HINT: train on a CUDA device, or set the distributed backend to \"auto\" or \"tcp\"");
  return "tcp";
}

std::unique_ptr<ProcessGroup> ProcessGroup::init(const ProcessEnv& env, const DistOptions& options) {
  std::unique_ptr<ProcessGroup> pg(new ProcessGroup());
  pg->env_ = env;
  pg->options_ = options;
  // Checked at world size 1 too, so a wrong setting fails on one GPU before it reaches a cluster.
  const std::string backend = resolve_comm_backend(options);
  if (!env.distributed()) {
    pg->comm_ = std::make_shared<SingleProcessComm>();
    pg->comm_->set_timeout(options.timeout);
    return pg;
  }
  TcpStoreOptions so;
  so.host = env.master_addr;
  so.port = env.store_port;
  so.is_server = env.rank == 0;
  // A loopback master means a single-host job: serve on loopback only. Otherwise every interface,
  // since MASTER_ADDR may name this host by an address we cannot bind to directly (NAT, aliases).
  so.bind_host = is_loopback(env.master_addr) ? env.master_addr : "";
  so.port_name = env.store_port_source == "MASTER_PORT" ? "MASTER_PORT"
                 : env.store_port_source == "TRAINER_STORE_PORT"
                     ? "TRAINER_STORE_PORT"
                     : "the trainer's store port (MASTER_PORT+1 under torchrun)";
  so.connect_timeout = options.connect_timeout;
  so.world_size = env.world_size;
  so.job_id = env.job_id;
  try {
    auto store = std::make_unique<TcpStore>(so);
    const std::string local_address = store->local_address();
    pg->store_ = std::move(store);
    // Before any peer connection: a different build might speak another protocol, and a rank on
    // another kind of device would open another kind of communicator (NCCL against CPU sockets),
    // which would only time out.
    std::vector<ConsistencyItem> items;
    if (!options.build.empty())
      items.push_back({"trainer build", options.build,
                       "install the same trainer build on every node (a shared file system or one "
                       "container image)"});
    items.push_back(
        {"communicator", backend + ", model on " + (options.device.is_cuda() ? "GPU" : "CPU"),
         "every rank must train on the same kind of device with the same communicator. Under "
         "train.device = \"auto\" a rank that sees no GPU trains on the CPU: check nvidia-smi and "
         "CUDA_VISIBLE_DEVICES on its node, or set train.device = \"cuda\" so that such a rank stops "
         "with its own error"});
    if (!options.gpu_id.empty())
      items.push_back({"GPU", options.gpu_id,
                       "each rank needs a GPU of its own: launch with trainer launch or torchrun, which set "
                       "LOCAL_RANK 0, 1, ... per node, and do not give two ranks of one node the same "
                       "LOCAL_RANK or a CUDA_VISIBLE_DEVICES with only the same GPU",
                       /*distinct=*/true});
    check_consistency(*pg->store_, env.rank, env.world_size, items, options.connect_timeout, "build");
    if (backend == "nccl") {
      NcclCommOptions no;
      no.name = "default";
      no.device = options.device.index;
      no.timeout = options.timeout;
      no.connect_timeout = options.connect_timeout;
      no.peer_silent_after = options.peer_silent_after;  // the heartbeat below reports to the same store
      // The watchdog's own connection: the main one may sit in a long store wait. Short replies, so a
      // frozen rank 0 is noticed (dist/peer_liveness.h) instead of blocking the watchdog for a minute.
      TcpStoreOptions wo = so;
      wo.is_server = false;
      wo.reply_timeout = std::chrono::seconds(3);
      no.watchdog_store = std::make_shared<TcpStore>(wo);
      pg->comm_ = create_nccl_comm(*pg->store_, env.rank, env.world_size, no);
    } else {
      CpuCommOptions co;
      co.name = "default";
      co.listen_address = local_address;
      co.timeout = options.timeout;
      co.connect_timeout = options.connect_timeout;
      pg->comm_ = CpuComm::create(*pg->store_, env.rank, env.world_size, co);
    }
    TcpStoreOptions ho = so;  // the heartbeat's own connection, like the NCCL watchdog's
    ho.is_server = false;
    ho.reply_timeout = std::chrono::seconds(3);  // a report and a failure's description stay short
    pg->heartbeat_ = std::make_unique<Heartbeat>(std::make_unique<TcpStore>(ho), env.rank, env.world_size);
  } catch (const WaitInterrupted&) {
    throw;  // a stop signal: nothing to explain
  } catch (const DistError& e) {
    std::string message = e.what();
    // The classic SLURM mistake: trainer run straight from the batch script is one process that
    // believes it is rank 0 of SLURM_NTASKS; the others never come.
    if (env.launcher == "slurm" && message.find("missing rank(s)") != std::string::npos)
      message +=
          " (under SLURM: start every task with srun; a trainer started directly in the batch script "
          "runs alone)";
    throw DistError(message);
  }
  return pg;
}

ProcessGroup::~ProcessGroup() {
  heartbeat_.reset();  // its connection to rank 0's store first
  comm_.reset();
  // Rank 0 leaving on an error: the other ranks are now failing too and read every rank's heartbeat
  // from this store for their messages. Keep serving a moment so that they can.
  if (!shut_down_ && store_ && env_.rank == 0 && env_.world_size > 1)
    std::this_thread::sleep_for(
        std::chrono::seconds(2));  // before the store: rank 0's store outlives its own communicator
  store_.reset();
}

void ProcessGroup::shutdown() {
  shut_down_ = true;
  if (comm_) comm_->shutdown();
}

}  // namespace trainer
