"""cubesim.numerics and `cubesim numerics`: metrics against an independent numpy computation on the
saved tensors, the numerics contract across backends (sim == host bit for bit), precedence of the
overrides, refusals by path, skipped backends, .npz data, determinism of the report, the CLI."""
import json
import math

import numpy as np
import pytest

import cubesim as cs
from cubesim import cli

SMALL = {"model": {"layers": 3, "hidden": 64, "ffn": 256, "tokens": 8, "tp": 4},
         "variants": {"bf16": {"model.dtype": "bf16"},
                      "bf16 sim": {"model.dtype": "bf16", "run.backend": "sim"},
                      "bf16 residual": {"model.dtype": "bf16", "model.residual_dtype": "bf16"},
                      "f32 sim": {"run.backend": "sim"}}}


def test_metrics_match_numpy_on_the_saved_tensors(tmp_path):
    rep = cs.numerics.run(SMALL, output_dir=tmp_path, save_tensors=True)
    z = np.load(tmp_path / "tensors.npz")
    names = [f"layers.{l}.output" for l in range(3)] + [f"layers.{l}.input_grad" for l in range(3)]
    checked = 0
    for variant in ("bf16", "bf16 sim", "bf16 residual"):
        for t in names:
            v, ref = z[f"{variant}/{t}"].ravel(), z[f"reference/{t}"].ravel()
            # Written independently of numerics.metrics: sums of squares in a Python loop over float64.
            sq = sum((float(a) - float(b)) ** 2 for a, b in zip(v, ref))
            rs = sum(float(b) ** 2 for b in ref)
            rms_abs = math.sqrt(sq / len(v))
            rms_rel = rms_abs / math.sqrt(rs / len(v) + 1e-30)
            max_abs = max(abs(float(a) - float(b)) for a, b in zip(v, ref))
            max_rel = max_abs / math.sqrt(max(abs(float(b)) for b in ref) ** 2 + 1e-30)
            got = rep["variants"][variant]["tensors"][t]
            for k, want in (("rms_abs", rms_abs), ("rms_rel", rms_rel), ("max_abs", max_abs), ("max_rel", max_rel)):
                assert want > 0
                assert abs(got[k] - want) <= 1e-12 * want, (variant, t, k, got[k], want)
                checked += 1
    assert checked == 3 * 6 * 4
    # The file holds the same numbers.
    on_disk = json.loads((tmp_path / "precision_report.json").read_text())
    assert on_disk["variants"]["bf16"]["tensors"]["layers.1.output"] == rep["variants"]["bf16"]["tensors"]["layers.1.output"]
    assert (tmp_path / "rms_rel.png").stat().st_size > 1000


def test_backends_agree_bit_for_bit_and_the_report_is_deterministic(tmp_path):
    a = cs.numerics.run(SMALL, output_dir=tmp_path / "a")
    b = cs.numerics.run(SMALL, output_dir=tmp_path / "b")
    assert (tmp_path / "a" / "precision_report.json").read_bytes() == (tmp_path / "b" / "precision_report.json").read_bytes()
    v = a["variants"]
    # The numerics contract: the simulated PEs and collectives give the host's bits.
    assert v["bf16 sim"]["tensors"] == v["bf16"]["tensors"]
    assert all(m["rms_abs"] == 0 and m["max_abs"] == 0 for m in v["f32 sim"]["tensors"].values())
    # A bf16 residual stream loses more than an f32 one, at every layer and in both directions.
    for t, m in v["bf16 residual"]["tensors"].items():
        assert m["rms_rel"] > v["bf16"]["tensors"][t]["rms_rel"] > 0, t
    # bf16's error is of bf16's size (2^-8 relative rounding per element, grown over a few layers).
    assert 1e-4 < v["bf16"]["summary"]["fw"]["first"] < 1e-2


def test_precedence_notes_and_tool_requirements():
    cfg = dict(SMALL, variants={"timing": {"model.dtype": "bf16", "run.timing_only": True}})
    runs = cs.numerics.resolve(cs.numerics.load_config(cfg))
    name, ref, ref_notes = runs[0]
    assert name == "reference" and ref["model"]["dtype"] == "f32" and ref["run"]["backend"] == "host"
    assert any("run.backend = 'host' forced (was 'sim')" in n for n in ref_notes)
    name, c, notes = runs[1]
    assert c["model"]["dtype"] == "bf16" and c["run"]["timing_only"] is False and c["run"]["backend"] == "host"
    assert any("which the reference forces to 'f32'" in n for n in notes)
    assert any("the tool needs False (values to compare)" in n for n in notes)


