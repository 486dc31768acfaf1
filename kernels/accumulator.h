// accumulator.h — models of a GEMM's accumulator other than the numerics contract's, for studies of
// what a machine's arithmetic does to a model's numbers (cubesim numerics; the sim and host backends'
// `gemm_numerics` option). The contract's GEMM (det_gemm.h) is `f32_fma_seq`; the others:
//
//   f32_fma_seq  acc = fma(a_k, b_k, acc) in f32, ascending k (det_gemm itself)
//   pairwise     the products fl(a_k·b_k) of each aligned group of 32 k summed by a balanced binary
//                tree in f32 ((p0+p1)+(p2+p3))+..., then acc = acc + the group's sum
//   bf16_acc     a narrow accumulator: acc = bf16(fma(a_k, b_k, acc)), rounded to nearest even each step
//   hopper_tc    the Hopper tensor core's multi-term fused add for bf16/f16 inputs and an f32
//                accumulator, as published models of H100/H200 describe it (Khattak & Mikaitis,
//                "Accurate models of NVIDIA tensor cores", arXiv:2512.07004; Xie et al., "MMA-Sim",
//                arXiv:2511.10909): each aligned group of kHopperGroup = 16 products (one k16 MMA)
//                and the accumulator c are fused in one sum. A product a·b is exact, with exponent
//                e_a + e_b and its significand in [1, 4) (not renormalised); c has its own exponent;
//                a subnormal operand has its format's least exponent; zero terms take no part in the
//                maximum. With E the largest of these exponents, but at least -133 (the exponent
//                of the least bf16 subnormal, 2^-133: an H200 cuts a group of tiny terms at 2^-158),
//                each term keeps trunc(t · 2^(25 - E)) · 2^(E - 25) (kHopperFracBits = 25
//                fractional bits below 2^E, cut toward zero in sign-magnitude, no sticky bit), the
//                kept terms are summed exactly, and the sum is rounded toward zero to f32
//                (subnormals kept), except that a sum of 2^128 or more is ±Inf and a sum that is
//                zero or cut to zero is +0. A group whose terms are all zero leaves c as it is. The
//                result is the next group's c. A non-finite input gives the IEEE sum of the exact
//                terms instead (NaN or ±Inf).
//
// Groups are aligned to multiples of the group size along k from k = 0, so a product blocked over k
// (the simulated PE's k-blocks) gives the whole product's bits when every block but the last is a
// whole number of groups (accumulate_model refuses a block that is not, when more follow: the
// caller passes `last`). Every model is batch invariant (an element depends on its row and column
// only) and deterministic. Scalar code: these are contrast and study modes, not fast paths.
//
//   using namespace cubesim::kernels;
//   gemm_model(AccumulatorModel::hopper_tc, A, B, nullptr, C);   // C = A·B under the model
#pragma once

#include <cstdint>
#include <string_view>

#include "kernels/det_gemm.h"

namespace cubesim::kernels {

enum class AccumulatorModel { f32_fma_seq, pairwise, bf16_acc, hopper_tc };
inline constexpr AccumulatorModel kAccumulatorModels[] = {AccumulatorModel::f32_fma_seq, AccumulatorModel::pairwise,
                                                          AccumulatorModel::bf16_acc, AccumulatorModel::hopper_tc};
std::string_view accumulator_model_name(AccumulatorModel m);  // "f32_fma_seq", ...
// std::invalid_argument naming `what` and the valid names otherwise.
AccumulatorModel parse_accumulator_model(std::string_view s, std::string_view what = "gemm_numerics");

inline constexpr int kPairwiseGroup = 32;
inline constexpr int kHopperGroup = 16;     // products per fused add: one k16 MMA instruction
inline constexpr int kHopperFracBits = 25;  // bits kept below the largest term's leading bit
inline constexpr int kHopperMinAlignExp = -133;  // E is at least this: the least bf16 subnormal's (H200)

// Products summed per step of the model (k-blocks must be multiples of it, but the last).
int accumulator_group(AccumulatorModel m);

// One hopper_tc step: acc + a[0]·b[0] + ... + a[n-1]·b[n-1] (n <= kHopperGroup) as the model sums it;
// `min_exp_a`, `min_exp_b`: each operand format's least exponent (bf16 -126, f16 -14).
float hopper_tc_step(float acc, const float* a, const float* b, int n, int min_exp_a = -126, int min_exp_b = -126,
                     int frac_bits = kHopperFracBits);

// Continues acc[i*ld + j] (an A.rows x B.cols f32 tile) over A's columns (B's rows) under the model.
// `last`: no block follows; otherwise A.cols must be a multiple of accumulator_group(m)
// (std::invalid_argument naming the block and the group). hopper_tc needs bf16 or f16 operands.
void accumulate_model(AccumulatorModel m, const MatrixView& A, const MatrixView& B, float* acc, std::int64_t ld,
                      bool last = true);
// C = A·B (+ bias) under the model: acc from +0.0f over all of K, then det_gemm_store.
void gemm_model(AccumulatorModel m, const MatrixView& A, const MatrixView& B, const VectorView* bias,
                const MutableMatrixView& C);

}  // namespace cubesim::kernels
