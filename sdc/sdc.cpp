#include "sdc/sdc.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>

#include <fmt/format.h>

#include "base/dtype.h"
#include "runtime/checksum.h"
#include "runtime/collectives.h"
#include "runtime/comm.h"
#include "runtime/errors.h"
#include "runtime/ops.h"
#include "runtime/process_group.h"
#include "runtime/sim_backend.h"
#include "sim/hw/address_hash.h"
#include "sim/hw/topology.h"

namespace cubesim::sdc {

using nlohmann::json;

namespace {

constexpr const char* kPointNames[] = {"comm_input", "comm_output", "compute_input", "compute_output"};
constexpr const char* kVerdictNames[] = {"clean", "comm", "compute", "memory"};

// ---------------------------------------------------------------- the recipe document

[[noreturn]] void bad(std::string_view origin, const std::string& path, const std::string& msg) {
  throw std::invalid_argument(fmt::format("{}: {}: {}", origin, path, msg));
}

void check_keys(const json& obj, const json& defaults, std::string_view origin, const std::string& path) {
  if (!obj.is_object()) bad(origin, path.empty() ? "(top level)" : path, fmt::format("expected an object, got {}", obj.dump()));
  std::vector<std::string> valid;
  for (const auto& [k, v] : defaults.items()) valid.push_back(k);
  for (const auto& [k, v] : obj.items()) {
    if (!defaults.contains(k)) {
      std::string list;
      for (const auto& v2 : valid) list += (list.empty() ? "" : ", ") + v2;
      bad(origin, path.empty() ? k : path + "." + k,
          fmt::format("unknown key{} (valid here: {})", hw::did_you_mean(k, valid), list));
    }
  }
}

template <class T>
T get_int(const json& obj, const char* key, T dflt, long double lo, long double hi, std::string_view origin,
          const std::string& path) {
  if (!obj.contains(key)) return dflt;
  const json& v = obj.at(key);
  const std::string p = path.empty() ? key : path + "." + key;
  if (!v.is_number_integer() && !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()))
    bad(origin, p, fmt::format("expected an integer in [{}, {}], got {}", static_cast<double>(lo),
                               static_cast<double>(hi), v.dump()));
  const long double x = v.is_number_unsigned() ? static_cast<long double>(v.get<std::uint64_t>())
                        : v.is_number_integer() ? static_cast<long double>(v.get<std::int64_t>())
                                                : static_cast<long double>(v.get<double>());
  if (x < lo || x > hi)
    bad(origin, p, fmt::format("{} is out of range: valid are integers in [{:.0f}, {:.0f}]", v.dump(),
                               static_cast<double>(lo), static_cast<double>(hi)));
  return static_cast<T>(x);
}

std::string get_string(const json& obj, const char* key, std::string dflt, std::string_view origin,
                       const std::string& path) {
  if (!obj.contains(key)) return dflt;
  const json& v = obj.at(key);
  if (!v.is_string()) bad(origin, path.empty() ? key : path + "." + key, fmt::format("expected a string, got {}", v.dump()));
  return v.get<std::string>();
}

template <class F>
auto parse_field(std::string_view origin, const std::string& path, F&& f) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {  // rt::RuntimeError too
    bad(origin, path, e.what());
  }
}

json fault_to_json(const RecipeFault& f) {
  const hw::FaultSpec& s = f.spec;
  return json{{"site", hw::fault_site_name(s.site)},
              {"model", hw::fault_model_name(s.model)},
              {"link", s.link},
              {"cube", s.cube},
              {"pe", s.pe},
              {"address", s.address},
              {"bytes", s.bytes},
              {"at_us", f.at_us},
              {"nth", s.nth},
              {"bits", s.bits},
              {"words", s.words},
              {"word_bytes", s.word_bytes},
              {"stuck_value", s.stuck_value},
              {"seed", s.seed},
              {"tensor", f.tensor},
              {"layer", f.layer},
              {"rank", f.rank}};
}

// ---------------------------------------------------------------- the model's data

// A uniform value in [-1, 1) from a 64-bit draw (exact in double; portable, unlike std's distributions).
double unit(std::uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-52 - 1.0; }

std::vector<std::uint8_t> to_dtype(const std::vector<float>& v, DType t) {
  std::vector<std::uint8_t> out(v.size() * dtype_size(t));
  for (std::size_t i = 0; i < v.size(); ++i) store_f32(out.data(), t, static_cast<std::int64_t>(i), v[i]);
  return out;
}

// W [ffn, hidden], scaled so x·Wᵀ stays O(1).
std::vector<std::uint8_t> weight_bytes(const Recipe& r) {
  std::mt19937_64 rng(r.weight_seed);
  std::vector<float> w(static_cast<std::size_t>(r.ffn * r.hidden));
  const double scale = std::sqrt(3.0 / static_cast<double>(r.hidden));
  for (auto& x : w) x = static_cast<float>(unit(rng()) * scale);
  return to_dtype(w, r.dtype);
}

// tp: W2 [hidden, ffn], from its own stream of the weight seed, scaled for a sum over ffn.
std::vector<std::uint8_t> weight2_bytes(const Recipe& r) {
  std::mt19937_64 rng(hw::mix64(r.weight_seed ^ 0x5DC0FFEEull));
  std::vector<float> w(static_cast<std::size_t>(r.hidden * r.ffn));
  const double scale = std::sqrt(3.0 / static_cast<double>(r.ffn));
  for (auto& x : w) x = static_cast<float>(unit(rng()) * scale);
  return to_dtype(w, r.dtype);
}

std::vector<std::uint8_t> input_bytes(const Recipe& r, int rank) {
  std::mt19937_64 rng(r.input_seed + static_cast<std::uint64_t>(rank) * 0x9E3779B97F4A7C15ull);
  std::vector<float> x(static_cast<std::size_t>(r.tokens * r.hidden));
  for (auto& v : x) v = static_cast<float>(unit(rng()) * 1.7);
  return to_dtype(x, r.dtype);
}

// The rank-fill pattern: word i of rank q's buffer.
std::uint32_t fill_word(int q, std::int64_t i) {
  return static_cast<std::uint32_t>(hw::mix64((static_cast<std::uint64_t>(q) << 40) ^ static_cast<std::uint64_t>(i)));
}
std::vector<std::uint8_t> fill_bytes(int q, std::int64_t n, DType t) {
  const std::size_t w = dtype_size(t);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(n) * w);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t v = fill_word(q, i);
    std::memcpy(out.data() + static_cast<std::size_t>(i) * w, &v, w);
  }
  return out;
}

std::vector<std::uint8_t> poison_bytes(std::int64_t n, DType t) {
  const std::size_t w = dtype_size(t);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(n) * w);
  const std::uint32_t nan = w == 4 ? 0x7fc0deadu : 0x7fdeu;
  for (std::int64_t i = 0; i < n; ++i) std::memcpy(out.data() + static_cast<std::size_t>(i) * w, &nan, w);
  return out;
}

// The layout of one layer's checksum slots on a rank (word in the even slot of a pair, mix in the
// odd one). fsdp: pairs comm_input, compute_input, compute_output, then one per chunk of the
// gathered weight. tp: pairs x, w1, w2 (compute_input), y_r (comm_input), h (with y_r,
// compute_output), one per chunk of y, then two per reduction step (what arrived, the result).
struct Layout {
  std::size_t chunks = 0, first_chunk = 0, first_step = 0, steps = 0, pairs = 0;
  Layout(Mode m, int p) {
    chunks = static_cast<std::size_t>(p);
    first_chunk = m == Mode::fsdp ? 3 : 5;
    first_step = first_chunk + chunks;
    steps = m == Mode::tp ? 2 * static_cast<std::size_t>(p - 1) : 0;
    pairs = first_step + steps;
  }
  std::size_t per_layer() const { return 2 * pairs; }
};

