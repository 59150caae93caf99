#include "app/config/settings.h"

namespace trainer {

std::string SettingNames<StemChoice>::name(StemChoice v) {
  switch (v) {
    case StemChoice::imagenet:
      return "imagenet";
    case StemChoice::cifar:
      return "cifar";
    case StemChoice::automatic:
      break;
  }
  return "auto";
}

std::string SettingNames<BnStatsSync>::name(BnStatsSync v) {
  return v == BnStatsSync::none ? "none" : "average";
}

std::string SettingNames<DeviceChoice>::name(DeviceChoice v) {
  switch (v) {
    case DeviceChoice::cpu:
      return "cpu";
    case DeviceChoice::cuda:
      return "cuda";
    case DeviceChoice::automatic:
      break;
  }
  return "auto";
}

std::string SettingNames<LrScaling>::name(LrScaling v) { return v == LrScaling::linear ? "linear" : "none"; }

std::string SettingNames<CommBackendChoice>::name(CommBackendChoice v) {
  switch (v) {
    case CommBackendChoice::nccl:
      return "nccl";
    case CommBackendChoice::tcp:
      return "tcp";
    case CommBackendChoice::automatic:
      break;
  }
  return "auto";
}

std::string SettingNames<OptimizerKind>::name(OptimizerKind v) {
  switch (v) {
    case OptimizerKind::adamw:
      return "adamw";
    case OptimizerKind::lamb:
      return "lamb";
    case OptimizerKind::lars:
      return "lars";
    case OptimizerKind::sgd:
      break;
  }
  return "sgd";
}

std::string SettingNames<KeepBestOn>::name(KeepBestOn v) { return v == KeepBestOn::ema ? "ema" : "model"; }

std::string SettingNames<OnCheckpointError>::name(OnCheckpointError v) {
  return v == OnCheckpointError::stop ? "stop" : "continue";
}

}  // namespace trainer
