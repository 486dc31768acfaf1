// det_gemm_exact.cu — GemmMode::exact: the numerics contract with FFMA, tuned for the f32 pipes.
//
// A register-blocked SGEMM: 128x128 output tiles, 256 threads, 8x8 outputs per thread, k staged
// through shared memory 16 at a time (widened to f32 on the way in, after the FFMAs of the previous
// k-tile so no load latency stalls them), two blocks per SM walking the tiles persistently. The
// contract holds because each accumulator is owned by exactly one thread and updated by one
// __fmaf_rn per k, in ascending k, from 0.0f; blocking over k only changes when operands are loaded,
// never the order of the FMAs. The last, partial k-tile stops at K (it does not run zero-padded k,
// which could turn a -0 sum into +0). Vectorized over m and n only, never over k.
//
// Two ways to stage a k-tile, same FFMAs in the same order (so the same bits):
//  - async (operands 16-byte aligned with a unit stride and rows a multiple of 16 bytes apart: every
//    dense layout, k-major or MN-major, any dtype): cp.async copies 16-byte chunks straight into
//    shared memory, so the next k-tile costs no registers during the FFMA loop. f32 chunks along m
//    (n) land in the compute tile as they are; the others land in a per-thread slot and are widened
//    and transposed into the tile after the k-tile's FFMAs (each thread converts the chunks it
//    copied itself, so no extra barrier). Before this path the f32 and transposed variants spilled
//    48-260 bytes (the k-tile in flight took 8-16 registers beside 64 accumulators).
//  - registers (anything else: odd strides, unaligned views; and 16-bit operands both k-major, its one
//    spill-free case, where it measured 1% faster): the loads sit in registers until after the
//    FFMAs. CUBESIM_EXACT_STAGING=registers forces it everywhere (for A/B measurements).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/det_gemm_cuda_internal.h"
#include "kernels/cuda/dtype_cuda.cuh"

namespace cubesim::cuda::detail {
namespace {

constexpr int BM = 128, BN = 128, BK = 16, THREADS = 256;
constexpr int PAD = 4;  // keeps float4 alignment (row = 132 floats = 528 B) and spreads banks
static_assert(THREADS % BK == 0 && THREADS % BM == 0 && THREADS % BN == 0, "staging maps assume these");

struct ExactParams {
  const void* a;
  std::int64_t a_rs, a_cs;
  const void* b;
  std::int64_t b_rs, b_cs;
  void* c;
  std::int64_t c_rs, c_cs;
  const void* bias;
  std::int64_t bias_stride;
  int M, N, K;
  DType c_dtype, bias_dtype;
  bool a_kcontig;  // consecutive threads walk k (else m) when staging A: coalesced either way
  bool b_ncontig;  // consecutive threads walk n (else k) when staging B
  bool a_vec, b_vec;  // k-contiguous with 16-byte aligned rows: 8 k in one or two 16-byte loads
  bool a_async, b_async;  // the staging dimension unit-stride, 16-byte aligned rows: cp.async staging
};

// Which elements of a tile this thread stages: all 8 lie in one row r0 of the tile (r is m for A, n
// for B), at k = k0 + i*DK. With K_FAST (the view's k stride is the small one), two threads share a
// row and each takes 8 consecutive k; otherwise ROWS threads take ROWS consecutive rows and step k by
// 256/ROWS. Either way neighbouring threads touch neighbouring addresses: coalesced loads, and one
// 64-bit row offset per thread.
//
// Edges need no zero fill: a row past the matrix is clamped to its last row and a k past K to the last
// k (valid addresses), and what they load is never used — rows past M and columns past N feed only
// outputs that are not stored, and k past K is never multiplied (the last k-tile stops at K).
template <bool K_FAST, int ROWS>
struct Stager {
  static constexpr int PER = ROWS * BK / THREADS;  // 8
  static constexpr int DK = K_FAST ? 1 : THREADS / ROWS;
  int r0, k0;
  std::int64_t row_off;  // element offset of row min(r0, last row) from the tile's row 0
  std::int64_t k_stride;
  bool vec;              // K_FAST only: the 8 k are contiguous and 16-byte aligned
};

// The 8 staged elements of a thread as loaded: 16-bit types two to a 32-bit word, f32 one to a word.
// They are widened only when stored to shared memory, after the k-tile's FFMAs, so the load latency
// never sits in front of an instruction the warp needs (and bf16/f16 take 4 registers, not 8).
template <DType T>
struct Raw {
  static constexpr int WORDS = T == DType::f32 ? 8 : 4;
  unsigned w[WORDS];
};

template <DType T>
__device__ __forceinline__ float widen(const Raw<T>& r, int i) {
  if constexpr (T == DType::f32) {
    return __uint_as_float(r.w[i]);
  } else if constexpr (T == DType::bf16) {
    return __uint_as_float(i % 2 ? r.w[i / 2] & 0xffff0000u : r.w[i / 2] << 16);
  } else {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(i % 2 ? r.w[i / 2] >> 16 : r.w[i / 2] & 0xffffu)));
  }
}

