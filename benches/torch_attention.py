#!/usr/bin/env python3
"""torch_attention.py — our tensor_core attention (bench_attention_cuda) against PyTorch's
scaled_dot_product_attention on the same shapes, in alternating rounds of one run (these machines'
clocks drift: alternating puts both under the same conditions), forward and backward.

    python3 benches/torch_attention.py --bench build-cu/benches/bench_attention_cuda [--rounds 3]
        [--batch 1 2] [--seq 4096] [--heads 32] [--kv-heads 8] [--dim 128] [--full] [--json FILE]
        [--variant 8,1,4]

SDPA is timed two ways and the faster (per direction) is the peer: with enable_gqa=True on the
grouped K, V, and on K, V repeated to every head (the flash backend's own GQA-free path; its backward then skips the sum
over the group, so it is, if anything, a little cheaper). Times: CUDA events, median of --reps; the
backward is torch.autograd.grad of the forward's output (forward not counted). FLOPs as FlashAttention
counts them: forward 4·b·h·s²·d (halved when causal), backward 2.5 times that. A ratio is SDPA's time
over ours (>= 0.6 forward, >= 0.5 backward are issue 19's targets).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F


def time_ms(fn, reps):
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def sdpa_times(b, s, h, kvh, d, causal, dtype, reps):
    g = torch.Generator(device="cuda").manual_seed(1)
    q = (torch.rand(b, h, s, d, device="cuda", dtype=torch.float32, generator=g) * 2 - 1).to(dtype).requires_grad_()
    k = (torch.rand(b, kvh, s, d, device="cuda", dtype=torch.float32, generator=g) * 2 - 1).to(dtype).requires_grad_()
    v = (torch.rand(b, kvh, s, d, device="cuda", dtype=torch.float32, generator=g) * 2 - 1).to(dtype).requires_grad_()
    do = (torch.rand(b, h, s, d, device="cuda", dtype=torch.float32, generator=g) * 2 - 1).to(dtype)
    ke = k.detach().repeat_interleave(h // kvh, dim=1).requires_grad_()
    ve = v.detach().repeat_interleave(h // kvh, dim=1).requires_grad_()
    out = {}
    for name, kk, vv, gqa in (("gqa", k, v, True), ("expanded", ke, ve, False)):
        try:
            f = lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, enable_gqa=gqa)
            with torch.no_grad():
                for _ in range(3):
                    f()
                fwd = time_ms(f, reps)
            o = f()
            bw = lambda: torch.autograd.grad(o, (q, kk, vv), do, retain_graph=True)
            for _ in range(3):
                bw()
            bwd = time_ms(bw, reps)
            out[name] = {"fwd_ms": fwd, "bwd_ms": bwd}
        except Exception as e:  # an SDPA path this torch lacks
            out[name] = {"error": str(e)[:200]}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--f16", action="store_true")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--variant", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    causal = not a.full
    dtype = torch.float16 if a.f16 else torch.bfloat16
    ours = {bb: [] for bb in a.batch}
    peer = {bb: [] for bb in a.batch}
    for r in range(a.rounds):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
            path = tf.name
        cmd = [a.bench, "--json", path, "--batch", ",".join(map(str, a.batch)), "--seq", str(a.seq), "--heads",
               str(a.heads), "--kv-heads", str(a.kv_heads), "--dim", str(a.dim), "--reps", str(a.reps)]
        if a.full:
            cmd.append("--full")
        if a.f16:
            cmd.append("--f16")
        if a.variant:
            cmd += ["--variant", a.variant]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit("bench failed: " + res.stderr + res.stdout)
        if r == 0:
            print(res.stdout)
        with open(path) as f:
            j = json.load(f)
        os.unlink(path)
        for row in j["rows"]:
            ours[row["batch"]].append(row)
        for bb in a.batch:
            peer[bb].append(sdpa_times(bb, a.seq, a.heads, a.kv_heads, a.dim, causal, dtype, a.reps))
    gpu = torch.cuda.get_device_name(0)
    print(f"torch {torch.__version__} on {gpu}; {a.rounds} alternating rounds, medians of {a.reps}")
    hdr = ("shape", "ours fwd ms", "SDPA fwd ms", "fwd ratio", "ours bwd ms", "SDPA bwd ms", "bwd ratio",
           "ours fwd/bwd TF/s", "SDPA fwd/bwd TF/s", "SDPA path")
    rows = []
    out = []
    for bb in a.batch:
        of = statistics.median(x["fwd_ms"] for x in ours[bb])
        ob = statistics.median(x["bwd_ms"] for x in ours[bb])
        # The peer per direction: the faster SDPA path's median (forward and backward chosen apart).
        fwd_by, bwd_by = {}, {}
        for name in ("gqa", "expanded"):
            ok = [p[name] for p in peer[bb] if "fwd_ms" in p[name]]
            if ok:
                fwd_by[name] = statistics.median(x["fwd_ms"] for x in ok)
                bwd_by[name] = statistics.median(x["bwd_ms"] for x in ok)
        fname = min(fwd_by, key=fwd_by.get)
        bname = min(bwd_by, key=bwd_by.get)
        pf, pb = fwd_by[fname], bwd_by[bname]
        name = fname if fname == bname else f"{fname}/{bname}"
        flops = 4.0 * bb * a.heads * a.seq * a.seq * a.dim * (0.5 if causal else 1.0)
        shape = f"b{bb} s{a.seq} h{a.heads}/{a.kv_heads} d{a.dim} {'causal' if causal else 'full'}"
        rows.append((shape, f"{of:.3f}", f"{pf:.3f}", f"{pf / of:.2f}", f"{ob:.3f}", f"{pb:.3f}", f"{pb / ob:.2f}",
                     f"{flops / of * 1e-9:.0f}/{2.5 * flops / ob * 1e-9:.0f}",
                     f"{flops / pf * 1e-9:.0f}/{2.5 * flops / pb * 1e-9:.0f}", name))
        out.append({"shape": shape, "batch": bb, "ours": ours[bb], "sdpa": peer[bb], "ours_fwd_ms": of,
                    "ours_bwd_ms": ob, "sdpa_fwd_ms": pf, "sdpa_bwd_ms": pb, "sdpa_path": name,
                    "sdpa_fwd_by_path": fwd_by, "sdpa_bwd_by_path": bwd_by,
                    "fwd_ratio": pf / of, "bwd_ratio": pb / ob})
    w = [max(len(str(r[i])) for r in rows + [hdr]) for i in range(len(hdr))]
    for r in [hdr] + rows:
        print(" | ".join(str(x).ljust(w[i]) for i, x in enumerate(r)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"bench": "torch_attention", "gpu": gpu, "torch": torch.__version__, "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
