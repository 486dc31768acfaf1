#!/usr/bin/env python3
"""gpu_measure.py — the measurements `cubesim calibrate` fits the simulator to, on real GPUs.

Standalone: it imports only PyTorch (cuBLAS, NCCL) and the standard library, so it runs on a GPU
machine where the cubesim extension is not built. It writes one JSON document (schema
"cubesim.measure/1") that `cubesim calibrate --measurements FILE` fits and `--check` compares with:

    python3 gpu_measure.py --out m.json [--sections env,hbm,peer,gemm,elementwise,coll,mlp] [--quick]
                           [--gemm-random N --seed S]

Sections (each a list of records; times are seconds per operation):
  env   GPU name, count, SMs, L2 size, driver, CUDA, NCCL and PyTorch versions, date, `nvidia-smi topo -m`
  hbm   {op: copy|read|write, bytes (the buffer), moved (bytes read + written), time}: device memory
        bandwidth by size; small buffers stay in L2 across repetitions, so the curve shows the L2 knee
  peer  {bytes, time}: one GPU's copy into another's memory (cudaMemcpyPeer over NVLink)
  gemm  {m, n, k, ta, tb, time}: bf16 C[m,n] = A·B through cuBLAS (torch.matmul); ta/tb: the operand
        is a transposed view (column-major), as Megatron's dgrad/wgrad read them. Inputs rotate over
        enough buffers that they are not L2 resident, as in a training step.
  coll  {op: all_reduce|all_gather|reduce_scatter, ranks, bytes, time, loop_time}: NCCL through
        torch.distributed; bytes as nccl-tests counts them (all_gather: the output, reduce_scatter:
        the input); time is the median of per-call CUDA-event durations, loop_time the mean over a
        back-to-back loop
  elementwise {op: gelu_fwd|gelu_bwd|bias_add|bias_grad, rows, cols, bytes_read, bytes_written, time}: the
        MLP step's elementwise ops alone on bf16 [rows, cols] (bias_grad: the column sum dy.sum(0))
  mlp   {tp, tokens, hidden, ffn, step, ops: [{name, kind, time}]}: Megatron's ParallelMLP forward +
        backward in plain PyTorch (column-parallel fc1 + GELU tanh, row-parallel fc2, the column
        layer's input-gradient all-reduce overlapping its weight-gradient GEMM), median step time and
        per-op medians
Every timing uses random data (never zeros), warms up first and takes a median of repeats.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0): the machines it runs on are shared.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_k] = _v

import torch  # noqa: E402

SCHEMA = "cubesim.measure/1"
MiB = 1 << 20


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def graph_time(fn, reps, replays=5):
    """Seconds per call of fn, captured `reps` times in a CUDA graph and replayed (median)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn(0)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / reps)
    del g
    return statistics.median(times)


# ---------------------------------------------------------------- env


def nccl_version():
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # no NCCL in this PyTorch
        return None
    if isinstance(v, int):  # older PyTorch: 2215 = 2.21.5 (NCCL_VERSION_CODE)
        return f"{v // 10000 if v >= 10000 else v // 1000}.{v // 100 % 100 if v >= 10000 else v // 100 % 10}.{v % 100}"
    return ".".join(str(x) for x in v)


def section_env(args):
    p = torch.cuda.get_device_properties(0)
    env = {
        "gpu": p.name,
        "gpus": torch.cuda.device_count(),
        "sms": p.multi_processor_count,
        "memory_bytes": p.total_memory,
        "l2_bytes": getattr(p, "L2_cache_size", None),
        "capability": f"{p.major}.{p.minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": os.uname().nodename,
    }
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.sm,power.limit",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.splitlines()
        if q:
            f = [x.strip() for x in q[0].split(",")]
            env.update(driver=f[0], max_sm_clock=f[1], sm_clock=f[2], power_limit=f[3])
        env["topo"] = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        env["nvidia_smi_error"] = str(e)
    return env


# ---------------------------------------------------------------- device memory


