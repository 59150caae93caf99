#pragma once
// Hints from the model to the backend about who consumes an op's output, for fusions that pay only
// when the consumer is known. Thread-local and scoped: the hint covers the ops issued on this thread
// while the scope lives.
//
// ConvFeedsBatchNormStats: the convolution about to run feeds a BatchNorm in training mode, which will
// compute its batch statistics from the convolution's output next. The CUDA backend may then compute
// the per-channel sums in the convolution's epilogue (nn/cuda/conv_stats_fusion.h) and hand them to
// that BatchNorm. Set by Conv2d::forward for convolutions marked set_feeds_batch_norm(true).
namespace trainer {

class ConvFeedsBatchNormStats {
 public:
  explicit ConvFeedsBatchNormStats(bool on);
  ~ConvFeedsBatchNormStats();
  ConvFeedsBatchNormStats(const ConvFeedsBatchNormStats&) = delete;
  ConvFeedsBatchNormStats& operator=(const ConvFeedsBatchNormStats&) = delete;
  static bool active();

 private:
  bool previous_;
};

}  // namespace trainer