struct RankOut {
  std::vector<Checks> checks;                 // per layer
  std::vector<sim::Time> starts;              // rank-fill, then each layer
  std::vector<std::uint8_t> fill;             // the gathered rank-fill buffer
  std::vector<std::vector<std::vector<std::uint8_t>>> tensors;  // per layer: tensor_names(mode)
  std::vector<std::uint64_t> regions;         // per step: the backend's begin_region token
  std::vector<sim::Time> step_starts;         // per step: its start and end
};

int check_ranks(int world, const Recipe& r) {
  const int p = r.ranks > 0 ? r.ranks : world;
  if (p > world)
    throw rt::RuntimeError(fmt::format("sdc: ranks = {} but the context has {} (valid: 0 for all, or 1..{})", p,
                                       world, world));
  if (r.ffn % p != 0)
    throw rt::RuntimeError(fmt::format("sdc: ffn = {} is not divisible by the {} ranks: every rank holds ffn / ranks "
                                       "{} of the weight{} (valid: a multiple of {})",
                                       r.ffn, p, r.mode == Mode::fsdp ? "rows" : "rows of W1 and columns",
                                       r.mode == Mode::fsdp ? "" : " W2", p));
  return p;
}

// Rank r's columns [r·rows, (r+1)·rows) of W2 [hidden, ffn], as a contiguous [hidden, rows] matrix.
std::vector<std::uint8_t> column_shard(const std::vector<std::uint8_t>& w2, const Recipe& r, int rank, std::int64_t rows) {
  const std::size_t esz = dtype_size(r.dtype);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(r.hidden * rows) * esz);
  for (std::int64_t i = 0; i < r.hidden; ++i)
    std::memcpy(out.data() + static_cast<std::size_t>(i * rows) * esz,
                w2.data() + static_cast<std::size_t>(i * r.ffn + rank * rows) * esz, static_cast<std::size_t>(rows) * esz);
  return out;
}

using Arm = std::function<void(int, const std::vector<std::vector<rt::Tensor>>&)>;

// Runs the model on ctx; `arm` (rank, tensors per layer) adds the faults aimed at that rank's tensors.
rt::RunReport run_model(rt::Context& ctx, const Recipe& r, int p, std::vector<RankOut>& out, bool keep_all_tensors,
                        const Arm& arm, int steps = 1, bool checksums = true, bool collect = true) {
  out.assign(static_cast<std::size_t>(p), {});
  const bool tp = r.mode == Mode::tp;
  const std::vector<std::uint8_t> w = weight_bytes(r);
  const std::vector<std::uint8_t> w2 = tp ? weight2_bytes(r) : std::vector<std::uint8_t>{};
  const std::int64_t rows = r.ffn / p;
  const std::size_t esz = dtype_size(r.dtype);
  const bool values = !ctx.backend().timing_only();
  const Layout lay(r.mode, p);
  rt::CollectiveOptions co;
  co.algorithm = r.algorithm;
  co.accumulate_f32 = false;  // the replay's reduction order and dtype, whatever the context's default
  return ctx.spawn(p, [&](int rank) {
    RankOut& o = out[static_cast<std::size_t>(rank)];
    rt::ProcessGroup* world = nullptr;
    if (p < ctx.world_size()) {
      std::vector<int> members(static_cast<std::size_t>(p));
      for (int i = 0; i < p; ++i) members[static_cast<std::size_t>(i)] = i;
      world = &ctx.new_group(members);
    }
    o.starts.push_back(ctx.simulator().now());
    // A backend without simulated time stamps replayed faults with the layer instead (-1: rank-fill).
    rt::FaultReplay* replay = ctx.backend().fault_replay();
    if (replay) replay->set_phase(rank, -1);
    const std::int64_t shard_n = rows * r.hidden;
    if (r.rank_fill) {
      const auto mine_b = fill_bytes(rank, shard_n, r.dtype);
      rt::Tensor mine = ctx.from_host_bytes(rank, {shard_n}, r.dtype, mine_b.data(), mine_b.size());
      rt::Tensor all = ctx.empty(rank, {p * shard_n}, r.dtype, "rank-fill");
      if (values) {
        const auto poison = poison_bytes(p * shard_n, r.dtype);
        all.copy_from_host_bytes(poison.data(), poison.size());
      }
      rt::all_gather(all, mine, world, co);
      if (values) o.fill = all.to_host_bytes();
    }
    // Every layer's tensors, placed up front (the same values in each layer).
    const std::uint8_t* shard_src = w.data() + static_cast<std::size_t>(rank * shard_n) * esz;
    const auto x_b = input_bytes(r, tp ? 0 : rank);
    const auto w2_b = tp ? column_shard(w2, r, rank, rows) : std::vector<std::uint8_t>{};
    // fsdp: the gathered weight, the pre-activation and the output; tp: the pre-activation, the hidden
    // activation and y: each starts poisoned (NaN), so a step that writes nothing shows.
    const std::int64_t pre_cols = tp ? rows : r.ffn;
    const auto poison_full = values && !tp ? poison_bytes(r.ffn * r.hidden, r.dtype) : std::vector<std::uint8_t>{};
    const auto poison_pre = values ? poison_bytes(r.tokens * pre_cols, r.dtype) : std::vector<std::uint8_t>{};
    const auto poison_y = values && tp ? poison_bytes(r.tokens * r.hidden, r.dtype) : std::vector<std::uint8_t>{};
    std::vector<std::vector<rt::Tensor>> t(static_cast<std::size_t>(r.layers));
    std::vector<rt::Tensor> pre(static_cast<std::size_t>(r.layers));
    auto poisoned = [&](std::vector<std::int64_t> shape, const std::vector<std::uint8_t>& poison, const char* name) {
      rt::Tensor x = ctx.empty(rank, std::move(shape), r.dtype, name);
      if (values) x.copy_from_host_bytes(poison.data(), poison.size());
      return x;
    };
    for (int l = 0; l < r.layers; ++l) {
      auto& tl = t[static_cast<std::size_t>(l)];
      const auto x = ctx.from_host_bytes(rank, {r.tokens, r.hidden}, r.dtype, x_b.data(), x_b.size());
      const auto w1 = ctx.from_host_bytes(rank, {rows, r.hidden}, r.dtype, shard_src, static_cast<std::uint64_t>(shard_n) * esz);
      pre[static_cast<std::size_t>(l)] = poisoned({r.tokens, pre_cols}, poison_pre, "pre-activation");
      if (tp) {
        tl = {x, w1, ctx.from_host_bytes(rank, {r.hidden, rows}, r.dtype, w2_b.data(), w2_b.size()),
              poisoned({r.tokens, rows}, poison_pre, "hidden"), poisoned({r.tokens, r.hidden}, poison_y, "output")};
      } else {
        tl = {w1, poisoned({r.ffn, r.hidden}, poison_full, "full weight"), x,
              poisoned({r.tokens, r.ffn}, poison_pre, "output")};
      }
    }
    if (arm) arm(rank, t);
    const std::size_t per = lay.per_layer();
    rt::Backend& be = ctx.backend();
    std::vector<std::size_t> taps(static_cast<std::size_t>(r.layers), 0);  // reduction steps seen (tp)
    for (int step = 0; step < steps; ++step) {
      const std::uint64_t region = be.begin_region(rank, "step");
      o.step_starts.push_back(ctx.simulator().now());
      // One set of slots per step, read once at its end.
      std::optional<rt::Checksums> cs;
      if (checksums) cs.emplace(rank, per * static_cast<std::size_t>(r.layers));
      for (int l = 0; l < r.layers; ++l) {
        const auto& tl = t[static_cast<std::size_t>(l)];
        const rt::Tensor& p_l = pre[static_cast<std::size_t>(l)];
        const std::size_t base = per * static_cast<std::size_t>(l);
        if (step == 0) o.starts.push_back(ctx.simulator().now());
        if (replay) replay->set_phase(rank, l);
        auto take = [&](std::size_t pair, const rt::Tensor& x, std::uint64_t first = 0) {
          if (cs) cs->take_pair(base + 2 * pair, base + 2 * pair + 1, x, first);
        };
        if (tp) {
          const auto& [x, w1, w2s, h, y] = std::tie(tl[0], tl[1], tl[2], tl[3], tl[4]);
          take(0, x);
          take(1, w1, static_cast<std::uint64_t>(x.numel()));
          take(2, w2s, static_cast<std::uint64_t>(x.numel() + w1.numel()));
          rt::matmul(x, w1.t(), nullptr, p_l, "sdc column gemm");
          rt::gelu(r.gelu, p_l, h);
          take(4, h, static_cast<std::uint64_t>(y.numel()));  // the column layer's output
          rt::matmul(h, w2s.t(), nullptr, y, "sdc row gemm");
          take(3, y);
          std::size_t& seen = taps[static_cast<std::size_t>(l)];
          seen = 0;
          const rt::ReduceTap tap = [&](const rt::Tensor& received, const rt::Tensor& reduced) {
            if (seen + 2 <= lay.steps) {
              take(lay.first_step + seen, received);
              take(lay.first_step + seen + 1, reduced);
            }
            seen += 2;
          };
          rt::CollectiveOptions ao = co;
          if (cs) ao.reduce_tap = &tap;
          rt::all_reduce(y, rt::ReduceOp::sum, world, ao);
          const rt::Tensor flat = y.flatten();
          for (int j = 0; j < p; ++j) {
            const rt::Range c = rt::chunk_range(flat.numel(), p, j);
            take(lay.first_chunk + static_cast<std::size_t>(j), flat.narrow(0, c.begin, c.count), static_cast<std::uint64_t>(c.begin));
          }
        } else {
          take(0, tl[0]);
          rt::all_gather(tl[1], tl[0], world, co);
          for (int j = 0; j < p; ++j)
            take(lay.first_chunk + static_cast<std::size_t>(j), tl[1].narrow(0, j * rows, rows), static_cast<std::uint64_t>(j * shard_n));
          take(1, tl[2]);
          rt::matmul(tl[2], tl[1].t(), nullptr, p_l, "sdc gemm");
          rt::gelu(r.gelu, p_l, tl[3]);
          take(2, tl[3]);
        }
      }
      be.end_region(region);
      o.regions.push_back(region);
      o.step_starts.push_back(ctx.simulator().now());
      if (!cs) continue;
      const std::vector<std::uint64_t> v = cs->read();
      o.checks.assign(static_cast<std::size_t>(r.layers), Checks{});
      for (int l = 0; l < r.layers; ++l) {
        const std::size_t base = per * static_cast<std::size_t>(l);
        auto wd = [&](std::size_t pair) { return v[base + 2 * pair]; };
        auto mx = [&](std::size_t pair) { return v[base + 2 * pair + 1]; };
        Checks& c = o.checks[static_cast<std::size_t>(l)];
        c.chunk_word.assign(static_cast<std::size_t>(p), 0);
        c.chunk_mix.assign(static_cast<std::size_t>(p), 0);
        for (std::size_t j = 0; j < lay.chunks; ++j) {
          c.chunk_word[j] = wd(lay.first_chunk + j);
          c.chunk_mix[j] = mx(lay.first_chunk + j);
          c.word[1] += c.chunk_word[j];
          c.mix[1] += c.chunk_mix[j];
        }
        if (tp) {
          const auto in = static_cast<std::size_t>(Point::compute_input), out_i = static_cast<std::size_t>(Point::compute_output);
          c.word[in] = wd(0) + wd(1) + wd(2), c.mix[in] = mx(0) + mx(1) + mx(2);
          c.word[0] = wd(3), c.mix[0] = mx(3);
          c.word[out_i] = wd(3) + wd(4), c.mix[out_i] = mx(3) + mx(4);
          const std::size_t n = std::min(taps[static_cast<std::size_t>(l)], lay.steps);
          for (std::size_t k = 0; k < n; ++k) {
            c.step_word.push_back(wd(lay.first_step + k));
            c.step_mix.push_back(mx(lay.first_step + k));
          }
        } else {
          c.word[0] = wd(0), c.mix[0] = mx(0);
          c.word[2] = wd(1), c.mix[2] = mx(1);
          c.word[3] = wd(2), c.mix[3] = mx(2);
        }
      }
    }
    if (values && collect) {
      const int keep = keep_all_tensors ? r.layers : 1;
      o.tensors.resize(static_cast<std::size_t>(keep));
      for (int l = 0; l < keep; ++l)
        for (const rt::Tensor& x : t[static_cast<std::size_t>(l)]) o.tensors[static_cast<std::size_t>(l)].push_back(x.to_host_bytes());
    }
  });
}

