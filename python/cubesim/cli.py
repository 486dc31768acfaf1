"""The cubesim command line.

    cubesim topo list | show NAME | validate FILE
    cubesim run [--topology NAME|FILE] [--tp N] [--cubes LIST] [--backend NAME] [--trace FILE] [--json FILE] ...
    cubesim algorithms | backends [--json FILE]
    cubesim bench collectives | gemm | tp | transfer | sim-core [options passed to the benchmark]
    cubesim xcheck [--topology NAME] [--tp N]... [options passed to cubesim-xcheck]
    cubesim calibrate [--base NAME] [--measurements FILE | --measure-only] [--out OVERLAY] [--check OVERLAY]
    cubesim sdc run [--recipe FILE] [--set PATH=VALUE] [--dry-run] | campaign --faults N --seed S [--json FILE]
    cubesim sweep plan SPEC | run SPEC --db FILE [--executor thread|process|mpi] [--resume] | report DB |
                  export DB --csv FILE | plot DB --x PATH --y METRIC [--hue PATH] [--facet PATH]

Human output is aligned tables on stdout; --json FILE writes the same results for machines
(--json - prints only the JSON, on stdout). Exit codes: 0 success; 1 the job ran and failed (a check
failed, a topology is invalid, a simulation raised); 2 the request was wrong (bad arguments, an
unknown topology, a tp the topology cannot hold, a backend this build lacks, a missing benchmark).
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import cubesim as cs

from ._progress import Progress
from ._table import format_table

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
JSON_SCHEMA_RUN = "cubesim.run/1"
MODEL_NAMES = {"mlp": "ParallelMLP", "gpt": "GPTModel"}

BENCHES = {
    "collectives": "bench_collectives",
    "gemm": "bench_det_gemm_cpu",
    "tp": "bench_tp_mlp",
    "gpt": "bench_tp_gpt",
    "transfer": "bench_transfer",
    "sim-core": "bench_sim_core",
}


class UsageError(Exception):
    """A request the command cannot serve as asked (exit code 2)."""


# ---- formatting ----------------------------------------------------------------------------------


def fmt_time(ps):
    return cs.core.format_time(int(ps))


def fmt_bytes(n):
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{n} B"


def fmt_num(x):
    return f"{x:g}"


def fmt_err(x):
    return "0" if x == 0 else f"{x:.3g}"


def pct(part, whole):
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def plural(n, word):
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def ranges(values):
    """[0, 1, 2, 5] -> '0-2, 5'."""
    values = sorted(values)
    out, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(out)


class Output:
    """Human text to stdout unless --json - asked for JSON only; JSON to the file --json names."""

    def __init__(self, json_path):
        check_output_path("--json", json_path)  # before any work: a bad path must not cost the run
        self.json_path = json_path
        self.quiet = json_path == "-"

    def say(self, text=""):
        if not self.quiet:
            print(text)

    def json(self, obj):
        if not self.json_path:
            return
        text = json.dumps(obj, indent=2, sort_keys=False)
        if self.json_path == "-":
            print(text)
            return
        try:
            Path(self.json_path).write_text(text + "\n")
        except OSError as e:
            raise UsageError(f"--json {self.json_path}: cannot write it ({e.strerror})") from e
        self.say(f"json: {self.json_path}")


def check_output_path(flag, path):
    """Refuses, before any work, an output file that cannot be written (a missing or read-only
    directory, a directory in its place); '-' (stdout) is always fine."""
    if not path or path == "-":
        return
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise UsageError(f"{flag} {path}: that is a directory; give a file path")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: the directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"{flag} {path}: cannot write there (permission denied)")


def int_in(lo, hi, what):
    """An argparse type: an integer in [lo, hi], refused with the range otherwise (no traceback,
    exit 2)."""
    def parse(text):
        try:
            v = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer; give {what}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v} is out of range; give {what}")
        return v
    parse.__name__ = "integer"
    return parse


SEED = int_in(0, 2**64 - 1, "a seed from 0 to 2^64-1")
SIZE = int_in(1, 2**40, "a size from 1 to 2^40")


def parse_sets(items):
    """['cube.hbm.bandwidth_GBps=4096', 'network.kind="ring"'] -> [(path, value)]; values are JSON,
    or taken as strings when they do not parse."""
    out = []
    for item in items or []:
        path, sep, value = item.partition("=")
        if not sep or not path:
            raise UsageError(f"--set {item!r}: write it as PATH=VALUE, e.g. --set cube.hbm.bandwidth_GBps=4096")
        try:
            out.append((path.strip(), json.loads(value)))
        except json.JSONDecodeError:
            out.append((path.strip(), value))
    return out


# ---- topo ----------------------------------------------------------------------------------------


def topology_summary(t):
    pes = t.pe_counts  # counted in C++: a summary of 65536 cubes makes no dict per cube or link
    return {
        "name": t.name,
        "cubes": t.num_cubes,
        "pes_per_cube": pes[0] if len(pes) == 1 else pes,
        "network": t.network,
        "links": t.num_links,
        "description": t.description,
    }


def cmd_topo_list(args):
    out = Output(args.json)
    rows, items = [], []
    for name in cs.list_topologies():
        try:
            s = topology_summary(cs.load_topology(name))
        except cs.TopologyError as e:
            s = {"name": name, "error": str(e)}
        items.append(s)
        if "error" in s:
            rows.append([name, "-", "-", "invalid", s["error"][:60]])
            continue
        desc = s["description"]
        if len(desc) > 70:
            desc = desc[:67].rstrip() + "..."
        rows.append([name, s["cubes"], s["pes_per_cube"], s["network"], desc])
    out.say(f"shipped topologies ({cs.topology_dir()}); default: {cs.DEFAULT_TOPOLOGY}")
    out.say(format_table(["name", "cubes", "PEs/cube", "network", "description"], rows))
    out.json({"topology_dir": cs.topology_dir(), "default": cs.DEFAULT_TOPOLOGY, "topologies": items})
    return EXIT_OK


def _rate_text(rate):
    per = ", ".join(f"{k} {fmt_num(v)}" for k, v in rate["per_cycle"].items())
    return f"{per} per cycle at {fmt_num(rate['clock_GHz'])} GHz"


def _cube_lines(c):
    h, pe = c["hbm"], c["pe"]
    lines = [
        f"{c['pes']} PEs; HBM {fmt_bytes(h['capacity_bytes'])} at {fmt_num(h['bandwidth_GBps'])} GB/s "
        f"({h['channels']} channels, {fmt_num(h['latency_ns'])} ns)"
        + (f"; clock x{fmt_num(c['clock_scale'])}" if c["clock_scale"] != 1 else ""),
        f"PE: {fmt_num(pe['clock_GHz'])} GHz; TCM {fmt_bytes(pe['tcm']['capacity_bytes'])} at "
        f"{fmt_num(pe['tcm']['bandwidth_GBps'])} GB/s; DMA read/write {fmt_num(pe['dma']['read_GBps'])}/"
        f"{fmt_num(pe['dma']['write_GBps'])} GB/s; tile {pe['tile']['m']}x{pe['tile']['n']}x{pe['tile']['k']}",
        f"MAC: {_rate_text(pe['mac'])}",
        f"vector: {_rate_text(pe['vector'])}",
    ]
    l2 = c.get("l2")
    if l2:
        lines.insert(1, f"L2: {fmt_bytes(l2['capacity_bytes'])}, {l2['line_bytes']}-byte lines of {l2['sector_bytes']}-byte "
                        f"sectors, {l2['ways']} ways, {fmt_num(l2['bandwidth_GBps'])} GB/s, "
                        f"{fmt_num(l2['latency_ns'])} ns hit latency")
    return lines


def cmd_topo_show(args):
    out = Output(args.json)
    sets = parse_sets(args.set)
    t = cs.load_topology(args.name, overrides=sets or None)
    if args.doc:
        if not out.quiet:
            print(json.dumps(t.doc, indent=2))
        out.json(t.doc)
        return EXIT_OK
    out.say(f"{t.name}: {t.description}")
    out.say(f"  origin    {t.origin}")
    net = t.network + (f" {'x'.join(map(str, t.dims))}" if t.dims else "")
    out.say(f"  network   {net}; {t.num_links} link directions; messages cut into {fmt_bytes(t.chunk_bytes)} chunks")
    sw = t.switch
    if sw is not None:
        line = f"latency {fmt_num(sw['latency_ns'])} ns"
        if sw["links_per_cube"] > 1:
            line += f"; {sw['links_per_cube']} striped links per cube (the links below are their sums)"
        if sw["port_GBps"] is not None:
            line += (f"; ports of {fmt_num(sw['port_GBps'])} GB/s, one per link "
                     f"({fmt_num(sw['port_GBps'] * sw['links_per_cube'])} GB/s per cube and direction)")
        out.say(f"  switch    {line}")
    # Cubes with the same figures are listed once.
    groups = {}
    for c in t.cubes:
        key = json.dumps({k: v for k, v in c.items() if k != "id"}, sort_keys=True)
        groups.setdefault(key, []).append(c)
    for cubes in groups.values():
        ids = [c["id"] for c in cubes]
        label = f"cube {ids[0]}" if len(ids) == 1 else f"cubes {ranges(ids)}"
        for i, line in enumerate(_cube_lines(cubes[0])):
            if len(label) > 10 and i == 0:
                out.say(f"  {label}")
            out.say(f"  {label if i == 0 and len(label) <= 10 else '':<10}{line}")
    links = {}
    for l in t.links:
        key = (l["bandwidth_GBps"], l["latency_ns"], l["overhead_ns"])
        links.setdefault(key, []).append(l["name"])
    if links:
        rows = []
        for (bw, lat, ovh), names in links.items():
            shown = ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")
            rows.append([fmt_num(bw), fmt_num(lat), fmt_num(ovh), shown])
        out.say("  links")
        out.say(format_table(["GB/s", "latency ns", "overhead ns", "links"], rows, indent="    "))
    if t.host:
        h = t.host
        out.say(
            f"  host      memory {fmt_bytes(h['capacity_bytes'])} at {fmt_num(h['bandwidth_GBps'])} GB/s; "
            f"link per cube {fmt_num(h['link']['bandwidth_GBps'])} GB/s, {fmt_num(h['link']['latency_ns'])} ns"
        )
    if t.sources:
        out.say("  sources")
        for s in t.sources:
            out.say(f"    - {s}")
    out.json(
        {
            "name": t.name,
            "description": t.description,
            "origin": t.origin,
            "sources": t.sources,
            "network": t.network,
            "dims": t.dims,
            "num_cubes": t.num_cubes,
            "chunk_bytes": t.chunk_bytes,
            "cubes": t.cubes,
            "links": t.links,
            "switch": t.switch,
            "host": t.host,
            "doc": t.doc,
        }
    )
    return EXIT_OK


_PATH_RE = re.compile(r"^topology '[^']*' \(.*?\): ([A-Za-z_][\w.\-]*): ")
_MISSING_RE = re.compile(r"^topology '[^']*' \(.*?\): missing required field '([^']+)'")
_LINE_RE = re.compile(r"invalid JSON at (line \d+, column \d+)")
_OVERRIDE_RE = re.compile(r"^override path '([^']+)'")


def error_json_path(message):
    """The JSON path a TopologyError message names ('network.link.bandwidth_GBps'), or where in
    the file a syntax error is ('line 3, column 7'), or None."""
    for rx in (_PATH_RE, _MISSING_RE, _LINE_RE, _OVERRIDE_RE):
        m = rx.search(message)
        if m:
            return m.group(1)
    return None


def cmd_topo_validate(args):
    out = Output(args.json)
    sets = parse_sets(args.set)
    try:
        t = cs.load_topology(args.file, overrides=sets or None)
    except cs.TopologyError as e:
        msg = str(e)
        path = error_json_path(msg)
        print(f"{args.file}: invalid", file=sys.stderr)
        if path:
            print(f"  at: {path}", file=sys.stderr)
        print(f"  {msg}", file=sys.stderr)
        out.json({"file": args.file, "valid": False, "path": path, "message": msg})
        return EXIT_USAGE  # an invalid topology is bad input: 2, as run and topo show exit on it (README)
    out.say(f"{args.file}: valid: '{t.name}', {plural(t.num_cubes, 'cube')}, network {t.network}, {t.num_links} link directions")
    out.json({"file": args.file, "valid": True, "path": None, "message": None, "topology": topology_summary(t)})
    return EXIT_OK


# ---- run -----------------------------------------------------------------------------------------


def model_needs(args):
    """What tp must divide for the model of `cubesim run`, as (name, value) pairs."""
    if getattr(args, "model", "mlp") == "gpt":
        groups = args.kv_heads or args.heads
        need = [("ffn", args.ffn), ("kv-heads" if args.kv_heads else "heads", groups), ("vocab", args.vocab)]
        if args.sequence_parallel:
            need.append(("batch x seq", args.batch * args.seq))
        return need
    return [("ffn", args.ffn)] + ([("tokens", args.tokens)] if args.sequence_parallel else [])


def valid_tps(limit, args):
    if getattr(args, "model", "mlp") == "gpt":
        return [p for p in range(1, (limit or 1) + 1) if all(v % p == 0 for _, v in model_needs(args))]
    return cs.tp.valid_tp_sizes(limit, args.ffn, args.tokens, args.sequence_parallel)


def need_text(args):
    return " and ".join(f"{n} {v}" for n, v in model_needs(args))


def choose_tp(args, limit, holder):
    """The tp to run: --tp, checked against the devices (limit; None: any) and the model, else the
    largest that fits. holder names the devices in messages ("topology 'ring4' has 4 cubes")."""
    need = need_text(args)
    if args.tp is None:
        return valid_tps(limit, args)[-1] if limit else 1
    if args.tp < 1:
        raise UsageError(f"--tp {args.tp}: tp must be at least 1")
    valid = valid_tps(limit or args.tp, args)
    if limit is not None and args.tp > limit:
        raise UsageError(
            f"--tp {args.tp}: {holder}, one per rank; valid tp values here: {', '.join(map(str, valid))}"
            + (" (or pick a topology with more cubes: cubesim topo list)" if "topology" in holder else "")
        )
    if args.tp not in valid:
        raise UsageError(f"--tp {args.tp}: tp must divide {need}; valid tp values here: {', '.join(map(str, valid))}")
    return args.tp


def parse_cubes(spec, num_cubes, topo_name):
    """--cubes '0-3' or '0,2,5-7' -> [0, 1, 2, 3] / [0, 2, 5, 6, 7], in the order given (rank r on the
    r-th cube). UsageError naming the flag for bad syntax, a cube out of range or named twice."""
    valid = f"topology '{topo_name}' has cubes 0-{num_cubes - 1}"
    example = "write cube ids and ranges, e.g. --cubes 0-3 or --cubes 0,2,5-7"
    cubes = []
    for part in spec.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not lo.strip().isdigit() or (sep and not hi.strip().isdigit()):
            raise UsageError(f"--cubes {spec}: {part!r} is not a cube id or a range; {example}")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise UsageError(f"--cubes {spec}: the range {part} runs backwards; write it low-high ({b}-{a})")
        for c in range(a, b + 1):
            if c >= num_cubes:
                raise UsageError(f"--cubes {spec}: cube {c} does not exist; {valid}")
            if c in cubes:
                raise UsageError(f"--cubes {spec}: cube {c} is named twice; each rank needs a cube of its own "
                                 f"({valid})")
            cubes.append(c)
    return cubes


def backend_row(name):
    return next(b for b in cs.backend_info() if b["name"] == name)


def cmd_run(args):
    out = Output(args.json)
    check_output_path("--trace", args.trace)
    backend = backend_row(args.backend)
    simulating = [b["name"] for b in cs.backend_info() if b["simulates"]]
    if args.timing_only and not backend["simulates"]:
        raise UsageError(f"--timing-only needs --backend {' or '.join(simulating)} (backend '{args.backend}' keeps "
                         "values)")
    if args.timing != "chunk" and not (backend["simulates"] and args.timing_only):
        raise UsageError(f"--timing {args.timing} needs --timing-only on a simulating backend "
                         f"({' or '.join(simulating)}): a flow-level run moves no bytes, so it cannot give the values "
                         "the check compares; add --timing-only, or leave --timing at chunk")
    if args.dtype not in cs.DTYPES:
        raise UsageError(f"--dtype {args.dtype}: use one of {', '.join(cs.DTYPES)}")
    gpt = args.model == "gpt"
    for flag in ("hidden", "ffn", "tokens") + (("vocab", "heads", "seq", "batch", "layers") if gpt else ()):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be at least 1")
    if gpt:
        if args.kv_heads is not None and args.kv_heads < 1:
            raise UsageError(f"--kv-heads {args.kv_heads}: must be at least 1")
        if args.hidden % args.heads:
            raise UsageError(f"--heads {args.heads}: must divide --hidden {args.hidden} (head size = hidden / heads)")
        if args.kv_heads and args.heads % args.kv_heads:
            raise UsageError(f"--kv-heads {args.kv_heads}: must divide --heads {args.heads} (query groups)")
        if args.lengths is not None:
            try:
                args.lengths = [int(x) for x in args.lengths.split(",")]
            except ValueError:
                raise UsageError(f"--lengths {args.lengths}: give one length per sequence, comma-separated "
                                 f"(e.g. --lengths {','.join([str(args.seq)] * args.batch)})") from None
            if len(args.lengths) != args.batch:
                raise UsageError(f"--lengths: {len(args.lengths)} lengths for --batch {args.batch}; give one per "
                                 "sequence")
            bad = [n for n in args.lengths if not 1 <= n <= args.seq]
            if bad:
                raise UsageError(f"--lengths: {bad[0]} is outside 1..--seq {args.seq} (each sequence's real tokens)")
    sets = parse_sets(args.set)
    sim = backend["simulates"]
    topo = None
    cubes = None
    if args.cubes is not None and not sim:
        raise UsageError(f"--cubes places the ranks on cubes of a topology: it needs --backend "
                         f"{' or '.join(simulating)} (backend '{args.backend}' has no cubes)")
    if sim:
        topo = cs.load_topology(args.topology, overrides=sets or None)
        if args.cubes is not None:
            cubes = parse_cubes(args.cubes, topo.num_cubes, topo.name)
            if args.tp is not None and args.tp != len(cubes):
                raise UsageError(f"--cubes {args.cubes} names {plural(len(cubes), 'cube')} for --tp {args.tp}: give one "
                                 "cube per rank")
            tp = len(cubes)
            valid = valid_tps(topo.num_cubes, args)
            if tp not in valid:
                need = need_text(args)
                raise UsageError(f"--cubes {args.cubes} names {plural(tp, 'cube')}, one per rank, but tp {tp} does not "
                                 f"divide {need}; valid tp values here: {', '.join(map(str, valid))} (name that many "
                                 "cubes)")
        else:
            tp = choose_tp(args, topo.num_cubes, f"topology '{args.topology}' has {plural(topo.num_cubes, 'cube')}")
            cubes = list(range(tp))
    elif not backend["available"]:
        cs.Context(args.backend, world_size=1)  # raises BackendUnavailableError saying why
        raise UsageError(f"--backend {args.backend}: it cannot run here ({backend['why_not']})")
    elif backend["devices"] >= 0:
        tp = choose_tp(args, backend["devices"],
                       f"backend '{args.backend}' has {plural(backend['devices'], 'device')} here")
    else:
        tp = choose_tp(args, None, "")

    ctx = cs.Context(
        args.backend,
        world_size=tp,
        topology=topo,  # the Topology loaded above (loaded and validated once); None unless simulating
        timing_only=True if args.timing_only else None,  # a backend option: simulating backends take it
        timing=args.timing if args.timing != "chunk" else None,
        trace=bool(args.trace),  # the hardware table comes from the units' counters, not from a trace
        algorithm=args.algorithm,
        record_ops=True,  # a record per GEMM and collective: what backends that measure time report
        ranks_on=cubes if args.cubes is not None else None,  # sim: rank r on cubes[r]
    )
    if args.trace:
        ctx.declare_tracks()
    model = dict(
        tp=tp,
        tokens=args.tokens,
        hidden=args.hidden,
        ffn=args.ffn,
        dtype=args.dtype,
        gelu=args.gelu,
        bias=not args.no_bias,
        sequence_parallel=args.sequence_parallel,
        seed=args.seed,
        data_seed=args.data_seed,
    )
    loss = None
    if gpt:
        model = dict(tp=tp, batch=args.batch, vocab=args.vocab, hidden=args.hidden, heads=args.heads,
                     kv_heads=args.kv_heads, ffn=args.ffn, seq=args.seq, layers=args.layers, norm=args.norm,
                     dtype=args.dtype, gelu=args.gelu, swiglu=args.swiglu, rotary=args.rotary, bias=not args.no_bias,
                     sequence_parallel=args.sequence_parallel,
                     tie_embeddings=not args.untie_embeddings, seed=args.seed, data_seed=args.data_seed,
                     lengths=args.lengths)
    where = f"{tp} rank{'s' if tp > 1 else ''} on " + (f"'{topo.name}'" if topo else args.backend)
    with Progress(f"{MODEL_NAMES[args.model]} forward+backward, {where}"):
        if gpt and args.timing_only:
            eq = None
            report = cs.tp.run_gpt(ctx, **model).run
        elif gpt:
            eq = cs.tp.check_gpt_equivalence(ctx, **model)
            report = eq.run
            loss = eq.mean_loss
        elif args.timing_only:
            eq = None
            report = cs.tp.run_mlp(ctx, **model)
        else:
            eq = cs.tp.check_mlp_equivalence(ctx, **model)
            report = eq.run
    trace_info = None
    if args.trace:
        try:
            ctx.save_trace(args.trace)
        except RuntimeError as e:
            raise UsageError(f"--trace {args.trace}: {e}") from e
        stats = ctx.trace_stats()
        trace_info = {
            "path": args.trace,
            "tracks": len(stats),
            "spans": sum(s.spans for s in stats),
            "pe_spans": sum(s.spans for s in stats if s.group.startswith("cube") and s.name.startswith("pe")),
            "groups": sorted({s.group for s in stats}),
        }

    passed = eq.passed if eq is not None else None
    result = {
        "schema": JSON_SCHEMA_RUN,
        "version": cs.__version__,
        "command": "run",
        "backend": args.backend,
        "topology": topology_summary(topo) | {"origin": topo.origin} if topo else None,
        "overrides": [{"path": p, "value": v} for p, v in sets] if sim else [],
        "tp": tp,
        "cubes": cubes,  # rank r ran on cubes[r] (sim); None on backends without cubes
        "algorithm": args.algorithm,
        "timing_only": args.timing_only,
        "timing": args.timing if sim else None,
        "model": args.model,
        "mlp": None if gpt else {k: model[k] for k in ("tokens", "hidden", "ffn", "dtype", "gelu", "bias",
                                                       "sequence_parallel", "seed")},
        "gpt": {k: v for k, v in model.items() if k not in ("tp", "data_seed")} if gpt else None,
        "loss": loss,
        "check": None
        if eq is None
        else {
            "pass": eq.passed,
            "max_abs": eq.max_abs,
            "checks": [c.to_dict() for c in eq.checks],
        },
        "sim_time_ps": report.sim_time_ps,
        "wall_s": report.wall_s,
        "events": report.events,
        "event_hash": f"{report.event_hash:016x}",
        "ranks": [
            {"rank": r.rank, "compute_ps": r.compute_ps, "comm_ps": r.comm_ps, "finish_ps": r.finish_ps}
            for r in report.ranks
        ],
        "measured": ctx.measured_totals(tp) if ctx.measures_time else None,
        "hardware": report.utilisation(cubes) if topo and not args.no_hardware_stats else None,
        "tracks": report.to_dict()["tracks"],
        # Every hardware unit that did something during the run, with its counters.
        "usage": [u for u in report.usage if u["pieces"] or u["busy_ps"]],
        "trace": trace_info,
        "notes": list(report.notes),
        "pass": passed if passed is not None else True,
    }
    print_run(out, args, ctx, topo, tp, eq, report, result, trace_info)
    out.json(result)
    return EXIT_OK if result["pass"] else EXIT_FAILED


def print_run(out, args, ctx, topo, tp, eq, report, result, trace_info):
    what = "checked against the host reference" if eq is not None else "timing only (no values, no check)"
    if args.timing == "flow":
        what += ", flow-level transfers"
    out.say(f"cubesim run: {MODEL_NAMES[args.model]} forward + backward, {what}")
    out.say()
    if topo:
        pes = result["topology"]["pes_per_cube"]
        out.say(f"  topology  {topo.name}: {plural(topo.num_cubes, 'cube')} x {pes} PEs, network {topo.network} "
                f"({topo.origin})")
        cubes = result["cubes"]
        if tp == 1:
            placement = f"rank 0 on cube {cubes[0]}"
        elif cubes == sorted(cubes):
            placement = f"ranks 0-{tp - 1} on cubes {ranges(cubes)}"
        else:
            placement = "ranks 0-{} on cubes {} (rank r on the r-th)".format(tp - 1, ",".join(map(str, cubes)))
        out.say(f"  backend   {args.backend}, tp {tp}: {placement}, collectives {args.algorithm}")
    else:
        out.say(f"  backend   {args.backend} ({ctx.describe()}), tp {tp}, collectives {args.algorithm}")
    if result["gpt"]:
        g = result["gpt"]
        kv = f", kv heads {g['kv_heads']}" if g["kv_heads"] else ""
        out.say(
            f"  model     {g['layers']} layers, hidden {g['hidden']}, heads {g['heads']}{kv}, ffn {g['ffn']}, vocab "
            f"{g['vocab']}, {g['batch']} x {g['seq']} tokens, {g['norm']}, {'SwiGLU' if g['swiglu'] else 'GELU ' + g['gelu']}, "
            f"{'RoPE, ' if g['rotary'] else ''}"
            f"{g['dtype']}"
            f"{', bias' if g['bias'] else ', no bias'}{', tied embeddings' if g['tie_embeddings'] else ''}"
            f"{', sequence parallel' if g['sequence_parallel'] else ''}"
            f"{', right padding ' + ','.join(map(str, g['lengths'])) + ' real tokens' if g.get('lengths') else ''}"
        )
    else:
        m = result["mlp"]
        out.say(
            f"  model     hidden {m['hidden']}, ffn {m['ffn']}, tokens {m['tokens']}, {m['dtype']}, GELU {m['gelu']}"
            f"{', bias' if m['bias'] else ', no bias'}{', sequence parallel' if m['sequence_parallel'] else ''}"
        )
    for o in result["overrides"]:
        out.say(f"  override  {o['path']} = {json.dumps(o['value'])}")
    out.say()
    if eq is not None:
        n = len(eq.checks)
        failed = [c for c in eq.checks if not c.passed]
        verdict = "PASS" if eq.passed else "FAIL"
        out.say(
            f"check: {verdict}  ({n - len(failed)} of {n} comparisons hold; max abs error {fmt_err(eq.max_abs)})"
        )
        rows = []
        for c in eq.checks:
            claim = "bitwise" if c.bitwise_claim else f"rel <= {c.tolerance:.2g}"
            if c.passed:
                res = "pass (bitwise)" if c.bitwise else "pass"
            else:
                res = "FAIL"
            rows.append([c.tensor, c.against, claim, fmt_err(c.max_abs), fmt_err(c.rel_norm), res])
        out.say(format_table(["tensor", "against", "claim", "max abs", "rel norm", "result"], rows,
                             align=["l", "l", "l", "r", "r", "l"]))
        out.say("  unsharded: the tp=1 model on the host; host replay: the same tp program on the host (same")
        out.say("  reduction order); ranks: every rank holds the same bits.")
        if tp > 1 and result["gpt"]:
            out.say("  every tensor of the GPT step is downstream of a sum of tp partials (attention and MLP")
            out.say("  outputs, the loss's sums): against the unsharded model a tolerance, everywhere else the bit.")
        elif tp > 1:
            out.say("  output and input_grad sum tp partials, which round differently from the unsharded sum:")
            out.say("  against the unsharded model they are held to a tolerance, everywhere else to the bit.")
        out.say()
    if result["loss"] is not None:
        out.say(f"loss: {result['loss']:.6f} (mean over tokens; log(vocab) = {math.log(result['gpt']['vocab']):.6f})")
        out.say()
    if topo:
        out.say(f"simulated time: {fmt_time(report.sim_time_ps)}  (simulator: {report.wall_s:.3f} s wall, "
                f"{report.events} events)")
        def row(label, compute, comm, finish):
            return [label, fmt_time(compute), fmt_time(comm), fmt_time(finish), pct(compute, report.sim_time_ps),
                    pct(comm, report.sim_time_ps)]

        ranks = report.ranks
        shown = ranks if len(ranks) <= 16 else ranks[:6] + ranks[-2:]
        rows = [row(r.rank, r.compute_ps, r.comm_ps, r.finish_ps) for r in shown]
        if len(ranks) > 16:
            rows.insert(6, ["...", "", "", "", "", ""])
            for name, agg in (("min", min), ("max", max)):
                rows.append(row(name, agg(r.compute_ps for r in ranks), agg(r.comm_ps for r in ranks),
                                agg(r.finish_ps for r in ranks)))
        out.say(format_table(["rank", "compute", "comm", "finish", "compute %", "comm %"], rows,
                             align=["r", "r", "r", "r", "r", "r"]))
        if len(ranks) > 16:
            out.say(f"  ({len(ranks) - 8} ranks not shown: every rank is in --json)")
        out.say("  compute: GEMMs (tile by tile on the cube's PEs, operands through TCM by DMA) and elementwise ops")
        out.say("  (a roofline of the PEs' vector rate against HBM); comm: time inside collectives (asynchronous")
        out.say("  ones overlap compute, so the two can sum past finish)")
        hw = result["hardware"]
        if hw is not None:
            out.say()
            out.say("hardware: share of the simulated time each unit was busy (PE columns: mean over the cube's PEs)")
            cubes = hw["cubes"]
            shown = cubes if len(cubes) <= 16 else cubes[:6] + cubes[-2:]
            rows = [[c["cube"], pct(c["pe_mac"], 1), pct(c["pe_vector"], 1), pct(c["pe_dma_read"], 1),
                     pct(c["pe_dma_write"], 1), pct(c["hbm_busiest_channel"], 1)] for c in shown]
            headers = ["cube", "PE MAC", "PE vector", "PE DMA read", "PE DMA write", "HBM (busiest channel)"]
            # An L2 column where the cubes have L2 caches: busy share and the hit rate of sectors read.
            if any(c.get("l2") for c in shown):
                headers.append("L2 (hit rate)")
                for r, c in zip(rows, shown):
                    l2 = c.get("l2")
                    if not l2:
                        r.append("-")
                    else:
                        rate = "no reads" if l2["hit_rate"] is None else f"{100 * l2['hit_rate']:.1f}% hits"
                        r.append(f"{pct(l2['busy'], 1)} ({rate})")
            if len(cubes) > 16:
                rows.insert(6, ["..."] + [""] * (len(headers) - 1))
            out.say(format_table(headers, rows, align=["r"] * len(headers)))
            l = hw["links"]
            if l["active"]:
                out.say(f"  links: {l['active']} of {l['directions']} directions carried traffic; busiest {l['busiest']} "
                        f"{pct(l['busiest_busy'], 1)}, mean of the active ones {pct(l['mean_busy_active'], 1)}")
            elif l["directions"]:
                out.say(f"  links: none of the {l['directions']} directions carried traffic")
            else:
                out.say("  links: none between the ranks' cubes (one rank)")
            sp = hw["switch_ports"]
            if sp["active"]:
                out.say(f"  switch ports: {sp['active']} of {sp['directions']} port groups carried traffic; busiest "
                        f"{sp['busiest']} {pct(sp['busiest_busy'], 1)}, mean of the active ones "
                        f"{pct(sp['mean_busy_active'], 1)}")
            elif sp["directions"]:
                out.say(f"  switch ports: none of the {sp['directions']} port groups carried traffic")
    elif result["measured"] is not None:
        out.say(f"measured by the backend (real time around every GEMM and collective); wall {report.wall_s:.3f} s")
        rows = [[m["rank"], f"{1e6 * m['gemm_s']:.1f} us", m["gemms"], f"{1e6 * m['collective_s']:.1f} us", m["collectives"]]
                for m in result["measured"]]
        out.say(format_table(["rank", "GEMMs", "count", "collectives", "count"], rows, align=["r"] * 5))
    else:
        out.say(f"wall time: {report.wall_s:.3f} s (backend '{args.backend}' keeps no simulated time)")
    for n in report.notes:
        out.say(f"note: {n}")
    out.say()
    if trace_info:
        out.say(
            f"trace: {trace_info['path']} ({trace_info['tracks']} tracks in {len(trace_info['groups'])} groups, "
            f"{trace_info['spans']} spans); open it in https://ui.perfetto.dev"
        )
        if topo:
            ports = topo.switch is not None and topo.switch["port_GBps"] is not None
            out.say("  tracks: per rank compute/comm; per cube HBM channels and each PE's MAC, vector and DMA "
                    "read/write; links" + ("; switch ports" if ports else ""))
            if trace_info["pe_spans"] == 0:
                out.say("  note: the PE tracks are empty: this run charged its compute to the ranks' compute "
                        "tracks without running it on the PEs")
    else:
        out.say("trace: not written (add --trace FILE for a Perfetto/Chrome trace)")


# ---- bench ---------------------------------------------------------------------------------------


def bench_dir():
    env = os.environ.get("CUBESIM_BENCH_DIR")
    if env:
        return Path(env)
    # build/python/cubesim/cli.py -> build/benches
    return Path(__file__).resolve().parent.parent.parent / "benches"


def _run_built(exe, exe_name, argv, target):
    """Runs an executable of the build with `argv`, streaming its output; returns its exit status."""
    if not exe.is_file() or not os.access(exe, os.X_OK):
        raise UsageError(f"{exe} is not built; build it with `cmake --build {exe.parent.parent} --target {target}`")
    with Progress(f"{exe_name} running") as p:
        proc = subprocess.Popen([str(exe)] + list(argv), stdout=subprocess.PIPE, text=True, bufsize=1)
        for line in proc.stdout:
            p.print(line)
        return proc.wait()


def cmd_bench(args):
    exe_name = BENCHES[args.which]
    rc = _run_built(bench_dir() / exe_name, exe_name, args.args, exe_name)
    if rc != 0:
        print(f"cubesim: {exe_name} exited with status {rc}", file=sys.stderr)
        return EXIT_FAILED if rc > 0 else rc
    return EXIT_OK


# ---- xcheck --------------------------------------------------------------------------------------


def xcheck_exe():
    env = os.environ.get("CUBESIM_XCHECK")
    if env:
        return Path(env)
    # build/python/cubesim/cli.py -> build/bin/cubesim-xcheck
    return Path(__file__).resolve().parent.parent.parent / "bin" / "cubesim-xcheck"


def cmd_xcheck(args):
    # The cross-check is a C++ program (it drives the GPUs, and it runs on GPU machines whose Python
    # cannot load this module); this subcommand runs it with the arguments given.
    argv = ["--topology", args.topology] + [a for tp in args.tp for a in ("--tp", str(tp))] + list(args.args)
    rc = _run_built(xcheck_exe(), "cubesim-xcheck", argv, "cubesim-xcheck")
    if rc == 3:
        print("cubesim: xcheck: no usable GPU here; the simulator side was printed above "
              "(run it on a machine with GPUs, see scripts/gpu/cuda_backend.sh)", file=sys.stderr)
        return EXIT_FAILED
    return {0: EXIT_OK, 2: EXIT_USAGE}.get(rc, EXIT_FAILED)


# ---- calibrate -----------------------------------------------------------------------------------


def gpu_measure_script():
    return Path(__file__).resolve().parent / "gpu_measure.py"


def measure_now(path, ranks):
    """Runs gpu_measure.py (PyTorch: cuBLAS, NCCL) on this machine's GPUs into `path`."""
    argv = [sys.executable, str(gpu_measure_script()), "--out", str(path), "--nccl-log"]
    if ranks:
        argv += ["--ranks", ranks]
    print(f"cubesim calibrate: measuring this machine's GPUs: {' '.join(argv)}", file=sys.stderr)
    rc = subprocess.call(argv)
    if rc == 3:
        raise UsageError("calibrate: no CUDA GPU here (or PyTorch cannot see one); measure on a GPU machine "
                         "(python3 gpu_measure.py --out FILE) and pass --measurements FILE")
    if rc != 0 and not Path(path).exists():
        raise UsageError(f"calibrate: the measurement failed (exit status {rc}); see the messages above")
    return path


