// The fast host det_gemm: BLIS-style cache blocking around a 6x16 register tile (12x32, two by two
// of the same slivers, where AVX-512 runs).
//
// Loop nest of one thread's output region (rows [m0,m1), columns [n0,n1)):
//   for each row superblock (only when the accumulator is a workspace, not C itself)
//     for jc in columns, step nc:                    B panel [K x nc]
//       for pc in 0..K, step kc (ascending):          pack B[pc:pc+kc, jc:jc+nc] into 16-wide slivers
//         for ic in rows, step mc:                    pack A[ic:ic+mc, pc:pc+kc] into 6-tall slivers
//           for jr, ir: micro-kernel on the 6x16 (or 12x32) tile, LOADING the accumulator when pc > 0
//       epilogue: bias after the full sum, round to C's dtype
// Each accumulator element therefore sees fma over k = 0, 1, ..., K-1 in order, starting at +0.0f,
// whatever mc/nc/kc, the region or the ISA: the same bits as det_gemm_reference. Threads split the
// output into disjoint regions (M and N only), so the thread count changes nothing either.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kernels/det_gemm.h"
#include "kernels/detail/det_gemm_checks.h"
#include "kernels/detail/microkernel.h"

namespace cubesim::kernels {

bool cpu_has_avx2_fma() {
#if defined(CUBESIM_KERNELS_AVX2)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

bool cpu_has_avx512f() {
#if defined(CUBESIM_KERNELS_AVX2)
  static const bool has = cpu_has_avx2_fma() && __builtin_cpu_supports("avx512f");
  return has;
#else
  return false;
#endif
}

GemmIsa gemm_isa_automatic() {
  return cpu_has_avx512f() ? GemmIsa::avx512 : cpu_has_avx2_fma() ? GemmIsa::avx2 : GemmIsa::portable;
}

namespace detail {

void microkernel_6x16_portable(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc,
                               bool load) {
  float t[kMR][kNR];
  for (int i = 0; i < kMR; ++i)
    for (int j = 0; j < kNR; ++j) t[i][j] = load ? c[i * ldc + j] : 0.0f;
  for (std::int64_t k = 0; k < kc; ++k, a += kMR, b += kNR) {
    for (int i = 0; i < kMR; ++i) {
      const float ai = a[i];
      for (int j = 0; j < kNR; ++j) t[i][j] = std::fma(ai, b[j], t[i][j]);
    }
  }
  for (int i = 0; i < kMR; ++i)
    for (int j = 0; j < kNR; ++j) c[i * ldc + j] = t[i][j];
}

#if !defined(CUBESIM_KERNELS_AVX2)
// Not x86: never called (cpu_has_avx2_fma() is false), defined so the symbols exist.
void microkernel_6x16_avx2(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc, bool load) {
  microkernel_6x16_portable(kc, a, b, c, ldc, load);
}
void microkernel_12x32_avx512(std::int64_t, const float*, const float*, const float*, const float*, float*,
                              std::int64_t, bool) {
  std::abort();
}
#endif

}  // namespace detail

namespace {

using detail::kMR;
using detail::kNR;

struct Blocking {
  std::int64_t mc, nc, kc;
};
// 6x16 tiles (AVX2, portable), tuned on Zen 5 (see docs/PERFORMANCE.md): a 16 KiB B sliver (kc x
// 16) stays in L1 while the 144 x 256 A block (147 KiB) streams from L2; the kc x nc B panel (1 MiB)
// sits in L2/L3.
constexpr Blocking kBlocking6x16{.mc = 144, .nc = 1024, .kc = 256};
// 12x32 tiles (AVX-512), tuned on Zen 4 (docs/PERFORMANCE.md, issue 14): what costs there is C, read
// and written once per k block from L3 or memory, so kc is as long as 1024; the 48 x 1024 A block
// (192 KiB) and a 128 KiB pair of B slivers stream from L2, the 4 MiB B panel from L3.
constexpr Blocking kBlocking12x32{.mc = 48, .nc = 1024, .kc = 1024};
// When C is not f32 with unit column stride, the accumulator is a workspace of at most this many
// rows x nc; B is packed again per superblock, which costs ~1/(2*rows) of the arithmetic.
constexpr std::int64_t kSuperblockRows = 576;

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// ---- workspace ---------------------------------------------------------------------------------

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(p_); }
  float* get(std::int64_t n) {
    if (n > n_) {
      std::free(p_);
      p_ = nullptr;
      n_ = 0;
      const auto bytes = static_cast<std::size_t>(round_up(n * 4, 64));
      p_ = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (!p_) throw std::bad_alloc();
      n_ = n;
    }
    return p_;
  }

 private:
  float* p_ = nullptr;
  std::int64_t n_ = 0;
};

// Per thread and kept between calls: pool threads live on, so steady-state calls allocate nothing.
struct Workspace {
  AlignedBuffer a, b, acc;
};
Workspace& thread_workspace() {
  thread_local Workspace ws;
  return ws;
}

// ---- thread pool -------------------------------------------------------------------------------

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins on `done` for up to ~200 us before the caller falls back to blocking: waking a sleeping
// thread costs tens of microseconds (more in a VM), as much as a whole 256^3 product.
template <class Done>
bool spin_until(Done&& done) {
  using clock = std::chrono::steady_clock;
  const auto until = clock::now() + std::chrono::microseconds(200);
  for (int i = 0;; ++i) {
    if (done()) return true;
    cpu_relax();
    if ((i & 63) == 63 && clock::now() > until) return false;
  }
}

// A few persistent threads. run(n, fn) calls fn(0..n-1), fn(0) on the caller. Workers spin a
// little after each job, then sleep. If another caller holds the pool, the tasks run one after
// another on the calling thread: they are independent, so the result is the same.
class ThreadPool {
 public:
  static ThreadPool& instance() {
    static ThreadPool pool;
    return pool;
  }
  ~ThreadPool() {
    {
      std::lock_guard l(m_);
      stop_.store(true);
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  void run(int n, const std::function<void(int)>& fn) {
    std::unique_lock region(region_, std::try_to_lock);
    if (n <= 1 || !region.owns_lock()) {
      for (int t = 0; t < n; ++t) fn(t);
      return;
    }
    {
      std::lock_guard l(m_);
      while (static_cast<int>(threads_.size()) < n - 1) {
        const int id = static_cast<int>(threads_.size()) + 1;
        threads_.emplace_back([this, id] { worker(id); });
      }
      job_ = &fn;
      jobs_ = n;
      error_ = nullptr;
      pending_.store(n - 1, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    std::exception_ptr mine;
    try {
      fn(0);
    } catch (...) {
      mine = std::current_exception();
    }
    auto finished = [&] { return pending_.load(std::memory_order_acquire) == 0; };
    if (!spin_until(finished)) {
      std::unique_lock l(m_);
      done_.wait(l, finished);
    }
    job_ = nullptr;
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  ThreadPool() = default;
  void worker(int id) {
    std::uint64_t seen = 0;
    for (;;) {
      auto woken = [&] { return stop_.load() || generation_.load(std::memory_order_acquire) != seen; };
      if (!spin_until(woken)) {
        std::unique_lock l(m_);
        wake_.wait(l, woken);
      }
      if (stop_.load()) return;
      seen = generation_.load(std::memory_order_acquire);
      if (id >= jobs_) continue;
      try {
        (*job_)(id);
      } catch (...) {
        std::lock_guard l(m_);
        if (!error_) error_ = std::current_exception();
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard l(m_);  // the caller may be between its check and its wait
        done_.notify_one();
      }
    }
  }

  std::mutex region_;  // one parallel region at a time
  std::mutex m_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;
  // Written by the caller before generation_ is bumped (release), read by workers after (acquire).
  const std::function<void(int)>* job_ = nullptr;
  int jobs_ = 0;
  std::exception_ptr error_;
  std::atomic<int> pending_{0};
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
};

// ---- packing: any dtype and strides in, dense f32 slivers out -----------------------------------

template <DType D>
inline float elem(const void* p, std::int64_t i) {
  if constexpr (D == DType::f32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (D == DType::bf16) {
    return bf16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
  } else {
    return f16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
  }
}

// dst holds ceil(mc/6) slivers of kc x 6: dst[s*kc*6 + k*6 + r] = A(i0 + 6s + r, p0 + k); rows
// past mc are zero (their results are computed and discarded). Slivers are packed in ascending
// order: the AVX2 packer spills 2 floats into the next one (see microkernel.h).
template <DType D, bool Simd>
void pack_a(const MatrixView& A, std::int64_t i0, std::int64_t mc, std::int64_t p0, std::int64_t kc, float* dst) {
  const std::int64_t rs = A.row_stride, cs = A.col_stride;
  for (std::int64_t s = 0; s < mc; s += kMR) {
    const std::int64_t rows = std::min<std::int64_t>(kMR, mc - s);
    float* d = dst + s * kc;
    const std::int64_t base = (i0 + s) * rs + p0 * cs;
    if constexpr (Simd && D == DType::f32) {
      if (cs == 1 && rows == kMR) {
        detail::pack_a_rowmajor_f32_avx2(static_cast<const float*>(A.data) + base, rs, kc, d);
        continue;
      }
    }
    if constexpr (Simd && D == DType::bf16) {
      if (cs == 1 && rows == kMR) {
        detail::pack_a_rowmajor_bf16_avx2(static_cast<const std::uint16_t*>(A.data) + base, rs, kc, d);
        continue;
      }
    }
    if (std::llabs(cs) <= std::llabs(rs)) {  // walk along k (row-major A)
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t row = base + r * rs;
        if (cs == 1) {
          for (std::int64_t k = 0; k < kc; ++k) d[k * kMR + r] = elem<D>(A.data, row + k);
        } else {
          for (std::int64_t k = 0; k < kc; ++k) d[k * kMR + r] = elem<D>(A.data, row + k * cs);
        }
      }
    } else {  // walk along m (transposed A, e.g. Aᵀ in the weight gradient)
      for (std::int64_t k = 0; k < kc; ++k)
        for (std::int64_t r = 0; r < rows; ++r) d[k * kMR + r] = elem<D>(A.data, base + k * cs + r * rs);
    }
    for (std::int64_t r = rows; r < kMR; ++r)
      for (std::int64_t k = 0; k < kc; ++k) d[k * kMR + r] = 0.0f;
  }
}

// dst holds ceil(nc/16) slivers of kc x 16: dst[s*kc*16 + k*16 + c] = B(p0 + k, j0 + 16s + c);
// columns past nc are zero. With Simd, full slivers of f32/bf16 go through the AVX2 packers (the
// same values; a transposed weight is the common case and the scalar gather is slow).
template <DType D, bool Simd>
void pack_b(const MatrixView& B, std::int64_t p0, std::int64_t kc, std::int64_t j0, std::int64_t nc, float* dst) {
  const std::int64_t rs = B.row_stride, cs = B.col_stride;
  std::int64_t s = 0;  // the first column not packed yet
  if (cs == 1 && nc >= kNR) {
    // Row-major B: all full slivers together, row by row. Sliver by sliver, every row would start
    // on a new page, a TLB and cache miss per 16 elements that no prefetcher follows (13% of a
    // 1024^3 product); row by row the reads are sequential.
    const std::int64_t slivers = nc / kNR;
    const std::int64_t base = p0 * rs + j0;
    s = slivers * kNR;
    if constexpr (Simd && D == DType::f32) {
      detail::pack_b_nmajor_f32_avx2(static_cast<const float*>(B.data) + base, rs, kc, slivers, dst);
    } else if constexpr (Simd && D == DType::bf16) {
      detail::pack_b_nmajor_bf16_avx2(static_cast<const std::uint16_t*>(B.data) + base, rs, kc, slivers, dst);
    } else {
      for (std::int64_t k = 0; k < kc; ++k) {
        const std::int64_t row = base + k * rs;
        for (std::int64_t j = 0; j < slivers; ++j) {
          float* dk = dst + j * kc * kNR + k * kNR;
          for (int c = 0; c < kNR; ++c) dk[c] = elem<D>(B.data, row + j * kNR + c);
        }
      }
    }
  }
  for (; s < nc; s += kNR) {
    const std::int64_t cols = std::min<std::int64_t>(kNR, nc - s);
    float* d = dst + s * kc;
    const std::int64_t base = p0 * rs + (j0 + s) * cs;
    if constexpr (Simd && D == DType::f32) {
      if (rs == 1 && cols == kNR) {
        detail::pack_b_kmajor_f32_avx2(static_cast<const float*>(B.data) + base, cs, kc, d);
        continue;
      }
    }
    if constexpr (Simd && D == DType::bf16) {
      if (rs == 1 && cols == kNR) {
        detail::pack_b_kmajor_bf16_avx2(static_cast<const std::uint16_t*>(B.data) + base, cs, kc, d);
        continue;
      }
    }
    if (std::llabs(cs) <= std::llabs(rs)) {
      for (std::int64_t k = 0; k < kc; ++k)
        for (std::int64_t c = 0; c < cols; ++c) d[k * kNR + c] = elem<D>(B.data, base + k * rs + c * cs);
    } else {  // walk along k (B = Wᵀ of a row-major W [out, in]: Megatron's Y = X·Wᵀ)
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::int64_t col = base + c * cs;
        if (rs == 1) {
          for (std::int64_t k = 0; k < kc; ++k) d[k * kNR + c] = elem<D>(B.data, col + k);
        } else {
          for (std::int64_t k = 0; k < kc; ++k) d[k * kNR + c] = elem<D>(B.data, col + k * rs);
        }
      }
    }
    for (std::int64_t k = 0; k < kc; ++k)
      for (std::int64_t c = cols; c < kNR; ++c) d[k * kNR + c] = 0.0f;
  }
}

using PackA = void (*)(const MatrixView&, std::int64_t, std::int64_t, std::int64_t, std::int64_t, float*);
using PackB = PackA;

template <template <DType> class F>
auto by_dtype(DType t) {
  switch (t) {
    case DType::f32: return F<DType::f32>::fn;
    case DType::bf16: return F<DType::bf16>::fn;
    case DType::f16: return F<DType::f16>::fn;
  }
  return F<DType::f32>::fn;  // unreachable: dtypes are checked before
}
template <DType D>
struct PackAFor {
  static constexpr PackA fn = &pack_a<D, false>;
};
template <DType D>
struct PackASimdFor {
#if defined(CUBESIM_KERNELS_AVX2)
  static constexpr PackA fn = &pack_a<D, true>;
#else
  static constexpr PackA fn = &pack_a<D, false>;
#endif
};
template <DType D>
struct PackBFor {
  static constexpr PackB fn = &pack_b<D, false>;
};
template <DType D>
struct PackBSimdFor {
#if defined(CUBESIM_KERNELS_AVX2)
  static constexpr PackB fn = &pack_b<D, true>;
#else
  static constexpr PackB fn = &pack_b<D, false>;
#endif
};

// ---- the engine --------------------------------------------------------------------------------

struct Engine {
  MatrixView A, B;
  std::int64_t M = 0, N = 0, K = 0;
  // Where the f32 accumulator lives when it is the destination itself (f32 C with unit column
  // stride, or the caller's tile in det_gemm_accumulate): element (i, j) at acc[i*acc_ld + j].
  bool direct = false;
  float* acc = nullptr;
  std::int64_t acc_ld = 0;
  bool from_acc = false;  // continue the caller's accumulator instead of starting at +0.0f
  // The epilogue (det_gemm only): bias after the sum, then round into C.
  bool epilogue = false;
  const float* bias = nullptr;  // N elements, widened to f32
  MutableMatrixView C;
  std::int64_t mc = 0, nc = 0, kc = 0, superblock = 0;
  detail::MicroKernel uk = &detail::microkernel_6x16_portable;
  bool big_tiles = false;  // whole 12x32 tiles through microkernel_12x32_avx512, edges through uk
  PackA pack_a = nullptr;
  PackB pack_b = nullptr;
};

template <DType D>
inline void store_one(void* data, std::int64_t at, float v) {
  if constexpr (D == DType::f32) {
    static_cast<float*>(data)[at] = v;
  } else if constexpr (D == DType::bf16) {
    static_cast<std::uint16_t*>(data)[at] = f32_to_bf16(v);
  } else {
    static_cast<std::uint16_t*>(data)[at] = f32_to_f16(v);
  }
}

template <DType D>
void store_rows(const Engine& E, const float* acc, std::int64_t ld, std::int64_t i0, std::int64_t i1,
                std::int64_t j0, std::int64_t nc) {
  const MutableMatrixView& C = E.C;
  if (std::llabs(C.row_stride) < std::llabs(C.col_stride)) {
    // Column-major C (e.g. dWᵀ as a view of a row-major dW): walk down columns in bands of 32 rows,
    // so the stores are contiguous and the band of the accumulator stays in L1.
    for (std::int64_t b0 = i0; b0 < i1; b0 += 32) {
      const std::int64_t b1 = std::min(i1, b0 + 32);
      for (std::int64_t j = 0; j < nc; ++j) {
        const float bias = E.bias ? E.bias[j0 + j] : 0.0f;
        const std::int64_t col = (j0 + j) * C.col_stride;
        for (std::int64_t i = b0; i < b1; ++i) {
          const float a = acc[(i - i0) * ld + j];
          store_one<D>(C.data, col + i * C.row_stride, E.bias ? a + bias : a);
        }
      }
    }
    return;
  }
  for (std::int64_t i = i0; i < i1; ++i) {
    const float* a = acc + (i - i0) * ld;
    const std::int64_t row = i * C.row_stride + j0 * C.col_stride;
    for (std::int64_t j = 0; j < nc; ++j) {
      store_one<D>(C.data, row + j * C.col_stride, E.bias ? a[j] + E.bias[j0 + j] : a[j]);
    }
  }
}

// Bias after the full sum, one f32 rounding, then rounding to C's dtype; rows [i0,i1), columns
// [j0, j0+nc) of C, whose accumulators start at acc (leading dimension ld).
void finish_block(const Engine& E, float* acc, std::int64_t ld, std::int64_t i0, std::int64_t i1, std::int64_t j0,
                  std::int64_t nc) {
  if (E.direct) {  // acc is C: only the bias is left to add
    if (!E.bias) return;
    for (std::int64_t i = i0; i < i1; ++i) {
      float* a = acc + (i - i0) * ld;
      for (std::int64_t j = 0; j < nc; ++j) a[j] = a[j] + E.bias[j0 + j];
    }
    return;
  }
  switch (E.C.dtype) {
    case DType::f32: store_rows<DType::f32>(E, acc, ld, i0, i1, j0, nc); return;
    case DType::bf16: store_rows<DType::bf16>(E, acc, ld, i0, i1, j0, nc); return;
    case DType::f16: store_rows<DType::f16>(E, acc, ld, i0, i1, j0, nc); return;
  }
}

// The 6x16 tiles of rows [i0, i1) and columns [j0, j1) of a packed block (A slivers at abuf, B
// slivers at bbuf, accumulators at c with leading dimension ld); i0 and j0 are tile-aligned.
void micro_tiles(const Engine& E, std::int64_t kc, const float* abuf, const float* bbuf, float* c, std::int64_t ld,
                 bool load, std::int64_t i0, std::int64_t i1, std::int64_t j0, std::int64_t j1) {
  for (std::int64_t jr = j0; jr < j1; jr += kNR) {
    const std::int64_t nr = std::min<std::int64_t>(kNR, j1 - jr);
    const float* bp = bbuf + jr * kc;
    for (std::int64_t ir = i0; ir < i1; ir += kMR) {
      const std::int64_t mr = std::min<std::int64_t>(kMR, i1 - ir);
      const float* ap = abuf + ir * kc;
      float* ct = c + ir * ld + jr;
      if (mr == kMR && nr == kNR) {
        E.uk(kc, ap, bp, ct, ld, load);
        continue;
      }
      // Edge tile: run the full 6x16 kernel on a copy; the padding lanes are discarded.
      alignas(64) float t[kMR * kNR] = {};
      if (load)
        for (std::int64_t i = 0; i < mr; ++i) std::copy(ct + i * ld, ct + i * ld + nr, t + i * kNR);
      E.uk(kc, ap, bp, t, kNR, load);
      for (std::int64_t i = 0; i < mr; ++i) std::copy(t + i * kNR, t + i * kNR + nr, ct + i * ld);
    }
  }
}

void compute_region(const Engine& E, std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1) {
  Workspace& ws = thread_workspace();
  const std::int64_t K = E.K;
  const std::int64_t sb = E.direct ? m1 - m0 : E.superblock;
  // +8: the slack the AVX2 A packer may write past the last sliver.
  float* abuf = ws.a.get(round_up(std::min(E.mc, m1 - m0), kMR) * std::max<std::int64_t>(1, std::min(E.kc, K)) + 8);
  float* bbuf = ws.b.get(round_up(std::min(E.nc, n1 - n0), kNR) * std::max<std::int64_t>(1, std::min(E.kc, K)));
  for (std::int64_t s0 = m0; s0 < m1; s0 += sb) {
    const std::int64_t s1 = std::min(m1, s0 + sb);
    for (std::int64_t jc = n0; jc < n1; jc += E.nc) {
      const std::int64_t nc = std::min(E.nc, n1 - jc);
      float* acc;
      std::int64_t ld;
      if (E.direct) {
        acc = E.acc + s0 * E.acc_ld + jc;
        ld = E.acc_ld;
      } else {
        // +16: a power-of-two row pitch would put a column's elements in one L1 set (the
        // column-major epilogue reads columns).
        ld = round_up(nc, kNR) + kNR;
        acc = ws.acc.get((s1 - s0) * ld);
      }
      if (K == 0 && !E.from_acc) {
        for (std::int64_t i = 0; i < s1 - s0; ++i) std::fill(acc + i * ld, acc + i * ld + nc, 0.0f);
      }
      for (std::int64_t pc = 0; pc < K; pc += E.kc) {
        const std::int64_t kc = std::min(E.kc, K - pc);
        const bool load = pc > 0 || E.from_acc;  // the running accumulator, never a fresh partial
        E.pack_b(E.B, pc, kc, jc, nc, bbuf);
        for (std::int64_t ic = s0; ic < s1; ic += E.mc) {
          const std::int64_t mc = std::min(E.mc, s1 - ic);
          E.pack_a(E.A, ic, mc, pc, kc, abuf);
          float* const cblock = acc + (ic - s0) * ld;
          std::int64_t jr = 0;
          if (E.big_tiles) {  // 12x32 tiles over whole pairs of slivers; the 6x16 loop below does the rest
            for (; jr + 2 * kNR <= nc; jr += 2 * kNR) {
              const float* bp = bbuf + jr * kc;
              std::int64_t ir = 0;
              for (; ir + 2 * kMR <= mc; ir += 2 * kMR) {
                const float* ap = abuf + ir * kc;
                detail::microkernel_12x32_avx512(kc, ap, ap + kMR * kc, bp, bp + kNR * kc, cblock + ir * ld + jr, ld,
                                                 load);
              }
              if (ir < mc) {
                micro_tiles(E, kc, abuf, bbuf, cblock, ld, load, ir, mc, jr, jr + 2 * kNR);
              }
            }
          }
          if (jr < nc) micro_tiles(E, kc, abuf, bbuf, cblock, ld, load, 0, mc, jr, nc);
        }
      }
      if (E.epilogue) finish_block(E, acc, ld, s0, s1, jc, nc);
    }
  }
}

// Splits the output over tm x tn = T threads: region boundaries fall on whole register tiles, and
// the grid minimises the packing repeated across regions (A once per column of regions, B once per
// row of regions).
void run_engine(const Engine& E, int threads, double min_flops_per_thread) {
  if (E.M == 0 || E.N == 0) return;
  const double flops = 2.0 * static_cast<double>(E.M) * static_cast<double>(E.N) *
                       static_cast<double>(std::max<std::int64_t>(E.K, 1));
  const std::int64_t mtiles = (E.M + kMR - 1) / kMR, ntiles = (E.N + kNR - 1) / kNR;
  int T = threads;
  if (min_flops_per_thread > 0) {
    T = static_cast<int>(std::clamp<double>(std::floor(flops / min_flops_per_thread), 1.0, threads));
  }
  int tm = 1, tn = 1;
  for (; T > 1; --T) {
    double best = -1;
    for (int a = 1; a <= T; ++a) {
      if (T % a) continue;
      const int b = T / a;
      if (a > mtiles || b > ntiles) continue;
      const double cost = static_cast<double>(E.M) * b + static_cast<double>(E.N) * a;
      if (best < 0 || cost < best) best = cost, tm = a, tn = b;
    }
    if (best >= 0) break;
  }
  if (T <= 1) {
    compute_region(E, 0, E.M, 0, E.N);
    return;
  }
  auto split = [](std::int64_t tiles, std::int64_t tile, std::int64_t extent, int parts, int p) {
    return std::min(extent, tiles * p / parts * tile);
  };
  ThreadPool::instance().run(T, [&](int t) {
    const int pm = t / tn, pn = t % tn;
    compute_region(E, split(mtiles, kMR, E.M, tm, pm), split(mtiles, kMR, E.M, tm, pm + 1),
                   split(ntiles, kNR, E.N, tn, pn), split(ntiles, kNR, E.N, tn, pn + 1));
  });
}

Engine make_engine(const char* fn, const GemmOptions& o, const MatrixView& A, const MatrixView& B) {
  if (o.threads < 1) {
    throw std::invalid_argument(fmt::format("{}: options.threads is {}; it must be >= 1", fn, o.threads));
  }
  if (o.mc < 0 || o.nc < 0 || o.kc < 0) {
    throw std::invalid_argument(fmt::format("{}: options.mc/nc/kc are {}/{}/{}; each must be >= 0 (0 = default)", fn,
                                            o.mc, o.nc, o.kc));
  }
  Engine E;
  E.A = A;
  E.B = B;
  E.M = A.rows;
  E.N = B.cols;
  E.K = A.cols;
  // An isa outside the enum (options read from untrusted bytes) is an error, after the switch.
  const GemmIsa isa = o.isa == GemmIsa::automatic ? gemm_isa_automatic() : o.isa;
  switch (isa) {
    case GemmIsa::automatic:
    case GemmIsa::portable: E.uk = &detail::microkernel_6x16_portable; break;
    case GemmIsa::avx2:
      if (!cpu_has_avx2_fma()) {
        throw std::invalid_argument(fmt::format(
            "{}: options.isa is avx2 but this CPU lacks AVX2 or FMA; use GemmIsa::automatic or GemmIsa::portable",
            fn));
      }
      E.uk = &detail::microkernel_6x16_avx2;
      break;
    case GemmIsa::avx512:
      if (!cpu_has_avx512f()) {
        throw std::invalid_argument(fmt::format(
            "{}: options.isa is avx512 but this CPU lacks AVX-512F (or AVX2/FMA); use GemmIsa::automatic, "
            "GemmIsa::avx2 or GemmIsa::portable",
            fn));
      }
      E.uk = &detail::microkernel_6x16_avx2;
      E.big_tiles = true;
      break;
  }
  if (o.isa != GemmIsa::automatic && o.isa != GemmIsa::portable && o.isa != GemmIsa::avx2 &&
      o.isa != GemmIsa::avx512) {
    throw std::invalid_argument(fmt::format(
        "{}: options.isa has invalid value {}; valid: automatic, portable, avx2, avx512", fn, static_cast<int>(o.isa)));
  }
  const Blocking& blocking = E.big_tiles ? kBlocking12x32 : kBlocking6x16;
  E.mc = o.mc ? round_up(o.mc, kMR) : blocking.mc;
  E.nc = o.nc ? round_up(o.nc, kNR) : blocking.nc;
  E.kc = o.kc ? o.kc : blocking.kc;
  E.superblock = std::max(E.mc, kSuperblockRows / E.mc * E.mc);
  // The AVX2 packers only where the AVX2 micro-kernel runs: `portable` stays free of AVX2 entirely.
  const bool simd = E.uk == &detail::microkernel_6x16_avx2;
  E.pack_a = simd ? by_dtype<PackASimdFor>(A.dtype) : by_dtype<PackAFor>(A.dtype);
  E.pack_b = simd ? by_dtype<PackBSimdFor>(B.dtype) : by_dtype<PackBFor>(B.dtype);
  return E;
}

void run_product(const char* fn, const MatrixView& A, const MatrixView& B, const VectorView* bias,
                 const MutableMatrixView& C, const GemmOptions& o) {
  Engine E = make_engine(fn, o, A, B);
  std::vector<float> bias_f32;
  if (bias) {
    bias_f32.resize(static_cast<std::size_t>(E.N));
    for (std::int64_t j = 0; j < E.N; ++j) bias_f32[j] = bias->at(j);
    E.bias = bias_f32.data();
  }
  E.C = C;
  E.epilogue = true;
  E.direct = C.dtype == DType::f32 && C.col_stride == 1;
  if (E.direct) {
    E.acc = static_cast<float*>(C.data);
    E.acc_ld = C.row_stride;
  }
  run_engine(E, o.threads, o.min_flops_per_thread);
}

}  // namespace

void det_gemm(const MatrixView& A, const MatrixView& B, const VectorView* bias, const MutableMatrixView& C,
              const GemmOptions& options) {
  detail::check_gemm("det_gemm", A, B, bias, C);
  run_product("det_gemm", A, B, bias, C, options);
}

void det_gemm_backward_input(const MatrixView& dC, const MatrixView& B, const MutableMatrixView& dA,
                             const GemmOptions& options) {
  detail::check_backward_input("det_gemm_backward_input", dC, B, dA);
  run_product("det_gemm_backward_input", dC, B.transposed(), nullptr, dA, options);  // k runs over n
}

void det_gemm_backward_weight(const MatrixView& A, const MatrixView& dC, const MutableMatrixView& dB,
                              const GemmOptions& options) {
  detail::check_backward_weight("det_gemm_backward_weight", A, dC, dB);
  run_product("det_gemm_backward_weight", A.transposed(), dC, nullptr, dB, options);  // k runs over m
}

void det_gemm_accumulate(const MatrixView& A, const MatrixView& B, float* acc, std::int64_t ld,
                         const GemmOptions& options) {
  detail::check_accumulate("det_gemm_accumulate", A, B, acc, ld);
  Engine E = make_engine("det_gemm_accumulate", options, A, B);
  E.direct = true;
  E.acc = acc;
  E.acc_ld = ld;
  E.from_acc = true;
  run_engine(E, options.threads, options.min_flops_per_thread);
}

}  // namespace cubesim::kernels
