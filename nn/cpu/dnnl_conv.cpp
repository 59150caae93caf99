// oneDNN convolutions for the CPU backend (see dnnl_conv.h for what is taken and why).
//
// Creating a oneDNN primitive costs far more than running a small one, so each is made once per
// (direction, shape, layout) and kept for the process. The primitive chooses its own memory layout
// (format_tag::any): for NCHW tensors it picks a blocked one (nChw16c) and the activations are
// reordered in and out around every call. Measured on resnet18-cifar, batch 64, 2 cores: the JIT
// kernels on blocked data with the reorders beat oneDNN's kernels on our plain layout (its NCHW path
// is a GEMM-based one no faster than ours), see bench/PERF_NOTES.md.
#include "nn/cpu/dnnl_conv.h"

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "nn/cpu/dnnl_blocked_copies.h"

namespace trainer {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

enum class Direction : uint8_t { forward, backward_input, backward_weight };

struct Layer {
  Shape x_shape, w_shape;  // [N, C, H, W], [O, C/groups, KH, KW]
  Conv2dParams p;
  bool channels_last = false;  // of the activations (x, y, and their gradients)
  bool bias = false;           // forward only
};

// The primitive and, for each of its arguments, the layout it wants and the layout we hold.
struct Plan {
  dnnl::primitive primitive;
  struct Arg {
    int id;
    memory::desc ours, wanted;
    // ours -> wanted for an input, wanted -> ours for the output; none when the two agree.
    std::optional<dnnl::reorder> reorder = std::nullopt;
  };
  std::vector<Arg> inputs;
  Arg output;
};

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

memory::dims dims_of(const Shape& s) { return memory::dims(s.begin(), s.end()); }

// The weight as oneDNN names it: [G, O/G, C/G, KH, KW] when grouped.
memory::desc weight_desc(const Layer& l, bool any) {
  memory::dims d = dims_of(l.w_shape);
  const int64_t g = l.p.groups;
  if (g > 1) d = {g, d[0] / g, d[1], d[2], d[3]};
  return memory::desc(d, memory::data_type::f32, any ? Tag::any : (g > 1 ? Tag::goihw : Tag::oihw));
}

memory::desc activation_desc(const Shape& s, const Layer& l, bool any) {
  return memory::desc(dims_of(s), memory::data_type::f32,
                      any ? Tag::any : (l.channels_last ? Tag::nhwc : Tag::nchw));
}

Shape output_shape(const Layer& l) {
  const Conv2dParams& p = l.p;
  return {l.x_shape[0], l.w_shape[0],
          conv_output_size(l.x_shape[2], static_cast<int>(l.w_shape[2]), p.stride_h, p.pad_h, p.dilation_h),
          conv_output_size(l.x_shape[3], static_cast<int>(l.w_shape[3]), p.stride_w, p.pad_w, p.dilation_w)};
}

// The forward primitive descriptor; the backward ones need it as a hint. Padding is symmetric, as
// PyTorch passes it: oneDNN's shape check floors like conv_output_size does.
dnnl::convolution_forward::primitive_desc forward_desc(const Layer& l, bool with_bias) {
  const Conv2dParams& p = l.p;
  const memory::dims strides = {p.stride_h, p.stride_w};
  const memory::dims dilation = {p.dilation_h - 1, p.dilation_w - 1};  // oneDNN counts the gaps
  const memory::dims pad = {p.pad_h, p.pad_w};
  const memory::desc bias =
      with_bias ? memory::desc({l.w_shape[0]}, memory::data_type::f32, Tag::x) : memory::desc();
  dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                    activation_desc(l.x_shape, l, true), weight_desc(l, true), bias,
                                    activation_desc(output_shape(l), l, true), strides, dilation, pad, pad);
  return {d, cpu_engine()};
}

