"""Shared fixtures for the Python tests: seeded random data (never constant fills)."""
import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    # A stable seed per test (crc32 of its id), so a failure reproduces.
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
