"""cubesim: a discrete-event simulator of accelerator systems with a tensor-parallel runtime.

The compiled extension `_cubesim` holds the simulator; this package re-exports it and adds the
command line (`python3 -m cubesim`, or `build/bin/cubesim`). Build with `make` and put
`build/python` on PYTHONPATH (the launcher and the Makefile do this).

    import numpy as np
    import cubesim as cs

    cs.list_topologies()                               # ['dgx_h100x8', ..., 'single_cube', ...]
    topo = cs.load_topology("ring4", overrides={"network.link.bandwidth_GBps": 64})

    ctx = cs.Context("sim", topology="ring4", trace=True)    # one rank per cube
    def step(rank):                                    # runs as a simulated process per rank
        x = ctx.tensor(rank, np.random.default_rng(rank).standard_normal(4096), "bf16")
        cs.all_reduce(x, algorithm="ring")
    report = ctx.spawn(step)                           # RunReport: sim_time_ps, ranks, tracks
    ctx.save_trace("allreduce.json")                   # open in ui.perfetto.dev

    # whole-run helpers (no Python inside the simulation)
    res = ctx.run_collective("all_reduce", [np.ones(8)] * 4, dtype="bf16")
    rep = cs.tp.check_mlp_equivalence(ctx, tp=4, hidden=512, ffn=2048, tokens=64)

Numpy conversions (Context.tensor, Tensor.numpy, det_gemm): float and integer arrays are converted
by value (to float32, then rounded to nearest even to bf16/f16 exactly as CUDA does); uint16 arrays
are bf16/f16 bit patterns and uint32 arrays f32 bit patterns, taken unchanged. Results come back as
float32 (bf16/f16 widen exactly), or as bit patterns with bits=True.

Errors raised in C++ arrive as Python exceptions with the same message: ValueError for bad
arguments (shapes, dtypes, ranks, ints out of range: the message names the argument and the valid
range), TypeError for a value of the wrong type, TopologyError (a ValueError) naming the JSON path,
RankError naming the failing ranks, CollectiveError, BackendUnavailableError, OutOfMemoryError (a
RuntimeError, as torch's is) when a device memory (simulated HBM, a GPU) cannot hold an allocation,
MemoryError when the host cannot hold a tensor.

Limits: a tensor holds at most 2^48 bytes; a document or override value given as Python objects
nests at most 64 dicts and lists and must not contain itself. Tensors belong to the Context that
made them. new_group sorts its ranks (as torch.distributed does).
"""
from . import _cubesim
from ._cubesim import (
    DEFAULT_TOPOLOGY,
    BackendUnavailableError,
    CollectiveError,
    CollectiveResult,
    Context,
    OutOfMemoryError,
    ProcessGroup,
    RankError,
    RankTimeline,
    RunReport,
    Tensor,
    Topology,
    TopologyError,
    TrackStats,
    Work,
    add,
    add_bias,
    all_gather,
    algorithms,
    all_reduce,
    apply_override,
    backend_info,
    backends,
    barrier,
    bias_grad,
    broadcast,
    copy,
    core,
    cpu_has_avx2_fma,
    cuda_built,
    cuda_device_count,
    current_rank,
    abft_check,
    checksum,
    det_gemm,
    det_gemm_backward_input,
    det_gemm_backward_weight,
    det_gemm_bias_grad,
    from_bits,
    gelu,
    gelu_backward,
    list_topologies,
    load_topology,
    load_topology_json,
    matmul,
    nccl_plan,
    recv,
    reduce_scatter,
    round_to,
    send,
    supported_algorithms,
    to_bits,
    topology_dir,
    topology_from_json,
    tp,
)

__version__ = "0.1.0"

DTYPES = ("f32", "bf16", "f16")


def validate_topology(doc_or_path, origin=None):
    """Validates a topology and returns it; raises TopologyError naming the JSON path if invalid.

    doc_or_path: a dict (a resolved document, e.g. from load_topology_json + apply_override), or a
    shipped name or a path to a JSON file.
    """
    if isinstance(doc_or_path, dict):
        return topology_from_json(doc_or_path, origin or "<json>")
    return load_topology(str(doc_or_path))


from . import sdc  # noqa: E402  (silent data corruption: cubesim.sdc.run / campaign)
from . import sweep  # noqa: E402  (design-space sweeps: cubesim.sweep.plan / run / load)
from . import numerics  # noqa: E402  (layer-wise error against fp32: cubesim.numerics.run)

__all__ = [name for name in dir() if not name.startswith("_")]
