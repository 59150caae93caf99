#include "nn/cuda/fused_attention_graph.h"

#include <initializer_list>
#include <utility>

namespace trainer::cuda::attention {
namespace {

using namespace cudnn_graph;
using conv_stats::OpGraph;

constexpr int64_t kAlignment = 16;
constexpr cudnnDataType_t kF32 = CUDNN_DATA_FLOAT;

Dims dense(const Dims& dims) { return {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1}; }
// The last two dims (or strides) swapped: k as k^T, a matrix read as its transpose.
Dims swap_last(const Dims& x) { return {x[0], x[1], x[3], x[2]}; }

cudnnDataType_t io_type(DType d) { return d == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

// Adds one graph's tensors and operations, in the order given, and remembers the first refusal (every
// later call then does nothing).
class Builder {
 public:
  explicit Builder(OpGraph& g) : g_(g) {}
  bool good() const { return good_; }

  cudnnBackendDescriptor_t memory(int64_t uid, cudnnDataType_t dt, const Dims& dims, const Dims& strides) {
    return keep(strided_tensor_desc(uid, dt, dims, strides, kAlignment));
  }
  // An intermediate that never reaches memory (dense strides unless given).
  cudnnBackendDescriptor_t virt(cudnnDataType_t dt, const Dims& dims) { return virt(dt, dims, dense(dims)); }
  cudnnBackendDescriptor_t virt(cudnnDataType_t dt, const Dims& dims, const Dims& strides) {
    return keep(strided_tensor_desc(next_uid_++, dt, dims, strides, kAlignment, Residence::is_virtual));
  }
  // A host float the variant pack passes by value.
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return keep(strided_tensor_desc(uid, kF32, {1, 1, 1, 1}, {1, 1, 1, 1}, kAlignment, Residence::by_value));
  }

  // out = mode(in, b), elementwise in f32; b is null for a unary mode.
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t in, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t out) {
    good_ = good_ && conv_stats::add_pointwise(g_, mode, in, b, out);
  }
  // c = a @ b over the last two dims, batched over the first two, accumulating in f32.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    const cudnnBackendDescriptor_t m =
        f32_descriptor(CUDNN_BACKEND_MATMUL_DESCRIPTOR, CUDNN_ATTR_MATMUL_COMP_TYPE);
    operation(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, a},
                                                          {CUDNN_ATTR_OPERATION_MATMUL_BDESC, b},
                                                          {CUDNN_ATTR_OPERATION_MATMUL_CDESC, c},
                                                          {CUDNN_ATTR_OPERATION_MATMUL_DESC, m}});
  }
  // out = reduce(in) over the dims where out has size 1, in f32.
  void reduction(cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t in, cudnnBackendDescriptor_t out) {
    const cudnnBackendDescriptor_t r =
        f32_descriptor(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_ATTR_REDUCTION_COMP_TYPE, &reduce);
    operation(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, {{CUDNN_ATTR_OPERATION_REDUCTION_XDESC, in},
                                                             {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, out},
                                                             {CUDNN_ATTR_OPERATION_REDUCTION_DESC, r}});
  }
  // out = m^T @ b for an f32 intermediate m [b, h, r, c], its transpose read in the inputs' dtype `io`
  // (the backward's P^T dO and dS^T q).
  void transposed_matmul(cudnnDataType_t io, const Dims& m_dims, cudnnBackendDescriptor_t m,
                         cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t out) {
    cudnnBackendDescriptor_t m_t = virt(io, swap_last(m_dims), swap_last(dense(m_dims)));
    reshape(m, m_t);
    matmul(m_t, b, out);
  }
  // out is in relabelled (here: a matrix read as its transpose, dims and strides swapped together).
  void reshape(cudnnBackendDescriptor_t in, cudnnBackendDescriptor_t out) {
    operation(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
              {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, in}, {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, out}});
  }

 private:
  // A finalised descriptor of `type` (kept with the graph) computing in f32 (attribute `precision`),
  // with a reduction's operator when `reduce` is given.
  cudnnBackendDescriptor_t f32_descriptor(cudnnBackendDescriptorType_t type,
                                          cudnnBackendAttributeName_t precision,
                                          const cudnnReduceTensorOp_t* reduce = nullptr) {
    if (!good_) return nullptr;
    BackendDesc& d = g_.keep(BackendDesc(type));
    good_ = d && set(d.get(), precision, CUDNN_TYPE_DATA_TYPE, 1, &kF32) &&
            (!reduce ||
             set(d.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, reduce)) &&
            GRAPH_OK(cudnnBackendFinalize(d.get()));
    return d.get();
  }
  // A finalised operation of `type` whose attributes name these descriptors, added to the graph.
  void operation(
      cudnnBackendDescriptorType_t type,
      std::initializer_list<std::pair<cudnnBackendAttributeName_t, cudnnBackendDescriptor_t>> parts) {
    if (!good_) return;
    BackendDesc op(type);
    good_ = static_cast<bool>(op);
    for (auto [name, d] : parts) good_ = good_ && set(op.get(), name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
    good_ = good_ && g_.add_op(std::move(op));
  }

  cudnnBackendDescriptor_t keep(BackendDesc d) {
    if (!d) good_ = false;
    return g_.keep(std::move(d)).get();
  }

  OpGraph& g_;
  int64_t next_uid_ = kFirstVirtual;
  bool good_ = true;
};

