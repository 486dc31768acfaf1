// bench_det_gemm_cpu — GFLOP/s of the fast host det_gemm against two peers in the same run: Eigen's
// f32 GEMM and OpenBLAS's sgemm.
//
// The peers are not contract implementations: neither GEMM is order-stable (kernel and blocking
// depend on the shape and the CPU). Eigen's translation unit (this one) is compiled with -mavx2
// -mfma, the ISA of det_gemm's micro-kernel; its threads come from OpenMP. OpenBLAS is Debian's
// libopenblas (the pthread build, linked directly, never the reference BLAS behind libblas.so); it
// picks its own kernel for the CPU at run time (AVX-512 where the CPU has it) and its threads are set
// to det_gemm's count for each row (openblas_set_num_threads). The header line names the build
// (openblas_get_config). For bf16 inputs both peers multiply the same values widened to f32
// beforehand (that conversion is not timed): Debian's OpenBLAS 0.3.21 is built without BFLOAT16, so
// there is no cblas_sbgemm to call. det_gemm reads the bf16 directly. Output f32, no bias.
//
//   square      M = N = K in {256, 512, 1024, 2048, 4096}, row-major operands
//   LLM-like    a tensor-parallel (TP=4) Llama-7B layer: Y = X·Wᵀ with W stored [out, in], so B is
//               a transposed view (the peers get the same transposed operand): QKV, MLP up, MLP down
//               at 512 and 2048 tokens, and a 16-token decode step
//
// Each figure is the best of several timed runs after a warm-up, the three kernels interleaved in
// ~50 ms blocks; between blocks the benchmark waits until no other thread of the process is running
// (OpenMP's and OpenBLAS's idle threads spin for milliseconds after a call and would take a core
// from the next kernel on a machine with as many cores as threads): at least --reps (3), and as many
// as fit in about 0.5 s per kernel for small shapes. One-thread rows also give the ratio of CPU times
// (the calling thread's, best of the same runs; "CPU time" column): on a machine that other
// processes share, it is what their time slices don't distort.
// Targets: det_gemm >= 0.9x Eigen (issue 5); det_gemm >= 1.0x OpenBLAS on the square and LLM shapes
// >= 1024, f32 and bf16, 1 and 2 threads (issue 14).
//
//   bench_det_gemm_cpu [--quick] [--json FILE] [--threads 1,2] [--reps N] [--min-size N]
//
// --min-size N keeps the shapes whose M, N and K are all >= N (1024: the OpenBLAS target's rows).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <Eigen/Core>
#include <cblas.h>

#include "bench_util.h"
#include "kernels/det_gemm.h"
#include "base/dtype.h"

using namespace cubesim;
using namespace cubesim::kernels;
using namespace cubesim::bench;

namespace {

struct Shape {
  std::string name;
  std::int64_t M, N, K;
  bool weight_transposed;  // B = Wᵀ of a row-major W [N, K]
};

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

struct Result {
  double ours = 0, eigen = 0, openblas = 0;
  // One thread only: det_gemm's CPU-time GFLOP/s over OpenBLAS's (the calling thread's CPU time,
  // best of the same runs), which other processes' time slices don't inflate; 0 with more threads.
  double openblas_ratio_cpu = 0;
};

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// True when no thread of this process but the caller is running or runnable (state R in
// /proc/self/task/*/stat): the peers' idle threads have stopped spinning.
bool other_threads_idle() {
  const std::string self = std::to_string(gettid());
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    if (e.path().filename() == self) continue;
    std::ifstream f(e.path() / "stat");
    std::string stat;
    std::getline(f, stat);
    const auto paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'R') return false;
  }
  return true;
}