// 8 contiguous elements at p, 16-byte aligned, in one (16-bit types) or two (f32) 16-byte loads.
// Loads through L1 cost one request per cache line a warp touches: one wide load instead of eight
// narrow ones keeps the staging off the L1/shared-memory pipe the FFMA loop feeds from.
template <DType T>
__device__ __forceinline__ void load8(const void* p, Raw<T>& r) {
  const uint4 x = __ldg(static_cast<const uint4*>(p));
  r.w[0] = x.x; r.w[1] = x.y; r.w[2] = x.z; r.w[3] = x.w;
  if constexpr (T == DType::f32) {
    const uint4 y = __ldg(static_cast<const uint4*>(p) + 1);
    r.w[4] = y.x; r.w[5] = y.y; r.w[6] = y.z; r.w[7] = y.w;
  }
}

template <DType T>
__device__ __forceinline__ unsigned load_bits(const void* base, std::int64_t i) {
  if constexpr (T == DType::f32) {
    return __float_as_uint(__ldg(static_cast<const float*>(base) + i));
  } else {
    return __ldg(static_cast<const unsigned short*>(base) + i);
  }
}

template <bool K_FAST, int ROWS>
__device__ __forceinline__ Stager<K_FAST, ROWS> make_stager(int r_left, std::int64_t r_stride,
                                                            std::int64_t k_stride, bool vec) {
  using S = Stager<K_FAST, ROWS>;
  static_assert(K_FAST ? BK % S::PER == 0 : THREADS % ROWS == 0, "staging map");
  const int tid = threadIdx.x;
  S st;
  st.r0 = K_FAST ? tid / (BK / S::PER) : tid % ROWS;
  st.k0 = K_FAST ? (tid % (BK / S::PER)) * S::PER : tid / ROWS;
  st.row_off = static_cast<std::int64_t>(min(st.r0, r_left - 1)) * r_stride;
  st.k_stride = k_stride;
  st.vec = K_FAST && vec;
  return st;
}

