// Attention on the simulated PEs (kernels/sim_pe_attention.h) through the attention contract's case
// table: operands in simulated HBM, outputs poisoned there first, the PEs' tiles (16 query rows, 32 keys,
// so every case crosses tiles) storing the values through TCM by DMA; a row a tile misses, or a store
// outside an output, shows as poison left or a gap written. Values are the host definition's (as
// SimBackend::attention computes them), so these cases test where the PEs put them.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <span>

#include "kernels/sim_pe_attention.h"
#include "sim/hw/topology.h"
#include "tests/kernels/attention_cases.h"

namespace cubesim::kernels::testing {
namespace {

// One host buffer's span in simulated HBM, and back.
struct InHbm {
  hw::Memory& hbm;
  void* host;
  std::size_t bytes;
  std::uint64_t addr = 0;
  InHbm(hw::Memory& m, const void* h, std::size_t n) : hbm(m), host(const_cast<void*>(h)), bytes(n) {
    addr = hbm.allocate(std::max<std::size_t>(n, 1), 256, "operand");
    hbm.write(addr, std::span<const std::byte>(static_cast<const std::byte*>(h), n));
  }
  HbmAttention as(AttentionBuffer b) const { return {&hbm, addr, b.dtype, b.row_stride, b.group_stride}; }
  void back() const { hbm.read(addr, std::span<std::byte>(static_cast<std::byte*>(host), bytes)); }
};

std::shared_ptr<const hw::Topology> small_tiles() {
  nlohmann::json doc = hw::load_topology_json("single_cube");
  doc["cube"]["pe"]["tile"] = nlohmann::json::parse(R"({"m": 16, "n": 32, "k": 16})");
  return std::make_shared<const hw::Topology>(hw::topology_from_json(doc, "single_cube with 16x32 tiles"));
}

AttentionBackend sim_pe_attention_backend() {
  auto topo = small_tiles();
  AttentionBackend be;
  be.name = "sim_pe";
  be.forward = [topo](const AttentionShape& s, AttentionBuffer q, AttentionBuffer k, AttentionBuffer v,
                      MutableAttentionBuffer o, float* stats, const std::int64_t* kv_valid) {
    const std::int64_t G = s.heads / s.kv_heads, tq = s.batch * s.seq_q, tk = s.batch * s.seq_k, d = s.head_dim;
    const std::size_t ob = attn_extent_bytes(o, tq, s.heads, G, d), sb = sizeof(float) * tq * s.heads * 2;
    // The values, on host copies of the outputs.
    std::vector<std::uint8_t> out_vals(static_cast<const std::uint8_t*>(o.data), static_cast<const std::uint8_t*>(o.data) + ob);
    std::vector<float> st_vals(static_cast<std::size_t>(tq * s.heads * 2));
    attention_forward(s, q, k, v, {out_vals.data(), o.dtype, o.row_stride, o.group_stride}, st_vals.data(), kv_valid);
    sim::Simulator sim;
    hw::System sys(sim, *topo, {.check_uninitialized = true});
    hw::Memory& hbm = sys.hbm(0);
    InHbm Q(hbm, q.data, attn_extent_bytes(q, tq, s.heads, G, d)), K(hbm, k.data, attn_extent_bytes(k, tk, s.kv_heads, 1, d)),
        V(hbm, v.data, attn_extent_bytes(v, tk, s.kv_heads, 1, d)), O(hbm, o.data, ob), S(hbm, stats, sb);
    AttentionValues vals;
    vals.out = {out_vals.data(), O.addr};
    vals.stats = {reinterpret_cast<const std::uint8_t*>(st_vals.data()), S.addr};
    sim.spawn("attention", [&] {
      sim_pe_attention_forward(sys, s, Q.as(q), K.as(k), V.as(v), O.as(o), {&hbm, S.addr, DType::f32, 2 * s.heads, 0}, vals);
    });
    sim.run();
    O.back();
    S.back();
  };
  be.backward = [topo](const AttentionShape& s, AttentionBuffer q, AttentionBuffer k, AttentionBuffer v, AttentionBuffer o,
                       const float* stats, AttentionBuffer dout, MutableAttentionBuffer dq, MutableAttentionBuffer dk,
                       MutableAttentionBuffer dv, const std::int64_t* kv_valid) {
    const std::int64_t G = s.heads / s.kv_heads, tq = s.batch * s.seq_q, tk = s.batch * s.seq_k, d = s.head_dim;
    const std::size_t qb = attn_extent_bytes(dq, tq, s.heads, G, d), kb = attn_extent_bytes(dk, tk, s.kv_heads, 1, d),
                      vb = attn_extent_bytes(dv, tk, s.kv_heads, 1, d);
    auto copy = [](const void* p, std::size_t n) {
      return std::vector<std::uint8_t>(static_cast<const std::uint8_t*>(p), static_cast<const std::uint8_t*>(p) + n);
    };
    std::vector<std::uint8_t> dq_vals = copy(dq.data, qb), dk_vals = copy(dk.data, kb), dv_vals = copy(dv.data, vb);
    attention_backward(s, q, k, v, o, stats, dout, {dq_vals.data(), dq.dtype, dq.row_stride, dq.group_stride},
                       {dk_vals.data(), dk.dtype, dk.row_stride, dk.group_stride},
                       {dv_vals.data(), dv.dtype, dv.row_stride, dv.group_stride}, kv_valid);
    sim::Simulator sim;
    hw::System sys(sim, *topo, {.check_uninitialized = true});
    hw::Memory& hbm = sys.hbm(0);
    InHbm Q(hbm, q.data, attn_extent_bytes(q, tq, s.heads, G, d)), K(hbm, k.data, attn_extent_bytes(k, tk, s.kv_heads, 1, d)),
        V(hbm, v.data, attn_extent_bytes(v, tk, s.kv_heads, 1, d)),
        DO(hbm, dout.data, attn_extent_bytes(dout, tq, s.heads, G, d)), DQ(hbm, dq.data, qb), DK(hbm, dk.data, kb),
        DV(hbm, dv.data, vb);
    AttentionValues vals;
    vals.dq = {dq_vals.data(), DQ.addr};
    vals.dk = {dk_vals.data(), DK.addr};
    vals.dv = {dv_vals.data(), DV.addr};
    sim.spawn("attention backward", [&] {
      sim_pe_attention_backward(sys, s, Q.as(q), K.as(k), V.as(v), DO.as(dout), DQ.as(dq), DK.as(dk), DV.as(dv), vals);
    });
    sim.run();
    DQ.back();
    DK.back();
    DV.back();
  };
  return be;
}

INSTANTIATE_ATTENTION_CONTRACT(Sim, ::testing::Values(sim_pe_attention_backend()));

}  // namespace
}  // namespace cubesim::kernels::testing