// At least 5 ms, then until the other threads are idle (at most 1 s: a thread that never sleeps
// must not stop the benchmark).
void pause_until_quiet() {
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  for (int i = 0; i < 1000 && !other_threads_idle(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// "OpenBLAS 0.3.21 DYNAMIC_ARCH ... Cooperlake ..." without the trailing space OpenBLAS leaves.
std::string openblas_config() {
  std::string c = openblas_get_config();
  while (!c.empty() && c.back() == ' ') c.pop_back();
  return c;
}

Result run_shape(const Shape& s, DType dtype, int threads, int reps, double budget_s) {
  const std::int64_t M = s.M, N = s.N, K = s.K;
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  // Values rounded to the input dtype; Eigen gets them widened to f32 (exactly the same values).
  std::vector<float> a(static_cast<std::size_t>(M * K)), w(static_cast<std::size_t>(N * K));
  for (float& v : a) v = round_to(dtype, u(rng));
  for (float& v : w) v = round_to(dtype, u(rng));
  std::vector<std::uint8_t> a_in(a.size() * dtype_size(dtype)), w_in(w.size() * dtype_size(dtype));
  convert_from_f32(a.data(), a_in.data(), dtype, a.size());
  convert_from_f32(w.data(), w_in.data(), dtype, w.size());
  std::vector<float> c(static_cast<std::size_t>(M * N)), ce(static_cast<std::size_t>(M * N)),
      cb(static_cast<std::size_t>(M * N));

  const MatrixView A = MatrixView::row_major(a_in.data(), dtype, M, K);
  // w holds B [K, N] row-major, or W [N, K] row-major with B = Wᵀ.
  const MatrixView B = s.weight_transposed ? MatrixView::row_major(w_in.data(), dtype, N, K).transposed()
                                           : MatrixView::row_major(w_in.data(), dtype, K, N);
  const MutableMatrixView C = MutableMatrixView::row_major(c.data(), DType::f32, M, N);
  const GemmOptions opt{.threads = threads};

  Eigen::Map<const RowMat> ea(a.data(), M, K);
  Eigen::Map<const RowMat> ew(w.data(), s.weight_transposed ? N : K, s.weight_transposed ? K : N);
  Eigen::Map<RowMat> ec(ce.data(), M, N);
  Eigen::setNbThreads(threads);
  openblas_set_num_threads(threads);

  auto ours = [&] { det_gemm(A, B, nullptr, C, opt); };
  auto eigen = [&] {
    if (s.weight_transposed) {
      ec.noalias() = ea * ew.transpose();
    } else {
      ec.noalias() = ea * ew;
    }
  };
  auto openblas = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, s.weight_transposed ? CblasTrans : CblasNoTrans, static_cast<int>(M),
                static_cast<int>(N), static_cast<int>(K), 1.0f, a.data(), static_cast<int>(K), w.data(),
                static_cast<int>(s.weight_transposed ? K : N), 0.0f, cb.data(), static_cast<int>(N));
  };
  auto time = [](auto&& f) {
    const double t0 = wall_seconds();
    f();
    return wall_seconds() - t0;
  };
  // Warm-up: page in buffers, grow the workspaces, start the pool. Its times size the repetitions:
  // at least `reps`, more for small shapes until each side has run for about budget_s (best-of-N
  // over half a second is what survives the noise of a shared machine).
  ours();
  eigen();
  openblas();
  const double t_ours = time(ours), t_eigen = time(eigen), t_openblas = time(openblas);
  const double per_rep = std::max({t_ours, t_eigen, t_openblas});
  const int n = std::max(reps, static_cast<int>(std::min(20000.0, budget_s / std::max(per_rep, 1e-7))));
  // Interleaved in blocks of ~50 ms, each started on a quiet process (see pause_until_quiet).
  const int block = std::max(1, static_cast<int>(0.05 / std::max(per_rep, 1e-7)));
  double best_ours = 1e30, best_eigen = 1e30, best_openblas = 1e30, cpu_ours = 1e30, cpu_openblas = 1e30;
  auto timed = [&](auto&& f, double& best, double& best_cpu) {
    const double c0 = thread_cpu_seconds();
    best = std::min(best, time(f));
    best_cpu = std::min(best_cpu, thread_cpu_seconds() - c0);
  };
  for (int done = 0; done < n; done += block) {
    pause_until_quiet();
    for (int r = 0; r < block; ++r) timed(ours, best_ours, cpu_ours);
    pause_until_quiet();
    for (int r = 0; r < block; ++r) best_eigen = std::min(best_eigen, time(eigen));
    pause_until_quiet();
    for (int r = 0; r < block; ++r) timed(openblas, best_openblas, cpu_openblas);
  }
  // Sanity: all computed the same product (the peers' order differs, so only approximately).
  auto check = [&](const std::vector<float>& peer, const char* name) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < c.size(); ++i) {
      num += (double(c[i]) - peer[i]) * (double(c[i]) - peer[i]);
      den += double(peer[i]) * peer[i];
    }
    if (!(num <= 1e-10 * den)) {
      throw std::runtime_error(fmt::format("{}: det_gemm and {} disagree (relative error {:.3g})", s.name, name,
                                           std::sqrt(num / den)));
    }
  };
  check(ce, "Eigen");
  check(cb, "OpenBLAS");
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  return {flops / best_ours * 1e-9, flops / best_eigen * 1e-9, flops / best_openblas * 1e-9,
          threads == 1 ? cpu_openblas / cpu_ours : 0.0};
}