def section_hbm(args):
    out = []
    sizes = [1 << s for s in range(20, 33 if not args.quick else 29)]
    big = torch.empty(2 * sizes[-1] + 2 * MiB, dtype=torch.uint8, device="cuda")
    big.random_(0, 255)
    for n in sizes:
        src = big[:n]
        dst = big[n + MiB: 2 * n + MiB]
        fsrc = src.view(torch.float32)
        red = torch.empty((), dtype=torch.float32, device="cuda")
        reps = max(4, min(200, int(0.02 / (2 * n / 3e12 + 2e-6))))
        for op, fn, moved in (
            ("copy", lambda i: dst.copy_(src), 2 * n),
            ("read", lambda i: red.copy_(fsrc.sum()), n),
            ("write", lambda i: dst.fill_(7), n),
        ):
            t = graph_time(fn, reps)
            out.append({"op": op, "bytes": n, "moved": moved, "time": t})
            log(f"hbm {op:5s} {n / MiB:8.0f} MiB  {moved / t / 1e9:8.1f} GB/s")
    del big
    torch.cuda.empty_cache()
    return out


def section_elementwise(args):
    """The MLP step's elementwise ops alone, bf16 [rows, cols]: gelu fwd (x -> y), gelu bwd (dy, x -> dx),
    bias add (y + b, b broadcast over rows), bias grad (dy.sum(0): a column reduction), each graph-replayed."""
    out = []
    shapes = [(r, c) for r in (1024, 4096, 8192) for c in (4096, 7168, 14336)]
    if args.quick:
        shapes = shapes[::4]
    for rows, cols in shapes:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        db = torch.empty(cols, device="cuda", dtype=torch.bfloat16)
        n = rows * cols * 2
        for op, fn, rd, wr in (
            ("gelu_fwd", lambda i: torch.ops.aten.gelu.out(x, approximate="tanh", out=y), n, n),
            ("gelu_bwd", lambda i: torch.ops.aten.gelu_backward.grad_input(dy, x, approximate="tanh", grad_input=y),
             2 * n, n),
            ("bias_add", lambda i: torch.add(x, b, out=y), n + cols * 2, n),
            ("bias_grad", lambda i: torch.sum(dy, 0, out=db), n, cols * 2),
        ):
            reps = max(4, min(100, int(0.01 / ((rd + wr) / 2e12 + 3e-6))))
            t = graph_time(fn, reps)
            out.append({"op": op, "rows": rows, "cols": cols, "bytes_read": rd, "bytes_written": wr, "time": t})
            log(f"elementwise {op:9s} {rows:5d}x{cols:5d} {t * 1e6:9.2f} us {(rd + wr) / t / 1e9:8.1f} GB/s")
        del x, dy, b, y, db
    torch.cuda.empty_cache()
    return out


def section_peer(args):
    if torch.cuda.device_count() < 2:
        return []
    out = []
    src_all = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0").random_(0, 255)
    dst_all = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:1")
    torch.cuda.synchronize(0)
    for s in range(3, 31, 1 if not args.quick else 3):
        n = 1 << s
        src, dst = src_all[:n], dst_all[:n]
        reps = max(5, min(300, int(0.02 / (n / 300e9 + 10e-6))))
        with torch.cuda.device(0):
            for _ in range(3):
                dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(1)
            per = []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                dst.copy_(src, non_blocking=True)
                b.record()
                per.append((a, b))
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(1)
            t = statistics.median(a.elapsed_time(b) / 1e3 for a, b in per)
        out.append({"bytes": n, "time": t})
        log(f"peer {n:12d} B  {t * 1e6:9.2f} us  {n / t / 1e9:8.1f} GB/s")
    del src_all, dst_all
    torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------- GEMM


def mlp_gemms(tokens, hidden, ffn, tp):
    """The six GEMMs of a ParallelMLP step on one rank, as (m, n, k, ta, tb, name): C = A·B."""
    f = ffn // tp
    return [
        (tokens, f, hidden, False, True, f"fc1.fwd tp{tp}"),      # Y1 = X · W1ᵀ
        (tokens, hidden, f, False, True, f"fc2.fwd tp{tp}"),      # Y2 = A · W2ᵀ
        (tokens, f, hidden, False, False, f"fc2.dgrad tp{tp}"),   # dA = dY · W2
        (hidden, f, tokens, True, False, f"fc2.wgrad tp{tp}"),    # dW2 = dYᵀ · A
        (tokens, hidden, f, False, False, f"fc1.dgrad tp{tp}"),   # dX = dY1 · W1
        (f, hidden, tokens, True, False, f"fc1.wgrad tp{tp}"),    # dW1 = dY1ᵀ · X
    ]


