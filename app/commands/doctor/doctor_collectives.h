#pragma once
// `trainer doctor`'s checks of how local ranks talk to each other: the peer-to-peer matrix of the local
// GPUs (app/commands/doctor/gpu_topology.h) and a short all-reduce with its result checked and its bus
// bandwidth measured (dist/collective_smoke.h): NCCL across every visible GPU when there are two or more,
// else the CPU communicator between two local ranks. Neither can hang (every wait has a deadline).
#include <chrono>

#include "app/commands/doctor/doctor_report.h"
#include "app/common/system_info.h"

namespace trainer {

void check_peer_topology(DoctorReport& r, const SystemInfo& s);
void check_collectives(DoctorReport& r, const SystemInfo& s, std::chrono::milliseconds timeout);

}  // namespace trainer
