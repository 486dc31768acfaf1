"""Issue 13 (hardening) for the Python API and the runtime: every case here crashed, answered wrongly
or gave an unclear error before; each test names the case it pins."""
import os

import numpy as np
import pytest

import cubesim as cs


def ring_all_reduce_on_host(xs):
    """The same ring all-reduce on the host reference: the sim backend must match it bit for bit."""
    h = cs.Context("host", world_size=len(xs))
    ts = [h.tensor(r, x) for r, x in enumerate(xs)]
    h.spawn(lambda rank: cs.all_reduce(ts[rank]))
    return [t.numpy() for t in ts]


# ---- 1: tensors of one context used by the ranks of another ----------------------------------------


@pytest.mark.parametrize("op", ["matmul", "all_reduce", "add", "send"])
def test_tensor_of_another_context_is_refused_naming_both(op):
    sim = cs.Context("sim", topology="ring4", world_size=2)
    host = cs.Context("host", world_size=2)
    for owner, runner, theirs, ours in ((sim, host, "simulated 'ring4'", "host reference"),
                                        (host, sim, "host reference", "simulated 'ring4'")):
        foreign = [owner.zeros(r, [4, 4]) for r in range(2)]

        def fn(rank):
            mine = runner.zeros(rank, [4, 4])
            if op == "matmul":
                cs.matmul(foreign[rank], mine, runner.zeros(rank, [4, 4]))
            elif op == "all_reduce":
                cs.all_reduce(foreign[rank])
            elif op == "add":
                cs.add(mine, foreign[rank], mine)
            elif rank == 0:
                cs.send(foreign[0], 1)
            else:
                cs.recv(mine, 0)

        with pytest.raises(cs.RankError) as e:
            runner.spawn(fn)
        msg = str(e.value)
        assert f"belongs to a context on the {theirs}" in msg, msg
        assert f"runs in a context on the {ours}" in msg, msg
        assert isinstance(e.value.__cause__, ValueError)
        # The context is still usable afterwards.
        ok = [runner.tensor(r, np.full(4, r + 1.0, np.float32)) for r in range(2)]
        runner.spawn(lambda rank: cs.all_reduce(ok[rank]))
        assert ok[1].numpy().tolist() == [3.0] * 4


# ---- 2: deep and self-referencing Python values as JSON ---------------------------------------------


def test_self_referencing_and_deep_values_are_refused_naming_the_argument():
    doc = cs.load_topology_json("single_cube")
    loop = []
    loop.append(loop)
    d = {}
    d["me"] = d
    deep = 0
    for _ in range(100_000):
        deep = [deep]
    calls = {
        "doc": lambda v: cs.topology_from_json({**doc, "_comment": v}),
        "value": lambda v: cs.apply_override(doc, "cube.hbm.bandwidth_GBps", v),
        "overrides": lambda v: cs.load_topology("single_cube", overrides={"cube.hbm.bandwidth_GBps": v}),
    }
    for arg, call in calls.items():
        for v in (loop, d, [1, {"x": loop}]):
            with pytest.raises(ValueError, match=rf"^{arg}.*contains itself \(a cycle"):
                call(v)
        with pytest.raises(ValueError, match=rf"^{arg}.*nested deeper than 64 dicts and lists"):
            call(deep)
    # A shared (not cyclic) sub-list is fine: the same object twice is a tree, not a cycle.
    shared = [1, 2]
    assert cs.apply_override(doc, "cube.hbm.bandwidth_GBps", 512)["cube"]["hbm"]["bandwidth_GBps"] == 512
    cs.topology_from_json({**doc, "_comment": [shared, shared]})


# ---- 3: shapes whose byte size overflows ------------------------------------------------------------


