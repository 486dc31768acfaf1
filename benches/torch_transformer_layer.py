"""The PyTorch reference for bench_tp_gpt's layer: a Llama-like transformer layer, forward and backward,
on one GPU (tp 1), as Megatron builds it: RMSNorm, a fused QKV linear (no bias), rotary embeddings
(non-interleaved), causal grouped-query attention (scaled_dot_product_attention, PyTorch's fused kernels),
the output projection, a residual; RMSNorm, a SwiGLU MLP (fc1 2 x ffn wide, silu(gate)·up, fc2), a
residual. bf16, one sequence. Times the step with CUDA events (median of --iters after --warmup) and
prints one JSON line (and writes it to --json).

    python3 benches/torch_transformer_layer.py --seq 4096 --hidden 4096 --heads 32 --kv-heads 8 --ffn 14336

Tensor parallel (tp 2, 4, ...; Megatron's layout without sequence parallelism): launched by torchrun,
each rank holds heads / tp query heads with their kv_heads / tp groups (the fused QKV's rows), ffn / tp
of the MLP, the output projection's and fc2's matching input columns; Megatron's two conjugate
operators around each block (identity forward / all-reduce backward before the column linear,
all-reduce forward / identity backward after the row linear) over NCCL. Rank 0 prints the JSON line.

    torchrun --nproc_per_node 4 benches/torch_transformer_layer.py --seq 4096
"""
import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F

_TP_GROUP = None


class _CopyToTp(torch.autograd.Function):
    """Before a column-parallel linear: the input as is; its gradient summed over the tp ranks."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        torch.distributed.all_reduce(g, group=_TP_GROUP)
        return g


class _ReduceFromTp(torch.autograd.Function):
    """After a row-parallel linear: the partial outputs summed over the tp ranks; the gradient as is."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        torch.distributed.all_reduce(x, group=_TP_GROUP)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


def rms_norm(x, w, eps=1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def rope(x, cos, sin):  # x [b, h, s, d], non-interleaved halves
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h].float(), x[..., h:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


def profile_split(step, steps=3):
    """Per step, the GPU kernel time (ms) by kind: GEMMs, attention (flash/SDPA kernels), the rest."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    out = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    top = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if not us or e.key.startswith("aten::") or e.key.startswith("cuda"):
            continue
        k = e.key.lower()
        kind = ("attention" if any(w in k for w in ("flash", "fmha", "attention", "sdpa")) else
                "gemm" if any(w in k for w in ("gemm", "xmma", "cutlass", "nvjet", "cublas", "wgmma", "sm90")) else "other")
        out[kind] += us / 1e3 / steps
        top.append((us / 1e3 / steps, kind, e.key[:90]))
    out["top"] = [{"ms": round(t, 4), "kind": k, "kernel": n} for t, k, n in sorted(top, reverse=True)[:12]]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=14336)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--profile", action="store_true",
                    help="also split one step's GPU kernel time into GEMMs, attention and the rest (torch.profiler)")
    a = ap.parse_args()
    tp = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if tp > 1:
        global _TP_GROUP
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group("nccl")
        _TP_GROUP = torch.distributed.group.WORLD
        if a.heads % tp or a.kv_heads % tp or a.ffn % tp:
            raise SystemExit(f"tp {tp} must divide heads {a.heads}, kv-heads {a.kv_heads} and ffn {a.ffn}")
    torch.manual_seed(rank)
    dt, dev = torch.bfloat16, "cuda"
    H, S, B = a.hidden, a.seq, a.batch
    d = H // a.heads
    nh, ng, ffn = a.heads // tp, a.kv_heads // tp, a.ffn // tp  # this rank's share
    copy_to = _CopyToTp.apply if tp > 1 else (lambda t: t)
    reduce_from = _ReduceFromTp.apply if tp > 1 else (lambda t: t)

    def param(*shape, std=0.02):
        return (torch.randn(*shape, device=dev, dtype=dt) * std).requires_grad_()

    w_n1, w_n2 = param(H, std=1.0), param(H, std=1.0)
    w_qkv, w_o = param((nh + 2 * ng) * d, H), param(H, nh * d)
    w_1, w_2 = param(2 * ffn, H), param(H, ffn)
    x = torch.randn(B, S, H, device=dev, dtype=dt, requires_grad=True)
    dy = torch.randn(B, S, H, device=dev, dtype=dt) * 0.1
    inv = 10000.0 ** (-torch.arange(0, d // 2, device=dev, dtype=torch.float64) * 2 / d)
    ang = torch.arange(S, device=dev, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = ang.cos().float(), ang.sin().float()

    def layer(x):
        h = copy_to(rms_norm(x, w_n1))
        qkv = F.linear(h, w_qkv)
        q, k, v = qkv.split([nh * d, ng * d, ng * d], -1)
        q = rope(q.view(B, S, nh, d).transpose(1, 2), cos, sin)
        k = rope(k.view(B, S, ng, d).transpose(1, 2), cos, sin)
        v = v.view(B, S, ng, d).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + reduce_from(F.linear(o.transpose(1, 2).reshape(B, S, nh * d), w_o))
        g, u = F.linear(copy_to(rms_norm(x, w_n2)), w_1).chunk(2, -1)
        return x + reduce_from(F.linear(F.silu(g) * u, w_2))

    def step():
        y = layer(x)
        y.backward(dy)

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(a.iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        step()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    split = profile_split(step) if a.profile else None
    if tp > 1:  # every rank's median; the step is as slow as its slowest rank
        med = torch.tensor([statistics.median(times)], device=dev)
        torch.distributed.all_reduce(med, op=torch.distributed.ReduceOp.MAX)
        times_med = med.item()
        torch.distributed.destroy_process_group()
        if rank != 0:
            return
    else:
        times_med = statistics.median(times)
    r = {"bench": "torch_transformer_layer", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
         "tp": tp, "seq": S, "batch": B, "hidden": H, "heads": a.heads, "kv_heads": a.kv_heads, "ffn": a.ffn,
         "step_ms_median": 1e3 * times_med, "step_ms_min": 1e3 * min(times),
         "kernel_ms": split}
    print(json.dumps(r))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f)


if __name__ == "__main__":
    main()