bool same(const Checks& a, const Checks& b, Point p, bool word) {
  const int i = static_cast<int>(p);
  return word ? a.word[static_cast<std::size_t>(i)] == b.word[static_cast<std::size_t>(i)]
              : a.mix[static_cast<std::size_t>(i)] == b.mix[static_cast<std::size_t>(i)];
}

std::string hex_word(const std::uint8_t* p, std::size_t w) {
  std::uint32_t v = 0;
  std::memcpy(&v, p, w);
  return fmt::format("{:#0{}x}", v, 2 + 2 * static_cast<int>(w));
}

// The bytes of a model tensor on a rank (tensor_names(mode)).
std::uint64_t tensor_bytes(const Recipe& r, int p, int which) {
  const std::int64_t rows = r.ffn / p;
  const std::int64_t fsdp[] = {rows * r.hidden, r.ffn * r.hidden, r.tokens * r.hidden, r.tokens * r.ffn};
  const std::int64_t tp[] = {r.tokens * r.hidden, rows * r.hidden, r.hidden * rows, r.tokens * rows, r.tokens * r.hidden};
  return static_cast<std::uint64_t>(r.mode == Mode::fsdp ? fsdp[which] : tp[which]) * dtype_size(r.dtype);
}
int tensor_index(Mode m, const std::string& name) {
  const auto& names = tensor_names(m);
  return static_cast<int>(std::find(names.begin(), names.end(), name) - names.begin());
}
std::string list_names(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
  return out;
}

// A tensor-aimed fault's rank and region inside its tensor: RuntimeError naming the field otherwise.
void check_aimed(const Recipe& r, int p, std::size_t i) {
  const RecipeFault& f = r.faults[i];
  if (tensor_index(r.mode, f.tensor) >= static_cast<int>(tensor_names(r.mode).size()))
    throw rt::RuntimeError(fmt::format("sdc: faults.{}.tensor: '{}' is not a tensor of the {} model (valid: {})", i,
                                       f.tensor, mode_name(r.mode), list_names(tensor_names(r.mode))));
  if (f.rank >= p)
    throw rt::RuntimeError(fmt::format("sdc: faults.{}.rank = {}: the run has ranks 0..{}", i, f.rank, p - 1));
  const std::uint64_t n = tensor_bytes(r, p, tensor_index(r.mode, f.tensor));
  const std::uint64_t esz = dtype_size(r.dtype);
  if (f.spec.address >= n || f.spec.address % esz != 0 || f.spec.bytes > n - f.spec.address)
    throw rt::RuntimeError(fmt::format(
        "sdc: faults.{}: address {} and bytes {} are not inside the {} ({} bytes; the address a multiple of {}, "
        "bytes 0 for the rest of the tensor)",
        i, f.spec.address, f.spec.bytes, f.tensor, n, esz));
}

