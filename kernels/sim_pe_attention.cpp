#include "kernels/sim_pe_attention.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <span>

#include <fmt/format.h>

#include "sim/core/event.h"
#include "sim/core/wait.h"
#include "sim/hw/cube.h"

namespace cubesim::kernels {

namespace {

struct Run {
  hw::System& sys;
  const AttentionShape& s;
  std::int64_t d, group;
  std::int64_t tq = 0, tk = 0;  // fit_tiles sets them
  std::uint64_t dma_bytes = 0, macs = 0;
};

std::uint64_t es(const HbmAttention& b) { return dtype_size(b.dtype); }

// Rows [t0, t0 + n) of head h (per_group heads to a query group) of sequence b, seq rows per sequence.
hw::Region rows_of(const HbmAttention& b, std::int64_t seq, std::int64_t bi, std::int64_t t0, std::int64_t n,
                   std::int64_t h, std::int64_t per_group, std::int64_t d) {
  const std::int64_t ho = attention_head_offset(b.group_stride, h, per_group, d);
  const std::uint64_t first = b.addr + static_cast<std::uint64_t>((bi * seq + t0) * b.row_stride + ho) * es(b);
  return hw::Region{first, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(d) * es(b),
                    static_cast<std::uint64_t>(b.row_stride) * es(b)};
}

// The statistics (2 f32 per token and head) of rows [t0, t0 + n) of head h.
hw::Region stats_of(const HbmAttention& st, const AttentionShape& s, std::int64_t bi, std::int64_t t0, std::int64_t n,
                    std::int64_t h) {
  return hw::Region{st.addr + static_cast<std::uint64_t>(((bi * s.seq_q + t0) * s.heads + h) * 8),
                    static_cast<std::uint64_t>(n), 8, static_cast<std::uint64_t>(s.heads * 8)};
}

hw::TransferHandle load(Run& R, hw::Pe& pe, const HbmAttention& src, const hw::Region& r, std::uint64_t tcm_addr) {
  R.dma_bytes += r.bytes();
  return R.sys.start_transfer(*src.memory, r, pe.tcm(), hw::Region{tcm_addr, r.rows, r.row_bytes, r.row_bytes});
}

// The output region's bytes (from the caller's host copy) into TCM, then the DMA to the memory.
hw::TransferHandle store(Run& R, hw::Pe& pe, std::uint64_t tcm_addr, const HbmAttention& o, const hw::Region& dst,
                         const HostBytes& values) {
  if (values.data) {
    for (std::uint64_t r = 0; r < dst.rows; ++r) {
      const std::uint64_t off = dst.row_addr(r) - values.addr;
      pe.tcm().write(tcm_addr + r * dst.row_bytes,
                     std::span<const std::byte>(reinterpret_cast<const std::byte*>(values.data + off), dst.row_bytes));
    }
  }
  R.dma_bytes += dst.bytes();
  return R.sys.start_transfer(pe.tcm(), hw::Region{tcm_addr, dst.rows, dst.row_bytes, dst.row_bytes}, *o.memory, dst);
}

// TCM buffers of one PE, released when the item loop ends.
struct Buffers {
  hw::Memory& tcm;
  std::vector<std::uint64_t> held;
  std::uint64_t get(std::uint64_t bytes, std::string_view what) {
    held.push_back(tcm.allocate(std::max<std::uint64_t>(bytes, 64), 64, what));
    return held.back();
  }
  ~Buffers() {
    for (auto it = held.rbegin(); it != held.rend(); ++it) tcm.free(*it);
  }
};

// Keys [0, n) that query rows [t0, t0 + nt) see together (causal: up to the last row's position).
std::int64_t keys_seen(const AttentionShape& s, std::int64_t t0, std::int64_t nt) {
  return s.causal ? std::min(s.seq_k, s.query_offset() + t0 + nt) : s.seq_k;
}

// The K and V blocks of one (sequence, query group) that query rows see (keys [0, nk)), streamed
// through two TCM slots: each block's loads are issued before the previous block computes.
struct KeyBlocks {
  Run& R;
  hw::Pe& pe;
  const HbmAttention &k, &v;
  std::uint64_t kb[2], vb[2];
  hw::TransferHandle kl[2] = {}, vl[2] = {};