def gemm_grid(quick):
    g = []
    for tp in (1, 2, 4, 8):
        g += mlp_gemms(4096, 4096, 14336, tp)
    for m in (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192,
              12288, 16384):
        g.append((m, 4096, 4096, False, True, "m-sweep"))
    for s in (256, 512, 1024, 2048, 3072, 4096, 6144, 8192):
        g.append((s, s, s, False, False, "square"))
    for (m, n, k, ta, tb) in ((4096, 4096, 4095, False, True), (4096, 4095, 4096, False, True),
                              (3000, 5000, 1000, False, False), (1234, 5678, 910, False, True),
                              (8192, 1024, 8192, False, True), (512, 28672, 4096, False, True),
                              (2048, 2048, 12288, True, False), (16384, 3584, 4096, False, True),
                              (100, 14336, 4096, False, True), (4096, 14336, 96, True, False),
                              (777, 777, 777, False, False), (4096, 7168, 4096, False, False),
                              (2048, 5120, 13824, False, True), (2048, 13824, 5120, False, True),
                              (13824, 5120, 2048, True, False), (5120, 13824, 2048, True, False),
                              (1, 14336, 4096, False, True), (16, 4096, 14336, False, True),
                              (8191, 8191, 1023, False, True), (3584, 4096, 16384, True, False),
                              (6144, 1536, 6144, False, True), (1536, 6144, 6144, False, False),
                              (12288, 12288, 4096, False, True), (24576, 4096, 4096, False, True),
                              (333, 4096, 11008, False, True), (4096, 11008, 4096, False, True)):
        g.append((m, n, k, ta, tb, "odd"))
    if quick:
        g = g[::6]
    return g