// Arms the recipe's faults that are not aimed at a tensor (those wait for their rank to place the
// tensor) in `inj`, their times from t0; slot[i]: the injector's spec of recipe fault i (-1: not yet).
// RuntimeError naming the fault's field for a spec the system cannot take.
std::vector<std::ptrdiff_t> arm_untargeted(hw::FaultInjector& inj, const Recipe& r, int p, sim::Time t0) {
  std::vector<std::ptrdiff_t> slot(r.faults.size(), -1);
  for (std::size_t i = 0; i < r.faults.size(); ++i) {
    const RecipeFault& f = r.faults[i];
    if (!f.tensor.empty()) {
      check_aimed(r, p, i);
      continue;
    }
    hw::FaultSpec spec = f.spec;
    if (f.at_us >= 0) spec.at = t0 + static_cast<sim::Time>(std::llround(f.at_us * 1e6));
    try {
      inj.add(spec, fmt::format("faults.{}", i));
    } catch (const hw::FaultError& e) {
      throw rt::RuntimeError(fmt::format("sdc: {}", e.what()));
    }
    slot[i] = static_cast<std::ptrdiff_t>(inj.specs().size()) - 1;
  }
  return slot;
}

}  // namespace

std::string_view point_name(Point p) { return kPointNames[static_cast<int>(p)]; }
std::string_view mode_name(Mode m) { return m == Mode::fsdp ? "fsdp" : "tp"; }
const std::vector<std::string>& tensor_names(Mode m) {
  static const std::vector<std::string> fsdp{"shard", "full", "input", "output"},
      tp{"input", "w1", "w2", "hidden", "output"};
  return m == Mode::fsdp ? fsdp : tp;
}
std::string_view verdict_kind_name(Verdict::Kind k) { return kVerdictNames[static_cast<int>(k)]; }

json recipe_to_json(const Recipe& r) {
  json faults = json::array();
  for (const auto& f : r.faults) faults.push_back(fault_to_json(f));
  return json{{"mode", mode_name(r.mode)},
              {"layers", r.layers},
              {"tokens", r.tokens},
              {"hidden", r.hidden},
              {"ffn", r.ffn},
              {"dtype", dtype_name(r.dtype)},
              {"ranks", r.ranks},
              {"algorithm", rt::algorithm_name(r.algorithm)},
              {"weight_seed", r.weight_seed},
              {"input_seed", r.input_seed},
              {"gelu", kernels::gelu_kind_name(r.gelu)},
              {"rank_fill", r.rank_fill},
              {"faults", faults}};
}

Recipe parse_recipe(const json& doc, std::string_view origin) {
  const Recipe d;
  json defaults = recipe_to_json(d);
  check_keys(doc, defaults, origin, "");
  Recipe r;
  const std::string mode = get_string(doc, "mode", "fsdp", origin, "");
  if (mode != "fsdp" && mode != "tp")
    bad(origin, "mode", fmt::format("'{}' is not a mode (valid: fsdp: all_gather of weight shards, then GEMM + GELU; "
                                    "tp: Megatron's column- and row-parallel layers with their all-reduce)",
                                    mode));
  r.mode = mode == "tp" ? Mode::tp : Mode::fsdp;
  r.layers = get_int<int>(doc, "layers", d.layers, 1, 4096, origin, "");
  r.tokens = get_int<std::int64_t>(doc, "tokens", d.tokens, 1, 1 << 20, origin, "");
  r.hidden = get_int<std::int64_t>(doc, "hidden", d.hidden, 1, 1 << 20, origin, "");
  r.ffn = get_int<std::int64_t>(doc, "ffn", d.ffn, 1, 1 << 20, origin, "");
  r.ranks = get_int<int>(doc, "ranks", d.ranks, 0, rt::kMaxRanks, origin, "");
  // Every rank holds each layer's tensors: a bound on their elements, before any allocation.
  constexpr std::int64_t kMaxElements = std::int64_t{1} << 28;
  for (const auto& [name, n] : {std::pair<const char*, std::int64_t>{"ffn x hidden (the weight)", r.ffn * r.hidden},
                                {"tokens x hidden (the input)", r.tokens * r.hidden},
                                {"tokens x ffn (the output)", r.tokens * r.ffn}}) {
    if (n > kMaxElements)
      bad(origin, "tokens/hidden/ffn",
          fmt::format("{} = {} elements; the SDC model allows at most 2^28 per tensor", name, n));
  }
  if (static_cast<std::int64_t>(r.layers) * (r.ffn * r.hidden + r.tokens * r.hidden + 2 * r.tokens * r.ffn) >
      (std::int64_t{1} << 32))
    bad(origin, "layers", fmt::format("{} layers of these sizes hold more than 2^32 elements per rank; give fewer "
                                      "layers or smaller tensors", r.layers));
  r.weight_seed = get_int<std::uint64_t>(doc, "weight_seed", d.weight_seed, 0, 18446744073709551615.0L, origin, "");
  r.input_seed = get_int<std::uint64_t>(doc, "input_seed", d.input_seed, 0, 18446744073709551615.0L, origin, "");
  const std::string dt = get_string(doc, "dtype", "bf16", origin, "");
  r.dtype = parse_field(origin, "dtype", [&] { return parse_dtype(dt); });
  const std::string alg = get_string(doc, "algorithm", "ring", origin, "");
  r.algorithm = parse_field(origin, "algorithm", [&] { return rt::parse_algorithm(alg); });
  // The verdict's comm rank follows the chunk's forwarding order: ring (owner, owner+1, ...) or direct
  // (straight from the owner); other algorithms forward in orders the verdict does not model. The
  // same two run tp's all-reduce (reduce-scatter and all-gather in those orders).
  if (r.algorithm != rt::Algorithm::ring && r.algorithm != rt::Algorithm::direct)
    bad(origin, "algorithm", fmt::format("'{}' is not supported by the SDC model (valid: ring, direct: the verdict "
                                         "locates a corrupted chunk along their forwarding order)",
                                         alg));
  const std::string g = get_string(doc, "gelu", "tanh", origin, "");
  r.gelu = parse_field(origin, "gelu", [&] { return kernels::parse_gelu_kind(g); });
  if (doc.contains("rank_fill")) {
    if (!doc["rank_fill"].is_boolean()) bad(origin, "rank_fill", fmt::format("expected true or false, got {}", doc["rank_fill"].dump()));
    r.rank_fill = doc["rank_fill"].get<bool>();
  }
  if (doc.contains("faults")) {
    const json& fs = doc["faults"];
    if (!fs.is_array()) bad(origin, "faults", fmt::format("expected a list of faults, got {}", fs.dump()));
    const json fdef = fault_to_json(RecipeFault{});
    for (std::size_t i = 0; i < fs.size(); ++i) {
      const std::string path = fmt::format("faults.{}", i);
      const json& f = fs[i];
      check_keys(f, fdef, origin, path);
      RecipeFault rf;
      hw::FaultSpec& s = rf.spec;
      const std::string site = get_string(f, "site", "link", origin, path);
      s.site = parse_field(origin, path + ".site", [&] { return hw::parse_fault_site(site, "site"); });
      const std::string model = get_string(f, "model", "bit_flip", origin, path);
      s.model = parse_field(origin, path + ".model", [&] { return hw::parse_fault_model(model, "model"); });
      s.link = get_int<int>(f, "link", -1, -1, 1 << 21, origin, path);
      s.cube = get_int<int>(f, "cube", -1, -1, 1 << 16, origin, path);
      s.pe = get_int<int>(f, "pe", -1, -1, 1 << 16, origin, path);
      s.address = get_int<std::uint64_t>(f, "address", 0, 0, 1e18L, origin, path);
      s.bytes = get_int<std::uint64_t>(f, "bytes", 0, 0, 1e18L, origin, path);
      if (f.contains("at_us")) {
        if (!f["at_us"].is_number() || !std::isfinite(f["at_us"].get<double>()) || f["at_us"].get<double>() > 1e12)
          bad(origin, path + ".at_us", fmt::format("expected microseconds from the run's start (a number <= 1e12; < 0: none), got {}", f["at_us"].dump()));
        rf.at_us = f["at_us"].get<double>();
      }
      s.nth = get_int<std::uint64_t>(f, "nth", 1, 1, 1e18L, origin, path);
      s.bits = get_int<int>(f, "bits", 2, 2, 32, origin, path);
      s.words = get_int<int>(f, "words", 2, 2, 1 << 20, origin, path);
      s.word_bytes = get_int<int>(f, "word_bytes", static_cast<int>(dtype_size(r.dtype)), 2, 4, origin, path);
      s.stuck_value = get_int<int>(f, "stuck_value", 0, 0, 1, origin, path);
      s.seed = get_int<std::uint64_t>(f, "seed", 0, 0, 18446744073709551615.0L, origin, path);
      parse_field(origin, path, [&] { hw::check_fault_model(s, "fault"); return 0; });
      rf.tensor = get_string(f, "tensor", "", origin, path);
      if (!rf.tensor.empty()) {
        const auto& names = tensor_names(r.mode);
        if (std::find(names.begin(), names.end(), rf.tensor) == names.end())
          bad(origin, path + ".tensor", fmt::format("'{}' is not a tensor of the {} model (valid: {})", rf.tensor,
                                                    mode_name(r.mode), list_names(names)));
        if (s.site != hw::FaultSite::hbm)
          bad(origin, path + ".tensor", "only an hbm fault (at rest) aims at a tensor; give site \"hbm\"");
      }
      rf.layer = get_int<int>(f, "layer", 0, 0, r.layers - 1, origin, path);
      rf.rank = get_int<int>(f, "rank", 0, 0, rt::kMaxRanks, origin, path);
      if ((s.site == hw::FaultSite::hbm || s.site == hw::FaultSite::tcm) && rf.at_us < 0)
        bad(origin, path + ".at_us", "a fault at rest strikes at a time: give at_us (microseconds from the run's start)");
      r.faults.push_back(rf);
    }
  }
  return r;
}

