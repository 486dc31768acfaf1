"""The runtime from Python: contexts, spawn with Python rank functions, collectives (checked bit for
bit against an independent replay of the documented order), run reports, traces, and errors that
arrive as Python exceptions with the C++ message."""
import json
import os
import threading

import numpy as np
import pytest

import cubesim as cs


def chunk_range(n, parts, i):
    """runtime/comm.h: the first n % parts chunks hold one element more."""
    base, extra = divmod(n, parts)
    begin = i * base + min(i, extra)
    return begin, base + (1 if i < extra else 0)


def ring_sum_replay(xs, dtype):
    """The ring all-reduce's documented order (runtime/algorithms/ring.h): chunk c is
    ((x[c+1] + x[c+2]) + ...) + x[c], rounded to dtype after every addition."""
    p, n = len(xs), xs[0].size
    out = np.empty(n, dtype=np.float32)
    for c in range(p):
        b, k = chunk_range(n, p, c)
        acc = xs[(c + 1) % p][b : b + k].astype(np.float32)
        for j in range(2, p + 1):
            acc = cs.round_to(dtype, (acc + xs[(c + j) % p][b : b + k]).astype(np.float32))
        out[b : b + k] = acc
    return out


def random_inputs(rng, p, n, dtype):
    return [cs.round_to(dtype, rng.uniform(-2, 2, n).astype(np.float32)) for _ in range(p)]


# ---- contexts -------------------------------------------------------------------------------------


def test_context_properties():
    ctx = cs.Context("sim", topology="ring4")
    assert ctx.backend == "sim" and ctx.world_size == 4 and not ctx.timing_only
    assert ctx.topology.name == "ring4"
    assert "ring4" in ctx.describe() and "ring4" in repr(ctx)
    h = cs.Context("host", world_size=3)
    assert h.backend == "host" and h.world_size == 3 and h.topology is None
    assert cs.Context("sim", topology="ring4", world_size=2).world_size == 2


def test_context_errors_name_the_input():
    with pytest.raises(ValueError, match="host context needs world_size >= 1"):
        cs.Context("host")
    with pytest.raises(ValueError, match="world_size 8 exceeds the 4 devices"):
        cs.Context("sim", topology="ring4", world_size=8)
    with pytest.raises(ValueError, match="tpu"):
        cs.Context("tpu", world_size=1)
    with pytest.raises(ValueError, match="hazards: 'sometimes' is not valid"):
        cs.Context("sim", hazards="sometimes")
    with pytest.raises(cs.TopologyError, match="nosuch"):
        cs.Context("sim", topology="nosuch")
    with pytest.raises(ValueError, match="ring"):
        cs.Context("host", world_size=2, algorithm="spiral")


def test_context_from_a_topology_object_runs_as_from_its_name(rng):
    xs = [rng.standard_normal(4096).astype(np.float32) for _ in range(4)]
    for overrides in (None, {"network.link.bandwidth_GBps": 32, "cubes.2.clock_scale": 0.5}):
        topo = cs.load_topology("ring4", overrides=overrides)
        by_name = cs.Context("sim", topology="ring4", overrides=overrides)
        by_object = cs.Context("sim", topology=topo)
        assert isinstance(by_object.topology, cs.Topology)
        assert by_object.topology.doc == by_name.topology.doc == topo.doc
        assert by_object.world_size == by_name.world_size == 4
        a = by_name.run_collective("all_reduce", xs, dtype="bf16", bits=True)
        b = by_object.run_collective("all_reduce", xs, dtype="bf16", bits=True)
        assert a.report.sim_time_ps == b.report.sim_time_ps > 0
        assert (a.report.events, a.report.event_hash) == (b.report.events, b.report.event_hash)
        for r in range(4):
            np.testing.assert_array_equal(a.outputs[r], b.outputs[r])
        kw = dict(tp=4, tokens=64, hidden=256, ffn=512)
        m = cs.tp.run_mlp(cs.Context("sim", topology="ring4", overrides=overrides, timing_only=True), **kw)
        n = cs.tp.run_mlp(cs.Context("sim", topology=topo, timing_only=True), **kw)
        assert m.sim_time_ps == n.sim_time_ps > 0 and m.event_hash == n.event_hash


