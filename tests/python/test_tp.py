"""Tensor parallelism from Python: parallel_state and the layers inside spawn, the equivalence check,
and run_mlp."""
import numpy as np
import pytest

import cubesim as cs


def mlp_step(ctx, tp, x, dy, **opts):
    """ParallelMLP forward and backward with tp ranks, written in Python; returns rank 0's output,
    input gradient and each rank's fc1 weight-gradient shard."""
    out = {}

    def rank_fn(rank):
        cs.tp.initialize_model_parallel(tp)
        assert cs.tp.get_tensor_model_parallel_rank() == rank
        assert cs.tp.get_tensor_model_parallel_world_size() == tp
        assert cs.tp.get_tensor_model_parallel_group().size == tp
        mlp = cs.tp.ParallelMLP(ctx, hidden=x.shape[1], ffn=opts.get("ffn", 128), dtype="bf16", seed=11)
        y = mlp.forward(ctx.tensor(rank, x, "bf16"))
        dx = mlp.backward(ctx.tensor(rank, dy, "bf16"))
        out[rank] = (y.numpy(bits=True), dx.numpy(bits=True), mlp.fc1.weight_grad.numpy(bits=True))
        assert mlp.fc1.out_per_rank == opts.get("ffn", 128) // tp and mlp.fc2.in_per_rank == opts.get("ffn", 128) // tp
        assert mlp.pre_activation.shape == (x.shape[0], opts.get("ffn", 128) // tp)
        cs.tp.destroy_model_parallel()

    rep = ctx.spawn(rank_fn, nprocs=tp)
    return out, rep


def test_parallel_mlp_in_python_sim_equals_host_replay(rng):
    x = rng.standard_normal((16, 64)).astype(np.float32)
    dy = (0.1 * rng.standard_normal((16, 64))).astype(np.float32)
    sim, rep = mlp_step(cs.Context("sim", topology="ring4"), 4, x, dy)
    host, _ = mlp_step(cs.Context("host", world_size=4), 4, x, dy)
    for r in range(4):
        for a, b in zip(sim[r], host[r]):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(sim[r][0], sim[0][0])  # replicated output, bit for bit
    assert rep.sim_time_ps > 0 and all(t.comm_ps > 0 for t in rep.ranks)
    # Weight-gradient shards are bitwise the unsharded model's rows (the contract fixes their order).
    one, _ = mlp_step(cs.Context("host", world_size=1), 1, x, dy)
    full = np.concatenate([sim[r][2] for r in range(4)])
    np.testing.assert_array_equal(full, one[0][2])


def test_column_and_row_linear(rng):
    ctx = cs.Context("host", world_size=2)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    out = {}

    def rank_fn(rank):
        cs.tp.initialize_model_parallel(2)
        col = cs.tp.ColumnParallelLinear(ctx, 32, 48, gather_output=True, dtype="f32", seed=5)
        y, b = col.forward(ctx.tensor(rank, x, "f32"))
        assert b is None and y.shape == (8, 48) and col.weight.shape == (24, 32)
        row = cs.tp.RowParallelLinear(ctx, 48, 16, dtype="f32", seed=6, skip_bias_add=True)
        z, zb = row.forward(y)
        assert zb is not None and zb.shape == (16,) and z.shape == (8, 16)
        out[rank] = (y.numpy(), col.weight.numpy(), col.bias.numpy())
        cs.tp.destroy_model_parallel()

    ctx.spawn(rank_fn)
    w = np.concatenate([out[0][1], out[1][1]])
    b = np.concatenate([out[0][2], out[1][2]])
    # The master weight is the same whatever tp: element (i, j) comes from master_value.
    assert w[3, 7] == np.float32(cs.tp.master_value(5, 0, 3, 7, 32, 0.02))
    np.testing.assert_array_equal(out[0][0], cs.det_gemm(x, w.T, b))
    np.testing.assert_array_equal(out[0][0], out[1][0])


def test_layers_outside_spawn_say_so():
    ctx = cs.Context("host", world_size=1)
    with pytest.raises(ValueError, match=r"inside Context\.spawn\(\)"):
        cs.tp.ParallelMLP(ctx, hidden=8, ffn=16)


@pytest.mark.parametrize("tp,sp", [(1, False), (2, True), (4, False)])
def test_check_mlp_equivalence_on_sim(tp, sp):
    ctx = cs.Context("sim", topology="ring4", world_size=tp)
    rep = cs.tp.check_mlp_equivalence(ctx, tp=tp, tokens=32, hidden=64, ffn=256, sequence_parallel=sp, data_seed=3)
    assert rep.passed, [c for c in rep.checks if not c.passed]
    against = {c.against for c in rep.checks}
    assert {"unsharded", "host replay"} <= against
    tensors = {c.tensor for c in rep.checks}
    assert {"output", "input_grad", "fc1.weight_grad", "fc2.weight_grad", "fc1.bias_grad"} <= tensors
    for c in rep.checks:
        if c.against == "host replay" or c.bitwise_claim:
            assert c.bitwise and c.max_abs == 0
        else:
            assert c.rel_norm <= c.tolerance == pytest.approx(cs.tp.tp_tolerance("bf16", tp))
    if tp > 1:
        out = [c for c in rep.checks if c.tensor == "output" and c.against == "unsharded"][0]
        assert not out.bitwise_claim and out.max_abs > 0  # tp partial sums round differently
    assert rep.run.sim_time_ps > 0 and len(rep.run.ranks) == tp
    assert rep.max_abs == max(c.max_abs for c in rep.checks)
    assert set(rep.checks[0].to_dict()) == {"tensor", "against", "claim", "bitwise", "max_abs", "rel_norm",
                                           "tolerance", "pass"}


def test_check_mlp_equivalence_on_host_and_errors():
    rep = cs.tp.check_mlp_equivalence(cs.Context("host", world_size=2), tp=2, tokens=8, hidden=32, ffn=64)
    assert rep.passed and {c.against for c in rep.checks} == {"unsharded", "ranks"}
    with pytest.raises(ValueError, match="tp 3 needs 1 to 2 ranks"):
        cs.tp.check_mlp_equivalence(cs.Context("host", world_size=2), tp=3)
    with pytest.raises(ValueError, match="timing-only"):
        cs.tp.check_mlp_equivalence(cs.Context("sim", timing_only=True))
    with pytest.raises(cs.RankError, match="not divisible by the tensor-parallel size 3"):
        cs.tp.run_mlp(cs.Context("host", world_size=3), tp=3, tokens=8, hidden=32, ffn=64)


def test_valid_tp_sizes():
    for devices in (1, 4, 8, 16):
        for ffn in (7, 96, 4096):
            for tokens in (10, 64):
                for sp in (False, True):
                    want = [p for p in range(1, devices + 1) if ffn % p == 0 and (not sp or tokens % p == 0)]
                    assert cs.tp.valid_tp_sizes(devices, ffn=ffn, tokens=tokens, sequence_parallel=sp) == want
    with pytest.raises(ValueError, match="devices 0 is not valid"):
        cs.tp.valid_tp_sizes(0, ffn=64, tokens=8)


@pytest.mark.parametrize("algorithm", [a["name"] for a in cs.algorithms() if "all_reduce" in a["collectives"]])
def test_check_mlp_equivalence_on_sim_with_every_algorithm(algorithm):
    # The host replay runs the collectives as the context does, so its bits match for every algorithm.
    ctx = cs.Context("sim", world_size=8, topology="mesh4x4", algorithm=algorithm)
    rep = cs.tp.check_mlp_equivalence(ctx, tp=8, tokens=16, hidden=32, ffn=64)
    assert rep.passed, [c for c in rep.checks if not c.passed]
    assert sum(c.against == "host replay" for c in rep.checks) == 7


def test_run_mlp_errors():
    with pytest.raises(ValueError, match=r"sequence parallel needs tokens \(6\) divisible by tp \(4\)"):
        cs.tp.run_mlp(cs.Context("host", world_size=4), tp=4, tokens=6, hidden=32, ffn=64, sequence_parallel=True)
    with pytest.raises(ValueError, match="tp 5 needs 1 to 4 ranks"):
        cs.tp.run_mlp(cs.Context("host", world_size=4), tp=5)
