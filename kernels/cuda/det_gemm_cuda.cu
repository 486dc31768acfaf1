// det_gemm_cuda.cu — the public entry points: shape checks, the mode switch, the backward views, and
// the bf16 repacking that lets the tensor-core kernel take any strided operand.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/det_gemm_cuda.h"
#include "kernels/cuda/det_gemm_cuda_internal.h"
#include "kernels/cuda/dtype_cuda.cuh"

namespace cubesim::cuda {

const char* gemm_mode_name(GemmMode m) {
  switch (m) {
    case GemmMode::exact: return "exact";
    case GemmMode::tensor_core: return "tensor_core";
  }
  return "?";
}

GemmMode parse_gemm_mode(std::string_view s) {
  for (GemmMode m : {GemmMode::exact, GemmMode::tensor_core}) {
    if (s == gemm_mode_name(m)) return m;
  }
  throw std::invalid_argument("gemm_mode: '" + std::string(s) + "' is not valid; use 'exact' or 'tensor_core'");
}

const char* tc_config_name(TcConfig c) {
  switch (c) {
    case TcConfig::automatic: return "automatic";
    case TcConfig::m128n256: return "m128n256";
    case TcConfig::m128n256_c2: return "m128n256_c2";
    case TcConfig::m128n128: return "m128n128";
    case TcConfig::m64n32: return "m64n32";
    case TcConfig::m64n256_pp: return "m64n256_pp";
    case TcConfig::m64n256_pp_c2: return "m64n256_pp_c2";
    case TcConfig::m128n32: return "m128n32";
    case TcConfig::m128n224: return "m128n224";
    case TcConfig::m128n224_c2: return "m128n224_c2";
    case TcConfig::m224n128_c2: return "m224n128_c2";
  }
  return "?";
}

bool tensor_core_mode_supported() {
  // Cached per device (0 unknown, 1 no, 2 yes): every tensor-core call asks.
  static std::atomic<int> cache[64] = {};
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (dev < 64 && cache[dev].load(std::memory_order_relaxed) != 0) return cache[dev].load(std::memory_order_relaxed) == 2;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) return false;
  const bool ok = major == 9 && minor == 0;  // the kernels are built for sm_90a only
  if (dev < 64) cache[dev].store(ok ? 2 : 1, std::memory_order_relaxed);
  return ok;
}

namespace detail {
namespace {

const char* dname(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

// Can the tensor-core kernel read this rows x kdim operand in place, k-major? (bf16, k contiguous,
// rows 16-byte aligned and not overlapping, as TMA needs.) MN-major is the same test with the
// dimensions' roles swapped.
bool tc_native(const void* data, DType t, std::int64_t rows, std::int64_t kdim, std::int64_t rs, std::int64_t ks) {
  if (t != DType::bf16 || ks != 1) return false;
  if (reinterpret_cast<std::uintptr_t>(data) % 16 != 0) return false;
  return rows <= 1 || (rs >= kdim && (rs * 2) % 16 == 0);
}

std::int64_t packed_ld(std::int64_t k) { return (k + 7) / 8 * 8; }
std::size_t round256(std::size_t b) { return (b + 255) / 256 * 256; }

__global__ void pack_bf16_kernel(const void* src, DType t, std::int64_t rows, std::int64_t kdim, std::int64_t rs,
                                 std::int64_t ks, __nv_bfloat16* dst, std::int64_t ld) {
  // A 32x32 tile through shared memory, so both the strided read and the k-contiguous write are
  // coalesced whichever of the source's dimensions is the unit-stride one.
  __shared__ float tile[32][33];
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * 32, k0 = static_cast<std::int64_t>(blockIdx.x) * 32;
  const bool k_fast = (ks < 0 ? -ks : ks) <= (rs < 0 ? -rs : rs);  // read along the smaller stride
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int a = threadIdx.x, b = i;
    const std::int64_t r = r0 + (k_fast ? b : a), k = k0 + (k_fast ? a : b);
    if (r < rows && k < kdim) tile[k_fast ? b : a][k_fast ? a : b] = load_elem_rt(src, t, r * rs + k * ks);
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const std::int64_t r = r0 + i, k = k0 + threadIdx.x;
    if (r < rows && k < kdim) dst[r * ld + k] = __float2bfloat16_rn(tile[i][threadIdx.x]);
  }
}

}  // namespace

void launch_pack_bf16(const void* src, DType t, std::int64_t rows, std::int64_t kdim, std::int64_t rs, std::int64_t ks,
                      void* dst, std::int64_t ld, cudaStream_t stream) {
  if (rows == 0 || kdim == 0) return;
  const dim3 grid(static_cast<unsigned>((kdim + 31) / 32), static_cast<unsigned>((rows + 31) / 32));
  if ((rows + 31) / 32 > 65535) throw_shape_error("det_gemm_cuda: operand has too many rows to repack");
  pack_bf16_kernel<<<grid, dim3(32, 8), 0, stream>>>(src, t, rows, kdim, rs, ks, static_cast<__nv_bfloat16*>(dst), ld);
  CUBESIM_CUDA_CHECK_LAUNCH("pack_bf16_kernel");
}

}  // namespace detail

