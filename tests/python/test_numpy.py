"""Tensors to and from numpy: every dtype round-trips; bf16/f16 convert exactly as documented
(round to nearest even, canonical NaN), or travel as bit patterns unchanged."""
import numpy as np
import pytest

import cubesim as cs

BACKENDS = ["sim", "host"]


def make_ctx(backend, ranks=1):
    if backend == "sim":
        return cs.Context("sim", topology="ring4", world_size=ranks)
    return cs.Context("host", world_size=ranks)


def bf16_bits_reference(x):
    """f32 -> bf16 bits, round to nearest even, NaN -> 0x7fff (an independent numpy version)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FFF), r)


def interesting_f32(rng, n=4096):
    v = np.concatenate(
        [
            rng.standard_normal(n).astype(np.float32) * np.float32(10.0) ** rng.integers(-40, 38, n).astype(np.float32),
            np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65520, 65519.996, 1e-8, 6e-8, 3e-8, -3e-8,
                      3.3895314e38, 3.4e38, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-9], dtype=np.float32),
        ]
    )
    # Ties: values exactly halfway between two bf16 numbers.
    halves = (rng.integers(0, 1 << 15, 256, dtype=np.uint32) << 16 | 0x8000).view(np.float32)
    return np.concatenate([v, halves]).astype(np.float32)


def test_to_bits_bf16_matches_round_to_nearest_even(rng):
    x = interesting_f32(rng)
    with np.errstate(invalid="ignore", over="ignore"):
        np.testing.assert_array_equal(cs.to_bits(x, "bf16"), bf16_bits_reference(x))


def test_to_bits_f16_matches_numpy_float16(rng):
    x = interesting_f32(rng)
    with np.errstate(invalid="ignore", over="ignore"):
        expect = x.astype(np.float16).view(np.uint16).copy()
    expect[np.isnan(x)] = 0x7FFF  # CUDA's canonical NaN, sign dropped
    np.testing.assert_array_equal(cs.to_bits(x, "f16"), expect)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_every_16_bit_pattern_widens_exactly(dtype):
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = cs.from_bits(bits, dtype)
    assert got.dtype == np.float32
    if dtype == "bf16":
        expect = (bits.astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_array_equal(got.view(np.uint32), expect.view(np.uint32))  # NaN payloads kept
    else:
        expect = bits.view(np.float16).astype(np.float32)
        nan = np.isnan(expect)
        np.testing.assert_array_equal(got[~nan].view(np.uint32), expect[~nan].view(np.uint32))
        assert (got[nan].view(np.uint32) == 0x7FFFFFFF).all()  # canonical, as the GPU does


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_bit_patterns_round_trip_unchanged(backend, dtype, rng):
    ctx = make_ctx(backend)
    if dtype == "f32":
        bits = rng.integers(0, 1 << 32, size=(33, 17), dtype=np.uint64).astype(np.uint32)
    else:
        bits = rng.integers(0, 1 << 16, size=(33, 17), dtype=np.uint32).astype(np.uint16)
    t = ctx.tensor(0, bits, dtype)
    assert t.dtype == dtype and t.shape == (33, 17) and t.device == 0
    out = t.numpy(bits=True)
    assert out.dtype == bits.dtype and out.shape == bits.shape
    np.testing.assert_array_equal(out, bits)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_values_round_trip_as_rounded(backend, dtype, rng):
    ctx = make_ctx(backend)
    x = rng.standard_normal((7, 45)).astype(np.float32)
    t = ctx.tensor(0, x, dtype)
    got = t.numpy()
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_array_equal(got, cs.round_to(dtype, x))
    np.testing.assert_array_equal(np.asarray(t), got)
    if dtype == "f32":
        np.testing.assert_array_equal(got, x)
    # Stored values survive a second trip exactly.
    np.testing.assert_array_equal(ctx.tensor(0, got, dtype).numpy(), got)


def test_float16_arrays_default_to_f16_and_keep_their_bits(rng):
    ctx = make_ctx("host")
    h = rng.standard_normal(100).astype(np.float16)
    t = ctx.tensor(0, h)
    assert t.dtype == "f16"
    np.testing.assert_array_equal(t.numpy(bits=True), h.view(np.uint16))
    np.testing.assert_array_equal(t.numpy(bits=True).view(np.float16), h)


def test_other_numeric_arrays_convert_by_value(rng):
    ctx = make_ctx("host")
    ints = rng.integers(-1000, 1000, 64)
    np.testing.assert_array_equal(ctx.tensor(0, ints, "f32").numpy(), ints.astype(np.float32))
    d = rng.standard_normal(64)  # float64: rounded once to float32, then to bf16
    np.testing.assert_array_equal(ctx.tensor(0, d, "bf16").numpy(), cs.round_to("bf16", d.astype(np.float32)))
    assert ctx.tensor(0, d).dtype == "f32"


def test_conversion_errors_say_what_is_valid():
    ctx = make_ctx("host")
    with pytest.raises(ValueError, match="uint16 array holds bf16 or f16 bit patterns"):
        ctx.tensor(0, np.zeros(4, dtype=np.uint16) + np.arange(4, dtype=np.uint16))
    with pytest.raises(ValueError, match="must be uint32"):
        ctx.tensor(0, np.arange(4, dtype=np.uint16), "f32")
    with pytest.raises(TypeError, match="cannot convert an array of dtype 'complex128'"):
        ctx.tensor(0, np.arange(4) * 1j, "f32")
    with pytest.raises(ValueError, match="valid"):
        ctx.tensor(0, np.arange(4.0), "fp8")
    with pytest.raises(ValueError, match="rank 5 does not exist; valid ranks are 0 to 0"):
        ctx.tensor(5, np.arange(4.0), "f32")


@pytest.mark.parametrize("backend", BACKENDS)
def test_views_read_like_numpy_slices(backend, rng):
    ctx = make_ctx(backend)
    x = rng.standard_normal((12, 8)).astype(np.float32)
    t = ctx.tensor(0, x, "f32")
    np.testing.assert_array_equal(t.narrow(1, 2, 5).numpy(), x[:, 2:7])
    parts = t.chunk(4, 1)
    assert len(parts) == 4 and not parts[1].is_contiguous()
    np.testing.assert_array_equal(parts[1].numpy(), x[:, 2:4])
    np.testing.assert_array_equal(t.t().numpy(), x.T)
    np.testing.assert_array_equal(t.T.numpy(), x.T)
    np.testing.assert_array_equal(t.reshape([8, 12]).numpy(), x.reshape(8, 12))
    y = rng.standard_normal((12, 8)).astype(np.float32)
    t.copy_from(y)
    np.testing.assert_array_equal(t.numpy(), y)
    assert t.numel == 96 and t.nbytes == 384 and t.ndim == 2 and t.strides == (8, 1)
    assert "f32[12, 8] on rank 0" in repr(t)


def test_tensors_keep_their_context_alive(rng):
    x = rng.standard_normal(256).astype(np.float32)
    t = cs.Context("sim", topology="single_cube").tensor(0, x, "bf16")  # the context is not kept by us
    import gc

    gc.collect()
    np.testing.assert_array_equal(t.numpy(), cs.round_to("bf16", x))