def test_shapes_past_the_tensor_byte_limit_are_refused_before_allocating():
    h = cs.Context("host", world_size=2)
    for shape, dtype in (([2**32, 2**32, 4], "f32"),   # 2^66 elements: the byte count wrapped to 0
                         ([2**62, 4], "bf16"),         # 2^64 elements x 2 bytes
                         ([2**31, 2**31], "f16"),      # 2^63 bytes
                         ([0, 2**62, 2**62], "f32"),   # no elements, but strides that overflow
                         ([2**46 + 1, 4], "f32")):     # just past 2^48 bytes
        for make in (h.empty, h.zeros):
            with pytest.raises(ValueError, match=r"is too large: the largest tensor holds 281474976710656 bytes \(2\^48\)"):
                make(1, shape, dtype)
    t = h.zeros(0, [3, 5])
    with pytest.raises(ValueError, match="reshape: shape .* is too large"):
        t.reshape([2**32, 2**32, 4])
    # Right at the limit's edge the check is exact: 2^46 f32 elements are 2^48 bytes (a timing-only sim
    # context allocates nothing on the host, so the limit itself is reachable; its HBM refuses it).
    small = h.zeros(1, [2, 3])
    small.copy_from(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert small.numpy().tolist() == [[0, 1, 2], [3, 4, 5]]


# ---- 4: ints past 2^64 ------------------------------------------------------------------------------


def test_ints_out_of_range_name_the_argument_and_the_range():
    h = cs.Context("host", world_size=2)
    big = 2**64
    with pytest.raises(ValueError, match=r"empty: shape\[1\]: 18446744073709551616 is out of range; valid: 0 to 2\^63-1"):
        h.empty(0, [1, big])
    with pytest.raises(ValueError, match=r"zeros: rank: 18446744073709551616 is out of range; valid: 0 to 1"):
        h.zeros(big, [1])
    with pytest.raises(ValueError, match=r"zeros: rank: -1 is out of range; valid: 0 to 1"):
        h.zeros(-1, [1])
    with pytest.raises(ValueError, match=r"empty: shape\[0\]: -3 is out of range"):
        h.empty(0, [-3])
    with pytest.raises(TypeError, match=r"empty: shape\[0\]: expected an int, got a str"):
        h.empty(0, ["3"])
    with pytest.raises(ValueError, match=r"nccl_plan: bytes: 18446744073709551616 is out of range; valid: 0 to 2\^64-1"):
        cs.nccl_plan("all_reduce", 4, big)
    with pytest.raises(ValueError, match=r"doc\['x'\]: integer 18446744073709551616 is out of range"):
        cs.topology_from_json({"x": big})
    for kw in ("seed", "data_seed"):
        for v in (big, -1):
            with pytest.raises(ValueError, match=rf"^{kw}: {v} is out of range; valid: 0 to 2\^64-1"):
                cs.tp.run_mlp(cs.Context("host", world_size=1), tokens=8, hidden=16, ffn=32, **{kw: v})
    with pytest.raises(ValueError, match=r"Context: world_size: 18446744073709551616 is out of range; valid: 0 to"):
        cs.Context("host", world_size=big)
    with pytest.raises(ValueError, match=r"Context: stack_size: -1 is out of range"):
        cs.Context("host", world_size=1, stack_size=-1)
    with pytest.raises(ValueError, match=r"spawn: nprocs: 18446744073709551616 is out of range"):
        h.spawn(lambda rank: None, nprocs=big)
    t = h.zeros(0, [4, 4])
    with pytest.raises(ValueError, match=r"narrow: start: 18446744073709551616 is out of range; valid: 0 to 2\^63-1"):
        t.narrow(0, big, 1)
    with pytest.raises(ValueError, match=r"chunk: n: 0 is out of range; valid: 1 to 2\^63-1"):
        t.chunk(0)

    def send_far(rank):
        cs.send(t, big) if rank == 0 else None

    with pytest.raises(cs.RankError, match=r"send: dst: 18446744073709551616 is out of range; valid: 0 to 2147483647"):
        h.spawn(send_far)
    for kw, msg in ((dict(tp=big), r"tp: 18446744073709551616 is out of range; valid: 1 to 2147483647"),
                    (dict(tokens=0), r"tokens: 0 is out of range; valid: 1 to 2\^63-1"),
                    (dict(hidden=-(2**70)), r"hidden: -1180591620717411303424 is out of range"),
                    (dict(ffn=2**64), r"ffn: 18446744073709551616 is out of range")):
        with pytest.raises(ValueError, match=msg):
            cs.tp.check_mlp_equivalence(cs.Context("host", world_size=1), **kw)
    ctx4 = cs.Context("host", world_size=2)
    with pytest.raises(ValueError, match=r"run_collective: root: 18446744073709551616 is out of range; valid: 0 to"):
        ctx4.run_collective("broadcast", [np.ones(2)] * 2, root=big)
    with pytest.raises(ValueError, match=r"hierarchy: -1 is out of range; valid: 0 to 1048576"):
        ctx4.run_collective("all_reduce", [np.ones(2)] * 2, hierarchy=-1)
    with pytest.raises(cs.RankError, match=r"hierarchy: 18446744073709551616 is out of range"):
        ctx4.spawn(lambda rank: cs.all_reduce(ctx4.zeros(rank, [2]), hierarchy=big))
    # The largest valid value still works where it is taken.
    assert cs.nccl_plan("all_reduce", 4, 2**64 - 1)["plan"]


def test_cli_exits_2_for_a_seed_past_2_64(tmp_path):
    import subprocess
    import sys
    import os
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-m", "cubesim", "run", "--seed", str(2**64), "--tokens", "8", "--hidden", "16",
                        "--ffn", "32"], capture_output=True, text=True, env=env)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "Unable to cast" not in r.stderr
    assert "seed" in r.stderr


