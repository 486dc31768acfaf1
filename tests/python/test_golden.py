"""Golden outputs of whole simulations: `cubesim run` on three shipped topologies must give the same
simulated time, the same event order (the simulator's fingerprint) and the same trace, byte for
byte, as the golden file records. Any change fails here.

An intended change (a new timing model, a new trace field) updates tests/golden/cubesim_run.json in
the same commit, with the reason:

    CUBESIM_UPDATE_GOLDEN=1 CUBESIM_GOLDEN_REASON="why the times change" \
        PYTHONPATH=build/python python3 -m pytest -q tests/python/test_golden.py
"""
import contextlib
import hashlib
import io
import json
import os
from pathlib import Path

import pytest

from cubesim import cli

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "cubesim_run.json"

# name -> the `cubesim run` arguments (the model is the command's default: hidden 512, ffn 2048,
# 256 tokens, bf16, tanh GELU, ring collectives).
RUNS = {
    "single_cube": ["--topology", "single_cube"],
    "ring4_tp4": ["--topology", "ring4", "--tp", "4"],
    "mesh4x4_tp8": ["--topology", "mesh4x4", "--tp", "8"],
}


def run_once(name, tmp_path):
    trace = tmp_path / f"{name}.trace.json"
    js = tmp_path / f"{name}.json"
    with contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(["run", *RUNS[name], "--trace", str(trace), "--json", str(js)])
    assert rc == 0, f"cubesim run {' '.join(RUNS[name])} failed (exit {rc})"
    d = json.loads(js.read_text())
    return {
        "args": RUNS[name],
        "sim_time_ps": d["sim_time_ps"],
        "events": d["events"],
        "event_hash": d["event_hash"],
        "trace_sha256": hashlib.sha256(trace.read_bytes()).hexdigest(),
    }


def test_golden_file_lists_every_run():
    golden = json.loads(GOLDEN.read_text())
    assert set(golden["runs"]) == set(RUNS)
    for name, g in golden["runs"].items():
        assert g["args"] == RUNS[name]
        assert g["reason"].strip(), f"{name}: every golden entry says why it has these values"


@pytest.mark.parametrize("name", sorted(RUNS))
def test_cubesim_run_matches_golden(name, tmp_path):
    got = run_once(name, tmp_path)
    if os.environ.get("CUBESIM_UPDATE_GOLDEN") == "1":
        reason = os.environ.get("CUBESIM_GOLDEN_REASON", "").strip()
        assert reason, "set CUBESIM_GOLDEN_REASON to say why the golden values change"
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {"runs": {}}
        golden.setdefault("_comment", "Golden outputs of `cubesim run`; see tests/python/test_golden.py for how to update.")
        golden["runs"][name] = got | {"reason": reason}
        GOLDEN.write_text(json.dumps(golden, indent=2, sort_keys=True) + "\n")
        return
    want = json.loads(GOLDEN.read_text())["runs"][name]
    for key in ("sim_time_ps", "events", "event_hash", "trace_sha256"):
        assert got[key] == want[key], (
            f"cubesim run {' '.join(RUNS[name])}: {key} is {got[key]}, the golden file says {want[key]} "
            f"(recorded because: {want['reason']}). If the change is intended, update the golden file "
            "with the reason (see this file's docstring)."
        )
