#!/usr/bin/env python3
"""bench_sweep: sweep throughput, the thread and process executors (and MPI) against the single-case
rate in the same run (issue 15: >= 90% of workers x single-case rate; MPI >= 85% from 1 to N).

    PYTHONPATH=build/python /usr/bin/python3 benches/bench_sweep.py [--cases 1000] [--jobs N]
        [--mpi 1,2,4] [--json FILE]          (also: cubesim sweep bench ...)
"""
import sys

from cubesim.cli import main

sys.exit(main(["sweep", "bench"] + sys.argv[1:]))
