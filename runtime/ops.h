// ops.h — compute on tensors, on any backend, under the numerics contract.
//
// Values are computed by the kernels (det_gemm, elementwise) on host copies of the operands, so
// every backend that computes on the host gives the same bits; the backend then charges the
// simulated time (the host charges nothing). Each op adds its time to the rank's compute timeline
// and, when tracing, a span on the rank's "compute" track.
//
//   matmul(x, w.t(), &b, y);           // y[M,N] = x[M,K] · wᵀ + b, w stored [N,K] (a view, no copy)
//   matmul(dy, w, nullptr, dx);        // backward, input:  dx = dy · w   (ascending n)
//   matmul(dy.t(), x, nullptr, dw);    // backward, weight: dw = dyᵀ · x  (ascending m)
//   bias_grad(dy, db);                 // db[n] = Σ_m dy[m, n], ascending m
#pragma once

#include "kernels/elementwise.h"
#include "runtime/tensor.h"

namespace cubesim::rt {

void matmul(const Tensor& a, const Tensor& b, const Tensor* bias, const Tensor& c, const char* name = "gemm");
void bias_grad(const Tensor& dy, const Tensor& db);
void gelu(kernels::GeluKind k, const Tensor& x, const Tensor& y);                          // y = gelu(x)
void gelu_backward(kernels::GeluKind k, const Tensor& x, const Tensor& dy, const Tensor& dx);
void add_bias(const Tensor& x, const Tensor& bias, const Tensor& y);                       // y = x + bias (per column)
// pre = x + bias (per column; pre may be x), y = gelu(pre): add_bias then gelu, bit for bit, in one
// pass where the backend fuses them (Megatron's bias-GELU): x is read once, pre and y written once.
void bias_gelu(kernels::GeluKind k, const Tensor& x, const Tensor& bias, const Tensor& pre, const Tensor& y);
void add(const Tensor& a, const Tensor& b, const Tensor& y);                               // y = a + b
void copy(const Tensor& src, const Tensor& dst);                                           // same shape and dtype

}  // namespace cubesim::rt
