#pragma once
#include <cstdint>
// train.cudnn_batchnorm: the batch norm's backward (and, where it times faster, its forward: below)
// through cuDNN's NHWC batch-norm kernels
// (cudnnBatchNormalizationBackwardEx, CUDNN_BATCHNORM_SPATIAL_PERSISTENT) after our forward: one call
// for grad_x, grad_gamma and grad_beta instead of our reduction and our elementwise pass, with the
// fused ReLU's mask applied by cuDNN (CUDNN_BATCHNORM_OPS_BN_ACTIVATION, given our output y; cuDNN
// does not document whether it masks by y or by its own recomputed pre-activation). Its backward is
// clearly faster than ours on large activations (resnet18-cifar's large stages), as
// bench/cudnn_bn_probe times it (figures: bench/PERF_NOTES.md, v9).
//
// CudaBackend::bn_backward_fused takes it for bf16/f16 channels-last 4-D inputs with f32 gamma, beta
// and statistics, when on and not under train.deterministic (cuDNN documents no determinism for these
// kernels). Elsewhere, or where cuDNN declines a shape (at its descriptors, its workspace query, a
// reserve space it would want, or its first call), the caller runs our two kernels.

namespace trainer::cuda {

// runtime::BackendOptions::cudnn_batch_norm.
bool cudnn_batch_norm_enabled();
// Backward calls cuDNN has run so far (tests: that the option took effect).
int64_t cudnn_batch_norm_calls();

// The forward (nn/cuda/cudnn_batch_norm_forward.cpp), where cuDNN times faster than ours shape by
// shape, comes with the option (BackendOptions::cudnn_batch_norm_forward, on unless set off;
// nn_bench --cudnn-bn-forward 0 measures without it): a small gain on resnet18-cifar, larger at small
// batches, and none at resnet50. Its outputs and statistics match ours layer by layer, and a whole bf16 step
// with it is no further from the f32 step than ours (CudnnBatchNorm.AResNetStepIsAsCloseToTheF32StepAsOurs;
// figures: bench/PERF_NOTES.md, v14). Tests force it on every shape cuDNN takes, without timing, to compare
// it with ours (BackendOptions::force_cudnn_batch_norm_forward).
int64_t cudnn_batch_norm_forward_calls();

}  // namespace trainer::cuda
