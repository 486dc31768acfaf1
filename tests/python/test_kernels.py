"""det_gemm and its backward helpers on numpy arrays: the fast kernel equals the scalar definition
bit for bit, a row never depends on the rest of the batch, views cost no copy, and the values
agree with float64 numpy within the rounding of the inputs."""
import numpy as np
import pytest

import cubesim as cs

SHAPES = [(1, 1, 1), (7, 5, 3), (33, 17, 65), (64, 96, 48), (130, 7, 200)]


def operands(rng, m, k, n, dtype):
    a = cs.round_to(dtype, rng.standard_normal((m, k)).astype(np.float32))
    b = cs.round_to(dtype, rng.standard_normal((k, n)).astype(np.float32))
    return a, b


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("out_dtype", ["f32", "bf16"])
def test_fast_equals_reference_bitwise(m, k, n, dtype, out_dtype, rng):
    a, b = operands(rng, m, k, n, dtype)
    bias = rng.standard_normal(n).astype(np.float32)
    ref = cs.det_gemm(a, b, bias, dtype=dtype, out_dtype=out_dtype, reference=True, bits=True)
    for threads in (1, 2):
        got = cs.det_gemm(a, b, bias, dtype=dtype, out_dtype=out_dtype, threads=threads, bits=True)
        np.testing.assert_array_equal(got, ref)
    vals = cs.det_gemm(a, b, bias, dtype=dtype, out_dtype=out_dtype)
    np.testing.assert_array_equal(vals, cs.from_bits(ref, out_dtype))
    exact = a.astype(np.float64) @ b.astype(np.float64) + bias
    tol = 2.0 ** -7 if out_dtype == "bf16" else 1e-5
    np.testing.assert_allclose(vals, exact, rtol=tol, atol=tol * np.abs(exact).max())


def test_rows_are_batch_invariant(rng):
    a, b = operands(rng, 97, 64, 40, "bf16")
    full = cs.det_gemm(a, b, dtype="bf16", bits=True)
    for i in rng.choice(97, 6, replace=False):
        one = cs.det_gemm(a[i : i + 1], b, dtype="bf16", bits=True)
        np.testing.assert_array_equal(one[0], full[i])
    padded = np.concatenate([a[:10], rng.standard_normal((5, 64)).astype(np.float32)])
    np.testing.assert_array_equal(cs.det_gemm(padded, b, dtype="bf16", bits=True)[:10], full[:10])


def test_views_and_bit_inputs_give_the_same_bits(rng):
    x = cs.round_to("bf16", rng.standard_normal((24, 40)).astype(np.float32))
    w = cs.round_to("bf16", rng.standard_normal((16, 40)).astype(np.float32))  # [out, in]
    y_view = cs.det_gemm(x, w.T, dtype="bf16", bits=True)  # strided operand, no copy
    y_copy = cs.det_gemm(x, np.ascontiguousarray(w.T), dtype="bf16", bits=True)
    y_bits = cs.det_gemm(cs.to_bits(x, "bf16"), cs.to_bits(w, "bf16").T, dtype="bf16", bits=True)
    np.testing.assert_array_equal(y_view, y_copy)
    np.testing.assert_array_equal(y_view, y_bits)
    h = rng.standard_normal((24, 40)).astype(np.float16)  # float16 arrays are f16 in place
    np.testing.assert_array_equal(cs.det_gemm(h, w.T), cs.det_gemm(h.astype(np.float32), w.T, dtype="f16"))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_backward_helpers(dtype, rng):
    m, k, n = 37, 29, 23
    a, b = operands(rng, m, k, n, dtype)
    dc = cs.round_to(dtype, rng.standard_normal((m, n)).astype(np.float32))
    da = cs.det_gemm_backward_input(dc, b, dtype=dtype, bits=True)
    np.testing.assert_array_equal(da, cs.det_gemm_backward_input(dc, b, dtype=dtype, reference=True, bits=True))
    db = cs.det_gemm_backward_weight(a, dc, dtype=dtype, threads=2, bits=True)
    np.testing.assert_array_equal(db, cs.det_gemm_backward_weight(a, dc, dtype=dtype, reference=True, bits=True))
    assert da.shape == (m, k) and db.shape == (k, n)
    np.testing.assert_allclose(cs.from_bits(da, "f32"), dc.astype(np.float64) @ b.T.astype(np.float64), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(cs.from_bits(db, "f32"), a.T.astype(np.float64) @ dc.astype(np.float64), rtol=1e-4, atol=1e-4)
    g = cs.det_gemm_bias_grad(dc, dtype=dtype)
    acc = np.zeros(n, dtype=np.float32)
    for row in dc:  # ascending m, f32 additions from +0
        acc = (acc + row).astype(np.float32)
    np.testing.assert_array_equal(g, acc)


def test_errors_name_the_operands():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(ValueError, match="3x4.*3x4|4.*3"):
        cs.det_gemm(a, a)
    with pytest.raises(ValueError, match="b must be 2-D, got shape \\(4\\)"):
        cs.det_gemm(a, a[0])
    with pytest.raises(ValueError, match="uint16 array .*dtype='bf16' or dtype='f16'"):
        cs.det_gemm(a.astype(np.uint16), a.T.astype(np.uint16))
    with pytest.raises(ValueError, match="threads must be >= 1"):
        cs.det_gemm(a, a.T, threads=0)
    assert isinstance(cs.cpu_has_avx2_fma(), bool)