def test_context_topology_object_takes_no_overrides():
    topo = cs.load_topology("ring4")
    with pytest.raises(ValueError, match=r"Topology object.*pass the overrides to load_topology"):
        cs.Context("sim", topology=topo, overrides={"network.link.bandwidth_GBps": 32})
    with pytest.raises(ValueError, match="load_topology"):
        cs.Context("sim", topology=topo, overrides={})
    with pytest.raises(TypeError, match="topology must be a name, a path or a Topology, not int"):
        cs.Context("sim", topology=4)


def test_context_override_errors_name_the_override_path():
    with pytest.raises(cs.TopologyError, match=r"override path 'network\.link\.bandwdith_GBps'.*did you mean"):
        cs.Context("sim", topology="ring4", overrides={"network.link.bandwdith_GBps": 32})
    with pytest.raises(cs.TopologyError, match=r"network\.link\.bandwidth_GBps: 0 is not valid"):
        cs.Context("sim", topology="ring4", overrides={"network.link.bandwidth_GBps": 0})


def test_cli_run_hands_its_loaded_topology_to_the_context(monkeypatch, capsys):
    from cubesim import cli

    loads, topologies = [], []
    real_load, real_context = cs.load_topology, cs.Context
    monkeypatch.setattr(cs, "load_topology", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    monkeypatch.setattr(cs, "Context", lambda *a, **k: topologies.append(k.get("topology")) or real_context(*a, **k))
    rc = cli.main(["run", "--topology", "ring4", "--tp", "2", "--timing-only", "--set", "network.link.bandwidth_GBps=16",
                   "--tokens", "8", "--hidden", "32", "--ffn", "64", "--no-hardware-stats"])
    capsys.readouterr()
    assert rc == 0 and len(loads) == 1
    assert len(topologies) == 1 and isinstance(topologies[0], cs.Topology)
    assert topologies[0].links[0]["bandwidth_GBps"] == 16


def test_cuda_backend_availability_is_reported():
    b = cs.backends()
    assert b["sim"] and b["host"]
    if not b["cuda"]:
        with pytest.raises(cs.BackendUnavailableError, match="cuda"):
            cs.Context("cuda", world_size=1)
        assert isinstance(cs.BackendUnavailableError("x"), RuntimeError)


# ---- spawn with Python rank functions --------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sim", "host"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_spawn_all_reduce_matches_the_ring_replay_bitwise(backend, dtype, rng):
    p, n = 4, 1031
    ctx = cs.Context("sim", topology="ring4", trace=True) if backend == "sim" else cs.Context("host", world_size=p)
    xs = random_inputs(rng, p, n, dtype)
    got = [None] * p

    def rank_fn(rank):
        assert cs.current_rank() == rank
        t = ctx.tensor(rank, xs[rank], dtype)
        cs.all_reduce(t, algorithm="ring")
        got[rank] = t.numpy(bits=True)

    rep = ctx.spawn(rank_fn)
    expect = cs.to_bits(ring_sum_replay(xs, dtype), dtype)
    for r in range(p):
        np.testing.assert_array_equal(got[r], expect, err_msg=f"rank {r}")
    assert [t.rank for t in rep.ranks] == list(range(p))
    if backend == "sim":
        assert rep.sim_time_ps > 0 and rep.events > 0
        assert all(t.comm_ps > 0 and t.finish_ps <= rep.sim_time_ps for t in rep.ranks)
        groups = {t.group for t in rep.tracks}
        assert "links" in groups and {"rank0", "cube0"} <= groups
        assert all(t.spans > 0 for t in rep.tracks)
    else:
        assert rep.sim_time_ps == 0


@pytest.mark.parametrize("name", ["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
def test_run_collective_sim_equals_host_for_every_algorithm(name, rng):
    p = 4
    xs = [rng.standard_normal((8, 13)).astype(np.float32) for _ in range(p)]
    sim = cs.Context("sim", topology="ring4")
    host = cs.Context("host", world_size=p)
    for alg in cs.supported_algorithms(name):
        a = sim.run_collective(name, xs, dtype="bf16", algorithm=alg, root=2, bits=True)
        b = host.run_collective(name, xs, dtype="bf16", algorithm=alg, root=2, bits=True)
        for r in range(p):
            np.testing.assert_array_equal(a.outputs[r], b.outputs[r], err_msg=f"{name} {alg} rank {r}")
        assert a.report.sim_time_ps > 0 and b.report.sim_time_ps == 0


def test_run_collective_shapes_and_values(rng):
    p = 4
    ctx = cs.Context("host", world_size=p)
    xs = [rng.standard_normal((8, 5)).astype(np.float32) for _ in range(p)]
    g = ctx.run_collective("all_gather", xs)
    assert g.outputs[0].shape == (32, 5)
    for r in range(p):
        np.testing.assert_array_equal(g.outputs[r], np.concatenate(xs))
    b = ctx.run_collective("broadcast", xs, root=3)
    for r in range(p):
        np.testing.assert_array_equal(b.outputs[r], xs[3])
    m = ctx.run_collective("all_reduce", xs, op="max")
    np.testing.assert_array_equal(m.outputs[1], np.max(np.stack(xs), axis=0))
    rs = ctx.run_collective("reduce_scatter", xs, dtype="f32")
    assert rs.outputs[0].shape == (2, 5)
    total = np.sum(np.stack(xs).astype(np.float64), axis=0)
    np.testing.assert_allclose(np.concatenate(rs.outputs), total, rtol=1e-5, atol=1e-5)
    # Fewer inputs than ranks: a group of the first ranks.
    two = ctx.run_collective("all_gather", xs[:2])
    assert len(two.outputs) == 2 and two.outputs[0].shape == (16, 5)


def test_run_collective_errors():
    ctx = cs.Context("host", world_size=2)
    x = np.arange(6, dtype=np.float32)
    with pytest.raises(ValueError, match="'gossip' is not a collective"):
        ctx.run_collective("gossip", [x, x])
    with pytest.raises(ValueError, match="3 inputs given; give one array per rank, 1 to 2"):
        ctx.run_collective("all_reduce", [x, x, x])
    with pytest.raises(ValueError, match="input 1 has shape \\(5\\) but input 0 has \\(6\\)"):
        ctx.run_collective("all_reduce", [x, x[:5]])
    with pytest.raises(ValueError, match="'avg' is not valid; use 'sum' or 'max'"):
        ctx.run_collective("all_reduce", [x, x], op="avg")
    with pytest.raises(ValueError, match="broadcast has no algorithm 'halving_doubling'; valid: ring, direct, tree"):
        ctx.run_collective("broadcast", [x, x], algorithm="halving_doubling")


def test_async_collective_groups_send_recv_and_ops(rng):
    ctx = cs.Context("sim", topology="ring4")
    a = rng.standard_normal((16, 24)).astype(np.float32)
    w = rng.standard_normal((8, 24)).astype(np.float32)
    out = {}

    def rank_fn(rank):
        pair = ctx.new_group([0, 1]) if rank < 2 else ctx.new_group([2, 3])
        assert pair.size == 2 and rank in pair and pair.index_of(rank) == rank % 2
        x = ctx.tensor(rank, a + rank, "f32")
        work = cs.all_reduce(x, group=pair, async_op=True)
        wt = ctx.tensor(rank, w, "f32")
        y = ctx.empty(rank, [16, 8], "f32")
        cs.matmul(ctx.tensor(rank, a, "f32"), wt.t(), y)  # y = a . w^T, while the all-reduce runs
        work.wait()
        assert work.is_completed()
        out[("sum", rank)] = x.numpy()
        out[("mm", rank)] = y.numpy()
        buf = ctx.zeros(rank, [5], "f32")
        if rank == 0:
            cs.send(ctx.tensor(0, np.arange(5, dtype=np.float32) * 3, "f32"), dst=3, tag=7)
        elif rank == 3:
            cs.recv(buf, src=0, tag=7)
            out["recv"] = buf.numpy()
        cs.barrier()

    ctx.spawn(rank_fn)
    np.testing.assert_array_equal(out[("sum", 0)], cs.round_to("f32", (a + 0) + (a + 1)))
    np.testing.assert_array_equal(out[("sum", 3)], cs.round_to("f32", (a + 2) + (a + 3)))
    ref = cs.det_gemm(a, w.T)
    for r in range(4):
        np.testing.assert_array_equal(out[("mm", r)], ref)
    np.testing.assert_array_equal(out["recv"], np.arange(5, dtype=np.float32) * 3)


def test_spawn_subset_and_world_group():
    ctx = cs.Context("host", world_size=4)
    seen = []
    rep = ctx.spawn(lambda r: seen.append(r), nprocs=2)
    assert sorted(seen) == [0, 1] and len(rep.ranks) == 2
    w = ctx.world()
    assert w.ranks == [0, 1, 2, 3] and w.size == 4 and w.default_algorithm is None
    w.default_algorithm = "tree"
    assert w.default_algorithm == "tree"
    with pytest.raises(ValueError, match="spawn: nprocs 5 is not valid"):
        ctx.spawn(lambda r: None, nprocs=5)


# ---- errors -----------------------------------------------------------------------------------------


def test_exception_in_a_rank_becomes_rank_error_with_cause():
    ctx = cs.Context("sim", topology="ring4")

    def rank_fn(rank):
        t = ctx.tensor(rank, np.arange(64, dtype=np.float32) * (rank + 1), "f32")
        if rank == 2:
            raise KeyError("rank two gave up")
        cs.all_reduce(t)  # the others block here until the run is torn down

    with pytest.raises(cs.RankError) as e:
        ctx.spawn(rank_fn)
    msg = str(e.value)
    assert "rank 2: KeyError: 'rank two gave up'" in msg and "test_runtime.py" in msg
    assert [r for r, _ in e.value.failures] == [2]
    assert isinstance(e.value.__cause__, KeyError)
    # The context is usable afterwards.
    rep = ctx.spawn(lambda r: None)
    assert len(rep.ranks) == 4


def test_catching_everything_in_a_rank_does_not_stop_the_teardown():
    ctx = cs.Context("host", world_size=2)
    caught = []

    def rank_fn(rank):
        if rank == 0:
            raise RuntimeError("boom")
        t = ctx.zeros(rank, [4], "f32")
        try:
            cs.all_reduce(t)
        except Exception as ex:  # the teardown is a BaseException: this does not swallow it
            caught.append(ex)

    with pytest.raises(cs.RankError, match="rank 0: RuntimeError: boom"):
        ctx.spawn(rank_fn)
    assert caught == []


def test_mismatched_collectives_name_both_calls():
    ctx = cs.Context("host", world_size=2)

    def rank_fn(rank):
        t = ctx.zeros(rank, [8 if rank == 0 else 6], "f32")
        cs.all_reduce(t)

    with pytest.raises(cs.RankError) as e:
        ctx.spawn(rank_fn)
    assert "all_reduce" in str(e.value) and "[8]" in str(e.value) and "[6]" in str(e.value)


def test_a_rank_that_skips_a_collective_is_a_deadlock_report():
    ctx = cs.Context("sim", topology="ring4", world_size=2)

    def rank_fn(rank):
        if rank == 0:
            cs.all_reduce(ctx.zeros(0, [4], "f32"))

    with pytest.raises(cs.RankError, match="(?s)deadlocked.*rank 0 arrived; rank 1 did not"):
        ctx.spawn(rank_fn)


def test_cpp_errors_inside_a_rank_keep_their_message():
    ctx = cs.Context("host", world_size=1)

    def rank_fn(rank):
        a = ctx.zeros(0, [4, 3], "f32")
        cs.matmul(a, a, ctx.empty(0, [4, 3], "f32"))

    with pytest.raises(cs.RankError, match=r"rank 0: ValueError: gemm: A \[4, 3\] times B \[4, 3\]"):
        ctx.spawn(rank_fn)


def test_collectives_outside_spawn_say_where_they_belong():
    ctx = cs.Context("host", world_size=1)
    t = ctx.zeros(0, [4], "f32")
    with pytest.raises(ValueError, match=r"inside Context\.spawn\(\)"):
        cs.all_reduce(t)


# ---- GIL, trace, determinism ------------------------------------------------------------------------


def test_the_gil_is_released_while_the_simulator_runs():
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(1)
            stop.wait(0.001)

    ctx = cs.Context("sim", topology="ring4")
    th = threading.Thread(target=ticker)
    th.start()
    try:
        before = len(ticks)
        cs.tp.run_mlp(ctx, tp=4, tokens=512, hidden=512, ffn=2048)  # C++ the whole time (a few tenths of a second)
        during = len(ticks) - before
    finally:
        stop.set()
        th.join()
    assert during > 3  # with the GIL held, the ticker could not have run at all


def test_python_ranks_interleave_and_run_deterministically(rng):
    xs = [rng.standard_normal(4096).astype(np.float32) for _ in range(4)]

    def once():
        ctx = cs.Context("sim", topology="ring4", trace=True)
        log = []

        def rank_fn(rank):
            t = ctx.tensor(rank, xs[rank], "bf16")
            for step in range(3):
                log.append((rank, step))
                cs.all_reduce(t, algorithm="ring" if step % 2 else "direct")
        rep = ctx.spawn(rank_fn)
        return log, rep.sim_time_ps, rep.events, [(t.group, t.name, t.spans, t.busy_ps) for t in rep.tracks]

    a, b = once(), once()
    assert a == b
    assert a[0][:4] == [(0, 0), (1, 0), (2, 0), (3, 0)]  # every rank reached step 0 before any finished


def test_simulations_in_several_python_threads_at_once(rng):
    xs = [rng.standard_normal(777).astype(np.float32) for _ in range(16)]

    def job(out, key):
        ctx = cs.Context("sim", topology="mesh4x4")
        got = {}

        def rank_fn(rank):
            t = ctx.tensor(rank, xs[rank], "bf16")
            cs.all_reduce(t, algorithm="tree")
            cs.all_reduce(t, algorithm="ring")
            got[rank] = t.numpy(bits=True)

        rep = ctx.spawn(rank_fn)
        out[key] = (rep.sim_time_ps, [got[r].tobytes() for r in range(16)])

    alone = {}
    job(alone, 0)
    out = {}
    threads = [threading.Thread(target=job, args=(out, k)) for k in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert out == {0: alone[0], 1: alone[0], 2: alone[0]}


def test_deep_python_code_in_a_rank_has_stack_room():
    ctx = cs.Context("host", world_size=2)

    def depth(n):
        return 0 if n == 0 else 1 + depth(n - 1)

    results = []
    ctx.spawn(lambda r: results.append(depth(400)))
    assert results == [400, 400]


def test_trace_file_has_a_track_per_pe_dma_link_and_hbm(tmp_path):
    ctx = cs.Context("sim", topology="ring4", trace=True)
    ctx.declare_hardware_tracks()
    cs.tp.run_mlp(ctx, tp=4, tokens=64, hidden=128, ffn=512)
    path = tmp_path / "t.json"
    ctx.save_trace(str(path))
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    groups = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    tracks = {(groups[e["pid"]], e["args"]["name"]) for e in events if e.get("name") == "thread_name"}
    pes = ctx.topology.cubes[0]["pes"]
    for c in range(4):
        assert (f"rank{c}", "compute") in tracks and (f"rank{c}", "comm") in tracks
        assert (f"cube{c}", "hbm.ch0") in tracks
        for i in range(pes):
            for unit in ("mac", "vector", "dma.read", "dma.write"):
                assert (f"cube{c}", f"pe{i}.{unit}") in tracks
    assert ("links", "link c0->c1") in tracks and ("links", "link c1->c0") in tracks
    spans = [e for e in events if e.get("ph") == "X"]
    busy = {(groups[e["pid"]], e["tid"]) for e in spans}
    tid_name = {(groups[e["pid"]], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    active = {(g, tid_name[(g, t)]) for g, t in busy}
    for want in [("rank0", "compute"), ("rank0", "comm"), ("cube0", "pe0.mac"), ("cube0", "pe0.dma.read"),
                 ("links", "link c0->c1")]:
        assert want in active, want
    assert any(g == "cube1" and n.startswith("hbm") for g, n in active)


def test_timing_only_keeps_the_simulated_time():
    kw = dict(tp=4, tokens=64, hidden=128, ffn=512)
    a = cs.tp.run_mlp(cs.Context("sim", topology="ring4"), **kw)
    b = cs.tp.run_mlp(cs.Context("sim", topology="ring4", timing_only=True), **kw)
    assert a.sim_time_ps == b.sim_time_ps > 0
    assert [(r.compute_ps, r.comm_ps) for r in a.ranks] == [(r.compute_ps, r.comm_ps) for r in b.ranks]


def test_report_to_dict_is_plain_json():
    ctx = cs.Context("sim", topology="ring4")
    rep = cs.tp.run_mlp(ctx, tp=2, tokens=32, hidden=64, ffn=256)
    d = rep.to_dict()
    json.dumps(d)
    assert d["sim_time_ps"] == rep.sim_time_ps and len(d["ranks"]) == 2
    assert set(d["ranks"][0]) == {"rank", "compute_ps", "comm_ps", "finish_ps"}
    assert set(d["tracks"][0]) == {"group", "name", "spans", "busy_ps"}
    assert "RunReport" in repr(rep) and "RankTimeline" in repr(rep.ranks[0])
    # The simulator takes no slower path it would need to say (the cuda backend's repacked GEMM
    # operands are said here: CudaBackendNotes in test_runtime_cuda).
    assert rep.notes == [] and d["notes"] == []


def test_a_context_runs_collectives_again_after_a_failed_run():
    ctx = cs.Context("host", world_size=2)

    def failing(rank):
        if rank == 1:
            raise ValueError("rank 1 stops before the barrier")
        cs.barrier()

    with pytest.raises(cs.RankError):
        ctx.spawn(failing)
    ctx.spawn(lambda rank: cs.barrier())


def test_run_report_usage_comes_from_the_units_counters_without_a_trace():
    kw = dict(tp=4, tokens=64, hidden=128, ffn=512)
    plain = cs.tp.run_mlp(cs.Context("sim", topology="ring4"), **kw)
    traced = cs.tp.run_mlp(cs.Context("sim", topology="ring4", trace=True), **kw)
    assert plain.usage == traced.usage, "counters do not depend on tracing"
    by_name = {u["name"]: u for u in plain.usage}
    assert {u["kind"] for u in plain.usage} >= {"memory", "dma_read", "dma_write", "link", "mac", "vector"}
    assert by_name["link c0->c1"]["bytes"] > 0 and by_name["link c0->c1"]["busy_ps"] > 0
    assert by_name["cube0.pe0.mac"]["bytes"] > 0  # operations
    assert by_name["cube1.hbm"]["busy_ps"] == max(by_name["cube1.hbm"]["channel_busy_ps"])
    assert all(0 <= u["busy_ps"] <= plain.sim_time_ps for u in plain.usage)
    u = plain.utilisation(4)
    assert [c["cube"] for c in u["cubes"]] == [0, 1, 2, 3]
    assert all(0 < c["pe_mac"] <= 1 and 0 < c["hbm_busiest_channel"] <= 1 for c in u["cubes"])
    assert u["links"]["directions"] == 8 and u["links"]["active"] >= 4
    host = cs.tp.run_mlp(cs.Context("host", world_size=2), tp=2, tokens=16, hidden=32, ffn=64)
    assert host.usage == [] and host.utilisation(2)["links"]["directions"] == 0


def test_a_switch_counts_its_links_in_the_hardware_table():
    rep = cs.tp.run_mlp(cs.Context("sim", topology="dgx_h100x8", timing_only=True), tp=8, tokens=64, hidden=128,
                        ffn=512)
    links = rep.utilisation(8)["links"]
    assert links["directions"] == 16 and links["active"] == 16  # c<i>->sw and sw->c<i>


def test_backends_come_from_the_registry_and_check_their_options():
    info = {b["name"]: b for b in cs.backend_info()}
    assert set(info) >= {"sim", "host", "cuda"} and set(cs.backends()) == set(info)
    assert info["sim"]["simulates"] and not info["host"]["simulates"] and info["host"]["devices"] == -1
    assert info["sim"]["available"] and info["host"]["available"] and info["host"]["why_not"] is None
    assert all(b["summary"] and b["options"] for b in info.values())
    if not info["cuda"]["available"]:
        assert info["cuda"]["why_not"]
    with pytest.raises(ValueError, match="backend 'host' has no option 'timing_only'"):
        cs.Context("host", world_size=2, timing_only=True)
    with pytest.raises(ValueError, match="backend 'host' simulates no system and takes no topology"):
        cs.Context("host", world_size=2, topology="ring4")
    with pytest.raises(ValueError, match="backend 'sim' has no option 'gemm_mode'"):
        cs.Context("sim", topology="ring4", gemm_mode="exact")
    assert cs.Context("sim").topology.name == cs.DEFAULT_TOPOLOGY


def test_ranks_on_places_the_ranks_on_the_cubes_given():
    ctx = cs.Context("sim", topology="h200x8", ranks_on=[4, 6], timing_only=True)
    assert ctx.world_size == 2 and ctx.ranks_on == [4, 6]
    assert cs.Context("sim", topology="ring4").ranks_on == [0, 1, 2, 3]
    rep = cs.tp.run_mlp(ctx, tp=2, tokens=64, hidden=128, ffn=512)
    by_name = {u["name"]: u for u in rep.usage}
    for c in range(8):
        used = c in (4, 6)
        assert (by_name[f"cube{c}.pe0.mac"]["bytes"] > 0) == used, c
        assert (by_name[f"link c{c}->sw"]["bytes"] > 0) == used, c
        assert (by_name[f"switch.port sw->c{c}"]["bytes"] > 0) == used, c
    # The ports carry what the links carry.
    assert by_name["switch.port c4->sw"]["bytes"] == by_name["link c4->sw"]["bytes"] > 0
    u = rep.utilisation(ctx.ranks_on)
    assert [c["cube"] for c in u["cubes"]] == [4, 6] and all(c["pe_mac"] > 0 for c in u["cubes"])
    assert u["links"]["directions"] == 4 and u["links"]["active"] == 4
    assert u["switch_ports"]["directions"] == 4 and u["switch_ports"]["active"] == 4
    assert rep.utilisation(2)["cubes"][0]["pe_mac"] == 0  # cubes 0 and 1 idled


def test_ranks_on_errors_name_the_argument_and_the_cube_range():
    with pytest.raises(ValueError, match=r"ranks_on in Python.*cube 3 is named twice \(ranks 0 and 1\).*0 to 7 in "
                                         r"topology 'h200x8'"):
        cs.Context("sim", topology="h200x8", ranks_on=[3, 3])
    with pytest.raises(ValueError, match=r"cube 8 \(for rank 1\) does not exist; topology 'h200x8' has cubes 0 to 7"):
        cs.Context("sim", topology="h200x8", ranks_on=[0, 8])
    with pytest.raises(ValueError, match="backend 'host' has no option 'cubes'"):
        cs.Context("host", world_size=2, ranks_on=[0, 1])


def test_nccl_plan_and_runs(rng):
    # NCCL's choice by size (runtime/algorithms/nccl.h): LL for tiny messages, Simple for large ones;
    # a small call on fewer channels (one below 16 KiB over 4 ranks, 4 at 64 KiB).
    small = cs.nccl_plan("all_reduce", 4, 1024, topology="h200x4")
    big = cs.nccl_plan("all_reduce", 4, 1 << 30, topology="h200x4")
    assert (small["algorithm"], small["protocol"], small["channels"]) == ("ring", "LL", 1)
    assert cs.nccl_plan("all_reduce", 4, 64 << 10, topology="h200x4")["channels"] == 4
    assert big["protocol"] == "Simple" and big["plan"] == "ring/Simple x16"
    assert big["predicted_us"] > small["predicted_us"] > 0
    assert cs.nccl_plan("all_gather", 2, 1024) == cs.nccl_plan("all_gather", 2, 1024, topology="h200x4")
    with pytest.raises(ValueError, match="'gossip' is not a collective"):
        cs.nccl_plan("gossip", 2, 1024)
    # On the simulator, with rings in group order, bitwise the ring's result.
    xs = [rng.standard_normal(1001).astype(np.float32) for _ in range(4)]
    ctx = cs.Context("sim", topology="h200x4", overrides={"nccl.rings": []})
    got = ctx.run_collective("all_reduce", xs, dtype="bf16", algorithm="nccl", bits=True)
    ref = cs.Context("host", world_size=4).run_collective("all_reduce", xs, dtype="bf16", algorithm="ring", bits=True)
    for a, b in zip(got.outputs, ref.outputs):
        assert np.array_equal(a, b)


def test_flow_level_timing_is_opt_in_close_to_chunk_level_and_refused_with_values():
    def all_reduce_time(**kw):
        ctx = cs.Context("sim", topology="ring4", timing_only=True, **kw)

        def fn(rank):
            t = ctx.empty(rank, [4 << 20], "bf16")  # 8 MiB per rank: ring messages of 2 MiB
            cs.all_reduce(t)

        return ctx, ctx.spawn(fn)

    chunk_ctx, chunk = all_reduce_time()
    flow_ctx, flow = all_reduce_time(timing="flow")
    assert chunk_ctx.timing == "chunk" and flow_ctx.timing == "flow"
    assert "flow level" in flow_ctx.describe()
    assert abs(flow.sim_time_ps / chunk.sim_time_ps - 1) <= 0.02, (flow.sim_time_ps, chunk.sim_time_ps)
    assert flow.events < chunk.events / 4  # one flow per message instead of a chunk event per link
    # The direct all-gather on a switched node: every GPU sends to every other at once (incast: the
    # two levels differ by up to ~15% there, docs/PERFORMANCE.md). A message whose flow ends while a
    # flow that started at that instant takes the whole of a link leaves its last chunk to the chunk
    # level with a turn on that link (one chunk of the other first), as the chunk level's FIFO serves
    # them; computed from the bandwidth left alone it waited ~10^4 times the collective. And the
    # report's time is when the last rank finished: a flow's superseded end event (a no-op, left
    # from before its rate rose) once put it ~3000 times later.
    def all_gather_time(**kw):
        ctx = cs.Context("sim", topology="dgx_h100x8", timing_only=True, **kw)
        xs = [np.zeros(64 << 10, np.float32)] * 8  # 128 KiB of bf16 per GPU
        return ctx.run_collective("all_gather", xs, dtype="bf16", algorithm="direct").report.sim_time_ps

    chunk_ag, flow_ag = all_gather_time(), all_gather_time(timing="flow")
    assert abs(flow_ag / chunk_ag - 1) <= 0.15, (flow_ag, chunk_ag)
    with pytest.raises(ValueError, match=r"timing 'flow' needs timing_only.*timing 'chunk'"):
        cs.Context("sim", topology="ring4", timing="flow")
    with pytest.raises(ValueError, match=r"timing.*'chunk'.*'flow'|one of"):
        cs.Context("sim", topology="ring4", timing_only=True, timing="packet")
    with pytest.raises(ValueError, match="no option 'timing'"):
        cs.Context("host", world_size=2, timing="flow")
    assert cs.Context("host", world_size=2).timing is None


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_trace_that_cannot_be_written_says_why_and_removes_no_device(tmp_path):
    ctx = cs.Context("sim", topology="ring4", trace=True)
    ctx.spawn(lambda rank: None)
    with pytest.raises(RuntimeError, match=r"writing trace file '/dev/full' failed \(on close: No space left on device\)"):
        ctx.save_trace("/dev/full")
    assert os.path.exists("/dev/full")  # only a regular file it wrote is removed
    with pytest.raises(RuntimeError, match=r"cannot open trace file '.*/no/such/dir/t.json' for writing: No such file"):
        ctx.save_trace(str(tmp_path / "no" / "such" / "dir" / "t.json"))