  KeyBlocks(Run& r, hw::Pe& p, Buffers& buf, const HbmAttention& kk, const HbmAttention& vv)
      : R(r), pe(p), k(kk), v(vv) {
    for (int i = 0; i < 2; ++i) {
      kb[i] = buf.get(R.tk * R.d * es(k), "K block");
      vb[i] = buf.get(R.tk * R.d * es(v), "V block");
    }
  }
  // Calls work(keys in the block) for every block of keys [0, nk) of sequence bi, group g, in order,
  // once its K and V have landed; `ready` waits for the item's own loads after the first block's issue.
  template <class Ready, class Work>
  void walk(std::int64_t bi, std::int64_t g, std::int64_t nk, Ready ready, Work work) {
    const std::int64_t blocks = (nk + R.tk - 1) / R.tk;
    auto issue = [&](std::int64_t blk) {
      const std::int64_t j0 = blk * R.tk, kt = std::min(R.tk, nk - j0);
      kl[blk % 2] = load(R, pe, k, rows_of(k, R.s.seq_k, bi, j0, kt, g, 1, R.d), kb[blk % 2]);
      vl[blk % 2] = load(R, pe, v, rows_of(v, R.s.seq_k, bi, j0, kt, g, 1, R.d), vb[blk % 2]);
    };
    if (blocks > 0) issue(0);
    ready();
    for (std::int64_t blk = 0; blk < blocks; ++blk) {
      if (blk + 1 < blocks) issue(blk + 1);
      kl[blk % 2].wait();
      vl[blk % 2].wait();
      work(std::min(R.tk, nk - blk * R.tk));
    }
  }
};

void forward_items(Run& R, hw::Pe& pe, const std::vector<std::array<std::int64_t, 3>>& items, const HbmAttention& q,
                   const HbmAttention& k, const HbmAttention& v, const HbmAttention& out, const HbmAttention& st,
                   const AttentionValues& val) {
  const AttentionShape& s = R.s;
  const std::int64_t d = R.d;
  Buffers buf{pe.tcm(), {}};
  const std::uint64_t qb = buf.get(R.tq * d * es(q), "Q tile"), ob = buf.get(R.tq * d * es(out), "O tile"),
                      sb = buf.get(R.tq * 8, "softmax stats");
  KeyBlocks keys(R, pe, buf, k, v);
  hw::TransferHandle ow, sw;
  for (const auto& [bi, h, t0] : items) {
    const std::int64_t nt = std::min(R.tq, s.seq_q - t0), g = h / R.group, nk = keys_seen(s, t0, nt);
    hw::TransferHandle ql = load(R, pe, q, rows_of(q, s.seq_q, bi, t0, nt, h, R.group, d), qb);
    keys.walk(bi, g, nk, [&] { ql.wait(); }, [&](std::int64_t kt) {
      const auto m = static_cast<std::uint64_t>(nt * kt * d);
      pe.compute(m, q.dtype, "attention QK");
      pe.vector_op(5 * m / static_cast<std::uint64_t>(d), DType::f32, "softmax");
      pe.compute(m, v.dtype, "attention PV");
      R.macs += 2 * m;
    });
    pe.vector_op(static_cast<std::uint64_t>(nt * d), out.dtype, "normalize");
    ow.wait();
    sw.wait();
    ow = store(R, pe, ob, out, rows_of(out, s.seq_q, bi, t0, nt, h, R.group, d), val.out);
    sw = store(R, pe, sb, st, stats_of(st, s, bi, t0, nt, h), val.stats);
  }
  ow.wait();
  sw.wait();
}

// dQ: items (sequence, head, query tile) over the key blocks they see.
void dq_items(Run& R, hw::Pe& pe, const std::vector<std::array<std::int64_t, 3>>& items, const HbmAttention& q,
              const HbmAttention& k, const HbmAttention& v, const HbmAttention& dout, const HbmAttention& dq,
              const AttentionValues& val) {
  const AttentionShape& s = R.s;
  const std::int64_t d = R.d;
  Buffers buf{pe.tcm(), {}};
  const std::uint64_t qb = buf.get(R.tq * d * es(q), "Q tile"), db = buf.get(R.tq * d * es(dout), "dO tile"),
                      gb = buf.get(R.tq * d * es(dq), "dQ tile");
  KeyBlocks keys(R, pe, buf, k, v);
  hw::TransferHandle gw;
  for (const auto& [bi, h, t0] : items) {
    const std::int64_t nt = std::min(R.tq, s.seq_q - t0), g = h / R.group, nk = keys_seen(s, t0, nt);
    hw::TransferHandle ql = load(R, pe, q, rows_of(q, s.seq_q, bi, t0, nt, h, R.group, d), qb);
    hw::TransferHandle dl = load(R, pe, dout, rows_of(dout, s.seq_q, bi, t0, nt, h, R.group, d), db);
    auto ready = [&] {
      ql.wait();
      dl.wait();
      pe.vector_op(static_cast<std::uint64_t>(nt * d), DType::f32, "attention D");
    };
    keys.walk(bi, g, nk, ready, [&](std::int64_t kt) {
      const auto m = static_cast<std::uint64_t>(nt * kt * d);
      pe.compute(3 * m, q.dtype, "attention dQ");
      pe.vector_op(6 * m / static_cast<std::uint64_t>(d), DType::f32, "softmax backward");
      R.macs += 3 * m;
    });
    gw.wait();
    gw = store(R, pe, gb, dq, rows_of(dq, s.seq_q, bi, t0, nt, h, R.group, d), val.dq);
  }
  gw.wait();
}

// dK, dV: items (sequence, query group, key tile) over the group's heads and the query blocks that
// see the tile.
void dkv_items(Run& R, hw::Pe& pe, const std::vector<std::array<std::int64_t, 3>>& items, const HbmAttention& q,
               const HbmAttention& k, const HbmAttention& v, const HbmAttention& dout, const HbmAttention& dk,
               const HbmAttention& dv, const AttentionValues& val) {
  const AttentionShape& s = R.s;
  const std::int64_t d = R.d;
  Buffers buf{pe.tcm(), {}};
  const std::uint64_t kb = buf.get(R.tk * d * es(k), "K tile"), vb = buf.get(R.tk * d * es(v), "V tile"),
                      gk = buf.get(R.tk * d * es(dk), "dK tile"), gv = buf.get(R.tk * d * es(dv), "dV tile");
  const std::uint64_t qb[2] = {buf.get(R.tq * d * es(q), "Q block"), buf.get(R.tq * d * es(q), "Q block")};
  const std::uint64_t db[2] = {buf.get(R.tq * d * es(dout), "dO block"), buf.get(R.tq * d * es(dout), "dO block")};
  hw::TransferHandle kw, vw;
  for (const auto& [bi, g, j0] : items) {
    const std::int64_t nk = std::min(R.tk, s.seq_k - j0);
    kw.wait();
    vw.wait();
    hw::TransferHandle kl = load(R, pe, k, rows_of(k, s.seq_k, bi, j0, nk, g, 1, d), kb);
    hw::TransferHandle vl = load(R, pe, v, rows_of(v, s.seq_k, bi, j0, nk, g, 1, d), vb);
    // The query rows that see key j0 or later: position q_offset + t >= j0 when causal.
    const std::int64_t first = s.causal ? std::max<std::int64_t>(0, j0 - s.query_offset()) : 0;
    std::vector<std::pair<std::int64_t, std::int64_t>> steps;  // (head, t0)
    for (std::int64_t h = g * R.group; h < (g + 1) * R.group; ++h)
      for (std::int64_t t0 = first; t0 < s.seq_q; t0 += R.tq) steps.push_back({h, t0});
    hw::TransferHandle ql[2], dl[2];
    auto issue = [&](std::size_t i) {
      const auto [h, t0] = steps[i];
      const std::int64_t nt = std::min(R.tq, s.seq_q - t0);
      ql[i % 2] = load(R, pe, q, rows_of(q, s.seq_q, bi, t0, nt, h, R.group, d), qb[i % 2]);
      dl[i % 2] = load(R, pe, dout, rows_of(dout, s.seq_q, bi, t0, nt, h, R.group, d), db[i % 2]);
    };
    if (!steps.empty()) issue(0);
    kl.wait();
    vl.wait();
    for (std::size_t i = 0; i < steps.size(); ++i) {
      if (i + 1 < steps.size()) issue(i + 1);
      ql[i % 2].wait();
      dl[i % 2].wait();
      const auto m = static_cast<std::uint64_t>(nk * std::min(R.tq, s.seq_q - steps[i].second) * d);
      pe.compute(4 * m, q.dtype, "attention dK dV");
      pe.vector_op(8 * m / static_cast<std::uint64_t>(d), DType::f32, "softmax backward");
      R.macs += 4 * m;
    }
    kw = store(R, pe, gk, dk, rows_of(dk, s.seq_k, bi, j0, nk, g, 1, d), val.dk);
    vw = store(R, pe, gv, dv, rows_of(dv, s.seq_k, bi, j0, nk, g, 1, d), val.dv);
  }
  kw.wait();
  vw.wait();
}

std::vector<hw::Pe*> pes_of(hw::System& sys, const std::vector<int>& cubes, const HbmAttention& first) {
  std::vector<int> cs = cubes;
  if (cs.empty()) {
    if (first.memory == nullptr || first.memory->cube() < 0) {
      throw std::invalid_argument("sim_pe_attention: the output is not in a cube's memory; name the cubes to run on");
    }
    cs.push_back(first.memory->cube());
  }
  std::vector<hw::Pe*> pes;
  for (int c : cs)
    for (int p = 0; p < sys.cube(c).num_pes(); ++p) pes.push_back(&sys.pe(c, p));
  if (pes.empty()) throw std::invalid_argument("sim_pe_attention: the chosen cubes have no PEs");
  return pes;
}

// The PE's tile (m query rows, n keys), halved (keys first) until `need(tq, tk)` fits the TCM.
void fit_tiles(Run& R, hw::Pe& pe, const std::function<std::uint64_t(std::int64_t, std::int64_t)>& need) {
  R.tq = std::max<std::int64_t>(1, pe.spec().tile.m);
  R.tk = std::max<std::int64_t>(1, pe.spec().tile.n);
  const std::uint64_t cap = pe.tcm().capacity();
  while (need(R.tq, R.tk) > cap) {
    if (R.tk > 1 && R.tk >= R.tq) {
      R.tk /= 2;
    } else if (R.tq > 1) {
      R.tq /= 2;
    } else {
      throw std::invalid_argument(fmt::format("sim_pe_attention: head_dim {} needs {} bytes of TCM for one row, but {} "
                                              "has {}",
                                              R.d, need(1, 1), pe.name(), cap));
    }
  }
}

// Runs `body(pe, items)` on every PE with the items dealt round-robin, and waits for all.
template <class Body>
void deal(hw::System& sys, const std::vector<hw::Pe*>& pes, const std::vector<std::array<std::int64_t, 3>>& items,
          const std::string& label, Body body) {
  sim::Simulator& sim = sys.simulator();
  std::vector<std::unique_ptr<sim::Event>> done;
  for (std::size_t p = 0; p < pes.size() && p < items.size(); ++p) {
    std::vector<std::array<std::int64_t, 3>> mine;
    for (std::size_t i = p; i < items.size(); i += pes.size()) mine.push_back(items[i]);
    done.push_back(std::make_unique<sim::Event>(pes[p]->name() + " " + label + " done"));
    sim::Event* ev = done.back().get();
    hw::Pe* pe = pes[p];
    sim.spawn(fmt::format("{}/{}", pe->name(), label), [pe, mine = std::move(mine), ev, &body]() mutable {
      body(*pe, mine);
      ev->trigger();
    });
  }
  std::vector<sim::Event*> evs;
  for (auto& e : done) evs.push_back(e.get());
  sim::wait_all(evs);
}

}  // namespace

SimAttentionReport sim_pe_attention_forward(hw::System& sys, const AttentionShape& s, const HbmAttention& q,
                                            const HbmAttention& k, const HbmAttention& v, const HbmAttention& out,
                                            const HbmAttention& stats, const AttentionValues& values,
                                            const SimAttentionOptions& opts) {
  s.validate();
  const std::vector<hw::Pe*> pes = pes_of(sys, opts.cubes, out);
  Run R{.sys = sys, .s = s, .d = s.head_dim, .group = s.heads / s.kv_heads};
  const std::uint64_t d = static_cast<std::uint64_t>(s.head_dim);
  fit_tiles(R, *pes[0], [&](std::int64_t tq, std::int64_t tk) {
    return static_cast<std::uint64_t>(tq) * d * (es(q) + es(out)) + 2 * static_cast<std::uint64_t>(tk) * d * (es(k) + es(v)) +
           static_cast<std::uint64_t>(tq) * 8 + 7 * 64;
  });
  std::vector<std::array<std::int64_t, 3>> items;
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads; ++h)
      for (std::int64_t t0 = 0; t0 < s.seq_q; t0 += R.tq) items.push_back({b, h, t0});
  const sim::Time t0 = sys.simulator().now();
  deal(sys, pes, items, opts.label, [&](hw::Pe& pe, const std::vector<std::array<std::int64_t, 3>>& mine) {
    forward_items(R, pe, mine, q, k, v, out, stats, values);
  });
  return {.time = sys.simulator().now() - t0, .items = static_cast<std::int64_t>(items.size()),
          .pes = static_cast<int>(pes.size()), .tile_q = R.tq, .tile_k = R.tk, .macs = R.macs, .dma_bytes = R.dma_bytes};
}

