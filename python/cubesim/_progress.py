"""A tiny progress indicator on stderr for jobs that take more than a couple of seconds.

    with Progress("simulating") as p:        # indeterminate: a bouncing bar and the elapsed time
        long_call()                          # (the GIL is released while C++ runs, so it animates)
    with Progress("sweep", total=10) as p:   # determinate: a filling bar, done/total
        for i in range(10): ...; p.update(i + 1)

Nothing is drawn before `delay` seconds, nor when stderr is not a terminal (set CUBESIM_PROGRESS=1
to force it, 0 to silence it). The line is cleared when the block ends, so output stays clean.
"""
import os
import sys
import threading
import time


def _enabled(stream):
    env = os.environ.get("CUBESIM_PROGRESS")
    if env is not None:
        return env not in ("", "0", "no", "off")
    return hasattr(stream, "isatty") and stream.isatty()


def _duration(s):
    s = int(round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
    WIDTH = 24

    def __init__(self, label, total=None, delay=2.0, stream=None, enabled=None, interval=0.1):
        self.label = label
        self.total = total
        self.done = 0
        self.delay = delay
        self.interval = interval
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _enabled(self.stream) if enabled is None else enabled
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._shown = False
        self._start = None

    def __enter__(self):
        self._start = time.monotonic()
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="cubesim-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._clear()
        return False

    def update(self, done=None, label=None):
        with self._lock:
            if done is not None:
                self.done = done
            if label is not None:
                self.label = label

    def print(self, line, file=None):
        """Prints a line of output without tearing the progress line."""
        out = file if file is not None else sys.stdout
        with self._lock:
            self._clear()
            out.write(line if line.endswith("\n") else line + "\n")
            out.flush()
            if self._shown:
                self._draw()

    def render(self, elapsed):
        """The progress line for `elapsed` seconds (no newline)."""
        if self.total:
            frac = min(max(self.done / self.total, 0.0), 1.0)
            fill = int(round(frac * self.WIDTH))
            bar = "#" * fill + "-" * (self.WIDTH - fill)
            eta = ""
            if 0 < self.done < self.total:
                eta = f", ETA {_duration(elapsed / self.done * (self.total - self.done))}"
            return f"{self.label} [{bar}] {self.done}/{self.total}  {elapsed:.1f} s{eta}"
        # Indeterminate: a block bouncing across the bar.
        span = self.WIDTH - 4
        pos = int(elapsed / self.interval) % (2 * span)
        pos = pos if pos < span else 2 * span - pos
        bar = " " * pos + "====" + " " * (span - pos)
        return f"{self.label} [{bar}] {elapsed:.1f} s"

    def _run(self):
        if self._stop.wait(self.delay):
            return
        while not self._stop.is_set():
            with self._lock:
                self._shown = True
                self._draw()
            self._stop.wait(self.interval)

    def _draw(self):
        line = self.render(time.monotonic() - self._start)
        self.stream.write("\r" + line + "\x1b[K")
        self.stream.flush()

    def _clear(self):
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