void apply_overrides(json& doc, const std::vector<std::string>& sets, std::string_view origin) {
  auto shape_of = [&] {
    // The shape every path must exist in: the defaults, with the document's own faults (so
    // faults.<i> exists for each fault the document has).
    json f = recipe_to_json(Recipe{});
    if (doc.contains("faults") && doc["faults"].is_array()) {
      for (std::size_t i = 0; i < doc["faults"].size(); ++i) f["faults"].push_back(fault_to_json(RecipeFault{}));
    }
    return f;
  };
  for (const std::string& s : sets) {
    const json full = shape_of();  // after the overrides before it (one may set "faults")
    const auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
      throw std::invalid_argument(fmt::format("{}: override '{}': expected path=value (e.g. layers=16, faults.0.nth=3)", origin, s));
    const std::string path = s.substr(0, eq), text = s.substr(eq + 1);
    json value;
    try {
      value = json::parse(text);
    } catch (const json::exception&) {
      value = text;
    }
    json* node = &doc;
    const json* shape = &full;
    std::string so_far;
    std::size_t start = 0;
    while (true) {
      const auto dot = path.find('.', start);
      const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      const bool last = dot == std::string::npos;
      so_far += (so_far.empty() ? "" : ".") + key;
      if (shape->is_array()) {
        std::size_t idx = 0;
        const bool numeric = !key.empty() && key.size() <= 9 && std::all_of(key.begin(), key.end(), ::isdigit);
        if (numeric) idx = std::stoul(key);
        if (!numeric || idx >= shape->size())
          throw std::invalid_argument(fmt::format("{}: override '{}': '{}' is not an entry of the list: it has {} "
                                                  "(valid indices: 0 to {}; add entries in the recipe file)",
                                                  origin, s, key, shape->size(), static_cast<long>(shape->size()) - 1));
        if (!node->is_array()) *node = json::array();
        while (node->size() <= idx) node->push_back(json::object());
        shape = &(*shape)[idx];
        node = &(*node)[idx];
      } else {
        if (!shape->is_object() || !shape->contains(key)) {
          std::vector<std::string> valid;
          if (shape->is_object())
            for (const auto& [k, v] : shape->items()) valid.push_back(k);
          throw std::invalid_argument(fmt::format("{}: override '{}': the recipe has no key '{}'{}", origin, s, so_far,
                                                  hw::did_you_mean(key, valid)));
        }
        if (!node->is_object()) *node = json::object();
        shape = &(*shape)[key];
        node = &(*node)[key];
      }
      if (last) break;
      start = dot + 1;
    }
    *node = value;
  }
}

Golden golden(const Recipe& r, int ranks, const hw::NcclSpec* nccl) {
  rt::ContextOptions o;
  o.world_size = ranks;
  o.algorithm = r.algorithm;
  if (nccl) o.nccl = *nccl;
  rt::Context host(o);
  Recipe clean = r;
  clean.faults.clear();
  const int p = check_ranks(host.world_size(), clean);
  std::vector<RankOut> out;
  run_model(host, clean, p, out, false, nullptr);
  Golden g;
  for (auto& o2 : out) {
    g.checks.push_back(o2.checks.at(0));
    g.tensors.push_back(o2.tensors.at(0));
  }
  return g;
}

namespace {
// Where a point comes in a layer's program order: fsdp gathers and then computes; tp computes and
// then all-reduces (comm_input, the all-reduce's input y_r, is part of compute_output too).
int program_order(Mode m, Point p) {
  if (m == Mode::fsdp) return static_cast<int>(p);
  switch (p) {
    case Point::compute_input: return 0;
    case Point::compute_output: return 1;
    case Point::comm_input: return 2;
    case Point::comm_output: return 3;
  }
  return 3;
}
}  // namespace