SimAttentionReport sim_pe_attention_backward(hw::System& sys, const AttentionShape& s, const HbmAttention& q,
                                             const HbmAttention& k, const HbmAttention& v, const HbmAttention& dout,
                                             const HbmAttention& dq, const HbmAttention& dk, const HbmAttention& dv,
                                             const AttentionValues& values, const SimAttentionOptions& opts) {
  s.validate();
  const std::vector<hw::Pe*> pes = pes_of(sys, opts.cubes, dq);
  Run R{.sys = sys, .s = s, .d = s.head_dim, .group = s.heads / s.kv_heads};
  const std::uint64_t d = static_cast<std::uint64_t>(s.head_dim);
  fit_tiles(R, *pes[0], [&](std::int64_t tq, std::int64_t tk) {
    const std::uint64_t a = static_cast<std::uint64_t>(tq) * d * (es(q) + es(dout) + es(dq)) +
                            2 * static_cast<std::uint64_t>(tk) * d * (es(k) + es(v));
    const std::uint64_t b = static_cast<std::uint64_t>(tk) * d * (es(k) + es(v) + es(dk) + es(dv)) +
                            2 * static_cast<std::uint64_t>(tq) * d * (es(q) + es(dout));
    return std::max(a, b) + 8 * 64;
  });
  std::vector<std::array<std::int64_t, 3>> qitems, kitems;
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < s.heads; ++h)
      for (std::int64_t t0 = 0; t0 < s.seq_q; t0 += R.tq) qitems.push_back({b, h, t0});
    for (std::int64_t g = 0; g < s.kv_heads; ++g)
      for (std::int64_t j0 = 0; j0 < s.seq_k; j0 += R.tk) kitems.push_back({b, g, j0});
  }
  const sim::Time t0 = sys.simulator().now();
  deal(sys, pes, qitems, opts.label + " dQ", [&](hw::Pe& pe, const std::vector<std::array<std::int64_t, 3>>& mine) {
    dq_items(R, pe, mine, q, k, v, dout, dq, values);
  });
  deal(sys, pes, kitems, opts.label + " dK dV", [&](hw::Pe& pe, const std::vector<std::array<std::int64_t, 3>>& mine) {
    dkv_items(R, pe, mine, q, k, v, dout, dk, dv, values);
  });
  return {.time = sys.simulator().now() - t0, .items = static_cast<std::int64_t>(qitems.size() + kitems.size()),
          .pes = static_cast<int>(pes.size()), .tile_q = R.tq, .tile_k = R.tk, .macs = R.macs, .dma_bytes = R.dma_bytes};
}

}  // namespace cubesim::kernels
