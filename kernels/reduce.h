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

// Which loop reduce_values runs. Every choice gives the same bits (the scalar loop's); `scalar` is
// the definition the vector loops are tested against, and `avx2`/`avx512` throw where the CPU lacks
// them. `automatic` picks the widest this CPU runs.
enum class ReduceIsa { automatic, scalar, avx2, avx512 };
std::string_view reduce_isa_name(ReduceIsa isa);  // "automatic", "scalar", "avx2", "avx512"
// Whether this CPU runs `isa`'s loop: avx2 needs AVX2 and F16C, avx512 also AVX-512F.
bool reduce_isa_available(ReduceIsa isa);
// What `automatic` runs on this CPU.
ReduceIsa reduce_isa_automatic();

// dst[i] = op(dst[i], src[i]) for i < count, rounding once to dtype. Sixteen elements at a time with
// AVX-512 (eight with AVX2 and F16C) where the CPU has them, with exactly the bits of the scalar loop.
void reduce_values(void* dst, const void* src, DType dtype, std::int64_t count, ReduceOp op,
                   ReduceIsa isa = ReduceIsa::automatic);
// The scalar loop: reduce_values with ReduceIsa::scalar.
void reduce_values_scalar(void* dst, const void* src, DType dtype, std::int64_t count, ReduceOp op);
// Whether reduce_values uses a vector loop on this CPU.
inline bool reduce_simd_available() { return reduce_isa_automatic() != ReduceIsa::scalar; }

}  // namespace cubesim::kernels