void judge(Result& res, const Golden& ref) {
  const int p = res.ranks;
  const Recipe& r = res.recipe;
  res.divergences.clear();
  // The rank-fill check: chunk j must be rank j's pattern, exactly.
  // (Its errors were found when the result was made; here they become divergences.)
  for (const auto& [rank, chunk] : res.rank_fill_bad)
    res.divergences.push_back({-1, rank, Point::comm_output, chunk, -1, false, false, false});  // seen by the pattern, not a checksum
  std::vector<Point> order(std::begin(kPoints), std::end(kPoints));
  std::sort(order.begin(), order.end(), [&](Point a, Point b) { return program_order(r.mode, a) < program_order(r.mode, b); });
  for (int l = 0; l < r.layers; ++l) {
    for (Point pt : order) {
      if (pt == Point::comm_output) {
        // tp: the reduction steps first, step by step (what arrived, then the step's result).
        std::size_t steps = 0;
        for (int rank = 0; rank < p; ++rank) {
          const Checks& got = res.checks[static_cast<std::size_t>(l)][static_cast<std::size_t>(rank)];
          steps = std::max(steps, got.step_word.size());
        }
        for (std::size_t k = 0; k < steps; ++k)
          for (int rank = 0; rank < p; ++rank) {
            const Checks& got = res.checks[static_cast<std::size_t>(l)][static_cast<std::size_t>(rank)];
            const Checks& want = ref.checks[static_cast<std::size_t>(rank)];
            // Only where both ran the algorithm's steps (a backend that ran NCCL reports none).
            if (got.step_word.size() != want.step_word.size() || k >= got.step_word.size()) continue;
            const bool w = got.step_word[k] != want.step_word[k], m = got.step_mix[k] != want.step_mix[k];
            if (w || m) res.divergences.push_back({l, rank, pt, -1, static_cast<int>(k / 2), k % 2 == 1, w, m});
          }
      }
      for (int rank = 0; rank < p; ++rank) {
        const Checks& got = res.checks[static_cast<std::size_t>(l)][static_cast<std::size_t>(rank)];
        const Checks& want = ref.checks[static_cast<std::size_t>(rank)];
        if (pt == Point::comm_output) {
          for (int j = 0; j < p; ++j) {
            const bool w = got.chunk_word[static_cast<std::size_t>(j)] != want.chunk_word[static_cast<std::size_t>(j)];
            const bool m = got.chunk_mix[static_cast<std::size_t>(j)] != want.chunk_mix[static_cast<std::size_t>(j)];
            if (w || m) res.divergences.push_back({l, rank, pt, j, -1, false, w, m});
          }
        } else {
          const bool w = !same(got, want, pt, true), m = !same(got, want, pt, false);
          if (w || m) res.divergences.push_back({l, rank, pt, -1, -1, false, w, m});
        }
      }
    }
  }
  Verdict& v = res.verdict;
  v = Verdict{};
  if (res.divergences.empty()) {
    v.text = res.changed_tensors.empty() ? "clean: every checksum matches the replay"
                                         : "clean by the checksums, but a tensor changed after its checksum was taken";
    return;
  }
  // The first layer (or the rank-fill check) with a divergence, and within it the first point.
  const int layer = res.divergences.front().layer;
  Point first = res.divergences.front().point;
  for (const auto& d : res.divergences)
    if (d.layer == layer && program_order(r.mode, d.point) < program_order(r.mode, first)) first = d.point;
  v.layer = layer;
  if (first == Point::comm_output) {
    v.kind = Verdict::Kind::comm;
    // tp: the earliest reduction step that differs (divergences list them step by step): a chunk
    // that arrived corrupted there, or a step that corrupted its result.
    const auto step = std::find_if(res.divergences.begin(), res.divergences.end(),
                                   [&](const Divergence& d) { return d.layer == layer && d.step >= 0; });
    if (step != res.divergences.end()) {
      v.rank = step->rank;
    } else {
      // The chunk's first divergent rank along the ring's forwarding order from its owner: where the
      // corruption entered (the ranks after it received it forwarded). The direct algorithm sends each
      // chunk straight to every rank, so any divergent rank is an entry; the first in that order is taken.
      int best_rank = -1, best_dist = p + 1;
      for (const auto& d : res.divergences) {
        if (d.layer != layer || d.point != Point::comm_output) continue;
        const int dist = ((d.rank - d.chunk) % p + p) % p;
        // fsdp: the owner's own copy (a local copy of its shard, checked at comm_input) comes last;
        // tp: the owner's chunk is where the all-gather starts (it left the last reduction step
        // matching, so a difference there entered on the owner after it): first.
        const int eff = dist == 0 && r.mode == Mode::fsdp ? p : dist;
        if (eff < best_dist) best_dist = eff, best_rank = d.rank;
      }
      v.rank = best_rank;
    }
  } else {
    for (const auto& d : res.divergences)
      if (d.layer == layer && d.point == first) {
        v.rank = d.rank;
        break;
      }
    v.kind = first == Point::compute_output ? Verdict::Kind::compute : Verdict::Kind::memory;
  }
  const std::string where = layer < 0 ? "the rank-fill check" : fmt::format("layer {}", layer);
  switch (v.kind) {
    case Verdict::Kind::comm: v.text = fmt::format("corruption in comm at {} on rank {}", where, v.rank); break;
    case Verdict::Kind::compute: v.text = fmt::format("corruption in compute at {} on rank {}", where, v.rank); break;
    case Verdict::Kind::memory:
      v.text = fmt::format("corruption at rest at {} on rank {} ({} differs before the layer used it)", where, v.rank,
                           point_name(first));
      break;
    case Verdict::Kind::clean: break;
  }
  if (!res.non_finite.empty()) v.text += fmt::format("; non-finite values: {}", res.non_finite.front());
}

void validate(const Recipe& r, int world_size, const hw::Topology* topo) {
  const int p = check_ranks(world_size, r);
  if (r.faults.empty()) return;
  if (!topo) {
    // A backend without a simulated system replays them at the runtime's points.
    rt::FaultReplay replay;
    for (std::size_t i = 0; i < r.faults.size(); ++i) {
      hw::FaultSpec spec = r.faults[i].spec;
      if (r.faults[i].at_us >= 0) spec.at = static_cast<sim::Time>(std::llround(r.faults[i].at_us * 1e6));
      try {
        replay.add(spec, fmt::format("faults.{}", i), p);
      } catch (const hw::FaultError& e) {
        throw rt::RuntimeError(fmt::format("sdc: on a backend without a simulated system: {}", e.what()));
      }
    }
    return;
  }
  sim::Simulator s;
  hw::System sys(s, *topo);
  arm_untargeted(sys.faults(), r, p, 0);
}