# ---- 5: copy_from checks the shape -------------------------------------------------------------------


class ArrayLike:
    """Not a numpy array: only __array__ (as torch tensors and many others have)."""

    def __init__(self, a):
        self.a = a

    def __array__(self, dtype=None, copy=None):
        return self.a if dtype is None else self.a.astype(dtype)

    def __repr__(self):
        return "ArrayLike(" + "x" * 10_000 + ")"  # a huge repr must not end up in the message


class DlpackOnly:
    def __init__(self, a):
        self.a = a

    def __dlpack__(self, *args, **kwargs):
        return self.a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_copy_from_requires_the_same_shape(rng):
    h = cs.Context("host", world_size=1)
    w = h.zeros(0, [3, 5])
    wt = rng.standard_normal((5, 3)).astype(np.float32)  # the transposed weight: same element count
    with pytest.raises(ValueError, match=r"copy_from: the source \(ndarray\) has shape \[5, 3\] but the tensor "
                                         r"f32\[3, 5\] on rank 0 has shape \[3, 5\]"):
        w.copy_from(wt)
    with pytest.raises(ValueError, match=r"has shape \[15\]"):
        w.copy_from(wt.ravel())
    with pytest.raises(ValueError) as e:
        w.copy_from(ArrayLike(wt))
    assert "(ArrayLike)" in str(e.value) and "xxxxxxxxxx" not in str(e.value)
    assert w.numpy().tolist() == np.zeros((3, 5)).tolist()  # nothing was written
    w.copy_from(ArrayLike(wt.T))
    assert np.array_equal(w.numpy(), wt.T)
    w2 = h.zeros(0, [3, 5])
    w2.copy_from(DlpackOnly(np.ascontiguousarray(wt.T)))
    assert np.array_equal(w2.numpy(), wt.T)
    w2.copy_from((wt.T * 2).tolist())  # nested lists work too
    assert np.array_equal(w2.numpy(), wt.T * 2)
    for junk, kind in ((object(), "object"), ("abc", "str"), ([[1, 2], [3]], "list")):
        with pytest.raises((TypeError, ValueError), match=rf"copy_from: .*the source \({kind}"):
            w2.copy_from(junk)
    torch = pytest.importorskip("torch")
    w3 = h.zeros(0, [3, 5])
    w3.copy_from(torch.from_numpy(np.ascontiguousarray(wt.T)))
    assert np.array_equal(w3.numpy(), wt.T)
    with pytest.raises(ValueError, match=r"\(Tensor\) has shape \[5, 3\]"):
        w3.copy_from(torch.from_numpy(wt))


# ---- 6: new_group sorts its ranks like torch.distributed ---------------------------------------------


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_new_group_sorts_ranks_like_torch(backend, rng):
    ctx = cs.Context(backend, 4, **({"topology": "ring4"} if backend == "sim" else {}))
    g = ctx.new_group([3, 1])
    assert g.ranks == [1, 3] and g.index_of(1) == 0 and g.index_of(3) == 1
    assert ctx.new_group([1, 3]) is g
    xs = {r: rng.standard_normal(4).astype(np.float32) for r in (1, 3)}
    big = {r: rng.standard_normal(8).astype(np.float32) for r in (1, 3)}
    out = {}

    def fn(rank):
        if rank not in (1, 3):
            return
        grp = ctx.new_group([3, 1])
        o = ctx.zeros(rank, [8])
        cs.all_gather(o, ctx.tensor(rank, xs[rank]), group=grp)
        rs = ctx.zeros(rank, [4])
        cs.reduce_scatter(rs, ctx.tensor(rank, big[rank]), group=grp)
        out[rank] = (o.numpy(), rs.numpy())

    ctx.spawn(fn)
    gathered = np.concatenate([xs[1], xs[3]])  # torch's order: ascending ranks
    summed = (big[1] + big[3]).astype(np.float32)
    for r in (1, 3):
        assert np.array_equal(out[r][0], gathered)
    assert np.array_equal(out[1][1], summed[:4]) and np.array_equal(out[3][1], summed[4:])


