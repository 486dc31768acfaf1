"""cubesim.sweep: design-space sweeps, on one machine or many (MPI), resumable, into SQLite.

A sweep spec (JSON, or YAML where PyYAML is installed) names a job, a base configuration and axes:

    {
      "job": "mlp",                                  # or "collective"
      "base": {"topology": "mesh4x4",                # a shipped name or a file (relative to the spec)
               "set": {"cube.hbm.bandwidth_GBps": 2048},   # topology overrides (dotted paths)
               "run": {"tp": 4, "hidden": 1024, "ffn": 4096, "tokens": 256}},
      "axes": [
        {"path": "topology.network.link.bandwidth_GBps", "values": [64, 128, 256]},
        {"path": "run.tokens", "log": {"from": 64, "to": 1024, "factor": 2}},
        {"path": "run.tp", "range": {"from": 1, "to": 8, "step": 1}},
        {"zip": [{"path": "run.hidden", "values": [1024, 2048]},
                 {"path": "run.ffn", "values": [4096, 8192]}]},
        {"path": "topology.cube.hbm.bandwidth_GBps",
         "random": {"loguniform": [1000, 4000], "n": 4, "seed": 7}}
      ],
      "filters": ["run.ffn % run.tp == 0"],          # Python-like expressions over the paths
      "sample": {"n": 50, "seed": 1},                # optional: a seeded subset of the product
      "timeout_s": 600                               # per case
    }

Paths start with `topology.` (a dotted path into the topology document, as `--set` takes it), or
`run.` (a job option, JOB_OPTIONS below), or are `topology` itself (the topology name or file).
Cases are the product of the axes (a zip axis varies its members together), in a fixed order,
filtered, then sampled; each is resolved to a full configuration whose content hash names it.

    plan = cubesim.sweep.plan("spec.json")          # Plan: cases, invalid cases (with reasons)
    rows = cubesim.sweep.run("spec.json", db="out.db", executor="process", jobs=4)
    rows = cubesim.sweep.load("out.db")             # list of dicts; .to_dataframe() with pandas

Executors (concurrent.futures.Executor): `thread` (the simulator releases the GIL), `process`
(forked workers; a case that crashes or passes its timeout kills only its worker, which is
replaced), `mpi` (mpi4py.futures.MPICommExecutor over MPI.COMM_WORLD: start the sweep under
`mpirun -np N`; rank 0 runs the sweep, the others run cases, each in a forked child of its own,
so crashes and timeouts are isolated there too). Every finished case is committed to the database
at once; `resume=True` runs only the cases the database lacks. Metrics are deterministic (the
simulated time, events, the event-order hash): the same whichever executor ran a case, and in
whatever order; the wall time is kept beside them.
"""
import ast
import concurrent.futures as cf
import csv
import datetime
import hashlib
import io
import itertools
import json
import math
import multiprocessing
import os
import random
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path

SCHEMA = "cubesim.sweep/1"
JOBS = ("mlp", "collective")
EXECUTORS = ("thread", "process", "mpi")
MPI_INSTALL = "apt-get install openmpi-bin python3-mpi4py"

# Every option a job takes, with its default. A spec's run options and `run.` axes must be among
# these (an unknown one is refused, naming the valid ones).
JOB_OPTIONS = {
    "mlp": {
        "backend": "sim", "tp": None, "tokens": 256, "hidden": 512, "ffn": 2048, "dtype": "bf16",
        "gelu": "tanh", "bias": True, "sequence_parallel": False, "seed": 1234, "data_seed": 99,
        "algorithm": "ring", "timing_only": True, "timing": "chunk",
    },
    "collective": {
        "backend": "sim", "collective": "all_reduce", "ranks": None, "bytes": 1 << 20, "dtype": "bf16",
        "algorithm": "ring", "timing_only": True, "timing": "chunk", "seed": 1,
    },
}
MAX_AXIS_VALUES = 1_000_000  # values on one axis
MAX_PRODUCT = 1_000_000  # combinations of the axes' values, before filters
MAX_CASES = 200_000  # cases after filters and sample (each is a resolved config in memory)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2}


MAX_TIMEOUT_S = 7 * 24 * 3600


def check_timeout(t, where):
    """Seconds per case: a finite number in (0, one week]."""
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 < t <= MAX_TIMEOUT_S:
        raise SpecError(f"{where}: give seconds, more than 0 and at most {MAX_TIMEOUT_S} (got {t!r})")
    return float(t)


class SpecError(ValueError):
    """A spec (or a request about one) that cannot be run as written; the message names where."""


class CaseTimeout(Exception):
    pass


class WorkerCrashed(Exception):
    pass


# ---- the spec ------------------------------------------------------------------------------------