Plan make_plan(Direction dir, const Layer& l) {
  const Conv2dParams& p = l.p;
  const memory::dims strides = {p.stride_h, p.stride_w};
  const memory::dims dilation = {p.dilation_h - 1, p.dilation_w - 1};
  const memory::dims pad = {p.pad_h, p.pad_w};
  const memory::desc x = activation_desc(l.x_shape, l, false), y = activation_desc(output_shape(l), l, false);
  const memory::desc w = weight_desc(l, false);
  Plan plan;
  if (dir == Direction::forward) {
    auto pd = forward_desc(l, l.bias);
    plan.primitive = dnnl::convolution_forward(pd);
    plan.inputs = {{DNNL_ARG_SRC, x, pd.src_desc()}, {DNNL_ARG_WEIGHTS, w, pd.weights_desc()}};
    if (l.bias) plan.inputs.push_back({DNNL_ARG_BIAS, pd.bias_desc(), pd.bias_desc()});
    plan.output = {DNNL_ARG_DST, y, pd.dst_desc()};
  } else if (dir == Direction::backward_input) {
    dnnl::convolution_backward_data::desc d(
        dnnl::algorithm::convolution_direct, activation_desc(l.x_shape, l, true), weight_desc(l, true),
        activation_desc(output_shape(l), l, true), strides, dilation, pad, pad);
    dnnl::convolution_backward_data::primitive_desc pd(d, cpu_engine(), forward_desc(l, false));
    plan.primitive = dnnl::convolution_backward_data(pd);
    plan.inputs = {{DNNL_ARG_DIFF_DST, y, pd.diff_dst_desc()}, {DNNL_ARG_WEIGHTS, w, pd.weights_desc()}};
    plan.output = {DNNL_ARG_DIFF_SRC, x, pd.diff_src_desc()};
  } else {
    dnnl::convolution_backward_weights::desc d(
        dnnl::algorithm::convolution_direct, activation_desc(l.x_shape, l, true), weight_desc(l, true),
        activation_desc(output_shape(l), l, true), strides, dilation, pad, pad);
    dnnl::convolution_backward_weights::primitive_desc pd(d, cpu_engine(), forward_desc(l, false));
    plan.primitive = dnnl::convolution_backward_weights(pd);
    plan.inputs = {{DNNL_ARG_SRC, x, pd.src_desc()}, {DNNL_ARG_DIFF_DST, y, pd.diff_dst_desc()}};
    plan.output = {DNNL_ARG_DIFF_WEIGHTS, w, pd.diff_weights_desc()};
  }
  for (Plan::Arg& a : plan.inputs)
    if (a.ours != a.wanted)
      a.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), a.ours, cpu_engine(), a.wanted));
  Plan::Arg& o = plan.output;
  if (o.ours != o.wanted)
    o.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), o.wanted, cpu_engine(), o.ours));
  return plan;
}

using Key = std::tuple<Direction, Shape, Shape, int, int, int, int, int, int, int, bool, bool>;

// The plan for a layer, made on first use; nullopt when oneDNN rejects the layer (remembered too).
const Plan* plan_for(Direction dir, const Layer& l) {
  static std::mutex mutex;
  static std::map<Key, std::optional<Plan>> plans;
  const Conv2dParams& p = l.p;
  const Key key{dir,     l.x_shape,    l.w_shape,    p.stride_h, p.stride_w,      p.pad_h,
                p.pad_w, p.dilation_h, p.dilation_w, p.groups,   l.channels_last, l.bias};
  std::lock_guard lock(mutex);
  auto it = plans.find(key);
  if (it == plans.end()) {
    std::optional<Plan> plan;
    try {
      plan = make_plan(dir, l);
    } catch (const dnnl::error&) {
      // No oneDNN implementation for this shape: the caller's im2col path takes it.
    }
    it = plans.emplace(key, std::move(plan)).first;
  }
  return it->second ? &*it->second : nullptr;
}

// Memory in the primitive's layout; from our allocator, so that it is reused and counted.
memory scratch(const memory::desc& desc, std::vector<Tensor>& keep) {
  keep.push_back(Tensor::empty({static_cast<int64_t>((desc.get_size() + 3) / 4)}, DType::f32));
  return memory(desc, cpu_engine(), keep.back().raw_data());
}

// One input of a plan: our tensor's memory, and a copy already in the primitive's layout when one was
// kept (dnnl_blocked_copies.h), which then replaces the reorder.
struct Input {
  const void* data;
  Tensor blocked = {};
};

// Runs the plan on our tensors' memory, reordering into and out of the primitive's layouts. Returns, for
// each input, the copy in the primitive's layout that a reorder made (undefined where none ran), for
// the caller to keep.
std::vector<Tensor> execute(const Plan& plan, const std::vector<Input>& inputs, void* output) {
  dnnl::engine& engine = cpu_engine();
  static thread_local dnnl::stream stream(engine);
  std::vector<Tensor> keep, made(plan.inputs.size());
  std::unordered_map<int, memory> args;
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    const Plan::Arg& a = plan.inputs[i];
    if (a.reorder && inputs[i].blocked.defined()) {
      args.emplace(a.id, memory(a.wanted, engine, inputs[i].blocked.raw_data()));
      continue;
    }
    memory ours(a.ours, engine, const_cast<void*>(inputs[i].data));
    if (!a.reorder) {
      args.emplace(a.id, ours);
      continue;
    }
    memory wanted = scratch(a.wanted, keep);
    made[i] = keep.back();
    a.reorder->execute(stream, ours, wanted);
    args.emplace(a.id, wanted);
  }
  const Plan::Arg& o = plan.output;
  memory out(o.ours, engine, output);
  memory result = o.reorder ? scratch(o.wanted, keep) : out;
  args.emplace(o.id, result);
  plan.primitive.execute(stream, args);
  if (o.reorder) o.reorder->execute(stream, result, out);
  stream.wait();
  return made;
}