// base: the view's element (tile row 0, first k of the k-tile); k_last: last valid k relative to it.
template <DType T, bool K_FAST, int ROWS>
__device__ __forceinline__ void stage_load(const void* base, const Stager<K_FAST, ROWS>& st, int k_last, Raw<T>& raw) {
  using S = Stager<K_FAST, ROWS>;
  static_assert(S::PER == 8, "8 elements a thread");
  if constexpr (K_FAST) {
    if (st.vec && k_last >= BK - 1) {  // a whole k-tile: no clamping needed
      using E = typename Storage<T>::type;
      load8<T>(static_cast<const E*>(base) + st.row_off + st.k0, raw);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int k = min(st.k0 + i * S::DK, k_last);
    const unsigned b = load_bits<T>(base, st.row_off + static_cast<std::int64_t>(k) * st.k_stride);
    if constexpr (T == DType::f32) {
      raw.w[i] = b;
    } else if (i % 2 == 0) {
      raw.w[i / 2] = b;
    } else {
      raw.w[i / 2] |= b << 16;
    }
  }
}

template <int LD, DType T, bool K_FAST, int ROWS>
__device__ __forceinline__ void stage_store(float (*tile)[LD], const Stager<K_FAST, ROWS>& st, const Raw<T>& raw) {
  using S = Stager<K_FAST, ROWS>;
#pragma unroll
  for (int i = 0; i < 8; ++i) tile[st.k0 + i * S::DK][st.r0] = widen<T>(raw, i);
}

// One k step for this thread's 8x8 accumulators: rows ty*4+{0..3} and 64+ty*4+{0..3}, columns
// likewise with tx (split so a warp's float4 reads of B cover 2 x 256 contiguous bytes).
__device__ __forceinline__ void fma_step(float (&acc)[8][8], const float* arow, const float* brow, int ty, int tx) {
  const float4 a0 = *reinterpret_cast<const float4*>(arow + ty * 4);
  const float4 a1 = *reinterpret_cast<const float4*>(arow + 64 + ty * 4);
  const float4 b0 = *reinterpret_cast<const float4*>(brow + tx * 4);
  const float4 b1 = *reinterpret_cast<const float4*>(brow + 64 + tx * 4);
  const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = __fmaf_rn(a[i], b[j], acc[i][j]);
}

// Persistent: a grid of (2 per SM) blocks walks the 128x128 output tiles, n fastest so the blocks
// working at once share A panels; each block loads its next tile's first k-tile before storing the
// current one, so that load's latency hides behind the epilogue.
// One k-tile's FMAs, k ascending (the last k-tile stops at K), both kernels.
__device__ __forceinline__ void ktile_fmas(float (&acc)[8][8], const float (&a)[BK][BM + PAD],
                                           const float (&b)[BK][BN + PAD], int t, int ktiles, int K, int ty, int tx) {
  if (t + 1 < ktiles || K % BK == 0) {
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) fma_step(acc, a[kk], b[kk], ty, tx);
  } else {
    const int krem = K - t * BK;  // the last k-tile: stop at K
    for (int kk = 0; kk < krem; ++kk) fma_step(acc, a[kk], b[kk], ty, tx);
  }
}

// The tile's epilogue, both kernels: bias after the whole sum (an add the compiler cannot contract),
// then round once into C's dtype. A thread holds rows ty*4.. and 64+ty*4.., columns tx*4.. and 64+tx*4...
__device__ __forceinline__ void store_tile(const ExactParams& p, const float (&acc)[8][8], int cm0, int cn0, int tx,
                                           int ty) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int m = cm0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
    if (m >= p.M) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int n = cn0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + (j - 4));
      if (n >= p.N) continue;
      float v = acc[i][j];
      if (p.bias) v = __fadd_rn(v, load_elem_rt(p.bias, p.bias_dtype, n * p.bias_stride));
      store_elem_rt(p.c, p.c_dtype, static_cast<std::int64_t>(m) * p.c_rs + static_cast<std::int64_t>(n) * p.c_cs, v);
    }
  }
}

