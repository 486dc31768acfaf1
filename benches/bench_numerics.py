"""`cubesim numerics` at the issue's size: a 24-layer study (hidden 1024, ffn 4096, 64 tokens, tp 4) with
6 variants on ring4, every variant on the simulator with values (examples/numerics/llm_24_layers.json),
timed end to end against the 2-minute target, with each run's time.

    PYTHONPATH=build/python python3 benches/bench_numerics.py [--config FILE] [--set PATH=VALUE]... [--json F]

Prints the wall time of the reference (fp32 on the host) and of each variant, the total, and
total / target (<= 1.0 meets it).
"""
import argparse
import json
import time
from pathlib import Path

import cubesim as cs

TARGET_S = 120.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "examples/numerics/llm_24_layers.json"))
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--json")
    a = ap.parse_args()
    t0 = time.monotonic()
    rep = cs.numerics.run(a.config, sets=a.set)
    total = time.monotonic() - t0
    wall = rep.pop("_wall_s")
    m = rep["config"]["model"]
    print(f"numerics study: {m['layers']} layers, hidden {m['hidden']}, ffn {m['ffn']}, {m['tokens']} tokens, tp {m['tp']}, "
          f"{len(rep['variants'])} variants")
    for name, s in wall.items():
        backend = "host" if name == "reference" else rep["variants"][name]["config"]["run"]["backend"]
        print(f"  {name:45s} {backend:5s} {s:7.1f} s")
    print(f"total {total:.1f} s; target {TARGET_S:.0f} s: ratio {total / TARGET_S:.2f} "
          f"({'met' if total <= TARGET_S else 'NOT met'})")
    print(cs.numerics.format_summary(rep))
    if a.json:
        Path(a.json).write_text(json.dumps({"bench": "bench_numerics", "model": m, "wall_s": wall, "total_s": total,
                                            "target_s": TARGET_S, "ratio": total / TARGET_S,
                                            "summary": {k: v.get("summary") for k, v in rep["variants"].items()}},
                                           indent=1) + "\n")


if __name__ == "__main__":
    main()