def cmd_calibrate(args):
    from . import calibrate as cal

    out = Output(args.json)
    try:
        if args.measurements:
            m = cal.load_measurements(args.measurements)
        else:
            save = args.save or f"measurements-{time.strftime('%Y%m%d-%H%M%S')}.json"
            m = cal.load_measurements(measure_now(save, args.ranks))
            out.say(f"measurements: {save}")
            if args.measure_only:
                return EXIT_OK
        if args.check:
            cal.check_gpu(cs.load_topology_json(args.check), m)
            topo = cs.load_topology(args.check)
            rows = cal.error_rows(topo, m, kinds=args.kinds.split(","))
            report = {"topology": args.check, "gpu": cal.gpu_of(m), "rows": rows}
        else:
            path = args.out or f"{Path(args.base).stem}_calibrated.json"
            if args.jobs is not None and args.jobs < 1:
                raise UsageError(f"calibrate: --jobs {args.jobs}: give a number of processes >= 1")
            result = cal.fit(m, base=args.base, log=lambda t: out.say(t), kinds=args.kinds.split(","),
                             name=Path(path).stem, jobs=args.jobs)
            cal.write_overlay(result["overlay"], path)
            out.say(f"wrote {path}")
            topo = cs.topology_from_json(result["document"], path)
            rows = cal.error_rows(topo, m, kinds=args.kinds.split(","))
            report = {"topology": path, "gpu": cal.gpu_of(m), "fitted": result["values"], "rows": rows}
    except cal.CalibrationError as e:
        raise UsageError(f"calibrate: {e}") from None
    table = []
    for r in rows:
        table.append([r["kind"], r["label"], "fit" if r["in_fit"] else "held out", f"{r['measured'] * 1e6:.2f}",
                      f"{r['simulated'] * 1e6:.2f}", f"{100 * r['error']:+.1f}%"])
    out.say(format_table(["kind", "measurement", "set", "measured us", "simulated us", "error"], table))
    summary = cal.summarise(rows)
    out.say("\nheld-out |error| by kind:")
    out.say(format_table(["kind", "n", "median", "geomean", "max"],
                         [[k, v["n"], f"{100 * v['median']:.1f}%", f"{100 * v['geomean']:.1f}%",
                           f"{100 * v['max']:.1f}%"] for k, v in summary.items()]))
    targets = cal.coll_targets(rows)
    if targets:
        out.say("\nheld-out collectives (issue 12's figures: geomean 1 MiB-1 GiB, max from 64 KiB):")
        out.say(format_table(["ranks", "n", "geomean 1M-1G", "max from 64K"],
                             [[k, v["n"], f"{100 * v['geomean_1MiB_1GiB']:.1f}%", f"{100 * v['max_from_64KiB']:.1f}%"]
                              for k, v in targets.items()]))
    for r in rows:
        r.pop("record", None)
    report["summary"] = summary
    report["coll_targets"] = targets
    out.json(report)
    return EXIT_OK