template <DType TA, DType TB, bool A_KFAST, bool B_KFAST>
__global__ void __launch_bounds__(THREADS, 2) exact_gemm_kernel(const ExactParams p) {
  __shared__ __align__(16) float as[2][BK][BM + PAD];
  __shared__ __align__(16) float bs[2][BK][BN + PAD];
  using SA = typename Storage<TA>::type;
  using SB = typename Storage<TB>::type;

  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int n_tiles = (p.N + BN - 1) / BN, tiles = n_tiles * ((p.M + BM - 1) / BM);
  const int ktiles = (p.K + BK - 1) / BK;
  const std::int64_t a_kstep = static_cast<std::int64_t>(BK) * p.a_cs, b_kstep = static_cast<std::int64_t>(BK) * p.b_rs;

  int tile = blockIdx.x;
  int m0 = (tile / n_tiles) * BM, n0 = (tile % n_tiles) * BN;
  auto sta = make_stager<A_KFAST, BM>(p.M - m0, p.a_rs, p.a_cs, p.a_vec);
  auto stb = make_stager<B_KFAST, BN>(p.N - n0, p.b_cs, p.b_rs, p.b_vec);
  // Element (tile row 0, k 0) of the current tile's A and B panels, advanced per k-tile.
  const SA* a_ptr = static_cast<const SA*>(p.a) + static_cast<std::int64_t>(m0) * p.a_rs;
  const SB* b_ptr = static_cast<const SB*>(p.b) + static_cast<std::int64_t>(n0) * p.b_cs;
  Raw<TA> ra;
  Raw<TB> rb;
  if (ktiles > 0) {
    stage_load<TA>(a_ptr, sta, p.K - 1, ra);
    stage_load<TB>(b_ptr, stb, p.K - 1, rb);
  }

  for (;;) {
    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

    __syncthreads();  // the previous tile's last k-tile has been read by every thread
    if (ktiles > 0) {
      stage_store(as[0], sta, ra);
      stage_store(bs[0], stb, rb);
    }
    __syncthreads();
    for (int t = 0; t < ktiles; ++t) {
      const int buf = t & 1;
      if (t + 1 < ktiles) {
        a_ptr += a_kstep;
        b_ptr += b_kstep;
        const int k_last = p.K - 1 - (t + 1) * BK;
        stage_load<TA>(a_ptr, sta, k_last, ra);
        stage_load<TB>(b_ptr, stb, k_last, rb);
      }
      ktile_fmas(acc, as[buf], bs[buf], t, ktiles, p.K, ty, tx);
      if (t + 1 < ktiles) {
        stage_store(as[buf ^ 1], sta, ra);
        stage_store(bs[buf ^ 1], stb, rb);
        __syncthreads();
      }
    }

    // The next tile's first k-tile is in flight while this one is stored.
    const int cm0 = m0, cn0 = n0;
    const int next = tile + static_cast<int>(gridDim.x);
    if (next < tiles) {
      tile = next;
      m0 = (tile / n_tiles) * BM;
      n0 = (tile % n_tiles) * BN;
      sta = make_stager<A_KFAST, BM>(p.M - m0, p.a_rs, p.a_cs, p.a_vec);
      stb = make_stager<B_KFAST, BN>(p.N - n0, p.b_cs, p.b_rs, p.b_vec);
      a_ptr = static_cast<const SA*>(p.a) + static_cast<std::int64_t>(m0) * p.a_rs;
      b_ptr = static_cast<const SB*>(p.b) + static_cast<std::int64_t>(n0) * p.b_cs;
      if (ktiles > 0) {
        stage_load<TA>(a_ptr, sta, p.K - 1, ra);
        stage_load<TB>(b_ptr, stb, p.K - 1, rb);
      }
    }

    store_tile(p, acc, cm0, cn0, tx, ty);
    if (next >= tiles) break;
  }
}


