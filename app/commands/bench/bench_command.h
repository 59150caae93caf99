#pragma once
// `trainer bench`: reproduces "1 process -> N processes" speedup experiments. Every point (processes x
// precision x per-rank batch x repeat) is a short `trainer launch --nproc-per-node P -- train CONFIG`
// run of this same binary in its own directory; rank 0's step_times.csv gives the steady-state step
// time (warm-up steps dropped) and the phase breakdown. Results: a table on stdout, bench.csv,
// bench.json (with the machine and build they came from) and speedup.png.
#include <string>
#include <vector>

namespace trainer {

// Statistics helpers, public for tests.
// The 97.5% quantile of Student's t with `dof` degrees of freedom (normal beyond 30).
double student_t975(int dof);
// Mean and 95% confidence half-width of `values` (half-width 0 for fewer than two values).
struct MeanInterval {
  double mean = 0.0, half_width = 0.0;
};
MeanInterval mean_interval95(const std::vector<double>& values);

int bench_command(const std::vector<std::string>& args);

}  // namespace trainer