# ---- algorithms, backends: the runtime's tables -----------------------------------------------------


def cmd_backends(args):
    # The rows of runtime/backend_registry.h, as the runtime reports them: nothing is listed here.
    out = Output(args.json)
    rows = cs.backend_info()
    out.say(format_table(["name", "here", "summary", "options"],
                         [[b["name"], "yes" if b["available"] else f"no: {b['why_not']}", b["summary"], b["options"]]
                          for b in rows]))
    out.json({"backends": rows})
    return EXIT_OK


def cmd_algorithms(args):
    # The rows of runtime/algorithms/table.h, as the runtime reports them: nothing is listed here.
    out = Output(args.json)
    rows = cs.algorithms()
    out.say(format_table(["name", "collectives", "summary"],
                         [[a["name"], ", ".join(a["collectives"]), a["summary"]] for a in rows]))
    out.json({"algorithms": rows})
    return EXIT_OK


# ---- main ----------------------------------------------------------------------------------------


# ---- sdc -----------------------------------------------------------------------------------------


def _sdc_context(args, recipe):
    backend = backend_row(args.backend)
    topo = None
    if backend["simulates"]:
        topo = cs.load_topology(args.topology, overrides=parse_sets(args.topo_set) or None)
    elif args.topo_set:
        raise UsageError(f"--topo-set changes a simulated topology: it needs --backend sim (not '{args.backend}')")
    elif not backend["available"]:
        raise UsageError(f"--backend {args.backend}: it cannot run here ({backend['why_not']})")
    ranks = recipe["ranks"]
    if topo is not None:
        world = topo.num_cubes
    elif backend["devices"] >= 0:
        world = backend["devices"]
    else:
        world = ranks or 4  # the host: as many ranks as the recipe asks (4 by default)
    if ranks > world:
        raise UsageError(f"the recipe's ranks = {ranks} but {'topology ' + repr(topo.name) if topo else args.backend} "
                         f"has {plural(world, 'device')}")
    return topo, world


