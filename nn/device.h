#pragma once
// Where a tensor's storage lives. Only the CPU exists until the CUDA backend registers itself.
#include <string>

namespace trainer {

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;

  static Device cpu() { return {DeviceKind::cpu, 0}; }
  static Device cuda(int index) { return {DeviceKind::cuda, index}; }
  bool is_cpu() const { return kind == DeviceKind::cpu; }
  bool is_cuda() const { return kind == DeviceKind::cuda; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

}  // namespace trainer
