"""The SDC model's step in PyTorch on one GPU, with and without the recipe's word checksums: the
peer bench_sdc's cuda numbers are read against (same sizes, same run).

    python3 benches/sdc_torch.py [--layers 8] [--tokens 8192] [--hidden 4096] [--ffn 4096] [--steps 20] [--json F]

Per layer: the weight shard copied into the full weight (all_gather on one rank), y = x . W^T,
h = gelu(y, tanh); with checksums, each of shard, full, x and h viewed as int16 and summed in int64
(torch's own reduction; the position-sensitive mix sum has no torch equivalent, so only the word sum is
timed). Step time by CUDA events, median over steps, interleaved with / without.
"""
import argparse
import json
import statistics

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    w = (torch.rand(a.ffn, a.hidden, device=dev, generator=g) * 2 - 1).to(torch.bfloat16) * (3 / a.hidden) ** 0.5
    x = (torch.rand(a.tokens, a.hidden, device=dev, generator=g) * 3.4 - 1.7).to(torch.bfloat16)
    shards = [w.clone() for _ in range(a.layers)]
    fulls = [torch.empty_like(w) for _ in range(a.layers)]
    xs = [x.clone() for _ in range(a.layers)]
    outs = [torch.empty(a.tokens, a.ffn, device=dev, dtype=torch.bfloat16) for _ in range(a.layers)]
    sums = torch.zeros(4 * a.layers, device=dev, dtype=torch.int64)

    def step(checks):
        for i in range(a.layers):
            if checks:
                sums[4 * i] = shards[i].view(torch.int16).sum(dtype=torch.int64)
            fulls[i].copy_(shards[i])
            if checks:
                sums[4 * i + 1] = fulls[i].view(torch.int16).sum(dtype=torch.int64)
                sums[4 * i + 2] = xs[i].view(torch.int16).sum(dtype=torch.int64)
            outs[i].copy_(torch.nn.functional.gelu(xs[i] @ fulls[i].T, approximate="tanh"))
            if checks:
                sums[4 * i + 3] = outs[i].view(torch.int16).sum(dtype=torch.int64)

    def timed(checks):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        step(checks)
        e.record()
        if checks:
            sums.cpu()  # the one read per step
        torch.cuda.synchronize()
        return s.elapsed_time(e) / 1e3

    for _ in range(3):
        timed(True), timed(False)
    with_s, without_s = [], []
    for _ in range(a.steps):
        with_s.append(timed(True))
        without_s.append(timed(False))
    mw, mo = statistics.median(with_s), statistics.median(without_s)
    name = torch.cuda.get_device_name()
    print(f"torch on {name}: step with word checksums {mw * 1e3:.3f} ms, without {mo * 1e3:.3f} ms, "
          f"overhead {100 * (mw / mo - 1):+.2f}%")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": name, "torch": torch.__version__, "layers": a.layers, "tokens": a.tokens,
                       "hidden": a.hidden, "ffn": a.ffn, "with_s": with_s, "without_s": without_s,
                       "median_with_s": mw, "median_without_s": mo, "overhead": mw / mo - 1}, f, indent=1)


if __name__ == "__main__":
    main()
