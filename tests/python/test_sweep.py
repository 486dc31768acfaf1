"""cubesim sweep: spec expansion, executors (thread, process, MPI), the SQLite results, resume after
SIGKILL, crash and timeout isolation, report, export, plot, and the refusals of bad input."""
import csv
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cubesim as cs
from cubesim import sweep
from cubesim.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "sweeps"
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def coll_spec(n_bw=4, seed=5, **extra):
    """A small collective sweep on ring4: random link bandwidths x two algorithms x two sizes."""
    spec = {
        "job": "collective",
        "base": {"topology": "ring4", "run": {"collective": "all_reduce", "dtype": "bf16"}},
        "axes": [
            {"path": "topology.network.link.bandwidth_GBps", "random": {"loguniform": [16, 512], "n": n_bw, "seed": seed}},
            {"path": "run.algorithm", "values": ["ring", "direct"]},
            {"path": "run.bytes", "log": {"from": 65536, "to": 262144, "factor": 4}},
        ],
    }
    spec.update(extra)
    return spec


_FLAKY = {}


def _flaky(config):
    """run_case, but one case segfaults, one raises and one hangs (the process executor sends this
    function to its forked workers by name)."""
    h = sweep.Case(0, {}, config).hash
    if h == _FLAKY["crash"]:
        os.kill(os.getpid(), signal.SIGSEGV)
    if h == _FLAKY["fail"]:
        raise ValueError("a case's own error")
    if h == _FLAKY["hang"]:
        time.sleep(60)
    return _FLAKY["real"](config)


def metrics_by_hash(rows):
    return {r["hash"]: (r["status"], r["metrics"]) for r in rows}


# ---- spec expansion ------------------------------------------------------------------------------


def test_axes_expand_in_a_fixed_order_with_zip_range_log_filters_and_sample():
    spec = {
        "job": "mlp",
        "base": {"topology": "mesh4x4", "run": {"hidden": 256}},
        "axes": [
            {"path": "run.tp", "range": {"from": 1, "to": 4, "step": 1}},
            {"path": "run.tokens", "log": {"from": 64, "to": 512, "factor": 2}},
            {"zip": [{"path": "run.ffn", "values": [1024, 2048]}, {"path": "run.dtype", "values": ["bf16", "f32"]}]},
        ],
        "filters": ["run.ffn % run.tp == 0 and not (run.tp == 3)"],
    }
    p = sweep.plan(spec)
    assert p.total == 4 * 4 * 2
    assert len(p.cases) == 3 * 4 * 2  # tp 3 filtered out
    assert [c.params["run.tp"] for c in p.cases[:8]] == [1] * 8
    assert [c.params["run.tokens"] for c in p.cases[:8:2]] == [64, 128, 256, 512]
    pairs = {(c.params["run.ffn"], c.params["run.dtype"]) for c in p.cases}
    assert pairs == {(1024, "bf16"), (2048, "f32")}  # zipped: varied together, not crossed
    assert all(c.invalid is None for c in p.cases)
    assert len({c.hash for c in p.cases}) == len(p.cases)
    # a seeded sample is a reproducible subset, in case order
    spec["sample"] = {"n": 7, "seed": 3}
    a, b = sweep.plan(spec), sweep.plan(spec)
    assert [c.index for c in a.cases] == [c.index for c in b.cases]
    assert len(a.cases) == 7 and [c.index for c in a.cases] == sorted(c.index for c in a.cases)
    spec["sample"]["seed"] = 4
    assert [c.index for c in sweep.plan(spec).cases] != [c.index for c in a.cases]


def test_random_axes_are_seeded_and_in_range():
    a = sweep.plan(coll_spec(n_bw=5, seed=9))
    b = sweep.plan(coll_spec(n_bw=5, seed=9))
    c = sweep.plan(coll_spec(n_bw=5, seed=10))
    bw = lambda p: sorted({x.params["topology.network.link.bandwidth_GBps"] for x in p.cases})
    assert bw(a) == bw(b) and bw(a) != bw(c)
    assert all(16 <= v <= 512 for v in bw(a)) and len(bw(a)) == 5
    # a case's config carries every job option (defaults filled) and the overrides it applies
    cfg = a.cases[0].config
    assert set(cfg["run"]) == set(sweep.JOB_OPTIONS["collective"])
    assert cfg["set"]["network.link.bandwidth_GBps"] == a.cases[0].params["topology.network.link.bandwidth_GBps"]