@pytest.mark.parametrize("cfg, match", [
    ({"modle": {}, "variants": {"a": {}}}, r"'modle' is not a section \(did you mean 'model'\?\)"),
    ({"model": {"layrs": 2}, "variants": {"a": {}}}, r"'model.layrs' is not a field \(did you mean 'model.layers'\?\)"),
    ({"variants": {"a": {"model.dtyp": "bf16"}}}, r"variants.a: 'model.dtyp' is not a field \(did you mean 'model.dtype'\?\)"),
    ({"variants": {"a": {"model.dtype": "fp8"}}}, r"variants.a: model.dtype: 'fp8' is not valid \(valid: f32, bf16, f16\)"),
    ({"variants": {"a": {"run.gemm_mode": "tensor_core"}}}, r"run.gemm_mode = 'tensor_core' needs run.backend 'cuda'"),
    ({"model": {"tp": 3}, "variants": {"a": {}}}, r"model.tp = 3 must divide model.ffn"),
    ({"model": {"layers": 0}, "variants": {"a": {}}}, r"model.layers = 0: valid are integers in \[1, 1024\]"),
    ({"variants": {}}, r"variants: expected an object of named variants"),
    ({"variants": {"reference": {}}}, r"the name 'reference' is the fp32 reference's"),
    ({"variants": {"a": {"run.backend": "tpu"}}}, r"run.backend: 'tpu' is not a backend"),
])
def test_bad_configs_are_refused_naming_the_path(cfg, match):
    with pytest.raises(ValueError, match=match):
        cs.numerics.run(cfg)


def test_a_backend_that_cannot_run_here_is_skipped_with_the_reason():
    missing = [b for b in cs.backend_info() if not b["available"]]
    if not missing:
        pytest.skip("every backend runs here")
    name = missing[0]["name"]
    rep = cs.numerics.run(dict(SMALL, variants={"there": {"run.backend": name}, "bf16": {"model.dtype": "bf16"}}))
    assert rep["variants"]["there"]["skipped"].startswith(f"backend '{name}' cannot run here")
    assert "tensors" in rep["variants"]["bf16"]
    assert "skipped" in cs.numerics.format_summary(rep)


def test_npz_data_and_its_errors(tmp_path, rng):
    x = rng.standard_normal((8, 64))
    dy = rng.standard_normal((8, 64))
    path = tmp_path / "data.npz"
    np.savez(path, input=x, output_grad=dy)
    cfg = dict(SMALL, data={"npz": str(path)}, variants={"bf16": {"model.dtype": "bf16"}})
    a = cs.numerics.run(cfg)
    cfg_seed = dict(SMALL, variants={"bf16": {"model.dtype": "bf16"}})
    assert a["variants"]["bf16"]["tensors"] != cs.numerics.run(cfg_seed)["variants"]["bf16"]["tensors"]
    np.savez(path, input=x)
    with pytest.raises(ValueError, match=r"has no array 'output_grad' \(it needs 'input', or 'tokens' and 'embedding', and 'output_grad' of shape \[8, 64\]"):
        cs.numerics.run(cfg)
    np.savez(path, input=x[:, :32], output_grad=dy)
    with pytest.raises(ValueError, match=r"'input' is float64\[8, 32\]; expected numbers of shape \[8, 64\]"):
        cs.numerics.run(cfg)


