// reduce.h — the combining step of a reduction: dst = op(dst, src), elementwise, on host values.
//
// Every collective algorithm's reduction (runtime/algorithms) is a sequence of these steps in an
// order the algorithm documents; each step widens both operands exactly to f32, combines them once
// and rounds once to the dtype (round to nearest even, as NCCL's bf16/f16 reductions do). The cuda
// backend's kernel (kernels/cuda/elementwise_cuda.h) computes the same bits on the GPU.
//
//   kernels::reduce_values(acc.data(), incoming.data(), DType::bf16, n, kernels::ReduceOp::sum);
//
// max propagates NaN (a NaN in either operand gives the quiet NaN) and keeps dst on ties, so
// max(-0, +0) is dst's zero.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/dtype.h"

namespace cubesim::kernels {

enum class ReduceOp { sum, max };
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::sum, ReduceOp::max};

std::string_view reduce_op_name(ReduceOp op);  // "sum", "max"
// "sum" | "max"; anything else throws std::invalid_argument naming the input and the valid ops.
ReduceOp parse_reduce_op(std::string_view s);

// dst[i] = op(dst[i], src[i]) for i < count, rounding once to dtype. Eight elements at a time with
// AVX2 (F16C for f16) where the CPU has them, with exactly the bits of the scalar loop.
void reduce_values(void* dst, const void* src, DType dtype, std::int64_t count, ReduceOp op);
// The scalar loop: the definition the vector path is tested against.
void reduce_values_scalar(void* dst, const void* src, DType dtype, std::int64_t count, ReduceOp op);
// Whether reduce_values uses the vector path on this CPU.
bool reduce_simd_available();

}  // namespace cubesim::kernels
