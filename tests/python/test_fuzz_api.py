"""A seeded fuzzer for the Python API's topology and tensor entry points (issue 13, Deliver 2).

Each case calls topology_from_json, apply_override, load_topology(overrides=), Context.empty/zeros,
Tensor.reshape or Tensor.copy_from with random, mostly malformed input (mutated shipped topology
documents, deep and cyclic containers, huge and negative ints, NaN, wrong types, shapes past the
tensor byte limit, arrays of the wrong shape or dtype) and asserts that it either works or raises
one of the documented Python exceptions (ValueError, TopologyError, TypeError; MemoryError or an
out-of-memory RuntimeError for an allocation that does not fit) with a message that is not empty
and not a dump of the input. A crash fails the whole test run, which is the point.

CI runs a few hundred cases (about a second). A longer run, for developers:

    CUBESIM_FUZZ_CASES=200000 CUBESIM_FUZZ_SEED=7 PYTHONPATH=build/python \\
        python3 -m pytest -q tests/python/test_fuzz_api.py

A failure prints the seed and the case number; CUBESIM_FUZZ_SEED=<seed> reproduces it.
"""
import copy
import math
import os
import random

import numpy as np
import pytest

import cubesim as cs

CASES = int(os.environ.get("CUBESIM_FUZZ_CASES", "300"))
SEED = int(os.environ.get("CUBESIM_FUZZ_SEED", "13"))
MAX_MESSAGE = 2000  # no error may dump its input: messages stay short


def check_outcome(call, what):
    """Runs call(); a documented exception is fine, anything else fails the test."""
    try:
        call()
    except (ValueError, TypeError) as e:  # TopologyError is a ValueError
        msg = str(e)
        assert msg.strip(), f"{what}: {type(e).__name__} with an empty message"
        assert len(msg) < MAX_MESSAGE, f"{what}: a {len(msg)}-character message: {msg[:300]}..."
        assert "Unable to cast" not in msg and "incompatible function arguments" not in msg, f"{what}: {msg[:300]}"
    except MemoryError as e:
        assert str(e).strip(), f"{what}: MemoryError with an empty message"
    except RuntimeError as e:  # only an allocation that does not fit the simulated memory
        assert "out of memory" in str(e), f"{what}: unexpected {type(e).__name__}: {str(e)[:300]}"


# ---- random values ------------------------------------------------------------------------------------


def deep(r, depth):
    v = r.choice([0, "x", None, {}])
    for _ in range(depth):
        v = [v] if r.random() < 0.5 else {"k": v}
    return v


def cyclic(r):
    if r.random() < 0.5:
        v = [1]
        v.append(v)
    else:
        v = {"a": 1}
        v["self"] = {"inner": [v]}
    return v


def scalar(r):
    return r.choice([
        0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**100, -(10**100),
        0.0, -0.0, 1e-300, 1e300, math.inf, -math.inf, math.nan, 0.5, -3.25,
        True, False, None, "", "x", "1e999", "\udcff", "a" * 5000, "nan",
        np.int64(7), np.float32(2.5), np.uint64(2**64 - 1), np.bool_(True), np.float16(1.0),
        np.arange(3), np.zeros((2, 2)), b"bytes", object(), 1 + 2j, (1, 2), [1, "2"],
    ])


def value(r, depth=0):
    k = r.random()
    if k < 0.45 or depth > 4:
        return scalar(r)
    if k < 0.6:
        return [value(r, depth + 1) for _ in range(r.randint(0, 4))]
    if k < 0.75:
        return {r.choice(["a", "bandwidth_GBps", "cubes", "_comment", "", "0"]): value(r, depth + 1)
                for _ in range(r.randint(0, 3))}
    if k < 0.8:
        return {r.choice([1, None, (1, 2), 2.5]): 1}  # a key JSON cannot hold
    if k < 0.9:
        return deep(r, r.choice([10, 63, 64, 65, 200, 5000]))
    return cyclic(r)


def key_paths(doc, prefix=(), depth=0):
    """Every path of a document as a tuple of its keys (down to 12 levels: mutations nest deeper)."""
    out = [prefix] if prefix else []
    if depth >= 12:
        return out
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += key_paths(v, prefix + (k,), depth + 1)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += key_paths(v, prefix + (i,), depth + 1)
    return out


