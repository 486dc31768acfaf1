"""cubesim.sdc and `cubesim sdc`: checksums against numpy, the model's verdicts (clean, comm, compute,
memory) for faults at each site, recipes refusing bad input by path, campaigns (bounded CI size),
and the command line's output, JSON and exit codes."""
import json

import numpy as np
import pytest

import cubesim as cs
from cubesim import cli

SMALL = {"layers": 4, "tokens": 8, "hidden": 64, "ffn": 128}


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ---- checksums --------------------------------------------------------------------------------------


def test_word_checksum_is_the_int16_sum_modulo_2_64():
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 1 << 16, size=5000, dtype=np.uint16)
    want = int(bits.view(np.int16).astype(np.int64).sum()) % (1 << 64)
    assert cs.checksum(bits, "bf16") == want
    f = rng.integers(0, 1 << 32, size=777, dtype=np.uint32)
    assert cs.checksum(f, "f32") == int(f.view(np.int32).astype(np.int64).sum()) % (1 << 64)


def test_mix_checksum_catches_a_swap_the_word_sum_misses():
    rng = np.random.default_rng(4)
    a = rng.integers(0, 1 << 16, size=256, dtype=np.uint16)
    b = a.copy()
    b[[3, 200]] = b[[200, 3]]
    assert a[3] != a[200]
    assert cs.checksum(a, "bf16", "word") == cs.checksum(b, "bf16", "word")
    assert cs.checksum(a, "bf16", "mix") != cs.checksum(b, "bf16", "mix")
    # Pieces add up to the whole when each gives its first element's index.
    whole = cs.checksum(a, "bf16", "mix")
    assert (cs.checksum(a[:100], "bf16", "mix") + cs.checksum(a[100:], "bf16", "mix", base=100)) % (1 << 64) == whole
    with pytest.raises(ValueError, match="'crc' \\(valid: word, mix\\)"):
        cs.checksum(a, "bf16", "crc")


# ---- the model ----------------------------------------------------------------------------------------


def test_clean_run_on_sim_and_host():
    res = cs.sdc.run(SMALL)
    assert res["verdict"]["kind"] == "clean", res["verdict"]["text"]
    assert not res["divergences"] and not res["rank_fill_errors"] and not res["changed_tensors"]
    layers = res["layers"]
    assert len(layers) == 4 and all(len(l["ranks"]) == 4 for l in layers)
    assert all(l["ranks"][2]["checksums"] == layers[0]["ranks"][2]["checksums"] for l in layers)
    host = cs.sdc.run(SMALL, context=cs.Context("host", world_size=4))
    assert host["verdict"]["kind"] == "clean"
    assert host["layers"][1]["ranks"][3]["checksums"] == layers[1]["ranks"][3]["checksums"]


def _moment(layer):
    """Microseconds from the run's start by which every rank has begun `layer`."""
    ctx = cs.Context("sim", topology="ring4")
    res = cs.sdc.run(SMALL, context=ctx)
    # The per-rank timelines are not in the JSON; a layer takes the same time on every rank, so the
    # layer's share of the run is close enough to land inside it.
    return res["sim_time_ps"] / 1e6 * (layer + 0.5) / (SMALL["layers"] + 0.5)


@pytest.mark.parametrize("fault,kind", [
    ({"site": "link", "link": 2, "model": "word_burst", "words": 3, "seed": 5}, "comm"),
    ({"site": "gemm_tile", "cube": 2, "seed": 8}, "compute"),
    ({"site": "dma", "cube": 1, "model": "multi_bit", "bits": 4, "seed": 9}, "compute"),
    ({"site": "hbm", "tensor": "input", "layer": 3, "rank": 1, "model": "stuck_at", "stuck_value": 1}, "memory"),
])
def test_each_site_gives_its_verdict(fault, kind):
    f = dict(fault)
    f["at_us"] = _moment(2 if kind != "memory" else 1)
    res = cs.sdc.run({**SMALL, "faults": [f]})
    assert len(res["faults"]) == 1, res["faults_not_fired"]
    v = res["verdict"]
    assert v["kind"] == kind, v["text"]
    rank = {"comm": None, "compute": f.get("cube"), "memory": 1}[kind]
    if rank is not None:
        assert v["rank"] == rank, v["text"]
    if kind == "memory":
        assert v["layer"] == 3 and "compute_input" in v["text"]
    else:
        assert v["layer"] == 2, (v["text"], res["faults"][0]["text"])