// ---- async staging ---------------------------------------------------------------------------------

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  // src_bytes < 16 zero-fills the rest (and reads nothing when 0): edges need no clamping here.
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// One operand's async staging. A thread copies COPIES 16-byte chunks a k-tile (8 elements):
//  K_FAST: row r = tid / 2, k = (tid % 2) * 8 (+ 4 for f32's second chunk): two threads a row, a warp
//          16 rows x 32 or 64 contiguous bytes;
//  else:   chunk c = tid + 256 j of the 16 k rows x 128 elements (one k row: 128 / CHUNK chunks),
//          a warp one or two whole k rows.
// DIRECT (f32, MN-contiguous): the chunk is 4 consecutive rows of the compute tile at one k, copied in
// place; otherwise into the thread's slot, converted by convert() after the wait.
template <DType T, bool K_FAST>
struct AsyncStager {
  static constexpr int ES = T == DType::f32 ? 4 : 2;
  static constexpr int CHUNK = 16 / ES;
  static constexpr int COPIES = 8 / CHUNK;
  static constexpr bool DIRECT = T == DType::f32 && !K_FAST;
  static constexpr int SLOT_BYTES = DIRECT ? 0 : 16 * COPIES;
  static constexpr int CHUNKS_PER_KROW = BM / CHUNK;
  static_assert(CHUNKS_PER_KROW * CHUNK == BM, "a k row is whole chunks");
  int r, k;               // first chunk's tile row and k within the k-tile
  int r_left;             // rows of this tile inside the matrix
  std::int64_t off;       // element offset of (r, k) from (tile row 0, k-tile start)
  std::int64_t k_stride;  // !K_FAST: element stride between k rows

  __device__ __forceinline__ AsyncStager(int left, std::int64_t r_stride, std::int64_t ks) {
    const int tid = threadIdx.x;
    if constexpr (K_FAST) {
      r = tid / 2;
      k = (tid % 2) * 8;
      off = static_cast<std::int64_t>(r) * r_stride + k;
    } else {
      r = (tid % CHUNKS_PER_KROW) * CHUNK;
      k = tid / CHUNKS_PER_KROW;
      off = r + static_cast<std::int64_t>(k) * ks;
    }
    r_left = left;
    k_stride = ks;
  }

  // Issue this thread's copies of the k-tile at ptr (tile row 0, k-tile start); k_left = K - k-tile start.
  template <class E>
  __device__ __forceinline__ void issue(const E* ptr, int k_left, float (*tile)[BM + PAD], unsigned char* slot) const {
#pragma unroll
    for (int j = 0; j < COPIES; ++j) {
      int bytes;
      std::int64_t o;
      void* dst;
      if constexpr (K_FAST) {
        const int kj = k + j * CHUNK;
        bytes = r < r_left ? min(max(k_left - kj, 0), CHUNK) * ES : 0;
        o = off + j * CHUNK;
      } else {
        const int kj = k + j * (THREADS / CHUNKS_PER_KROW);
        bytes = kj < k_left ? min(max(r_left - r, 0), CHUNK) * ES : 0;
        o = off + static_cast<std::int64_t>(j * (THREADS / CHUNKS_PER_KROW)) * k_stride;
      }
      if constexpr (DIRECT) {
        dst = &tile[k + j * (THREADS / CHUNKS_PER_KROW)][r];
      } else {
        dst = slot + j * 16;
      }
      cp_async16(dst, bytes ? static_cast<const void*>(ptr + o) : static_cast<const void*>(ptr), bytes);
    }
  }

  // After the wait: widen the slot's elements into the compute tile (transposed when K_FAST).
  __device__ __forceinline__ void convert(float (*tile)[BM + PAD], const unsigned char* slot) const {
    if constexpr (!DIRECT) {
      Raw<T> raw;
#pragma unroll
      for (int j = 0; j < COPIES; ++j) {
        const uint4 x = *reinterpret_cast<const uint4*>(slot + j * 16);
        raw.w[4 * j] = x.x; raw.w[4 * j + 1] = x.y; raw.w[4 * j + 2] = x.z; raw.w[4 * j + 3] = x.w;
      }
      if constexpr (K_FAST) {
#pragma unroll
        for (int i = 0; i < 8; ++i) tile[k + i][r] = widen<T>(raw, i);
      } else {
        float4* d = reinterpret_cast<float4*>(&tile[k][r]);
        d[0] = make_float4(widen<T>(raw, 0), widen<T>(raw, 1), widen<T>(raw, 2), widen<T>(raw, 3));
        d[1] = make_float4(widen<T>(raw, 4), widen<T>(raw, 5), widen<T>(raw, 6), widen<T>(raw, 7));
      }
    }
  }
};