def get(doc, keys):
    for k in keys:
        doc = doc[k]
    return doc


def paths(doc):
    """Every dotted path of a document."""
    return [".".join(map(str, p)) for p in key_paths(doc)]


def random_path(r, doc):
    p = r.choice(paths(doc) or ["name"])
    k = r.random()
    if k < 0.5:
        return p
    if k < 0.7:  # a mangled path
        parts = p.split(".")
        parts[r.randrange(len(parts))] = r.choice(["", "99999999999999999999", "-1", "nosuch", "0x1", " ", "é"])
        return ".".join(parts)
    return r.choice(["", ".", "..", "a..b", "cubes.-1", "cubes.1e3", "x" * 400, "network.dims.99999999999"])


def mutate(r, doc):
    """A copy of doc with a few fields replaced, deleted or added."""
    d = copy.deepcopy(doc)
    for _ in range(r.randint(1, 4)):
        ps = key_paths(d)
        if not ps:
            break
        keys = r.choice(ps)
        node = d
        for key in keys[:-1]:
            node = node[key]
        last = keys[-1]
        k = r.random()
        old = node[last]
        if k < 0.3 and isinstance(old, (int, float)) and not isinstance(old, bool):
            node[last] = type(old)(old * r.choice([1, 2, 0.5, 3, 0, -1]))  # a plausible edit: often still valid
        elif k < 0.7:
            node[last] = value(r)
        elif k < 0.85 and isinstance(node, dict):
            del node[last]
        elif isinstance(node, dict):
            node[str(last) + r.choice(["_", "s", "x"])] = value(r)
    return d


def shape(r):
    k = r.random()
    if k < 0.3:  # small and valid
        return [r.randint(0, 8) for _ in range(r.randint(0, 4))]
    if k < 0.55:  # past the byte limit, or wrapping 64 bits
        return r.choice([[2**32, 2**32, 4], [2**62, 4], [2**63 - 1], [0, 2**62, 2**62], [2**46 + 1, 4], [2**24] * 3])
    if k < 0.75:  # out of range ints
        return [r.choice([-1, -(2**63), 2**63, 2**64, 10**30, 3])]
    return r.choice([[1.5], ["3"], [None], [[2]], "34", 3, None, {"a": 1}, [True], np.array([2, 3]),
                     (np.int64(2), np.int32(3)), [np.float64(2.0)], object()])


# ---- the targets ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docs():
    return [cs.load_topology_json(n) for n in ("single_cube", "ring4", "mesh4x4", "h100x8")]


def test_fuzz_topology_entry_points(docs):
    r = random.Random(SEED)
    for case in range(CASES):
        doc = r.choice(docs)
        what = f"seed {SEED} case {case}"
        k = r.random()
        if k < 0.35:
            m = mutate(r, doc)
            check_outcome(lambda: cs.topology_from_json(m, "fuzz"), f"{what}: topology_from_json")
        elif k < 0.5:
            v = value(r)
            check_outcome(lambda: cs.topology_from_json(v), f"{what}: topology_from_json of a bare value")
        elif k < 0.75:
            p, v = random_path(r, doc), value(r)
            check_outcome(lambda: cs.apply_override(doc, p, v), f"{what}: apply_override({p[:40]!r})")
        else:
            name = r.choice(["single_cube", "ring4"])
            kind = r.random()
            if kind < 0.3:  # plausible: a real numeric field scaled (often still valid)
                base = cs.load_topology_json(name)
                num = [p for p in key_paths(base) if isinstance(get(base, p), (int, float))
                       and not isinstance(get(base, p), bool)]
                p = r.choice(num)
                ov = {".".join(map(str, p)): get(base, p) * r.choice([1, 2, 0.5, 4])}
            elif kind < 0.6:
                ov = {random_path(r, cs.load_topology_json(name)): value(r) for _ in range(r.randint(1, 3))}
            elif kind < 0.8:
                ov = [(random_path(r, doc), value(r))]
            else:
                ov = value(r)
            check_outcome(lambda: cs.load_topology(name, overrides=ov), f"{what}: load_topology(overrides=)")