def test_recipe_errors_name_the_path(tmp_path):
    with pytest.raises(ValueError, match="layer: unknown key \\(did you mean 'layers'\\?\\)"):
        cs.sdc.load_recipe({"layer": 2})
    with pytest.raises(ValueError, match="faults.0.model: model: unknown fault model 'flip'"):
        cs.sdc.load_recipe({"faults": [{"model": "flip"}]})
    with pytest.raises(ValueError, match="the recipe has no key 'tokns' \\(did you mean 'tokens'\\?\\)"):
        cs.sdc.load_recipe(None, ["tokns=3"])
    bad = tmp_path / "r.json"
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="r.json: not UTF-8"):
        cs.sdc.load_recipe(str(bad))
    bad.write_text('{"layers": 2,}')
    with pytest.raises(ValueError, match="r.json: not JSON"):
        cs.sdc.load_recipe(str(bad))
    with pytest.raises(ValueError, match="cannot read it"):
        cs.sdc.load_recipe(str(tmp_path / "missing.json"))
    full = cs.sdc.load_recipe(None, ["layers=3", 'faults=[{"site": "link", "link": 2}]', "faults.0.nth=5"])
    assert full["layers"] == 3 and full["faults"][0]["nth"] == 5 and full["faults"][0]["model"] == "bit_flip"
    assert set(full) == set(cs.sdc.default_recipe())


def test_faults_the_topology_lacks_are_refused():
    ctx = cs.Context("sim", topology="ring4")
    with pytest.raises(ValueError, match="faults.0.pe = 200: a cube of 'ring4' has PEs 0.."):
        cs.sdc.validate({"faults": [{"site": "gemm_tile", "cube": 0, "pe": 200}]}, ctx)
    with pytest.raises(ValueError, match="faults.0.link = 99: the topology 'ring4' has links 0.."):
        cs.sdc.run({**SMALL, "faults": [{"site": "link", "link": 99}]}, context=ctx)
    with pytest.raises(ValueError, match="on the host backend: faults.0.link: 1: this backend has no simulated links"):
        cs.sdc.run({**SMALL, "faults": [{"site": "link", "link": 1}]}, context=cs.Context("host", world_size=4))
    with pytest.raises(ValueError, match="ffn = 102 is not divisible by the 4 ranks"):
        cs.sdc.run({**SMALL, "ffn": 102}, context=ctx)
    # The context is still usable.
    assert cs.sdc.run(SMALL, context=ctx)["verdict"]["kind"] == "clean"


# ---- campaigns ----------------------------------------------------------------------------------------


def test_campaign_detects_and_localises_everything_and_repeats():
    seen = []
    c = cs.sdc.campaign(SMALL, faults=120, seed=5, clean_runs=3, threads=2,
                        progress=lambda done, total: seen.append((done, total)))
    t = c["total"]
    assert t["injected"] == t["fired"] == 120
    assert t["detected"] == t["activated"] > 90 and t["silent"] == 0
    assert t["localised"] == t["detected"]
    assert t["masked"] + t["activated"] == t["fired"]
    assert c["clean"] == {"runs": 3, "layer_steps": 48, "false_positives": 0}
    assert len(seen) == 123 and max(seen)[0] == 123
    assert len(c["outcomes"]) == 120 and all(o["fired"] for o in c["outcomes"])
    again = cs.sdc.campaign(SMALL, faults=120, seed=5, clean_runs=3, threads=1, outcomes=True)
    c.pop("wall_s"), again.pop("wall_s")
    assert json.dumps(c, sort_keys=True) == json.dumps(again, sort_keys=True)
    other = cs.sdc.campaign(SMALL, faults=120, seed=6, clean_runs=0)
    assert [o["fault"] for o in other["outcomes"]] != [o["fault"] for o in again["outcomes"]]