template <DType TA, DType TB, bool A_KFAST, bool B_KFAST>
struct AsyncLayout {
  using SA = AsyncStager<TA, A_KFAST>;
  using SB = AsyncStager<TB, B_KFAST>;
  static constexpr int TILE_BYTES = BK * (BM + PAD) * 4;
  static constexpr int SLOT_A = 4 * TILE_BYTES, SLOT_B = SLOT_A + THREADS * SA::SLOT_BYTES;
  static constexpr int BYTES = SLOT_B + THREADS * SB::SLOT_BYTES;
};

// The loop of exact_gemm_kernel with async staging. The compute buffer of a tile's first k-tile
// alternates (buf0), so the next tile's first k-tile goes into the buffer its last k-tile did not use
// (last read before the barrier that ended the k-tile before) and a tile needs one barrier less.
template <DType TA, DType TB, bool A_KFAST, bool B_KFAST>
__global__ void __launch_bounds__(THREADS, 2) exact_gemm_async_kernel(const ExactParams p) {
  using L = AsyncLayout<TA, TB, A_KFAST, B_KFAST>;
  using Tile = float[BK][BM + PAD];
  static_assert(BM == BN, "A and B tiles share a type");
  extern __shared__ __align__(16) unsigned char smem[];
  Tile* as = reinterpret_cast<Tile*>(smem);
  Tile* bs = as + 2;
  unsigned char* slot_a = smem + L::SLOT_A + threadIdx.x * L::SA::SLOT_BYTES;
  unsigned char* slot_b = smem + L::SLOT_B + threadIdx.x * L::SB::SLOT_BYTES;
  using SA = typename Storage<TA>::type;
  using SB = typename Storage<TB>::type;

  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int n_tiles = (p.N + BN - 1) / BN, tiles = n_tiles * ((p.M + BM - 1) / BM);
  const int ktiles = (p.K + BK - 1) / BK;
  const std::int64_t a_kstep = static_cast<std::int64_t>(BK) * p.a_cs, b_kstep = static_cast<std::int64_t>(BK) * p.b_rs;

  int tile = blockIdx.x;
  int m0 = (tile / n_tiles) * BM, n0 = (tile % n_tiles) * BN;
  int buf0 = 0;
  typename L::SA sta(p.M - m0, p.a_rs, p.a_cs);
  typename L::SB stb(p.N - n0, p.b_cs, p.b_rs);
  const SA* a_ptr = static_cast<const SA*>(p.a) + static_cast<std::int64_t>(m0) * p.a_rs;
  const SB* b_ptr = static_cast<const SB*>(p.b) + static_cast<std::int64_t>(n0) * p.b_cs;
  if (ktiles > 0) {
    sta.issue(a_ptr, p.K, as[buf0], slot_a);
    stb.issue(b_ptr, p.K, bs[buf0], slot_b);
    cp_async_commit();
  }

  for (;;) {
    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

    if (ktiles > 0) {
      cp_async_wait_all();
      sta.convert(as[buf0], slot_a);
      stb.convert(bs[buf0], slot_b);
    }
    __syncthreads();
    for (int t = 0; t < ktiles; ++t) {
      const int buf = (buf0 + t) & 1;
      if (t + 1 < ktiles) {
        a_ptr += a_kstep;
        b_ptr += b_kstep;
        const int k_left = p.K - (t + 1) * BK;
        sta.issue(a_ptr, k_left, as[buf ^ 1], slot_a);
        stb.issue(b_ptr, k_left, bs[buf ^ 1], slot_b);
        cp_async_commit();
      }
      ktile_fmas(acc, as[buf], bs[buf], t, ktiles, p.K, ty, tx);
      if (t + 1 < ktiles) {
        cp_async_wait_all();
        sta.convert(as[buf ^ 1], slot_a);
        stb.convert(bs[buf ^ 1], slot_b);
        __syncthreads();
      }
    }

    // The next tile's first k-tile is in flight while this one is stored.
    const int cm0 = m0, cn0 = n0;
    const int next = tile + static_cast<int>(gridDim.x);
    if (next < tiles) {
      tile = next;
      m0 = (tile / n_tiles) * BM;
      n0 = (tile % n_tiles) * BN;
      buf0 = (buf0 + ktiles) & 1;
      sta.r_left = p.M - m0;
      stb.r_left = p.N - n0;
      a_ptr = static_cast<const SA*>(p.a) + static_cast<std::int64_t>(m0) * p.a_rs;
      b_ptr = static_cast<const SB*>(p.b) + static_cast<std::int64_t>(n0) * p.b_cs;
      if (ktiles > 0) {
        sta.issue(a_ptr, p.K, as[buf0], slot_a);
        stb.issue(b_ptr, p.K, bs[buf0], slot_b);
        cp_async_commit();
      }
    }

    store_tile(p, acc, cm0, cn0, tx, ty);
    if (next >= tiles) break;
  }
}