using detail::BiasArg;
using detail::throw_shape_error;

namespace {

// [lo, hi) byte range a view's elements span (empty views: an empty range).
struct Range {
  std::uintptr_t lo = 0, hi = 0;
};
Range span(const void* data, DType t, std::int64_t rows, std::int64_t cols, std::int64_t rs, std::int64_t cs) {
  if (rows == 0 || cols == 0) return {};
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(t));
  const std::int64_t r_lo = std::min<std::int64_t>(0, (rows - 1) * rs), r_hi = std::max<std::int64_t>(0, (rows - 1) * rs);
  const std::int64_t c_lo = std::min<std::int64_t>(0, (cols - 1) * cs), c_hi = std::max<std::int64_t>(0, (cols - 1) * cs);
  const auto base = reinterpret_cast<std::intptr_t>(data);
  return {static_cast<std::uintptr_t>(base + (r_lo + c_lo) * es), static_cast<std::uintptr_t>(base + (r_hi + c_hi + 1) * es)};
}
bool overlaps(Range a, Range b) { return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi; }

std::string describe(const char* name, const MatrixView& v) {
  return std::string(name) + " " + std::to_string(v.rows) + "x" + std::to_string(v.cols) + " " +
         detail::dname(v.dtype) + " (row stride " + std::to_string(v.row_stride) + ", col stride " +
         std::to_string(v.col_stride) + ")";
}

void check_view(const char* fn, const char* name, const MatrixView& v) {
  if (!dtype_valid(v.dtype))
    throw_shape_error(std::string(fn) + ": " + name + " has an invalid dtype; valid: f32, bf16, f16");
  if (v.rows < 0 || v.cols < 0)
    throw_shape_error(std::string(fn) + ": " + describe(name, v) + " has a negative extent");
  if (v.rows > 0x7fffffff || v.cols > 0x7fffffff)
    throw_shape_error(std::string(fn) + ": " + describe(name, v) + " exceeds 2^31-1 rows or columns");
  if (v.rows > 0 && v.cols > 0 && v.data == nullptr)
    throw_shape_error(std::string(fn) + ": " + describe(name, v) + " has no data");
}

BiasArg check_args(const char* fn, const MatrixView& a, const MatrixView& b, const VectorView* bias,
                   const MutableMatrixView& c) {
  check_view(fn, "A", a);
  check_view(fn, "B", b);
  check_view(fn, "C", c);
  if (a.cols != b.rows || c.rows != a.rows || c.cols != b.cols)
    throw_shape_error(std::string(fn) + ": C = A·B needs A [M,K], B [K,N], C [M,N]; got " + describe("A", a) + ", " +
                      describe("B", b) + ", " + describe("C", c));
  const Range rc = span(c.data, c.dtype, c.rows, c.cols, c.row_stride, c.col_stride);
  if (c.rows > 1 && c.cols > 1 && (c.row_stride == 0 || c.col_stride == 0))
    throw_shape_error(std::string(fn) + ": " + describe("C", c) + " maps several elements to one address");
  if (overlaps(rc, span(a.data, a.dtype, a.rows, a.cols, a.row_stride, a.col_stride)) ||
      overlaps(rc, span(b.data, b.dtype, b.rows, b.cols, b.row_stride, b.col_stride)))
    throw_shape_error(std::string(fn) + ": the output " + describe("C", c) + " overlaps an input; it must not");
  BiasArg ba;
  if (bias && bias->data) {
    if (!dtype_valid(bias->dtype)) throw_shape_error(std::string(fn) + ": bias has an invalid dtype; valid: f32, bf16, f16");
    if (bias->size != b.cols)
      throw_shape_error(std::string(fn) + ": bias has " + std::to_string(bias->size) + " elements; C has " +
                        std::to_string(b.cols) + " columns and the bias needs as many");
    if (overlaps(rc, span(bias->data, bias->dtype, 1, bias->size, 0, bias->stride)))
      throw_shape_error(std::string(fn) + ": the output " + describe("C", c) + " overlaps the bias; it must not");
    ba.data = bias->data;
    ba.dtype = bias->dtype;
    ba.stride = bias->stride;
  }
  return ba;
}

// How the tensor-core kernel reads an operand: in place k-major, in place MN-major (through TMA
// either way), or repacked to k-major bf16 in the workspace (another dtype, or strides TMA cannot
// describe: a non-unit inner stride, rows not 16-byte aligned, a negative stride).
enum class TcUse { k_major, mn_major, repack };

