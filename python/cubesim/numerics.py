"""cubesim.numerics: layer-wise error propagation of a deep tensor-parallel model against an fp32
reference, for named variants of the run's config (`cubesim numerics --config FILE`).

The model is a residual stack of `layers` Megatron ParallelMLP blocks (tp/layers.h), each
h <- h + MLP_l(h) with its own master weights (seed + l), run forward and backward (the output
gradient drawn from the data seed). For every layer it captures the forward activation (the residual
stream after the block: `layers.<l>.output`) and the input gradient (the gradient of the block's
input: `layers.<l>.input_grad`). The reference runs the base config with fp32 forced (model.dtype and
model.residual_dtype f32, the host backend, exact GEMMs); a variant is that reference with its own
dotted-path overrides on top, then what the tool requires (values: run.timing_only false), so a
variant states only what it changes:

    {"model": {"layers": 24, "hidden": 1024, "ffn": 4096, "tokens": 64, "tp": 4},
     "run": {"backend": "sim", "topology": "ring4"},
     "variants": {"bf16": {"model.dtype": "bf16"},
                  "bf16 on sim": {"model.dtype": "bf16", "run.backend": "sim"},
                  "bf16, bf16 residual": {"model.dtype": "bf16", "model.residual_dtype": "bf16"}}}

Per tensor and variant: rms_abs = RMS(v - ref), rms_rel = rms_abs / sqrt(ref_scale^2 + eps) with
ref_scale = RMS(ref), max_abs = max |v - ref|, max_rel = max_abs / sqrt(max|ref|^2 + eps), all in
float64 (eps = 1e-30). Results: a console table, precision_report.json, a summary table (fw and bw
rows per variant: first layer, median and max over the middle layers, last layer) and a plot of
rms_rel per layer.

    import cubesim as cs
    rep = cs.numerics.run("examples/numerics/bf16_vs_fp32.json", output_dir="out")
    rep["variants"]["bf16"]["tensors"]["layers.0.output"]["rms_rel"]
"""
import copy
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np

from . import _cubesim
from ._docfile import read_document

SCHEMA = "cubesim.numerics/1"
EPS = 1e-30
MAX_CONFIG_BYTES = 1 << 20

# Every field of a config with its default; variants and the base name fields by dotted path.
DEFAULTS = {
    "model": {
        "layers": 4,          # ParallelMLP blocks in the residual stack
        "hidden": 256,
        "ffn": 1024,
        "tokens": 32,
        "tp": 4,              # tensor-parallel size (ranks)
        "dtype": "bf16",      # weights and activations of the blocks
        "residual_dtype": "f32",  # the residual stream between blocks
        "gelu": "tanh",       # tanh | erf
        "bias": True,
        "seed": 1234,         # master weights: block l draws from seed + l
    },
    "data": {
        "seed": 1,            # the input and the output gradient (normal, scaled below)
        "vocab": 0,           # > 0: the input is seeded random tokens in [0, vocab) looked up in a seeded
                              # embedding (row t normal from default_rng((seed, 1, t)), times input_scale);
                              # 0: normal activations
        "input_scale": 1.0,
        "grad_scale": 1.0,
        "npz": None,          # a file with arrays "input" and "output_grad" [tokens, hidden] instead (or, for
                              # the input, "tokens" [tokens] ints and "embedding" [vocab, hidden]), and
                              # optionally every block's weights (layers.<l>.fc1.weight [ffn, hidden],
                              # .fc1.bias [ffn], .fc2.weight [hidden, ffn], .fc2.bias [hidden])
    },
    "run": {
        "backend": "sim",     # sim | host | cuda
        "topology": "ring4",  # sim: a topology name or file
        "algorithm": "ring",  # the collectives' algorithm
        "accumulate_f32": False,  # collectives carry bf16/f16 partial sums in f32
        "gemm_mode": "exact",     # cuda: exact | tensor_core
        "gemm_numerics": "f32_fma_seq",  # sim, host: the GEMMs' accumulator model (kernels/accumulator.h)
        "share_gpus": False,      # cuda: more ranks (model.tp) than GPUs, rank r on GPU r % GPUs
        "timing_only": False,     # the tool needs values: always false
    },
}
# What the reference forces (first), and what the tool requires of every run (last, always wins).
REFERENCE_FORCES = {"model.dtype": "f32", "model.residual_dtype": "f32", "run.backend": "host",
                    "run.gemm_mode": "exact", "run.gemm_numerics": "f32_fma_seq"}