# ---- 7: a failed run leaves a usable context ----------------------------------------------------------


@pytest.mark.parametrize("backend", ["sim", "host"])
def test_a_run_failing_mid_collective_leaves_a_usable_context(backend, rng):
    ctx = cs.Context(backend, 4, **({"topology": "ring4"} if backend == "sim" else {}))
    n = 1 << 16
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(4)]
    ts = [ctx.tensor(r, x) for r, x in enumerate(xs)]

    def bad(rank):
        w = cs.all_reduce(ts[rank], async_op=True)  # transfers in flight when rank 0 raises
        if rank == 0:
            raise KeyError("boom mid-collective")
        w.wait()

    with pytest.raises(cs.RankError, match="rank 0"):
        ctx.spawn(bad)
    for r in range(4):  # host writes into memory the failed run's transfers were using
        ts[r].copy_from(xs[r])
    ctx.spawn(lambda rank: cs.all_reduce(ts[rank]))
    want = ring_all_reduce_on_host(xs)
    for r in range(4):
        assert np.array_equal(ts[r].numpy(), want[r])


def test_a_run_failing_mid_send_leaves_a_usable_context(rng):
    ctx = cs.Context("sim", topology="ring4")
    x = rng.standard_normal(1 << 15).astype(np.float32)
    src = ctx.tensor(0, x)
    dst = ctx.zeros(1, [1 << 15])

    def bad(rank):
        if rank == 0:
            cs.send(src, 1)
        elif rank == 1:
            raise ValueError("the receiver fails")

    with pytest.raises(cs.RankError, match="the receiver fails"):
        ctx.spawn(bad, 2)

    def good(rank):
        if rank == 0:
            cs.send(src, 1)
        elif rank == 1:
            cs.recv(dst, 0)

    ctx.spawn(good, 2)
    assert np.array_equal(dst.numpy(), x)

    # A third rank fails while the send is on the wire (sender and receiver both posted at 0 ps, so the
    # transfer is in flight when the run stops): the context forgets that transfer, so neither a host
    # write into its destination nor the next run's transfer into it is a hazard against it. (The
    # receiver failing above never starts a transfer: a message is sent when both sides have posted.)
    def fails_mid_send(rank):
        if rank == 0:
            cs.send(src, 1)
        elif rank == 1:
            cs.recv(dst, 0)
        elif rank == 2:
            raise ValueError("a third rank fails")

    with pytest.raises(cs.RankError, match="a third rank fails"):
        ctx.spawn(fails_mid_send, 3)
    dst.copy_from(np.zeros(1 << 15, np.float32))
    ctx.spawn(good, 2)
    assert np.array_equal(dst.numpy(), x)


# ---- 8: a rank function with the wrong signature ----------------------------------------------------


def test_a_rank_function_with_the_wrong_signature_is_a_type_error_naming_it():
    ctx = cs.Context("host", world_size=2)

    def no_args():
        pass

    def two_args(rank, world):
        pass

    for fn, sig in ((no_args, r"no_args\(\)"), (two_args, r"two_args\(rank, world\)")):
        with pytest.raises(TypeError, match=rf"Context.spawn\(\): the rank function .*{sig} cannot be called as "
                                            rf".*\(rank\).*def .*\(rank\)"):
            ctx.spawn(fn)
    for junk in (5, "fn", None):
        with pytest.raises(TypeError, match=r"Context.spawn\(\): fn must be a function of the rank, def fn\(rank\)"):
            ctx.spawn(junk)
    ctx.spawn(lambda rank, extra=1: None)  # a default for the rest is fine
    ctx.spawn(lambda *args: None)


# ---- 9: failures in PE helper processes name the owning rank ------------------------------------------


