"""fp8 KV caches through the binding: plan(kv_data_type=...) and run(k_scale=, v_scale=) on the CPU backend
against the float64 reference (numpy uint8 codes, ml_dtypes' and torch's float8 types when installed), the
FlashInfer-style wrapper, the append's quantization (every code against a brute-force nearest-code search,
saturation), page copies, and the errors; on a GPU the CUDA backend's fp8 kernel on torch tensors too.

Run: PKV_LIBRARY=build/libpersistentkv.so python3 -m pytest -q python/tests/test_fp8.py
"""

import os
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import persistentkv as pkv  # noqa: E402
from persistentkv import PkvError, Status, flashinfer  # noqa: E402
from test_binding import assert_close, to_dtype, to_f64  # noqa: E402

FORMATS = {"float8_e4m3fn": (False, 448.0), "float8_e5m2": (True, 57344.0)}


# ---- fp8 in numpy: decoding every code, and the nearest code by brute force --------------------------
def decode(codes, e5m2):
    """float64 values of fp8 codes (NaN codes NaN, e5m2 infinities inf)."""
    c = np.asarray(codes, np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    mbits, bias = (2, 15) if e5m2 else (3, 7)
    e = (c & 0x7F) >> mbits
    m = c & ((1 << mbits) - 1)
    val = np.where(e == 0, m * 2.0 ** (1 - bias - mbits), (1 + m / 2.0**mbits) * 2.0 ** (e - bias))
    if e5m2:
        val = np.where(e == 31, np.where(m == 0, np.inf, np.nan), val)
    else:
        val = np.where((e == 15) & (m == 7), np.nan, val)
    return sign * val


def encode(x, e5m2):
    """The code nearest to each float32 x (ties to the even code), saturating at the largest finite; NaN -> a NaN
    code (checked as NaN only)."""
    x = np.asarray(x, np.float64).ravel()
    codes = np.arange(128)
    mags = decode(codes, e5m2)
    finite = np.isfinite(mags)
    codes, mags = codes[finite], mags[finite]
    top = mags.max()
    a = np.minimum(np.abs(x), top)
    dist = np.abs(a[:, None] - mags[None, :])
    best = dist.min(axis=1, keepdims=True)
    tie = dist == best
    pick = np.where(tie.sum(axis=1) > 1, np.argmax(tie & (codes[None, :] % 2 == 0), axis=1), np.argmin(dist, axis=1))
    out = codes[pick] | np.where(np.signbit(x), 0x80, 0)
    return np.where(np.isnan(x), 0x7F, out).astype(np.uint8)


def random_codes(rng, shape, e5m2):
    """fp8 codes of magnitude up to 2, never zero nor NaN, random signs."""
    mag = rng.integers(1, 0x40, shape)
    return (mag | (rng.integers(0, 2, shape) << 7)).astype(np.uint8)


def make_problem(seed, lens, hq, hkv, fmt, d=64, ps=16, layout="NHD", dtype="float16", heads=False):
    rng = np.random.default_rng(seed)
    lens = np.asarray(lens, np.int32)
    pages = (lens + ps - 1) // ps + rng.integers(0, 2, len(lens))
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    pool = int(indptr[-1]) + 5
    indices = rng.permutation(pool)[: indptr[-1]].astype(np.int32)
    shape = (pool, ps, hkv, d) if layout == "NHD" else (pool, hkv, ps, d)
    e5m2 = FORMATS[fmt][0]
    k, v = random_codes(rng, shape, e5m2), random_codes(rng, shape, e5m2)
    q = to_dtype(rng.standard_normal((len(lens), hq, d), dtype=np.float32), dtype)
    if heads:
        ks = rng.uniform(0.01, 0.6, hkv).astype(np.float32)
        vs = rng.uniform(0.01, 0.6, hkv).astype(np.float32)
    else:
        ks, vs = float(rng.uniform(0.01, 0.6)), float(rng.uniform(0.01, 0.6))
    return dict(q=q, k=k, v=v, indptr=indptr, indices=indices, lens=lens, hq=hq, hkv=hkv, d=d, ps=ps, pool=pool,
                layout=layout, dtype=dtype, fmt=fmt, ks=ks, vs=vs)


def ref_of(p, k=None, v=None):
    return pkv.reference(p["q"], p["k"] if k is None else k, p["v"] if v is None else v, p["indptr"], p["indices"],
                         p["lens"], kv_layout=p["layout"], q_data_type=p["dtype"], kv_data_type=p["fmt"],
                         k_scale=p["ks"], v_scale=p["vs"])


def plan(w, p, **kw):
    w.plan(p["indptr"], p["indices"], p["lens"], p["hq"], p["hkv"], p["d"], p["ps"], num_pages=p["pool"],
           q_data_type=p["dtype"], kv_data_type=p["fmt"], **kw)


LENS = [0, 1, 17, 48, 130, 257, 3]


@pytest.fixture(scope="module")
def cpus():
    return {lay: pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cpu", kv_layout=lay, num_threads=2)
            for lay in ("NHD", "HND")}


# ---- decode ----------------------------------------------------------------------------------------------
def test_numpy_codec_matches_the_library_definition():
    """decode/encode above agree with the formats' known values (the library's conversions are test_fp8.c's)."""
    assert decode([0x7E, 0x38, 0x01, 0x80], False).tolist()[:3] == [448.0, 1.0, 2.0**-9]
    assert decode([0x7B, 0x3C], True).tolist() == [57344.0, 1.0]
    assert np.isnan(decode([0x7F], False))[0] and np.isinf(decode([0x7C], True))[0]
    assert encode([1e9, -1e9, 1.0, 0.0], False).tolist() == [0x7E, 0xFE, 0x38, 0x00]
    assert encode([1e9], True).tolist() == [0x7B]


@pytest.mark.parametrize("route", pkv.ROUTES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("heads", [False, True], ids=["per_tensor", "per_head"])
def test_routes_match_reference(cpus, route, layout, fmt, heads):
    dtype = "bfloat16" if heads else "float16"
    p = make_problem(zlib.crc32(repr((route, layout, fmt, heads)).encode()), LENS, 8, 2, fmt, ps=1 if heads else 16,
                     layout=layout, dtype=dtype, heads=heads)
    w = cpus[layout]
    plan(w, p, route=route, parallelism=32, min_chunk_tokens=16)
    o, lse = w.run(p["q"], p["k"], p["v"], return_lse=True, k_scale=p["ks"], v_scale=p["vs"])
    assert o.dtype == p["q"].dtype
    assert_close(o, lse, ref_of(p), dtype, p["lens"])
    assert w.counters["kv_bytes"] == int(np.sum(p["lens"])) * p["hkv"] * p["d"] * 2  # one byte per element


def test_scales_at_run_time_one_plan_two_layers(cpus):
    """Scales are run() arguments: one plan serves layers whose scales differ; 1.0 when None."""
    p = make_problem(5, LENS, 8, 2, "float8_e4m3fn")
    w = cpus["NHD"]
    plan(w, p)
    for ks, vs in ((0.25, 0.5), (0.03, 0.7), (None, None)):
        q = dict(p, ks=1.0 if ks is None else ks, vs=1.0 if vs is None else vs)
        assert_close(w.run(p["q"], p["k"], p["v"], k_scale=ks, v_scale=vs), None, ref_of(q), "float16", p["lens"])
    # a one-element array is a per-tensor scale
    assert_close(w.run(p["q"], p["k"], p["v"], k_scale=np.array([0.25], np.float32), v_scale=np.float32(0.5)), None,
                 ref_of(dict(p, ks=0.25, vs=0.5)), "float16", p["lens"])


def test_interleaved_cache(cpus):
    p = make_problem(9, LENS, 4, 2, "float8_e5m2", layout="HND")
    kv = np.stack([p["k"], p["v"]], axis=1)  # [pool, 2, Hkv, ps, d]
    w = cpus["HND"]
    plan(w, p, route="fused", parallelism=32, min_chunk_tokens=16)
    assert_close(w.run(p["q"], kv, k_scale=p["ks"], v_scale=p["vs"]), None, ref_of(p), "float16", p["lens"])
    assert_close(w.run(p["q"], (kv[:, 0], kv[:, 1]), k_scale=p["ks"], v_scale=p["vs"]), None, ref_of(p), "float16",
                 p["lens"])


def test_ml_dtypes_float8(cpus):
    ml = pytest.importorskip("ml_dtypes")
    p = make_problem(11, LENS, 8, 1, "float8_e4m3fn")
    w = cpus["NHD"]
    w.plan(p["indptr"], p["indices"], p["lens"], 8, 1, 64, 16, num_pages=p["pool"], kv_data_type=ml.float8_e4m3fn)
    k, v = p["k"].view(ml.float8_e4m3fn), p["v"].view(ml.float8_e4m3fn)
    assert_close(w.run(p["q"], k, v, k_scale=p["ks"], v_scale=p["vs"]), None, ref_of(p), "float16", p["lens"])
    with pytest.raises(TypeError):  # e5m2 codes for an e4m3 plan
        w.run(p["q"], p["k"].view(ml.float8_e5m2), p["v"].view(ml.float8_e5m2))


def test_torch_float8_cpu_tensors(cpus):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e5m2"):
        pytest.skip("this torch has no float8 types")
    p = make_problem(13, LENS, 8, 2, "float8_e5m2")
    w = cpus["NHD"]
    w.plan(torch.as_tensor(p["indptr"]), torch.as_tensor(p["indices"]), torch.as_tensor(p["lens"]), 8, 2, 64, 16,
           num_pages=p["pool"], kv_data_type=torch.float8_e5m2)
    k = torch.from_numpy(p["k"]).view(torch.float8_e5m2)
    v = torch.from_numpy(p["v"]).view(torch.float8_e5m2)
    q = torch.from_numpy(p["q"])
    o = w.run(q, k, v, k_scale=p["ks"], v_scale=torch.tensor(p["vs"]))
    assert_close(o.numpy(), None, ref_of(p), "float16", p["lens"])


def test_flashinfer_wrapper_with_fp8(cpus):
    """FlashInfer's names: plan(..., kv_data_type=fp8) and run(..., k_scale=, v_scale=)."""
    p = make_problem(17, [5, 0, 40, 33], 8, 2, "float8_e4m3fn")
    last = np.where(p["lens"] > 0, (p["lens"] - 1) % 16 + 1, 0).astype(np.int32)  # FlashInfer's last_page_len
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(np.empty(1 << 20, np.uint8), "NHD", backend_device="cpu")
    indptr = np.concatenate([[0], np.cumsum((p["lens"] + 15) // 16)]).astype(np.int32)  # no spare pages
    indices = np.concatenate([p["indices"][p["indptr"][i]:p["indptr"][i] + (indptr[i + 1] - indptr[i])]
                              for i in range(4)]).astype(np.int32)
    w.plan(indptr, indices, last, 8, 2, 64, 16, q_data_type="float16", kv_data_type="float8_e4m3fn")
    o, lse = w.run(p["q"], (p["k"], p["v"]), k_scale=p["ks"], v_scale=p["vs"], return_lse=True)
    ro, rl = pkv.reference(p["q"], p["k"], p["v"], indptr, indices, p["lens"], q_data_type="float16",
                           kv_data_type="float8_e4m3fn", k_scale=p["ks"], v_scale=p["vs"])
    assert_close(o, lse / np.log2(np.e), (ro, rl), "float16", p["lens"])  # FlashInfer's lse is base 2
    with pytest.raises(PkvError) as e:
        w.run(p["q"], (p["k"], p["v"]), q_scale=0.5)
    assert e.value.status == Status.UNSUPPORTED


# ---- append and copy ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("heads", [False, True], ids=["per_tensor", "per_head"])
def test_append_quantizes_with_saturation(fmt, dtype, heads):
    rng = np.random.default_rng(len(fmt) * 7 + len(dtype) + heads)
    e5m2, top = FORMATS[fmt]
    P, ps, H, d = 12, 4, 2, 64
    kc = np.zeros((P, ps, H, d), np.uint8)
    vc = np.zeros_like(kc)
    pool = pkv.PagePool(P, ps, 2)
    pool.create(0, 7)
    pool.create(1, 3)
    indptr, indices, last, lens = pool.table([0, 1])
    nnz = 10
    scale = rng.uniform(0.05, 0.5, H).astype(np.float32) if heads else np.float32(0.125)
    s = scale if heads else np.full(H, scale, np.float32)
    x = rng.uniform(-1.0, 1.0, (nnz, H, d)).astype(np.float32) * np.float32(0.8 * top) * s[None, :, None]
    x[0, 0, :8] = np.float32(3.0 * top) * s[0] * np.sign(x[0, 0, :8])  # beyond the range after the division
    k = to_dtype(x, dtype)
    v = to_dtype(-x, dtype)
    pkv.append_kv(k, v, (kc, vc), indptr, indices, seq_lens=lens, append_indptr=np.array([0, 7, 10], np.int32),
                  kv_data_type=fmt, k_scale=scale, v_scale=scale)
    bidx, pos = pkv.get_batch_indices_positions(np.array([0, 7, 10], np.int32), lens, nnz)
    for t in range(nnz):
        page, slot = indices[indptr[bidx[t]] + pos[t] // ps], pos[t] % ps
        for h in range(H):
            want_k = encode((to_f64(k[t, h], dtype).astype(np.float32) / s[h]).astype(np.float32), e5m2)
            want_v = encode((to_f64(v[t, h], dtype).astype(np.float32) / s[h]).astype(np.float32), e5m2)
            assert np.array_equal(kc[page, slot, h], want_k), (t, h)
            assert np.array_equal(vc[page, slot, h], want_v), (t, h)
    first = indices[0]
    assert np.all(np.abs(decode(kc[first, 0, 0, :8], e5m2)) == top)  # saturated, read back exactly
    # copy-on-write copies move the bytes
    spare = [pg for pg in range(P) if pg not in set(indices.tolist())][0]
    pkv.copy_pages([(int(indices[0]), spare)], (kc, vc))
    assert np.array_equal(kc[spare], kc[indices[0]]) and np.array_equal(vc[spare], vc[indices[0]])


def test_append_errors():
    kc = np.zeros((4, 4, 1, 64), np.uint8)
    vc = np.zeros_like(kc)
    k = np.ones((1, 1, 64), np.float16)
    args = (k, k, (kc, vc), np.array([0, 1], np.int32), np.array([2], np.int32))
    with pytest.raises(TypeError, match="kv_data_type"):  # uint8 codes of which format?
        pkv.append_kv(*args, seq_lens=np.array([1], np.int32))
    for bad in (float("nan"), -1.0, float("inf")):
        with pytest.raises(PkvError) as e:
            pkv.append_kv(*args, seq_lens=np.array([1], np.int32), kv_data_type="fp8", k_scale=bad)
        assert e.value.status == Status.INVALID_ARGUMENT
    pkv.append_kv(*args, seq_lens=np.array([1], np.int32), kv_data_type="fp8_e4m3", v_scale=0.5)
    assert (kc[2, 0, 0] == 0x38).all() and (vc[2, 0, 0] == 0x40).all()  # 1.0, and 1.0 / 0.5 = 2.0


# ---- errors ------------------------------------------------------------------------------------------
def test_errors(cpus):
    p = make_problem(23, [7, 30], 4, 2, "float8_e4m3fn")
    w = cpus["NHD"]
    plan(w, p)
    for bad in (float("nan"), float("inf"), -0.5):
        with pytest.raises(PkvError) as e:
            w.run(p["q"], p["k"], p["v"], k_scale=bad)
        assert e.value.status == Status.INVALID_ARGUMENT and "k_scale" in e.value.message
    with pytest.raises(PkvError) as e:
        w.run(p["q"], p["k"], p["v"], v_scale=np.array([0.5, np.nan], np.float32))
    assert e.value.status == Status.INVALID_ARGUMENT and "v_head_scales[1]" in e.value.message
    with pytest.raises(ValueError, match="num_kv_heads"):
        w.run(p["q"], p["k"], p["v"], k_scale=np.ones(3, np.float32))
    with pytest.raises(TypeError):  # float16 caches for an fp8 plan
        w.run(p["q"], p["k"].astype(np.float16), p["v"].astype(np.float16))
    with pytest.raises(ValueError):
        w.plan(p["indptr"], p["indices"], p["lens"], 4, 2, 64, 16, kv_data_type="float32")
    with pytest.raises(ValueError):
        w.plan(p["indptr"], p["indices"], p["lens"], 4, 2, 64, 16, q_data_type="float8_e4m3fn")
    # a float16 cache takes no scale but 1
    w.plan(p["indptr"], p["indices"], p["lens"], 4, 2, 64, 16, num_pages=p["pool"])
    k16, v16 = (np.ones(p["k"].shape, np.float16) for _ in range(2))
    w.run(p["q"], k16, v16, k_scale=1.0)
    with pytest.raises(PkvError) as e:
        w.run(p["q"], k16, v16, k_scale=0.5)
    assert e.value.status == Status.INVALID_ARGUMENT and "fp8" in e.value.message


@pytest.mark.parametrize("route", pkv.ROUTES)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_cuda_backend_matches_reference(route, fmt):
    """The CUDA backend's fp8 kernel on torch tensors (codes viewed as torch's float8 types; per-head scales as
    device tensors), against the float64 reference."""
    if not pkv.cuda_available():
        pytest.skip("no CUDA device (or a build without CUDA)")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    for heads, layout, dtype in ((False, "NHD", "float16"), (True, "HND", "bfloat16")):
        p = make_problem(zlib.crc32(repr(("cuda", route, fmt, heads)).encode()), LENS, 8, 2, fmt, d=128,
                         layout=layout, dtype=dtype, heads=heads)
        w = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cuda", kv_layout=layout)
        plan(w, p, route=route)
        tdt = getattr(torch, fmt)
        dev = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()
        k, v = dev(p["k"]).view(tdt), dev(p["v"]).view(tdt)
        q = dev(p["q"]) if dtype == "float16" else dev(p["q"].view(np.int16)).view(torch.bfloat16)
        ks = dev(p["ks"]) if heads else p["ks"]
        vs = dev(p["vs"]) if heads else p["vs"]
        o, lse = w.run(q, k, v, return_lse=True, k_scale=ks, v_scale=vs)
        torch.cuda.synchronize()
        o_np = o.cpu().numpy() if dtype == "float16" else o.view(torch.int16).cpu().numpy().view(np.uint16)
        assert_close(o_np, lse.cpu().numpy(), ref_of(p), dtype, p["lens"])