TOOL_REQUIRES = {"run.timing_only": False}
CHOICES = {
    "model.dtype": ("f32", "bf16", "f16"),
    "model.residual_dtype": ("f32", "bf16", "f16"),
    "model.gelu": ("tanh", "erf"),
    "run.gemm_mode": ("exact", "tensor_core"),
    "run.gemm_numerics": ("f32_fma_seq", "pairwise", "bf16_acc", "hopper_tc"),
}
RANGES = {"data.vocab": (0, 1 << 24), "model.layers": (1, 1024), "model.hidden": (1, 1 << 16), "model.ffn": (1, 1 << 18),
          "model.tokens": (1, 1 << 16), "model.tp": (1, 1024)}


class ConfigError(ValueError):
    """A config the tool cannot run: names the file, the dotted path and what would be valid."""


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        p = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, p + "."))
        else:
            out[p] = v
    return out


def _closest(name, valid):
    import difflib
    m = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    return f" (did you mean '{m[0]}'?)" if m else ""


def _set(cfg, path, value, origin):
    valid = sorted(_flat(DEFAULTS))
    if path not in valid:
        raise ConfigError(f"{origin}: '{path}' is not a field{_closest(path, valid)}; valid: {', '.join(valid)}")
    section, key = path.split(".", 1)
    cfg[section][key] = value


def _check(cfg, origin):
    """Types and ranges of a resolved config; ConfigError naming the path."""
    for path, dflt in _flat(DEFAULTS).items():
        section, key = path.split(".", 1)
        v = cfg[section][key]
        if path == "data.npz":
            if v is not None and not isinstance(v, str):
                raise ConfigError(f"{origin}: {path}: expected a file name or null, got {v!r}")
            continue
        if isinstance(dflt, bool):
            if not isinstance(v, bool):
                raise ConfigError(f"{origin}: {path}: expected true or false, got {v!r}")
        elif isinstance(dflt, int):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"{origin}: {path}: expected an integer, got {v!r}")
            lo, hi = RANGES.get(path, (0, 2 ** 63 - 1))
            if not lo <= v <= hi:
                raise ConfigError(f"{origin}: {path} = {v}: valid are integers in [{lo}, {hi}]")
        elif isinstance(dflt, float):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"{origin}: {path}: expected a positive number, got {v!r}")
        elif isinstance(dflt, str):
            if not isinstance(v, str):
                raise ConfigError(f"{origin}: {path}: expected a string, got {v!r}")
            if path in CHOICES and v not in CHOICES[path]:
                raise ConfigError(f"{origin}: {path}: '{v}' is not valid (valid: {', '.join(CHOICES[path])})")
    m = cfg["model"]
    if m["ffn"] % m["tp"] or m["hidden"] % m["tp"]:
        raise ConfigError(f"{origin}: model.tp = {m['tp']} must divide model.ffn = {m['ffn']} and model.hidden = "
                          f"{m['hidden']} (the column layer splits ffn, the row layer's input is split)")
    backends = [b["name"] for b in _cubesim.backend_info()]
    if cfg["run"]["backend"] not in backends:
        raise ConfigError(f"{origin}: run.backend: '{cfg['run']['backend']}' is not a backend (valid: "
                          f"{', '.join(backends)})")
    if cfg["run"]["gemm_mode"] != "exact" and cfg["run"]["backend"] != "cuda":
        raise ConfigError(f"{origin}: run.gemm_mode = '{cfg['run']['gemm_mode']}' needs run.backend 'cuda' (sim and "
                          f"host run the exact GEMM of the numerics contract; their accumulator models are "
                          f"run.gemm_numerics)")
    if cfg["run"]["gemm_numerics"] != "f32_fma_seq" and cfg["run"]["backend"] == "cuda":
        raise ConfigError(f"{origin}: run.gemm_numerics = '{cfg['run']['gemm_numerics']}' is modelled by the sim and "
                          f"host backends (the GPU has its own: run.gemm_mode)")
    if cfg["data"]["vocab"] and cfg["data"]["npz"]:
        raise ConfigError(f"{origin}: data.vocab = {cfg['data']['vocab']} draws seeded tokens, and data.npz gives the "
                          f"data: set one (an .npz brings its own 'tokens' and 'embedding')")
    if cfg["run"]["share_gpus"] and cfg["run"]["backend"] != "cuda":
        raise ConfigError(f"{origin}: run.share_gpus places several ranks on one GPU; run.backend is "
                          f"'{cfg['run']['backend']}' (it applies to 'cuda' only)")
    if cfg["run"]["gemm_numerics"] == "hopper_tc" and cfg["model"]["dtype"] == "f32":
        raise ConfigError(f"{origin}: run.gemm_numerics = 'hopper_tc' models bf16/f16 tensor-core MMAs; model.dtype "
                          f"is f32 (set model.dtype bf16 or f16)")