TcUse tc_use(const void* data, DType t, std::int64_t rows, std::int64_t kdim, std::int64_t rs, std::int64_t ks) {
  if (detail::tc_native(data, t, rows, kdim, rs, ks)) return TcUse::k_major;
  if (detail::tc_native(data, t, kdim, rows, ks, rs)) return TcUse::mn_major;
  return TcUse::repack;
}

struct TcPlan {
  TcUse a, b;
  std::size_t a_bytes, b_bytes;
};

TcPlan tc_plan(const MatrixView& a, const MatrixView& b) {
  TcPlan p;
  const std::int64_t K = a.cols;
  p.a = tc_use(a.data, a.dtype, a.rows, K, a.row_stride, a.col_stride);
  // The kernel reads Bᵀ [N,K]: B's row stride is Bᵀ's column stride.
  p.b = tc_use(b.data, b.dtype, b.cols, K, b.col_stride, b.row_stride);
  p.a_bytes = p.a == TcUse::repack ? detail::round256(static_cast<std::size_t>(a.rows * detail::packed_ld(K) * 2)) : 0;
  p.b_bytes = p.b == TcUse::repack ? detail::round256(static_cast<std::size_t>(b.cols * detail::packed_ld(K) * 2)) : 0;
  return p;
}

void run_gemm(const char* fn, const MatrixView& a, const MatrixView& b, const VectorView* bias,
              const MutableMatrixView& c, const GemmOptions& opt, cudaStream_t stream) {
  const BiasArg ba = check_args(fn, a, b, bias, c);
  if (opt.mode != GemmMode::exact && opt.mode != GemmMode::tensor_core)
    throw_shape_error(std::string(fn) + ": unknown GemmMode; valid: exact, tensor_core");
  if (opt.sm_margin < 0)
    throw_shape_error(std::string(fn) + ": GemmOptions::sm_margin is " + std::to_string(opt.sm_margin) +
                      "; give 0 or more SMs to leave free");
  if (c.rows == 0 || c.cols == 0) return;
  // K == 0: C = 0 (+ bias) in either mode; the exact kernel writes exactly that.
  if (opt.mode == GemmMode::exact || a.cols == 0) {
    detail::launch_exact_gemm(a, b, ba, c, stream);
    return;
  }
  if (!tensor_core_mode_supported())
    throw std::invalid_argument(std::string(fn) + ": GemmMode::tensor_core needs an sm_90 GPU (H100/H200); this "
                                "device is not one. Use GemmMode::exact.");

  const TcPlan plan = tc_plan(a, b);
  const std::size_t need = plan.a_bytes + plan.b_bytes;
  void* ws = opt.workspace;
  bool own = false;
  if (need > 0 && (ws == nullptr || opt.workspace_bytes < need)) {
    if (ws != nullptr)
      throw_shape_error(std::string(fn) + ": workspace of " + std::to_string(opt.workspace_bytes) +
                        " bytes is too small; " + std::to_string(need) + " needed (det_gemm_cuda_workspace_bytes)");
    CUBESIM_CUDA_CHECK(cudaMallocAsync(&ws, need, stream));
    own = true;
  }
  const std::int64_t K = a.cols, ldk = detail::packed_ld(K);
  detail::TcOperands ops;
  ops.M = static_cast<int>(a.rows);
  ops.N = static_cast<int>(b.cols);
  ops.K = static_cast<int>(K);
  auto* wsb = static_cast<std::uint8_t*>(ws);
  try {
    // One operand as the kernel reads it: rows x K, element (r, k) at data + r*rs + k*ks (B as Bᵀ).
    // A row stride that is never used (one row, or one k for MN-major) is given a valid one.
    auto place = [&](TcUse use, const void* data, DType t, std::int64_t rows, std::int64_t rs, std::int64_t ks,
                     void* scratch, const void*& ptr, std::int64_t& ld, bool& mn) {
      switch (use) {
        case TcUse::repack:
          detail::launch_pack_bf16(data, t, rows, K, rs, ks, scratch, ldk, stream);
          ptr = scratch;
          ld = ldk;
          break;
        case TcUse::k_major:
          ptr = data;
          ld = rows <= 1 ? ldk : rs;
          break;
        case TcUse::mn_major:
          ptr = data;
          ld = K <= 1 ? detail::packed_ld(rows) : ks;
          mn = true;
          break;
      }
    };
    place(plan.a, a.data, a.dtype, a.rows, a.row_stride, a.col_stride, wsb, ops.a, ops.lda, ops.a_mn);
    place(plan.b, b.data, b.dtype, b.cols, b.col_stride, b.row_stride, wsb + plan.a_bytes, ops.bt, ops.ldb, ops.b_mn);
    detail::launch_tc_gemm(ops, ba, c, opt.tc_config, stream, opt.sm_margin);
  } catch (...) {
    if (own) cudaFreeAsync(ws, stream);
    throw;
  }
  if (own) CUBESIM_CUDA_CHECK(cudaFreeAsync(ws, stream));
}

}  // namespace