def test_fuzz_tensor_entry_points():
    r = random.Random(SEED + 1)
    rng = np.random.default_rng(SEED)
    host = cs.Context("host", world_size=2)
    sim = cs.Context("sim", topology="ring4", timing_only=True)  # big shapes: no host bytes behind them
    live = [host.zeros(0, [2, 3]), host.zeros(1, [6])]
    for case in range(CASES):
        what = f"seed {SEED} case {case}"
        k = r.random()
        if k < 0.4:
            s = shape(r)
            small = isinstance(s, list) and all(isinstance(d, int) and 0 <= d <= 8 for d in s)
            ctx = host if small else sim  # the host would really allocate a valid large tensor
            make = r.choice([ctx.empty, ctx.zeros])
            rank = r.choice([0, 1, 0, -1, 2**64, 4, "0", None, np.int64(1), 1.0, True])
            dtype = r.choice(["f32", "bf16", "f16", "float32", "f64", "", "int8", None])
            args = [rank, s] + ([] if dtype is None else [dtype])
            check_outcome(lambda: make(*args), f"{what}: {make.__name__}{tuple(map(repr, args))!r:.200}")
        elif k < 0.55:
            t = r.choice(live)
            s = shape(r)
            check_outcome(lambda: t.reshape(s), f"{what}: reshape({s!r:.100})")
        else:
            t = r.choice(live)
            kind = r.random()
            if kind < 0.3:
                src = rng.standard_normal(r.choice([t.shape, t.shape[::-1], (t.numel,), (1,) + t.shape, ()]))
                with np.errstate(all="ignore"):
                    src = src.astype(r.choice([np.float32, np.float64, np.float16, np.int32, np.uint16, np.uint32,
                                               np.bool_, np.complex64, object, "U3"]))
            elif kind < 0.5:
                src = value(r)
            elif kind < 0.6:
                src = np.full(t.shape, r.choice([np.nan, np.inf, -np.inf, 1e39, -0.0]), np.float64)
            elif kind < 0.7:
                src = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape=t.shape,
                                                      strides=(0,) * len(t.shape))
            else:
                src = np.asfortranarray(rng.standard_normal(t.shape).astype(np.float32)).tolist()
            with np.errstate(all="ignore"):
                check_outcome(lambda: t.copy_from(src), f"{what}: copy_from({type(src).__name__})")
    # The context still works after all of that.
    x = rng.standard_normal(6).astype(np.float32)
    live[1].copy_from(x)
    assert np.array_equal(live[1].numpy(), x)


def test_fuzz_context_and_plan_entry_points():
    """Context(...) and nccl_plan(...) with random arguments: made, or refused with a documented type."""
    r = random.Random(SEED + 2)
    ints = [0, 1, 2, 3, 4, 8, -1, 2**31, 2**63, 2**64, 10**30, True, 2.0, "2", None, np.int64(2)]
    for case in range(max(CASES // 3, 1)):
        what = f"seed {SEED} case {case}"
        if r.random() < 0.7:
            kw = {}
            for key, choices in (("world_size", ints), ("topology", ["ring4", "single_cube", "nosuch", "", 5, None]),
                                 ("overrides", [None, {}, {"network.link.bandwidth_GBps": 1e-30}, {"x": 1}, "x",
                                                [("cube.pes", 0)], 7]),
                                 ("hazards", ["throw", "record", "off", "sometimes", None]),
                                 ("algorithm", ["ring", "tree", "halving_doubling", "spiral", ""]),
                                 ("hierarchy", ints), ("stack_size", ints + [1 << 20]),
                                 ("ranks_on", [None, [0], [3, 2], [0, 0], [-1], [99]]),
                                 ("timing_only", [None, True, False])):
                if r.random() < 0.5:
                    kw[key] = r.choice(choices)
            backend = r.choice(["sim", "host", "tpu", "", "sim"])
            check_outcome(lambda: cs.Context(backend, **kw), f"{what}: Context({backend!r}, {kw!r:.200})")
        else:
            coll = r.choice(["all_reduce", "all_gather", "reduce_scatter", "broadcast", "gather", ""])
            ranks, nbytes = r.choice(ints), r.choice(ints)
            topo = r.choice([None, "ring4", "nosuch", 3])
            check_outcome(lambda: cs.nccl_plan(coll, ranks, nbytes, topo), f"{what}: nccl_plan({coll!r}, {ranks!r}, "
                                                                           f"{nbytes!r}, {topo!r})")