def test_token_inputs_seeded_and_from_an_npz(tmp_path):
    # Seeded tokens: ids in [0, vocab), each token's embedding row the same wherever it occurs, and a
    # study over them equals one whose .npz holds the same tokens and embedding rows.
    cfg = dict(SMALL, data={"seed": 3, "vocab": 5}, variants={"bf16": {"model.dtype": "bf16"}})
    loaded = cs.numerics.load_config(cfg)
    ids = cs.numerics.token_ids(loaded)
    assert ids.shape == (8,) and ids.min() >= 0 and ids.max() < 5 and len(set(ids.tolist())) < 8  # repeats
    x = cs.numerics.embed(ids, 64, 3, 1.0)
    for i in range(8):
        for j in range(8):
            assert (x[i] == x[j]).all() == (ids[i] == ids[j])
    rep = cs.numerics.run(cfg, output_dir=tmp_path / "a", save_tensors=True)
    assert rep["variants"] == cs.numerics.run(cfg)["variants"]  # deterministic
    emb = np.zeros((5, 64))
    for t in set(ids.tolist()):
        emb[t] = cs.numerics.embed(np.array([t]), 64, 3, 1.0)[0]
    dy = np.random.default_rng(3)
    dy.standard_normal((8, 64))
    path = tmp_path / "tokens.npz"
    np.savez(path, tokens=ids, embedding=emb, output_grad=dy.standard_normal((8, 64)))
    from_npz = cs.numerics.run(dict(SMALL, data={"npz": str(path)}, variants={"bf16": {"model.dtype": "bf16"}}))
    assert from_npz["variants"]["bf16"]["tensors"] == rep["variants"]["bf16"]["tensors"]
    # Tokens differ from normal activations (the default, vocab 0).
    assert cs.numerics.run(dict(cfg, data={"seed": 3}))["variants"]["bf16"]["tensors"] != rep["variants"]["bf16"]["tensors"]
    # Bad token data, named.
    np.savez(path, tokens=ids + 5, embedding=emb, output_grad=np.zeros((8, 64)))
    with pytest.raises(ValueError, match=r"token id \d+ is outside the embedding's vocabulary \[0, 5\)"):
        cs.numerics.run(dict(SMALL, data={"npz": str(path)}))
    np.savez(path, tokens=ids, output_grad=np.zeros((8, 64)))
    with pytest.raises(ValueError, match=r"has 'tokens' but no 'embedding' \[vocab, 64\]"):
        cs.numerics.run(dict(SMALL, data={"npz": str(path)}))
    np.savez(path, tokens=ids.astype(np.float32), embedding=emb, output_grad=np.zeros((8, 64)))
    with pytest.raises(ValueError, match=r"'tokens' is float32\[8\]; expected integers of shape \[8\]"):
        cs.numerics.run(dict(SMALL, data={"npz": str(path)}))
    np.savez(path, tokens=ids, embedding=emb[:, :32], output_grad=np.zeros((8, 64)))
    with pytest.raises(ValueError, match=r"'embedding' is float64\[5, 32\]; expected numbers of shape \[vocab, 64\]"):
        cs.numerics.run(dict(SMALL, data={"npz": str(path)}))
    np.savez(path, tokens=ids, embedding=emb, input=np.zeros((8, 64)), output_grad=np.zeros((8, 64)))
    with pytest.raises(ValueError, match=r"has both 'input' and 'tokens': give one"):
        cs.numerics.run(dict(SMALL, data={"npz": str(path)}))
    np.savez(path, tokens=ids, embedding=emb)
    with pytest.raises(ValueError, match=r"has no array 'output_grad' \(it needs 'input', or 'tokens' and 'embedding'"):
        cs.numerics.run(dict(SMALL, data={"npz": str(path)}))
    np.savez(path, output_grad=np.zeros((8, 64)))
    with pytest.raises(ValueError, match=r"has no array 'input' \(it needs 'input', or 'tokens' and 'embedding', and "
                                         r"'output_grad' of shape \[8, 64\]; it has output_grad\)"):
        cs.numerics.run(dict(SMALL, data={"npz": str(path)}))
    with pytest.raises(ValueError, match=r"data.vocab = 5 draws seeded tokens, and data.npz gives the data: set one"):
        cs.numerics.run(dict(SMALL, data={"npz": str(path), "vocab": 5}))
    with pytest.raises(ValueError, match=r"data.vocab = -1: valid are integers in \[0, 16777216\]"):
        cs.numerics.run(dict(SMALL, data={"vocab": -1}))


def test_summary_cells_keep_two_significant_digits():
    rep = cs.numerics.run(SMALL)
    text = cs.numerics.format_summary(rep)
    rows = [l.split() for l in text.splitlines()[3:]]
    for r in rows:
        for cell in r[-4:]:
            v = float(cell)
            if v == 0:
                continue
            digits = cell.split(".")[1].lstrip("0") if "." in cell else cell
            assert len(digits) >= 2, (cell, text)


