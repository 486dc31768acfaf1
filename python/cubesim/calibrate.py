"""cubesim.calibrate — fit a topology's physical figures to measurements of a real GPU machine.

The measurements come from gpu_measure.py (PyTorch: cuBLAS, NCCL; see its docstring), run on the GPU
machine; the fit runs the simulator itself (timing-only contexts) and adjusts a few physical figures
of the base topology until its predictions match, then writes an overlay topology that `extends` the
base and records every fitted figure, the measurements it came from and the GPU, driver and NCCL
version in its `sources` and `calibration` sections.

The model is small on purpose: each fitted figure is one number of the topology (a bandwidth, a
latency, a clock, a cycle count), never a table of measured times, so predictions hold for shapes
and sizes never measured. Measurements are split by a fixed rule into a calibration set (what the fit
sees) and a held-out set (what the error tables judge): see SPLIT below.

    from cubesim import calibrate
    m = calibrate.load_measurements("calibration/h200_2gpu_2026-11-22.json")
    fit = calibrate.fit(m, base="h200x8")             # {"values", "overlay", "document", "fit_sets"}
    calibrate.write_overlay(fit["overlay"], "topologies/h200x8_calibrated.json")
    rows = calibrate.error_rows(cs.load_topology("h200x8_calibrated"), m)   # measured, simulated, error
    calibrate.summarise(rows)                         # held-out median / geomean / max per kind
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from typing import Callable

import cubesim as cs

MEASURE_SCHEMA = "cubesim.measure/1"


class CalibrationError(ValueError):
    """A measurement file or overlay that cannot be used, with the reason."""


# ---------------------------------------------------------------- measurements


def load_measurements(path):
    """One measurement file, or several joined by commas ("a.json,b.json"): their records together
    (collectives: each keeps the GPU count of its own file, which the split reads; the first file
    gives env and the other sections, NCCL's logs are merged by rank count)."""
    if "," in str(path):
        docs = [load_measurements(p) for p in str(path).split(",") if p]
        doc = dict(docs[0])
        doc["coll"] = [r for d in docs for r in d.get("coll", [])]
        logs = {}
        for d in docs:
            logs.update({str(k): v for k, v in nccl_logs(d).items()})
        doc["nccl_log"] = logs
        doc["_path"] = ",".join(d["_path"] for d in docs)
        return doc
    doc = load_one(path)
    gpus = (doc.get("env") or {}).get("gpus")
    for r in doc.get("coll", []):
        r.setdefault("_gpus", gpus)
    return doc


def files_of(m, unknown="?"):
    """The measurement files of m by name: "a.json" or "a.json, b.json"."""
    path = m.get("_path")
    return ", ".join(os.path.basename(p) for p in str(path).split(",")) if path else unknown


def load_one(path):
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except OSError as e:
        raise CalibrationError(f"measurements {path}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise CalibrationError(f"measurements {path}: not JSON: {e}") from None
    if doc.get("schema") != MEASURE_SCHEMA:
        raise CalibrationError(f"measurements {path}: schema {doc.get('schema')!r}; expected {MEASURE_SCHEMA!r} "
                               "(written by gpu_measure.py / `cubesim calibrate --measure-only`)")
    doc["_path"] = path
    return doc


def coll_time(rec):
    """The device-side time of a collective: the CUDA-graph replay time when measured, else the eager median."""
    return rec.get("graph_time") or rec["time"]


# The split (a fixed rule, not a choice per run): what the fit may see.
#   gemm: the square sweep from 2048, every other point of the M sweep (M = 1, 4, 16, ..., 16384),
#         777^3 and two shapes whose rows are not 16-byte aligned (2- and 4-byte); held out: every MLP shape (tp
#         1/2/4/8, fwd, dgrad, wgrad), the other M-sweep points, the small squares and the other
#         odd shapes.
#   coll: sizes 2^k with k even from 64 KiB to 256 MiB, measured on a machine of as many GPUs as
#         the call's ranks (a 2-GPU file's 2-rank calls, a 4-GPU file's 4-rank calls); held out: odd
#         k, 1 GiB, and calls on fewer ranks than their machine has (the 4-GPU file's 2-rank calls).
#         Only the files the fit is given count: `cubesim calibrate --measurements a.json,b.json`.
#   mlp:  never in the fit.
def in_fit(kind, rec, index=None):
    if kind == "gemm":
        if rec.get("name") == "square":
            return rec["m"] >= 2048
        if rec.get("name") == "m-sweep":
            return index is not None and index % 2 == 0
        return (rec["m"], rec["n"], rec["k"]) in ((777, 777, 777), (4096, 4096, 4095), (1234, 5678, 910))
    if kind == "coll":
        k = int(math.log2(rec["bytes"]))
        return rec.get("_gpus", rec["ranks"]) == rec["ranks"] and k % 2 == 0 and 16 <= k <= 28
    return False


def split(m, kind):
    recs = m.get(kind, [])
    if kind == "gemm":
        msweep = [r for r in recs if r.get("name") == "m-sweep"]
        idx = {id(r): i for i, r in enumerate(msweep)}
        return ([r for r in recs if in_fit(kind, r, idx.get(id(r)))],
                [r for r in recs if not in_fit(kind, r, idx.get(id(r)))])
    return [r for r in recs if in_fit(kind, r)], [r for r in recs if not in_fit(kind, r)]


# ---------------------------------------------------------------- predictions (the simulator)


def topology_of(base, values):
    """The base topology with `values` ({dotted path: value}) set."""
    return cs.load_topology(base, overrides=dict(values)) if values else cs.load_topology(base)


def sim_gemm(topo, m, n, k, ta=False, tb=False, dtype="bf16"):
    """Simulated seconds of C[m,n] = A·B on one cube (timing only); ta/tb: the operand is a transposed view."""
    ctx = cs.Context("sim", topology=topo, world_size=1, timing_only=True)

    def rank_fn(r):
        a = ctx.empty(0, [k, m] if ta else [m, k], dtype)
        b = ctx.empty(0, [n, k] if tb else [k, n], dtype)
        c = ctx.empty(0, [m, n], dtype)
        cs.matmul(a.t() if ta else a, b.t() if tb else b, c)

    return ctx.spawn(rank_fn, nprocs=1).sim_time_ps * 1e-12


def sim_collective(topo, op, ranks, nbytes, algorithm="nccl", dtype="bf16"):
    """Simulated seconds of one collective on `ranks` ranks; bytes as nccl-tests counts them."""
    ctx = cs.Context("sim", topology=topo, world_size=ranks, timing_only=True)
    n = nbytes // 2

    def rank_fn(r):
        if op == "all_reduce":
            cs.all_reduce(ctx.empty(r, [n], dtype), algorithm=algorithm)
        elif op == "all_gather":
            cs.all_gather(ctx.empty(r, [n], dtype), ctx.empty(r, [n // ranks], dtype), algorithm=algorithm)
        elif op == "reduce_scatter":
            cs.reduce_scatter(ctx.empty(r, [n // ranks], dtype), ctx.empty(r, [n], dtype), algorithm=algorithm)
        else:
            raise CalibrationError(f"collective {op!r}: not one of all_reduce, all_gather, reduce_scatter")

    return ctx.spawn(rank_fn).sim_time_ps * 1e-12


def sim_peer(topo, nbytes):
    """Simulated seconds of one GPU's copy of nbytes into another's memory (a send from rank 0 to 1)."""
    ctx = cs.Context("sim", topology=topo, world_size=2, timing_only=True)
    n = max(1, nbytes // 4)

    def rank_fn(r):
        t = ctx.empty(r, [n], "f32")
        if r == 0:
            cs.send(t, dst=1)
        else:
            cs.recv(t, src=0)

    return ctx.spawn(rank_fn).sim_time_ps * 1e-12


# ---------------------------------------------------------------- the fit


@dataclasses.dataclass
class Param:
    """One fitted figure: a dotted topology path, its starting value and its bounds."""
    path: str
    start: float
    lo: float
    hi: float
    what: str  # for the overlay's sources: what the figure is
    integer: bool = False  # a whole number (cycles)
    also: tuple = ()  # further paths that take the same value (one physical figure in several places)

    def value(self, v):
        return int(round(v)) if self.integer else round(v, 6)


@dataclasses.dataclass
class Group:
    """Parameters fitted together against one kind of measurement."""
    name: str
    params: list
    kind: str                               # measurement section: gemm | coll | peer
    predict: Callable                       # (topo, record) -> seconds
    measured: Callable = lambda r: r["time"]


HUBER = 0.15  # residuals (log error) beyond this count linearly, not squared: one odd shape cannot pull the fit


_JOB = None  # the function parallel_map's forked workers run (set before the pool forks)


def _run_job(arg):
    return _JOB(arg)


def default_jobs():
    """Worker processes for the fit: CUBESIM_CALIBRATE_JOBS, else one per CPU."""
    try:
        return max(1, int(os.environ.get("CUBESIM_CALIBRATE_JOBS", "") or os.cpu_count() or 1))
    except ValueError:
        raise CalibrationError(f"CUBESIM_CALIBRATE_JOBS={os.environ['CUBESIM_CALIBRATE_JOBS']!r}: give a number of "
                               "processes >= 1") from None


def parallel_map(fn, args, jobs):
    """[fn(a) for a in args], in up to `jobs` forked processes (each simulation is independent and
    deterministic, so the results are the same as in one process)."""
    global _JOB
    if jobs <= 1 or len(args) <= 1:
        return [fn(a) for a in args]
    import multiprocessing
    _JOB = fn
    try:
        with multiprocessing.get_context("fork").Pool(min(jobs, len(args))) as pool:
            return pool.map(_run_job, args)
    finally:
        _JOB = None


def fit_group(base, fixed, group, records, log=print, iterations=6, jobs=1):
    """Levenberg–Marquardt on log(simulated / measured) over `records`, parameters in log space, with
    Huber weights (iteratively reweighted: a residual r beyond HUBER weighs HUBER / |r|). The
    Jacobian's columns are simulated in up to `jobs` processes."""
    names = [p.path for p in group.params]
    x = [math.log(p.start) for p in group.params]
    lo = [math.log(p.lo) for p in group.params]
    hi = [math.log(p.hi) for p in group.params]

    def residuals(xv):
        vals = dict(fixed)
        vals.update(param_values(group.params, xv))
        topo = topology_of(base, vals)
        return [math.log(group.predict(topo, r) / group.measured(r)) for r in records]

    def cost(res):
        return sum(e * e if abs(e) <= HUBER else HUBER * (2 * abs(e) - HUBER) for e in res)

    res = residuals(x)
    lam = 1e-2
    for it in range(iterations):
        h = 0.03
        points, steps = [], []
        for j in range(len(x)):
            xp = list(x)
            xp[j] = min(hi[j], x[j] + h)
            step = xp[j] - x[j]
            if step == 0:
                xp[j] = x[j] - h
                step = -h
            points.append(xp)
            steps.append(step)
        J = [[(a - b) / step for a, b in zip(rp, res)]
             for rp, step in zip(parallel_map(residuals, points, jobs), steps)]
        # Normal equations (J^T W J + lam diag) dx = -J^T W r, with J stored column-wise.
        n = len(x)
        w = [1.0 if abs(e) <= HUBER else HUBER / abs(e) for e in res]
        A = [[sum(w[k] * J[i][k] * J[j][k] for k in range(len(res))) for j in range(n)] for i in range(n)]
        g = [sum(w[k] * J[i][k] * res[k] for k in range(len(res))) for i in range(n)]
        improved = False
        for _ in range(6):
            M = [[A[i][j] + (lam * (A[i][i] + 1e-9) if i == j else 0.0) for j in range(n)] for i in range(n)]
            dx = solve(M, [-v for v in g])
            xn = [min(hi[i], max(lo[i], x[i] + dx[i])) for i in range(n)]
            rn = residuals(xn)
            if cost(rn) < cost(res):
                x, res, lam, improved = xn, rn, lam / 3, True
                break
            lam *= 4
        log(f"  {group.name} iteration {it + 1}: rms log error {math.sqrt(sum(e * e for e in res) / len(res)):.4f} "
            + ", ".join(f"{nm.split('.')[-1]}={math.exp(v):.4g}" for nm, v in zip(names, x)))
        if not improved:
            break
    return param_values(group.params, x), res


def param_values(params, xv):
    """{path: value} for parameters at log-values xv, including each parameter's `also` paths."""
    out = {}
    for p, v in zip(params, xv):
        for path in (p.path,) + tuple(p.also):
            out[path] = p.value(math.exp(v))
    return out


def solve(A, b):
    """Gaussian elimination with partial pivoting (n is a handful)."""
    n = len(b)
    M = [row[:] + [b[i]] for i, row in enumerate(A)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(M[r][c]))
        M[c], M[p] = M[p], M[c]
        if abs(M[c][c]) < 1e-300:
            continue
        for r in range(c + 1, n):
            f = M[r][c] / M[c][c]
            for k in range(c, n + 1):
                M[r][k] -= f * M[c][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        s = M[r][n] - sum(M[r][k] * x[k] for k in range(r + 1, n))
        x[r] = s / M[r][r] if abs(M[r][r]) > 1e-300 else 0.0
    return x


# ---------------------------------------------------------------- error tables


# Peer copies are timed eagerly from PyTorch, whose cross-device copy costs ~20 us of host-side
# synchronisation: only copies large enough that the device time dominates are compared.
PEER_MIN_BYTES = 16 << 20


def error_rows(topo, m, kinds=("gemm", "coll", "peer")):
    """Per measurement: (kind, label, measured s, simulated s, error, in_fit)."""
    rows = []
    for kind in kinds:
        fit_set, held = split(m, kind)
        fit_ids = {id(r) for r in fit_set}
        for r in m.get(kind, []):
            if kind == "peer" and r["bytes"] < PEER_MIN_BYTES:
                continue
            if kind == "gemm":
                label = f"{r['name']} {r['m']}x{r['n']}x{r['k']}{' Aᵀ' if r['ta'] else ''}{' Bᵀ' if r['tb'] else ''}"
                sim = sim_gemm(topo, r["m"], r["n"], r["k"], r["ta"], r["tb"])
                meas = r["time"]
            elif kind == "coll":
                label = f"{r['op']} {r['ranks']} GPUs {r['bytes']} B"
                sim = sim_collective(topo, r["op"], r["ranks"], r["bytes"])
                meas = coll_time(r)
            else:
                label = f"peer copy {r['bytes']} B"
                sim = sim_peer(topo, r["bytes"])
                meas = r["time"]
            rows.append({"kind": kind, "label": label, "record": r, "measured": meas, "simulated": sim,
                         "error": (sim - meas) / meas, "in_fit": id(r) in fit_ids})
    return rows


def summarise(rows):
    """Median / max |error| and geomean |error| per kind, held-out rows only."""
    out = {}
    for kind in sorted({r["kind"] for r in rows}):
        held = [abs(r["error"]) for r in rows if r["kind"] == kind and not r["in_fit"]]
        if not held:
            continue
        held.sort()
        geo = math.exp(sum(math.log(max(e, 1e-6)) for e in held) / len(held))
        out[kind] = {"n": len(held), "median": held[len(held) // 2], "max": held[-1], "geomean": geo}
    return out


def coll_targets(rows):
    """Issue 12's collective figures over the held-out rows, per rank count: the geomean |error| of the
    sizes from 1 MiB to 1 GiB and the max |error| from 64 KiB on."""
    out = {}
    for ranks in sorted({r["record"]["ranks"] for r in rows if r["kind"] == "coll"}):
        held = [r for r in rows if r["kind"] == "coll" and not r["in_fit"] and r["record"]["ranks"] == ranks]
        mid = [abs(r["error"]) for r in held if (1 << 20) <= r["record"]["bytes"] <= (1 << 30)]
        big = [abs(r["error"]) for r in held if r["record"]["bytes"] >= (64 << 10)]
        if not mid or not big:
            continue
        out[ranks] = {"n": len(big), "geomean_1MiB_1GiB": math.exp(sum(math.log(max(e, 1e-6)) for e in mid) / len(mid)),
                      "max_from_64KiB": max(big)}
    return out


def gpu_of(m):
    return (m.get("env") or {}).get("gpu")


def check_gpu(overlay_doc, m):
    """Refuses an overlay calibrated on another GPU than the measurements'."""
    cal = (overlay_doc or {}).get("calibration") or {}
    want, have = cal.get("gpu"), gpu_of(m)
    if want and have and want != have:
        raise CalibrationError(f"the overlay was calibrated on a {want}, but the GPU found is a {have}; "
                               "measure and fit this GPU with `cubesim calibrate` (or pass an overlay made for it)")


def write_overlay(doc, path):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------- what is fitted, and how


def closed_form(m):
    """Figures read straight off the measurements: ({path: value}, [source lines])."""
    vals, src = {}, []
    env = m.get("env") or {}
    reads = [r for r in m.get("hbm", []) if r["op"] == "read"]
    if reads:
        big = max(reads, key=lambda r: r["bytes"])
        bw = big["moved"] / big["time"] / 1e9
        vals["cube.hbm.bandwidth_GBps"] = vals["cube.hbm.read_GBps"] = round(bw, 1)
        src.append(f"cube.hbm.bandwidth_GBps and read_GBps {bw:.0f}: measured read bandwidth of a {big['bytes'] >> 20} MiB buffer "
                   f"(a device reduction over it, gpu_measure.py hbm 'read')")
    # The runtime's elementwise/reduction ops (hw::HbmSpec, hw::KernelSpec): the write rate of the
    # largest buffer (no copy_GBps: on the H200 GELU's reads and writes take R/read + W/write, where the
    # 4 GiB copy's rate would make them 17-32% slow); a reduction's extra cost over a plain pass (read =
    # a sum, write = a fill of the same smallest, L2-resident buffer); the stream's gap per kernel (the
    # MLP step's intervals that run no kernel: tp 1 has no all-reduce).
    writes = [r for r in m.get("hbm", []) if r["op"] == "write"]
    if writes:
        big = max(writes, key=lambda r: r["bytes"])
        bw = big["moved"] / big["time"] / 1e9
        vals["cube.hbm.write_GBps"] = round(bw, 1)
        src.append(f"cube.hbm.write_GBps {bw:.0f}: measured write bandwidth of a {big['bytes'] >> 20} MiB buffer (a fill, "
                   "gpu_measure.py hbm 'write')")
    small = {op: min((r for r in m.get("hbm", []) if r["op"] == op), key=lambda r: r["bytes"], default=None)
             for op in ("read", "write")}
    if small["read"] and small["write"] and small["read"]["bytes"] == small["write"]["bytes"]:
        red = max(0.0, small["read"]["time"] - small["write"]["time"]) * 1e9
        vals["cube.kernel.reduction_ns"] = round(red, 1)
        src.append(f"cube.kernel.reduction_ns {red:.0f}: a device reduction's time over a fill's on the same "
                   f"{small['read']['bytes'] >> 20} MiB buffer (gpu_measure.py hbm 'read' minus 'write')")
    gaps = [o["time"] for r in m.get("mlp", []) if r.get("tp") == 1 for o in r["ops"]
            if o["name"] in ("fc2.all_reduce", "fc1.all_reduce_wait")]
    if gaps:
        gap = statistics.median(gaps) * 1e9
        vals["cube.kernel.launch_gap_ns"] = round(gap, 1)
        src.append(f"cube.kernel.launch_gap_ns {gap:.0f}: the stream's gap per operation, the median of {len(gaps)} "
                   "intervals of the PyTorch MLP step at tp 1 that run no kernel (gpu_measure.py mlp)")
    l2 = env.get("l2_bytes")
    if l2:
        vals["cube.l2.capacity_MiB"] = round(l2 / (1 << 20), 3)
        src.append(f"cube.l2.capacity_MiB {l2 / (1 << 20):g}: the device's L2 size (cudaDeviceProp.l2CacheSize)")
    peers = sorted((r for r in m.get("peer", []) if r["bytes"] >= 64 << 20), key=lambda r: r["bytes"])
    if len(peers) >= 2:
        a, b = peers[0], peers[-1]
        bw = (b["bytes"] - a["bytes"]) / (b["time"] - a["time"]) / 1e9
        per_link = bw / 18
        for path in ("network.link.bandwidth_GBps", "network.switch.port.bandwidth_GBps"):
            vals[path] = round(per_link, 3)
        src.append(f"network.link and switch.port bandwidth_GBps {per_link:.2f}: a peer copy's incremental rate between "
                   f"{a['bytes'] >> 20} MiB and {b['bytes'] >> 20} MiB ({bw:.0f} GB/s per direction) over the 18 NVLinks")
    logs = m.get("nccl_log") or {}
    log2 = logs.get("2") if isinstance(logs, dict) and "choices" not in logs else logs
    if log2 and log2.get("channels"):
        vals["nccl.channels"] = int(log2["channels"])
        src.append(f"nccl.channels {log2['channels']}: NCCL's own count on this machine ('coll channels' in its "
                   "NCCL_DEBUG=INFO log)")
    return vals, src


def gemm_group():
    return Group(
        name="gemm", kind="gemm",
        predict=lambda topo, r: sim_gemm(topo, r["m"], r["n"], r["k"], r["ta"], r["tb"]),
        params=[
            Param("cube.pe.mac.clock_GHz", 1.95, 1.0, 1.98, "the MAC array's sustained clock under a dense GEMM"),
            Param("cube.l2.bandwidth_GBps", 5760, 2000, 30000, "the L2's bandwidth to the PEs"),
            Param("cube.pe.gemm.mma.prologue_cycles", 20, 1, 50000, "per-tile cycles before the first MMA", True),
            Param("cube.pe.gemm.mma.epilogue_cycles", 20, 1, 50000, "per-tile cycles after the last MMA", True),
            Param("cube.pe.dma.read_GBps", 129, 16, 2000, "a PE's TMA load bandwidth"),
            Param("cube.pe.gemm.mma.unaligned_bytes_per_cycle", 5.6, 0.5, 512,
                  "operand bytes per cycle without TMA (unaligned operands)"),
            Param("cube.pe.gemm.launch_ns", 750, 10, 20000, "a GEMM kernel's launch and completion"),
            Param("cube.pe.gemm.mma.unaligned_macs_per_cycle", 400, 32, 2048,
                  "the MMA rate of the kernel that runs unaligned operands (no TMA, no wgmma)"),
        ])


def nccl_logs(m):
    """NCCL's own logs of a measurement file by rank count: {ranks: {"choices", "channels", "tuning"}}."""
    logs = m.get("nccl_log") or {}
    if not isinstance(logs, dict):
        return {}
    if "choices" in logs:  # one rank count: the file's own
        return {int((m.get("env") or {}).get("gpus", 2)): logs}
    return {int(k): v for k, v in logs.items() if isinstance(v, dict)}


# NCCL's names in its log, ours in the topology.
NCCL_OPS = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter"}
NCCL_PROTOS = {"LL": "LL", "LL128": "LL128", "SIMPLE": "Simple", "Simple": "Simple"}


def nccl_tuning(m):
    """NCCL's tuning model read off its own log (NCCL_DEBUG=INFO prints, per collective, algorithm
    and protocol, the latency and bandwidth it predicts with): the figures the simulated NCCL
    chooses its algorithm and protocol with. ({path: value}, [source lines]). Ring only: the ring's
    latency is base + steps x hop (all_reduce 2(p-1) steps, all_gather p-1), its bandwidth the bus
    bandwidth x p / steps; the bus bandwidth of Simple over the channels gives the per-channel
    figure, LL's and LL128's are their ceilings (NCCL's llMaxBw and LL128 efficiency)."""
    logs = nccl_logs(m)
    if not logs:
        return {}, []
    p = min(logs)
    log = logs[p]
    tab = {(t["op"], t["algo"], t["proto"]): t for t in log.get("tuning", [])}
    vals, src = {}, []
    where = f"NCCL's tuning table for {p} ranks (NCCL_DEBUG=INFO, nccl_log in {files_of(m)})"
    for proto in ("LL", "LL128", "Simple"):
        ar, ag = tab.get(("AllReduce", "Ring", proto)), tab.get(("AllGather", "Ring", proto))
        if not ar or not ag or p < 2:
            continue
        hop = (ar["latency_us"] - ag["latency_us"]) / (p - 1)
        base = ag["latency_us"] - (p - 1) * hop
        vals[f"nccl.protocols.{proto}.base_latency_ns.ring"] = round(base * 1000, 1)
        vals[f"nccl.protocols.{proto}.hop_latency_ns.ring"] = round(hop * 1000, 1)
        bus = ar["bandwidth_GBps"] * 2 * (p - 1) / p
        if proto == "Simple" and log.get("channels"):
            vals["nccl.channel_bandwidth_GBps"] = round(bus / int(log["channels"]), 4)
            src.append(f"nccl.channel_bandwidth_GBps {bus / int(log['channels']):g}: NCCL's bus bandwidth of ring/Simple "
                       f"({bus:g} GB/s) over its {log['channels']} channels, from {where}; selection only")
        else:
            vals[f"nccl.protocols.{proto}.max_bus_bandwidth_GBps"] = round(bus, 3)
            src.append(f"nccl.protocols.{proto}.max_bus_bandwidth_GBps {bus:g}: NCCL's ring/{proto} bus bandwidth, from "
                       f"{where}; selection only")
        src.append(f"nccl.protocols.{proto}.base_latency_ns.ring {base * 1000:g} and hop_latency_ns.ring {hop * 1000:g}: "
                   f"NCCL's ring/{proto} latency (all_reduce {ar['latency_us']} us, all_gather {ag['latency_us']} us), "
                   f"from {where}; selection only where the protocol's fixed_latency_ns and send_latency_ns are set")
    return vals, src


def nccl_choices(m):
    """NCCL's recorded choices: [(op, ranks, bytes as cubesim counts them, algorithm, protocol,
    channels)]. The log counts all_gather and reduce_scatter by one rank's part; cubesim (and NCCL's
    tuning model) by the whole buffer."""
    out = []
    for p, log in sorted(nccl_logs(m).items()):
        for c in log.get("choices", []):
            op = NCCL_OPS.get(c["op"])
            if op is None:
                continue
            nbytes = c["bytes"] * (p if op != "all_reduce" else 1)
            out.append((op, p, nbytes, c["algo"].lower(), NCCL_PROTOS.get(c["proto"], c["proto"]), c.get("channels")))
    return out


def coll_group():
    # The physical figures of the simulated NCCL (topologies/README.md, "nccl"): what a call costs
    # on the hardware. NCCL's choice of algorithm and protocol stays with its own tuning model
    # (nccl_tuning). LL128 runs like Simple (the same 16-byte copy loop, 120 of 128 bytes data):
    # its send and copy rates are Simple's.
    return Group(
        name="coll", kind="coll", measured=coll_time,
        predict=lambda topo, r: sim_collective(topo, r["op"], r["ranks"], r["bytes"]),
        params=[
            Param("nccl.launch_latency_ns", 9600, 10, 50000,
                  "a collective's launch latency (with LL's fixed_latency_ns 0: all of LL's fixed cost)"),
            Param("nccl.protocols.LL.send_bandwidth_GBps", 8, 1, 100, "one channel's send loop under LL (wire bytes)"),
            Param("network.link.latency_ns", 500, 10, 5000,
                  "an NVLink's flight time (a send crosses two, cube to switch to cube; LL's per-step latency "
                  "with its send_latency_ns 0)"),
            Param("nccl.protocols.Simple.fixed_latency_ns", 10000, 10, 50000,
                  "Simple's fixed cost per call beyond the launch", also=("nccl.protocols.LL128.fixed_latency_ns",)),
            Param("nccl.protocols.Simple.send_latency_ns", 2000, 10, 20000, "Simple's latency before every send",
                  also=("nccl.protocols.LL128.send_latency_ns",)),
            Param("nccl.protocols.Simple.send_bandwidth_GBps", 18, 2, 100,
                  "one channel's send loop under Simple (one SM storing to the peer over NVLink)",
                  also=("nccl.protocols.LL128.send_bandwidth_GBps",)),
            Param("nccl.protocols.Simple.copy_bandwidth_GBps", 25, 2, 400,
                  "one channel's copy of a received Simple slice into the output (one SM, local HBM)",
                  also=("nccl.protocols.LL128.copy_bandwidth_GBps",)),
        ])


def coll_constants():
    """Physical figures of the simulated NCCL that are not fitted: NCCL's own pipeline geometry
    ({path: value}, [source lines])."""
    vals = {"nccl.protocols.Simple.chunk_slices": 2, "nccl.protocols.LL.fixed_latency_ns": 0,
            "nccl.protocols.LL.send_latency_ns": 0}
    src = ["nccl.protocols.Simple.chunk_slices 2: NCCL's ring chunk of ALLREDUCE_CHUNKSTEPS / ALLREDUCE_SLICESTEPS = "
           "(NCCL_STEPS/2) / (NCCL_STEPS/4) slices (src/include/collectives.h; all_gather and reduce_scatter the same); "
           "slice_bytes stays 1 MiB = 2 steps of the 4 MiB Simple buffer's 8 (NCCL_BUFFSIZE, NCCL_STEPS)",
           "nccl.protocols.LL.fixed_latency_ns 0: LL's fixed cost is the fitted launch latency",
           "nccl.protocols.LL.send_latency_ns 0: LL's step waits on no handshake beyond the links' flight time (its "
           "flags travel with the data)"]
    return vals, src


def fit(m, base="h200x8", log=print, kinds=("gemm", "coll", "peer"), name=None, jobs=None):
    """Fits `base` to measurements `m`: closed-form figures first, then each group by the simulator.
    Returns {"values", "overlay" (the document to write), "document" (resolved), "residuals"}."""
    values, sources = closed_form(m)
    if "coll" in kinds:  # NCCL's own tuning model (its choice of algorithm and protocol), from its log
        for tv, ts in (nccl_tuning(m), coll_constants()):
            values.update(tv)
            sources += ts
    log(f"closed-form figures: {values}")
    groups = [g for g in (gemm_group(), coll_group()) if g.kind in kinds]
    fit_sets = {}
    for g in groups:
        recs, _ = split(m, g.kind)
        fit_sets[g.name] = recs
        if not recs:
            log(f"{g.name}: no measurements to fit; its figures keep the base's values")
            continue
        log(f"fitting {g.name} on {len(recs)} measurements: {', '.join(p.path for p in g.params)}")
        vals, res = fit_group(base, values, g, recs, log=log, jobs=jobs or default_jobs())
        values.update(vals)
        rms = math.sqrt(sum(e * e for e in res) / len(res))
        for p in g.params:
            also = "".join(f" (and {a})" for a in p.also)
            sources.append(f"{p.path} {vals[p.path]}{also}: {p.what}, fitted by cubesim calibrate to {len(recs)} "
                           f"{g.name} measurements (rms log error {rms:.3f})")
    env = m.get("env") or {}
    name = name or f"{os.path.splitext(os.path.basename(str(base)))[0]}_calibrated"
    when = env.get("date", "")[:10]
    overlay = {
        "name": name,
        "extends": base,
        "description": f"{base} with figures fitted to measurements of {env.get('gpus', '?')} x {env.get('gpu', '?')} "
                       f"(driver {env.get('driver', '?')}, CUDA {env.get('cuda', '?')}, NCCL {env.get('nccl', '?')}, "
                       f"PyTorch {env.get('torch', '?')}) on {when} by cubesim calibrate.",
        "sources": [f"measurements: {files_of(m)} (gpu_measure.py, schema {MEASURE_SCHEMA})"]
                   + sources,
        "calibration": {"gpu": env.get("gpu", ""), "gpus": env.get("gpus", 0), "driver": env.get("driver", ""),
                        "nccl": env.get("nccl", ""), "cuda": env.get("cuda", ""), "date": when,
                        "measurements": files_of(m, "")},
        "set": {k: values[k] for k in sorted(values)},
    }
    doc = cs.load_topology_json(base)
    for k, v in overlay["set"].items():
        doc = cs.apply_override(doc, k, v)
    doc["name"] = name
    return {"values": values, "overlay": overlay, "document": doc, "fit_sets": fit_sets}
