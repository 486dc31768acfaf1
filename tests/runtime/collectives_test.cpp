// Collectives on the host backend: every collective x algorithm x dtype x group size on random
// data, against an f64 reference, with ranks bitwise identical where every rank holds the result,
// and, for ring and direct, bitwise against an independent replay of their documented order.
#include <gtest/gtest.h>

#include <cmath>

#include "collective_harness.h"
#include "runtime/comm.h"
#include "runtime/errors.h"

namespace cubesim::rt::testing {
namespace {

double unit_roundoff(DType d) { return d == DType::f32 ? std::ldexp(1.0, -24) : d == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

double rel_norm(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double e = static_cast<double>(got[i]) - ref[i];
    num += e * e;
    den += ref[i] * ref[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// The documented orders, replayed independently (ring.h, direct.h).
std::vector<float> replay_sum(const std::vector<std::vector<float>>& x, DType d, Algorithm a) {
  const int p = static_cast<int>(x.size());
  const std::int64_t n = static_cast<std::int64_t>(x[0].size());
  std::vector<float> out(static_cast<std::size_t>(n));
  for (int c = 0; c < p; ++c) {
    const Range r = chunk_range(n, p, c);
    for (std::int64_t i = r.begin; i < r.begin + r.count; ++i) {
      float acc;
      if (a == Algorithm::ring) {  // ((x[c+1] + x[c+2]) + ...) + x[c]
        acc = x[static_cast<std::size_t>((c + 1) % p)][i];
        for (int k = 2; k <= p; ++k) acc = round_to(d, acc + x[static_cast<std::size_t>((c + k) % p)][i]);
      } else {  // x0 + x1 + ... in member order
        acc = x[0][i];
        for (int k = 1; k < p; ++k) acc = round_to(d, acc + x[static_cast<std::size_t>(k)][i]);
      }
      out[static_cast<std::size_t>(i)] = acc;
    }
  }
  return out;
}

class Collectives : public ::testing::TestWithParam<CollCase> {};

TEST_P(Collectives, MatchReferenceOnHost) {
  const CollCase c = GetParam();
  const CollResult r = run_collective(host_context, c);
  const int p = c.ranks;
  const std::size_t in_n = r.inputs[0].size();
  for (int k = 0; k < p; ++k) {
    for (float v : r.out[static_cast<std::size_t>(k)]) ASSERT_FALSE(std::isnan(v)) << "unwritten output on rank " << k;
  }
  if (c.coll == "broadcast") {
    for (int k = 0; k < p; ++k) EXPECT_EQ(r.out[static_cast<std::size_t>(k)], r.inputs[static_cast<std::size_t>(c.root)]);
    return;
  }
  if (c.coll == "all_gather") {
    std::vector<float> cat;
    for (const auto& v : r.inputs) cat.insert(cat.end(), v.begin(), v.end());
    for (int k = 0; k < p; ++k) EXPECT_EQ(r.out[static_cast<std::size_t>(k)], cat) << "rank " << k;
    return;
  }
  // Reductions: f64 reference over the whole buffer.
  std::vector<double> ref(in_n);
  for (std::size_t i = 0; i < in_n; ++i) {
    double acc = c.op == ReduceOp::sum ? 0.0 : -INFINITY;
    for (const auto& v : r.inputs) acc = c.op == ReduceOp::sum ? acc + v[i] : std::max<double>(acc, v[i]);
    ref[i] = acc;
  }
  const double tol = c.acc_f32 ? 2 * unit_roundoff(c.dtype) : p * unit_roundoff(c.dtype) * 2;
  if (c.coll == "all_reduce") {
    for (int k = 1; k < p; ++k) {
      EXPECT_EQ(r.out_bytes[static_cast<std::size_t>(k)], r.out_bytes[0]) << "rank " << k << " differs from rank 0";
    }
    if (c.op == ReduceOp::max) {
      for (std::size_t i = 0; i < in_n; ++i) ASSERT_EQ(r.out[0][i], static_cast<float>(ref[i]));
    } else {
      EXPECT_LE(rel_norm(r.out[0], ref), tol);
    }
    if (c.op == ReduceOp::sum && !c.acc_f32 && (c.algo == Algorithm::ring || c.algo == Algorithm::direct)) {
      EXPECT_EQ(r.out[0], replay_sum(r.inputs, c.dtype, c.algo)) << "not the documented order";
    }
    // nccl on these sizes runs rings (nccl.h: ring's order whatever its channels and slices).
    if (c.op == ReduceOp::sum && !c.acc_f32 && c.algo == Algorithm::nccl) {
      EXPECT_EQ(r.out[0], replay_sum(r.inputs, c.dtype, Algorithm::ring)) << "not the documented order";
    }
  } else {  // reduce_scatter: rank k holds chunk k
    for (int k = 0; k < p; ++k) {
      const Range rg = chunk_range(static_cast<std::int64_t>(in_n), p, k);
      std::vector<double> part(ref.begin() + rg.begin, ref.begin() + rg.begin + rg.count);
      EXPECT_LE(rel_norm(r.out[static_cast<std::size_t>(k)], part), tol) << "rank " << k;
    }
    if (c.op == ReduceOp::sum && (c.algo == Algorithm::ring || c.algo == Algorithm::direct || c.algo == Algorithm::nccl)) {
      const auto full = replay_sum(r.inputs, c.dtype, c.algo == Algorithm::nccl ? Algorithm::ring : c.algo);
      for (int k = 0; k < p; ++k) {
        const Range rg = chunk_range(static_cast<std::int64_t>(in_n), p, k);
        EXPECT_EQ(r.out[static_cast<std::size_t>(k)], std::vector<float>(full.begin() + rg.begin, full.begin() + rg.begin + rg.count));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllCases, Collectives, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param.name(); });

TEST(CollectiveErrors, UnsupportedAlgorithmListsValidOnes) {
  auto ctx = host_context(2);
  try {
    ctx->spawn(2, [&](int r) {
      Tensor t = ctx->zeros(r, {8}, DType::f32);
      broadcast(t, 0, nullptr, {.algorithm = Algorithm::halving_doubling});
    });
    FAIL();
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find("broadcast: algorithm 'halving_doubling' is not available; valid: ring, direct, tree"),
              std::string::npos)
        << e.what();
  }
}

TEST(CollectiveErrors, HalvingDoublingReduceScatterNeedsPowerOfTwo) {
  auto ctx = host_context(3);
  try {
    ctx->spawn(3, [&](int r) {
      Tensor in = ctx->zeros(r, {9}, DType::f32), out = ctx->zeros(r, {3}, DType::f32);
      reduce_scatter(out, in, ReduceOp::sum, nullptr, {.algorithm = Algorithm::halving_doubling});
    });
    FAIL();
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find("reduce_scatter #0 on group 'world': halving_doubling reduce_scatter needs a "
                                         "power-of-two group (1, 2, 4, 8, ... ranks), not 3 ranks"),
              std::string::npos)
        << e.what();
  }
}

TEST(CollectiveErrors, MismatchedSizesNameBothRanks) {
  auto ctx = host_context(4);
  try {
    ctx->spawn(4, [&](int r) {
      Tensor t = ctx->zeros(r, {r == 2 ? 16 : 8}, DType::bf16);
      all_reduce(t);
    });
    FAIL();
  } catch (const RankError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("mismatched collectives"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 2 called all_reduce (sum, bf16[16], ring)"), std::string::npos) << m;
    EXPECT_NE(m.find("bf16[8]"), std::string::npos) << m;
    ASSERT_EQ(e.failures().size(), 1u);
    EXPECT_EQ(e.failures()[0].rank, 2);
  }
}

TEST(CollectiveErrors, SkippedCollectiveNamesWhoArrivedAndWhoDidNot) {
  auto ctx = host_context(4);
  try {
    ctx->spawn(4, [&](int r) {
      Tensor t = ctx->zeros(r, {64}, DType::f32);
      all_reduce(t);
      if (r != 1) all_reduce(t);  // rank 1 skips the second one
    });
    FAIL();
  } catch (const RankError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("deadlocked"), std::string::npos) << m;
    EXPECT_NE(m.find("all_reduce #1 on group 'world'"), std::string::npos) << m;
    EXPECT_NE(m.find("ranks 0, 2, 3 arrived; rank 1 did not"), std::string::npos) << m;
  }
}

TEST(CollectiveErrors, TensorOnAnotherRankIsRejected) {
  auto ctx = host_context(2);
  try {
    ctx->spawn(2, [&](int r) {
      Tensor t = ctx->zeros(1 - r, {8}, DType::f32);
      all_reduce(t);
    });
    FAIL();
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find("lives on rank"), std::string::npos) << e.what();
  }
}

TEST(CollectiveErrors, ARankExceptionStopsSiblingsAndNamesTheRank) {
  auto ctx = host_context(4);
  int finished = 0;
  try {
    ctx->spawn(4, [&](int r) {
      Tensor t = ctx->zeros(r, {8}, DType::f32);
      if (r == 3) throw std::runtime_error("bad batch on rank 3");
      all_reduce(t);
      ++finished;
    });
    FAIL();
  } catch (const RankError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3: bad batch on rank 3"), std::string::npos) << e.what();
    EXPECT_EQ(e.failures().at(0).rank, 3);
  }
  EXPECT_EQ(finished, 0);
}

// After a run in which ranks stopped at different collectives, the next spawn starts every group's
// call count afresh (else its calls would pair with the failed run's).
TEST(CollectiveErrors, AContextRunsCollectivesAgainAfterAFailedRun) {
  auto ctx = host_context(3);
  EXPECT_THROW(ctx->spawn(3, [&](int r) {
    Tensor t = ctx->zeros(r, {4}, DType::f32);
    if (r == 2) throw std::runtime_error("rank 2 stops early");
    all_reduce(t);
    all_reduce(t);
  }),
               RankError);
  std::vector<float> got;
  ctx->spawn(3, [&](int r) {
    Tensor t = ctx->from_host_f32(r, {4}, DType::f32, std::vector<float>(4, 1.0f + r));
    all_reduce(t);
    if (r == 0) got = t.to_host_f32();
  });
  EXPECT_EQ(got, std::vector<float>(4, 6.0f));
}

TEST(CollectiveErrors, PointToPointSizeMismatchNamesBothRanksAndTheMessage) {
  for (bool recv_first : {false, true}) {
    auto ctx = host_context(2);
    const std::string m = error_of([&] {
      ctx->spawn(2, [&](int r) {
        Tensor t = ctx->zeros(r, {r == 0 ? 4 : 2}, DType::f32);
        // The side that comes second arrives a nanosecond later.
        if (r == 0) {
          if (recv_first) sim::this_process::sleep(sim::ns(1));
          send(t, 1, 5);
        } else {
          if (!recv_first) sim::this_process::sleep(sim::ns(1));
          recv(t, 0, 5);
        }
      });
    });
    // Whichever side comes second finds the mismatch; the message says who sent what to whom.
    EXPECT_NE(m.find("send/recv on group 'world' (tag 5, message #0 from rank 0 to rank 1)"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0 sends 16 bytes to rank 1, which expects 8"), std::string::npos) << m;
  }
}

TEST(CollectiveErrors, AnUnmatchedMessageIsNamedInTheDeadlockReport) {
  auto ctx = host_context(2);
  std::string m = error_of([&] {
    ctx->spawn(2, [&](int r) {
      Tensor t = ctx->zeros(r, {4}, DType::f32);
      if (r == 0) send(t, 1, 3);  // rank 1 never receives
    });
  });
  EXPECT_NE(m.find("deadlocked"), std::string::npos) << m;
  EXPECT_NE(m.find("a message from rank 0 to rank 1 in send/recv on group 'world' (tag 3, message #0"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("sent, but the receiver has not posted its receive"), std::string::npos) << m;
  m = error_of([&] {
    ctx->spawn(2, [&](int r) {
      Tensor t = ctx->zeros(r, {4}, DType::f32);
      if (r == 1) recv(t, 0, 3);  // rank 0 never sends
    });
  });
  EXPECT_NE(m.find("the receive is posted, but nothing was sent"), std::string::npos) << m;
}

// Nothing that lives per message outlives it: a ring all-reduce over p ranks sends 2p(p-1)
// messages, but only a few per rank are ever filed at once, and none after the run.
TEST(Collectives, MessagesInFlightStayFewPerRank) {
  const int p = 32;
  auto ctx = host_context(p);
  ctx->spawn(p, [&](int r) {
    Tensor t = ctx->zeros(r, {p * 8}, DType::f32);
    all_reduce(t);
    all_reduce(t);
  });
  EXPECT_EQ(ctx->messages_in_flight(), 0u);
  EXPECT_LE(ctx->mailboxes_made(), static_cast<std::size_t>(3 * p)) << "made " << ctx->mailboxes_made();
}

TEST(Collectives, AsyncSubgroupsAndPointToPoint) {
  auto ctx = host_context(4);
  std::vector<std::vector<float>> got(4);
  ctx->spawn(4, [&](int r) {
    ProcessGroup& pair = ctx->new_group({r / 2 * 2, r / 2 * 2 + 1});
    Tensor t = ctx->from_host_f32(r, {5}, DType::f32, std::vector<float>(5, static_cast<float>(r + 1)));
    Work w = all_reduce(t, ReduceOp::sum, &pair, {.async_op = true});
    w.wait();
    EXPECT_TRUE(w.is_completed());
    Tensor msg = ctx->zeros(r, {5}, DType::f32);
    if (r == 0) send(t, 3, 7);
    if (r == 3) recv(msg, 0, 7);
    barrier();
    got[static_cast<std::size_t>(r)] = r == 3 ? msg.to_host_f32() : t.to_host_f32();
  });
  EXPECT_EQ(got[0], std::vector<float>(5, 3.0f));  // 1 + 2
  EXPECT_EQ(got[2], std::vector<float>(5, 7.0f));  // 3 + 4
  EXPECT_EQ(got[3], std::vector<float>(5, 3.0f));  // rank 0's tensor after its pair's all_reduce
}

}  // namespace
}  // namespace cubesim::rt::testing