def load_spec(spec):
    """A spec from a dict, or a .json / .yaml file; returns (spec dict, base directory for files)."""
    if isinstance(spec, dict):
        return spec, Path.cwd()
    path = Path(spec)
    if not path.is_file():
        raise SpecError(f"sweep spec {spec}: no such file")
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise SpecError(f"sweep spec {spec}: YAML needs PyYAML (apt-get install python3-yaml); or write JSON") from None
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise SpecError(f"sweep spec {spec}: invalid YAML: {e}") from None
    else:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecError(f"sweep spec {spec}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    if not isinstance(doc, dict):
        raise SpecError(f"sweep spec {spec}: the document must be an object with job, base and axes")
    return doc, path.resolve().parent


def spec_hash(doc):
    """The content hash of a spec, without what may change between a run and its resume (timeout_s)."""
    core = {k: v for k, v in doc.items() if k not in ("timeout_s",)}
    return hashlib.sha256(json.dumps(core, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _values_of(axis, where):
    """The values of one (non-zip) axis."""
    kinds = [k for k in ("values", "range", "log", "random") if k in axis]
    if len(kinds) != 1:
        raise SpecError(f"{where}: give exactly one of values, range, log, random (got {', '.join(kinds) or 'none'})")
    kind = kinds[0]
    spec = axis[kind]
    if kind == "values":
        if not isinstance(spec, list) or not spec:
            raise SpecError(f"{where}.values: give a non-empty list")
        for v in spec:
            if isinstance(v, float) and not math.isfinite(v):
                raise SpecError(f"{where}.values: {v} is not a finite number")
        return list(spec)
    if not isinstance(spec, dict):
        raise SpecError(f"{where}.{kind}: give an object, e.g. " + {
            "range": '{"from": 1, "to": 8, "step": 1}', "log": '{"from": 64, "to": 4096, "factor": 2}',
            "random": '{"uniform": [1, 2], "n": 8, "seed": 1}'}[kind])

    def num(key, default=None):
        v = spec.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SpecError(f"{where}.{kind}.{key}: give a number (got {json.dumps(v)})")
        return v

    if kind == "range":
        lo, hi, step = num("from"), num("to"), num("step", 1)
        if step <= 0:
            raise SpecError(f"{where}.range.step: must be > 0 (got {step})")
        if hi < lo:
            raise SpecError(f"{where}.range: 'to' ({hi}) is below 'from' ({lo})")
        if not all(math.isfinite(x) for x in (lo, hi, step)):
            raise SpecError(f"{where}.range: from, to and step must be finite numbers")
        try:
            n = int(math.floor((hi - lo) / step + 1e-9)) + 1
        except (OverflowError, ValueError):
            n = MAX_AXIS_VALUES + 1
        if n > MAX_AXIS_VALUES:
            raise SpecError(f"{where}.range: {n} values; an axis holds at most {MAX_AXIS_VALUES} (raise step)")
        vals = [lo + i * step for i in range(n)]
        return [int(v) if all(isinstance(x, int) for x in (lo, step)) else round(v, 12) for v in vals]
    if kind == "log":
        lo, hi = num("from"), num("to")
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 or hi < lo:
            raise SpecError(f"{where}.log: needs finite 0 < from <= to (got from {lo}, to {hi})")
        if "factor" in spec:
            f = num("factor")
            if not math.isfinite(f) or f <= 1:
                raise SpecError(f"{where}.log.factor: must be > 1 (got {f})")
            if math.log(hi / lo) / math.log(f) > MAX_AXIS_VALUES:
                raise SpecError(f"{where}.log: more than {MAX_AXIS_VALUES} values; an axis holds at most that")
            vals, v = [], lo
            while v <= hi * (1 + 1e-12):
                vals.append(v)
                v = v * f
            return vals
        if "num" in spec:
            n = num("num")
            if not isinstance(n, int) or not 1 <= n <= MAX_AXIS_VALUES:
                raise SpecError(f"{where}.log.num: give a count from 1 to {MAX_AXIS_VALUES} (got {n})")
            vals = [lo * (hi / lo) ** (i / (n - 1)) if n > 1 else lo for i in range(n)]
            if spec.get("int", isinstance(lo, int) and isinstance(hi, int)):
                vals = sorted(set(int(round(v)) for v in vals))
            return vals
        raise SpecError(f"{where}.log: give 'factor' (from, from*factor, ... up to to) or 'num' (that many "
                        "log-spaced values)")
    # random: n draws with a seed, from uniform / loguniform / randint / choice
    n, seed = spec.get("n"), spec.get("seed")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_AXIS_VALUES:
        raise SpecError(f"{where}.random.n: give the number of draws (an integer from 1 to {MAX_AXIS_VALUES})")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise SpecError(f"{where}.random.seed: give an integer seed (draws are reproducible)")
    rng = random.Random(seed)
    dists = [k for k in ("uniform", "loguniform", "randint", "choice") if k in spec]
    if len(dists) != 1:
        raise SpecError(f"{where}.random: give exactly one of uniform [lo, hi], loguniform [lo, hi], "
                        "randint [lo, hi], choice [values]")
    d = dists[0]
    arg = spec[d]
    if d == "choice":
        if not isinstance(arg, list) or not arg:
            raise SpecError(f"{where}.random.choice: give a non-empty list")
        return [rng.choice(arg) for _ in range(n)]
    if (not isinstance(arg, list) or len(arg) != 2
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in arg) or arg[1] < arg[0]):
        raise SpecError(f"{where}.random.{d}: give [lo, hi] with lo <= hi")
    lo, hi = arg
    if d == "uniform":
        return [rng.uniform(lo, hi) for _ in range(n)]
    if d == "randint":
        return [rng.randint(int(lo), int(hi)) for _ in range(n)]
    if lo <= 0:
        raise SpecError(f"{where}.random.loguniform: needs lo > 0")
    return [math.exp(rng.uniform(math.log(lo), math.log(hi))) for _ in range(n)]


def _axis_groups(doc):
    """[(paths, [tuple of values])]: one group per axis; a zip axis is one group of several paths."""
    axes = doc.get("axes")
    if not isinstance(axes, list) or not axes:
        raise SpecError("axes: give a non-empty list of axes (a sweep of one case is `cubesim run`)")
    groups, seen = [], set()
    for i, axis in enumerate(axes):
        where = f"axes[{i}]"
        if not isinstance(axis, dict):
            raise SpecError(f"{where}: give an object with path and values (or zip)")
        members = axis["zip"] if "zip" in axis else [axis]
        if "zip" in axis and (not isinstance(members, list) or not members):
            raise SpecError(f"{where}.zip: give a non-empty list of axes")
        paths, columns = [], []
        for j, m in enumerate(members):
            mw = f"{where}.zip[{j}]" if "zip" in axis else where
            if not isinstance(m, dict) or not isinstance(m.get("path"), str) or not m["path"]:
                raise SpecError(f"{mw}.path: give a dotted path (topology.<field...>, run.<option> or topology)")
            if m["path"] in seen:
                raise SpecError(f"{mw}.path: '{m['path']}' is swept by another axis already")
            seen.add(m["path"])
            paths.append(m["path"])
            columns.append(_values_of(m, mw))
        if len({len(c) for c in columns}) > 1:
            raise SpecError(f"{where}.zip: the zipped axes have different lengths "
                            f"({', '.join(f'{p}: {len(c)}' for p, c in zip(paths, columns))}); give equal lengths")
        groups.append((paths, list(zip(*columns))))
    return groups


class _Filter:
    """A filter expression over the case's values: arithmetic, comparisons, and/or/not, `in`, and
    names that are dotted paths (run.tp, topology.network.link.bandwidth_GBps)."""

    OPS = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.BinOp,
           ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.Compare, ast.Eq, ast.NotEq,
           ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Constant, ast.Name, ast.Attribute, ast.Load,
           ast.List, ast.Tuple, ast.IfExp)

    def __init__(self, text, where):
        self.text, self.where = text, where
        if not isinstance(text, str):
            raise SpecError(f"{where}: give the filter as a string, e.g. \"run.ffn % run.tp == 0\"")
        try:
            self.tree = ast.parse(text, mode="eval")
        except SyntaxError as e:
            raise SpecError(f"{where}: {text!r} is not an expression ({e.msg})") from None
        for node in ast.walk(self.tree):
            if not isinstance(node, self.OPS):
                raise SpecError(f"{where}: {text!r} uses {type(node).__name__}, which filters do not allow "
                                "(arithmetic, comparisons, and/or/not, in, and dotted paths only)")

    @staticmethod
    def _path(node):
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(node.id)
        return ".".join(reversed(parts))

    def __call__(self, lookup):
        def ev(n):
            if isinstance(n, ast.Expression):
                return ev(n.body)
            if isinstance(n, ast.Constant):
                return n.value
            if isinstance(n, (ast.Name, ast.Attribute)):
                return lookup(self._path(n), self)
            if isinstance(n, (ast.List, ast.Tuple)):
                return [ev(e) for e in n.elts]
            if isinstance(n, ast.BoolOp):
                vals = (ev(v) for v in n.values)
                return all(vals) if isinstance(n.op, ast.And) else any(vals)
            if isinstance(n, ast.UnaryOp):
                v = ev(n.operand)
                return {ast.Not: lambda: not v, ast.USub: lambda: -v, ast.UAdd: lambda: +v}[type(n.op)]()
            if isinstance(n, ast.IfExp):
                return ev(n.body) if ev(n.test) else ev(n.orelse)
            if isinstance(n, ast.BinOp):
                a, b = ev(n.left), ev(n.right)
                for x in (a, b):  # numbers only, of sane size: a filter must not take the machine
                    if not _num(x) or (isinstance(x, int) and x.bit_length() > 256):
                        raise SpecError(f"{self.where}: {self.text!r}: arithmetic takes numbers of at most 256 bits "
                                        f"(got {type(x).__name__})")
                if isinstance(n.op, ast.Pow) and (abs(b) > 64 or (isinstance(a, int) and a.bit_length() * abs(b) > 256)):
                    raise SpecError(f"{self.where}: {self.text!r}: powers are limited to 256-bit results")
                f = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b, ast.Div: lambda: a / b,
                     ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b, ast.Pow: lambda: a ** b}[type(n.op)]
                return f()
            if isinstance(n, ast.Compare):
                left = ev(n.left)
                for op, c in zip(n.ops, n.comparators):
                    right = ev(c)
                    ok = {ast.Eq: lambda: left == right, ast.NotEq: lambda: left != right, ast.Lt: lambda: left < right,
                          ast.LtE: lambda: left <= right, ast.Gt: lambda: left > right, ast.GtE: lambda: left >= right,
                          ast.In: lambda: left in right, ast.NotIn: lambda: left not in right}[type(op)]()
                    if not ok:
                        return False
                    left = right
                return True
            raise SpecError(f"{self.where}: cannot evaluate {ast.dump(n)}")

        try:
            return bool(ev(self.tree))
        except SpecError:
            raise
        except Exception as e:  # a type error or a division by zero in the expression
            raise SpecError(f"{self.where}: {self.text!r} failed on a case: {type(e).__name__}: {e}") from None


def _get_dotted(doc, path):
    cur = doc
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise KeyError(path)
    return cur


