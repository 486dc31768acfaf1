"""The GPT model through the Python API and `cubesim run --model gpt`: the equivalence check passes on
the simulator and the host, a timing-only run takes the functional run's simulated time, the loss of an
untrained model is near log(vocab), and sizes that tp or the heads cannot take are refused naming the
valid choices."""
import json
import math

import pytest

import cubesim as cs
from cubesim import cli

SMALL = ["--hidden", "64", "--heads", "8", "--ffn", "128", "--vocab", "128", "--seq", "72", "--layers", "2"]


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_run_gpt_checks_against_the_host_reference(capsys, tmp_path):
    path = tmp_path / "gpt.json"
    rc, out, err = run_cli(capsys, "run", "--model", "gpt", "--topology", "ring4", "--kv-heads", "4", "--batch", "2",
                           "--sequence-parallel", "--swiglu", "--rotary", "--norm", "rms_norm", *SMALL, "--json", str(path))
    assert rc == 0, err
    assert "GPTModel forward + backward, checked against the host reference" in out
    assert "check: PASS" in out and "kv heads 4" in out and "sequence parallel" in out and "SwiGLU" in out and "RoPE" in out
    d = json.loads(path.read_text())
    assert d["model"] == "gpt" and d["mlp"] is None and d["pass"] is True and d["tp"] == 4
    assert d["gpt"]["kv_heads"] == 4 and d["gpt"]["layers"] == 2 and d["gpt"]["swiglu"] is True
    againsts = {c["against"] for c in d["check"]["checks"]}
    assert againsts == {"unsharded", "host replay", "ranks"}
    names = {c["tensor"] for c in d["check"]["checks"]}
    assert "loss" in names and "layers.1.attention.qkv.weight_grad" in names and "embedding.weight_grad" in names
    assert abs(d["loss"] - math.log(128)) < 0.1 * math.log(128)


def test_timing_only_gpt_takes_the_functional_runs_time(capsys, tmp_path):
    times = []
    for extra in ([], ["--timing-only"]):
        path = tmp_path / f"g{len(times)}.json"
        rc, out, err = run_cli(capsys, "run", "--model", "gpt", "--topology", "ring4", "--tp", "2", *SMALL, *extra,
                               "--json", str(path))
        assert rc == 0, err
        times.append(json.loads(path.read_text())["sim_time_ps"])
    assert times[0] == times[1] > 0


@pytest.mark.parametrize("argv,message", [
    (["--tp", "4", "--kv-heads", "2"], "--tp 4: tp must divide ffn 128 and kv-heads 2 and vocab 128; valid tp values "
     "here: 1, 2"),
    (["--heads", "6"], "--heads 6: must divide --hidden 64"),
    (["--kv-heads", "3"], "--kv-heads 3: must divide --heads 8"),
    (["--batch", "2", "--lengths", "72"], "--lengths: 1 lengths for --batch 2; give one per sequence"),
    (["--batch", "2", "--lengths", "72,73"], "--lengths: 73 is outside 1..--seq 72"),
    (["--lengths", "x"], "--lengths x: give one length per sequence, comma-separated (e.g. --lengths 72)"),
])
def test_run_gpt_refuses_sizes_naming_the_valid_choices(capsys, argv, message):
    args = SMALL + argv  # later flags win
    rc, out, err = run_cli(capsys, "run", "--model", "gpt", "--topology", "ring4", *args)
    assert rc == 2
    assert message in err


def test_api_check_gpt_equivalence_on_the_host_and_its_errors():
    ctx = cs.Context("host", world_size=2)
    rep = cs.tp.check_gpt_equivalence(ctx, tp=2, batch=1, vocab=64, hidden=32, heads=4, kv_heads=2, ffn=64, seq=70,
                                      layers=1, norm="rms_norm", dtype="f32", tie_embeddings=False)
    assert rep.passed, [c for c in rep.checks if not c.passed]
    assert {c.tensor for c in rep.checks} >= {"loss", "lm_head.weight_grad", "layers.0.mlp.fc1.weight_grad"}
    assert all(c.against != "host replay" for c in rep.checks)  # the host is its own replay
    with pytest.raises(cs.RankError, match="vocab 63 is not divisible by the tensor-parallel size 2"):
        cs.tp.check_gpt_equivalence(ctx, tp=2, vocab=63, hidden=32, heads=4, ffn=64, seq=8, layers=1)
    with pytest.raises(ValueError, match="layers"):
        cs.tp.run_gpt(ctx, tp=1, layers=0)


def test_api_gpt_with_right_padding_masks_the_loss_and_checks_equivalence():
    # lengths: each sequence's real tokens; the loss is the mean over them (Megatron's loss mask).
    sim = cs.Context("sim", topology="mesh4x4", world_size=2)
    kw = dict(tp=2, batch=3, vocab=64, hidden=32, heads=4, kv_heads=2, ffn=64, seq=24, layers=1, norm="rms_norm",
              dtype="bf16", rotary=True, swiglu=True)
    rep = cs.tp.check_gpt_equivalence(sim, lengths=[24, 9, 16], **kw)
    assert rep.passed, [c for c in rep.checks if not c.passed]
    assert any(c.against == "host replay" for c in rep.checks)
    assert abs(rep.mean_loss - math.log(64)) < 0.15 * math.log(64)
    padded = cs.tp.run_gpt(sim, lengths=[24, 9, 16], **kw).mean_loss
    full = cs.tp.run_gpt(sim, **kw).mean_loss
    assert padded == rep.mean_loss and padded != full
    with pytest.raises(ValueError, match="sequence 1 has length 25; valid lengths are 1 to seq 24"):
        cs.tp.run_gpt(sim, lengths=[24, 25, 3], **kw)
    with pytest.raises(ValueError, match="2 lengths for a batch of 3 sequences"):
        cs.tp.check_gpt_equivalence(sim, lengths=[24, 5], **kw)
    with pytest.raises(ValueError, match="give one length per sequence"):
        cs.tp.run_gpt(sim, lengths=[], **kw)
    with pytest.raises(ValueError, match=r"lengths\[1\]"):
        cs.tp.run_gpt(sim, lengths=[24, -1, 3], **kw)


def test_run_gpt_with_right_padding(capsys, tmp_path):
    path = tmp_path / "gpt.json"
    rc, out, err = run_cli(capsys, "run", "--model", "gpt", "--topology", "ring4", "--tp", "2", "--batch", "2",
                           "--lengths", "72,30", *SMALL, "--json", str(path))
    assert rc == 0, err
    assert "check: PASS" in out and "right padding 72,30 real tokens" in out
    d = json.loads(path.read_text())
    assert d["gpt"]["lengths"] == [72, 30] and d["pass"] is True
    assert abs(d["loss"] - math.log(128)) < 0.1 * math.log(128)
