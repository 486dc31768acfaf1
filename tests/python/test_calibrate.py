"""cubesim calibrate: the fit recovers figures the simulator itself produced, the fixed split rule,
the overlay it writes, and the errors a user can cause (a wrong file, another GPU's overlay)."""
import json
import math
import os

import pytest

import cubesim as cs
from cubesim import calibrate as cal
from cubesim import cli

ENV = {"gpu": "NVIDIA H200", "gpus": 2, "driver": "580.159.04", "cuda": "13.0", "nccl": "2.28.9",
       "torch": "2.11.0", "date": "2026-11-22T16:13:54Z", "l2_bytes": 60 << 20}


def measurements(tmp_path, **sections):
    doc = {"schema": cal.MEASURE_SCHEMA, "env": dict(ENV), "hbm": [], "peer": [], "gemm": [], "coll": [], "mlp": []}
    doc.update(sections)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    return cal.load_measurements(str(path))


def with_values(base, values):
    doc = cs.load_topology_json(base)
    for k, v in values.items():
        doc = cs.apply_override(doc, k, v)
    return cs.topology_from_json(doc, "truth")


def test_fit_recovers_nccl_figures_it_generated(tmp_path):
    truth = {"nccl.launch_latency_ns": 4000, "nccl.channel_bandwidth_GBps": 9.0}
    topo = with_values("h200x8", truth)
    recs = [{"op": op, "ranks": 2, "bytes": 1 << k, "time": 0.0} for op in ("all_reduce", "all_gather")
            for k in range(16, 25, 2)]
    for r in recs:
        r["time"] = cal.sim_collective(topo, r["op"], 2, r["bytes"])
    group = cal.Group(name="coll", kind="coll", predict=lambda t, r: cal.sim_collective(t, r["op"], 2, r["bytes"]),
                      params=[cal.Param("nccl.launch_latency_ns", 1500, 10, 50000, "launch", True),
                              cal.Param("nccl.channel_bandwidth_GBps", 20, 1, 100, "channel bandwidth")])
    got, res = cal.fit_group("h200x8", {}, group, recs, log=lambda s: None, iterations=8, jobs=2)
    assert max(abs(e) for e in res) < 0.01
    assert got["nccl.launch_latency_ns"] == pytest.approx(4000, rel=0.03)
    assert got["nccl.channel_bandwidth_GBps"] == pytest.approx(9.0, rel=0.03)


def test_parallel_map_gives_the_serial_results_in_order():
    fn = lambda n: [cal.sim_gemm(cs.load_topology("h200x8"), 64 * n, 512, 256)]  # noqa: E731 (forked, not pickled)
    args = [1, 2, 3, 5, 8]
    assert cal.parallel_map(fn, args, 3) == [fn(a) for a in args]


def test_fit_recovers_the_mma_clock_it_generated():
    topo = with_values("h200x8", {"cube.pe.mac.clock_GHz": 1.55})
    recs = [{"m": 2048, "n": 2048, "k": 2048, "ta": False, "tb": False},
            {"m": 2048, "n": 4096, "k": 1024, "ta": False, "tb": True}]
    for r in recs:
        r["time"] = cal.sim_gemm(topo, r["m"], r["n"], r["k"], r["ta"], r["tb"])
    group = cal.Group(name="gemm", kind="gemm",
                      predict=lambda t, r: cal.sim_gemm(t, r["m"], r["n"], r["k"], r["ta"], r["tb"]),
                      params=[cal.Param("cube.pe.mac.clock_GHz", 1.9, 1.0, 1.98, "clock")])
    got, res = cal.fit_group("h200x8", {}, group, recs, log=lambda s: None)
    assert got["cube.pe.mac.clock_GHz"] == pytest.approx(1.55, rel=0.01)
    assert max(abs(e) for e in res) < 0.01