def load_config(config, sets=()):
    """The config as a dict (a path to a JSON or YAML file, or a dict), checked: unknown sections,
    fields and variant paths are refused naming them (ConfigError). `sets`: "path=value" overrides of
    the base (the value JSON, or a string when it is not JSON), after the file."""
    origin = "config"
    base_dir = Path(".")
    if isinstance(config, dict):
        doc = copy.deepcopy(config)
    else:
        path = Path(config)
        origin, base_dir = str(path), path.parent
        doc = read_document(path, MAX_CONFIG_BYTES, "a config", error=ConfigError, yaml_ok=True)
    if not isinstance(doc, dict):
        raise ConfigError(f"{origin}: expected an object with model, data, run and variants")
    sections = list(DEFAULTS) + ["variants"]
    for k in doc:
        if k not in sections:
            raise ConfigError(f"{origin}: '{k}' is not a section{_closest(k, sections)}; valid: {', '.join(sections)}")
    cfg = copy.deepcopy(DEFAULTS)
    for section in DEFAULTS:
        given = doc.get(section, {})
        if not isinstance(given, dict):
            raise ConfigError(f"{origin}: {section}: expected an object, got {given!r}")
        for k, v in given.items():
            _set(cfg, f"{section}.{k}", v, origin)
    for s_ in sets:
        path, eq, text = str(s_).partition("=")
        if not eq or not path:
            raise ConfigError(f"--set {s_}: expected path=value (e.g. model.layers=24)")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        _set(cfg, path, value, f"--set {s_}")
    variants = doc.get("variants", {})
    if not isinstance(variants, dict) or not variants:
        raise ConfigError(f"{origin}: variants: expected an object of named variants, each "
                          "{dotted.path: value, ...} (e.g. {\"bf16\": {\"model.dtype\": \"bf16\"}})")
    if "reference" in variants:
        raise ConfigError(f"{origin}: variants.reference: the name 'reference' is the fp32 reference's")
    for name, ov in variants.items():
        if not isinstance(ov, dict):
            raise ConfigError(f"{origin}: variants.{name}: expected {{dotted.path: value, ...}}, got {ov!r}")
        probe = copy.deepcopy(cfg)
        for p, v in ov.items():
            _set(probe, p, v, f"{origin}: variants.{name}")
    if cfg["data"]["npz"] is not None:
        npz = Path(cfg["data"]["npz"])
        cfg["data"]["npz"] = str(npz if npz.is_absolute() else base_dir / npz)
    _check(cfg, origin)
    cfg["variants"] = {k: dict(v) for k, v in variants.items()}
    return cfg