int resident_blocks() {
  // Cached per device: two 256-thread blocks per SM (registers and shared memory allow two).
  static std::atomic<int> cache[64] = {};
  int dev = 0;
  CUBESIM_CUDA_CHECK(cudaGetDevice(&dev));
  int n = cache[dev % 64].load(std::memory_order_relaxed);
  if (n == 0) {
    CUBESIM_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    n *= 2;
    cache[dev % 64].store(n, std::memory_order_relaxed);
  }
  return n;
}

bool registers_forced() {
  static const bool forced = [] {
    const char* e = std::getenv("CUBESIM_EXACT_STAGING");
    return e != nullptr && std::strcmp(e, "registers") == 0;
  }();
  return forced;
}

template <DType TA, DType TB, bool A_KFAST, bool B_KFAST>
void launch_async(const dim3 grid, const ExactParams& p, cudaStream_t stream) {
  constexpr int bytes = AsyncLayout<TA, TB, A_KFAST, B_KFAST>::BYTES;
  auto* kernel = exact_gemm_async_kernel<TA, TB, A_KFAST, B_KFAST>;
  if constexpr (bytes > 48 * 1024) {  // over the default dynamic limit: opt in once per device
    static std::atomic<bool> set[64] = {};
    int dev = 0;
    CUBESIM_CUDA_CHECK(cudaGetDevice(&dev));
    if (!set[dev % 64].load(std::memory_order_relaxed)) {
      CUBESIM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
      set[dev % 64].store(true, std::memory_order_relaxed);
    }
  }
  kernel<<<grid, THREADS, bytes, stream>>>(p);
}

template <DType TA, DType TB>
void launch_typed(const ExactParams& p, cudaStream_t stream) {
  const long long tiles = static_cast<long long>((p.N + BN - 1) / BN) * ((p.M + BM - 1) / BM);
  if (tiles > 0x7fffffffLL) throw_shape_error("det_gemm_cuda: too many output tiles for the exact kernel");
  const dim3 grid(static_cast<unsigned>(std::min<long long>(tiles, resident_blocks())));
  const bool a_kfast = p.a_kcontig, b_kfast = !p.b_ncontig;
  // 16-bit operands both k-major are the one spill-free register variant where the async path is not
  // faster (H200, 8192^3: 43.1 against 42.7 TF/s; every other measured layout gained 5-23%).
  constexpr bool regs_best = TA != DType::f32 && TB != DType::f32;
  if (p.a_async && p.b_async && !registers_forced() && !(regs_best && a_kfast && b_kfast)) {
    if (a_kfast && b_kfast) launch_async<TA, TB, true, true>(grid, p, stream);
    else if (a_kfast) launch_async<TA, TB, true, false>(grid, p, stream);
    else if (b_kfast) launch_async<TA, TB, false, true>(grid, p, stream);
    else launch_async<TA, TB, false, false>(grid, p, stream);
    CUBESIM_CUDA_CHECK_LAUNCH("exact_gemm_async_kernel");
    return;
  }
  if (a_kfast && b_kfast) exact_gemm_kernel<TA, TB, true, true><<<grid, THREADS, 0, stream>>>(p);
  else if (a_kfast) exact_gemm_kernel<TA, TB, true, false><<<grid, THREADS, 0, stream>>>(p);
  else if (b_kfast) exact_gemm_kernel<TA, TB, false, true><<<grid, THREADS, 0, stream>>>(p);
  else exact_gemm_kernel<TA, TB, false, false><<<grid, THREADS, 0, stream>>>(p);
  CUBESIM_CUDA_CHECK_LAUNCH("exact_gemm_kernel");
}

