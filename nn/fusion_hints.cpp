#include "nn/fusion_hints.h"

namespace trainer {
namespace {
thread_local bool t_conv_feeds_batch_norm_stats = false;
}  // namespace

ConvFeedsBatchNormStats::ConvFeedsBatchNormStats(bool on) : previous_(t_conv_feeds_batch_norm_stats) {
  t_conv_feeds_batch_norm_stats = on;
}
ConvFeedsBatchNormStats::~ConvFeedsBatchNormStats() { t_conv_feeds_batch_norm_stats = previous_; }
bool ConvFeedsBatchNormStats::active() { return t_conv_feeds_batch_norm_stats; }

}  // namespace trainer
