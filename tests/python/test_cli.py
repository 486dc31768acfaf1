"""The command line: exit codes, human and JSON output, the trace file, topo and bench commands.
Most cases call cli.main() in-process (fast); a few run the real `python3 -m cubesim` and the
build's launcher script."""
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cubesim as cs
from cubesim import cli
from cubesim._progress import Progress
from cubesim._table import format_table

SMALL = ["--hidden", "64", "--ffn", "256", "--tokens", "32"]
PKG_ROOT = Path(cs.__file__).resolve().parent.parent  # build/python


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ---- run --------------------------------------------------------------------------------------------


def test_run_default_passes_and_reports(capsys):
    rc, out, err = run_cli(capsys, "run", *SMALL)
    assert rc == 0, err
    assert "check: PASS" in out and "max abs error" in out
    assert f"topology  {cs.DEFAULT_TOPOLOGY}" in out
    assert "simulated time:" in out and "compute %" in out
    assert "trace: not written" in out


def test_run_json_schema(capsys, tmp_path):
    path = tmp_path / "run.json"
    rc, out, _ = run_cli(capsys, "run", "--topology", "ring4", "--tp", "2", "--json", str(path), *SMALL)
    assert rc == 0
    assert f"json: {path}" in out
    d = json.loads(path.read_text())
    assert d["schema"] == "cubesim.run/1" and d["command"] == "run" and d["pass"] is True
    assert d["backend"] == "sim" and d["tp"] == 2 and d["timing_only"] is False
    assert d["topology"]["name"] == "ring4" and d["topology"]["cubes"] == 4
    assert d["mlp"] == {"tokens": 32, "hidden": 64, "ffn": 256, "dtype": "bf16", "gelu": "tanh", "bias": True,
                        "sequence_parallel": False, "seed": 1234}
    assert d["check"]["pass"] is True and d["check"]["max_abs"] > 0  # tp 2 sums partials
    c0 = d["check"]["checks"][0]
    assert set(c0) == {"tensor", "against", "claim", "bitwise", "max_abs", "rel_norm", "tolerance", "pass"}
    assert isinstance(d["sim_time_ps"], int) and d["sim_time_ps"] > 0
    assert [r["rank"] for r in d["ranks"]] == [0, 1]
    assert set(d["ranks"][0]) == {"rank", "compute_ps", "comm_ps", "finish_ps"}
    assert all(r["comm_ps"] > 0 for r in d["ranks"])
    hw = d["hardware"]
    assert [c["cube"] for c in hw["cubes"]] == [0, 1]
    assert set(hw["cubes"][0]) == {"cube", "pe_mac", "pe_vector", "pe_dma_read", "pe_dma_write", "hbm_busiest_channel"}
    assert all(0 < c["pe_mac"] <= 1 and 0 < c["hbm_busiest_channel"] <= 1 for c in hw["cubes"])
    assert hw["links"]["directions"] == 2 and hw["links"]["active"] >= 1 and 0 < hw["links"]["busiest_busy"] <= 1
    assert d["trace"] is None and d["measured"] is None