def cmd_sdc_run(args):
    out = Output(args.json)
    recipe = cs.sdc.load_recipe(args.recipe, args.set or [])
    topo, world = _sdc_context(args, recipe)
    world = recipe["ranks"] or world
    cs._cubesim._sdc_validate(recipe, world, topo)
    if args.dry_run:
        out.say(f"recipe {args.recipe or '(defaults)'}: valid for {plural(world, 'rank')} on "
                f"{repr(topo.name) if topo else args.backend}")
        out.say(json.dumps(recipe, indent=2))
        out.json({"schema": "cubesim.sdc.recipe/1", "recipe": recipe, "ranks": world})
        return EXIT_OK
    ctx = cs.Context(args.backend, world_size=world, topology=topo)
    with Progress(f"SDC model, {plural(world, 'rank')}"):
        res = cs.sdc.run(recipe, context=ctx)
    out.say(cs.sdc.format_result(res))
    res["schema"] = "cubesim.sdc.run/1"
    out.json(res)
    if res["faults_not_fired"]:
        print("cubesim: error: " + "; ".join(res["faults_not_fired"]), file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK if res["verdict"]["kind"] == "clean" else EXIT_FAILED


def cmd_sdc_campaign(args):
    out = Output(args.json)
    recipe = cs.sdc.load_recipe(args.recipe, args.set or [])
    topo = cs.load_topology(args.topology, overrides=parse_sets(args.topo_set) or None)
    world = 0
    if args.backend != "sim":  # faults replayed on host or cuda: its ranks as `sdc run` takes them
        _, world = _sdc_context(args, recipe)
        world = recipe["ranks"] or world
    valid = cs.sdc.CAMPAIGN_SITES if args.backend == "sim" else cs.sdc.REPLAY_SITES
    sites = [s.strip() for s in (args.sites or ",".join(valid)).split(",") if s.strip()]
    for s in sites:
        if s not in valid:
            raise UsageError(f"--sites {args.sites}: '{s}' is not drawn by campaigns on {args.backend} (valid: "
                             f"{', '.join(valid)})")
    total = args.faults + args.clean_runs
    with Progress(f"SDC campaign, {args.faults} faults + {args.clean_runs} clean runs", total=total) as bar:
        c = cs.sdc.campaign(recipe, topology=topo, faults=args.faults, seed=args.seed, clean_runs=args.clean_runs,
                            threads=args.threads, sites=sites, progress=lambda done, _total: bar.update(done),
                            outcomes=bool(args.json), backend=args.backend, world_size=world)
    out.say(cs.sdc.format_campaign(c))
    c["schema"] = "cubesim.sdc.campaign/1"
    out.json(c)
    return EXIT_OK


# ---- numerics ------------------------------------------------------------------------------------


def cmd_numerics(args):
    out = Output(args.json)
    cfg = cs.numerics.load_config(args.config, args.set or [])  # refused before any work
    if args.output_dir:
        d = Path(args.output_dir)
        if d.exists() and not d.is_dir():
            raise UsageError(f"--output-dir {args.output_dir}: that is a file; give a directory")
        if not d.exists() and not (d.parent if str(d.parent) else Path(".")).is_dir():
            raise UsageError(f"--output-dir {args.output_dir}: its parent directory does not exist")
    total = 1 + len(cfg["variants"])
    with Progress(f"numerics, the reference and {plural(total - 1, 'variant')}", total=total) as bar:
        rep = cs.numerics.run(args.config, output_dir=args.output_dir, save_tensors=args.save_tensors,
                              sets=args.set or [], progress=lambda done, _total, _name: bar.update(done))
    wall = rep.pop("_wall_s")
    m = rep["config"]["model"]
    out.say(f"numerics: {m['layers']} layers (hidden {m['hidden']}, ffn {m['ffn']}, {m['tokens']} tokens, tp {m['tp']}), "
            f"reference fp32 on host ({wall.get('reference', 0):.1f} s)")
    for name, v in rep["variants"].items():
        if v.get("skipped"):
            out.say(f"variant {name!r}: skipped: {v['skipped']}")
            continue
        out.say(f"variant {name!r}: {v['config']['model']['dtype']} blocks, {v['config']['model']['residual_dtype']} "
                f"residual, on {v['config']['run']['backend']} ({wall.get(name, 0):.1f} s)")
        for n in v["notes"]:
            out.say(f"  note: {n}")
    out.say(cs.numerics.format_tensors(rep, None if args.all_rows else 64))
    out.say(cs.numerics.format_summary(rep))
    if args.output_dir:
        out.say(f"report: {Path(args.output_dir) / 'precision_report.json'}")
    out.json(rep)
    return EXIT_OK


# ---- sweep ---------------------------------------------------------------------------------------


def _short(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, str) and "/" in v:
        return Path(v).name
    return json.dumps(v) if not isinstance(v, str) else v


def cmd_sweep_plan(args):
    sw = cs.sweep
    out = Output(args.json)
    try:
        p = sw.plan(args.spec)
    except sw.SpecError as e:
        raise UsageError(str(e)) from None
    valid, invalid = p.valid, p.invalid
    out.say(f"sweep {args.spec}: job {p.job}, spec hash {p.hash}")
    out.say(f"  {len(p.cases)} cases ({p.total} in the product of {len(p.axes)} axes"
            + (f", {p.total - len(p.cases)} left out by filters or sample" if p.total != len(p.cases) else "")
            + f"); {len(valid)} can run, {len(invalid)} cannot; timeout {p.timeout:g} s per case")
    shown = p.cases[: args.show]
    if shown:
        out.say()
        headers = ["case", "hash"] + p.axes + ["runs?"]
        rows = [[c.index, c.hash] + [_short(c.params.get(a)) for a in p.axes] + ["yes" if c.invalid is None else "NO"]
                for c in shown]
        out.say(format_table(headers, rows))
        if len(p.cases) > len(shown):
            out.say(f"  ... {len(p.cases) - len(shown)} more (--show N for more)")
    if invalid:
        out.say()
        out.say(f"cases that cannot run ({len(invalid)}):")
        for c in invalid[: args.show]:
            out.say(f"  case {c.index} {json.dumps(c.params)}: {c.invalid}")
    if shown:
        out.say()
        out.say(f"case {shown[0].index} resolved: {json.dumps(shown[0].config)}")
    out.json({"spec": args.spec, "spec_hash": p.hash, "job": p.job, "axes": p.axes, "total": p.total,
              "cases": len(p.cases), "valid": len(valid), "timeout_s": p.timeout,
              "invalid": [{"case": c.index, "params": c.params, "reason": c.invalid} for c in invalid],
              "first": [{"case": c.index, "hash": c.hash, "params": c.params, "config": c.config} for c in shown]})
    return EXIT_OK if not invalid else EXIT_USAGE  # as `sweep run` refuses them


def cmd_sweep_run(args):
    sw = cs.sweep
    rank0 = True
    if args.executor == "mpi" and sw.mpi_available():
        from mpi4py import MPI
        rank0 = MPI.COMM_WORLD.Get_rank() == 0
    out = Output(args.json if rank0 else None)
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: give at least 1")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"--timeout {args.timeout}: give seconds > 0")
    prog = Progress("sweep", total=1, delay=1.0)

    def progress(done, total, elapsed, eta):
        prog.update(done)
        prog.total = total

    try:
        with prog:
            rows = sw.run(args.spec, args.db, executor=args.executor, jobs=args.jobs, resume=args.resume,
                          overwrite=args.overwrite, skip_invalid=args.skip_invalid, retry_failed=args.retry_failed,
                          timeout=args.timeout, progress=progress, log=lambda s: prog.print(s) if not out.quiet else None)
    except sw.SpecError as e:
        raise UsageError(str(e)) from None
    except KeyboardInterrupt:
        print(f"cubesim: sweep interrupted; the cases that finished are in {args.db}: run the same command with "
              "--resume for the rest", file=sys.stderr)
        return EXIT_INTERRUPTED
    if rows is None:  # an MPI worker rank: it served cases
        return EXIT_OK
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    out.say(f"sweep done: {len(rows)} cases in {args.db}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    bad = [r for r in rows if r["status"] not in ("ok", "invalid")]
    for r in bad[:10]:
        out.say(f"  case {r['case']} {r['status']}: {r['error']}")
    out.say(f"  look at it: cubesim sweep report {args.db}; cubesim sweep plot {args.db} --x AXIS --y METRIC")
    out.json({"db": args.db, "cases": len(rows), "status": counts, "elapsed_s": rows.elapsed_s})
    code = EXIT_OK if not bad else EXIT_FAILED
    if rows.abandoned:  # thread executor: simulations still running past their timeout; do not wait
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _open_rows(db):
    sw = cs.sweep
    try:
        d = sw.ResultsDB(db, create=False)
    except sw.SpecError as e:
        raise UsageError(str(e)) from None
    try:
        return d.meta(), d.rows()
    finally:
        d.close()


def cmd_sweep_report(args):
    sw = cs.sweep
    out = Output(args.json)
    meta, rows = _open_rows(args.db)
    axes = json.loads(meta.get("axes", "[]"))
    groups = json.loads(meta.get("axis_groups", "null")) or axes
    ok = [r for r in rows if r["status"] == "ok"]
    metric = args.metric
    metrics = sorted({k for r in ok for k in r["metrics"]})
    if metric not in metrics and ok:
        raise UsageError(f"--metric {metric}: not a metric of this sweep; metrics: {', '.join(metrics)}")
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    out.say(f"sweep {args.db}: spec hash {meta.get('spec_hash')}, {len(rows)} cases: "
            + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    shown = rows[: args.show]
    table = [[r["case"]] + [_short(r["params"].get(a)) for a in axes] + [r["status"], _short(r["metrics"].get(metric, "-")),
             f"{r['wall_s']:.3f}" if r["wall_s"] is not None else "-"] for r in shown]
    out.say(format_table(["case"] + axes + ["status", metric, "wall s"], table))
    if len(rows) > len(shown):
        out.say(f"  ... {len(rows) - len(shown)} more (--show N, or cubesim sweep export)")
    sens = sw.sensitivity(rows, groups)
    out.say()
    out.say(f"sensitivity: per axis, the median over cases that differ only in it of max/min {metric}")
    srows, ignored = [], []
    for s in sens:
        if not s["groups"]:
            verdict = "cannot tell (no two cases differ only in it)"
        elif not s["changes"]:
            verdict = "CHANGES NO METRIC"
            ignored.append(s["axis"])
        else:
            verdict = f"changes {len(s['changes'])} of {len(metrics)} metrics"
        spread = s["spread"].get(metric)
        srows.append([s["axis"], len(s["values"]), f"{spread:.3f}x" if spread else "-", verdict])
    out.say(format_table(["axis", "values", f"{metric} spread", "verdict"], srows))
    for a in ignored:
        out.say(f"  warning: {a} changes no metric: the model may ignore it (check the path, or the job it "
                "applies to)")
    out.json({"db": args.db, "spec_hash": meta.get("spec_hash"), "status": counts, "metric": metric,
              "sensitivity": sens, "ignored_axes": ignored})
    return EXIT_OK


def cmd_sweep_export(args):
    sw = cs.sweep
    if not args.csv and not args.json_out:
        raise UsageError("sweep export: give --csv FILE and/or --json FILE ('-' for stdout)")
    for flag, path in (("--csv", args.csv), ("--json", args.json_out)):
        check_output_path(flag, path)
    try:
        rows = sw.export(args.db, csv_path=args.csv, json_path=args.json_out)
    except sw.SpecError as e:
        raise UsageError(str(e)) from None
    if "-" not in (args.csv, args.json_out):
        print(f"exported {len(rows)} cases" + "".join(f"; {k} {v}" for k, v in (("csv", args.csv), ("json", args.json_out))
                                                     if v))
    return EXIT_OK


def cmd_sweep_plot(args):
    sw = cs.sweep
    check_output_path("--out", args.out)
    where = dict(parse_sets(args.where)) if args.where else None
    try:
        path = sw.plot(args.db, args.x, args.y, hue=args.hue, facet=args.facet, where=where, out=args.out,
                       logx=args.logx, logy=args.logy)
    except sw.SpecError as e:
        raise UsageError(str(e)) from None
    print(f"plot: {path}")
    return EXIT_OK


def cmd_sweep_bench(args):
    sw = cs.sweep
    out = Output(args.json)
    try:
        mpi = [int(x) for x in args.mpi.split(",") if x.strip()] if args.mpi else []
    except ValueError:
        raise UsageError(f"--mpi {args.mpi}: give worker counts separated by commas, e.g. 1,2,4") from None
    if any(n < 1 for n in mpi):
        raise UsageError(f"--mpi {args.mpi}: worker counts start at 1")
    if mpi and not sw.mpi_available():
        raise UsageError(f"--mpi needs mpi4py on Open MPI; install it with: {sw.MPI_INSTALL}")
    with Progress("sweep bench"):
        rows = sw.benchmark(cases=args.cases, jobs=args.jobs, mpi_np=mpi, mpi_cases_per_worker=args.mpi_cases,
                            overhead_jobs=args.overhead_jobs)
    target = {"thread": 0.9, "process": 0.9, "mpi": 0.85, "thread (synthetic)": 0.9}
    table = []
    for r in rows:
        t = target.get(r["executor"])
        met = "" if t is None else ("yes" if r["efficiency"] >= t else "NO")
        table.append([r["executor"], r["workers"], r["cases"], f"{r['cases_per_s']:.1f}", f"{r['efficiency']:.3f}",
                      f"{r['of_independent']:.3f}" if "of_independent" in r else "",
                      f"{r['end_to_end_cases_per_s']:.1f}" if "end_to_end_cases_per_s" in r else "",
                      "" if t is None else f">= {t}", met + (" (oversubscribed)" if r.get("oversubscribed") else "")])
        r["target"], r["met"] = t, (None if t is None else r["efficiency"] >= t)
    out.say("sweep throughput: `cubesim run --topology mesh4x4 --timing-only` cases (cases/s: the sweep's own rate, "
            "its executor's start to its shutdown; end to end: with mpirun's and the interpreters' start too; "
            "efficiency: rate / (workers x serial rate), MPI against its first (1-worker) run with as many cases per "
            "worker; "
            "of independent: rate / that of as many plain processes looping over cases, the machine's own ceiling; "
            "thread (synthetic): the executor and driver alone, cases holding the GIL hold_ms then releasing it "
            "free_ms, efficiency against workers / (hold + free), whatever the cores)")
    out.say(format_table(["executor", "workers", "cases", "cases/s", "efficiency", "of independent", "end to end",
                          "target", "met"],
                         table))
    out.json({"bench": "sweep", "rows": rows})
    return EXIT_OK


def build_parser():
    p = argparse.ArgumentParser(
        prog="cubesim",
        description="cubesim: a discrete-event simulator of accelerator systems with a tensor-parallel runtime.",
        epilog="Exit codes: 0 success; 1 the job ran and failed; 2 a wrong request. "
        "See README.md, section 'Command line'.",
    )
    p.add_argument("--version", action="version", version=f"cubesim {cs.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def json_opt(sp):
        sp.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE ('-': only JSON, on stdout)")

    def set_opt(sp):
        sp.add_argument("--set", action="append", metavar="PATH=VALUE",
                        help="override a topology field by dotted path (repeatable), e.g. "
                        "--set network.link.bandwidth_GBps=64 --set cubes.3.clock_scale=0.8")

    topo = sub.add_parser("topo", help="list, show and validate topologies")
    tsub = topo.add_subparsers(dest="topo_command", metavar="SUBCOMMAND")
    tsub.required = True
    tl = tsub.add_parser("list", help="the shipped topologies")
    json_opt(tl)
    tl.set_defaults(fn=cmd_topo_list)
    ts = tsub.add_parser("show", help="the figures of a topology (a shipped name or a file)")
    ts.add_argument("name", metavar="NAME|FILE")
    ts.add_argument("--doc", action="store_true", help="print the resolved JSON document instead")
    set_opt(ts)
    json_opt(ts)
    ts.set_defaults(fn=cmd_topo_show)
    tv = tsub.add_parser("validate", help="check a topology file; exit 2 and name the JSON path if invalid")
    tv.add_argument("file", metavar="FILE")
    set_opt(tv)
    json_opt(tv)
    tv.set_defaults(fn=cmd_topo_validate)

    run = sub.add_parser(
        "run",
        help="the main job: ParallelMLP (or --model gpt: GPTModel) forward + backward, checked against the host "
        "reference",
        description="Runs a Megatron-style ParallelMLP (or, with --model gpt, a GPTModel: embedding, transformer layers "
        "with grouped-query attention and MLP, final norm, LM head, vocab-parallel cross-entropy) forward and "
        "backward with tp ranks on the topology, checks "
        "every tensor against the host reference (the unsharded model, and the same tp program replayed on the "
        "host), and prints the check, the simulated time and its compute/communication split per rank.",
    )
    run.add_argument("--topology", default=cs.DEFAULT_TOPOLOGY, metavar="NAME|FILE",
                     help=f"a shipped topology or a JSON file (default: {cs.DEFAULT_TOPOLOGY}; see cubesim topo list)")
    run.add_argument("--tp", type=int, metavar="N",
                     help="tensor-parallel ranks, one per cube (default: as many as the topology holds and ffn divides)")
    run.add_argument("--cubes", metavar="LIST",
                     help="sim: the cubes the ranks run on, rank r on the r-th (ranges and lists: 0-3, 0,2,5-7; "
                     "default 0 to tp-1); --tp defaults to their count")
    run.add_argument("--backend", default="sim", choices=[b["name"] for b in cs.backend_info()],
                     help="where it runs (default: sim; see cubesim.backend_info())")
    run.add_argument("--trace", metavar="FILE", help="write a Perfetto/Chrome trace JSON (open in ui.perfetto.dev)")
    json_opt(run)
    run.add_argument("--model", default="mlp", choices=list(MODEL_NAMES),
                     help="mlp (default): Megatron's ParallelMLP; gpt: GPTModel (embedding, --layers transformer "
                     "layers with attention and MLP, final norm, LM head, vocab-parallel cross-entropy)")
    run.add_argument("--hidden", type=SIZE, default=512, metavar="N", help="hidden size (default 512)")
    run.add_argument("--ffn", type=SIZE, default=2048, metavar="N", help="feed-forward size (default 2048)")
    run.add_argument("--tokens", type=SIZE, default=256, metavar="N", help="tokens in the batch (default 256)")
    run.add_argument("--dtype", default="bf16", help="f32 | bf16 | f16 (default bf16)")
    run.add_argument("--gelu", default="tanh", choices=["tanh", "erf"], help="GELU form (default tanh)")
    run.add_argument("--no-bias", action="store_true", help="linear layers without bias")
    run.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism")
    g = run.add_argument_group("gpt model (--model gpt)")
    g.add_argument("--layers", type=SIZE, default=2, metavar="N", help="transformer layers (default 2)")
    g.add_argument("--heads", type=SIZE, default=8, metavar="N", help="attention heads (default 8)")
    g.add_argument("--kv-heads", type=SIZE, default=None, metavar="N",
                   help="key/value heads: query groups of grouped-query attention (default: --heads)")
    g.add_argument("--seq", type=SIZE, default=128, metavar="N", help="sequence length (default 128)")
    g.add_argument("--batch", type=SIZE, default=1, metavar="N", help="sequences in the batch (default 1)")
    g.add_argument("--vocab", type=SIZE, default=1024, metavar="N", help="vocabulary size (default 1024)")
    g.add_argument("--norm", default="layer_norm", choices=["layer_norm", "rms_norm"],
                   help="normalization (default layer_norm)")
    g.add_argument("--swiglu", action="store_true",
                   help="SwiGLU MLP (silu(gate)·up, the Llama MLP; fc1 twice as wide) instead of GELU")
    g.add_argument("--rotary", action="store_true",
                   help="rotary position embeddings on the query and key heads (RoPE, as GPT-NeoX and Llama)")
    g.add_argument("--lengths", default=None, metavar="L1,L2,...",
                   help="right padding: each sequence's real tokens (1..--seq), one per --batch; the loss is the mean "
                        "over real tokens (Megatron's loss mask)")
    g.add_argument("--untie-embeddings", action="store_true",
                   help="an LM head of its own (default: tied to the embedding, as Megatron's GPT)")
    run.add_argument("--algorithm", default="ring", choices=[a["name"] for a in cs.algorithms()],
                     help="collective algorithm (default ring; see cubesim algorithms)")
    run.add_argument("--timing-only", action="store_true",
                     help="sim only: move no values (same simulated time, much faster); skips the check")
    run.add_argument("--timing", default="chunk", choices=["chunk", "flow"],
                     help="sim, with --timing-only: how transfers are timed; chunk (default): every chunk through "
                     "every link and memory; flow: each message one flow through links and memories as FIFO queues of fluid, events only "
                     "where flows start, stop or change rate (faster for large messages; docs/PERFORMANCE.md has its error)")
    run.add_argument("--no-hardware-stats", action="store_true",
                     help="sim: skip the per-track hardware statistics (they record a trace in memory; large runs "
                     "save memory and time without it)")
    run.add_argument("--seed", type=SEED, default=1234, help="weight seed (default 1234)")
    run.add_argument("--data-seed", type=SEED, default=99, help="input seed (default 99)")
    set_opt(run)
    run.set_defaults(fn=cmd_run)

    bench = sub.add_parser(
        "bench",
        help="run a benchmark (collectives, gemm, tp, transfer, sim-core)",
        description="Runs a benchmark executable from the build (build/benches/...): it prints a table and, with "
        "--json FILE, writes JSON. Every option after the name goes to the benchmark, e.g. --quick, --json FILE, "
        "--topology ring4.",
    )
    bench.add_argument("which", choices=list(BENCHES), help=", ".join(f"{k}: {v}" for k, v in BENCHES.items()))
    bench.add_argument("args", nargs=argparse.REMAINDER, help="options for the benchmark (--quick, --json FILE, ...)")
    bench.set_defaults(fn=cmd_bench)

    xc = sub.add_parser(
        "xcheck",
        help="run the same MLP on the simulator and on real GPUs: bits, and simulated against measured time",
        description="Runs build/bin/cubesim-xcheck: the ParallelMLP on the simulated topology and on the cuda backend "
        "(exact GEMM with the deterministic ring, then tensor-core GEMM with NCCL); prints per tensor whether the bits "
        "match (or the max error where a mode has no bitwise claim) and, per GEMM and collective, the simulated time "
        "beside the measured GPU time with the error in percent. Exits 1 when a claim fails or no GPU is usable.",
    )
    xc.add_argument("--topology", default="h200x4", help="simulated system (default h200x4)")
    xc.add_argument("--tp", type=int, action="append", default=[], help="tensor-parallel size; repeatable (default: "
                    "every power of two up to the GPUs present)")
    xc.add_argument("args", nargs=argparse.REMAINDER, help="more options for cubesim-xcheck (--json FILE, --tokens N, "
                    "--sim-only, ...)")
    xc.set_defaults(fn=cmd_xcheck)

    ca = sub.add_parser(
        "calibrate",
        help="fit a topology to measurements of this machine's GPUs (cuBLAS, NCCL), or check an overlay",
        description="Measures the GPUs here with PyTorch (python/cubesim/gpu_measure.py: HBM and L2 bandwidth, peer "
        "copies, NCCL all_reduce / all_gather / reduce_scatter from 8 B to 1 GiB, cuBLAS GEMMs over a shape grid, "
        "the PyTorch MLP step), or reads such a measurement (--measurements FILE), then fits a few physical figures "
        "of the base topology by running the simulator and writes an overlay that extends it, recording every "
        "fitted figure and where it came from. --check OVERLAY prints the error table of an overlay without "
        "refitting. Errors are reported on the held-out measurements (the split is a fixed rule, calibrate.py).",
    )
    ca.add_argument("--base", default="h200x8", metavar="NAME|FILE", help="topology to fit (default h200x8)")
    ca.add_argument("--measurements", metavar="FILE", help="use these measurements instead of measuring now")
    ca.add_argument("--save", metavar="FILE", help="where to write the measurements taken now")
    ca.add_argument("--ranks", default="", metavar="N,M", help="GPU counts for the collectives (default 2 and all)")
    ca.add_argument("--measure-only", action="store_true", help="measure and save, do not fit")
    ca.add_argument("--out", metavar="FILE", help="the overlay to write (default BASE_calibrated.json)")
    ca.add_argument("--check", metavar="OVERLAY", help="print the error table of this overlay; no fit")
    ca.add_argument("--kinds", default="gemm,coll,peer", help="measurement kinds to fit and check (default all)")
    ca.add_argument("--jobs", type=int, default=None, metavar="N",
                    help="processes simulating the fit's points at once (default: CUBESIM_CALIBRATE_JOBS or one per CPU)")
    json_opt(ca)
    ca.set_defaults(fn=cmd_calibrate)

    al = sub.add_parser("algorithms", help="the collective algorithms: name, the collectives each does, summary")
    json_opt(al)
    al.set_defaults(fn=cmd_algorithms)

    be = sub.add_parser("backends", help="the backends: name, whether it runs here (and why not), summary, options")
    json_opt(be)
    be.set_defaults(fn=cmd_backends)

    sd = sub.add_parser("sdc", help="silent data corruption: the checksummed layer model, fault injection, campaigns",
                        description="The SDC model: layers sharing one weight and one input, exact checksums at "
                        "comm_input, comm_output, compute_input and compute_output, compared with a host replay; "
                        "the verdict names where a corruption entered (comm or compute, layer, rank). Faults are "
                        "injected into the simulated system from the recipe (run) or drawn by the thousand "
                        "(campaign). See python/cubesim/sdc.py and docs/SDC.md.")
    ssub = sd.add_subparsers(dest="sdc_command", metavar="SUBCOMMAND")
    ssub.required = True

    def recipe_opts(sp):
        sp.add_argument("--recipe", metavar="FILE", help="a JSON recipe (default: every field at its default)")
        sp.add_argument("--set", action="append", metavar="PATH=VALUE",
                        help="override a recipe field by dotted path (repeatable), e.g. --set layers=16 "
                        "--set faults.0.nth=3")
        sp.add_argument("--topology", default="ring4", metavar="NAME|FILE", help="the simulated system (default ring4)")
        sp.add_argument("--topo-set", action="append", metavar="PATH=VALUE",
                        help="override a topology field by dotted path (repeatable)")

    sr = ssub.add_parser("run", help="run the SDC model once (with the recipe's faults); exit 1 if it finds corruption")
    recipe_opts(sr)
    sr.add_argument("--backend", default="sim", choices=cs.backends(),
                    help="where it runs (sim injects any fault; host and cuda replay gemm_tile, reduce and link faults)")
    sr.add_argument("--dry-run", action="store_true", help="validate the recipe (and its faults against the topology), "
                    "print it in full, run nothing")
    json_opt(sr)
    sr.set_defaults(fn=cmd_sdc_run)
    sc = ssub.add_parser("campaign", help="inject many seeded faults; tally detection and localisation")
    recipe_opts(sc)
    sc.add_argument("--faults", type=int_in(0, 10_000_000, "a count from 0 to 10^7"), default=1000, metavar="N",
                    help="faults to inject (default 1000)")
    sc.add_argument("--seed", type=SEED, default=1, help="the campaign's seed: the same seed, the same table")
    sc.add_argument("--clean-runs", type=int_in(0, 1_000_000, "a count from 0 to 10^6"), default=10, metavar="K",
                    help="fault-free runs on fresh data, for false positives (default 10)")
    sc.add_argument("--threads", type=int_in(0, 1024, "a count from 0 to 1024"), default=0, metavar="J",
                    help="worker threads (default: one per core)")
    sc.add_argument("--sites", default=None, metavar="LIST",
                    help=f"fault sites to draw from (default on sim {','.join(cs.sdc.CAMPAIGN_SITES)}; on host and "
                    f"cuda {','.join(cs.sdc.REPLAY_SITES)})")
    sc.add_argument("--backend", default="sim", choices=cs.backends(),
                    help="sim (faults injected into the topology's simulated system, default), or host/cuda (faults "
                    "replayed at GEMM outputs, reduction steps and collective results, in device memory on cuda)")
    json_opt(sc)
    sc.set_defaults(fn=cmd_sdc_campaign)

    nu = sub.add_parser("numerics", help="layer-wise error of named variants against an fp32 reference",
                        description="Runs a residual stack of tensor-parallel MLP blocks forward and backward in fp32 "
                        "on the host (the reference) and for each variant of the config (dotted-path overrides: "
                        "dtypes, backend, collective algorithm and accumulation, tp, GELU, GEMM mode), and reports "
                        "per layer the error of the activations and input gradients. Writes precision_report.json "
                        "and rms_rel.png to --output-dir. See python/cubesim/numerics.py and docs/NUMERICS.md.")
    nu.add_argument("--config", required=True, metavar="FILE", help="the study: model, data, run and variants (JSON or YAML)")
    nu.add_argument("--output-dir", metavar="DIR", help="write precision_report.json and rms_rel.png here")
    nu.add_argument("--set", action="append", metavar="PATH=VALUE",
                    help="override a field of the base config (repeatable), e.g. --set model.layers=24")
    nu.add_argument("--save-tensors", action="store_true", help="also write every captured tensor to tensors.npz")
    nu.add_argument("--all-rows", action="store_true", help="print every tensor's row (default: the first 64)")
    json_opt(nu)
    nu.set_defaults(fn=cmd_numerics)

    sw = sub.add_parser("sweep", help="design-space sweeps: plan, run (thread/process/MPI), report, export, plot",
                        description="Sweeps a job (the MLP step or a collective) over axes of topology fields and run "
                        "options, from a JSON (or YAML) spec; results go case by case into a SQLite database, so a "
                        "killed sweep resumes. See python/cubesim/sweep.py and examples/sweeps/.")
    wsub = sw.add_subparsers(dest="sweep_command", metavar="SUBCOMMAND")
    wsub.required = True
    wp = wsub.add_parser("plan", help="the case count, a few resolved cases, and the cases that cannot run")
    wp.add_argument("spec", metavar="SPEC")
    wp.add_argument("--show", type=int_in(0, 10**9, "a count"), default=8, metavar="N", help="cases to list (default 8)")
    json_opt(wp)
    wp.set_defaults(fn=cmd_sweep_plan)
    wr = wsub.add_parser("run", help="run a sweep into a SQLite database")
    wr.add_argument("spec", metavar="SPEC")
    wr.add_argument("--db", required=True, metavar="FILE", help="the SQLite database the results go to")
    wr.add_argument("--executor", default="process", choices=["thread", "process", "mpi"],
                    help="thread; process (default: forked workers, a crash or timeout kills only its case); mpi "
                    "(under mpirun: rank 0 leads, the other ranks run cases)")
    wr.add_argument("--jobs", type=int, metavar="N", help="thread/process: cases at once (default: one per CPU)")
    wr.add_argument("--resume", action="store_true", help="run only the cases the database lacks")
    wr.add_argument("--retry-failed", action="store_true", help="with --resume: also re-run failed, crashed, timed out")
    wr.add_argument("--overwrite", action="store_true", help="start the database again")
    wr.add_argument("--skip-invalid", action="store_true", help="record cases that cannot run as invalid, run the rest")
    wr.add_argument("--timeout", type=float, metavar="S", help="seconds per case (default: the spec's timeout_s, or 600)")
    json_opt(wr)
    wr.set_defaults(fn=cmd_sweep_run)
    wrep = wsub.add_parser("report", help="a table of the cases and the sensitivity per axis (flags ignored axes)")
    wrep.add_argument("db", metavar="DB")
    wrep.add_argument("--metric", default=cs.sweep.DEFAULT_METRIC,
                      help=f"the metric shown (default {cs.sweep.DEFAULT_METRIC})")
    wrep.add_argument("--show", type=int_in(0, 10**9, "a count"), default=20, metavar="N", help="cases to list (default 20)")
    json_opt(wrep)
    wrep.set_defaults(fn=cmd_sweep_report)
    we = wsub.add_parser("export", help="the results as CSV (flat) and/or JSON")
    we.add_argument("db", metavar="DB")
    we.add_argument("--csv", metavar="FILE")
    we.add_argument("--json", dest="json_out", metavar="FILE")
    we.set_defaults(fn=cmd_sweep_export)
    wpl = wsub.add_parser("plot", help="a metric against an axis, PNG/SVG (matplotlib)")
    wpl.add_argument("db", metavar="DB")
    wpl.add_argument("--x", required=True, metavar="PATH")
    wpl.add_argument("--y", required=True, metavar="METRIC")
    wpl.add_argument("--hue", metavar="PATH", help="one line per value of this axis")
    wpl.add_argument("--facet", metavar="PATH", help="one panel per value of this axis")
    wpl.add_argument("--where", action="append", metavar="PATH=VALUE", help="keep only these cases (repeatable)")
    wpl.add_argument("--out", default="sweep.png", metavar="FILE", help="a .png, .svg or .pdf (default sweep.png)")
    wpl.add_argument("--logx", action="store_true")
    wpl.add_argument("--logy", action="store_true")
    wpl.set_defaults(fn=cmd_sweep_plot)
    wb = wsub.add_parser("bench", help="sweep throughput of the executors against the single-case rate")
    wb.add_argument("--cases", type=int_in(1, 10**6, "a count"), default=1000, metavar="N")
    wb.add_argument("--jobs", type=int_in(1, 4096, "a count"), metavar="N", help="workers (default: one per CPU)")
    wb.add_argument("--mpi", metavar="N,M", help="also MPI sweeps with these worker counts (mpirun, rank 0 leads)")
    wb.add_argument("--mpi-cases", type=int_in(1, 10**6, "a count"), metavar="N",
                    help="cases per MPI worker (default: --cases / the most workers, at least 50)")
    wb.add_argument("--overhead-jobs", type=int_in(0, 4096, "a count"), default=16, metavar="N",
                    help="threads of the synthetic run measuring the thread executor's own cost (default 16; 0: skip)")
    json_opt(wb)
    wb.set_defaults(fn=cmd_sweep_bench)
    return p


def main(argv=None):
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # only xcheck forwards options it does not know itself
        if getattr(args, "command", None) != "xcheck":
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.args = extra + list(args.args)
    try:
        return args.fn(args)
    except UsageError as e:
        print(f"cubesim: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except cs.BackendUnavailableError as e:
        print(f"cubesim: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except cs.TopologyError as e:
        print(f"cubesim: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except cs.RankError as e:
        print(f"cubesim: the run failed: {e}", file=sys.stderr)
        return EXIT_FAILED
    except ValueError as e:
        print(f"cubesim: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as e:
        print(f"cubesim: the run failed: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt as e:  # Ctrl-C: the simulation stops between events and says how far it got
        print(f"cubesim: {e}" if str(e) else "cubesim: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (cubesim ... | head): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