def test_the_split_keeps_the_targets_out_of_the_fit(tmp_path):
    gemm = [{"m": 4096, "n": 14336, "k": 4096, "ta": False, "tb": True, "name": "fc1.fwd tp1", "time": 1},
            {"m": 4096, "n": 4096, "k": 4096, "ta": False, "tb": False, "name": "square", "time": 1},
            {"m": 512, "n": 512, "k": 512, "ta": False, "tb": False, "name": "square", "time": 1}]
    gemm += [{"m": m, "n": 4096, "k": 4096, "ta": False, "tb": True, "name": "m-sweep", "time": 1}
             for m in (1, 2, 1024, 1536, 2048)]
    coll = [{"op": "all_reduce", "ranks": r, "bytes": 1 << k, "time": 1} for r in (2, 4) for k in (16, 17, 28, 30)]
    m = measurements(tmp_path, gemm=gemm, coll=coll)
    fit, held = cal.split(m, "gemm")
    assert [(r["name"], r["m"]) for r in fit] == [("square", 4096), ("m-sweep", 1), ("m-sweep", 1024), ("m-sweep", 2048)]
    assert all(r in held for r in m["gemm"] if r["name"].startswith("fc"))
    fit, held = cal.split(m, "coll")
    assert sorted((r["ranks"], r["bytes"]) for r in fit) == [(2, 1 << 16), (2, 1 << 28)]
    assert all(r["ranks"] == 4 or r["bytes"] in (1 << 17, 1 << 30) for r in held)


def test_closed_form_figures_come_from_the_measurements(tmp_path):
    m = measurements(tmp_path,
                     hbm=[{"op": "read", "bytes": 1 << 32, "moved": 1 << 32, "time": (1 << 32) / 4.0e12}],
                     peer=[{"bytes": 64 << 20, "time": 10e-6 + (64 << 20) / 360e9},
                           {"bytes": 1 << 30, "time": 10e-6 + (1 << 30) / 360e9}])
    vals, src = cal.closed_form(m)
    assert vals["cube.hbm.bandwidth_GBps"] == pytest.approx(4000, rel=1e-3)
    assert vals["cube.l2.capacity_MiB"] == 60
    assert vals["network.link.bandwidth_GBps"] == pytest.approx(20, rel=1e-3)  # 360 GB/s over 18 links
    assert any("cube.hbm.bandwidth_GBps" in s for s in src)