Result run(rt::Context& ctx, const Recipe& r, const Golden* ref) {
  const int p = check_ranks(ctx.world_size(), r);
  auto* sim = dynamic_cast<rt::SimBackend*>(&ctx.backend());
  // Backends without a simulated system replay gemm_tile, reduce and link faults at the runtime's points.
  rt::FaultReplay* replay = sim ? nullptr : ctx.backend().fault_replay();
  if (!r.faults.empty() && (ctx.backend().timing_only() || (!sim && !replay)))
    throw rt::RuntimeError(fmt::format("sdc: the recipe has {} fault(s), which need values: the sim backend, or a "
                                       "backend that replays them (host, cuda) (this context: {}{}); remove the "
                                       "faults or run without timing_only",
                                       r.faults.size(), ctx.backend().name(),
                                       ctx.backend().timing_only() ? ", timing-only" : ""));
  Golden own;
  if (ctx.backend().timing_only()) ref = nullptr;  // no values to compare
  if (!ref && !ctx.backend().timing_only()) {
    own = golden(r, p, ctx.backend().topology() ? &ctx.backend().topology()->nccl : nullptr);
    ref = &own;
  }
  Result res;
  res.recipe = r;
  res.ranks = p;
  for (int rank = 0; rank < p; ++rank) res.cubes.push_back(ctx.backend().device_of(rank));
  hw::FaultInjector* inj = sim && !r.faults.empty() ? &sim->system().faults() : nullptr;
  if (sim) sim->system().faults().clear();
  if (replay) replay->clear();
  // Whatever happens (a refused fault, a failed rank), nothing of this run stays armed.
  struct Disarm {
    hw::FaultInjector* inj;
    rt::FaultReplay* replay;
    ~Disarm() {
      if (inj) inj->clear();
      if (replay) replay->clear();
    }
  } disarm{inj, replay};
  if (replay) {
    for (std::size_t i = 0; i < r.faults.size(); ++i) {
      const RecipeFault& f = r.faults[i];
      hw::FaultSpec spec = f.spec;
      if (f.at_us >= 0) spec.at = static_cast<sim::Time>(std::llround(f.at_us * 1e6));
      try {
        replay->add(spec, fmt::format("faults.{}", i), p);
      } catch (const hw::FaultError& e) {
        throw rt::RuntimeError(fmt::format("sdc: on the {} backend: {}", ctx.backend().name(), e.what()));
      }
    }
  }
  const sim::Time t0 = ctx.simulator().now();
  // Faults not aimed at a tensor are armed now; those aimed at one, when their rank has placed it.
  auto at_of = [&](const RecipeFault& f) -> std::optional<sim::Time> {
    if (f.at_us < 0) return std::nullopt;
    return t0 + static_cast<sim::Time>(std::llround(f.at_us * 1e6));
  };
  std::vector<std::ptrdiff_t> slot = inj ? arm_untargeted(*inj, r, p, t0) : std::vector<std::ptrdiff_t>{};
  Arm arm;
  if (inj) {
    arm = [&](int rank, const std::vector<std::vector<rt::Tensor>>& t) {
      for (std::size_t i = 0; i < r.faults.size(); ++i) {
        const RecipeFault& f = r.faults[i];
        if (f.tensor.empty() || f.rank != rank || f.layer >= static_cast<int>(t.size())) continue;
        const rt::Tensor& x = t[static_cast<std::size_t>(f.layer)][static_cast<std::size_t>(tensor_index(r.mode, f.tensor))];
        const auto& st = static_cast<const rt::SimStorage&>(x.storage());
        hw::FaultSpec s = f.spec;  // its region was checked against the tensor (check_aimed)
        s.cube = sim->device_of(rank);
        s.address = st.addr() + x.byte_offset() + f.spec.address;
        s.bytes = f.spec.bytes ? f.spec.bytes : x.nbytes() - f.spec.address;
        s.at = at_of(f);
        if (s.at && *s.at < ctx.simulator().now())
          throw rt::RuntimeError(fmt::format(
              "sdc: faults.{}.at_us = {}: the {} of layer {} on rank {} exists only from {} us on (when the rank "
              "placed it); give a later at_us",
              i, f.at_us, f.tensor, f.layer, rank, static_cast<double>(ctx.simulator().now() - t0) / 1e6));
        inj->add(s, fmt::format("faults.{}", i));
        slot[i] = static_cast<std::ptrdiff_t>(inj->specs().size()) - 1;
      }
    };
  }
  std::vector<RankOut> out;
  res.report = run_model(ctx, r, p, out, true, arm);
  // tp's all-reduce is checked against the replay's reduction order: a backend that ran it itself
  // (NCCL on cuda: no reduction steps reached the tap) reduces in an order of its own.
  if (r.mode == Mode::tp && p > 1 && !ctx.backend().timing_only() && out[0].checks.at(0).step_word.empty())
    throw rt::RuntimeError(fmt::format("sdc: tp mode checks the all-reduce against the replay's {} order step by step, "
                                       "but no reduction step reached it: the {} backend ran the collective itself "
                                       "(NCCL); give it collectives 'ring'",
                                       rt::algorithm_name(r.algorithm), ctx.backend().name()));
  res.checks.assign(static_cast<std::size_t>(r.layers), std::vector<Checks>(static_cast<std::size_t>(p)));
  for (int rank = 0; rank < p; ++rank) {
    auto& o = out[static_cast<std::size_t>(rank)];
    res.starts.push_back(o.starts);
    for (int l = 0; l < r.layers; ++l)
      res.checks[static_cast<std::size_t>(l)][static_cast<std::size_t>(rank)] = std::move(o.checks[static_cast<std::size_t>(l)]);
  }
  if (inj) {
    // At-rest faults strike by events of their own, which the simulator runs even after every rank has
    // finished: one that struck after the run changed nothing the run used.
    const sim::Time end = t0 + res.report.sim_time;
    std::vector<std::size_t> late;
    for (const auto& rec : inj->log()) {
      if (rec.time > end) late.push_back(rec.spec);
      else res.faults.push_back(rec);
    }
    const std::vector<std::size_t> pending = inj->pending();
    for (std::size_t i = 0; i < r.faults.size(); ++i) {
      const hw::FaultSpec& s = r.faults[i].spec;
      const bool armed = slot[i] >= 0;
      const auto k = static_cast<std::size_t>(std::max<std::ptrdiff_t>(slot[i], 0));
      res.fault_operations.push_back(armed ? inj->seen(k) : 0);
      const bool after = armed && std::find(late.begin(), late.end(), k) != late.end();
      if (armed && !after && std::find(pending.begin(), pending.end(), k) == pending.end()) continue;  // it fired
      const std::string when = r.faults[i].at_us >= 0 ? fmt::format("at {} us", r.faults[i].at_us) : fmt::format("nth {}", s.nth);
      res.faults_not_fired.push_back(fmt::format(
          "faults.{} ({}, {}): never fired{}; the run took {} (its matching operations: {})", i,
          hw::fault_site_name(s.site), when,
          !armed  ? " (its rank never placed the tensor)"
          : after ? " during the run (it struck after the last rank finished)"
                  : "",
          sim::format_time(ctx.simulator().now() - t0), res.fault_operations.back()));
    }
    // The faults' log names the injector's specs; give it the recipe's numbering.
    for (auto& rec : res.faults)
      for (std::size_t i = 0; i < slot.size(); ++i)
        if (slot[i] == static_cast<std::ptrdiff_t>(rec.spec)) {
          rec.spec = i;
          break;
        }
    inj->clear();
  }
  if (replay && !r.faults.empty()) {
    for (const auto& rec : replay->log()) {
      res.faults.push_back(rec.fault);
      res.fault_layers.push_back(rec.phase);
    }
    const std::vector<std::size_t> pending = replay->pending();
    for (std::size_t i = 0; i < r.faults.size(); ++i) {
      res.fault_operations.push_back(replay->seen(i));
      if (std::find(pending.begin(), pending.end(), i) == pending.end()) continue;
      const int cube = r.faults[i].spec.cube;
      res.faults_not_fired.push_back(fmt::format("faults.{} ({}, nth {}): never fired; {} had {} matching operations",
                                                 i, hw::fault_site_name(r.faults[i].spec.site), r.faults[i].spec.nth,
                                                 cube < 0 ? std::string("the ranks together") : fmt::format("rank {}", cube),
                                                 replay->seen(i)));
    }
    replay->clear();
  }
  if (!ref) {
    res.verdict.text = "no values (timing-only): nothing checked";
    return res;
  }
  // The rank-fill check, word by word.
  const std::size_t esz = dtype_size(r.dtype);
  const std::int64_t shard_n = r.ffn / p * r.hidden;
  if (r.rank_fill) {
    for (int rank = 0; rank < p; ++rank) {
      const auto& got = out[static_cast<std::size_t>(rank)].fill;
      for (int j = 0; j < p; ++j) {
        const auto want = fill_bytes(j, shard_n, r.dtype);
        const std::uint8_t* g = got.data() + static_cast<std::size_t>(j * shard_n) * esz;
        if (std::memcmp(g, want.data(), want.size()) == 0) continue;
        std::size_t i = 0;
        while (std::memcmp(g + i * esz, want.data() + i * esz, esz) == 0) ++i;
        res.rank_fill_bad.emplace_back(rank, j);
        res.rank_fill_errors.push_back(fmt::format("rank {}, chunk {}: word {} is {} (expected {})", rank, j, i,
                                                   hex_word(g + i * esz, esz), hex_word(want.data() + i * esz, esz)));
      }
    }
  }
  // Activation: which tensors differ from the reference at the end, and non-finite outputs.
  const auto& names = tensor_names(r.mode);
  for (int l = 0; l < r.layers; ++l)
    for (int rank = 0; rank < p; ++rank)
      for (std::size_t i = 0; i < names.size(); ++i) {
        const auto& got = out[static_cast<std::size_t>(rank)].tensors[static_cast<std::size_t>(l)][i];
        const auto& want = ref->tensors[static_cast<std::size_t>(rank)][i];
        if (got != want) res.changed_tensors.push_back(fmt::format("layer {} rank {} {}", l, rank, names[i]));
        if (names[i] == "output" && got != want) {
          std::int64_t nan = 0, inf = 0;
          for (std::size_t e = 0; e < got.size() / esz; ++e) {
            const float x = load_f32(got.data(), r.dtype, static_cast<std::int64_t>(e));
            nan += std::isnan(x), inf += std::isinf(x);
          }
          if (nan || inf)
            res.non_finite.push_back(fmt::format("layer {} rank {} output: {} NaN, {} Inf", l, rank, nan, inf));
        }
      }
  judge(res, *ref);
  return res;
}