@pytest.mark.parametrize("mutate, needle", [
    (lambda s: s["axes"].append({"path": "run.bogus", "values": [1]}), "not an option of job 'collective'"),
    (lambda s: s["axes"].append({"path": "hbm.bandwidth", "values": [1]}), "start it with 'topology.'"),
    (lambda s: s["axes"].append({"path": "run.seed", "values": []}), "non-empty list"),
    (lambda s: s["axes"].append({"path": "run.seed", "range": {"from": 5, "to": 1}}), "below 'from'"),
    (lambda s: s["axes"].append({"path": "run.seed", "random": {"uniform": [0, 1], "n": 2}}), "seed"),
    (lambda s: s.update(filters=["run.bytes > 10**12"]), "no cases"),
    (lambda s: s.update(filters=["__import__('os')"]), "Call"),
    (lambda s: s.update(filters=["run.nothing > 1"]), "names 'run.nothing'"),
    (lambda s: s.update(job="train"), "not a job"),
    (lambda s: s.update(axes=[]), "non-empty list of axes"),
    (lambda s: s["axes"].append({"path": "run.seed", "range": {"from": 1, "to": 1e9}}), "at most 1000000"),
    (lambda s: s["axes"].append({"path": "run.seed", "range": {"from": -1e308, "to": 1e308, "step": 5e-324}}),
     "at most 1000000"),
    (lambda s: s["axes"].extend({"path": p, "range": {"from": 1, "to": 200}}
                                for p in ("run.seed", "run.ranks", "topology.network.link.latency_ns")), "product is"),
    (lambda s: s["axes"].append({"path": "run.seed", "values": [float("nan")]}), "not a finite number"),
    (lambda s: s["axes"].append({"path": "run.seed", "values": [[float("inf")]]}), "finite numbers only"),
    (lambda s: s["base"]["run"].update(seed=float("nan")), "finite numbers only"),
    (lambda s: s.update(filters=["9**9**9 > 1"]), "256-bit"),
    (lambda s: s.update(filters=["[1] * 10**9 == 1"]), "numbers of at most 256 bits"),
    (lambda s: s.update(filters=[1]), "as a string"),
    (lambda s: s.update(timeout_s=float("inf")), "timeout_s"),
    (lambda s: s.update(timeout_s=0), "timeout_s"),
    (lambda s: s.update(extra=1), "unknown key"),
    (lambda s: s["axes"].append({"zip": [{"path": "run.seed", "values": [1, 2]},
                                         {"path": "run.dtype", "values": ["f32"]}]}), "different lengths"),
])
def test_bad_specs_are_refused_naming_the_place(mutate, needle):
    spec = coll_spec()
    mutate(spec)
    with pytest.raises(sweep.SpecError, match=None) as e:
        sweep.plan(spec)
    assert needle in str(e.value)


def test_wrongly_typed_run_options_are_invalid_cases_with_the_reason():
    spec = coll_spec(n_bw=1)
    spec["axes"].append({"path": "run.timing_only", "values": ["false", True]})
    spec["axes"].append({"path": "run.seed", "values": [1.5, 3]})
    p = sweep.plan(spec)
    reasons = {c.invalid for c in p.invalid}
    assert len(p.invalid) == 3 * len(p.cases) // 4
    assert any('run.timing_only "false": give true or false' in r for r in reasons)
    assert any("run.seed 1.5: give an integer from 0 to" in r for r in reasons)