def test_cli(capsys, tmp_path):
    cfg = tmp_path / "study.json"
    cfg.write_text(json.dumps(SMALL))
    rc = cli.main(["numerics", "--config", str(cfg), "--output-dir", str(tmp_path / "out"), "--set", "model.layers=2",
                   "--json", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "rms_rel against the fp32 reference" in out and "last (layer 1)" in out
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["schema"] == "cubesim.numerics/1" and rep["config"]["model"]["layers"] == 2
    assert (tmp_path / "out" / "precision_report.json").exists()
    rc = cli.main(["numerics", "--config", str(cfg), "--set", "model.hiden=3"])
    out, err = capsys.readouterr()
    assert rc == 2 and "'model.hiden' is not a field (did you mean 'model.hidden'?)" in err, err
    rc = cli.main(["numerics", "--config", str(tmp_path / "missing.json")])
    out, err = capsys.readouterr()
    assert rc == 2 and "cannot read it" in err, err


def test_example_configs_load():
    from pathlib import Path
    root = Path(__file__).resolve().parents[2] / "examples" / "numerics"
    files = sorted(root.glob("*.json"))
    assert len(files) >= 2
    for f in files:
        cfg = cs.numerics.load_config(f)
        assert cs.numerics.resolve(cfg)[0][0] == "reference"


def test_accumulator_models_reach_sim_and_host_alike():
    models = ("f32_fma_seq", "pairwise", "bf16_acc", "hopper_tc")
    cfg = dict(SMALL, variants={f"{m} {b}": {"model.dtype": "bf16", "run.gemm_numerics": m, "run.backend": b}
                                for m in models for b in ("host", "sim")})
    v = cs.numerics.run(cfg)["variants"]
    for m in models:  # the simulated PEs run the same model: the same bits as the host
        assert v[f"{m} sim"]["tensors"] == v[f"{m} host"]["tensors"], m
    # A bf16 accumulator loses far more than an f32 one.
    for t, mt in v["bf16_acc host"]["tensors"].items():
        assert mt["rms_rel"] > 1.5 * v["f32_fma_seq host"]["tensors"][t]["rms_rel"], t
    with pytest.raises(ValueError, match="'hopper_tc' models bf16/f16 tensor-core MMAs; model.dtype is f32"):
        cs.numerics.run(dict(SMALL, variants={"a": {"run.gemm_numerics": "hopper_tc"}}))
    with pytest.raises(ValueError, match="is modelled by the sim and host backends"):
        cs.numerics.run(dict(SMALL, variants={"a": {"model.dtype": "bf16", "run.gemm_numerics": "pairwise",
                                                    "run.backend": "cuda"}}))


def test_gemm_numerics_on_a_context(rng):
    a = rng.standard_normal((16, 96)).astype(np.float32)
    b = rng.standard_normal((96, 8)).astype(np.float32)
    outs = {}
    for model in ("bf16_acc", "hopper_tc", "f32_fma_seq"):
        for backend in ("host", "sim"):
            kw = {"topology": "ring4"} if backend == "sim" else {"world_size": 1}
            ctx = cs.Context(backend, gemm_numerics=model, **kw)

            def fn(rank):
                c = ctx.empty(rank, [16, 8], "f32")
                cs.matmul(ctx.tensor(rank, a, "bf16"), ctx.tensor(rank, b, "bf16"), c)
                outs[model, backend] = c.numpy()
            ctx.spawn(fn, nprocs=1)
        np.testing.assert_array_equal(outs[model, "sim"], outs[model, "host"])
    # hopper_tc truncates: on random data with f32 outputs some elements differ from the contract's.
    assert (outs["hopper_tc", "host"] != outs["f32_fma_seq", "host"]).any()
    np.testing.assert_allclose(outs["hopper_tc", "host"], outs["f32_fma_seq", "host"], rtol=1e-5, atol=1e-5)
    # bf16_acc by definition: acc = bf16(fma(a, b, acc)) along k (a·b exact in float64, one f32 rounding).
    ab = cs.round_to("bf16", a).astype(np.float64)
    bb = cs.round_to("bf16", b).astype(np.float64)
    want = np.zeros((16, 8), np.float32)
    for k in range(96):
        want = cs.round_to("bf16", (want.astype(np.float64) + ab[:, k:k + 1] * bb[k:k + 1, :]).astype(np.float32))
    np.testing.assert_array_equal(outs["bf16_acc", "host"], want)
    with pytest.raises(ValueError, match="'tf32' is not valid|not an accumulator model|valid"):
        cs.Context("host", world_size=1, gemm_numerics="tf32")
    ctx = cs.Context("sim", topology="ring4", overrides={"cube.pe.tile.k": 24}, gemm_numerics="hopper_tc")

    def bad(rank):
        c = ctx.empty(rank, [16, 8], "f32")
        cs.matmul(ctx.tensor(rank, a, "bf16"), ctx.tensor(rank, b, "bf16"), c)
    with pytest.raises(Exception, match="groups of 16 products, but the PE's tile k is 24"):
        ctx.spawn(bad, nprocs=1)


def test_weights_from_the_npz_are_the_model(tmp_path, rng):
    L, T, H, F = 2, 8, 64, 256
    x = rng.standard_normal((T, H))
    arrays = {"input": x, "output_grad": rng.standard_normal((T, H))}
    for l in range(L):
        arrays[f"layers.{l}.fc1.weight"] = 0.1 * rng.standard_normal((F, H))
        arrays[f"layers.{l}.fc1.bias"] = 0.1 * rng.standard_normal(F)
        arrays[f"layers.{l}.fc2.weight"] = 0.1 * rng.standard_normal((H, F))
        arrays[f"layers.{l}.fc2.bias"] = 0.1 * rng.standard_normal(H)
    path = tmp_path / "data.npz"
    np.savez(path, **arrays)
    cfg = {"model": {"layers": L, "hidden": H, "ffn": F, "tokens": T, "tp": 4},
           "data": {"npz": str(path)}, "variants": {"bf16": {"model.dtype": "bf16"}}}
    cs.numerics.run(cfg, output_dir=tmp_path / "out", save_tensors=True)
    got = np.load(tmp_path / "out" / "tensors.npz")["reference/layers.0.output"]
    # Block 0 in float64 from the full weights (each rank held its shard): h = x + MLP(x), tanh GELU.
    w = {k: arrays[f"layers.0.{k}"].astype(np.float32).astype(np.float64) for k in
         ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")}
    xf = x.astype(np.float32).astype(np.float64)
    a = xf @ w["fc1.weight"].T + w["fc1.bias"]
    g = 0.5 * a * (1 + np.tanh(0.7978845608028654 * (a + 0.044715 * a ** 3)))
    want = xf + g @ w["fc2.weight"].T + w["fc2.bias"]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
    del arrays["layers.1.fc2.bias"]
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"has weights but no array 'layers.1.fc2.bias'"):
        cs.numerics.run(cfg)
    arrays["layers.1.fc2.bias"] = np.zeros(H + 1)
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"'layers.1.fc2.bias' is float64\[65\]; expected numbers of shape \[64\]"):
        cs.numerics.run(cfg)
    arrays["layers.1.fc2.bias"] = np.zeros(H)
    arrays["layers.2.fc1.weight"] = np.zeros((F, H))
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"'layers.2.fc1.weight' is not a weight of the model \(blocks 0..1"):
        cs.numerics.run(cfg)