std::vector<double> step_seconds(rt::Context& ctx, const Recipe& r, int steps, bool checksums) {
  if (steps < 1 || steps > 1000000)
    throw rt::RuntimeError(fmt::format("sdc: steps = {} (valid: 1 to 1000000)", steps));
  if (!r.faults.empty()) throw rt::RuntimeError("sdc: step_seconds times a fault-free model; remove the faults");
  const int p = check_ranks(ctx.world_size(), r);
  std::vector<RankOut> out;
  run_model(ctx, r, p, out, false, nullptr, steps, checksums, false);
  std::vector<double> secs;
  for (int s = 0; s < steps; ++s) {
    double worst = 0;  // the slowest rank's step
    for (const RankOut& o : out) {
      const auto i = static_cast<std::size_t>(s);
      const double m = ctx.backend().measures_time() ? ctx.backend().measured_seconds(o.regions[i]) : -1;
      worst = std::max(worst, m >= 0 ? m : static_cast<double>(o.step_starts[2 * i + 1] - o.step_starts[2 * i]) * 1e-12);
    }
    secs.push_back(worst);
  }
  return secs;
}

Truth truth_of(const Result& r, std::size_t fault) {
  const hw::FaultRecord& f = r.faults.at(fault);
  Truth t;
  t.kind = f.site == hw::FaultSite::link || f.site == hw::FaultSite::reduce ? Verdict::Kind::comm
           : f.site == hw::FaultSite::hbm || f.site == hw::FaultSite::tcm  ? Verdict::Kind::memory
                                                                           : Verdict::Kind::compute;
  // A replayed fault (no simulated time): its rank and layer as the backend stamped them.
  if (fault < r.fault_layers.size()) {
    t.rank = f.cube;
    t.layer = r.fault_layers[fault];
    return t;
  }
  const auto it = std::find(r.cubes.begin(), r.cubes.end(), f.cube);
  if (it == r.cubes.end()) return t;
  t.rank = static_cast<int>(it - r.cubes.begin());
  const auto& starts = r.starts[static_cast<std::size_t>(t.rank)];
  // starts[0]: the rank-fill check (layer -1); starts[l + 1]: layer l. A phase's last landing and the
  // next phase's start share an instant (the rank resumes when the bytes land): a fault at a start
  // belongs to the phase before it (every operation of a phase comes strictly after its start).
  for (std::size_t i = 1; i < starts.size(); ++i)
    if (starts[i] < f.time) t.layer = static_cast<int>(i) - 1;
  return t;
}

namespace {
// A fault as logged; a replayed one by its operation and layer (the backend keeps no simulated time).
std::string fault_text(const Result& r, std::size_t i) {
  const hw::FaultRecord& f = r.faults[i];
  if (i >= r.fault_layers.size()) return hw::describe(f);
  const int layer = r.fault_layers[i];
  return fmt::format("{} #{} ({}): {} changing {} bit{} in {} [{:#x}, {:#x})", f.unit, f.operation,
                     layer < 0 ? std::string("the rank-fill check") : fmt::format("layer {}", layer),
                     hw::fault_model_name(f.model), f.bits_changed, f.bits_changed == 1 ? "" : "s", f.memory, f.address,
                     f.address + f.bytes);
}
}  // namespace

json result_to_json(const Result& r) {
  json layers = json::array();
  for (std::size_t l = 0; l < r.checks.size(); ++l) {
    json ranks = json::array();
    for (std::size_t rank = 0; rank < r.checks[l].size(); ++rank) {
      const Checks& c = r.checks[l][rank];
      json pts = json::object();
      for (Point p : kPoints) {
        const auto i = static_cast<std::size_t>(p);
        pts[std::string(point_name(p))] = {{"word", fmt::format("{:016x}", c.word[i])}, {"mix", fmt::format("{:016x}", c.mix[i])}};
      }
      json entry = {{"rank", rank}, {"checksums", pts}};
      if (!c.step_word.empty()) {
        json steps = json::array();
        for (std::size_t k = 0; k + 1 < c.step_word.size(); k += 2)
          steps.push_back({{"received", {{"word", fmt::format("{:016x}", c.step_word[k])}, {"mix", fmt::format("{:016x}", c.step_mix[k])}}},
                           {"reduced", {{"word", fmt::format("{:016x}", c.step_word[k + 1])}, {"mix", fmt::format("{:016x}", c.step_mix[k + 1])}}}});
        entry["reduction_steps"] = steps;
      }
      ranks.push_back(entry);
    }
    layers.push_back({{"layer", l}, {"ranks", ranks}});
  }
  json div = json::array();
  for (const auto& d : r.divergences)
    div.push_back({{"layer", d.layer}, {"rank", d.rank}, {"point", point_name(d.point)}, {"chunk", d.chunk},
                   {"step", d.step}, {"reduced", d.reduced}, {"word", d.word}, {"mix", d.mix}});
  json faults = json::array();
  for (std::size_t i = 0; i < r.faults.size(); ++i) {
    const hw::FaultRecord& f = r.faults[i];
    faults.push_back({{"spec", f.spec},
                      {"site", hw::fault_site_name(f.site)},
                      {"model", hw::fault_model_name(f.model)},
                      {"time_ps", f.time},
                      {"unit", f.unit},
                      {"memory", f.memory},
                      {"cube", f.cube},
                      {"address", f.address},
                      {"bytes", f.bytes},
                      {"bits_changed", f.bits_changed},
                      {"operation", f.operation},
                      {"text", fault_text(r, i)}});
  }
  return json{{"recipe", recipe_to_json(r.recipe)},
              {"ranks", r.ranks},
              {"sim_time_ps", r.report.sim_time},
              {"events", r.report.events},
              {"verdict",
               {{"kind", verdict_kind_name(r.verdict.kind)},
                {"layer", r.verdict.layer},
                {"rank", r.verdict.rank},
                {"text", r.verdict.text}}},
              {"divergences", div},
              {"rank_fill_errors", r.rank_fill_errors},
              {"changed_tensors", r.changed_tensors},
              {"non_finite", r.non_finite},
              {"faults", faults},
              {"faults_not_fired", r.faults_not_fired},
              {"layers", layers}};
}

}  // namespace cubesim::sdc