def _canonical(v, where="a value"):
    """JSON-stable value (tuples become lists); SpecError for what JSON cannot hold exactly (NaN,
    infinities, dates and other YAML types)."""
    try:
        return json.loads(json.dumps(v, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise SpecError(f"{where}: {e} (give numbers, strings, booleans, lists or objects; finite numbers only)") from None


class Case:
    """One point of a sweep: its index in the full product, the axis values, the resolved config."""

    __slots__ = ("index", "params", "config", "hash", "invalid")

    def __init__(self, index, params, config):
        self.index, self.params, self.config = index, params, config
        self.hash = hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
        self.invalid = None

    def __repr__(self):
        return f"<Case {self.index} {self.hash} {self.params}>"


class Plan:
    """The cases of a spec, in order, with those that cannot run (invalid: [(case, reason)])."""

    def __init__(self, spec, base_dir, cases, total, axes):
        self.spec, self.base_dir, self.cases, self.total, self.axes = spec, base_dir, cases, total, axes
        self.hash = spec_hash(spec)
        self.job = spec["job"]

    @property
    def valid(self):
        return [c for c in self.cases if c.invalid is None]

    @property
    def invalid(self):
        return [c for c in self.cases if c.invalid is not None]


def _resolve_topology(name, base_dir):
    """A shipped name stays a name; a file path becomes absolute (relative to the spec's folder)."""
    import cubesim as cs
    if not isinstance(name, str) or not name:
        raise SpecError(f"topology: give a shipped name ({', '.join(cs.list_topologies())}) or a JSON file")
    if name in cs.list_topologies():
        return name
    p = Path(name)
    if not p.is_absolute():
        p = base_dir / p
    if p.is_file():
        return str(p.resolve())
    raise SpecError(f"topology '{name}': neither a shipped topology ({', '.join(cs.list_topologies())}) nor a file "
                    f"(looked for {p})")


def plan(spec, validate=True):
    """Expands a spec into its cases (Plan). SpecError for a malformed spec, an unknown path or job
    option, an empty axis or a spec with no cases; with validate, each case's topology is loaded and
    its job options checked, and cases that cannot run are marked with the reason (Plan.invalid)."""
    doc, base_dir = load_spec(spec)
    unknown = set(doc) - {"job", "base", "axes", "filters", "sample", "timeout_s", "name", "description", "schema"}
    if unknown:
        raise SpecError(f"spec: unknown key(s) {', '.join(sorted(unknown))}; valid: job, base, axes, filters, sample, "
                        "timeout_s, name, description")
    job = doc.get("job", "mlp")
    if job not in JOBS:
        raise SpecError(f"job: '{job}' is not a job; give one of {', '.join(JOBS)}")
    base = doc.get("base", {})
    if not isinstance(base, dict):
        raise SpecError("base: give an object with topology, set and run")
    bad = set(base) - {"topology", "set", "run"}
    if bad:
        raise SpecError(f"base: unknown key(s) {', '.join(sorted(bad))}; valid: topology, set, run")
    options = JOB_OPTIONS[job]
    base_run = base.get("run", {})
    base_set = base.get("set", {})
    if not isinstance(base_run, dict) or not isinstance(base_set, dict):
        raise SpecError("base.run and base.set: give objects ({option: value} and {dotted.path: value})")
    for k in base_run:
        if k not in options:
            raise SpecError(f"base.run.{k}: not an option of job '{job}'; valid: {', '.join(options)}")
    groups = _axis_groups(doc)
    for paths, _ in groups:
        for p in paths:
            if p == "topology" or p.startswith("topology."):
                continue
            if p.startswith("run."):
                if p[4:] not in options:
                    raise SpecError(f"axis path '{p}': '{p[4:]}' is not an option of job '{job}'; valid: "
                                    + ", ".join("run." + o for o in options))
                continue
            raise SpecError(f"axis path '{p}': start it with 'topology.' (a topology field), 'run.' (a job option) "
                            "or give 'topology' (the topology itself)")
    filters = doc.get("filters", [])
    if isinstance(filters, str):
        filters = [filters]
    if not isinstance(filters, list):
        raise SpecError("filters: give a list of expressions")
    filters = [_Filter(f, f"filters[{i}]") for i, f in enumerate(filters)]
    timeout = check_timeout(doc.get("timeout_s", 600), "timeout_s")

    axis_paths = [p for paths, _ in groups for p in paths]
    product = math.prod(len(vals) for _, vals in groups)
    if product > MAX_PRODUCT:
        raise SpecError(f"axes: their product is {product} combinations; a sweep expands at most {MAX_PRODUCT} "
                        "(filters apply after the product: narrow the axes)")
    import cubesim as cs
    default_topology = cs.DEFAULT_TOPOLOGY
    # A dotted path that names no field of the topology is the spec's error, said once (not once a case).
    first_topo = groups[axis_paths.index("topology")][1][0][0] if "topology" in axis_paths else \
        base.get("topology", default_topology)
    probe = _resolve_topology(first_topo, base_dir)
    checks = [(f"base.set.{k}", k, v) for k, v in base_set.items()]
    checks += [(f"axis path '{pth}'", pth[len("topology."):], vals[0][i]) for pths, vals in groups
               for i, pth in enumerate(pths) if pth.startswith("topology.")]
    for where, path, value in checks:
        try:
            cs.load_topology(probe, overrides={path: value})
        except cs.TopologyError as e:
            if str(e).startswith("override path"):
                raise SpecError(f"{where}: {e}") from None
    doc_hashes = {}

    def doc_hash(resolved):
        """The content hash of a topology as loaded (extends resolved): part of every case's config,
        so a changed file is a new case, not a resumed one."""
        if resolved not in doc_hashes:
            try:
                text = json.dumps(cs.load_topology(resolved).doc, sort_keys=True)
            except cs.TopologyError as e:
                text = "invalid: " + str(e)
            doc_hashes[resolved] = hashlib.sha256(text.encode()).hexdigest()[:16]
        return doc_hashes[resolved]

    cases, total, seen_hashes = [], 0, set()
    sample = doc.get("sample")
    for index, combo in enumerate(itertools.product(*[vals for _, vals in groups])):
        total += 1
        params = {}
        for (paths, _), values in zip(groups, combo):
            params.update(zip(paths, values))
        params = _canonical(params, "axis values")
        topo = params.get("topology", base.get("topology", default_topology))
        sets = dict(base_set)
        run = dict(options)
        run.update(base_run)
        for p, v in params.items():
            if p.startswith("topology."):
                sets[p[len("topology."):]] = v
            elif p.startswith("run."):
                run[p[4:]] = v

        def lookup(path, flt, params=params, sets=sets, run=run, topo=topo):
            if path in params:
                return params[path]
            if path == "topology":
                return topo
            if path.startswith("run.") and path[4:] in run:
                return run[path[4:]]
            if path.startswith("topology.") and path[9:] in sets:
                return sets[path[9:]]
            raise SpecError(f"{flt.where}: {flt.text!r} names '{path}', which is neither an axis, a run option "
                            f"nor a base override; axes: {', '.join(axis_paths) or 'none'}")

        if not all(f(lookup) for f in filters):
            continue
        resolved = _resolve_topology(topo, base_dir)
        config = _canonical({"job": job, "topology": resolved, "topology_sha256": doc_hash(resolved),
                             "set": dict(sorted(sets.items())), "run": run}, "the case's configuration")
        case = Case(index, params, config)
        if len(cases) >= MAX_CASES and sample is None:
            raise SpecError(f"the spec gives more than {MAX_CASES} cases; a sweep holds at most that (add filters, "
                            "narrow the axes, or take a seeded sample)")
        if case.hash in seen_hashes:  # two axis values that resolve alike (a random choice drawn twice)
            continue
        seen_hashes.add(case.hash)
        cases.append(case)
    if sample is not None:
        if not isinstance(sample, dict) or not isinstance(sample.get("n"), int) or sample["n"] < 1 \
                or not isinstance(sample.get("seed"), int):
            raise SpecError('sample: give {"n": COUNT, "seed": INT} (a seeded subset of the cases)')
        if sample["n"] < len(cases):
            keep = sorted(random.Random(sample["seed"]).sample(range(len(cases)), sample["n"]))
            cases = [cases[i] for i in keep]
    if not cases:
        raise SpecError(f"the spec gives no cases ({total} in the product of the axes, none left after the filters"
                        " and sample); loosen the filters" if total else "the spec gives no cases")
    p = Plan(doc, base_dir, cases, total, axis_paths)
    p.groups = [list(paths) for paths, _ in groups]  # a zip axis is one group of paths
    p.timeout = float(timeout)
    if validate:
        _validate(p)
    return p


def _validate(p):
    """Marks cases that cannot run (Case.invalid = the reason), loading each distinct topology once."""
    import cubesim as cs
    topos = {}
    backends = {b["name"]: b for b in cs.backend_info()}
    for c in p.cases:
        cfg, run = c.config, c.config["run"]
        key = json.dumps([cfg["topology"], cfg["set"]], sort_keys=True)
        if key not in topos:
            try:
                topos[key] = cs.load_topology(cfg["topology"], overrides=cfg["set"] or None)
            except cs.TopologyError as e:
                topos[key] = e
        t = topos[key]
        if isinstance(t, Exception):
            c.invalid = str(t)
            continue
        c.invalid = _check_run(cfg["job"], run, t, backends)


_BOOL_OPTIONS = ("bias", "sequence_parallel", "timing_only")
_INT_OPTIONS = {"tokens": (1, 2**40), "hidden": (1, 2**40), "ffn": (1, 2**40), "seed": (0, 2**64 - 1),
                "data_seed": (0, 2**64 - 1), "bytes": (1, 2**48), "tp": (1, 65536), "ranks": (1, 65536)}
_ENUM_OPTIONS = {"gelu": ("tanh", "erf"), "timing": ("chunk", "flow"), "dtype": tuple(DTYPE_BYTES),
                 "collective": COLLECTIVES}


def _option_error(job, run):
    """Why a job option has the wrong type or value (None if all are fine)."""
    for k, v in run.items():
        if k in _BOOL_OPTIONS and not isinstance(v, bool):
            return f"run.{k} {json.dumps(v)}: give true or false"
        if k in _INT_OPTIONS and not (v is None and k in ("tp", "ranks")):
            lo, hi = _INT_OPTIONS[k]
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                return f"run.{k} {json.dumps(v)}: give an integer from {lo} to {hi}"
        if k in _ENUM_OPTIONS and v not in _ENUM_OPTIONS[k]:
            return f"run.{k} {json.dumps(v)}: give one of {', '.join(_ENUM_OPTIONS[k])}"
    return None


def _check_run(job, run, topo, backends):
    """Why a case's job options cannot run on topology topo (None if they can)."""
    import cubesim as cs
    bad = _option_error(job, run)
    if bad:
        return bad
    b = backends.get(run["backend"])
    if b is None:
        return f"run.backend '{run['backend']}': not a backend; valid: {', '.join(backends)}"
    if not b["simulates"]:
        if not b["available"]:
            return f"run.backend '{run['backend']}': it cannot run here ({b['why_not']})"
        if run["timing_only"]:
            return f"run.timing_only: backend '{run['backend']}' keeps values; set run.timing_only false"
    if run["timing"] not in ("chunk", "flow"):
        return f"run.timing '{run['timing']}': give chunk or flow"
    if run["timing"] == "flow" and not run["timing_only"]:
        return "run.timing flow: a flow-level run moves no values; it needs run.timing_only true"
    if run["dtype"] not in DTYPE_BYTES:
        return f"run.dtype '{run['dtype']}': give one of {', '.join(DTYPE_BYTES)}"
    algos = [a["name"] for a in cs.algorithms()]
    if run["algorithm"] not in algos:
        return f"run.algorithm '{run['algorithm']}': give one of {', '.join(algos)}"
    limit = topo.num_cubes if b["simulates"] else (b["devices"] if b["devices"] >= 0 else None)
    where = f"topology '{topo.name}' has {topo.num_cubes} cubes" if b["simulates"] else \
        f"backend '{run['backend']}' has {limit} devices"
    if job == "mlp":
        for k in ("tokens", "hidden", "ffn"):
            if not isinstance(run[k], int) or isinstance(run[k], bool) or run[k] < 1:
                return f"run.{k} {json.dumps(run[k])}: give an integer >= 1"
        tp = run["tp"] if run["tp"] is not None else None
        valid = cs.tp.valid_tp_sizes(limit or (tp or 1), run["ffn"], run["tokens"], bool(run["sequence_parallel"]))
        if tp is None:
            return None if valid else f"no tp fits: {where}"
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            return f"run.tp {json.dumps(tp)}: give an integer >= 1"
        if limit is not None and tp > limit:
            return f"run.tp {tp}: {where}, one per rank; valid tp here: {', '.join(map(str, valid))}"
        if tp not in valid:
            return f"run.tp {tp}: tp must divide ffn {run['ffn']}; valid tp here: {', '.join(map(str, valid))}"
        return None
    # collective
    if run["collective"] not in COLLECTIVES:
        return f"run.collective '{run['collective']}': give one of {', '.join(COLLECTIVES)}"
    ranks = run["ranks"] if run["ranks"] is not None else limit
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        return f"run.ranks {json.dumps(ranks)}: give an integer >= 1"
    if limit is not None and ranks > limit:
        return f"run.ranks {ranks}: {where}, one per rank"
    nbytes, esz = run["bytes"], DTYPE_BYTES[run["dtype"]]
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < esz or nbytes % esz:
        return f"run.bytes {json.dumps(nbytes)}: give a positive multiple of the {run['dtype']} element size ({esz})"
    if run["collective"] == "reduce_scatter" and (nbytes // esz) % ranks:
        return f"run.bytes {nbytes}: reduce_scatter splits {nbytes // esz} elements over {ranks} ranks; give a multiple"
    if run["algorithm"] not in cs.supported_algorithms(run["collective"]):
        return (f"run.algorithm '{run['algorithm']}' does not do {run['collective']}; it has: "
                f"{', '.join(cs.supported_algorithms(run['collective']))}")
    return None


# ---- running one case ----------------------------------------------------------------------------


def run_case(config):
    """Runs one resolved case in this process; returns {"metrics": {...}, "wall_s": s}. Raises what
    the simulator raises (the caller records it as the case's error)."""
    import numpy as np
    import cubesim as cs
    t0 = time.perf_counter()
    run = config["run"]
    b = {x["name"]: x for x in cs.backend_info()}[run["backend"]]
    topo = cs.load_topology(config["topology"], overrides=config["set"] or None) if b["simulates"] else None
    kw = dict(timing_only=True if run["timing_only"] else None,
              timing=run["timing"] if run["timing"] != "chunk" else None,
              algorithm=run["algorithm"])
    if config["job"] == "mlp":
        tp = run["tp"]
        if tp is None:
            limit = topo.num_cubes if topo else max(b["devices"], 1)
            tp = cs.tp.valid_tp_sizes(limit, run["ffn"], run["tokens"], run["sequence_parallel"])[-1]
        ctx = cs.Context(run["backend"], world_size=tp, topology=topo, **kw)
        model = dict(tp=tp, tokens=run["tokens"], hidden=run["hidden"], ffn=run["ffn"], dtype=run["dtype"],
                     gelu=run["gelu"], bias=run["bias"], sequence_parallel=run["sequence_parallel"],
                     seed=run["seed"], data_seed=run["data_seed"])
        metrics = {}
        if run["timing_only"]:
            rep = cs.tp.run_mlp(ctx, **model)
        else:
            eq = cs.tp.check_mlp_equivalence(ctx, **model)
            rep = eq.run
            metrics.update(check_pass=bool(eq.passed), max_abs=float(eq.max_abs))
        flops = 12.0 * run["tokens"] * run["hidden"] * run["ffn"]  # forward 2 GEMMs, backward 4
        metrics.update(_report_metrics(rep))
        metrics["tp"] = tp
        metrics["model_tflops_per_s"] = flops / (rep.sim_time_ps * 1e-12) / 1e12 if rep.sim_time_ps else None
    else:
        ranks = run["ranks"] if run["ranks"] is not None else (topo.num_cubes if topo else max(b["devices"], 1))
        ctx = cs.Context(run["backend"], world_size=ranks, topology=topo, **kw)
        esz = DTYPE_BYTES[run["dtype"]]
        count = run["bytes"] // esz
        kind = run["collective"]
        functional = not run["timing_only"]
        rng = np.random.default_rng(run["seed"])
        inputs = [rng.standard_normal(count).astype(np.float32) for _ in range(ranks)] if functional else None

        def body(rank):
            if functional:
                x = ctx.tensor(rank, inputs[rank], run["dtype"])
            else:
                x = ctx.empty(rank, [count], run["dtype"])
            if kind == "all_reduce":
                cs.all_reduce(x, algorithm=run["algorithm"])
            elif kind == "broadcast":
                cs.broadcast(x, 0, algorithm=run["algorithm"])
            elif kind == "all_gather":
                out = ctx.empty(rank, [count * ranks], run["dtype"])
                cs.all_gather(out, x, algorithm=run["algorithm"])
            else:
                out = ctx.empty(rank, [count // ranks], run["dtype"])
                cs.reduce_scatter(out, x, algorithm=run["algorithm"])

        rep = ctx.spawn(body)
        metrics = _report_metrics(rep)
        metrics["ranks"] = ranks
        t = rep.sim_time_ps * 1e-12
        # NCCL's bus-bandwidth factors: what each rank's links carry relative to the buffer.
        factor = {"all_reduce": 2.0 * (ranks - 1) / ranks, "all_gather": (ranks - 1) / ranks,
                  "reduce_scatter": (ranks - 1) / ranks, "broadcast": 1.0}[kind]
        size = run["bytes"] * (ranks if kind == "all_gather" else 1)
        metrics["algbw_GBps"] = size / t / 1e9 if t else None
        metrics["busbw_GBps"] = size * factor / t / 1e9 if t else None
    return {"metrics": metrics, "wall_s": time.perf_counter() - t0}


def _report_metrics(rep):
    ranks = rep.ranks
    return {
        "sim_time_ps": int(rep.sim_time_ps),
        "events": int(rep.events),
        "event_hash": f"{rep.event_hash:016x}",
        "compute_ps_max": max((int(r.compute_ps) for r in ranks), default=0),
        "comm_ps_max": max((int(r.comm_ps) for r in ranks), default=0),
    }


# ---- executors -----------------------------------------------------------------------------------


_FORK_LOCK = threading.Lock()
_PARENT_ENDS = set()  # the parent's ends of every worker's pipe (a child closes the others' copies)


def _die_with_parent():
    """Linux: the worker is killed when the thread that forked it goes (a SIGKILLed sweep leaves no
    orphans behind)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _worker_loop(conn, own_parent_end):
    """A forked worker: runs (fn, args) pairs from the pipe until it is closed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _die_with_parent()
    for fd in list(_PARENT_ENDS):  # copies of other workers' pipes: a worker's EOF must be its own
        if fd != own_parent_end:
            try:
                os.close(fd)
            except OSError:
                pass
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        try:
            out = (True, fn(*args))
        except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
            out = (False, f"{type(e).__name__}: {e}")
        try:
            conn.send(out)
        except (BrokenPipeError, OSError):
            os._exit(0)


class _Isolated:
    """One forked child that runs calls in the order sent; a call that passes its timeout kills it,
    one that kills it (a crash) is reported; either way the next call forks a fresh child. call()
    runs one call and waits for it; ProcessExecutor uses the parts (start, send, recv, kill) to keep
    several workers busy from one thread."""

    def __init__(self):
        self.proc = self.conn = None

    def start(self):
        # One fork at a time: a child forked while another worker's pipe is half set up would hold
        # a copy of that worker's child end, and the parent would never see that worker die.
        with _FORK_LOCK:
            ctx = multiprocessing.get_context("fork")
            parent, child = ctx.Pipe()
            _PARENT_ENDS.add(parent.fileno())
            self.proc = ctx.Process(target=_worker_loop, args=(child, parent.fileno()), daemon=True)
            self.proc.start()
            child.close()
            self.conn = parent

    def send(self, fn, args):
        if self.proc is None:
            self.start()
        self.conn.send((fn, args))

    def recv(self):
        """The next call's result; raises its error as RuntimeError, WorkerCrashed if the child died
        (EOF: every result it sent before has been read)."""
        try:
            ok, value = self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(5)
            code = self.proc.exitcode
            self._close()
            how = f"signal {-code} ({signal.Signals(-code).name})" if code is not None and code < 0 else f"exit code {code}"
            raise WorkerCrashed(f"the process running the case died ({how})") from None
        if not ok:
            raise RuntimeError(value)
        return value

    def call(self, fn, args, timeout):
        if self.proc is not None and not self.proc.is_alive():
            self._close()
        self.send(fn, args)
        if not self.conn.poll(timeout):
            self.kill()
            raise CaseTimeout(f"timed out after {timeout:g} s (the case was killed)")
        return self.recv()

    def kill(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.join(5)
        self._close()

    def _close(self):
        if self.conn is not None:
            with _FORK_LOCK:
                _PARENT_ENDS.discard(self.conn.fileno())
                self.conn.close()
        self.proc = self.conn = None


class ProcessExecutor(cf.Executor):
    """A concurrent.futures.Executor of `jobs` forked workers, each call isolated: a call that passes
    `timeout` seconds fails with CaseTimeout, one whose worker dies with WorkerCrashed; the worker is
    replaced and the other calls go on.

    One thread serves every worker: it polls all their pipes at once, and keeps DEPTH calls sent to
    each, so a worker starts its next call without waiting for the parent. A call's time starts when
    the one before it on its worker returned. Done-callbacks run in that thread. The rule that
    surprises: a call is `running()` from when it is sent to a worker (cancel() cannot stop it then),
    and when a worker is killed or dies, the calls queued behind the one it was running go back to
    the front of the queue."""

    DEPTH = 2

    def __init__(self, jobs, timeout=None):
        import collections
        self._timeout = timeout
        self._calls = collections.deque()  # (future, fn, args) not yet sent to a worker
        self._lock = threading.Lock()
        self._shutdown = False
        self._woken = False  # a byte is in the wake pipe, or the thread is about to look at _calls
        self._wake_r, self._wake_w = os.pipe()
        self._workers = [_Isolated() for _ in range(jobs)]
        for w in self._workers:
            w.sent = collections.deque()  # items sent, oldest (running) first
            w.began = 0.0  # when the oldest began (the one before it returned)
        self._thread = threading.Thread(target=self._serve, name="cubesim-sweep-process", daemon=True)
        self._thread.start()

    def submit(self, fn, /, *args, **kwargs):
        fn, args = _CallKw.of(fn, args, kwargs)
        fut = cf.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit after shutdown")
            self._calls.append((fut, fn, args))
            wake, self._woken = not self._woken, True
            if wake:
                self._wake()
        return fut

    def _wake(self):
        # Under self._lock: the serve thread closes the pipe (and clears _wake_w) under it when it ends.
        if self._wake_w is not None:
            os.write(self._wake_w, b"x")

    def shutdown(self, wait=True, *, cancel_futures=False):
        with self._lock:
            self._shutdown = True
            cancelled = list(self._calls) if cancel_futures else []
            if cancel_futures:
                self._calls.clear()
        for fut, _, _ in cancelled:
            fut.cancel()
        with self._lock:
            self._wake()  # a second shutdown, after the thread ended, writes nothing
        if wait:
            self._thread.join()

    def _serve(self):
        import select
        poller = select.poll()
        by_fd = {}  # a worker's pipe -> the worker
        poller.register(self._wake_r, select.POLLIN)
        try:
            while True:
                self._send_calls(poller, by_fd)
                busy = [w for w in self._workers if w.sent]
                if not busy:
                    with self._lock:
                        if self._shutdown and not self._calls:
                            return
                wait_ms = None
                if self._timeout is not None and busy:
                    first = min(w.began for w in busy) + self._timeout
                    wait_ms = max(0.0, first - time.monotonic()) * 1e3 + 1
                for fd, _ in poller.poll(wait_ms):
                    if fd == self._wake_r:
                        os.read(self._wake_r, 4096)
                        with self._lock:
                            self._woken = False
                    else:
                        self._collect(by_fd[fd], poller, by_fd)
                if self._timeout is not None:
                    now = time.monotonic()
                    for w in self._workers:
                        if w.sent and now - w.began > self._timeout:
                            self._kill_late(w, poller, by_fd)
        except BaseException as e:  # noqa: BLE001 - a bug here must not leave callers waiting
            failed = [item for w in self._workers for item in w.sent]
            with self._lock:
                self._shutdown = True
                failed += list(self._calls)
                self._calls.clear()
            for fut, _, _ in failed:
                if not fut.done():
                    if fut.running() or fut.set_running_or_notify_cancel():
                        fut.set_exception(e)
            raise
        finally:
            for w in self._workers:
                w.kill()
            with self._lock:
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_w = None

    def _send_calls(self, poller, by_fd):
        """Tops every worker up to DEPTH sent calls (forking a worker where there is none)."""
        import select
        for w in self._workers:
            while len(w.sent) < self.DEPTH and self._calls:
                try:
                    item = self._calls.popleft()
                except IndexError:  # shutdown(cancel_futures=True) took it
                    return
                fut, fn, args = item
                if not (fut.running() or fut.set_running_or_notify_cancel()):
                    continue  # cancelled
                if w.proc is None:
                    try:
                        w.start()
                    except BaseException as e:  # noqa: BLE001 - a failed fork: the call says so, not a hang
                        w.proc = None
                        fut.set_exception(e)
                        raise
                    by_fd[w.conn.fileno()] = w
                    poller.register(w.conn, select.POLLIN)
                if not w.sent:
                    w.began = time.monotonic()
                w.sent.append(item)
                try:
                    w.conn.send((fn, args))
                except (BrokenPipeError, OSError):  # it died: its pipe's EOF says so
                    if len(w.sent) == 1:  # between calls: this one never ran
                        w.sent.pop()
                        self._calls.appendleft(item)
                    break
                except BaseException as e:  # noqa: BLE001 - e.g. an argument that cannot be pickled
                    w.sent.pop()
                    fut.set_exception(e)

    def _collect(self, w, poller, by_fd):
        """The next result waiting in w's pipe; at EOF (the worker died) its running call fails with
        WorkerCrashed and the calls behind it go back to the queue."""
        try:
            self._finish(w)  # one message: poll() reports the pipe again while more are waiting
        except WorkerCrashed as e:
            self._lost(w, e, poller, by_fd)

    def _finish(self, w):
        """Reads w's next result (WorkerCrashed at EOF) and completes its oldest call."""
        try:
            value = w.recv()
        except WorkerCrashed:
            raise
        except Exception as e:  # noqa: BLE001 - the call's own error
            w.began = time.monotonic()
            w.sent.popleft()[0].set_exception(e)
            return
        w.began = time.monotonic()
        w.sent.popleft()[0].set_result(value)

    def _kill_late(self, w, poller, by_fd):
        """w's oldest call is past the timeout: kill w, keep the results it sent before it died; the
        call it was running then fails with CaseTimeout unless it had only just begun (a result
        arrived after all: then it goes back to the queue)."""
        poller.unregister(w.conn)
        by_fd.pop(w.conn.fileno(), None)
        w.proc.kill()
        w.proc.join(5)
        returned = 0
        try:
            while w.conn.poll():
                self._finish(w)
                returned += 1
        except WorkerCrashed:
            pass  # the EOF of the kill (recv closed the pipe)
        w.kill()
        if w.sent and not returned:
            fut = w.sent.popleft()[0]
            fut.set_exception(CaseTimeout(f"timed out after {self._timeout:g} s (the case was killed)"))
        self._requeue(w)

    def _lost(self, w, err, poller, by_fd):
        for fd in [fd for fd, x in by_fd.items() if x is w]:
            poller.unregister(fd)
            del by_fd[fd]
        if w.sent:
            w.sent.popleft()[0].set_exception(err)
        self._requeue(w)

    def _requeue(self, w):
        with self._lock:
            while w.sent:
                self._calls.appendleft(w.sent.pop())


class ThreadExecutor(cf.Executor):
    """A concurrent.futures.Executor of `jobs` daemon threads (the simulator releases the GIL while it
    runs), which take (future, fn, args) items from a queue and stop at a None. A call cannot be
    stopped from outside; `abandon()` says one has outlived its timeout: a new thread takes its
    place, and the old one ends when its call does. Daemon threads do not hold the process open at
    exit."""

    def __init__(self, jobs):
        import queue
        self._queue = queue.Queue()
        self._shutdown = False
        self._lock = threading.Lock()
        self._target = jobs
        self._live = 0
        for _ in range(jobs):
            self._spawn()

    def _spawn(self):
        with self._lock:
            self._live += 1
        threading.Thread(target=self._serve, name="cubesim-sweep", daemon=True).start()

    def _serve(self):
        while True:
            with self._lock:
                if self._live > self._target:  # a replaced thread whose call has ended
                    self._live -= 1
                    return
            item = self._queue.get()
            if item is None:
                with self._lock:
                    self._live -= 1
                return
            fut, fn, args = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001
                fut.set_exception(e)

    def abandon(self):
        """One running call is past its timeout: start a thread in its place."""
        with self._lock:
            self._target += 1
        self._spawn()
        with self._lock:
            self._target -= 1

    def submit(self, fn, /, *args, **kwargs):
        if self._shutdown:
            raise RuntimeError("cannot submit after shutdown")
        fn, args = _CallKw.of(fn, args, kwargs)
        fut = cf.Future()
        self._queue.put((fut, fn, args))
        return fut

    def shutdown(self, wait=True, *, cancel_futures=False):
        """No more calls; with cancel_futures the queued ones are cancelled; a None for each thread."""
        import queue
        self._shutdown = True
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        with self._lock:
            n = self._live
        for _ in range(n):
            self._queue.put(None)


class _CallKw:
    """fn with keyword arguments, sent as one more positional argument (picklable, unlike a lambda)."""

    def __init__(self, fn):
        self.fn = fn

    @staticmethod
    def of(fn, args, kwargs):
        """What an executor's submit(fn, *args, **kwargs) sends: (fn, args) as they are without kwargs."""
        return (_CallKw(fn), args + (kwargs,)) if kwargs else (fn, args)

    def __call__(self, *args):
        return self.fn(*args[:-1], **args[-1])


_MPI_ISOLATED = None


def _mpi_batch(configs, timeout):
    """What an MPI worker runs: a few cases, each in a forked child of its own (crash and timeout
    isolation), returning [(status, result or error)] in order. Batches amortise the round trip to
    rank 0 (mpi4py polls with a backoff of up to a millisecond each way)."""
    global _MPI_ISOLATED
    if _MPI_ISOLATED is None:
        _MPI_ISOLATED = _Isolated()
    out = []
    for config in configs:
        try:
            out.append(("ok", _MPI_ISOLATED.call(run_case, (config,), timeout)))
        except CaseTimeout as e:
            out.append(("timeout", str(e)))
        except WorkerCrashed as e:
            out.append(("crashed", str(e)))
        except Exception as e:  # noqa: BLE001
            out.append(("failed", str(e)))
    return out


def mpi_available():
    try:
        import mpi4py  # noqa: F401
        return True
    except ImportError:
        return False


# ---- the results database ------------------------------------------------------------------------


class ResultsDB:
    """SQLite: a meta table (the spec, its hash) and one row per finished case, committed at once."""

    def __init__(self, path, create=True):
        self.path = str(path)
        if not create:  # read it as it is: a file that is not a sweep's database is refused, not changed
            if not Path(self.path).is_file():
                raise SpecError(f"{self.path}: no such database")
            try:
                self.conn = sqlite3.connect(f"file:{Path(self.path).resolve()}?mode=ro", uri=True, timeout=30)
                schema = self.meta().get("schema")
                self.conn.execute("SELECT idx, hash, params, config, status, metrics, error, wall_s, finished_at "
                                  "FROM cases LIMIT 1")
            except sqlite3.DatabaseError as e:
                raise SpecError(f"{self.path}: not a sweep database ({e})") from None
            if schema != SCHEMA:
                raise SpecError(f"{self.path}: not a sweep database (schema {schema!r}, expected {SCHEMA!r})")
            return
        try:
            # The process executor writes rows from its own thread (its done-callbacks), one at a time.
            self.conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            self.conn.execute(
                "CREATE TABLE IF NOT EXISTS cases (idx INTEGER PRIMARY KEY, hash TEXT UNIQUE NOT NULL, "
                "params TEXT NOT NULL, config TEXT NOT NULL, status TEXT NOT NULL, metrics TEXT, error TEXT, "
                "wall_s REAL, finished_at TEXT)")
        except sqlite3.DatabaseError as e:
            raise SpecError(f"--db {self.path}: cannot use it as a sweep database ({e})") from None

    def meta(self):
        return dict(self.conn.execute("SELECT key, value FROM meta").fetchall())

    def set_meta(self, **kv):
        with self.conn:
            for k, v in kv.items():
                self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (k, v))

    def done_hashes(self, statuses=None):
        rows = self.conn.execute("SELECT hash, status FROM cases").fetchall()
        return {h for h, s in rows if statuses is None or s in statuses}

    def count(self):
        return self.conn.execute("SELECT COUNT(*) FROM cases").fetchone()[0]

    def write(self, case, status, metrics=None, error=None, wall_s=None):
        self.insert(self.row(case, status, metrics, error, wall_s))

    @staticmethod
    def row(case, status, metrics=None, error=None, wall_s=None):
        """A case's row as insert() takes it (a process worker makes its own, JSON and all)."""
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        return (case.index, case.hash, json.dumps(case.params, sort_keys=True), json.dumps(case.config, sort_keys=True),
                status, json.dumps(metrics, sort_keys=True) if metrics is not None else None, error, wall_s, now)

    def insert(self, row):
        self.conn.execute("INSERT OR REPLACE INTO cases VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

    def rows(self):
        out = []
        for idx, h, params, config, status, metrics, error, wall_s, fin in self.conn.execute(
                "SELECT * FROM cases ORDER BY idx"):
            out.append({"case": idx, "hash": h, "params": json.loads(params), "config": json.loads(config),
                        "status": status, "metrics": json.loads(metrics) if metrics else {}, "error": error,
                        "wall_s": wall_s, "finished_at": fin})
        return out

    def close(self):
        self.conn.close()


class Rows(list):
    """The results, one dict per case in case order; to_dataframe() where pandas is installed."""

    abandoned = 0
    # The run's own wall time: from its executor's start, through every case run and recorded, to the
    # executor's shutdown (the interpreter's and mpirun's start are not in it).
    elapsed_s = 0.0

    def to_dataframe(self):
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Rows.to_dataframe needs pandas (apt-get install python3-pandas); the rows are plain "
                              "dicts without it") from None
        return pd.DataFrame(flatten(self))


def flatten(rows):
    """Rows as flat dicts: case, hash, status, each axis path, each metric, wall_s, error."""
    out = []
    for r in rows:
        d = {"case": r["case"], "hash": r["hash"], "status": r["status"]}
        d.update(r["params"])
        d.update(r["metrics"])
        d["wall_s"] = r["wall_s"]
        d["error"] = r["error"]
        out.append(d)
    return out


def load(db):
    """The rows of a sweep database (Rows: list of dicts in case order)."""
    d = ResultsDB(db, create=False)
    try:
        return Rows(d.rows())
    finally:
        d.close()


def export(db, csv_path=None, json_path=None):
    """Writes the results as CSV (flat: one column per axis and metric) and/or JSON (nested rows)."""
    d = ResultsDB(db, create=False)
    try:
        meta, rows = d.meta(), d.rows()
    finally:
        d.close()
    if csv_path:
        flat = flatten(rows)
        cols = []
        for r in flat:
            for k in r:
                if k not in cols:
                    cols.append(k)
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        for r in flat:
            w.writerow({k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()})
        _write(csv_path, buf.getvalue())
    if json_path:
        doc = {"schema": SCHEMA, "spec_hash": meta.get("spec_hash"), "spec": json.loads(meta.get("spec", "null")),
               "cases": rows}
        _write(json_path, json.dumps(doc, indent=1) + "\n")
    return rows


def _write(path, text):
    if path == "-":
        sys.stdout.write(text)
    else:
        Path(path).write_text(text)


# ---- running a sweep -----------------------------------------------------------------------------


def open_db(p, db, resume=False, overwrite=False):
    """The database for plan p: new, or (resume) the one this spec wrote before; refuses one made by
    another spec, naming both hashes, and an existing one without resume or overwrite."""
    path = Path(db)
    if path.is_dir():
        raise SpecError(f"--db {db}: that is a directory; give a file path")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise SpecError(f"--db {db}: the directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise SpecError(f"--db {db}: cannot write there (permission denied)")
    if path.exists() and path.stat().st_size > 0:
        if overwrite or resume:
            ResultsDB(path, create=False).close()  # refuses a file that is not a sweep database
        if overwrite:
            for suffix in ("", "-wal", "-shm"):
                Path(str(path) + suffix).unlink(missing_ok=True)
        elif not resume:
            raise SpecError(f"--db {db}: it exists; add --resume to run only its missing cases, --overwrite to start "
                            "again, or give another file")
    d = ResultsDB(path)
    meta = d.meta()
    if meta.get("spec_hash") and meta["spec_hash"] != p.hash:
        d.close()
        raise SpecError(f"--db {db}: it holds the results of another spec (spec hash {meta['spec_hash']}); this spec's "
                        f"hash is {p.hash}. Give the spec that made it, or another --db")
    if not meta.get("spec_hash"):
        import cubesim as cs
        d.set_meta(spec_hash=p.hash, spec=json.dumps(p.spec, sort_keys=True), schema=SCHEMA,
                   version=cs.__version__, axes=json.dumps(p.axes), axis_groups=json.dumps(p.groups))
    return d


def make_executor(kind, jobs, timeout):
    """The thread or process executor (the MPI one is entered by run(), on every rank)."""
    if kind == "thread":
        return ThreadExecutor(jobs)
    return ProcessExecutor(jobs, timeout)


def run(spec, db, executor="process", jobs=None, resume=False, overwrite=False, skip_invalid=False,
        retry_failed=False, timeout=None, progress=None, log=None):
    """Runs a sweep into the SQLite database db and returns its Rows (None on an MPI worker rank,
    which only serves cases). SpecError before anything runs for a bad spec, invalid cases (unless
    skip_invalid: they are recorded as 'invalid' rows), a database that cannot be used."""
    if executor not in EXECUTORS:
        raise SpecError(f"--executor {executor}: give one of {', '.join(EXECUTORS)}")
    if jobs is not None and (not isinstance(jobs, int) or jobs < 1):
        raise SpecError(f"--jobs {jobs}: give a count >= 1")
    if executor == "mpi":
        if not mpi_available():
            raise SpecError(f"--executor mpi needs mpi4py on Open MPI; install it with: {MPI_INSTALL}")
        from mpi4py.futures import MPICommExecutor
        # Every rank enters the executor first: the others serve cases until rank 0 leaves it, which
        # it does however the sweep ends (a bad spec, an error, Ctrl-C), so no rank is left waiting.
        with MPICommExecutor() as ex:
            if ex is None:
                return None
            return _run(spec, db, executor, jobs, resume, overwrite, skip_invalid, retry_failed, timeout, progress,
                        log, ex)
    return _run(spec, db, executor, jobs, resume, overwrite, skip_invalid, retry_failed, timeout, progress, log, None)


def _run(spec, db, executor, jobs, resume, overwrite, skip_invalid, retry_failed, timeout, progress, log, mpi_ex):
    if executor != "mpi" and int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
        raise SpecError("this is one of several MPI ranks (started by mpirun): give --executor mpi, or every rank "
                        "runs the whole sweep into the same database")
    p = plan(spec)
    timeout = check_timeout(timeout, "--timeout") if timeout is not None else p.timeout
    log = log or (lambda s: None)
    if p.invalid and not skip_invalid:
        lines = "\n".join(f"  case {c.index} {c.params}: {c.invalid}" for c in p.invalid[:10])
        more = f"\n  ... and {len(p.invalid) - 10} more" if len(p.invalid) > 10 else ""
        raise SpecError(f"{len(p.invalid)} of {len(p.cases)} cases cannot run:\n{lines}{more}\n"
                        "add a filter that leaves them out, or --skip-invalid to record them as invalid and run the rest")
    d = open_db(p, db, resume=resume, overwrite=overwrite)
    try:
        keep = {"ok"} if retry_failed else None  # retried: failed, timeout, crashed and invalid (checked again)
        done = d.done_hashes(keep)
        todo = [c for c in p.cases if c.hash not in done]
        for c in todo:
            if c.invalid is not None:
                d.write(c, "invalid", error=c.invalid)
        todo = [c for c in todo if c.invalid is None]
        log(f"sweep {p.hash}: {len(p.cases)} cases, {len(p.cases) - len(todo)} already in {db}, {len(todo)} to run "
            f"({executor} executor)")
        t0 = time.perf_counter()
        abandoned = _drive(p, d, todo, executor, jobs or os.cpu_count() or 1, timeout, progress, mpi_ex) if todo else 0
        elapsed = time.perf_counter() - t0
        rows = Rows(d.rows())
        rows.abandoned = abandoned  # thread executor: calls still running past their timeout
        rows.elapsed_s = elapsed
        return rows
    finally:
        d.close()


def _case_row(case):
    """What a process worker runs: the case, and its database row ready to insert (the JSON is
    encoded in the worker, not in the parent that writes every row)."""
    value = run_case(case.config)
    return ResultsDB.row(case, "ok", metrics=value["metrics"], wall_s=value["wall_s"])


def _drive_process(d, todo, jobs, timeout, progress):
    """The process executor's driver: submits every case; each one's done-callback writes its row,
    in the executor's thread, as its result arrives (no hand-off to this thread, which only waits
    and reports progress)."""
    import functools
    ex = ProcessExecutor(jobs, timeout)
    all_done = threading.Event()
    write_lock = threading.Lock()  # a callback runs here instead if its case finished before it was added
    state = {"finished": 0, "error": None}

    def on_done(c, f):
        if f.cancelled():
            return
        try:
            row = f.result()
        except CaseTimeout as e:
            row = ResultsDB.row(c, "timeout", error=str(e), wall_s=timeout)
        except WorkerCrashed as e:
            row = ResultsDB.row(c, "crashed", error=str(e))
        except Exception as e:  # noqa: BLE001 - the case's own error (a RuntimeError from the worker)
            row = ResultsDB.row(c, "failed", error=str(e) if isinstance(e, RuntimeError) else f"{type(e).__name__}: {e}")
        with write_lock:
            try:
                d.insert(row)
            except BaseException as e:  # noqa: BLE001 - the database: the driver raises it
                state["error"] = state["error"] or e
                all_done.set()
                return
            state["finished"] += 1
            if state["finished"] == len(todo):
                all_done.set()

    interrupted = False
    try:
        for c in todo:
            ex.submit(_case_row, c).add_done_callback(functools.partial(on_done, c))
        t0 = time.monotonic()
        while True:
            n = state["finished"]
            if progress is not None:
                el = time.monotonic() - t0
                progress(n, len(todo), el, el / n * (len(todo) - n) if n else None)
            if all_done.is_set():
                break
            all_done.wait(0.1 if progress is not None else 1.0)
        if state["error"] is not None:
            raise state["error"]
    except BaseException:  # Ctrl-C: keep what finished, stop waiting for the rest (resume runs it)
        interrupted = True
        raise
    finally:
        ex.shutdown(wait=not interrupted, cancel_futures=True)
    return 0


def _drive(p, d, todo, kind, jobs, timeout, progress, mpi_ex=None):
    """Submits every case, then records each as it finishes (a done-callback queues it: O(1) a
    case, where waiting on the whole pending set would cost O(cases) each time)."""
    import queue
    if kind == "process":
        return _drive_process(d, todo, jobs, timeout, progress)
    ex = mpi_ex if kind == "mpi" else make_executor(kind, jobs, timeout)
    starts = {}  # thread executor: case index -> when it began, while it runs
    fut_of = {}  # thread executor: case index -> its future
    abandoned = 0
    finished_q = queue.Queue()

    def timed(config, idx):
        starts[idx] = time.monotonic()  # running now: the driver checks only these for timeouts
        return run_case(config)

    def record(c, status, value):
        if status == "ok":
            d.write(c, "ok", metrics=value["metrics"], wall_s=value["wall_s"])
        else:
            d.write(c, status, error=value, wall_s=timeout if status == "timeout" else None)

    # Thread and process executors get every case at once. MPI tasks are fed as workers free up, in
    # batches of about a quarter second of cases (mpi4py polls with a backoff of up to a millisecond
    # each way, which cases of a few milliseconds would feel), so a case's row is written at most
    # that much later than it finished, and long cases go one at a time.
    if kind == "mpi":
        from mpi4py import MPI
        in_flight = 2 * max(MPI.COMM_WORLD.Get_size() - 1, 1)
    else:
        in_flight = len(todo)
    futs, pending = {}, set()
    next_case = 0
    case_walls = []

    def refill():
        nonlocal next_case
        while len(pending) < in_flight and next_case < len(todo):
            size = 1
            if kind == "mpi" and case_walls:
                mean = sum(case_walls[-64:]) / len(case_walls[-64:])
                size = max(1, min(16, int(0.25 / max(mean, 1e-4))))
            group = todo[next_case:next_case + size]
            next_case += len(group)
            if kind == "thread":
                f = ex.submit(timed, group[0].config, group[0].index)
                fut_of[group[0].index] = f
            elif kind == "process":
                f = ex.submit(run_case, group[0].config)
            else:
                f = ex.submit(_mpi_batch, [c.config for c in group], timeout)
            futs[f] = group
            pending.add(f)
            f.add_done_callback(finished_q.put)

    try:
        refill()
        finished = 0
        t0 = time.monotonic()
        if progress is not None:
            progress(0, len(todo), 0.0, None)
        while pending:
            try:
                f = finished_q.get(timeout=0.5 if kind == "thread" else None)
            except queue.Empty:
                f = None
            if f is not None and f in pending:
                pending.discard(f)
                group = futs[f]
                starts.pop(group[0].index, None)
                try:
                    res = f.result()
                    if kind == "mpi":
                        for c, (status, value) in zip(group, res):
                            record(c, status, value)
                            if status == "ok":
                                case_walls.append(value["wall_s"])
                    else:
                        record(group[0], "ok", res)
                except CaseTimeout as e:
                    record(group[0], "timeout", str(e))
                except WorkerCrashed as e:
                    record(group[0], "crashed", str(e))
                except Exception as e:  # noqa: BLE001 - a case's own failure (or an MPI worker's)
                    msg = str(e) if isinstance(e, RuntimeError) and kind != "thread" else f"{type(e).__name__}: {e}"
                    for c in group:
                        record(c, "failed", msg)
                finished += len(group)
                refill()
            if kind == "thread":  # a thread cannot be killed: record the case and leave the thread
                # Only the running cases (at most the threads'), not every pending one: a sweep of
                # thousands submitted at once made this O(cases) per finished case, under the GIL.
                now = time.monotonic()
                for idx, began in list(starts.items()):
                    if now - began <= timeout:
                        continue
                    starts.pop(idx)
                    f = fut_of[idx]
                    if f in pending:
                        c = futs[f][0]
                        d.write(c, "timeout", error=f"timed out after {timeout:g} s (it runs on in its thread, which "
                                "a new one replaced; the process executor kills such cases)", wall_s=timeout)
                        pending.discard(f)
                        ex.abandon()
                        abandoned += 1
                        finished += 1
            if progress is not None:
                el = time.monotonic() - t0
                eta = el / finished * (len(todo) - finished) if finished else None
                progress(finished, len(todo), el, eta)
    except BaseException:  # Ctrl-C: keep what finished, stop waiting for the rest (resume runs it)
        abandoned += 1
        raise
    finally:
        if kind != "mpi":  # run() leaves the MPI executor
            ex.shutdown(wait=abandoned == 0, cancel_futures=True)
    return abandoned


# ---- looking at results --------------------------------------------------------------------------


DEFAULT_METRIC = "sim_time_ps"


def sensitivity(rows, axes, metrics=None):
    """Per axis: how much it moves each metric with every other axis held fixed. axes: paths, or
    lists of paths varied together (a zip axis). Returns a list of {"axis" (the paths joined by '+'),
    "values", "groups" (sets of cases that differ only in this axis), "spread": {metric: median over
    groups of max/min}, "changes": [metrics it changes]}; an axis with groups but an empty "changes"
    moves no metric (a parameter the model ignores)."""
    ok = [r for r in rows if r["status"] == "ok"]
    if metrics is None:
        metrics = sorted({k for r in ok for k, v in r["metrics"].items() if isinstance(v, (int, float, str))
                          and not isinstance(v, bool)})
    out = []
    for a in axes:
        paths = [a] if isinstance(a, str) else list(a)
        groups = {}
        for r in ok:
            if not all(p in r["params"] for p in paths):
                continue
            key = json.dumps({k: v for k, v in r["params"].items() if k not in paths}, sort_keys=True)
            groups.setdefault(key, []).append(r)

        def value(r):
            return json.dumps([r["params"][p] for p in paths])

        values = sorted({value(r) for g in groups.values() for r in g})
        spread, changes = {}, []
        multi = [g for g in groups.values() if len({value(r) for r in g}) > 1]
        for m in metrics:
            ratios, changed = [], False
            for g in multi:
                vals = [r["metrics"].get(m) for r in g]
                if len({json.dumps(v) for v in vals}) > 1:
                    changed = True
                nums = [v for v in vals if _num(v)]
                if nums and min(nums) > 0:
                    ratios.append(max(nums) / min(nums))
            if changed:
                changes.append(m)
            if ratios:
                ratios.sort()
                spread[m] = ratios[len(ratios) // 2]
        vals = [json.loads(v) for v in values]
        out.append({"axis": "+".join(paths), "values": [v[0] for v in vals] if len(paths) == 1 else vals,
                    "groups": len(multi), "spread": spread, "changes": changes})
    return out


def _num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def plot(db, x, y, hue=None, facet=None, where=None, out="sweep.png", logx=False, logy=False):
    """Plots metric y against axis x (lines per hue value, a panel per facet value) to PNG or SVG.
    Cases that differ in other axes are reduced to their median per point (say so in the title);
    `where` ({path: value}) keeps only matching cases. Returns the path written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpecError("sweep plot needs matplotlib: apt-get install python3-matplotlib") from None
    if Path(out).suffix.lower() not in (".png", ".svg", ".pdf"):
        raise SpecError(f"--out {out}: give a .png, .svg or .pdf file")
    rows = [r for r in load(db) if r["status"] == "ok"]
    flat = flatten(rows)
    if not flat:
        raise SpecError(f"{db}: no finished cases to plot")
    cols = set().union(*(r.keys() for r in flat))
    for flag, name in (("--x", x), ("--y", y), ("--hue", hue), ("--facet", facet)):
        if name is not None and name not in cols:
            axes = sorted(k for k in cols if "." in k or k == "topology")
            mets = sorted(k for k in rows[0]["metrics"])
            raise SpecError(f"{flag} {name}: not an axis or metric of this sweep; axes: {', '.join(axes)}; metrics: "
                            f"{', '.join(mets)}")
    for k, v in (where or {}).items():
        if k not in cols:
            raise SpecError(f"--where {k}: not a column of this sweep")
        flat = [r for r in flat if json.dumps(r.get(k)) == json.dumps(v) or str(r.get(k)) == str(v)]
    if not flat:
        raise SpecError("--where leaves no cases")
    if not any(_num(r.get(y)) for r in flat):
        raise SpecError(f"--y {y}: not a number in these cases; plot a numeric metric (sim_time_ps, events, ...)")
    facets = sorted({json.dumps(r.get(facet)) for r in flat}) if facet else ["null"]
    fig, axs = plt.subplots(1, len(facets), figsize=(5 * len(facets), 4), squeeze=False, sharey=True)
    reduced = False
    for ax, fv in zip(axs[0], facets):
        sub = [r for r in flat if not facet or json.dumps(r.get(facet)) == fv]
        hues = sorted({json.dumps(r.get(hue)) for r in sub}) if hue else ["null"]
        for hv in hues:
            pts = {}
            for r in sub:
                if hue and json.dumps(r.get(hue)) != hv:
                    continue
                if _num(r.get(y)):
                    pts.setdefault(json.dumps(r.get(x)), []).append(r[y])
            xs = sorted(pts, key=lambda s: (not _num(json.loads(s)), json.loads(s) if _num(json.loads(s)) else s))
            reduced |= any(len(pts[k]) > 1 for k in xs)
            ys = [sorted(pts[k])[len(pts[k]) // 2] for k in xs]
            xv = [json.loads(k) for k in xs]
            label = f"{hue}={json.loads(hv)}" if hue else None
            ax.plot(xv, ys, marker="o", label=label)
        ax.set_xlabel(x)
        if facet:
            ax.set_title(f"{facet}={json.loads(fv)}", fontsize=9)
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        if hue:
            ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    axs[0][0].set_ylabel(y + (" (median over other axes)" if reduced else ""))
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


# ---- benchmark -----------------------------------------------------------------------------------


def bench_spec(cases, seed=1):
    """The throughput benchmark's sweep: `cubesim run --topology mesh4x4 --timing-only` (the MLP step
    at its default size, tp 16) at `cases` link bandwidths."""
    return {"name": "sweep throughput bench", "job": "mlp",
            "base": {"topology": "mesh4x4", "run": {"hidden": 512, "ffn": 2048, "tokens": 256}},
            "axes": [{"path": "topology.network.link.bandwidth_GBps",
                      "random": {"loguniform": [16, 1024], "n": cases, "seed": seed}}]}


def _independent_rate(cases, n):
    """Cases per second of n forked processes each running `cases` in a plain loop, timed from a
    common start to the last one's end. RuntimeError if a process fails (none is left behind)."""
    r_go, w_go = os.pipe()
    r_done, w_done = os.pipe()
    pids = []
    try:
        for _ in range(n):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.close(w_go)
                    os.close(r_done)
                    if os.read(r_go, 1) == b"x":  # EOF instead: the parent gave up
                        for c in cases:
                            run_case(c.config)
                        os.write(w_done, b"x")
                        code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
    except BaseException:
        os.close(w_go)  # the children started read EOF and leave
        for pid in pids:
            os.waitpid(pid, 0)
        raise
    finally:
        os.close(r_go)
        os.close(w_done)  # only the children's copies remain: EOF once they have all exited
    time.sleep(0.2)
    t0 = time.perf_counter()
    os.write(w_go, b"x" * n)
    os.close(w_go)
    got = 0
    while got < n:
        part = os.read(r_done, n)
        if not part:
            break  # every child has exited, some without finishing
        got += len(part)
    dt = time.perf_counter() - t0
    os.close(r_done)
    failed = sum(1 for pid in pids if os.waitpid(pid, 0)[1] != 0)
    if got < n or failed:
        raise RuntimeError(f"the independent-process ceiling: {max(n - got, failed)} of {n} processes failed")
    return n * len(cases) / dt


def _synthetic_case(hold_s, free_s):
    """A stand-in for run_case that holds the GIL hold_s (Python work) and then releases it free_s
    (the simulation): with it the thread executor's own cost shows on any machine, since a released
    wait needs no core."""
    def case(config):
        end = time.perf_counter() + hold_s
        while time.perf_counter() < end:
            pass
        time.sleep(free_s)
        return {"metrics": {"sim_time_ps": 0}, "wall_s": hold_s + free_s}
    return case


def executor_overhead(cases=4000, jobs=16, hold_ms=0.15, free_ms=4.0, tmpdir=None):
    """The thread executor and the sweep's driver alone: `cases` synthetic cases on `jobs` threads, each
    holding the GIL hold_ms (about a real case's Python share: its config, the Context's creation and
    report) and then releasing it free_ms. Efficiency = rate / (jobs / (hold + free)): what the executor,
    the database writes and the GIL's hand-over leave of the ideal, independent of the machine's cores
    (the held parts need at most jobs x hold / (hold + free) of one core). The module's run_case is the
    synthetic one meanwhile: run no other sweep in this process at the same time."""
    import tempfile
    global run_case
    real = run_case
    run_case = _synthetic_case(hold_ms * 1e-3, free_ms * 1e-3)
    try:
        with tempfile.TemporaryDirectory(dir=tmpdir) as tmp:
            res = run(bench_spec(cases), Path(tmp) / "overhead.db", executor="thread", jobs=jobs)
    finally:
        run_case = real
    rate = cases / res.elapsed_s
    ideal = jobs / ((hold_ms + free_ms) * 1e-3)
    return {"executor": "thread (synthetic)", "workers": jobs, "cases": cases, "cases_per_s": rate,
            "efficiency": rate / ideal, "hold_ms": hold_ms, "free_ms": free_ms,
            "ok": sum(r["status"] == "ok" for r in res)}


def benchmark(cases=1000, jobs=None, executors=("thread", "process"), mpi_np=(), serial_cases=None, tmpdir=None,
              mpi_cases_per_worker=None, overhead_jobs=16):
    """Cases per second: serially in this process (the single-case rate), then per executor with
    `jobs` workers; efficiency = rate / (jobs x single-case rate). Rates are the sweep's own (its
    elapsed_s: from the first case handed out to the last recorded); `end_to_end` adds the start (the
    executor's workers, and for MPI mpirun and the interpreters). mpi_np: worker counts to run an MPI
    sweep with (mpirun, rank 0 leading), each worker given mpi_cases_per_worker cases (weak scaling, so
    every run lasts about as long), efficiency against the run with the first count given (per
    worker; 1 by default), and an independent ceiling measured at each count on the serial cases.
    With the thread executor, also the executor's own cost on synthetic cases (executor_overhead,
    overhead_jobs threads; 0 skips it)."""
    import tempfile
    import subprocess
    jobs = jobs or os.cpu_count() or 1
    spec = bench_spec(cases)
    p = plan(spec)
    serial = p.cases[: serial_cases or min(len(p.cases), 200)]
    t0 = time.perf_counter()
    for c in serial:
        run_case(c.config)
    single = len(serial) / (time.perf_counter() - t0)
    rows = [{"executor": "serial", "workers": 1, "cases": len(serial), "cases_per_s": single, "efficiency": 1.0}]
    # The machine's own ceiling: `jobs` forked processes, each running the serial cases in a plain loop
    # (no executor, no database), timed from when all have started: what the machine gives `jobs`
    # copies of this work (shared caches, memory bandwidth, SMT siblings, clocks), which the executors'
    # overhead is measured against too.
    ceiling = _independent_rate(serial, jobs)
    rows.append({"executor": "independent", "workers": jobs, "cases": jobs * len(serial), "cases_per_s": ceiling,
                 "efficiency": ceiling / (jobs * single)})
    with tempfile.TemporaryDirectory(dir=tmpdir) as tmp:
        for kind in executors:
            db = Path(tmp) / f"{kind}.db"
            t0 = time.perf_counter()
            res = run(spec, db, executor=kind, jobs=jobs)
            total = time.perf_counter() - t0
            rate = len(p.cases) / res.elapsed_s
            rows.append({"executor": kind, "workers": jobs, "cases": len(p.cases), "cases_per_s": rate,
                         "efficiency": rate / (jobs * single), "of_independent": rate / ceiling,
                         "end_to_end_cases_per_s": len(p.cases) / total})
        if mpi_np:
            base_rate = None
            per = mpi_cases_per_worker or max(cases // max(mpi_np), 50)
            env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
            for n in mpi_np:
                spec_path = Path(tmp) / f"spec{n}.json"
                spec_path.write_text(json.dumps(bench_spec(per * n, seed=n)))
                db, out = Path(tmp) / f"mpi{n}.db", Path(tmp) / f"mpi{n}.json"
                cmd = ["mpirun", "--oversubscribe", "-np", str(n + 1), sys.executable, "-m", "cubesim", "sweep", "run",
                       str(spec_path), "--db", str(db), "--executor", "mpi", "--json", str(out)]
                t0 = time.perf_counter()
                subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
                total = time.perf_counter() - t0
                rate = per * n / json.loads(out.read_text())["elapsed_s"]
                base_rate = base_rate or rate / n
                rows.append({"executor": "mpi", "workers": n, "cases": per * n, "cases_per_s": rate,
                             "efficiency": rate / (n * base_rate),
                             "of_independent": rate / (ceiling if n == jobs else _independent_rate(serial, n)),
                             "end_to_end_cases_per_s": per * n / total,
                             "oversubscribed": n + 1 > (os.cpu_count() or 1)})
    if "thread" in executors and overhead_jobs:
        rows.append(executor_overhead(cases=max(cases, 250 * overhead_jobs), jobs=overhead_jobs, tmpdir=tmpdir))
    return rows
