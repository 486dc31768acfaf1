"""cubesim: a discrete-event simulator of accelerator systems with a tensor-parallel runtime.

The compiled extension `_cubesim` holds the simulator; this package re-exports it. Build with
`make` and put `build/python` on PYTHONPATH (the Makefile does this for `make test`).
"""
from . import _cubesim
from ._cubesim import core

__all__ = ["core"]
__version__ = "0.1.0"
