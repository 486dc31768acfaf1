"""ABFT for det_gemm (kernels/abft.h, cubesim.abft_check): the false-positive rate on clean GEMMs and
the smallest error it catches.

    PYTHONPATH=build/python python3 benches/bench_abft.py [--gemms 300] [--seed 1] [--json F]

Clean: `gemms` random GEMMs (shapes M, N in 16..256, K in 64..2048; inputs bf16, f16 or f32 from
N(0, 1); outputs f32 or bf16; half with a bias), each checked once: a failed check is a false positive.
The largest |residual| / threshold seen is reported too (how close clean GEMMs come to the threshold).
Smallest error caught: on every clean GEMM one element C[i, j] is moved by d and d is bisected to the
smallest |d| the check flags (and locates at (i, j)); reported relative to the RMS of C's elements
(the size of a typical output), as the median and the maximum over GEMMs.
"""
import argparse
import json
import statistics

import numpy as np

import cubesim as cs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gemms", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    fp, worst, rel = 0, 0.0, {}
    for g in range(a.gemms):
        m, n = (int(x) for x in rng.integers(16, 257, size=2))
        k = int(rng.integers(64, 2049))
        din = ("bf16", "f16", "f32")[g % 3]
        dout = ("f32", "bf16")[(g // 3) % 2]
        A = rng.standard_normal((m, k)).astype(np.float32)
        B = rng.standard_normal((k, n)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32) if g % 2 else None
        C = cs.det_gemm(A, B, bias, dtype=din, out_dtype=dout)
        r = cs.abft_check(A, B, C, bias, dtype=din, out_dtype=dout)
        fp += not r["ok"]
        worst = max(worst, r["worst_ratio"])
        i, j = int(rng.integers(m)), int(rng.integers(n))
        rms = float(np.sqrt(np.mean(C.astype(np.float64) ** 2)))
        lo, hi = 0.0, 64.0 * rms
        for _ in range(40):
            d = (lo + hi) / 2
            C2 = C.copy()
            C2[i, j] = np.float32(C[i, j] + d)
            r2 = cs.abft_check(A, B, C2, bias, dtype=din, out_dtype=dout)
            if not r2["ok"] and r2["located"] == [(i, j)]:
                hi = d
            else:
                lo = d
        rel.setdefault(f"{din}->{dout}", []).append(hi / rms)
    print(f"ABFT on {a.gemms} clean random GEMMs: {fp} false positives; largest |residual|/threshold {worst:.3f}")
    print("smallest error caught and located, relative to the RMS of C (median / max over GEMMs):")
    rows = {}
    for key, v in sorted(rel.items()):
        rows[key] = {"median": statistics.median(v), "max": max(v), "gemms": len(v)}
        print(f"  {key:10s} {rows[key]['median']:.3g} / {rows[key]['max']:.3g}  ({len(v)} GEMMs)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gemms": a.gemms, "false_positives": fp, "worst_ratio": worst, "smallest_caught": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