def test_a_failure_in_a_pe_helper_process_names_its_rank():
    ctx = cs.Context("sim", topology="ring4", check_uninitialized=True, ranks_on=[3, 1, 2, 0])

    def fn(rank):
        a = ctx.empty(rank, [64, 64])  # never written: the PE's DMA reads unwritten bytes
        if rank == 1:
            cs.matmul(a, ctx.zeros(rank, [64, 64]), ctx.zeros(rank, [64, 64]))

    with pytest.raises(cs.RankError) as e:
        ctx.spawn(fn)
    assert e.value.failures[0][0] == 1, e.value.failures  # rank 1, on cube 1 here
    assert "rank -1" not in str(e.value)
    assert "spawn: rank 1 failed" in str(e.value)
    assert "in its helper process 'cube1.pe" in str(e.value)
    # Python spellings (case 12): the option as Python sets it, not SystemOptions::check_uninitialized.
    assert "Context(check_uninitialized=False)" in str(e.value) and "::" not in str(e.value)


# ---- 10: matmul messages and aliasing ------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["host", "sim"])
def test_matmul_shape_message_and_aliasing(backend):
    ctx = cs.Context(backend, 1, **({"topology": "single_cube"} if backend == "sim" else {}))

    def bad_k(rank):
        cs.matmul(ctx.zeros(0, [4, 3]), ctx.zeros(0, [4, 5]), ctx.zeros(0, [4, 5]))

    with pytest.raises(cs.RankError, match=r"A \[4, 3\] times B \[4, 5\] is not defined: A's columns \(3\) must "
                                           r"equal B's rows \(4\)") as e:
        ctx.spawn(bad_k)
    assert "gives" not in str(e.value)

    def bad_c(rank):
        cs.matmul(ctx.zeros(0, [4, 3]), ctx.zeros(0, [3, 5]), ctx.zeros(0, [5, 4]))

    with pytest.raises(cs.RankError, match=r"gives \[4, 5\], but the output C is \[5, 4\]; give an output of shape "
                                           r"\[4, 5\]"):
        ctx.spawn(bad_c)

    for alias in ("a", "b", "view", "bias"):
        def fn(rank):
            a = ctx.zeros(0, [4, 4])
            b = ctx.zeros(0, [4, 4])
            if alias == "a":
                cs.matmul(a, b, a)
            elif alias == "b":
                cs.matmul(a, b, b)
            elif alias == "view":  # an overlapping view of a larger buffer
                buf = ctx.zeros(0, [8, 4])
                cs.matmul(buf.narrow(0, 0, 4), b, buf.narrow(0, 2, 4))
            else:
                buf = ctx.zeros(0, [5, 4])
                cs.matmul(a, b, buf.narrow(0, 0, 4), bias=buf.narrow(0, 3, 1).reshape([4]))

        with pytest.raises(cs.RankError, match="shares memory with input"):
            ctx.spawn(fn)

    def disjoint_views(rank):  # views of one buffer that do not overlap are fine
        buf = ctx.zeros(0, [8, 4])
        cs.matmul(buf.narrow(0, 0, 4), ctx.zeros(0, [4, 4]), buf.narrow(0, 4, 4))

    ctx.spawn(disjoint_views)


# ---- 11: halving-doubling on 3 ranks -------------------------------------------------------------------


def test_halving_doubling_on_3_ranks_is_refused_up_front():
    ctx = cs.Context("sim", topology="ring4", world_size=3)
    before = ctx.now_ps
    for coll in ("all_gather", "reduce_scatter"):
        with pytest.raises(ValueError, match=rf"halving_doubling {coll} needs a power-of-two group \(1, 2, 4, 8, \.\.\. "
                                             rf"ranks\), not 3 ranks; use ring") as e:
            ctx.run_collective(coll, [np.ones(6, np.float32)] * 3, algorithm="halving_doubling")
        assert not isinstance(e.value, cs.RankError)
    assert ctx.now_ps == before  # nothing ran
    ctx.run_collective("all_reduce", [np.ones(6, np.float32)] * 3, algorithm="halving_doubling")  # any size


def test_an_mlp_whose_algorithm_cannot_run_on_its_tp_group_is_refused_before_the_run():
    kw = dict(tp=3, tokens=12, hidden=48, ffn=96, sequence_parallel=True)
    ctx = cs.Context("sim", topology="ring4", world_size=3, algorithm="halving_doubling", timing_only=True)
    before = ctx.now_ps
    for job in (cs.tp.run_mlp, cs.tp.check_mlp_equivalence):
        with pytest.raises(ValueError, match=rf"{job.__name__} \(tp 3, sequence parallel\): halving_doubling "
                                             r"all_gather needs a power-of-two group .* not 3 ranks") as e:
            job(ctx, **kw)
        assert not isinstance(e.value, cs.RankError)
    assert ctx.now_ps == before  # nothing ran
    tree = cs.Context("sim", topology="ring4", world_size=3, algorithm="tree", timing_only=True)
    with pytest.raises(ValueError, match=r"algorithm 'tree' does no all_gather; valid: ring, direct"):
        cs.tp.run_mlp(tree, **kw)
    # Without sequence parallelism the step runs all_reduce only, which halving_doubling does on 3 ranks.
    assert cs.tp.run_mlp(ctx, **{**kw, "sequence_parallel": False}).sim_time_ps > 0


