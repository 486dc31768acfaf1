// det_gemm_checks.h — argument checks shared by the det_gemm entry points (internal).
//
// Each public function checks its own operands under the names its caller knows (A, B, C or dC,
// B, dA ...) and then hands plain views to the reference or the fast engine, which assume valid
// input. Messages follow the project rule: name the input, say what would be valid.
//
//   check_matrix("det_gemm", "A", A);
//   check_output("det_gemm", "C", C, {{"A", A}, {"B", B}});
#pragma once

#include <initializer_list>
#include <utility>

#include "kernels/det_gemm.h"

namespace cubesim::kernels::detail {

// dtype valid, non-negative shape, non-null data when non-empty.
void check_matrix(const char* fn, const char* name, const MatrixView& v);
void check_vector(const char* fn, const char* name, const VectorView& v);
// check_matrix, plus: distinct elements never share an address, and no byte of the output lies
// inside an input (the engines read inputs while writing outputs).
void check_output(const char* fn, const char* name, const MatrixView& out,
                  std::initializer_list<std::pair<const char*, MatrixView>> inputs);
void check_output_vector(const char* fn, const char* name, const VectorView& out,
                         std::initializer_list<std::pair<const char*, MatrixView>> inputs);
// "64x128 f32 (row stride 128, col stride 1)" — a view as messages describe it.
std::string describe(const MatrixView& v);

// The shape checks of C = A·B (+ bias), with the operands' caller-side names.
void check_gemm(const char* fn, const MatrixView& A, const MatrixView& B, const VectorView* bias,
                const MutableMatrixView& C);
// dA [M,K] = dC [M,N] · Bᵀ with B [K,N].
void check_backward_input(const char* fn, const MatrixView& dC, const MatrixView& B, const MutableMatrixView& dA);
// dB [K,N] = Aᵀ · dC with A [M,K], dC [M,N].
void check_backward_weight(const char* fn, const MatrixView& A, const MatrixView& dC, const MutableMatrixView& dB);
// acc [A.rows x B.cols, leading dimension ld] continued by A·B.
void check_accumulate(const char* fn, const MatrixView& A, const MatrixView& B, const float* acc, std::int64_t ld);

}  // namespace cubesim::kernels::detail
