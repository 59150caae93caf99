#pragma once
// Mixup and CutMix per element, shared by the CPU and CUDA kernels (host and device code): what a
// pixel of the mixed batch is, and what a class's target is, given the step's draws. One formula for
// both backends, so their batches cannot drift apart.
//
// The draws travel as f64 [kMixDrawValues] on the batch's device (the CUDA kernels read them there, so
// a captured step takes new draws on every replay): whether the step cuts (CutMix) or blends (Mixup),
// lambda (for CutMix already corrected to the box's true area), and the box [y0, y1) x [x0, x1).
// lambda = 1 with blending leaves the batch as it is (1 * x + 0 * x' = x).
#include <cstdint>

#if !defined(TRAINER_HOST_DEVICE)
#if defined(__CUDACC__)
#define TRAINER_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TRAINER_HOST_DEVICE inline
#endif
#endif

namespace trainer {

enum MixDrawIndex : int {
  kMixCutmix = 0,  // 1: paste the partner's box; 0: blend with the partner
  kMixLambda,      // the weight of the sample's own image and label
  kMixBoxY0,       // the box's rows [y0, y1) and columns [x0, x1), clipped to the image
  kMixBoxY1,
  kMixBoxX0,
  kMixBoxX1,
  kMixDrawValues,
};

// Sample i is mixed with sample N - 1 - i (timm's x.flip(0)).
TRAINER_HOST_DEVICE int64_t mix_partner(int64_t i, int64_t n) { return n - 1 - i; }

TRAINER_HOST_DEVICE bool in_mix_box(const double* draws, int64_t y, int64_t x) {
  const double fy = static_cast<double>(y), fx = static_cast<double>(x);
  return fy >= draws[kMixBoxY0] && fy < draws[kMixBoxY1] && fx >= draws[kMixBoxX0] && fx < draws[kMixBoxX1];
}

// The mixed value of pixel (y, x) of a sample whose value is `own` and whose partner's is `partner`,
// computed in T (the kernel's compute type) as timm does in the batch's dtype.
template <class T>
TRAINER_HOST_DEVICE T mixed_pixel(const double* draws, int64_t y, int64_t x, T own, T partner) {
  if (draws[kMixCutmix] != 0.0) return in_mix_box(draws, y, x) ? partner : own;
  const T lam = static_cast<T>(draws[kMixLambda]);
  return own * lam + partner * (static_cast<T>(1) - lam);
}

// The target of class k for a sample labelled `own` whose partner is labelled `partner`: label smoothing
// puts `off` = eps / K on every class and `on` = 1 - eps + off on the label; lambda mixes the two.
TRAINER_HOST_DEVICE double mixed_target(const double* draws, int64_t k, int64_t own, int64_t partner,
                                        double on, double off) {
  const double lam = draws[kMixLambda];
  return lam * (k == own ? on : off) + (1.0 - lam) * (k == partner ? on : off);
}

}  // namespace trainer