def test_cli_run_refuses_halving_doubling_on_3_ranks_with_exit_2():
    import os
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "cubesim", "run", "--topology", "ring4", "--tp", "3", "--algorithm",
                        "halving_doubling", "--sequence-parallel", "--hidden", "48", "--ffn", "96", "--tokens", "12"],
                       capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "halving_doubling all_gather needs a power-of-two group" in r.stderr and "RankError" not in r.stderr
    assert "the run failed" not in r.stderr


# ---- 12: Python spellings in messages ------------------------------------------------------------------


def test_messages_use_python_spellings():
    with pytest.raises(ValueError) as e:
        cs.current_rank()
    assert "Context.spawn()" in str(e.value) and "::" not in str(e.value)
    ctx = cs.Context("host", world_size=1)
    with pytest.raises(cs.RankError) as e:
        ctx.spawn(lambda rank: cs.tp.get_tensor_model_parallel_rank())
    assert "tp.initialize_model_parallel" in str(e.value) and "::" not in str(e.value)


# ---- found by the fuzzer (test_fuzz_api.py) -----------------------------------------------------------


def test_strings_without_utf8_are_a_value_error_naming_where():
    doc = cs.load_topology_json("single_cube")
    with pytest.raises(ValueError, match=r"^doc\['_comment'\]: the string .* cannot be encoded as UTF-8"):
        cs.topology_from_json({**doc, "_comment": "\udcff"})
    with pytest.raises(ValueError, match=r"^doc \(a key\): the string .* cannot be encoded as UTF-8"):
        cs.topology_from_json({**doc, "\udcff": 1})
    with pytest.raises(ValueError, match=r"^overrides: a path: the string .* cannot be encoded as UTF-8"):
        cs.load_topology("single_cube", overrides={"\udcff": 1})


@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="under AddressSanitizer (make asan-test) a failed operator new aborts the process "
                           "instead of throwing std::bad_alloc, whatever allocator_may_return_null says")
def test_host_out_of_memory_names_the_allocation():
    h = cs.Context("host", world_size=1)
    with pytest.raises(MemoryError, match=r"allocation 'empty' on rank 0: the host backend cannot allocate "
                                          r"281474976710656 bytes of host memory"):
        h.empty(0, [2**46])  # exactly the tensor byte limit: allowed, but no host has it


def test_device_out_of_memory_is_an_out_of_memory_error_naming_the_memory():
    """A simulated HBM that cannot hold an allocation was a bare RuntimeError; now cubesim.OutOfMemoryError
    (a RuntimeError, as torch.OutOfMemoryError is), inside a rank function too."""
    ctx = cs.Context("sim", topology="single_cube")
    with pytest.raises(cs.OutOfMemoryError, match=r"cube0\.hbm: out of memory: cannot allocate 4\.00 TiB .* for "
                                                  r"'empty': capacity 16\.00 GiB"):
        ctx.empty(0, [2**40])
    assert issubclass(cs.OutOfMemoryError, RuntimeError)
    seen = []

    def fn(rank):
        try:
            ctx.zeros(rank, [2**40])
        except cs.OutOfMemoryError as e:
            seen.append(str(e))
            raise

    with pytest.raises(cs.RankError, match=r"rank 0: OutOfMemoryError: cube0\.hbm: out of memory") as e:
        ctx.spawn(fn, 1)
    assert len(seen) == 1 and isinstance(e.value.__cause__, cs.OutOfMemoryError)
    ctx.spawn(lambda rank: ctx.zeros(rank, [1024]), 1)  # the context is still usable


def test_a_rank_count_beyond_the_limit_is_refused_before_any_work_with_the_memory_it_needs():
    with pytest.raises(ValueError, match=r"70000 ranks: the limit is 65536 ranks per context.*would need about 17\.1 GiB"):
        cs.Context("host", world_size=70000)