template <DType TA>
void launch_b(DType tb, const ExactParams& p, cudaStream_t stream) {
  switch (tb) {
    case DType::f32: return launch_typed<TA, DType::f32>(p, stream);
    case DType::bf16: return launch_typed<TA, DType::bf16>(p, stream);
    case DType::f16: return launch_typed<TA, DType::f16>(p, stream);
  }
}

}  // namespace

void launch_exact_gemm(const MatrixView& a, const MatrixView& b, const BiasArg& bias, const MutableMatrixView& c,
                       cudaStream_t stream) {
  if (c.rows == 0 || c.cols == 0) return;
  ExactParams p;
  p.a = a.data; p.a_rs = a.row_stride; p.a_cs = a.col_stride;
  p.b = b.data; p.b_rs = b.row_stride; p.b_cs = b.col_stride;
  p.c = c.data; p.c_rs = c.row_stride; p.c_cs = c.col_stride;
  p.bias = bias.data; p.bias_dtype = bias.dtype; p.bias_stride = bias.stride; p.c_dtype = c.dtype;
  p.M = static_cast<int>(c.rows); p.N = static_cast<int>(c.cols); p.K = static_cast<int>(a.cols);
  // Walk the operand along its unit-stride dimension when staging (ties: the row-major choice).
  p.a_kcontig = !(a.row_stride == 1 && a.col_stride != 1);
  p.b_ncontig = !(b.row_stride == 1 && b.col_stride != 1);
  // Vector loads: k unit-stride, 16-byte aligned base, rows a multiple of 16 bytes apart.
  auto vec_ok = [](const void* d, DType t, std::int64_t k_stride, std::int64_t r_stride, std::int64_t rows) {
    const std::int64_t es = static_cast<std::int64_t>(dtype_size(t));
    return k_stride == 1 && reinterpret_cast<std::uintptr_t>(d) % 16 == 0 && (rows <= 1 || (r_stride * es) % 16 == 0);
  };
  p.a_vec = p.a_kcontig && vec_ok(a.data, a.dtype, a.col_stride, a.row_stride, a.rows);
  p.b_vec = !p.b_ncontig && vec_ok(b.data, b.dtype, b.row_stride, b.col_stride, b.cols);
  // Async staging: 16-byte chunks along the staging (unit-stride) dimension, k or m (n). The other
  // dimension's stride in bytes a multiple of 16 (or only one such row), base 16-byte aligned.
  p.a_async = p.a_kcontig ? p.a_vec : vec_ok(a.data, a.dtype, a.row_stride, a.col_stride, a.cols);
  p.b_async = !p.b_ncontig ? p.b_vec : vec_ok(b.data, b.dtype, b.col_stride, b.row_stride, b.rows);
  // K == 0 is fine: the k loop is empty and the epilogue writes 0.0f (+ bias).
  switch (a.dtype) {
    case DType::f32: return launch_b<DType::f32>(b.dtype, p, stream);
    case DType::bf16: return launch_b<DType::bf16>(b.dtype, p, stream);
    case DType::f16: return launch_b<DType::f16>(b.dtype, p, stream);
  }
}

}  // namespace cubesim::cuda::detail