def test_cases_that_cannot_run_are_reported_before_anything_runs(tmp_path):
    spec = coll_spec(n_bw=1)
    spec["axes"].append({"path": "run.ranks", "values": [2, 8]})  # ring4 has 4 cubes
    spec["axes"].append({"path": "topology.network.link.latency_nss", "values": [100]})  # a typo: said once
    with pytest.raises(sweep.SpecError, match="axis path 'topology.network.link.latency_nss'.*did you mean 'latency_ns'"):
        sweep.plan(spec)
    spec["axes"].pop()
    spec["axes"].append({"path": "topology.network.link.latency_ns", "values": [100, -5]})  # a bad value: per case
    p = sweep.plan(spec)
    neg = [c for c in p.cases if c.params["topology.network.link.latency_ns"] == -5]
    assert len(neg) == len(p.cases) // 2 and all(c.invalid and "latency_ns" in c.invalid for c in neg)
    spec["axes"].pop()
    p = sweep.plan(spec)
    bad = p.invalid
    assert len(bad) == len(p.cases) // 2 and all("ring4" in c.invalid and "4 cubes" in c.invalid for c in bad)
    db = tmp_path / "r.db"
    with pytest.raises(sweep.SpecError, match="cannot run"):
        sweep.run(spec, db, executor="thread", jobs=1)
    assert not db.exists() or sweep.load(db) == []  # nothing ran
    rows = sweep.run(spec, db, executor="thread", jobs=2, skip_invalid=True)
    assert sorted({r["status"] for r in rows}) == ["invalid", "ok"]
    assert sum(r["status"] == "invalid" for r in rows) == len(bad)


# ---- running -------------------------------------------------------------------------------------


def test_thread_and_process_executors_give_the_same_rows(tmp_path):
    spec = coll_spec(n_bw=3)
    a = sweep.run(spec, tmp_path / "t.db", executor="thread", jobs=2)
    b = sweep.run(spec, tmp_path / "p.db", executor="process", jobs=2)
    assert [r["case"] for r in a] == [r["case"] for r in b] == sorted(r["case"] for r in a)
    assert metrics_by_hash(a) == metrics_by_hash(b)
    assert all(r["status"] == "ok" for r in a)
    # the metrics are the simulator's: the same case run directly gives them
    r0 = a[0]
    direct = sweep.run_case(r0["config"])["metrics"]
    assert direct == r0["metrics"]
    # and they respond to the axes: faster links, shorter all-reduce (same algorithm and size)
    by = {}
    for r in a:
        key = (r["params"]["run.algorithm"], r["params"]["run.bytes"])
        by.setdefault(key, []).append((r["params"]["topology.network.link.bandwidth_GBps"], r["metrics"]["sim_time_ps"]))
    for pts in by.values():
        pts.sort()
        assert all(t1 >= t2 for (_, t1), (_, t2) in zip(pts, pts[1:])), pts
        assert pts[0][1] > pts[-1][1]


def test_mlp_cases_agree_with_run_mlp_and_functional_cases_check(tmp_path):
    spec = {"job": "mlp", "base": {"topology": "ring4", "run": {"hidden": 128, "ffn": 512, "tokens": 32}},
            "axes": [{"path": "run.tp", "values": [2, 4]}, {"path": "run.timing_only", "values": [True, False]}]}
    rows = sweep.run(spec, tmp_path / "m.db", executor="thread", jobs=2)
    assert all(r["status"] == "ok" for r in rows)
    for r in rows:
        ctx = cs.Context("sim", topology="ring4", timing_only=True, world_size=r["params"]["run.tp"])
        rep = cs.tp.run_mlp(ctx, tp=r["params"]["run.tp"], tokens=32, hidden=128, ffn=512)
        assert r["metrics"]["sim_time_ps"] == rep.sim_time_ps
        if not r["params"]["run.timing_only"]:
            assert r["metrics"]["check_pass"] is True


def test_failed_crashed_and_timed_out_cases_are_recorded_and_the_others_finish(tmp_path, monkeypatch):
    spec = coll_spec(n_bw=2)
    p = sweep.plan(spec)
    crash, fail = p.cases[1].hash, p.cases[2].hash
    hang = p.cases[3].hash
    real = sweep.run_case
    _FLAKY.update(crash=crash, fail=fail, hang=hang, real=real)
    monkeypatch.setattr(sweep, "run_case", _flaky)  # the forked workers inherit it
    t0 = time.monotonic()
    rows = sweep.run(spec, tmp_path / "f.db", executor="process", jobs=2, timeout=2)
    assert time.monotonic() - t0 < 30
    status = {r["hash"]: r for r in rows}
    assert status[crash]["status"] == "crashed" and "SIGSEGV" in status[crash]["error"]
    assert status[fail]["status"] == "failed" and "ValueError: a case's own error" in status[fail]["error"]
    assert status[hang]["status"] == "timeout" and "timed out after 2 s" in status[hang]["error"]
    others = [r for r in rows if r["hash"] not in (crash, fail, hang)]
    assert len(others) == len(p.cases) - 3 and all(r["status"] == "ok" for r in others)
    # --resume --retry-failed runs exactly those three again (now healthy)
    monkeypatch.setattr(sweep, "run_case", real)
    rows2 = sweep.run(spec, tmp_path / "f.db", executor="process", jobs=2, resume=True, retry_failed=True)
    assert all(r["status"] == "ok" for r in rows2) and len(rows2) == len(p.cases)


