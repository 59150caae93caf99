// cuDNN's fused attention (nn/cuda/fused_attention.h) against the composed form: forward and backward
// in bf16 and fp16 against the composed path in f32 on the same values (ViT-B/16's 197 tokens and 12
// heads of 64, odd lengths, q, k, v read in place from a packed projection or apart), the packed
// gradient in one tensor, F::packed_self_attention under autograd, the ops inside a captured CUDA
// graph as in an eager call, and the switch that forces the composed path. The op table's attention
// cases compare the same kernels with the CPU; tests/gpu/vit_test.cpp a whole ViT step.
#include "nn/cuda/fused_attention.h"

#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "nn/composed_attention.h"
#include "nn/cuda/cuda_graph.h"
#include "nn/functional.h"
#include "nn/runtime.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer {
namespace {

using namespace gpu_test;

// bf16 keeps 8 bits, f16 11; the products accumulate in f32 either way.
constexpr double kHalfTolerance = 2e-2;

struct Problem {
  int64_t b, h, t, s, d;
  bool packed;  // q, k, v views of one qkv [B, T, 3, H, d] (then s == t)
  std::string name() const {
    std::ostringstream text;
    text << "b" << b << " h" << h << " t" << t << " s" << s << " d" << d << (packed ? " packed" : " apart");
    return text.str();
  }
};

// One problem's inputs in one dtype on the GPU: q, k, v (views of `qkv` when packed) and dy, read
// through a permuted view of [B, T, H, d] memory when packed (as the out-projection hands it back).
struct Inputs {
  Tensor qkv, q, k, v, dy;
};

Inputs draw(const Problem& p, uint64_t seed, DType dtype) {
  Generator gen(seed);
  Inputs in;
  if (p.packed) {
    in.qkv = on_gpu(random({p.b, p.t, 3, p.h, p.d}, gen, dtype, -2.0, 2.0));
    in.q = packed_attention_head(in.qkv, 0), in.k = packed_attention_head(in.qkv, 1);
    in.v = packed_attention_head(in.qkv, 2);
    in.dy = on_gpu(random({p.b, p.t, p.h, p.d}, gen, dtype)).permute({0, 2, 1, 3});
  } else {
    in.q = on_gpu(random({p.b, p.h, p.t, p.d}, gen, dtype, -2.0, 2.0));
    in.k = on_gpu(random({p.b, p.h, p.s, p.d}, gen, dtype, -2.0, 2.0));
    in.v = on_gpu(random({p.b, p.h, p.s, p.d}, gen, dtype, -2.0, 2.0));
    in.dy = on_gpu(random({p.b, p.h, p.t, p.d}, gen, dtype));  // contiguous: the backward copies it
  }
  return in;
}

// The same values in f32 (what the half run sees, rounded), laid out alike.
Inputs in_f32(const Inputs& half) {
  Inputs in;
  auto f32 = [](const Tensor& t) { return on_gpu(as_f32(t)); };
  if (half.qkv.defined()) {
    in.qkv = f32(half.qkv);
    in.q = packed_attention_head(in.qkv, 0), in.k = packed_attention_head(in.qkv, 1);
    in.v = packed_attention_head(in.qkv, 2);
  } else {
    in.q = f32(half.q), in.k = f32(half.k), in.v = f32(half.v);
  }
  in.dy = f32(half.dy);
  return in;
}

double scale_of(const Problem& p) { return 1.0 / std::sqrt(static_cast<double>(p.d)); }

const std::vector<Problem> kProblems = {
    {2, 12, 197, 197, 64, true},                            // ViT-B/16 at 224x224
    {2, 6, 197, 197, 64, false},                            // ViT-S/16's heads, q, k, v apart
    {3, 2, 17, 17, 8, true},                                // odd lengths, the smallest head dim
    {2, 4, 65, 65, 32, true},    {2, 3, 9, 13, 16, false},  // k and v longer than q
};

TEST(FusedAttention, ForwardAndBackwardFollowTheComposedPathInF32) {
  REQUIRE_GPU();
  for (const Problem& p : kProblems) {
    for (DType dtype : {DType::bf16, DType::f16}) {
      const std::string what = p.name() + " " + std::string(dtype_name(dtype));
      const Inputs half = draw(p, 7, dtype), ref = in_f32(half);
      const double scale = scale_of(p);
      const Tensor ref_out = composed_attention(dev(), ref.q, ref.k, ref.v, scale);
      const AttentionGrads ref_g = composed_attention_backward(dev(), ref.dy, ref.q, ref.k, ref.v, scale);
      const std::optional<AttentionForward> f = dev().fused_attention(half.q, half.k, half.v, scale);
      ASSERT_TRUE(f) << what
                     << ": the fused path did not apply (see the warning above, or TRAINER_CUDNN_DEBUG=1)";
      const std::optional<AttentionGrads> g =
          dev().fused_attention_backward(half.dy, half.q, half.k, half.v, f->out, f->stats, scale);
      ASSERT_TRUE(g) << what;
      EXPECT_LT(relative_error(f->out, ref_out), kHalfTolerance) << what;
      EXPECT_LT(relative_error(g->grad_q, ref_g.grad_q), kHalfTolerance) << what;
      EXPECT_LT(relative_error(g->grad_k, ref_g.grad_k), kHalfTolerance) << what;
      EXPECT_LT(relative_error(g->grad_v, ref_g.grad_v), kHalfTolerance) << what;
      // The heads of a token side by side: the out-projection reads the output without a copy.
      EXPECT_TRUE(f->out.permute({0, 2, 1, 3}).is_contiguous()) << what;
      EXPECT_EQ(f->stats.shape(), (Shape{p.b, p.h, p.t, 1})) << what;
      EXPECT_EQ(g->packed.defined(), p.packed) << what;
      if (p.packed) {
        EXPECT_EQ(g->packed.shape(), half.qkv.shape()) << what;
        EXPECT_TRUE(g->grad_q.same_storage(g->packed) && g->grad_v.same_storage(g->packed)) << what;
      }
    }
  }
}

TEST(FusedAttention, DeclinesWhatItCannotRun) {
  REQUIRE_GPU();
  const Problem p{2, 2, 17, 17, 8, true};
  const Inputs f32 = in_f32(draw(p, 3, DType::bf16));
  EXPECT_FALSE(dev().fused_attention(f32.q, f32.k, f32.v, scale_of(p))) << "f32 runs composed";
  const Inputs odd_head = draw({2, 2, 17, 17, 12, false}, 3, DType::bf16);  // head dim not a multiple of 8
  EXPECT_FALSE(dev().fused_attention(odd_head.q, odd_head.k, odd_head.v, 0.3));
  const Inputs half = draw(p, 3, DType::bf16);
  Tensor unrelated_stats = Tensor::zeros({p.b, p.h, p.t, 1}, DType::f32, gpu());
  {
    runtime::ScopedBackendOptions off([](runtime::BackendOptions& o) { o.fused_attention = false; });
    EXPECT_FALSE(dev().fused_attention(half.q, half.k, half.v, scale_of(p)));
  }
  // A backward with no forward of the backend's own to differentiate (no statistics) declines.
  EXPECT_FALSE(
      dev().fused_attention_backward(half.dy, half.q, half.k, half.v, half.dy, Tensor(), scale_of(p)));
}

// F::packed_self_attention under autograd, fused in half precision and composed when the switch is off,
// against the composed f32 run: output and the packed projection's gradient.
TEST(FusedAttention, PackedSelfAttentionUnderAutogradFollowsF32) {
  REQUIRE_GPU();
  const Problem p{2, 12, 197, 197, 64, true};
  for (DType dtype : {DType::bf16, DType::f16}) {
    const Inputs half = draw(p, 11, dtype), ref = in_f32(half);
    auto run = [](const Inputs& in, Tensor* grad) {
      Variable qkv(in.qkv, true);
      Variable out = F::packed_self_attention(qkv);  // [N, T, H, d]
      out.backward(in.dy.permute({0, 2, 1, 3}));
      *grad = qkv.grad();
      return out.data();
    };
    Tensor ref_grad, fused_grad, composed_grad;
    const Tensor ref_out = run(ref, &ref_grad);
    const int64_t forwards = cuda::fused_attention_forward_calls(),
                  backwards = cuda::fused_attention_backward_calls();
    const Tensor fused_out = run(half, &fused_grad);
    EXPECT_EQ(cuda::fused_attention_forward_calls() - forwards, 1);
    EXPECT_EQ(cuda::fused_attention_backward_calls() - backwards, 1);
    Tensor composed_out;
    {
      runtime::ScopedBackendOptions off([](runtime::BackendOptions& o) { o.fused_attention = false; });
      composed_out = run(half, &composed_grad);
    }
    EXPECT_EQ(cuda::fused_attention_forward_calls() - forwards, 1)
        << "the switch must force the composed path";
    EXPECT_LT(relative_error(fused_out, ref_out), kHalfTolerance) << dtype_name(dtype);
    EXPECT_LT(relative_error(fused_grad, ref_grad), kHalfTolerance) << dtype_name(dtype);
    EXPECT_LT(relative_error(composed_out, ref_out), kHalfTolerance) << dtype_name(dtype);
    EXPECT_LT(relative_error(composed_grad, ref_grad), kHalfTolerance) << dtype_name(dtype);
  }
}

// Forward and backward captured after an eager call of the shape, replayed on new values: the eager
// results on those values (the forward bit for bit; dQ sums in a varying order, so the gradient to
// rounding).
TEST(FusedAttention, CapturedInACudaGraphGivesTheEagerResult) {
  REQUIRE_GPU();
  const Problem p{4, 6, 197, 197, 64, true};
  const Inputs first = draw(p, 21, DType::bf16), second = draw(p, 22, DType::bf16);
  Variable qkv(first.qkv.clone(), true);
  const Tensor dy = first.dy.permute({0, 2, 1, 3}).clone();  // [N, T, H, d]
  Tensor out, grad;
  auto step = [&] {
    qkv.zero_grad();
    Variable o = F::packed_self_attention(qkv);
    o.backward(dy);
    out = o.data(), grad = qkv.grad();
  };
  auto eager_on = [&](const Tensor& values, Tensor* eager_out, Tensor* eager_grad) {
    qkv.data().copy_(values);
    step();
    *eager_out = out.clone(), *eager_grad = grad.clone();
  };
  Tensor out1, grad1, out2, grad2;
  eager_on(second.qkv, &out2, &grad2);
  eager_on(first.qkv, &out1, &grad1);  // the shape's plans exist now
  const int64_t forwards = cuda::fused_attention_forward_calls();
  cuda::CudaGraph graph;
  graph.capture(step);
  EXPECT_EQ(cuda::fused_attention_forward_calls() - forwards, 1) << "the capture must hold the fused forward";
  for (const auto& [values, want_out, want_grad] :
       {std::tuple{first.qkv, out1, grad1}, std::tuple{second.qkv, out2, grad2}}) {
    qkv.data().copy_(values);
    graph.replay();
    expect_close(as_f32(want_out), as_f32(out), 0.0, 0.0, "replayed output");
    EXPECT_LT(relative_error(grad, want_grad), 1e-2);
  }
}

// A shape first met inside a capture cannot have its plans built there: it runs composed, correctly.
TEST(FusedAttention, AShapeFirstSeenInACaptureRunsComposed) {
  REQUIRE_GPU();
  const Problem p{2, 4, 33, 33, 40, true};  // no other test uses this shape
  const Inputs half = draw(p, 31, DType::bf16), ref = in_f32(half);
  const Tensor ref_out = composed_attention(dev(), ref.q, ref.k, ref.v, scale_of(p)).permute({0, 2, 1, 3});
  auto attend = [&] { return F::packed_self_attention(Variable(half.qkv)).data(); };
  {
    // The composed kernels of this shape run once eagerly (what a captured step's warm-up does), the
    // fused path kept off so the shape stays unseen by it.
    runtime::ScopedBackendOptions off([](runtime::BackendOptions& o) { o.fused_attention = false; });
    EXPECT_LT(relative_error(attend(), ref_out), kHalfTolerance) << "eager";
  }
  Tensor out;
  const int64_t forwards = cuda::fused_attention_forward_calls();
  cuda::CudaGraph graph;
  graph.capture([&] { out = attend(); });
  graph.replay();
  EXPECT_EQ(cuda::fused_attention_forward_calls(), forwards);
  EXPECT_LT(relative_error(out, ref_out), kHalfTolerance) << "replayed";
}

}  // namespace
}  // namespace trainer