std::vector<int> parse_threads(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const BenchArgs args = parse_bench_args(argc, argv, "bench_det_gemm_cpu");
  std::vector<int> thread_counts = {1, 2};
  int reps = args.quick ? 1 : 3;
  std::int64_t min_size = 0;
  for (std::size_t i = 0; i < args.rest.size(); ++i) {
    const std::string& a = args.rest[i];
    if (a == "--threads" && i + 1 < args.rest.size()) {
      thread_counts = parse_threads(args.rest[++i]);
    } else if (a == "--reps" && i + 1 < args.rest.size()) {
      reps = std::max(1, std::stoi(args.rest[++i]));
    } else if (a == "--min-size" && i + 1 < args.rest.size()) {
      min_size = std::stoll(args.rest[++i]);
    } else {
      fmt::print(stderr, "bench_det_gemm_cpu: unknown argument '{}'; valid: --quick, --json FILE, --threads 1,2, "
                         "--reps N, --min-size N\n", a);
      return 2;
    }
  }
  if (!cpu_has_avx2_fma()) {
    fmt::print(stderr, "bench_det_gemm_cpu: this CPU lacks AVX2/FMA, which this benchmark is built for\n");
    return 2;
  }

  std::vector<Shape> shapes;
  if (args.quick) {
    shapes = {{"square", 256, 256, 256, false}, {"decode", 16, 512, 256, true}};
  } else {
    for (std::int64_t n : {256, 512, 1024, 2048, 4096}) shapes.push_back({"square", n, n, n, false});
    shapes.push_back({"decode_qkv", 16, 3072, 4096, true});
    for (std::int64_t m : {512, 2048}) {
      shapes.push_back({"qkv", m, 3072, 4096, true});
      shapes.push_back({"mlp_up", m, 2752, 4096, true});
      shapes.push_back({"mlp_down", m, 4096, 2752, true});
    }
  }

  std::erase_if(shapes, [&](const Shape& s) { return std::min({s.M, s.N, s.K}) < min_size; });

  const std::string cpu = cpu_model();
  const std::string openblas = openblas_config();
  const GemmIsa isa = gemm_isa_automatic();
  fmt::print("bench_det_gemm_cpu: {}; det_gemm micro-kernel {}; Eigen {}.{}.{} with AVX2+FMA; {} (core {}); "
             "best of >= {}\n",
             cpu, isa == GemmIsa::avx512 ? "avx512 (12x32, 6x16 avx2 on edges)" : "avx2 (6x16)", EIGEN_WORLD_VERSION,
             EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION, openblas, openblas_get_corename(), reps);
  Table t({"shape", "M", "N", "K", "dtype", "threads", "det_gemm GFLOP/s", "Eigen GFLOP/s", "OpenBLAS GFLOP/s",
           "vs Eigen", ">= 0.9", "vs OpenBLAS", ">= 1.0", "CPU time"});
  nlohmann::json rows = nlohmann::json::array();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int threads : thread_counts) {
      for (const Shape& s : shapes) {
        const Result r = run_shape(s, dtype, threads, reps, args.quick ? 0.02 : 0.5);
        const double ratio = r.ours / r.eigen, ratio_openblas = r.ours / r.openblas;
        // The OpenBLAS target covers shapes with every dimension >= 1024 (not the decode step).
        const bool openblas_target = std::min({s.M, s.N, s.K}) >= 1024;
        t.row({s.name + (s.weight_transposed ? " (X·Wᵀ)" : ""), std::to_string(s.M), std::to_string(s.N),
               std::to_string(s.K), std::string(dtype_name(dtype)), std::to_string(threads),
               fmt::format("{:.1f}", r.ours), fmt::format("{:.1f}", r.eigen), fmt::format("{:.1f}", r.openblas),
               fmt::format("{:.2f}", ratio), ratio >= 0.9 ? "yes" : "NO", fmt::format("{:.2f}", ratio_openblas),
               !openblas_target ? "-" : ratio_openblas >= 1.0 ? "yes" : "NO",
               threads == 1 ? fmt::format("{:.2f}", r.openblas_ratio_cpu) : "-"});
        rows.push_back({{"shape", s.name},
                        {"M", s.M},
                        {"N", s.N},
                        {"K", s.K},
                        {"weight_transposed", s.weight_transposed},
                        {"dtype", dtype_name(dtype)},
                        {"threads", threads},
                        {"gflops", r.ours},
                        {"eigen_gflops", r.eigen},
                        {"ratio", ratio},
                        {"openblas_gflops", r.openblas},
                        {"openblas_ratio", ratio_openblas},
                        {"openblas_target", openblas_target},
                        {"openblas_ratio_cpu_time", r.openblas_ratio_cpu}});
        std::fflush(stdout);
      }
    }
  }
  t.print();
  write_json(args, {{"bench", "bench_det_gemm_cpu"}, {"cpu", cpu}, {"isa", gemm_isa_name(isa)}, {"openblas", openblas}, {"reps", reps}, {"rows", rows}});
  return 0;
}