def test_a_crash_a_failure_and_a_hang_among_a_hundred_process_cases(tmp_path, monkeypatch):
    # 100 cases on 2 workers, two calls queued in each: a crash, a failure and a hang among them are
    # each recorded once, and every other case runs to the thread executor's results.
    spec = coll_spec(n_bw=25)
    p = sweep.plan(spec)
    crash, fail, hang = p.cases[11].hash, p.cases[20].hash, p.cases[29].hash
    real = sweep.run_case
    _FLAKY.update(crash=crash, fail=fail, hang=hang, real=real)
    monkeypatch.setattr(sweep, "run_case", _flaky)
    rows = sweep.run(spec, tmp_path / "c.db", executor="process", jobs=2, timeout=2)
    assert len(rows) == 100 and len({r["hash"] for r in rows}) == 100
    status = {r["hash"]: r for r in rows}
    assert status[crash]["status"] == "crashed" and "SIGSEGV" in status[crash]["error"]
    assert status[fail]["status"] == "failed" and "ValueError: a case's own error" in status[fail]["error"]
    assert status[hang]["status"] == "timeout" and "timed out after 2 s" in status[hang]["error"]
    monkeypatch.setattr(sweep, "run_case", real)
    ref = sweep.run(spec, tmp_path / "t.db", executor="thread", jobs=2)
    ok = {h: m for h, m in metrics_by_hash(rows).items() if h not in (crash, fail, hang)}
    assert ok == {h: m for h, m in metrics_by_hash(ref).items() if h in ok} and all(s == "ok" for s, _ in ok.values())


def _slow(config):
    time.sleep(0.2)
    return _FLAKY["real"](config)


def test_the_process_executors_timeout_is_per_case_not_per_batch(tmp_path, monkeypatch):
    spec = coll_spec(n_bw=2)  # 8 cases of 0.2 s on 1 worker, two queued at a time, a 0.3 s timeout
    _FLAKY.update(real=sweep.run_case)
    monkeypatch.setattr(sweep, "run_case", _slow)
    rows = sweep.run(spec, tmp_path / "s.db", executor="process", jobs=1, timeout=0.3)
    assert len(rows) == 8 and all(r["status"] == "ok" for r in rows)


def test_the_process_executor_shuts_down_twice_and_leaks_no_descriptor():
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        ex = sweep.ProcessExecutor(2)
        assert ex.submit(pow, 2, 10).result() == 1024
        ex.shutdown()
        ex.shutdown()  # the Executor contract: a second call is harmless
        with pytest.raises(RuntimeError, match="after shutdown"):
            ex.submit(pow, 2, 3)
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_failed_fork_fails_the_call_instead_of_hanging(monkeypatch):
    def no_fork(self):
        raise OSError("fork: Resource temporarily unavailable")

    monkeypatch.setattr(sweep._Isolated, "start", no_fork)
    monkeypatch.setattr(sweep.threading, "excepthook", lambda args: None)  # the serving thread's end
    ex = sweep.ProcessExecutor(1)
    f = ex.submit(pow, 2, 3)
    with pytest.raises(OSError, match="Resource temporarily unavailable"):
        f.result(timeout=30)
    ex.shutdown()


def test_the_thread_executor_records_a_timeout_and_goes_on_without_waiting(tmp_path):
    # case 0 takes ~6 s (it cannot be stopped in a thread and runs on); case 1 a few milliseconds
    spec = {"job": "mlp", "base": {"topology": "torus8x8"},
            "axes": [{"zip": [{"path": "run.tp", "values": [64, 2]}, {"path": "run.hidden", "values": [4096, 64]},
                              {"path": "run.ffn", "values": [16384, 256]}, {"path": "run.tokens", "values": [4096, 32]}]}],
            "timeout_s": 0.3}
    t0 = time.monotonic()
    rows = sweep.run(spec, tmp_path / "t.db", executor="thread", jobs=1)
    assert time.monotonic() - t0 < 4  # it did not wait for the long case (0.3 s timeout + a small case)
    assert rows[0]["status"] == "timeout" and "runs on in its thread" in rows[0]["error"]
    assert rows.abandoned == 1
    assert rows[1]["params"]["run.tp"] == 2 and rows[1]["status"] == "ok"