def test_closed_form_hbm_directions_and_kernel_figures(tmp_path):
    # Sizes out of order and a noisy small record: the largest buffer sets each rate; a reduction's
    # extra cost is read minus write on the smallest buffer; the launch gap is the median of tp 1's
    # intervals that run no kernel (tp 2's all-reduce, a real one, is not among them).
    hbm = [{"op": op, "bytes": b, "moved": (2 if op == "copy" else 1) * b,
            "time": extra + (2 if op == "copy" else 1) * b / rate}
           for op, rate, extra in (("read", 4.0e12, 8e-6), ("write", 3.0e12, 1e-6), ("copy", 2.5e12, 1e-6))
           for b in (1 << 32, 1 << 20, 1 << 30)]
    ops = lambda ar, wait: [{"name": "gelu.fwd", "kind": "other", "time": 80e-6},
                            {"name": "fc2.all_reduce", "kind": "collective", "time": ar},
                            {"name": "fc1.all_reduce_wait", "kind": "collective", "time": wait}]
    mlp = [{"tp": 1, "tokens": 4096, "hidden": 4096, "ffn": 14336, "step": 1e-3, "ops": ops(2.9e-6, 3.1e-6)},
           {"tp": 1, "tokens": 2048, "hidden": 5120, "ffn": 13824, "step": 1e-3, "ops": ops(2.8e-6, 3.3e-6)},
           {"tp": 2, "tokens": 4096, "hidden": 4096, "ffn": 14336, "step": 1e-3, "ops": ops(139e-6, 2.9e-6)}]
    vals, src = cal.closed_form(measurements(tmp_path, hbm=hbm, mlp=mlp))
    big = 1 << 32
    assert vals["cube.hbm.read_GBps"] == vals["cube.hbm.bandwidth_GBps"]
    assert vals["cube.hbm.read_GBps"] == pytest.approx(big / (8e-6 + big / 4.0e12) / 1e9, abs=0.1)
    assert vals["cube.hbm.write_GBps"] == pytest.approx(big / (1e-6 + big / 3.0e12) / 1e9, abs=0.1)
    assert "cube.hbm.copy_GBps" not in vals  # a copy's rate is measured but not a figure (calibrate.py)
    small = 1 << 20
    assert vals["cube.kernel.reduction_ns"] == pytest.approx((8e-6 + small / 4.0e12 - 1e-6 - small / 3.0e12) * 1e9, abs=0.1)
    assert vals["cube.kernel.launch_gap_ns"] == pytest.approx(3000, abs=0.1)  # median of 2.8, 2.9, 3.1, 3.3 us
    for key in ("write_GBps", "reduction_ns", "launch_gap_ns"):
        assert any(key in s for s in src)
    # Without such records: none of these figures.
    vals, _ = cal.closed_form(measurements(tmp_path))
    assert not any(k.startswith(("cube.hbm", "cube.kernel")) for k in vals)
    # The figures are schema paths of the base they are written for, and load there.
    vals, _ = cal.closed_form(measurements(tmp_path, hbm=hbm, mlp=mlp))
    doc = cs.load_topology_json("h200x8")
    for k, v in vals.items():
        doc = cs.apply_override(doc, k, v)
    assert doc["cube"]["hbm"]["write_GBps"] == vals["cube.hbm.write_GBps"]
    assert doc["cube"]["kernel"]["launch_gap_ns"] == vals["cube.kernel.launch_gap_ns"]
    assert len(cs.topology_from_json(doc, "fitted").cubes) == 8


def test_bad_measurement_files_are_refused(tmp_path):
    with pytest.raises(cal.CalibrationError, match="nosuch.json: cannot read"):
        cal.load_measurements(str(tmp_path / "nosuch.json"))
    p = tmp_path / "x.json"
    p.write_text("{not json")
    with pytest.raises(cal.CalibrationError, match="not JSON"):
        cal.load_measurements(str(p))
    p.write_text(json.dumps({"schema": "other/1"}))
    with pytest.raises(cal.CalibrationError, match="schema 'other/1'; expected 'cubesim.measure/1'"):
        cal.load_measurements(str(p))


def test_an_overlay_for_another_gpu_is_refused_naming_both(tmp_path):
    m = measurements(tmp_path)
    m["env"]["gpu"] = "NVIDIA H100 80GB HBM3"
    with pytest.raises(cal.CalibrationError, match="calibrated on a NVIDIA H200, but the GPU found is a NVIDIA H100"):
        cal.check_gpu({"calibration": {"gpu": "NVIDIA H200"}}, m)
    cal.check_gpu({"calibration": {"gpu": "NVIDIA H100 80GB HBM3"}}, m)  # the same GPU: fine


