#pragma once
// nn_bench --trace: what the GPU ran during a number of steps, summed by kernel name (a small
// Nsight-Systems substitute). cupti_trace.cpp (CUDA builds; libcupti is loaded at run time, so the bench
// runs without it) or no_trace.cpp (CPU builds), chosen by CMake.
namespace trainer::trace {

// Starts recording; false (with a message on stderr) when tracing is unavailable.
bool start();
// Stops recording and prints the summary over `steps` steps that took `wall_s` seconds.
void report(int steps, double wall_s);

}  // namespace trainer::trace