OpGraph finalized(OpGraph& g, const Builder& x, cudnnHandle_t handle) {
  if (!x.good() || !g.finalize(handle)) return OpGraph();
  return std::move(g);
}

}  // namespace

OpGraph build_forward(cudnnHandle_t handle, const Problem& p) {
  OpGraph g;
  Builder x(g);
  const cudnnDataType_t io = io_type(p.dtype);
  const Dims scores{p.b, p.h, p.t, p.s}, rows{p.b, p.h, p.t, 1};
  cudnnBackendDescriptor_t q = x.memory(kQ, io, {p.b, p.h, p.t, p.d}, p.q_strides);
  cudnnBackendDescriptor_t kt = x.memory(kK, io, {p.b, p.h, p.d, p.s}, swap_last(p.k_strides));
  cudnnBackendDescriptor_t v = x.memory(kV, io, {p.b, p.h, p.s, p.dv}, p.v_strides);
  cudnnBackendDescriptor_t o = x.memory(kO, io, {p.b, p.h, p.t, p.dv}, p.o_strides);
  cudnnBackendDescriptor_t stats = x.memory(kStats, kF32, rows, dense(rows));
  cudnnBackendDescriptor_t scale = x.scalar(kScale);
  // S = scale * q k^T, then the softmax as the engines recognise it, with stats = max + log(sum).
  cudnnBackendDescriptor_t s0 = x.virt(kF32, scores), s1 = x.virt(kF32, scores);
  x.matmul(q, kt, s0);
  x.pointwise(CUDNN_POINTWISE_MUL, s0, scale, s1);
  cudnnBackendDescriptor_t max = x.virt(kF32, rows), centred = x.virt(kF32, scores);
  x.reduction(CUDNN_REDUCE_TENSOR_MAX, s1, max);
  x.pointwise(CUDNN_POINTWISE_SUB, s1, max, centred);
  cudnnBackendDescriptor_t e = x.virt(kF32, scores), sum = x.virt(kF32, rows), log_sum = x.virt(kF32, rows);
  x.pointwise(CUDNN_POINTWISE_EXP, centred, nullptr, e);
  x.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  x.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, log_sum);
  x.pointwise(CUDNN_POINTWISE_ADD, max, log_sum, stats);
  // The probabilities in the inputs' dtype: the second product's operand, as in cudnn-frontend.
  cudnnBackendDescriptor_t probs = x.virt(io, scores);
  x.pointwise(CUDNN_POINTWISE_DIV, e, sum, probs);
  x.matmul(probs, v, o);
  return finalized(g, x, handle);
}