def _cuda_gpus():
    info = next((b for b in cs.backend_info() if b["name"] == "cuda"), None)
    return info["devices"] if info is not None and info["available"] else 0


@pytest.mark.skipif(_cuda_gpus() < 1, reason="needs a CUDA GPU (the cuda backend is absent here or sees none)")
def test_cuda_variants_equal_the_host_and_the_hopper_tc_model_bit_for_bit(tmp_path):
    # On the GPU: the cuda backend's exact GEMMs are the numerics contract's (= host), and its tensor-core
    # GEMMs are what the hopper_tc accumulator model computes (= host and sim in hopper_tc), through the
    # whole residual stack, forward and backward, with the runtime's ring all-reduce over tp 2.
    tp = 2
    share = _cuda_gpus() < tp
    cuda = {"model.dtype": "bf16", "run.backend": "cuda", "run.share_gpus": share}
    cfg = {"model": {"layers": 3, "hidden": 256, "ffn": 1024, "tokens": 64, "tp": tp},
           "data": {"seed": 5},
           "variants": {"exact cuda": dict(cuda),
                        "exact host": {"model.dtype": "bf16"},
                        "tc cuda": dict(cuda, **{"run.gemm_mode": "tensor_core"}),
                        "hopper_tc host": {"model.dtype": "bf16", "run.gemm_numerics": "hopper_tc"},
                        "hopper_tc sim": {"model.dtype": "bf16", "run.backend": "sim", "run.topology": "ring4",
                                          "run.gemm_numerics": "hopper_tc"}}}
    cs.numerics.run(cfg, output_dir=tmp_path, save_tensors=True)
    z = np.load(tmp_path / "tensors.npz")
    names = [f"layers.{l}.{k}" for l in range(3) for k in ("output", "input_grad")]
    for t in names:
        assert z[f"exact cuda/{t}"].any(), t
        np.testing.assert_array_equal(z[f"exact cuda/{t}"], z[f"exact host/{t}"], err_msg=t)
        np.testing.assert_array_equal(z[f"tc cuda/{t}"], z[f"hopper_tc host/{t}"], err_msg=t)
        np.testing.assert_array_equal(z[f"tc cuda/{t}"], z[f"hopper_tc sim/{t}"], err_msg=t)
    # The tensor cores do differ from the contract on this data (else the comparison proves little).
    assert any((z[f"tc cuda/{t}"] != z[f"exact cuda/{t}"]).any() for t in names)
