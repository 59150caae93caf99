#pragma once
// Backend::fused_attention and its backward on the GPU: cuDNN's flash-attention graphs
// (nn/cuda/fused_attention_graph.h), where a ViT's composed attention spent its time in slow cuBLAS
// kernels for T = 197 (no aligned tiles), permute copies and a softmax pass over [B*H*T, T].
//
// Where they apply: bf16/f16 q, k, v on this GPU, compute capability 8.0+, cuDNN 9+, head dims
// multiples of 8 up to 128, the last dimension dense and the other strides multiples of 8 elements (so
// rows start on 16 bytes), 16-byte aligned data. Never under train.deterministic (the backward
// accumulates dQ with atomics) nor with BackendOptions::fused_attention off; nullopt then, and the
// caller composes attention of bmm and softmax.
//
// q, k and v are read through their strides: the ViT hands in views of its packed projection
// [N, T, 3, H, d]. The output is written as [N, T, H, dv] (a [B, H, T, dv] view of it), and the
// gradients of packed views land in one packed tensor (Backend::AttentionGrads::packed): no copy is
// made either way.
//
// Plans are built per (dtype, shapes, strides) at the first eager call of a shape, forward and
// backward together (so a forward that ran fused always has its backward), and kept for the process's
// life. A shape first seen inside a CUDA graph capture runs composed (nothing can be built there). A
// graph cuDNN refuses or a plan that fails to run (an older cuDNN, no engine for the shape) sends that
// shape to the composed path with one warning line, never an error. Workspaces come from the caching
// allocator and nothing waits for the host, so the fused ops run inside a captured step.
#include <cstdint>

namespace trainer::cuda {

// Fused forwards and backwards run since the process started (tests check the fused path ran).
int64_t fused_attention_forward_calls();
int64_t fused_attention_backward_calls();

}  // namespace trainer::cuda
