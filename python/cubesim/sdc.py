"""cubesim.sdc: silent-data-corruption detection, fault injection and campaigns (sdc/sdc.h).

The SDC model runs layers that share their weights and one reference input, so every layer must give
bitwise the same tensors; four exact checksums per layer (comm_input, comm_output per chunk,
compute_input, compute_output; integer word sums and a position-sensitive mix) are compared with a
replay on the host, and the first divergence says where a corruption entered. Mode "fsdp" (the
default) all-gathers weight shards, then runs GEMM + GELU; mode "tp" runs Megatron's column- and
row-parallel layers and their all-reduce, checked after every reduction step too:

    import cubesim as cs
    res = cs.sdc.run()                                         # ring4, the default recipe: clean
    res = cs.sdc.run({"faults": [{"site": "link", "link": 3, "nth": 2, "seed": 7}]})
    res["verdict"]["text"]        # 'corruption in comm at layer 0 on rank 2'
    res = cs.sdc.run({"mode": "tp", "faults": [{"site": "reduce", "cube": 1, "nth": 2}]})
    c = cs.sdc.campaign(topology="ring4", faults=1000, seed=7)
    c["total"]                    # injected, fired, activated, detected, localised, masked, silent

A recipe is a dict or a JSON file; every field has a default (default_recipe() lists them) and
unknown keys are refused; `sets` are "path=value" overrides ("layers=16", "faults.0.nth=3").
Faults (site link|dma|hbm|tcm|gemm_tile|reduce, model bit_flip|multi_bit|stuck_at|word_burst, the
nth matching operation from at_us on, or at rest at at_us, optionally aimed at a model tensor:
"tensor": fsdp "shard"|"full"|"input"|"output", tp "input"|"w1"|"w2"|"hidden"|"output"; "layer",
"rank") need values: the sim backend injects any of them into its system; host and cuda replay
gemm_tile, reduce and link faults at GEMM outputs, reduction steps and collective results ("cube"
names a rank; "link" -1).
"""

from . import _cubesim
from ._docfile import read_document

SITES = ("link", "dma", "hbm", "tcm", "gemm_tile", "reduce")
MODELS = ("bit_flip", "multi_bit", "stuck_at", "word_burst")
CAMPAIGN_SITES = ("link", "dma", "gemm_tile", "reduce")  # reduce: tp only (fsdp has no reductions)
REPLAY_SITES = ("gemm_tile", "reduce", "link")  # host and cuda replay them (no simulated system; link: a
                                                # collective's result where it landed)
POINTS = ("comm_input", "comm_output", "compute_input", "compute_output")
MAX_RECIPE_BYTES = 1 << 20


def default_recipe():
    """Every field of a recipe with its default value."""
    return _cubesim._sdc_default_recipe()


def load_recipe(recipe=None, sets=()):
    """The full, validated recipe: `recipe` is None (the defaults), a dict, or the path of a JSON file;
    `sets` are "path=value" overrides. ValueError naming the file and the dotted path otherwise."""
    origin = "recipe"
    if recipe is None:
        doc = {}
    elif isinstance(recipe, dict):
        doc = recipe
    else:
        origin = str(recipe)
        doc = read_document(recipe, MAX_RECIPE_BYTES, "a recipe")
    return _cubesim._sdc_recipe(doc, [str(s) for s in sets], origin)


def validate(recipe, context):
    """Checks a recipe against a context before any work (ranks, sizes, every fault against the
    topology); RuntimeError/ValueError naming the field."""
    topo = None
    info = next((b for b in _cubesim.backend_info() if b["name"] == context.backend), None)
    if info and info["simulates"]:
        topo = context.topology
    _cubesim._sdc_validate(load_recipe(recipe), context.world_size, topo)


def run(recipe=None, *, context=None, topology="ring4", sets=()):
    """Runs the SDC model once and returns its result: per layer and rank the checksums, the
    divergences from the replay, the verdict (kind clean|comm|compute|memory, layer, rank, text),
    the faults as injected, and faults that never fired."""
    r = load_recipe(recipe, sets)
    if context is None:
        context = _cubesim.Context("sim", topology=topology)
    return _cubesim._sdc_run(context, r, "recipe")


def campaign(recipe=None, *, topology="ring4", faults=100, seed=1, clean_runs=10, threads=0,
             sites=None, progress=None, outcomes=True, sets=(), backend="sim", world_size=0, backend_options=None):
    """Injects `faults` faults drawn from `seed` (each on a fresh simulated system) and runs
    `clean_runs` fault-free runs; returns the tallies (total, by_site, by_model), the false
    positives, the census of operations per unit and, with outcomes, one row per fault.
    progress(done, total) is called after each run.

    backend "host" or "cuda" replays the faults at the runtime's points instead (REPLAY_SITES: GEMM
    outputs and reduction steps per rank; runtime/fault_replay.h) on world_size ranks (0: the recipe's
    ranks, else every GPU on cuda, 4 on host), backend_options as Context's; the topology then only
    names the campaign, and cuda runs one fault at a time (threads ignored)."""
    if sites is None:
        sites = CAMPAIGN_SITES if backend == "sim" else REPLAY_SITES
    rec = load_recipe(recipe, sets)
    if backend != "sim" and not world_size:  # as `cubesim sdc run` takes them: the recipe's, the devices, or 4
        info = next((b for b in _cubesim.backend_info() if b["name"] == backend), None)
        devices = info["devices"] if info else -1
        world_size = rec["ranks"] or (devices if devices > 0 else 4)
    topo = topology if isinstance(topology, _cubesim.Topology) else _cubesim.load_topology(topology)
    return _cubesim._sdc_campaign(topo, rec, faults, seed, clean_runs, threads, list(sites),
                                  progress, outcomes, backend, world_size, dict(backend_options or {}))