def test_a_real_case_past_its_timeout_is_killed(tmp_path):
    spec = {"job": "mlp", "base": {"topology": "torus8x8", "run": {"hidden": 8192, "ffn": 65536, "tokens": 8192}},
            "axes": [{"path": "run.tp", "values": [64]}], "timeout_s": 0.5}
    rows = sweep.run(spec, tmp_path / "t.db", executor="process", jobs=1)
    assert rows[0]["status"] == "timeout"


def test_a_sweep_killed_with_sigkill_resumes_to_the_same_results(tmp_path, rng):
    # Timing-only MLP steps, a few ms each: 360 of them on 2 workers give the poll below about a second
    # to catch the sweep mid-run (120 finished within one poll on an idle machine).
    spec = sweep.bench_spec(360)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    full = sweep.run(spec, tmp_path / "full.db", executor="process", jobs=2)
    n = len(full)
    db = tmp_path / "killed.db"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-m", "cubesim", "sweep", "run", str(spec_path), "--db", str(db),
                             "--jobs", "2"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    done = 0
    kill_at = int(rng.integers(5, n // 3))  # a random moment
    while time.monotonic() < deadline:
        if db.exists():
            try:
                # Never wait behind the sweep's writes (a locked database: poll again).
                with sqlite3.connect(db, timeout=0.01) as c:
                    done = c.execute("SELECT COUNT(*) FROM cases").fetchone()[0]
            except sqlite3.OperationalError:
                done = 0
        if done >= kill_at:
            break
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its workers, mid-run
    proc.wait()
    partial = sweep.load(db)
    assert kill_at <= len(partial) < n, (kill_at, len(partial), n)
    rows = sweep.run(spec_path, db, executor="process", jobs=2, resume=True)
    assert len(rows) == n and len({r["hash"] for r in rows}) == n  # every case exactly once
    assert metrics_by_hash(rows) == metrics_by_hash(full)  # bitwise the uninterrupted results
    for r in partial:  # rows written before the kill were kept, not re-run
        assert next(x for x in rows if x["hash"] == r["hash"])["finished_at"] == r["finished_at"]


def test_resume_refuses_another_specs_database_and_existing_db_needs_resume(tmp_path):
    db = tmp_path / "a.db"
    sweep.run(coll_spec(n_bw=1), db, executor="thread", jobs=1)
    with pytest.raises(sweep.SpecError, match="add --resume"):
        sweep.run(coll_spec(n_bw=1), db, executor="thread", jobs=1)
    other = coll_spec(n_bw=2)
    with pytest.raises(sweep.SpecError) as e:
        sweep.run(other, db, executor="thread", jobs=1, resume=True)
    assert sweep.plan(coll_spec(n_bw=1)).hash in str(e.value) and sweep.plan(other).hash in str(e.value)
    # resuming a complete sweep runs nothing and keeps the rows
    before = sweep.load(db)
    assert sweep.run(coll_spec(n_bw=1), db, executor="thread", jobs=1, resume=True) == before
    with pytest.raises(sweep.SpecError, match="does not exist"):
        sweep.run(coll_spec(n_bw=1), tmp_path / "no" / "x.db")
    with pytest.raises(sweep.SpecError, match="directory"):
        sweep.run(coll_spec(n_bw=1), tmp_path)


def test_unknown_executor_and_bad_jobs_are_refused_before_anything(tmp_path):
    with pytest.raises(sweep.SpecError, match="give one of thread, process, mpi"):
        sweep.run(coll_spec(n_bw=1), tmp_path / "x.db", executor="fibers")
    with pytest.raises(sweep.SpecError, match="--jobs 0"):
        sweep.run(coll_spec(n_bw=1), tmp_path / "x.db", jobs=0)
    assert not (tmp_path / "x.db").exists()


def test_mpi_executor_missing_names_the_install_line(monkeypatch, tmp_path):
    monkeypatch.setattr(sweep, "mpi_available", lambda: False)
    with pytest.raises(sweep.SpecError, match="apt-get install openmpi-bin python3-mpi4py"):
        sweep.run(coll_spec(n_bw=1), tmp_path / "m.db", executor="mpi")


@pytest.mark.skipif(shutil.which("mpirun") is None or not sweep.mpi_available(),
                    reason="Open MPI and mpi4py are not installed (scripts/install-deps.sh installs them)")
def test_mpi_sweep_under_mpirun_gives_the_same_rows(tmp_path):
    spec = coll_spec(n_bw=3)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **MPI_ENV)
    r = subprocess.run(["mpirun", "--oversubscribe", "-np", "2", sys.executable, "-m", "cubesim", "sweep", "run",
                        str(spec_path), "--db", str(tmp_path / "mpi.db"), "--executor", "mpi"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sweep done" in r.stdout and r.stdout.count("sweep done") == 1  # only rank 0 reports
    mpi = sweep.load(tmp_path / "mpi.db")
    local = sweep.run(spec, tmp_path / "local.db", executor="thread", jobs=2)
    assert metrics_by_hash(mpi) == metrics_by_hash(local)
    # a bad spec under mpirun: rank 0 says why and the workers are released (no hang)
    spec["axes"].append({"path": "run.tpp", "values": [1]})
    spec_path.write_text(json.dumps(spec))
    r = subprocess.run(["mpirun", "--oversubscribe", "-np", "2", sys.executable, "-m", "cubesim", "sweep", "run",
                        str(spec_path), "--db", str(tmp_path / "bad.db"), "--executor", "mpi"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "'tpp' is not an option of job 'collective'" in r.stderr


def test_a_hundred_case_sweep(tmp_path):
    spec = coll_spec(n_bw=25)
    rows = sweep.run(spec, tmp_path / "h.db", executor="process", jobs=2)
    assert len(rows) == 100 and all(r["status"] == "ok" for r in rows)


def test_the_executor_overhead_bench_runs_every_synthetic_case_and_restores_run_case(tmp_path):
    real = sweep.run_case
    row = sweep.executor_overhead(cases=48, jobs=4, hold_ms=0.05, free_ms=1.0, tmpdir=tmp_path)
    assert sweep.run_case is real
    assert row["executor"] == "thread (synthetic)" and row["workers"] == 4 and row["cases"] == 48
    assert row["ok"] == 48 and row["cases_per_s"] > 0 and row["efficiency"] > 0


# ---- looking at results --------------------------------------------------------------------------


def test_report_flags_an_axis_that_changes_no_metric(tmp_path, capsys):
    spec = coll_spec(n_bw=2)
    spec["axes"].append({"path": "run.seed", "values": [1, 2]})  # timing-only: the data seed moves nothing
    db = tmp_path / "s.db"
    sweep.run(spec, db, executor="thread", jobs=2)
    sens = {s["axis"]: s for s in sweep.sensitivity(sweep.load(db), sweep.plan(spec).axes)}
    assert sens["run.seed"]["changes"] == [] and sens["run.seed"]["groups"] > 0
    assert "sim_time_ps" in sens["run.bytes"]["changes"] and sens["run.bytes"]["spread"]["sim_time_ps"] > 1.5
    assert "sim_time_ps" in sens["topology.network.link.bandwidth_GBps"]["changes"]
    assert main(["sweep", "report", str(db), "--json", str(tmp_path / "rep.json")]) == 0
    out = capsys.readouterr().out
    assert "run.seed changes no metric" in out
    assert json.loads((tmp_path / "rep.json").read_text())["ignored_axes"] == ["run.seed"]


def test_a_zip_axis_is_judged_as_one(tmp_path):
    spec = coll_spec(n_bw=2)
    spec["axes"].append({"zip": [{"path": "run.seed", "values": [1, 2]},
                                 {"path": "topology.network.link.latency_ns", "values": [100, 5000]}]})
    db = tmp_path / "z.db"
    sweep.run(spec, db, executor="thread", jobs=2)
    p = sweep.plan(spec)
    sens = {s["axis"]: s for s in sweep.sensitivity(sweep.load(db), p.groups)}
    z = sens["run.seed+topology.network.link.latency_ns"]
    assert z["groups"] > 0 and z["values"] == [[1, 100], [2, 5000]]
    assert "sim_time_ps" in z["changes"] and z["spread"]["sim_time_ps"] > 1.0


def test_read_only_commands_refuse_a_file_that_is_not_a_sweep_database(tmp_path):
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE cases (x INTEGER)")
    before = other.read_bytes()
    for argv in (["sweep", "report", str(other)], ["sweep", "export", str(other), "--csv", str(tmp_path / "x.csv")]):
        assert main(argv) == 2
    assert other.read_bytes() == before
    with pytest.raises(sweep.SpecError, match="not a sweep database"):
        sweep.run(coll_spec(n_bw=1), other, executor="thread", overwrite=True)
    assert other.read_bytes() == before
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    assert main(["sweep", "report", str(empty)]) == 2 and empty.read_bytes() == b""


def test_several_mpi_ranks_without_the_mpi_executor_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    with pytest.raises(sweep.SpecError, match="give --executor mpi"):
        sweep.run(coll_spec(n_bw=1), tmp_path / "x.db", executor="process")


def test_export_csv_and_json_and_plot(tmp_path):
    spec = coll_spec(n_bw=2)
    db = tmp_path / "e.db"
    sweep.run(spec, db, executor="thread", jobs=2)
    assert main(["sweep", "export", str(db), "--csv", str(tmp_path / "r.csv"), "--json", str(tmp_path / "r.json")]) == 0
    with open(tmp_path / "r.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8
    assert {"case", "hash", "status", "run.bytes", "sim_time_ps", "busbw_GBps", "wall_s"} <= set(rows[0])
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["spec_hash"] == sweep.plan(spec).hash and len(doc["cases"]) == 8
    pytest.importorskip("matplotlib")
    for ext in ("png", "svg"):
        out = tmp_path / f"p.{ext}"
        assert main(["sweep", "plot", str(db), "--x", "topology.network.link.bandwidth_GBps", "--y", "busbw_GBps",
                     "--hue", "run.algorithm", "--facet", "run.bytes", "--out", str(out), "--logx"]) == 0
        assert out.stat().st_size > 1000
    assert main(["sweep", "plot", str(db), "--x", "run.nope", "--y", "busbw_GBps", "--out", str(out)]) == 2


def test_cli_plan_and_run_exit_codes(tmp_path, capsys):
    assert main(["sweep", "plan", str(EXAMPLES / "mlp_mesh4x4.json"), "--show", "2"]) == 0
    out = capsys.readouterr().out
    assert "135 cases" in out and "spec hash" in out
    bad = tmp_path / "bad.json"
    bad.write_text('{"job": "mlp", "axes": [ {"path": "run.tp" ')
    assert main(["sweep", "plan", str(bad)]) == 2
    assert "invalid JSON at line 1" in capsys.readouterr().err
    assert main(["sweep", "run", str(bad), "--db", str(tmp_path / "x.db")]) == 2
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(coll_spec(n_bw=1)))
    assert main(["sweep", "run", str(spec), "--db", str(tmp_path / "s.db"), "--executor", "thread"]) == 0
    assert main(["sweep", "run", str(spec), "--db", str(tmp_path / "s.db")]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["sweep", "report", str(tmp_path / "missing.db")]) == 2


@pytest.mark.parametrize("name", ["mlp_mesh4x4.json", "collectives.json", "random_links.yaml"])
def test_example_specs_plan(name):
    if name.endswith(".yaml"):
        pytest.importorskip("yaml")
    p = sweep.plan(EXAMPLES / name)
    assert p.cases and not p.invalid


def test_the_bench_ceiling_reports_failed_processes_instead_of_hanging(monkeypatch):
    # The independent-process ceiling forks workers that run cases; one that fails must end the
    # measurement with an error (it used to leave the parent reading a pipe forever).
    p = sweep.plan(sweep.bench_spec(2))
    assert sweep._independent_rate(p.cases[:1], 2) > 0

    def boom(config):
        raise ValueError("boom")

    monkeypatch.setattr(sweep, "run_case", boom)
    with pytest.raises(RuntimeError, match="2 of 2 processes failed"):
        sweep._independent_rate(p.cases[:1], 2)
