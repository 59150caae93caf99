#pragma once
// `trainer doctor [CONFIG]`: the pre-flight checklist before a long run. Each line is PASS, WARN or FAIL
// with a hint: build, CPU and BLAS kernels, GPUs (CUDA builds), NCCL variables, the GPUs' peer-to-peer
// matrix and a collective smoke test (app/commands/doctor/doctor_collectives.h), launcher variables and,
// with a config, that it loads, its dataset opens, its device is usable, its run directory is writable
// with room to spare and its metrics ports are free. Exit status 0 without FAIL, 1 otherwise.
#include <string>
#include <vector>

namespace trainer {

int doctor_command(const std::vector<std::string>& args);

}  // namespace trainer
