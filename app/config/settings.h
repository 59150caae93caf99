#pragma once
// The config's enumerated settings: each is an enum once parsed (never a string compared wherever it
// is used), and each enum's TOML names come from one place -- SettingNames<E> -- which the schema's
// allowed values, the parser, the TOML writer and the messages all read. The Precision pattern
// (nn/amp/precision_policy.h), for every enumerated key.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/augment/augment.h"
#include "data/bad_samples.h"
#include "data/cache_mode.h"
#include "nn/amp/precision_policy.h"
#include "nn/loss_kind.h"
#include "nn/optim/lr_schedule.h"

namespace trainer {

enum class StemChoice { automatic, imagenet, cifar };   // model.stem; automatic = cifar up to 64 px
enum class BnStatsSync { average, none };               // model.bn_stats_sync
enum class DeviceChoice { automatic, cpu, cuda };       // train.device
enum class LrScaling { none, linear };                  // optim.lr_scaling
enum class CommBackendChoice { automatic, nccl, tcp };  // dist.backend
enum class OnCheckpointError { keep_training, stop };   // checkpoint.on_error
enum class OptimizerKind { sgd, adamw, lamb, lars };    // optim.name
enum class KeepBestOn { model, ema };                   // checkpoint.keep_best_on

// For each enumerated setting: `values`, every value in the order the messages list them, and
// name(value), its TOML spelling.
template <class E>
struct SettingNames;

template <>
struct SettingNames<StemChoice> {
  static constexpr StemChoice values[] = {StemChoice::automatic, StemChoice::imagenet, StemChoice::cifar};
  static std::string name(StemChoice v);
};
template <>
struct SettingNames<BnStatsSync> {
  static constexpr BnStatsSync values[] = {BnStatsSync::average, BnStatsSync::none};
  static std::string name(BnStatsSync v);
};
template <>
struct SettingNames<DeviceChoice> {
  static constexpr DeviceChoice values[] = {DeviceChoice::automatic, DeviceChoice::cpu, DeviceChoice::cuda};
  static std::string name(DeviceChoice v);
};
template <>
struct SettingNames<LrScaling> {
  static constexpr LrScaling values[] = {LrScaling::none, LrScaling::linear};
  static std::string name(LrScaling v);
};
template <>
struct SettingNames<CommBackendChoice> {
  static constexpr CommBackendChoice values[] = {CommBackendChoice::automatic, CommBackendChoice::nccl,
                                                 CommBackendChoice::tcp};
  static std::string name(CommBackendChoice v);
};
template <>
struct SettingNames<OptimizerKind> {
  static constexpr OptimizerKind values[] = {OptimizerKind::sgd, OptimizerKind::adamw, OptimizerKind::lamb,
                                             OptimizerKind::lars};
  static std::string name(OptimizerKind v);
};
template <>
struct SettingNames<KeepBestOn> {
  static constexpr KeepBestOn values[] = {KeepBestOn::model, KeepBestOn::ema};
  static std::string name(KeepBestOn v);
};
template <>
struct SettingNames<OnCheckpointError> {
  static constexpr OnCheckpointError values[] = {OnCheckpointError::keep_training, OnCheckpointError::stop};
  static std::string name(OnCheckpointError v);
};
// The enums of the layers below, spelled by their own name functions.
template <>
struct SettingNames<BadSamplePolicy> {
  static constexpr BadSamplePolicy values[] = {BadSamplePolicy::error, BadSamplePolicy::skip};
  static std::string name(BadSamplePolicy v) { return to_string(v); }
};
template <>
struct SettingNames<CacheMode> {
  static constexpr CacheMode values[] = {CacheMode::none, CacheMode::encoded, CacheMode::decoded};
  static std::string name(CacheMode v) { return to_string(v); }
};
template <>
struct SettingNames<AugmentPolicy> {
  static constexpr AugmentPolicy values[] = {AugmentPolicy::none, AugmentPolicy::randaugment,
                                             AugmentPolicy::trivialaugment, AugmentPolicy::autoaugment};
  static std::string name(AugmentPolicy v) { return to_string(v); }
};
template <>
struct SettingNames<ErasingValue> {
  static constexpr ErasingValue values[] = {ErasingValue::zero, ErasingValue::random};
  static std::string name(ErasingValue v) { return to_string(v); }
};
template <>
struct SettingNames<ScheduleKind> {
  static constexpr ScheduleKind values[] = {ScheduleKind::constant, ScheduleKind::step,
                                            ScheduleKind::multistep, ScheduleKind::cosine,
                                            ScheduleKind::onecycle};
  static std::string name(ScheduleKind v) { return std::string(schedule_kind_name(v)); }
};
template <>
struct SettingNames<Precision> {
  static constexpr Precision values[] = {Precision::fp32, Precision::tf32, Precision::bf16, Precision::fp16};
  static std::string name(Precision v) { return std::string(precision_name(v)); }
};
template <>
struct SettingNames<LossKind> {
  static constexpr LossKind values[] = {LossKind::cross_entropy, LossKind::bce};
  static std::string name(LossKind v) { return std::string(loss_kind_name(v)); }
};

template <class E>
concept Setting = requires {
  SettingNames<E>::values;
};

template <Setting E>
std::string setting_name(E value) {
  return SettingNames<E>::name(value);
}

// Every name of E, in its table's order (the schema's allowed values).
template <Setting E>
std::vector<std::string> setting_names() {
  std::vector<std::string> names;
  for (E v : SettingNames<E>::values) names.push_back(SettingNames<E>::name(v));
  return names;
}

// The value named `name`, or none.
template <Setting E>
std::optional<E> parse_setting(std::string_view name) {
  for (E v : SettingNames<E>::values)
    if (SettingNames<E>::name(v) == name) return v;
  return std::nullopt;
}

}  // namespace trainer
