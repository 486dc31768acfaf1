// Fault injection (sim/hw/fault.h): each site corrupts exactly the bytes its log names, at the
// moment the spec chose, the same bits every run; bad specs are refused naming the field.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "sim/hw/fault.h"
#include "sim/hw/system.h"
#include "test_util.h"

namespace cubesim::hw {
namespace {

using testing::random_bytes;

int bits_differing(const std::vector<std::byte>& a, const std::vector<std::byte>& b, std::uint64_t* first = nullptr) {
  int n = 0;
  bool seen = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const int d = std::popcount(static_cast<unsigned>(a[i] ^ b[i]));
    if (d && !seen && first) *first = i, seen = true;
    n += d;
  }
  return n;
}

// Moves `n` random messages of 64 KiB from cube 0 to cube 2 (over two links of ring4, one after the
// other); returns what landed and the source bytes.
struct Moved {
  std::vector<std::vector<std::byte>> sent, got;
  std::vector<FaultRecord> log;
  std::uint64_t event_hash = 0;
};
Moved move_messages(const std::vector<FaultSpec>& faults, int n = 3, std::uint64_t bytes = 65536) {
  sim::Simulator sim;
  System sys(sim, load_topology("ring4"));
  for (std::size_t i = 0; i < faults.size(); ++i) sys.faults().add(faults[i], "faults[" + std::to_string(i) + "]");
  Moved m;
  sim.spawn("mover", [&] {
    for (int i = 0; i < n; ++i) {
      m.sent.push_back(random_bytes(bytes, 100 + i));
      sys.hbm(0).write(0, m.sent.back());
      sys.transfer(sys.hbm(0).at(0), sys.hbm(2).at(4096), bytes);
      m.got.emplace_back(bytes);
      sys.hbm(2).read(4096, m.got.back());
    }
  });
  sim.run();
  m.log = sys.faults().log();
  m.event_hash = sim.event_order_hash();
  return m;
}

int link_on_route(int from, int to, int hop) {
  sim::Simulator sim;
  System sys(sim, load_topology("ring4"));
  return sys.route(from, to).at(static_cast<std::size_t>(hop));
}

TEST(Fault, ALinkFaultCorruptsTheNthTransferAcrossIt) {
  const int link = link_on_route(0, 2, 1);
  FaultSpec f{.site = FaultSite::link, .link = link, .nth = 2, .seed = 11};
  const Moved m = move_messages({f});
  ASSERT_EQ(m.log.size(), 1u);
  const FaultRecord& r = m.log[0];
  EXPECT_EQ(r.operation, 2u);
  EXPECT_EQ(r.memory, "cube2.hbm");
  EXPECT_EQ(r.bits_changed, 1u);
  EXPECT_NE(r.unit.find("link"), std::string::npos) << r.unit;
  EXPECT_EQ(m.got[0], m.sent[0]);
  EXPECT_EQ(m.got[2], m.sent[2]);
  std::uint64_t first = 0;
  EXPECT_EQ(bits_differing(m.got[1], m.sent[1], &first), 1);
  EXPECT_EQ(r.address, 4096 + r.offset);
  EXPECT_EQ(r.offset, first & ~std::uint64_t{1});  // the first byte changed is in the 2-byte word logged
  // Same spec, same bits; another seed, another place.
  const Moved again = move_messages({f});
  EXPECT_EQ(again.got[1], m.got[1]);
  f.seed = 12;
  const Moved other = move_messages({f});
  EXPECT_NE(other.got[1], m.got[1]);
}

TEST(Fault, ALinkOffTheRouteNeverFires) {
  const int off = link_on_route(2, 0, 0);  // the other direction
  const Moved m = move_messages({FaultSpec{.site = FaultSite::link, .link = off, .seed = 1}});
  EXPECT_TRUE(m.log.empty());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(m.got[i], m.sent[i]);
}

TEST(Fault, EveryModelChangesWhatItSays) {
  const int link = link_on_route(0, 2, 0);
  struct Case {
    FaultSpec spec;
    int bits_min, bits_max;
    std::uint64_t bytes;
  };
  const std::vector<Case> cases = {
      {{.site = FaultSite::link, .model = FaultModel::bit_flip, .link = link, .seed = 3}, 1, 1, 2},
      {{.site = FaultSite::link, .model = FaultModel::multi_bit, .link = link, .bits = 5, .seed = 3}, 5, 5, 2},
      {{.site = FaultSite::link, .model = FaultModel::multi_bit, .link = link, .bits = 9, .word_bytes = 4, .seed = 4},
       9, 9, 4},
      {{.site = FaultSite::link, .model = FaultModel::word_burst, .link = link, .words = 7, .seed = 5}, 7, 7, 14},
      {{.site = FaultSite::link, .model = FaultModel::stuck_at, .link = link, .stuck_value = 1, .seed = 6}, 1, 16, 2},
      {{.site = FaultSite::link, .model = FaultModel::stuck_at, .link = link, .word_bytes = 4, .stuck_value = 0,
        .seed = 7},
       1, 32, 4},
  };
  for (const Case& c : cases) {
    const Moved m = move_messages({c.spec}, 1);
    ASSERT_EQ(m.log.size(), 1u) << fault_model_name(c.spec.model);
    const FaultRecord& r = m.log[0];
    EXPECT_EQ(r.bytes, c.bytes) << fault_model_name(c.spec.model);
    EXPECT_GE(static_cast<int>(r.bits_changed), c.bits_min) << fault_model_name(c.spec.model);
    EXPECT_LE(static_cast<int>(r.bits_changed), c.bits_max) << fault_model_name(c.spec.model);
    std::uint64_t first = 0;
    EXPECT_EQ(bits_differing(m.got[0], m.sent[0], &first), static_cast<int>(r.bits_changed));
    EXPECT_GE(first, r.offset);
    EXPECT_LT(first, r.offset + r.bytes);
    if (c.spec.model == FaultModel::stuck_at) {
      for (std::uint64_t b = 0; b < r.bytes; ++b)
        EXPECT_EQ(m.got[0][r.offset + b], std::byte{c.spec.stuck_value ? std::uint8_t{0xff} : std::uint8_t{0}});
    }
    if (c.spec.model == FaultModel::multi_bit) {  // adjacent bits of one word
      std::uint64_t word = 0, want = 0;
      for (std::uint64_t b = 0; b < r.bytes; ++b) {
        word |= static_cast<std::uint64_t>(m.got[0][r.offset + b]) << (8 * b);
        want |= static_cast<std::uint64_t>(m.sent[0][r.offset + b]) << (8 * b);
      }
      const std::uint64_t diff = word ^ want;
      EXPECT_EQ(std::popcount(diff), c.spec.bits);
      EXPECT_EQ(std::popcount(diff >> std::countr_zero(diff)), std::countr_one(diff >> std::countr_zero(diff)));
    }
  }
}

// DMA channels are on the paths into and out of a PE's TCM (operands in, tiles out).
TEST(Fault, ADmaFaultHitsTransfersThroughThatPesChannels) {
  for (int pe : {1, 0}) {
    sim::Simulator sim;
    System sys(sim, load_topology("ring4"));
    sys.faults().add(FaultSpec{.site = FaultSite::dma, .cube = 0, .pe = 1, .nth = 3, .seed = 2});
    std::vector<std::vector<std::byte>> sent, got;
    sim.spawn("p", [&] {
      for (int i = 0; i < 3; ++i) {
        sent.push_back(random_bytes(8192, 50 + i));
        sys.hbm(0).write(0, sent.back());
        sys.transfer(sys.hbm(0).at(0), sys.tcm(0, pe).at(0), 8192);
        got.emplace_back(8192);
        sys.tcm(0, pe).read(0, got.back());
      }
    });
    sim.run();
    if (pe == 0) {
      EXPECT_TRUE(sys.faults().log().empty());
      continue;
    }
    ASSERT_EQ(sys.faults().log().size(), 1u);
    EXPECT_EQ(sys.faults().log()[0].operation, 3u);
    EXPECT_EQ(sys.faults().log()[0].unit, "cube0.pe1.dma.read") << sys.faults().log()[0].unit;
    EXPECT_EQ(got[1], sent[1]);
    EXPECT_EQ(bits_differing(got[2], sent[2]), 1);
  }
}

TEST(Fault, MemoryAtRestChangesAtItsTime) {
  sim::Simulator sim;
  System sys(sim, load_topology("ring4"));
  const auto data = random_bytes(1024, 9);
  sys.faults().add(FaultSpec{.site = FaultSite::hbm, .model = FaultModel::word_burst, .cube = 1, .address = 512,
                             .bytes = 256, .at = sim::us(5), .words = 3, .seed = 4});
  std::vector<std::byte> before(1024), after(1024);
  sim.spawn("p", [&] {
    sys.hbm(1).write(0, data);
    sim::this_process::sleep(sim::us(5) - sim::ps(1));
    sys.hbm(1).read(0, before);
    sim::this_process::sleep(sim::ps(2));
    sys.hbm(1).read(0, after);
  });
  sim.run();
  EXPECT_EQ(before, data);
  ASSERT_EQ(sys.faults().log().size(), 1u);
  const FaultRecord& r = sys.faults().log()[0];
  EXPECT_EQ(r.time, sim::us(5));
  EXPECT_EQ(r.operation, 0u);
  EXPECT_EQ(bits_differing(after, data), 3);
  EXPECT_GE(r.address, 512u);
  EXPECT_LE(r.address + r.bytes, 768u);
  EXPECT_TRUE(sys.faults().pending().empty());
}

TEST(Fault, ATimeNobodyReachesStaysPending) {
  const int link = link_on_route(0, 2, 0);
  sim::Simulator sim;
  System sys(sim, load_topology("ring4"));
  sys.faults().add(FaultSpec{.site = FaultSite::link, .link = link, .at = sim::ms(1000), .seed = 1});
  sim.spawn("p", [&] {
    sys.hbm(0).write(0, random_bytes(256, 1));
    sys.transfer(sys.hbm(0).at(0), sys.hbm(2).at(0), 256);
  });
  sim.run();
  EXPECT_TRUE(sys.faults().log().empty());
  EXPECT_EQ(sys.faults().pending(), std::vector<std::size_t>{0});
}

void expect_refused(const FaultSpec& f, const std::string& needle, bool functional = true) {
  sim::Simulator sim;
  SystemOptions o;
  o.functional = functional;
  System sys(sim, load_topology("ring4"), o);
  try {
    sys.faults().add(f, "faults[0]");
    ADD_FAILURE() << "accepted: " << needle;
  } catch (const FaultError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Fault, BadSpecsAreRefusedNamingTheField) {
  expect_refused({.site = FaultSite::link, .link = 999}, "faults[0].link = 999: the topology 'ring4' has links 0..");
  expect_refused({.site = FaultSite::gemm_tile, .cube = 0, .pe = 200}, "faults[0].pe = 200: a cube of 'ring4' has PEs 0..");
  expect_refused({.site = FaultSite::hbm, .cube = 4, .bytes = 8, .at = 0}, "faults[0].cube = 4: the topology 'ring4' has cubes 0..3");
  expect_refused({.site = FaultSite::hbm, .cube = 0, .address = 0, .bytes = 0, .at = 0}, "is not inside cube0.hbm");
  expect_refused({.site = FaultSite::hbm, .cube = 0, .bytes = 8}, "faults[0].at: a fault at rest needs");
  expect_refused({.site = FaultSite::link, .model = FaultModel::multi_bit, .link = 0, .bits = 17},
                 "faults[0].bits = 17: a multi_bit fault flips 2 to 16");
  expect_refused({.site = FaultSite::link, .link = 0, .word_bytes = 3}, "faults[0].word_bytes = 3");
  expect_refused({.site = FaultSite::link, .link = 0, .nth = 0}, "faults[0].nth = 0");
  expect_refused({.site = FaultSite::link, .link = 0}, "timing-only", false);
  try {
    parse_fault_model("flip");
    ADD_FAILURE();
  } catch (const FaultError& e) {
    EXPECT_NE(std::string(e.what()).find("valid: bit_flip, multi_bit, stuck_at, word_burst"), std::string::npos);
  }
  EXPECT_THROW(parse_fault_site("pe"), FaultError);
  for (FaultSite s : kFaultSites) EXPECT_EQ(parse_fault_site(fault_site_name(s)), s);
  for (FaultModel m : kFaultModels) EXPECT_EQ(parse_fault_model(fault_model_name(m)), m);
}

TEST(Fault, AFaultThatNeverFiresChangesNoEventAndNoByte) {
  const Moved clean = move_messages({});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(clean.got[i], clean.sent[i]);
  EXPECT_TRUE(clean.log.empty());
  // Armed on a link off the route: the same events in the same order, the same bytes.
  const Moved armed = move_messages({FaultSpec{.site = FaultSite::link, .link = link_on_route(2, 0, 0), .seed = 1}});
  EXPECT_EQ(armed.event_hash, clean.event_hash);
  EXPECT_EQ(armed.got, clean.got);
  // Firing changes the bytes but not the timing: the same events.
  const Moved fired = move_messages({FaultSpec{.site = FaultSite::link, .link = link_on_route(0, 2, 0), .seed = 1}});
  ASSERT_EQ(fired.log.size(), 1u);
  EXPECT_EQ(fired.event_hash, clean.event_hash);
  EXPECT_NE(fired.got[0], clean.got[0]);
}

}  // namespace
}  // namespace cubesim::hw