def test_campaign_bad_options():
    with pytest.raises(ValueError, match="site 'hbm' is not drawn by campaigns"):
        cs.sdc.campaign(SMALL, faults=1, sites=["hbm"])
    with pytest.raises(ValueError, match=r"the fsdp model on 'ring4' has no operation at the sites asked for \(fsdp has no reduction steps\)"):
        cs.sdc.campaign(SMALL, faults=1, sites=["reduce"])  # fsdp has no reductions
    with pytest.raises(ValueError, match="unknown fault site 'pe'"):
        cs.sdc.campaign(SMALL, faults=1, sites=["pe"])
    with pytest.raises(ValueError, match="faults"):
        cs.sdc.campaign(SMALL, faults=-1)


# ---- the command line ---------------------------------------------------------------------------------


def test_cli_run_clean_and_corrupted(capsys, tmp_path):
    recipe = tmp_path / "r.json"
    recipe.write_text(json.dumps(SMALL))
    rc, out, err = run_cli(capsys, "sdc", "run", "--recipe", str(recipe))
    assert rc == 0, err
    assert "verdict: clean" in out and "comm_output" in out
    path = tmp_path / "out.json"
    rc, out, err = run_cli(capsys, "sdc", "run", "--recipe", str(recipe), "--set",
                           'faults=[{"site": "link", "link": 2, "nth": 3, "seed": 1}]', "--json", str(path))
    assert rc == 1, err
    assert "verdict: corruption in comm" in out and "fault injected: link c" in out
    d = json.loads(path.read_text())
    assert d["schema"] == "cubesim.sdc.run/1" and d["verdict"]["kind"] == "comm" and len(d["faults"]) == 1


def test_cli_dry_run_and_errors(capsys, tmp_path):
    rc, out, err = run_cli(capsys, "sdc", "run", "--dry-run", "--set", "layers=2")
    assert rc == 0, err
    assert "valid for 4 ranks on 'ring4'" in out and '"layers": 2' in out
    rc, out, err = run_cli(capsys, "sdc", "run", "--dry-run", "--set", "layres=2")
    assert rc == 2 and "did you mean 'layers'" in err
    rc, out, err = run_cli(capsys, "sdc", "run", "--dry-run", "--set", 'faults=[{"site": "link", "link": 40}]')
    assert rc == 2 and "faults.0.link = 40" in err
    rc, out, err = run_cli(capsys, "sdc", "run", "--set", "layers=2", "--set",
                           'faults=[{"site": "link", "link": 1, "at_us": 1e6}]')
    assert rc == 2 and "faults.0 (link, at 1000000 us): never fired" in err
    rc, out, err = run_cli(capsys, "sdc", "run", "--recipe", str(tmp_path / "nope.json"))
    assert rc == 2 and "nope.json: cannot read it" in err


def test_cli_campaign(capsys, tmp_path):
    path = tmp_path / "c.json"
    rc, out, err = run_cli(capsys, "sdc", "campaign", "--set", "layers=2", "--faults", "40", "--seed", "3",
                           "--clean-runs", "2", "--json", str(path))
    assert rc == 0, err
    assert "SDC campaign on 'ring4'" in out and "site link" in out and "false positives: 0" in out
    d = json.loads(path.read_text())
    assert d["schema"] == "cubesim.sdc.campaign/1" and d["total"]["injected"] == 40 and len(d["outcomes"]) == 40
    rc, out, err = run_cli(capsys, "sdc", "campaign", "--faults", "1", "--sites", "hbm")
    assert rc == 2 and "'hbm' is not drawn by campaigns" in err


