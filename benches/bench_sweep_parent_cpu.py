"""The sweep's parent process: its CPU per case while the process executor runs the bench's cases.

    PYTHONPATH=build/python /usr/bin/python3 benches/bench_sweep_parent_cpu.py [CASES [JOBS]]

Prints one JSON line: parent_ms (getrusage(RUSAGE_SELF) around sweep.run, every thread: plan, database,
driver, executor), drive_ms (the same around the driver alone: what competes with the workers for
cores), children_ms (RUSAGE_CHILDREN: the workers), rate (cases/s of the sweep's elapsed_s).
"""
import json
import resource
import sys
import tempfile
from pathlib import Path

from cubesim import sweep


def cpu(who):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 600
    jobs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    spec = sweep.bench_spec(n)
    sweep.plan(spec)  # the topology's first load, outside the figure
    drive = {}
    real = sweep._drive

    def timed_drive(*a, **k):
        c0 = cpu(resource.RUSAGE_SELF)
        try:
            return real(*a, **k)
        finally:
            drive["s"] = cpu(resource.RUSAGE_SELF) - c0

    sweep._drive = timed_drive
    with tempfile.TemporaryDirectory() as tmp:
        s0, c0 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
        rows = sweep.run(spec, Path(tmp) / "p.db", executor="process", jobs=jobs)
        s1, c1 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
    print(json.dumps({"cases": n, "jobs": jobs, "ok": sum(r["status"] == "ok" for r in rows),
                      "parent_ms": round((s1 - s0) / n * 1e3, 3), "drive_ms": round(drive["s"] / n * 1e3, 3),
                      "children_ms": round((c1 - c0) / n * 1e3, 3), "rate": round(n / rows.elapsed_s, 1)}))


if __name__ == "__main__":
    main()