def _pct(part, whole):
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def format_result(res, max_rows=64):
    """The result as text: a table of the checksums (mix, low 8 hex digits; * where it differs from
    the replay), the verdict, the faults."""
    from ._table import format_table
    lines = []
    bad = {(d["layer"], d["rank"], d["point"]) for d in res["divergences"]}
    rows = []
    layers = res["layers"]
    total = sum(len(layer["ranks"]) for layer in layers)
    for layer in layers:
        for r in layer["ranks"]:
            key = (layer["layer"], r["rank"])
            if total > max_rows and not any((key[0], key[1], p) in bad for p in POINTS):
                continue
            rows.append([str(layer["layer"]), str(r["rank"])] +
                        [r["checksums"][p]["mix"][-8:] + ("*" if (key[0], key[1], p) in bad else "")
                         for p in POINTS])
    rec = res["recipe"]
    if rec["mode"] == "tp":
        shape = (f"gelu(x[{rec['tokens']}, {rec['hidden']}] . W1[{rec['ffn']}, {rec['hidden']}]^T) . "
                 f"W2[{rec['hidden']}, {rec['ffn']}]^T split over the ranks, {rec['dtype']}, all_reduce")
    else:
        shape = (f"x[{rec['tokens']}, {rec['hidden']}] . W[{rec['ffn']}, {rec['hidden']}]^T, {rec['dtype']}, "
                 f"all_gather")
    lines.append(f"SDC model ({rec['mode']}): {rec['layers']} layers x {res['ranks']} ranks, {shape} "
                 f"{rec['algorithm']}; simulated {_cubesim.core.format_time(res['sim_time_ps'])}")
    if rows:
        note = "" if total <= max_rows else f" (only the rows that differ: {total} in all)"
        lines.append(f"checksums (mix, low 8 hex digits; * differs from the replay){note}:")
        lines.append(format_table(["layer", "rank", *POINTS], rows))
    steps = [d for d in res["divergences"] if d.get("step", -1) >= 0]
    for d in steps[:8]:
        lines.append(f"reduction step {d['step']} of layer {d['layer']} on rank {d['rank']}: "
                     f"{'its result' if d['reduced'] else 'the chunk that arrived'} differs from the replay")
    for e in res["rank_fill_errors"][:8]:
        lines.append(f"rank-fill check: {e}")
    for f in res["faults"]:
        lines.append(f"fault injected: {f['text']}")
    for f in res["faults_not_fired"]:
        lines.append(f"fault NOT injected: {f}")
    if res["changed_tensors"]:
        more = len(res["changed_tensors"]) - 4
        lines.append("tensors that differ from the replay: " + ", ".join(res["changed_tensors"][:4]) +
                     (f" and {more} more" if more > 0 else ""))
    lines.append(f"verdict: {res['verdict']['text']}")
    return "\n".join(lines)


def format_campaign(c):
    """The campaign's tallies as a table (all, then by site and by model) and the clean runs."""
    from ._table import format_table
    head = ["faults", "injected", "fired", "activated", "detected", "by word", "by mix", "by rank-fill", "localised",
            "masked", "silent"]

    def row(name, t):
        return [name, str(t["injected"]), str(t["fired"]), str(t["activated"]),
                f"{t['detected']} ({_pct(t['detected'], t['activated'])})", str(t["by_word"]), str(t["by_mix"]),
                str(t["by_rank_fill"]),
                f"{t['localised']} ({_pct(t['localised'], t['detected'])})", str(t["masked"]), str(t["silent"])]
    rows = [row("all", c["total"])]
    rows += [row(f"site {k}", v) for k, v in c["by_site"].items()]
    rows += [row(f"model {k}", v) for k, v in c["by_model"].items()]
    cl = c["clean"]
    rec = c["recipe"]
    return "\n".join([
        (f"SDC campaign on '{c['topology']}'" if c.get("backend", "sim") == "sim" else
         f"SDC campaign on the {c['backend']} backend (faults replayed at GEMM outputs, reduction steps and collective results)") +
        f": {c['ranks']} ranks, {rec['mode']} mode, {rec['layers']} layers, seed {c['seed']}, {c['wall_s']:.1f} s",
        format_table(head, rows),
        "(detected: % of activated; localised: % of detected, to comm/compute, layer and rank)",
        f"fault-free runs: {cl['runs']} ({cl['layer_steps']} layer-steps on fresh data), "
        f"false positives: {cl['false_positives']}",
    ])