def test_tp_mode_checks_every_reduction_step_and_names_the_rank(capsys):
    res = cs.sdc.run(dict(SMALL, mode="tp"))
    assert res["verdict"]["kind"] == "clean", res["verdict"]["text"]
    steps = res["layers"][2]["ranks"][1]["reduction_steps"]
    assert len(steps) == 3 and all(set(s) == {"received", "reduced"} for s in steps)
    outs = {r["checksums"]["comm_output"]["mix"] for r in res["layers"][0]["ranks"]}
    assert len(outs) == 1  # every rank holds the same all-reduced bits
    rc, out, err = run_cli(capsys, "sdc", "run", "--set", "mode=tp", "--set", "layers=4", "--set",
                           'faults=[{"site": "reduce", "cube": 3, "nth": 5, "seed": 2}]')
    assert rc == 1, err
    assert "verdict: corruption in comm at layer 1 on rank 3" in out, out
    assert "reduction step 1 of layer 1 on rank 3: its result differs from the replay" in out, out
    with pytest.raises(ValueError, match="'full' is not a tensor of the tp model"):
        cs.sdc.load_recipe({"mode": "tp", "faults": [{"site": "hbm", "tensor": "full", "at_us": 1}]})
    with pytest.raises(ValueError, match="'pp' is not a mode"):
        cs.sdc.load_recipe({"mode": "pp"})
    c = cs.sdc.campaign(dict(SMALL, mode="tp"), faults=40, seed=3, clean_runs=2, threads=2)
    t = c["total"]
    assert t["detected"] == t["activated"] > 30 and t["localised"] == t["detected"] and t["silent"] == 0
    assert c["by_site"]["reduce"]["injected"] > 0


def test_faults_replay_on_the_host_backend_and_its_campaigns(capsys):
    host = cs.Context("host", world_size=4)
    res = cs.sdc.run(dict(SMALL, mode="tp", faults=[{"site": "reduce", "cube": 2, "nth": 4, "seed": 1}]), context=host)
    assert res["verdict"]["text"] == "corruption in comm at layer 1 on rank 2", res["verdict"]
    assert res["faults"][0]["text"].startswith("rank2 reduction step #4 (layer 1): bit_flip changing 1 bit")
    res = cs.sdc.run(dict(SMALL, faults=[{"site": "gemm_tile", "cube": 1, "nth": 2, "seed": 1}]), context=host)
    assert res["verdict"]["text"] == "corruption in compute at layer 1 on rank 1", res["verdict"]
    with pytest.raises(ValueError, match="faults.0.at: this backend keeps no simulated time"):
        cs.sdc.run(dict(SMALL, faults=[{"site": "gemm_tile", "at_us": 2}]), context=host)
    c = cs.sdc.campaign(dict(SMALL, mode="tp"), backend="host", faults=60, seed=2, clean_runs=2)  # 4 ranks
    t = c["total"]
    assert c["backend"] == "host" and c["ranks"] == 4 and set(c["by_site"]) == {"gemm_tile", "reduce", "link"}
    assert t["fired"] == 60 and t["detected"] == t["activated"] > 50 and t["localised"] == t["detected"]
    with pytest.raises(ValueError, match="site 'dma' needs the sim backend"):
        cs.sdc.campaign(SMALL, backend="host", world_size=4, faults=1, sites=["dma"])
    rc, out, err = run_cli(capsys, "sdc", "campaign", "--backend", "host", "--set", "mode=tp", "--set", "layers=2",
                           "--faults", "20", "--clean-runs", "1")
    assert rc == 0, err
    assert "on the host backend (faults replayed at GEMM outputs, reduction steps and collective results)" in out, out
    rc, out, err = run_cli(capsys, "sdc", "campaign", "--backend", "host", "--sites", "dma", "--faults", "1")
    assert rc == 2 and "'dma' is not drawn by campaigns on host" in err, err