def random_gemm_grid(count, seed):
    """`count` shapes drawn log-uniformly (M 1..16384, N and K 512..16384; a quarter of each dimension odd),
    transposes at random: shapes no fit has seen (named "random")."""
    import math
    import random
    rng = random.Random(seed)

    def draw(lo, hi):
        v = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
        return v if rng.random() < 0.25 else max(lo, v // 8 * 8)

    g = []
    while len(g) < count:
        m = draw(1, 16384) if rng.random() < 0.5 else draw(1024, 16384)  # half of them: training-sized M
        n, k = draw(512, 16384), draw(512, 16384)
        if 2.0 * m * n * k > 4e12:  # at most a few milliseconds each
            continue
        g.append((m, n, k, rng.random() < 0.3, rng.random() < 0.5, "random"))
    return g


def section_gemm(args):
    out = []
    grid = random_gemm_grid(args.gemm_random, args.seed) if args.gemm_random else gemm_grid(args.quick)
    for (m, n, k, ta, tb, name) in grid:
        per_set = 2 * (m * k + k * n + m * n)
        sets = max(1, min(32, -(-300 * MiB // per_set)))
        As = [torch.randn((k, m) if ta else (m, k), device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        Bs = [torch.randn((n, k) if tb else (k, n), device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        Cs = [torch.empty((m, n), device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        a_view = [a.t() if ta else a for a in As]
        b_view = [b.t() if tb else b for b in Bs]
        est = 2.0 * m * n * k / 600e12 + per_set / 3e12 + 3e-6
        reps = max(3, min(200, int(0.01 / est)))
        t = graph_time(lambda i: torch.matmul(a_view[i % sets], b_view[i % sets], out=Cs[i % sets]), reps)
        out.append({"m": m, "n": n, "k": k, "ta": ta, "tb": tb, "name": name, "time": t})
        log(f"gemm {name:16s} {m:6d}x{n:6d}x{k:6d} ta={int(ta)} tb={int(tb)} {t * 1e6:10.2f} us "
            f"{2 * m * n * k / t / 1e12:7.1f} TFLOP/s")
        del As, Bs, Cs, a_view, b_view
    torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------- the MLP step


def mlp_step_ops(tokens, hidden, ffn, tp, rank, group, dist):
    """Runs and times Megatron's ParallelMLP step on one rank; returns (step seconds, {op: seconds})."""
    torch.manual_seed(1234 + rank)
    f = ffn // tp
    dt = torch.bfloat16
    X = torch.randn(tokens, hidden, device="cuda", dtype=dt)
    W1 = torch.randn(f, hidden, device="cuda", dtype=dt) * 0.02
    b1 = torch.randn(f, device="cuda", dtype=dt) * 0.02
    W2 = torch.randn(hidden, f, device="cuda", dtype=dt) * 0.02
    b2 = torch.randn(hidden, device="cuda", dtype=dt) * 0.02
    dY = torch.randn(tokens, hidden, device="cuda", dtype=dt)
    side = torch.cuda.Stream()
    gelu = torch.nn.functional.gelu

    def step(ev):
        def mark(name):
            if ev is not None:
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                ev.append((name, e))
        mark("start")
        Y1 = torch.addmm(b1, X, W1.t())                    # fc1 (column parallel)
        mark("fc1.fwd")
        A = gelu(Y1, approximate="tanh")
        mark("gelu.fwd")
        Y2 = torch.matmul(A, W2.t())                        # fc2 (row parallel), partial sums
        mark("fc2.fwd")
        if tp > 1:
            dist.all_reduce(Y2, group=group)
        mark("fc2.all_reduce")
        Y = Y2 + b2
        mark("bias.fwd")
        # backward
        db2 = dY.sum(0)
        mark("fc2.bias_grad")
        dA = torch.matmul(dY, W2)                           # fc2 dgrad
        mark("fc2.dgrad")
        dW2 = torch.matmul(dY.t(), A)                       # fc2 wgrad
        mark("fc2.wgrad")
        dY1 = torch.ops.aten.gelu_backward(dA, Y1, approximate="tanh")
        mark("gelu.bwd")
        dX = torch.matmul(dY1, W1)                          # fc1 dgrad, partial sums
        mark("fc1.dgrad")
        if tp > 1:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                work = dist.all_reduce(dX, group=group, async_op=True)
        db1 = dY1.sum(0)
        mark("fc1.bias_grad")
        dW1 = torch.matmul(dY1.t(), X)                      # fc1 wgrad, overlapping the all-reduce
        mark("fc1.wgrad")
        if tp > 1:
            work.wait()
            torch.cuda.current_stream().wait_stream(side)
        mark("fc1.all_reduce_wait")
        return Y, dX, dW1, dW2, db1, db2

    for _ in range(3):
        step(None)
    torch.cuda.synchronize()
    steps, per_op = [], {}
    for _ in range(20):
        if tp > 1:
            dist.barrier(group=group)
            torch.cuda.synchronize()
        ev = []
        step(ev)
        torch.cuda.synchronize()
        steps.append(ev[0][1].elapsed_time(ev[-1][1]) / 1e3)
        for (_, a), (name, b) in zip(ev, ev[1:]):
            per_op.setdefault(name, []).append(a.elapsed_time(b) / 1e3)
    return statistics.median(steps), {k: statistics.median(v) for k, v in per_op.items()}


def op_kind(name):
    if "all_reduce" in name:
        return "collective"
    if name.endswith(("fwd", "dgrad", "wgrad")) and name.startswith("fc"):
        return "gemm"
    return "other"


MLP_SHAPES = ((4096, 4096, 14336), (2048, 5120, 13824))


def mlp_record(tp, shape, step, ops):
    t, h, f = shape
    return {"tp": tp, "tokens": t, "hidden": h, "ffn": f, "step": step,
            "ops": [{"name": k, "kind": op_kind(k), "time": v} for k, v in ops.items()]}


# ---------------------------------------------------------------- collectives (one process per GPU)


COLL_OPS = ("all_reduce", "all_gather", "reduce_scatter")


def coll_graph_time(fn, reps, dist, group):
    """Seconds per collective, `reps` of them captured in a CUDA graph and replayed on every rank at
    once (the device-side time, free of the host's launch overhead), or None if capture fails."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(4):
            dist.barrier(group=group)
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3 / reps)
        del g
        return statistics.median(times[1:])
    except Exception as e:  # capture unsupported here: the eager figures stand
        log(f"graph capture of a collective failed: {type(e).__name__}: {e}")
        return None


def coll_worker(rank, world, port, sections, quick, result_path, shapes):
    global MLP_SHAPES
    MLP_SHAPES = shapes
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    kw = dict(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        dist.init_process_group("nccl", device_id=torch.device("cuda", rank), **kw)
    except TypeError:  # an older PyTorch without device_id
        dist.init_process_group("nccl", **kw)
    group = dist.group.WORLD
    out = {"coll": [], "mlp": []}
    if "coll" in sections:
        top = 30 if not quick else 24
        big_in = torch.randn((1 << top) // 2 + 64, device="cuda", dtype=torch.bfloat16)
        big_out = torch.empty_like(big_in)
        for op in COLL_OPS:
            for s in range(3, top + 1, 1 if not quick else 3):
                nbytes = 1 << s
                n = nbytes // 2
                if n % world:
                    continue
                if op == "all_reduce":
                    buf = big_in[:n]
                    fn = lambda: dist.all_reduce(buf, group=group)
                elif op == "all_gather":
                    o = big_out[:n]
                    i = big_in[: n // world]
                    fn = lambda: dist.all_gather_into_tensor(o, i, group=group)
                else:
                    o = big_out[: n // world]
                    i = big_in[:n]
                    fn = lambda: dist.reduce_scatter_tensor(o, i, group=group)
                est = nbytes / 150e9 + 20e-6
                reps = max(5, min(100, int(0.03 / est)))
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                dist.barrier(group=group)
                torch.cuda.synchronize()
                per = []
                e0 = torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(reps):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    fn()
                    b.record()
                    per.append((a, b))
                e1 = torch.cuda.Event(enable_timing=True)
                e1.record()
                torch.cuda.synchronize()
                t = statistics.median(a.elapsed_time(b) / 1e3 for a, b in per)
                loop = e0.elapsed_time(e1) / 1e3 / reps
                gt = coll_graph_time(fn, min(reps, 50), dist, group)
                out["coll"].append({"op": op, "ranks": world, "bytes": nbytes, "time": t, "loop_time": loop,
                                    "graph_time": gt})
                if rank == 0:
                    log(f"coll {op:14s} {world} ranks {nbytes:12d} B  {t * 1e6:10.2f} us  loop {loop * 1e6:10.2f} us  "
                        f"graph {gt * 1e6 if gt else -1:10.2f} us  "
                        f"algbw {nbytes / t / 1e9:7.1f} GB/s")
        del big_in, big_out
        torch.cuda.empty_cache()
    if "mlp" in sections:
        for shape in MLP_SHAPES:
            step, ops = mlp_step_ops(*shape, world, rank, group, dist)
            out["mlp"].append(mlp_record(world, shape, step, ops))
            if rank == 0:
                log(f"mlp tp{world} {shape}: step {step * 1e3:.3f} ms")
            torch.cuda.empty_cache()
    if rank == 0:
        with open(result_path, "w") as fh:
            json.dump(out, fh)
    dist.barrier(group=group)
    dist.destroy_process_group()


def run_distributed(world, sections, quick):
    import tempfile
    import torch.multiprocessing as mp
    path = tempfile.mktemp(suffix=f".w{world}.json")
    port = 29500 + world + (os.getpid() % 1000)
    mp.spawn(coll_worker, args=(world, port, sections, quick, path, MLP_SHAPES), nprocs=world, join=True)
    with open(path) as fh:
        r = json.load(fh)
    os.unlink(path)
    return r


# ---------------------------------------------------------------- NCCL's own log


def parse_nccl_log(text):
    """NCCL's choices and its tuning table from an NCCL_DEBUG=INFO log (NCCL_DEBUG_SUBSYS=INIT,TUNING,COLL):
    {"choices": [{op, bytes, algo, proto, channels}], "channels": N, "tuning": [{op, algo, proto, latency_us, bandwidth_GBps}]}"""
    import re
    choices, seen = [], set()
    for m in re.finditer(r"(\w+): (\d+) Bytes -> Algo (\w+) proto (\w+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}", text):
        key = m.groups()
        if key in seen:
            continue
        seen.add(key)
        choices.append({"op": m.group(1), "bytes": int(m.group(2)), "algo": m.group(3), "proto": m.group(4),
                        "channels": int(m.group(6)) - int(m.group(5)) + 1})
    out = {"choices": choices}
    m = re.search(r"(\d+) coll channels", text)
    if m:
        out["channels"] = int(m.group(1))
    # The first table block: Tree, Ring, CollNetDirect x LL, LL128, Simple.
    tuning = []
    algos = None
    for line in text.splitlines():
        if "Algorithm   |" in line:
            algos = [a.strip() for a in line.split("|")[1:] if a.strip()]
            continue
        m = re.search(r"INFO\s+(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce) \|(.*)", line)
        if m and algos:
            cells = [c.strip() for c in m.group(2).split("|") if c.strip()]
            for i, c in enumerate(cells):
                lat, bw = (float(x) for x in c.split("/"))
                if bw > 0:
                    tuning.append({"op": m.group(1), "algo": algos[i // 3], "proto": ("LL", "LL128", "Simple")[i % 3],
                                   "latency_us": lat, "bandwidth_GBps": bw})
    out["tuning"] = tuning
    return out


# ---------------------------------------------------------------- main


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write (rewritten after every section)")
    ap.add_argument("--sections", default="env,hbm,peer,gemm,elementwise,coll,mlp")
    ap.add_argument("--ranks", default="", help="GPU counts for coll/mlp, e.g. 1,2,4 (default: 2 and all GPUs; the "
                    "MLP step also on 1 GPU)")
    ap.add_argument("--mlp-shape", default="", metavar="T,H,F[;T,H,F...]",
                    help="the MLP step's tokens,hidden,ffn (default: 4096,4096,14336 and 2048,5120,13824)")
    ap.add_argument("--gemm-random", type=int, default=0, metavar="N",
                    help="gemm: N random shapes (named 'random', never fitted) instead of the standard grid")
    ap.add_argument("--seed", type=int, default=1, help="seed of --gemm-random")
    ap.add_argument("--quick", action="store_true", help="a few points of each section (a smoke test)")
    ap.add_argument("--nccl-log", action="store_true",
                    help="run NCCL with NCCL_DEBUG=INFO and record its choice of algorithm, protocol and channels per "
                         "call and its tuning table (doc['nccl_log'][ranks])")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_measure: no CUDA GPU here", file=sys.stderr)
        return 3
    sections = set(args.sections.split(","))
    global MLP_SHAPES
    if args.mlp_shape:
        try:
            MLP_SHAPES = tuple(tuple(int(x) for x in one.split(",")) for one in args.mlp_shape.split(";"))
        except ValueError:
            MLP_SHAPES = ()
        if not MLP_SHAPES or any(len(x) != 3 for x in MLP_SHAPES):
            ap.error(f"--mlp-shape {args.mlp_shape!r}: give tokens,hidden,ffn as three integers (shapes separated "
                     "by ';')")
    ranks = [int(x) for x in args.ranks.split(",") if x]
    doc = {"schema": SCHEMA, "env": section_env(args), "hbm": [], "peer": [], "gemm": [], "elementwise": [],
           "coll": [], "mlp": [], "errors": []}

    def save():
        with open(args.out, "w") as fh:
            json.dump(doc, fh, indent=1)

    save()
    t0 = time.time()
    for name, fn in (("hbm", section_hbm), ("peer", section_peer), ("gemm", section_gemm),
                     ("elementwise", section_elementwise)):
        if name in sections:
            try:
                doc[name] = fn(args)
            except Exception as e:  # keep what the other sections measured
                doc["errors"].append(f"{name}: {type(e).__name__}: {e}")
                log(f"section {name} failed: {e}")
            save()
            log(f"-- {name} done at {time.time() - t0:.0f} s")
    if "mlp" in sections and (not ranks or 1 in ranks):
        try:
            for shape in MLP_SHAPES:
                step, ops = mlp_step_ops(*shape, 1, 0, None, None)
                doc["mlp"].append(mlp_record(1, shape, step, ops))
                log(f"mlp tp1 {shape}: step {step * 1e3:.3f} ms")
        except Exception as e:
            doc["errors"].append(f"mlp tp1: {type(e).__name__}: {e}")
        save()
    ngpu = torch.cuda.device_count()
    worlds = [w for w in ranks if w >= 2] if ranks else sorted({w for w in (2, ngpu) if 2 <= w <= ngpu})
    if any(w > ngpu for w in worlds):
        print(f"gpu_measure: --ranks {args.ranks}: only {ngpu} GPU(s) here", file=sys.stderr)
        return 2
    if sections & {"coll", "mlp"}:
        for w in worlds:
            try:
                if args.nccl_log:
                    import tempfile
                    logdir = tempfile.mkdtemp(prefix="nccl_log")
                    os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,TUNING,COLL",
                                      NCCL_DEBUG_FILE=os.path.join(logdir, "nccl.%p.log"))
                r = run_distributed(w, sections & {"coll", "mlp"}, args.quick)
                if args.nccl_log:
                    for name in sorted(os.listdir(logdir)):
                        text = open(os.path.join(logdir, name), errors="replace").read()
                        if f"rank 0 nranks {w} " in text:
                            doc.setdefault("nccl_log", {})[str(w)] = parse_nccl_log(text)
                            break
                    for k in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"):
                        os.environ.pop(k, None)
                doc["coll"] += r["coll"]
                doc["mlp"] += r["mlp"]
            except Exception as e:
                doc["errors"].append(f"coll/mlp on {w} GPUs: {type(e).__name__}: {e}")
                log(f"distributed {w} failed: {e}")
            save()
            log(f"-- {w}-GPU collectives/mlp done at {time.time() - t0:.0f} s")
    save()
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