def test_cli_fits_writes_a_loadable_overlay_and_checks_it(tmp_path, capsys):
    # The truth in the fit's own terms (its fixed figures, its parameters where they start), with
    # another launch latency: the fit must find it.
    figures = dict(cal.coll_constants()[0])
    for p in cal.coll_group().params:
        for path in (p.path,) + tuple(p.also):
            figures[path] = p.start
    figures["nccl.launch_latency_ns"] = 3000
    truth = with_values("h200x8", figures)
    coll = [{"op": "all_reduce", "ranks": 2, "bytes": 1 << k} for k in (16, 18, 20, 21)]
    for r in coll:
        r["time"] = cal.sim_collective(truth, "all_reduce", 2, r["bytes"])
    m = measurements(tmp_path, coll=coll)
    out = tmp_path / "h200x8_cal.json"
    rc = cli.main(["calibrate", "--measurements", m["_path"], "--kinds", "coll", "--out", str(out),
                   "--json", str(tmp_path / "r.json")])
    assert rc == 0
    overlay = json.loads(out.read_text())
    assert overlay["extends"] == "h200x8" and overlay["calibration"]["gpu"] == "NVIDIA H200"
    assert "nccl.launch_latency_ns" in overlay["set"] and any("fitted" in s for s in overlay["sources"])
    topo = cs.load_topology(str(out))
    assert topo.name == "h200x8_cal"
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["summary"]["coll"]["max"] < 0.05  # held out: 2^21
    # --check reads the overlay without refitting; another GPU's measurements are refused.
    assert cli.main(["calibrate", "--measurements", m["_path"], "--kinds", "coll", "--check", str(out)]) == 0
    other = json.loads(open(m["_path"]).read())
    other["env"]["gpu"] = "NVIDIA H100 80GB HBM3"
    (tmp_path / "h100.json").write_text(json.dumps(other))
    capsys.readouterr()
    assert cli.main(["calibrate", "--measurements", str(tmp_path / "h100.json"), "--check", str(out)]) == 2
    assert "calibrated on a NVIDIA H200, but the GPU found is a NVIDIA H100 80GB HBM3" in capsys.readouterr().err


def test_the_shipped_overlay_is_a_valid_topology_for_the_h200():
    t = cs.load_topology("h200x8_calibrated")
    assert cs.load_topology_json("h200x8_calibrated")["calibration"]["gpu"] == "NVIDIA H200"
    with open(f"{cs.topology_dir()}/h200x8_calibrated.json") as fh:
        doc = json.load(fh)
    assert t.name == "h200x8_calibrated" and len(t.cubes) == 8
    assert set(doc["set"]) >= {"cube.hbm.bandwidth_GBps", "cube.pe.mac.clock_GHz", "nccl.channel_bandwidth_GBps"}
    assert all(math.isfinite(float(v)) for v in doc["set"].values())


def test_unaligned_operands_load_at_the_unaligned_rate():
    # TMA needs 16-byte aligned rows: K = 4095 bf16 (8190-byte rows) is not, K = 4096 is.
    slow = with_values("h200x8", {"cube.pe.gemm.mma.unaligned_bytes_per_cycle": 4})
    fast = with_values("h200x8", {"cube.pe.gemm.mma.unaligned_bytes_per_cycle": 64})
    plain = cs.load_topology("h200x8")  # no such figure: no limit
    aligned = [cal.sim_gemm(t, 1024, 2048, 4096) for t in (slow, fast, plain)]
    assert aligned[0] == aligned[1] == aligned[2]
    odd = [cal.sim_gemm(t, 1024, 2048, 4095) for t in (slow, fast, plain)]
    assert odd[0] > 4 * odd[2] and odd[2] <= odd[1] < odd[0]
    doc = cs.load_topology_json("h200x8")
    with pytest.raises(cs.TopologyError, match=r"pe\.gemm\.mma\.unaligned_bytes_per_cycle: -1 is not valid; give"):
        cs.topology_from_json(cs.apply_override(doc, "cube.pe.gemm.mma.unaligned_bytes_per_cycle", -1), "t")


CALIBRATION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "calibration")


@pytest.mark.parametrize("name", ["h200_2gpu_2026-11-22.json", "h200_2gpu_2026-11-22_check.json",
                                  "h200_4gpu_2026-11-22.json"])
