"""The Python module's view of sim/core: time helpers and an end-to-end scenario."""
import random

import pytest

import cubesim
from cubesim import core


def test_transfer_time_is_exact_ceiling():
    rng = random.Random(7)
    for _ in range(200):
        nbytes = rng.randrange(0, 1 << 40)
        gbps = rng.choice([1, 25, 128, 450, 900, 4800])
        expected = -(-nbytes * 10**12 // (gbps * 10**9))  # ceil in exact integers
        assert core.transfer_time_ps(nbytes, gbps) == expected


def test_errors_arrive_as_python_exceptions_with_the_message():
    with pytest.raises(ValueError, match="bandwidth"):
        core.transfer_time_ps(1024, 0)
    with pytest.raises(ValueError, match="non-negative"):
        core.from_ns(-1.0)
    with pytest.raises(ValueError, match="items must be at least 1"):
        core.run_pipeline([1.0], 0)


def test_format_time():
    assert core.format_time(1_250_000) == "1.250 us"
    assert core.format_time(999) == "999 ps"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pipeline_time_has_closed_form(seed):
    # With one-slot buffers and a never-blocking sink, the slowest stage sets the pace:
    # time = sum(service) + (items - 1) * max(service).
    rng = random.Random(seed)
    service = [float(rng.randrange(1, 50)) for _ in range(rng.randrange(1, 6))]
    items = rng.randrange(1, 40)
    r = core.run_pipeline(service, items)
    expected_ns = sum(service) + (items - 1) * max(service)
    assert r["sim_time_ps"] == round(expected_ns * 1000)
    busy = {t["name"]: t["busy_ps"] for t in r["tracks"]}
    for i, s in enumerate(service):
        assert busy[f"stage{i}"] == round(s * 1000) * items


def test_pipeline_is_deterministic():
    a = core.run_pipeline([3.0, 7.0, 2.0], 25, trace=True)
    b = core.run_pipeline([3.0, 7.0, 2.0], 25, trace=True)
    assert a == b


def test_version():
    assert cubesim.__version__