std::size_t det_gemm_cuda_workspace_bytes(const MatrixView& A, const MatrixView& B, const GemmOptions& opt) {
  if (opt.mode != GemmMode::tensor_core || A.cols == 0) return 0;
  const TcPlan p = tc_plan(A, B);
  return p.a_bytes + p.b_bytes;
}

namespace {
// Why tc_native refuses an operand read as rows x kdim (element (r, k) at data + r*rs + k*ks), in
// either orientation; "" if it does not.
std::string repack_reason(const char* name, const void* data, DType t, std::int64_t rows, std::int64_t kdim,
                          std::int64_t rs, std::int64_t ks) {
  if (detail::tc_native(data, t, rows, kdim, rs, ks) || detail::tc_native(data, t, kdim, rows, ks, rs)) return {};
  const std::string what = std::string(name) + " [" + std::to_string(rows) + " x " + std::to_string(kdim) + "]";
  if (t != DType::bf16)
    return what + " is " + std::string(dtype_name(t)) +
           ": the tensor cores read bf16, so it is converted (rounded to nearest even) and repacked first";
  if (reinterpret_cast<std::uintptr_t>(data) % 16 != 0)
    return what + " starts at an address that is not 16-byte aligned, which TMA cannot read; it is repacked first";
  if (ks != 1 && rs != 1)
    return what + " has no unit stride (strides " + std::to_string(rs) + " and " + std::to_string(ks) +
           " elements), which TMA cannot read; it is repacked first";
  // One stride is 1; the other steps from row to row (k-major) or column to column (MN-major).
  const std::int64_t outer = ks == 1 ? rs : ks, extent = ks == 1 ? kdim : rows;
  const std::string how = outer < 0 ? "run backwards (a stride of " + std::to_string(outer) + " elements)"
                          : outer < extent
                              ? "overlap (" + std::to_string(outer) + " elements apart, " + std::to_string(extent) +
                                    " long)"
                              : "are " + std::to_string(outer) + " elements apart, not a multiple of 16 bytes";
  return what + ": its rows " + how + ", which TMA cannot read; it is repacked first";
}
}  // namespace

std::string det_gemm_cuda_repack_reason(const MatrixView& A, const MatrixView& B, const GemmOptions& opt) {
  if (opt.mode != GemmMode::tensor_core || A.cols == 0) return {};
  const std::int64_t K = A.cols;
  std::string a = repack_reason("A", A.data, A.dtype, A.rows, K, A.row_stride, A.col_stride);
  // The kernel reads Bᵀ [N,K]; named by B's own shape [K x N] below.
  std::string b = repack_reason("B", B.data, B.dtype, K, B.cols, B.row_stride, B.col_stride);
  if (a.empty()) return b;
  return b.empty() ? a : a + "; " + b;
}

void det_gemm_cuda(const MatrixView& A, const MatrixView& B, const VectorView* bias, const MutableMatrixView& C,
                   const GemmOptions& opt, cudaStream_t stream) {
  run_gemm("det_gemm_cuda", A, B, bias, C, opt, stream);
}

void det_gemm_cuda_backward_input(const MatrixView& dC, const MatrixView& B, const MutableMatrixView& dA,
                                  const GemmOptions& opt, cudaStream_t stream) {
  // dA [M,K] = dC [M,N] · Bᵀ [N,K]: the reduction runs over n, ascending.
  if (dC.cols != B.cols)
    throw_shape_error("det_gemm_cuda_backward_input: dA = dC·Bᵀ needs dC [M,N] and B [K,N]; got " + describe("dC", dC) +
                      ", " + describe("B", B));
  run_gemm("det_gemm_cuda_backward_input", dC, B.transposed(), nullptr, dA, opt, stream);
}

void det_gemm_cuda_backward_weight(const MatrixView& A, const MatrixView& dC, const MutableMatrixView& dB,
                                   const GemmOptions& opt, cudaStream_t stream) {
  // dB [K,N] = Aᵀ [K,M] · dC [M,N]: the reduction runs over m, ascending.
  if (A.rows != dC.rows)
    throw_shape_error("det_gemm_cuda_backward_weight: dB = Aᵀ·dC needs A [M,K] and dC [M,N]; got " + describe("A", A) +
                      ", " + describe("dC", dC));
  run_gemm("det_gemm_cuda_backward_weight", A.transposed(), dC, nullptr, dB, opt, stream);
}

}  // namespace cubesim::cuda