def test_the_simulated_nccl_chooses_as_the_real_one_logged(name):
    # NCCL_DEBUG=INFO recorded, per collective and size, the algorithm, protocol and channel count
    # NCCL ran; the shipped overlay's nccl section must choose the same algorithm and protocol for
    # every one of them, and the same channels but where NCCL's grain left it 22 of the 24 the
    # thread-threshold rule gives (nccl.h: not modelled).
    m = cal.load_measurements(f"{CALIBRATION}/{name}")
    choices = cal.nccl_choices(m)
    assert len(choices) > 50
    topo = cs.load_topology("h200x8_calibrated")
    wrong, grain, reduced = [], 0, 0
    for op, ranks, nbytes, algo, proto, channels in choices:
        plan = cs.nccl_plan(op, ranks, nbytes, topo)
        if (plan["algorithm"], plan["protocol"]) != (algo, proto):
            wrong.append(f"{op} {ranks} ranks {nbytes} B: NCCL {algo}/{proto}, simulated {plan['plan']}")
        if channels is None:
            continue
        reduced += channels < 24
        if (channels, plan["channels"]) == (22, 24):
            grain += 1
        elif channels != plan["channels"]:
            wrong.append(f"{op} {ranks} ranks {nbytes} B: NCCL {channels} channels, simulated {plan['plan']}")
    assert not wrong, "\n".join(wrong)
    assert reduced > 20 and grain <= reduced // 5


def test_nccl_tuning_is_read_off_nccls_table(tmp_path):
    # A table written from known figures (2 ranks: all_reduce 2 steps, all_gather 1).
    base = {"LL": 5.0, "LL128": 12.0, "Simple": 9.0}
    hop = {"LL": 0.5, "LL128": 2.0, "Simple": 3.0}
    bus = {"LL": 120.0, "LL128": 300.0, "Simple": 400.0}
    tuning = []
    for proto in base:
        tuning.append({"op": "AllReduce", "algo": "Ring", "proto": proto, "latency_us": base[proto] + 2 * hop[proto],
                       "bandwidth_GBps": bus[proto]})
        tuning.append({"op": "AllGather", "algo": "Ring", "proto": proto, "latency_us": base[proto] + hop[proto],
                       "bandwidth_GBps": 2 * bus[proto]})
    m = measurements(tmp_path, nccl_log={"choices": [], "channels": 20, "tuning": tuning})
    vals, src = cal.nccl_tuning(m)
    for proto in base:
        assert vals[f"nccl.protocols.{proto}.base_latency_ns.ring"] == pytest.approx(base[proto] * 1000)
        assert vals[f"nccl.protocols.{proto}.hop_latency_ns.ring"] == pytest.approx(hop[proto] * 1000)
    assert vals["nccl.channel_bandwidth_GBps"] == pytest.approx(400.0 / 20)
    assert vals["nccl.protocols.LL.max_bus_bandwidth_GBps"] == pytest.approx(120.0)
    assert vals["nccl.protocols.LL128.max_bus_bandwidth_GBps"] == pytest.approx(300.0)
    assert all("NCCL's" in s for s in src)


def test_several_measurement_files_fit_each_at_its_own_gpu_count(tmp_path):
    coll = [{"op": "all_gather", "ranks": r, "bytes": 1 << k, "time": 1} for r in (2, 4) for k in (16, 17, 30)]
    two = tmp_path / "two.json"
    four = tmp_path / "four.json"
    for path, gpus, recs in ((two, 2, [r for r in coll if r["ranks"] == 2]), (four, 4, coll)):
        path.write_text(json.dumps({"schema": cal.MEASURE_SCHEMA, "env": dict(ENV, gpus=gpus), "coll": recs}))
    m = cal.load_measurements(f"{two},{four}")
    assert len(m["coll"]) == 9 and cal.files_of(m) == "two.json, four.json"
    fit, held = cal.split(m, "coll")
    # 2 ranks from the 2-GPU file, 4 ranks from the 4-GPU file: even sizes up to 256 MiB only.
    assert sorted((r["ranks"], r["_gpus"], r["bytes"]) for r in fit) == [(2, 2, 1 << 16), (4, 4, 1 << 16)]
    assert sum(1 for r in held if r["ranks"] == 2 and r["_gpus"] == 4) == 3