def resolve(cfg):
    """The reference's config and each variant's, with the notes on precedence: [(name, config,
    notes)], the reference first."""
    base = {s: dict(cfg[s]) for s in DEFAULTS}
    ref = copy.deepcopy(base)
    for p, v in REFERENCE_FORCES.items():
        _set(ref, p, v, "reference")
    notes = [f"{p} = {v!r} forced (was {_flat(base)[p]!r})" for p, v in REFERENCE_FORCES.items()
             if _flat(base)[p] != v]
    out = [("reference", ref, notes)]
    for name, ov in cfg["variants"].items():
        c = copy.deepcopy(ref)
        notes = []
        for p, v in ov.items():
            if p in REFERENCE_FORCES:
                notes.append(f"sets {p} = {v!r}, which the reference forces to {REFERENCE_FORCES[p]!r}: the "
                             "variant's value applies to it")
            _set(c, p, v, f"variants.{name}")
        for p, v in TOOL_REQUIRES.items():
            if _flat(c)[p] != v:
                notes.append(f"sets {p} = {_flat(c)[p]!r}, but the tool needs {v!r} (values to compare): "
                             "the tool's value applies")
            _set(c, p, v, f"variants.{name}")
        _check(c, f"variants.{name}")
        out.append((name, c, notes))
    return out


