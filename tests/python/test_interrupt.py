"""Ctrl-C (sim/core/interrupt.h): a SIGINT stops a running simulation between events. The CLI prints
how far it got and exits 130; in Python the call raises KeyboardInterrupt and the context runs
again. The signal is sent once the run is under way (the process has spent CPU time in it); no
wall-clock time is asserted."""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import cubesim as cs

PKG_ROOT = Path(cs.__file__).resolve().parent.parent  # build/python
# A timing-only MLP step of several seconds on the 2-core CI machine (about 7 s here).
LONG = ["--topology", "h200x8", "--tp", "8", "--hidden", "4096", "--ffn", "14336", "--tokens", "4096",
        "--timing-only", "--algorithm", "nccl"]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_ctrl_c_stops_cubesim_run_and_exits_130():
    env = dict(os.environ, PYTHONPATH=str(PKG_ROOT), CUBESIM_PROGRESS="0")
    # The child gets SIGINT's default disposition even where this test runs with it ignored (a
    # background job): an ignored SIGINT stays ignored, by design.
    p = subprocess.Popen([sys.executable, "-m", "cubesim", "run", *LONG], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # Start-up (imports, the topology) takes well under a second of CPU; wait for the run.
        deadline = time.monotonic() + 120
        while p.poll() is None and cpu_seconds(p.pid) < 2.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.poll() is None, "the run ended before it could be interrupted: make LONG longer"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, (out, err)
    assert "interrupted (SIGINT) at simulated time" in err, err
    assert "Traceback" not in err and "simulated time:" not in out


@pytest.fixture
def python_sigint_handler():
    """Python's own SIGINT handler for the test, whatever this process inherited (a background
    job starts with SIGINT ignored)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_in_python_raises_keyboard_interrupt_and_the_context_runs_again(python_sigint_handler):
    ctx = cs.Context("sim", topology="h200x8", world_size=8, timing_only=True, algorithm="nccl")
    main_pid = os.getpid()
    start = time.process_time()

    def send_when_running():
        while time.process_time() - start < 1.5:  # this process's CPU time: the run is under way
            time.sleep(0.05)
        os.kill(main_pid, signal.SIGINT)

    t = threading.Thread(target=send_when_running, daemon=True)
    t.start()
    with pytest.raises(KeyboardInterrupt, match=r"interrupted \(SIGINT\) at simulated time .* the context can run"):
        cs.tp.run_mlp(ctx, tp=8, tokens=4096, hidden=4096, ffn=14336, dtype="bf16")
    t.join()
    # Python's own handler is back, and the same context runs a small step to the end.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    report = cs.tp.run_mlp(ctx, tp=8, tokens=64, hidden=256, ffn=1024, dtype="bf16")
    assert report.sim_time_ps > 0