OpGraph build_backward(cudnnHandle_t handle, const Problem& p) {
  OpGraph g;
  Builder x(g);
  const cudnnDataType_t io = io_type(p.dtype);
  const Dims q_dims{p.b, p.h, p.t, p.d}, k_dims{p.b, p.h, p.s, p.d}, o_dims{p.b, p.h, p.t, p.dv};
  const Dims scores{p.b, p.h, p.t, p.s}, rows{p.b, p.h, p.t, 1};
  cudnnBackendDescriptor_t q = x.memory(kQ, io, q_dims, p.q_strides);
  cudnnBackendDescriptor_t kt = x.memory(kK, io, swap_last(k_dims), swap_last(p.k_strides));
  cudnnBackendDescriptor_t vt = x.memory(kV, io, {p.b, p.h, p.dv, p.s}, swap_last(p.v_strides));
  cudnnBackendDescriptor_t o = x.memory(kO, io, o_dims, p.o_strides);
  cudnnBackendDescriptor_t d_o = x.memory(kDo, io, o_dims, p.o_strides);
  cudnnBackendDescriptor_t stats = x.memory(kStats, kF32, rows, dense(rows));
  cudnnBackendDescriptor_t dq = x.memory(kDq, io, q_dims, p.dq_strides);
  cudnnBackendDescriptor_t dk = x.memory(kDk, io, k_dims, p.dk_strides);
  cudnnBackendDescriptor_t dv = x.memory(kDv, io, {p.b, p.h, p.s, p.dv}, p.dv_strides);
  cudnnBackendDescriptor_t softmax_sum = x.memory(kSoftmaxSum, kF32, rows, dense(rows));
  cudnnBackendDescriptor_t dq_accum = x.memory(kDqAccum, kF32, q_dims, dense(q_dims));
  cudnnBackendDescriptor_t scale = x.scalar(kScale), one = x.scalar(kOne);
  // softmax_sum = sum over dv of dO * O: the softmax backward's row term.
  cudnnBackendDescriptor_t d_o_o = x.virt(kF32, o_dims), row_sum = x.virt(kF32, rows);
  x.pointwise(CUDNN_POINTWISE_MUL, d_o, o, d_o_o);
  x.reduction(CUDNN_REDUCE_TENSOR_ADD, d_o_o, row_sum);
  x.pointwise(CUDNN_POINTWISE_MUL, row_sum, one, softmax_sum);
  // P = exp(scale * q k^T - stats): the forward's probabilities, recomputed.
  cudnnBackendDescriptor_t s0 = x.virt(kF32, scores), s1 = x.virt(kF32, scores), s2 = x.virt(kF32, scores);
  cudnnBackendDescriptor_t probs = x.virt(kF32, scores);
  x.matmul(q, kt, s0);
  x.pointwise(CUDNN_POINTWISE_MUL, s0, scale, s1);
  x.pointwise(CUDNN_POINTWISE_SUB, s1, stats, s2);
  x.pointwise(CUDNN_POINTWISE_EXP, s2, nullptr, probs);
  x.transposed_matmul(io, scores, probs, d_o, dv);  // dV = P^T dO
  // dS = scale * P * (dO V^T - softmax_sum).
  cudnnBackendDescriptor_t dp = x.virt(kF32, scores), dp_centred = x.virt(kF32, scores);
  cudnnBackendDescriptor_t ds_unscaled = x.virt(kF32, scores), ds = x.virt(kF32, scores);
  x.matmul(d_o, vt, dp);
  x.pointwise(CUDNN_POINTWISE_SUB, dp, softmax_sum, dp_centred);
  x.pointwise(CUDNN_POINTWISE_MUL, dp_centred, probs, ds_unscaled);
  x.pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, scale, ds);
  x.transposed_matmul(io, scores, ds, q, dk);  // dK = dS^T q
  // dQ = dS k, accumulated in f32 across key blocks, then converted.
  cudnnBackendDescriptor_t k = x.virt(kF32, k_dims, p.k_strides);
  x.reshape(kt, k);
  x.matmul(ds, k, dq_accum);
  x.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, dq);
  return finalized(g, x, handle);
}

}  // namespace trainer::cuda::attention