// Each layer's input x in the forward's blocked layout, for its weight gradient. Per thread: the
// backward of a forward runs on the thread that ran it; elsewhere the lookup misses and x is
// reordered again, which is only slower.
BlockedCopies& forward_inputs() {
  static thread_local BlockedCopies copies;
  return copies;
}

// grad_y in the blocked layout, from the data gradient for the weight gradient that autograd runs
// right after it on the same grad_y (nn/functional/conv.cpp). Only that next call may use it: every
// other convolution call drops it first.
BlockedCopies& grad_outputs() {
  static thread_local BlockedCopies copies;
  return copies;
}

MemoryFormat format_of(bool channels_last) {
  return channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous;
}

}  // namespace

Tensor dnnl_conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& bias_in, const Conv2dParams& p) {
  if (x_in.dtype() != DType::f32) return {};
  Layer l{x_in.shape(), w_in.shape(), p, x_in.suggest_memory_format() == MemoryFormat::channels_last,
          bias_in.defined()};
  const Plan* plan = plan_for(Direction::forward, l);
  if (!plan) return {};
  grad_outputs().clear();
  const MemoryFormat f = format_of(l.channels_last);
  const Tensor x = x_in.contiguous(f), w = w_in.contiguous();
  Tensor y = Tensor::empty(output_shape(l), DType::f32, Device::cpu(), f);
  std::vector<Input> inputs = {{x.raw_data()}, {w.raw_data()}};
  Tensor bias;
  if (l.bias) {
    bias = bias_in.contiguous();
    inputs.push_back({bias.raw_data()});
  }
  // Always reordered afresh (x may have been written since an earlier forward), then kept for the
  // weight gradient, which wants x in the same layout.
  const std::vector<Tensor> made = execute(*plan, inputs, y.raw_data());
  if (made[0].defined())
    forward_inputs().keep(x_in, plan->inputs[0].wanted, made[0]);
  else
    forward_inputs().forget(x_in);  // x needed no reorder here; an older copy may be stale
  return y;
}

Tensor dnnl_conv2d_backward_input(const Tensor& grad_y, const Tensor& w_in, const Shape& x_shape,
                                  const Conv2dParams& p) {
  // With 1 to 3 input channels (a network's first layer, whose input gradient training never needs)
  // im2col measured faster: 0.9 vs 2.2 ms (1 channel) and 4.5 vs 6.8 ms (3 channels) at batch 64.
  if (grad_y.dtype() != DType::f32 || x_shape[1] < 4) return {};
  Layer l{x_shape, w_in.shape(), p, grad_y.suggest_memory_format() == MemoryFormat::channels_last};
  const Plan* plan = plan_for(Direction::backward_input, l);
  if (!plan) return {};
  grad_outputs().clear();
  const MemoryFormat f = format_of(l.channels_last);
  const Tensor dy = grad_y.contiguous(f), w = w_in.contiguous();
  Tensor dx = Tensor::empty(x_shape, DType::f32, Device::cpu(), f);
  const std::vector<Tensor> made = execute(*plan, {{dy.raw_data()}, {w.raw_data()}}, dx.raw_data());
  if (made[0].defined()) grad_outputs().keep(grad_y, plan->inputs[0].wanted, made[0]);
  return dx;
}

Tensor dnnl_conv2d_backward_weight(const Tensor& grad_y, const Tensor& x_in, const Shape& w_shape,
                                   const Conv2dParams& p) {
  if (grad_y.dtype() != DType::f32) return {};
  Layer l{x_in.shape(), w_shape, p, x_in.suggest_memory_format() == MemoryFormat::channels_last};
  const Plan* plan = plan_for(Direction::backward_weight, l);
  if (!plan) return {};
  Tensor kept_x = forward_inputs().take(x_in, plan->inputs[0].wanted);
  Tensor kept_dy = grad_outputs().take(grad_y, plan->inputs[1].wanted);
  grad_outputs().clear();
  const MemoryFormat f = format_of(l.channels_last);
  const Tensor x = kept_x.defined() ? x_in : x_in.contiguous(f);
  const Tensor dy = kept_dy.defined() ? grad_y : grad_y.contiguous(f);
  Tensor dw = Tensor::empty(w_shape, DType::f32);
  execute(*plan, {{x.raw_data(), std::move(kept_x)}, {dy.raw_data(), std::move(kept_dy)}}, dw.raw_data());
  return dw;
}

}  // namespace trainer