def _weights(cfg, arrays, path):
    """The blocks' full weights from the .npz's arrays: None when it has none; ConfigError naming a
    missing or mis-shaped array otherwise."""
    m = cfg["model"]
    names = [k for k in arrays if k.startswith("layers.")]
    if not names:
        return None
    out = []
    for l in range(m["layers"]):
        block = {}
        for part, shape in (("fc1.weight", (m["ffn"], m["hidden"])), ("fc1.bias", (m["ffn"],)),
                            ("fc2.weight", (m["hidden"], m["ffn"])), ("fc2.bias", (m["hidden"],))):
            key = f"layers.{l}.{part}"
            if part.endswith("bias") and not m["bias"]:
                continue
            if key not in arrays:
                raise ConfigError(f"data.npz: {path} has weights but no array '{key}' (every block needs fc1.weight "
                                  f"{list((m['ffn'], m['hidden']))}, fc1.bias [{m['ffn']}], fc2.weight "
                                  f"{list((m['hidden'], m['ffn']))}, fc2.bias [{m['hidden']}]; model.layers = "
                                  f"{m['layers']})")
            a = np.asarray(arrays[key])
            if a.shape != shape or a.dtype.kind not in "fiu":
                raise ConfigError(f"data.npz: '{key}' is {a.dtype}{list(a.shape)}; expected numbers of shape {list(shape)}")
            block[part] = a.astype(np.float32)
        out.append(block)
    extra = sorted(set(names) - {f"layers.{l}.{p}" for l in range(m["layers"])
                                 for p in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")})
    if extra:
        raise ConfigError(f"data.npz: {path}: '{extra[0]}' is not a weight of the model (blocks 0..{m['layers'] - 1}, "
                          "each fc1.weight, fc1.bias, fc2.weight, fc2.bias)")
    return out


def token_ids(cfg):
    """The seeded random tokens of a config with data.vocab > 0: model.tokens ids in [0, vocab)."""
    m, d = cfg["model"], cfg["data"]
    return np.random.default_rng((d["seed"], 0x70C)).integers(0, d["vocab"], m["tokens"])


def embed(ids, hidden, seed, scale):
    """Rows of the seeded embedding: token t's row is normal from numpy's default_rng((seed, 1, t)),
    times scale, whatever the vocabulary's size (only the rows used are drawn)."""
    rows = {int(t): np.random.default_rng((seed, 1, int(t))).standard_normal(hidden) * scale for t in set(ids.tolist())}
    return np.stack([rows[int(t)] for t in ids])


def _npz_input(arrays, path, shape):
    """The input from an .npz: 'input' [tokens, hidden], or 'tokens' looked up in 'embedding'."""
    if "tokens" in arrays:
        ids = np.asarray(arrays["tokens"])
        if ids.shape != shape[:1] or ids.dtype.kind not in "iu":
            raise ConfigError(f"data.npz: 'tokens' is {ids.dtype}{list(ids.shape)}; expected integers of shape "
                              f"[{shape[0]}] (model.tokens)")
        if "embedding" not in arrays:
            raise ConfigError(f"data.npz: {path} has 'tokens' but no 'embedding' [vocab, {shape[1]}] to look them up in")
        e = np.asarray(arrays["embedding"])
        if e.ndim != 2 or e.shape[1] != shape[1] or e.shape[0] < 1 or e.dtype.kind not in "fiu":
            raise ConfigError(f"data.npz: 'embedding' is {e.dtype}{list(e.shape)}; expected numbers of shape "
                              f"[vocab, {shape[1]}] (model.hidden)")
        bad = ids[(ids < 0) | (ids >= e.shape[0])]
        if bad.size:
            raise ConfigError(f"data.npz: token id {int(bad[0])} is outside the embedding's vocabulary [0, "
                              f"{e.shape[0]})")
        if "input" in arrays:
            raise ConfigError(f"data.npz: {path} has both 'input' and 'tokens': give one")
        return e[ids].astype(np.float64)
    return _npz_activation(arrays, path, "input", shape)


def _npz_activation(arrays, path, key, shape):
    """Array `key` of the .npz as float64 [tokens, hidden]; ConfigError naming it when missing or mis-shaped."""
    if key not in arrays:
        raise ConfigError(f"data.npz: {path} has no array '{key}' (it needs 'input', or 'tokens' and 'embedding', "
                          f"and 'output_grad' of shape {list(shape)}; it has {', '.join(sorted(arrays)) or 'none'})")
    a = np.asarray(arrays[key])
    if a.shape != shape or a.dtype.kind not in "fiu":
        raise ConfigError(f"data.npz: '{key}' is {a.dtype}{list(a.shape)}; expected numbers of shape "
                          f"{list(shape)} (model.tokens x model.hidden)")
    return a.astype(np.float64)


def _data(cfg):
    """The input, the output gradient and the weights (None: the seeded master weights)."""
    m, d = cfg["model"], cfg["data"]
    shape = (m["tokens"], m["hidden"])
    if d["npz"]:
        try:
            with np.load(d["npz"]) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise ConfigError(f"data.npz: cannot read {d['npz']} ({e})") from None
        x = _npz_input(arrays, d["npz"], shape)
        return x, _npz_activation(arrays, d["npz"], "output_grad", shape), _weights(cfg, arrays, d["npz"])
    rng = np.random.default_rng(d["seed"])
    x = rng.standard_normal(shape) * d["input_scale"]
    dy = rng.standard_normal(shape) * d["grad_scale"]
    if d["vocab"]:
        x = embed(token_ids(cfg), m["hidden"], d["seed"], d["input_scale"])
    return x, dy, None


def _context(cfg):
    r, m = cfg["run"], cfg["model"]
    kw = dict(world_size=m["tp"], algorithm=r["algorithm"], accumulate_f32=r["accumulate_f32"])
    info = next(b for b in _cubesim.backend_info() if b["name"] == r["backend"])
    if info["simulates"]:
        kw["topology"] = r["topology"]
    if r["backend"] == "cuda":
        kw["gemm_mode"] = r["gemm_mode"]
        if r["share_gpus"]:
            kw["share_gpus"] = True
    elif r["gemm_numerics"] != "f32_fma_seq":
        kw["gemm_numerics"] = r["gemm_numerics"]
    return _cubesim.Context(r["backend"], **kw)


def run_model(cfg, x, dy, weights=None):
    """One forward and backward pass of the residual stack on the config's backend; returns
    {tensor name: float64 array} (rank 0's copy: every rank holds the same after the all-reduces).
    `weights`: per block the full fc1/fc2 weights and biases (each rank takes its shard), else the
    seeded master weights."""
    m = cfg["model"]
    ctx = _context(cfg)
    if ctx.world_size < m["tp"]:
        raise ConfigError(f"model.tp = {m['tp']}, but run.backend '{cfg['run']['backend']}' has "
                          f"{ctx.world_size} ranks here")
    tp, L = m["tp"], m["layers"]
    bdt, rdt = m["dtype"], m["residual_dtype"]
    captured = {}

    def cast(rank, t, dtype):
        return t if t.dtype == dtype else ctx.tensor(rank, t.numpy(), dtype)

    def rank_fn(rank):
        _cubesim.tp.initialize_model_parallel(tp)
        try:
            blocks = [_cubesim.tp.ParallelMLP(ctx, m["hidden"], m["ffn"], gelu=m["gelu"], bias=m["bias"], dtype=bdt,
                                              seed=m["seed"] + l) for l in range(L)]
            if weights is not None:  # this rank's shards: fc1 by rows (and its bias), fc2 by columns
                per = m["ffn"] // tp
                rows = slice(rank * per, (rank + 1) * per)
                for blk, w in zip(blocks, weights):
                    blk.fc1.weight.copy_from(w["fc1.weight"][rows])
                    blk.fc2.weight.copy_from(np.ascontiguousarray(w["fc2.weight"][:, rows]))
                    if m["bias"]:
                        blk.fc1.bias.copy_from(w["fc1.bias"][rows])
                        blk.fc2.bias.copy_from(w["fc2.bias"])
            h = ctx.tensor(rank, x, rdt)
            for l, blk in enumerate(blocks):
                y = cast(rank, blk.forward(cast(rank, h, bdt)), rdt)
                nh = ctx.empty(rank, list(h.shape), rdt)
                _cubesim.add(h, y, nh)
                h = nh
                if rank == 0:
                    captured[f"layers.{l}.output"] = h.numpy().astype(np.float64)
            g = ctx.tensor(rank, dy, rdt)
            for l in reversed(range(L)):
                dx = cast(rank, blocks[l].backward(cast(rank, g, bdt)), rdt)
                ng = ctx.empty(rank, list(g.shape), rdt)
                _cubesim.add(g, dx, ng)
                g = ng
                if rank == 0:
                    captured[f"layers.{l}.input_grad"] = g.numpy().astype(np.float64)
        finally:
            _cubesim.tp.destroy_model_parallel()

    ctx.spawn(rank_fn, nprocs=tp)
    return captured


def metrics(v, ref):
    """rms_abs, rms_rel, max_abs, max_rel of v against ref (float64)."""
    v = np.asarray(v, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    d = v - ref
    rms_abs = float(np.sqrt(np.mean(d * d)))
    ref_scale = float(np.sqrt(np.mean(ref * ref)))
    max_abs = float(np.max(np.abs(d))) if d.size else 0.0
    ref_max = float(np.max(np.abs(ref))) if ref.size else 0.0
    return {"rms_abs": rms_abs, "rms_rel": rms_abs / math.sqrt(ref_scale * ref_scale + EPS),
            "max_abs": max_abs, "max_rel": max_abs / math.sqrt(ref_max * ref_max + EPS), "ref_scale": ref_scale}


def tensor_names(layers):
    return [f"layers.{l}.output" for l in range(layers)] + [f"layers.{l}.input_grad" for l in range(layers)]


def summarize(tensors, layers):
    """Per direction (fw: outputs, bw: input gradients) rms_rel at the first layer, the median and max
    over the middle layers (without the first and last), and the last layer."""
    out = {}
    for direction, kind in (("fw", "output"), ("bw", "input_grad")):
        vals = [tensors[f"layers.{l}.{kind}"]["rms_rel"] for l in range(layers)]
        mid = vals[1:-1]
        out[direction] = {"first": vals[0], "mid_median": statistics.median(mid) if mid else None,
                          "mid_max": max(mid) if mid else None, "last": vals[-1]}
    return out


def _decimals(values):
    """Decimals so that every (non-zero) value keeps two significant digits."""
    d = 0
    for v in values:
        if v is None or v == 0 or not math.isfinite(v):
            continue
        d = max(d, 1 - math.floor(math.log10(abs(v))))
    return min(d, 20)


def format_summary(rep):
    from ._table import format_table
    layers = rep["config"]["model"]["layers"]
    mid = f"layers 1..{layers - 2}" if layers > 2 else "(none)"
    heads = ["variant", "dir", "first (layer 0)", f"mid median ({mid})", f"mid max ({mid})",
             f"last (layer {layers - 1})"]
    keys = ["first", "mid_median", "mid_max", "last"]
    rows_raw = []
    for name, v in rep["variants"].items():
        if v.get("skipped"):
            rows_raw.append((name, "-", None))
            continue
        for direction in ("fw", "bw"):
            rows_raw.append((name, direction, v["summary"][direction]))
    dec = {k: _decimals([r[2][k] for r in rows_raw if r[2]]) for k in keys}
    rows = []
    for name, direction, s in rows_raw:
        if s is None:
            rows.append([name, "skipped", "", "", "", ""])
            continue
        rows.append([name, direction] + ["-" if s[k] is None else f"{s[k]:.{dec[k]}f}" for k in keys])
    return "rms_rel against the fp32 reference:\n" + format_table(heads, rows)


def format_tensors(rep, max_rows=None):
    from ._table import format_table
    rows = []
    for name, v in rep["variants"].items():
        if v.get("skipped"):
            continue
        for t, mt in v["tensors"].items():
            rows.append([name, t, f"{mt['rms_abs']:.3e}", f"{mt['rms_rel']:.3e}", f"{mt['max_abs']:.3e}",
                         f"{mt['max_rel']:.3e}"])
    if max_rows is not None and len(rows) > max_rows:
        rows = rows[:max_rows] + [["...", f"({len(rows) - max_rows} more rows in precision_report.json)", "", "", "",
                                   ""]]
    return format_table(["variant", "tensor", "rms_abs", "rms_rel", "max_abs", "max_rel"], rows)


def plot(rep, path):
    """rms_rel per layer, forward and backward, one line per variant (PNG or SVG by the suffix)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    layers = rep["config"]["model"]["layers"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (direction, kind) in zip(axes, (("forward (layer outputs)", "output"),
                                            ("backward (input gradients)", "input_grad"))):
        for name, v in rep["variants"].items():
            if v.get("skipped"):
                continue
            ys = [v["tensors"][f"layers.{l}.{kind}"]["rms_rel"] for l in range(layers)]
            # Zero error (bitwise equal to the reference) has no place on a log axis: left out, said in the legend.
            label = name if any(ys) else f"{name} (bitwise equal: not drawn)"
            ax.plot(range(layers), [y if y > 0 else float("nan") for y in ys], marker="o", markersize=3, label=label)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel("layer")
        ax.set_title(direction)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("rms_rel against fp32")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None} if str(path).endswith(".png") else None)
    plt.close(fig)


def run(config, *, output_dir=None, progress=None, save_tensors=False, sets=()):
    """Runs the study: the reference, then each variant; returns the report (the dict written to
    precision_report.json). A variant whose backend cannot run here is skipped with the reason.
    progress(done, total, name) is called after each run."""
    cfg = load_config(config, sets)
    runs = resolve(cfg)
    x, dy, weights = _data(cfg)
    rep = {"schema": SCHEMA, "config": {s: cfg[s] for s in DEFAULTS}, "eps": EPS, "reference": {},
           "variants": {}}
    ref_tensors = None
    saved = {}
    wall = {}
    for i, (name, c, notes) in enumerate(runs):
        t0 = time.monotonic()
        entry = {"config": c, "notes": notes}
        info = next(b for b in _cubesim.backend_info() if b["name"] == c["run"]["backend"])
        if not info["available"]:
            if name == "reference":
                raise ConfigError(f"reference: backend '{c['run']['backend']}' cannot run here ({info['why_not']})")
            entry["skipped"] = f"backend '{c['run']['backend']}' cannot run here: {info['why_not']}"
            rep["variants"][name] = entry
            if progress:
                progress(i + 1, len(runs), name)
            continue
        tensors = run_model(c, x, dy, weights)
        wall[name] = time.monotonic() - t0
        if save_tensors:
            saved[name] = tensors
        if name == "reference":
            ref_tensors = tensors
            entry["ref_scale"] = {t: metrics(a, a)["ref_scale"] for t, a in tensors.items()}
            rep["reference"] = entry
        else:
            entry["tensors"] = {t: metrics(tensors[t], ref_tensors[t]) for t in tensor_names(cfg["model"]["layers"])}
            for mt in entry["tensors"].values():
                del mt["ref_scale"]
            entry["summary"] = summarize(entry["tensors"], cfg["model"]["layers"])
            rep["variants"][name] = entry
        if progress:
            progress(i + 1, len(runs), name)
    if output_dir is not None:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "precision_report.json", "w") as f:
            json.dump(rep, f, indent=1, sort_keys=True)
            f.write("\n")
        if any(not v.get("skipped") for v in rep["variants"].values()):
            plot(rep, out / "rms_rel.png")
        if save_tensors:
            np.savez(out / "tensors.npz", **{f"{n}/{t}": a for n, ts in saved.items() for t, a in ts.items()})
    rep["_wall_s"] = wall  # not in the file: the report there is the same bits every run
    return rep