def test_run_on_a_topology_with_l2_reports_it(capsys, tmp_path):
    # h200x4's cubes have an L2: the hardware table has its column, the JSON its counters and the
    # trace its track; hits + misses are the sectors read, fills are the misses' bytes.
    path, trace = tmp_path / "run.json", tmp_path / "trace.json"
    rc, out, _ = run_cli(capsys, "run", "--topology", "h200x4", "--tp", "2", "--timing-only", "--json", str(path),
                         "--trace", str(trace), *SMALL)
    assert rc == 0
    assert "L2 (hit rate)" in out and "% hits)" in out
    d = json.loads(path.read_text())
    for c in d["hardware"]["cubes"]:
        l2 = c["l2"]
        assert set(l2) == {"busy", "hits", "misses", "hit_rate"}
        assert l2["misses"] > 0 and 0 < l2["busy"] <= 1
        assert l2["hit_rate"] == pytest.approx(l2["hits"] / (l2["hits"] + l2["misses"]))
    units = [u for u in d["usage"] if u["kind"] == "l2"]
    assert [u["name"] for u in units] == ["cube0.l2", "cube1.l2"]
    for u, c in zip(units, d["hardware"]["cubes"]):
        assert (u["hits"], u["misses"]) == (c["l2"]["hits"], c["l2"]["misses"])
        assert u["fill_bytes"] == 32 * u["misses"]  # 32-byte sectors
    tracks = {(e["args"]["name"]) for e in json.loads(trace.read_text())["traceEvents"]
              if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert "l2" in tracks
    rc, out, _ = run_cli(capsys, "topo", "show", "h200x4")
    assert rc == 0 and "L2: 50" in out and "128-byte lines of 32-byte sectors, 16 ways" in out


def test_run_json_to_stdout_is_only_json(capsys):
    rc, out, _ = run_cli(capsys, "run", "--json", "-", *SMALL)
    assert rc == 0
    d = json.loads(out)
    assert d["pass"] is True and d["tp"] == 1


def test_run_trace_file_parses_and_has_the_tracks(capsys, tmp_path):
    path = tmp_path / "trace.json"
    rc, out, _ = run_cli(capsys, "run", "--topology", "ring4", "--trace", str(path), *SMALL)
    assert rc == 0
    assert f"trace: {path}" in out and "ui.perfetto.dev" in out
    doc = json.loads(path.read_text())
    ev = doc["traceEvents"]
    groups = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name"}
    tracks = {(groups[e["pid"]], e["args"]["name"]) for e in ev if e.get("name") == "thread_name"}
    for c in range(4):
        assert {(f"rank{c}", "compute"), (f"rank{c}", "comm"), (f"cube{c}", "pe0.mac"), (f"cube{c}", "pe0.vector"),
                (f"cube{c}", "pe0.dma.read"), (f"cube{c}", "pe0.dma.write"), (f"cube{c}", "hbm.ch0")} <= tracks
    assert ("links", "link c0->c1") in tracks
    assert sum(1 for e in ev if e.get("ph") == "X") > 0


def test_run_json_has_every_active_units_counters(capsys):
    rc, out, _ = run_cli(capsys, "run", "--json", "-", "--topology", "ring4", "--tp", "2", *SMALL)
    units = json.loads(out)["usage"]
    usage = {u["name"]: u for u in units}
    assert rc == 0 and "cube3.hbm" not in usage  # ranks on cubes 0 and 1 only
    tokens, hidden, ffn_per_rank = 32, 64, 256 // 2
    # Each rank runs six GEMMs of tokens x hidden x ffn/tp MACs (fc1, fc2 forward; their dgrad and
    # wgrad), all on its cube's PEs: the MAC arrays count exactly those operations.
    for cube in (0, 1):
        macs = sum(u["bytes"] for u in units if u["kind"] == "mac" and u["cube"] == cube)
        assert macs == 6 * tokens * hidden * ffn_per_rank
    # Two ring all-reduces of a [tokens, hidden] bf16 tensor on 2 ranks (fc2's output, fc1's input
    # gradient): each sends 2 * (p - 1) / p of the tensor over each direction of the link.
    for link in ("link c0->c1", "link c1->c0"):
        p, tensor_bytes = 2, tokens * hidden * 2
        assert usage[link]["bytes"] == 2 * tensor_bytes * 2 * (p - 1) // p
        assert usage[link]["busy_ps"] > 0


def test_run_no_hardware_stats_leaves_the_table_out(capsys):
    rc, out, _ = run_cli(capsys, "run", "--json", "-", "--topology", "ring4", "--tp", "2", "--no-hardware-stats", *SMALL)
    assert rc == 0 and json.loads(out)["hardware"] is None
    rc, out, _ = run_cli(capsys, "run", "--topology", "ring4", "--tp", "2", "--no-hardware-stats", *SMALL)
    assert rc == 0 and "hardware:" not in out and "simulated time:" in out


def test_run_timing_only_and_host(capsys):
    rc, out, _ = run_cli(capsys, "run", "--topology", "ring4", "--timing-only", *SMALL)
    assert rc == 0 and "timing only" in out and "check:" not in out
    rc, out, _ = run_cli(capsys, "run", "--backend", "host", "--tp", "2", *SMALL)
    assert rc == 0 and "check: PASS" in out and "backend   host" in out and "simulated time:" not in out


def test_run_with_overrides(capsys):
    rc, out, _ = run_cli(capsys, "run", "--json", "-", "--topology", "ring4", "--timing-only",
                         "--set", "network.link.bandwidth_GBps=16", *SMALL)
    slow = json.loads(out)
    rc, out, _ = run_cli(capsys, "run", "--json", "-", "--topology", "ring4", "--timing-only", *SMALL)
    fast = json.loads(out)
    assert slow["overrides"] == [{"path": "network.link.bandwidth_GBps", "value": 16}]
    assert sum(r["comm_ps"] for r in slow["ranks"]) > sum(r["comm_ps"] for r in fast["ranks"])


def test_run_usage_errors_exit_2(capsys):
    rc, _, err = run_cli(capsys, "run", "--topology", "ring4", "--tp", "8", *SMALL)
    assert rc == 2 and "--tp 8: topology 'ring4' has 4 cubes, one per rank; valid tp values here: 1, 2, 4" in err
    rc, _, err = run_cli(capsys, "run", "--topology", "ring4", "--tp", "3", *SMALL)
    assert rc == 2 and "tp must divide ffn 256; valid tp values here: 1, 2, 4" in err
    rc, _, err = run_cli(capsys, "run", "--topology", "nosuch")
    assert rc == 2 and "unknown topology 'nosuch'" in err
    rc, _, err = run_cli(capsys, "run", "--set", "cube.hbm.bandwdth_GBps=1")
    assert rc == 2 and "did you mean 'bandwidth_GBps'" in err
    rc, _, err = run_cli(capsys, "run", "--backend", "host", "--timing-only")
    assert rc == 2 and "--timing-only needs --backend sim" in err
    rc, _, err = run_cli(capsys, "run", "--dtype", "fp8")
    assert rc == 2 and "f32, bf16, f16" in err
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--backend", "tpu"])
    assert e.value.code == 2


def test_run_cuda_without_gpu_says_unavailable(capsys):
    if cs.backends()["cuda"]:
        pytest.skip("a GPU is usable here")
    rc, _, err = run_cli(capsys, "run", "--backend", "cuda")
    assert rc == 2 and "cuda" in err and ("not available in this build" in err or "no usable GPU" in err)


# ---- topo -------------------------------------------------------------------------------------------


def test_topo_list(capsys):
    rc, out, _ = run_cli(capsys, "topo", "list")
    assert rc == 0
    for name in cs.list_topologies():
        assert name in out
    rc, out, _ = run_cli(capsys, "topo", "list", "--json", "-")
    d = json.loads(out)
    assert d["default"] == cs.DEFAULT_TOPOLOGY
    assert {t["name"] for t in d["topologies"]} == set(cs.list_topologies())
    assert {"name", "cubes", "pes_per_cube", "network", "links", "description"} <= set(d["topologies"][0])


def test_topo_show(capsys):
    rc, out, _ = run_cli(capsys, "topo", "show", "mesh4x4")
    assert rc == 0 and "mesh4x4" in out and "network   mesh 4x4" in out and "HBM" in out and "links" in out
    rc, out, _ = run_cli(capsys, "topo", "show", "ring4", "--set", "cubes.2.clock_scale=0.5", "--json", "-")
    d = json.loads(out)
    assert d["num_cubes"] == 4 and d["cubes"][2]["clock_scale"] == 0.5 and d["doc"]["name"] == "ring4"
    rc, out, _ = run_cli(capsys, "topo", "show", "single_cube", "--doc")
    assert json.loads(out)["name"] == "single_cube"
    rc, _, err = run_cli(capsys, "topo", "show", "nosuch")
    assert rc == 2 and "unknown topology" in err


def test_topo_validate(capsys, tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(cs.load_topology_json("ring4")))
    rc, out, _ = run_cli(capsys, "topo", "validate", str(good))
    assert rc == 0 and "valid" in out
    doc = cs.load_topology_json("ring4")
    doc["network"]["link"]["latency_ns"] = -3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    rc, out, err = run_cli(capsys, "topo", "validate", str(bad))
    assert rc == 2 and "invalid" in err and "at: network.link.latency_ns" in err
    rc, out, err = run_cli(capsys, "topo", "validate", str(bad), "--json", "-")
    d = json.loads(out)
    assert rc == 2 and d == {"file": str(bad), "valid": False, "path": "network.link.latency_ns", "message": d["message"]}
    broken = tmp_path / "broken.json"
    broken.write_text('{"name": "x",\n "cube": }')
    rc, _, err = run_cli(capsys, "topo", "validate", str(broken))
    assert rc == 2 and "at: line 2, column" in err


def test_invalid_topology_exits_2_from_every_command(capsys, tmp_path):
    """Issue 13: topo validate exited 1 where run and topo show exit 2 (README: bad input is 2)."""
    doc = cs.load_topology_json("ring4")
    doc["network"]["link"]["bandwidth_GBps"] = 1e-30  # positive, but rounds to 0 bytes/s
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    codes = {}
    for argv in (("topo", "validate", str(bad)), ("topo", "show", str(bad)), ("run", "--topology", str(bad), *SMALL)):
        rc, _, err = run_cli(capsys, *argv)
        codes[argv[1]] = rc
        assert "network.link.bandwidth_GBps" in err and "bad.json" in err, (argv, err)
    assert codes == {"validate": 2, "show": 2, "--topology": 2}


@pytest.mark.parametrize(
    "text,expect",
    [
        (b'{"name": "x", "_comment": "caf\xe9"}', ["byte 0xE9", "byte offset 30", "not valid UTF-8"]),
        (b'{"_comment": ' + b"[" * 100000 + b"]" * 100000 + b"}", ["deeper than 64 levels", "the limit is 64"]),
        (b'{"cubes": 1e999}', ["cubes: a number is out of range", "give a finite number"]),
        (b'{"extends": "' + b"x" * 300 + b'"}', ["extends:", "300 bytes", "each part at most 255 bytes"]),
        (b'{"extends": "/dev/zero"}', ["/dev/zero", "not a regular file", "16777216 bytes"]),
    ],
)
def test_topo_validate_names_the_file_for_hostile_input(capsys, tmp_path, text, expect):
    """Issue 13: these crashed, or gave an empty or bare RuntimeError message; now exit 2 naming the file."""
    f = tmp_path / "hostile.json"
    f.write_bytes(text)
    rc, _, err = run_cli(capsys, "topo", "validate", str(f))
    assert rc == 2 and str(f) in err, err
    for e in expect:
        assert e in err, (e, err)


def test_topo_validate_refuses_huge_cube_counts_at_once(capsys, tmp_path):
    """Issue 13: 2^17 cubes took 11 s and 1.2 GB; 2^20 ran out of memory. Now refused from the count."""
    for dims in ([512, 256], [1024, 1024]):
        doc = cs.load_topology_json("mesh4x4")
        doc["network"]["dims"] = dims
        f = tmp_path / "big.json"
        f.write_text(json.dumps(doc))
        rc, _, err = run_cli(capsys, "topo", "validate", str(f))
        assert rc == 2 and "at: network.dims" in err and "the limit is 65536 cubes" in err, err


@pytest.mark.parametrize(
    "message,path",
    [
        ("topology 'small' (t): network.links.1.to: cube 7 does not exist; cube ids are 0..3", "network.links.1.to"),
        ("topology 'x' (a.json): missing required field 'network' (...)", "network"),
        ("topology 'small' (t): cube.pe.tcm: TCM of 16.00 KiB is smaller", "cube.pe.tcm"),
        ("topology file 'b.json': invalid JSON at line 1, column 2: ...", "line 1, column 2"),
        ("topology file 'nosuch.json' does not exist", None),
    ],
)
def test_error_json_path(message, path):
    assert cli.error_json_path(message) == path


# ---- algorithms -------------------------------------------------------------------------------------


def test_algorithms_prints_the_table(capsys):
    rows = cs.algorithms()
    assert rows and all(set(a) == {"name", "collectives", "summary"} and a["name"] and a["summary"] for a in rows)
    rc, out, _ = run_cli(capsys, "algorithms")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["name", "collectives", "summary"]
    for a in rows:
        line = next(l for l in lines if l.split()[:1] == [a["name"]])
        assert ", ".join(a["collectives"]) in line and a["summary"] in line
    rc, out, _ = run_cli(capsys, "algorithms", "--json", "-")
    assert rc == 0 and json.loads(out) == {"algorithms": rows}
    # The same table behind supported_algorithms and `cubesim run --algorithm`.
    for coll in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"):
        assert cs.supported_algorithms(coll) == [a["name"] for a in rows if coll in a["collectives"]]
    assert "ring" in cs.supported_algorithms("broadcast") and "tree" not in cs.supported_algorithms("all_gather")
    with pytest.raises(SystemExit):
        cli.main(["run", "--algorithm", "gossip"])
    err = capsys.readouterr().err
    assert "invalid choice: 'gossip'" in err and all(a["name"] in err for a in rows)


# ---- bench ------------------------------------------------------------------------------------------


def fake_bench(tmp_path, name, rc):
    exe = tmp_path / name
    exe.write_text(f'#!/bin/sh\necho "{name} got: $*"\nexit {rc}\n')
    exe.chmod(0o755)
    return exe


def test_bench_passes_options_through(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CUBESIM_BENCH_DIR", str(tmp_path))
    fake_bench(tmp_path, "bench_tp_mlp", 0)
    rc, out, _ = run_cli(capsys, "bench", "tp", "--quick", "--json", "x.json", "--topology", "ring4")
    assert rc == 0 and "bench_tp_mlp got: --quick --json x.json --topology ring4" in out
    fake_bench(tmp_path, "bench_collectives", 3)
    rc, out, err = run_cli(capsys, "bench", "collectives")
    assert rc == 1 and "bench_collectives exited with status 3" in err


def test_bench_missing_executable_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CUBESIM_BENCH_DIR", str(tmp_path))
    rc, _, err = run_cli(capsys, "bench", "gemm")
    assert rc == 2 and "bench_det_gemm_cpu is not built" in err and "--target bench_det_gemm_cpu" in err


def test_bench_dir_is_the_builds(monkeypatch):
    monkeypatch.delenv("CUBESIM_BENCH_DIR", raising=False)
    assert cli.bench_dir() == PKG_ROOT.parent / "benches"


# ---- the real command ---------------------------------------------------------------------------------


def test_python_m_cubesim(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(PKG_ROOT))
    r = subprocess.run([sys.executable, "-m", "cubesim", "--version"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.strip() == f"cubesim {cs.__version__}"
    r = subprocess.run([sys.executable, "-m", "cubesim", "run", "--topology", "ring4", "--tp", "5"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "valid tp values here" in r.stderr
    r = subprocess.run([sys.executable, "-m", "cubesim"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "usage" in r.stderr


def test_launcher_script():
    launcher = PKG_ROOT.parent / "bin" / "cubesim"
    assert launcher.is_file() and os.access(launcher, os.X_OK)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(launcher), "topo", "list", "--json", "-"], capture_output=True, text=True, env=env, cwd="/")
    assert r.returncode == 0, r.stderr
    assert cs.DEFAULT_TOPOLOGY in {t["name"] for t in json.loads(r.stdout)["topologies"]}


# ---- output helpers ---------------------------------------------------------------------------------


def test_progress_draws_only_when_enabled_and_clears():
    buf = io.StringIO()
    with Progress("job", total=4, delay=0.0, stream=buf, enabled=True, interval=0.01) as p:
        p.update(2)
        import time

        time.sleep(0.05)
    text = buf.getvalue()
    assert "job [" in text and "2/4" in text and text.endswith("\r\x1b[K")
    quiet = io.StringIO()
    with Progress("job", stream=quiet, enabled=False, delay=0.0):
        pass
    assert quiet.getvalue() == ""
    assert Progress("spin").render(1.0).startswith("spin [")
    assert "====" in Progress("spin").render(0.35)


def test_table_alignment():
    t = format_table(["name", "time"], [["a", "1.5 us"], ["bbb", "12.000 ms"]])
    lines = t.splitlines()
    assert lines[0].split() == ["name", "time"]
    assert lines[2].endswith("   1.5 us") and lines[3].endswith("12.000 ms")


# ---- xcheck -----------------------------------------------------------------------------------------

XSMALL = ["--tp", "1", "--tokens", "64", "--hidden", "128", "--ffn", "256",
          "--check-tokens", "32", "--check-hidden", "64", "--check-ffn", "128"]


def test_xcheck_runs_the_cross_check_program(capsys):
    rc, out, err = run_cli(capsys, "xcheck", "--sim-only", *XSMALL)
    assert rc == 0, err
    assert "simulated step" in out and "column fprop" in out and "row wgrad" in out


def test_xcheck_without_a_gpu_says_so_and_fails(capsys):
    rc, out, err = run_cli(capsys, "xcheck", *XSMALL)
    if rc == 0:
        pytest.skip("a usable GPU is present: the cross-check ran")
    assert rc == 1
    assert "no usable GPU" in err


def test_xcheck_forwards_only_its_own_unknown_options(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--no-such-option"])
    assert e.value.code == 2


def test_backends_prints_the_registry(capsys, tmp_path):
    rc, out, _ = run_cli(capsys, "backends")
    assert rc == 0 and all(b["name"] in out and b["summary"] in out for b in cs.backend_info())
    rc, out, _ = run_cli(capsys, "backends", "--json", "-")
    assert rc == 0 and json.loads(out)["backends"] == cs.backend_info()


def test_run_cubes_places_the_ranks(capsys):
    rc, out, err = run_cli(capsys, "run", "--json", "-", "--topology", "h200x8", "--cubes", "4,6", "--timing-only",
                           *SMALL)
    assert rc == 0, err
    d = json.loads(out)
    assert d["tp"] == 2 and d["cubes"] == [4, 6]  # --tp defaults to the number of cubes
    assert [c["cube"] for c in d["hardware"]["cubes"]] == [4, 6]
    assert all(c["pe_mac"] > 0 for c in d["hardware"]["cubes"])
    busy = {u["name"] for u in d["usage"]}
    assert {"link c4->sw", "link sw->c6", "switch.port c4->sw", "switch.port sw->c6"} <= busy
    assert not any(n.startswith(f"cube{c}.") for n in busy for c in (0, 1, 2, 3, 5, 7))
    assert d["hardware"]["switch_ports"]["active"] == 4
    rc, out, err = run_cli(capsys, "run", "--topology", "h200x8", "--tp", "2", "--cubes", "4,6", "--timing-only",
                           *SMALL)
    assert rc == 0, err
    assert "tp 2: ranks 0-1 on cubes 4, 6" in out and "switch ports: 4 of 4 port groups" in out
    rc, out, _ = run_cli(capsys, "run", "--topology", "h200x8", "--cubes", "6,1", "--timing-only", *SMALL)
    assert rc == 0 and "ranks 0-1 on cubes 6,1 (rank r on the r-th)" in out
    # The default placement is cubes 0 to tp-1, and naming them gives the same run.
    rc, a, _ = run_cli(capsys, "run", "--json", "-", "--topology", "h200x8", "--tp", "4", "--timing-only", *SMALL)
    rc2, b, _ = run_cli(capsys, "run", "--json", "-", "--topology", "h200x8", "--cubes", "0-3", "--timing-only", *SMALL)
    a, b = json.loads(a), json.loads(b)
    assert rc == rc2 == 0 and a["cubes"] == b["cubes"] == [0, 1, 2, 3]
    assert a["sim_time_ps"] == b["sim_time_ps"] and a["event_hash"] == b["event_hash"]


def test_parse_cubes():
    assert cli.parse_cubes("0-3", 8, "t") == [0, 1, 2, 3]
    assert cli.parse_cubes("0,2,5-7", 8, "t") == [0, 2, 5, 6, 7]
    assert cli.parse_cubes("3,1", 8, "t") == [3, 1]
    assert cli.parse_cubes(" 4 , 6 ", 8, "t") == [4, 6]


def test_run_cubes_errors_exit_2(capsys):
    def err_of(*argv):
        rc, _, err = run_cli(capsys, "run", "--topology", "h200x8", "--timing-only", *argv, *SMALL)
        assert rc == 2, err
        return err

    assert "--cubes 0,0: cube 0 is named twice; each rank needs a cube of its own (topology 'h200x8' has cubes " \
           "0-7)" in err_of("--cubes", "0,0")
    assert "--cubes 0-2,1: cube 1 is named twice" in err_of("--cubes", "0-2,1")
    assert "--cubes 6-8: cube 8 does not exist; topology 'h200x8' has cubes 0-7" in err_of("--cubes", "6-8")
    assert "--cubes 3-1: the range 3-1 runs backwards; write it low-high (1-3)" in err_of("--cubes", "3-1")
    for bad in ("a", "1-", "-1", "1,,2", "1-2-3", ""):
        assert f"--cubes {bad}: " in err_of("--cubes", bad) and "e.g. --cubes 0-3 or --cubes 0,2,5-7" in \
            err_of("--cubes", bad), bad
    assert "--cubes 4,6 names 2 cubes for --tp 4: give one cube per rank" in err_of("--cubes", "4,6", "--tp", "4")
    assert "--cubes 0-2 names 3 cubes, one per rank, but tp 3 does not divide ffn 256; valid tp values here: 1, 2, " \
           "4, 8 (name that many cubes)" in err_of("--cubes", "0-2")
    rc, _, err = run_cli(capsys, "run", "--backend", "host", "--cubes", "0-1", *SMALL)
    assert rc == 2 and "--cubes places the ranks on cubes of a topology: it needs --backend sim" in err


def test_topo_show_names_the_switch_and_its_ports(capsys):
    rc, out, _ = run_cli(capsys, "topo", "show", "h200x8")
    assert rc == 0
    assert "switch    latency 300 ns; 18 striped links per cube" in out
    assert "ports of 25 GB/s, one per link (450 GB/s per cube and direction)" in out
    rc, out, _ = run_cli(capsys, "topo", "show", "dgx_h100x8")
    assert rc == 0 and "switch    latency 300 ns" in out and "ports" not in out.split("switch    ")[1].split("\n")[0]


# ---- bad flags are refused before any work (issue 13) ----------------------------------------------


@pytest.mark.parametrize("flag,value,msg", [("--seed", "-1", "give a seed from 0 to 2^64-1"),
                                            ("--data-seed", str(2**64), "give a seed from 0 to 2^64-1"),
                                            ("--hidden", "0", "give a size from 1 to 2^40"),
                                            ("--tokens", "12x", "is not an integer")])
def test_run_refuses_out_of_range_integers_with_exit_2(capsys, flag, value, msg):
    with pytest.raises(SystemExit) as e:
        cli.main(["run", flag, value, *SMALL])
    _, err = capsys.readouterr()
    assert e.value.code == 2
    assert f"argument {flag}" in err and msg in err and "Traceback" not in err


@pytest.mark.parametrize("flag", ["--trace", "--json"])
def test_run_refuses_an_unwritable_output_path_before_running(capsys, tmp_path, flag):
    for bad, why in [(tmp_path / "missing" / "x.json", "does not exist"), (tmp_path, "that is a directory")]:
        rc, out, err = run_cli(capsys, "run", *SMALL, flag, str(bad))
        assert rc == 2, err
        assert f"{flag} {bad}" in err and why in err
        assert "simulated time" not in out and "check:" not in out  # nothing ran


def test_run_flow_level_timing(capsys, tmp_path):
    path = tmp_path / "flow.json"
    rc, out, err = run_cli(capsys, "run", "--topology", "ring4", "--tp", "4", "--timing-only", "--timing", "flow",
                           "--json", str(path), *SMALL)
    assert rc == 0, err
    assert "flow-level transfers" in out
    d = json.loads(path.read_text())
    assert d["timing"] == "flow" and d["timing_only"] and d["sim_time_ps"] > 0
    rc, out, err = run_cli(capsys, "run", "--topology", "ring4", "--tp", "4", "--timing", "flow", *SMALL)
    assert rc == 2 and "--timing flow needs --timing-only" in err and "cannot give the values" in err
