"""persistentkv.flashinfer: FlashInfer's decode wrapper calls (positional order, keywords, run forms,
base-2 lse) on the CPU backend against the float64 reference, and the refusals of what it lacks."""

import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_binding import (LENS, _from_torch, _to_torch, assert_close, cuda_torch, make_problem,  # noqa: E402,F401
                          ref_of, seed_of)

import persistentkv as pkv  # noqa: E402
from persistentkv import flashinfer  # noqa: E402

LOG2E = 1.0 / math.log(2.0)


def last_page_len_of(p):
    """FlashInfer's third plan() argument: tokens in each row's last page (0 for a row without pages).
    make_problem gives some rows a spare page; FlashInfer's form cannot say that, so those rows get
    their exact page count here (indptr/indices rebuilt)."""
    ps, lens = p["ps"], p["lens"]
    pages = (lens + ps - 1) // ps
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    old = p["indptr"]
    indices = np.concatenate([p["indices"][old[r]:old[r] + pages[r]] for r in range(len(lens))]).astype(np.int32)
    last = np.where(lens > 0, lens - (pages - 1) * ps, 0).astype(np.int32)
    return dict(p, indptr=indptr, indices=indices), last


def fi_wrapper(**kw):
    return flashinfer.BatchDecodeWithPagedKVCacheWrapper(np.zeros(1 << 20, np.uint8), backend_device="cpu", **kw)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_flashinfer_calls_match_reference(layout, dtype):
    p, last = last_page_len_of(make_problem(seed_of("fi", layout, dtype), LENS, 8, 2, layout=layout, dtype=dtype))
    w = fi_wrapper(kv_layout=layout)
    # FlashInfer's positional order: last_page_len third, then heads, head_dim, page_size
    w.plan(p["indptr"], p["indices"], last, p["hq"], p["hkv"], p["d"], p["ps"], q_data_type=dtype)
    o, lse = w.run(p["q"], (p["k"], p["v"]), return_lse=True)
    ro, rl = ref_of(p)
    # lse in base 2, as FlashInfer returns it
    assert_close(o, np.asarray(lse, np.float64) / LOG2E, (ro, rl), dtype, p["lens"])
    o2, lse2 = w.run_return_lse(p["q"], (p["k"], p["v"]))
    assert np.array_equal(o2, o) and np.array_equal(lse2, lse)
    assert np.array_equal(w.run(p["q"], (p["k"], p["v"])), o)
    # the same step through the native wrapper: same plan, same numbers; lse ln -> log2
    n = pkv.BatchDecodeWithPagedKVCacheWrapper(kv_layout=layout, backend="cpu")
    n.plan(p["indptr"], p["indices"], p["lens"], p["hq"], p["hkv"], p["d"], p["ps"], q_data_type=dtype)
    no, nl = n.run(p["q"], p["k"], p["v"], return_lse=True)
    assert n.route == w.native.route
    assert np.array_equal(no, o)
    ok = np.isfinite(nl)
    assert np.allclose(nl[ok] * LOG2E, lse[ok], rtol=0, atol=1e-5) and np.all(np.isneginf(lse[~ok]))


def test_workspace_buffer_is_used_and_outputs_in_place():
    p, last = last_page_len_of(make_problem(seed_of("fi-ws"), LENS, 8, 2))
    buf = np.zeros(1 << 20, np.uint8)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(buf, "NHD", backend_device="cpu")
    w.plan(p["indptr"], p["indices"], last, p["hq"], p["hkv"], p["d"], p["ps"])
    assert w.native._ws is buf and w.native.workspace_size >= w.native.plan_workspace_size
    out = np.full(p["q"].shape, np.nan, np.float16)
    lse = np.full((len(LENS), p["hq"]), np.nan, np.float32)
    r = w.run(p["q"], (p["k"], p["v"]), out=out, lse=lse)
    assert r is out  # return_lse False: o only, lse written in place (base 2)
    ro, rl = ref_of(p)
    assert_close(out, lse.astype(np.float64) / LOG2E, (ro, rl), "float16", p["lens"])
    # a buffer too small for the next plan is replaced by a grown one, not overrun
    w.reset_workspace_buffer(np.zeros(512, np.uint8))
    assert w.native.workspace_size >= w.native.plan_workspace_size


def test_interleaved_cache_deprecated_positional_and_keywords():
    p, last = last_page_len_of(make_problem(seed_of("fi-kv"), LENS, 8, 2, dtype="bfloat16"))
    kv = np.stack([p["k"], p["v"]], axis=1)  # [num_pages, 2, page_size, Hkv, d]
    w = fi_wrapper()
    with pytest.raises(TypeError, match="multiple values"):
        w.plan(p["indptr"], p["indices"], last, p["hq"], p["hkv"], p["d"], p["ps"], "NONE", -1,
               pos_encoding_mode="NONE")
    # FlashInfer's deprecated positional order: pos_encoding_mode, window_left, logits_soft_cap, q_data_type
    w.plan(p["indptr"], p["indices"], last, p["hq"], p["hkv"], p["d"], p["ps"], "NONE", -1, None, "bfloat16",
           non_blocking=True, rope_scale=None, rope_theta=None)
    o = w.forward(p["q"], kv)
    assert_close(o, None, ref_of(p), "bfloat16", p["lens"])
    # data_type (FlashInfer's older name for both dtypes) and kv_data_type equal to q's
    w.begin_forward(p["indptr"], p["indices"], last, p["hq"], p["hkv"], p["d"], p["ps"], data_type="bfloat16",
                    kv_data_type="bfloat16", o_data_type="bfloat16")
    assert np.array_equal(w.run(p["q"], kv), o)
    w.end_forward()
    with pytest.raises(TypeError, match="unexpected keyword"):
        w.plan(p["indptr"], p["indices"], last, p["hq"], p["hkv"], p["d"], p["ps"], num_pages=5)


def test_soft_cap_window_and_scale_as_flashinfer():
    p, last = last_page_len_of(make_problem(seed_of("fi-cap"), [300, 40, 0, 129], 8, 2))
    w = fi_wrapper()
    w.plan(p["indptr"], p["indices"], last, p["hq"], p["hkv"], p["d"], p["ps"], logits_soft_cap=30.0,
           window_left=63, sm_scale=0.1)
    o, lse = w.run(p["q"], (p["k"], p["v"]), return_lse=True, window_left=63)
    ro, rl = pkv.reference(p["q"], p["k"], p["v"], p["indptr"], p["indices"], p["lens"], sm_scale=0.1,
                           logits_soft_cap=30.0, window_left=63)
    assert_close(o, np.asarray(lse, np.float64) / LOG2E, (ro, rl), "float16", p["lens"])
    with pytest.raises(ValueError, match="window_left"):
        w.run(p["q"], (p["k"], p["v"]), window_left=10)
    # logits_soft_cap 0 means none, as in FlashInfer
    w.plan(p["indptr"], p["indices"], last, p["hq"], p["hkv"], p["d"], p["ps"], logits_soft_cap=0.0)
    assert_close(w.run(p["q"], (p["k"], p["v"])), None, ref_of(p), "float16", p["lens"])


def test_split_controls_map_to_routes():
    p, last = last_page_len_of(make_problem(seed_of("fi-split"), [700, 33, 1, 260], 8, 2))
    ref = ref_of(p)
    w = fi_wrapper()
    w.plan(p["indptr"], p["indices"], last, p["hq"], p["hkv"], p["d"], p["ps"], disable_split_kv=True)
    assert w.native.route == "single" and w.native.counters["merge_state_bytes"] == 0
    assert_close(w.run(p["q"], (p["k"], p["v"])), None, ref, "float16", p["lens"])
    w.plan(p["indptr"], p["indices"], last, p["hq"], p["hkv"], p["d"], p["ps"], fixed_split_size=4)
    assert w.native.route == "workqueue"
    # chunks of 4 pages: row 0 (700 tokens, 44 pages) alone makes 11 tasks per KV head
    assert w.native.counters["tasks"] >= 11 * p["hkv"]
    assert_close(w.run(p["q"], (p["k"], p["v"])), None, ref, "float16", p["lens"])


def test_seq_lens_and_block_tables_must_agree():
    p, last = last_page_len_of(make_problem(seed_of("fi-bt"), [70, 16, 0, 5], 8, 2))
    w = fi_wrapper()
    ip, ix = p["indptr"], p["indices"]
    bt = np.full((4, 8), -1, np.int32)
    for r in range(4):
        bt[r, :ip[r + 1] - ip[r]] = ix[ip[r]:ip[r + 1]]
    w.plan(ip, ix, last, p["hq"], p["hkv"], p["d"], p["ps"], seq_lens=p["lens"], block_tables=bt)
    assert_close(w.run(p["q"], (p["k"], p["v"])), None, ref_of(p), "float16", p["lens"])
    bad = bt.copy()
    bad[0, 1] = (bad[0, 1] + 1) % p["pool"]
    with pytest.raises(ValueError, match="block_tables row 0"):
        w.plan(ip, ix, last, p["hq"], p["hkv"], p["d"], p["ps"], block_tables=bad)
    wrong = p["lens"].copy()
    wrong[0] -= 1
    with pytest.raises(ValueError, match=r"seq_lens\[0\]"):
        w.plan(ip, ix, last, p["hq"], p["hkv"], p["d"], p["ps"], seq_lens=wrong)


def unsupported(fn):
    with pytest.raises(pkv.PkvError) as e:
        fn()
    assert e.value.status == pkv.Status.UNSUPPORTED and "not supported by PersistentKV" in str(e.value)


def test_what_persistentkv_lacks_is_refused():
    p, last = last_page_len_of(make_problem(seed_of("fi-no"), [40, 3], 8, 2))
    w = fi_wrapper()
    args = (p["indptr"], p["indices"], last, p["hq"], p["hkv"], p["d"], p["ps"])
    unsupported(lambda: w.plan(*args, pos_encoding_mode="ROPE_LLAMA"))
    unsupported(lambda: w.plan(*args, "ALIBI"))
    unsupported(lambda: w.plan(*args, q_len_per_req=2))
    unsupported(lambda: w.plan(*args, window_right=5))
    unsupported(lambda: w.plan(*args, kv_data_type="float32"))
    unsupported(lambda: w.plan(*args, kv_data_type="nvfp4"))
    unsupported(lambda: w.plan(*args, o_data_type="bfloat16"))
    with pytest.raises(ValueError, match="int32 CUDA tensor in cudagraph mode"):  # FlashInfer's fixed buffers
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(None, use_cuda_graph=True, backend_device="cpu")
    with pytest.raises(ValueError, match="int32 CUDA tensor in cudagraph mode"):
        flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(None, np.zeros(3, np.int32), np.zeros(4, np.int32),
                                                               np.zeros(2, np.int32))
    w.plan(*args)
    kv = (p["k"], p["v"])
    unsupported(lambda: w.run(p["q"], kv, k_scale=0.5))
    unsupported(lambda: w.run(p["q"], kv, v_scale=2.0))
    unsupported(lambda: w.run(p["q"], kv, sinks=np.zeros(p["hq"], np.float32)))
    unsupported(lambda: w.run(p["q"], kv, enable_pdl=False))
    assert_close(w.run(p["q"], kv, q_scale=1.0, k_scale=1.0, enable_pdl=True), None, ref_of(p), "float16",
                 p["lens"])
    with pytest.raises(TypeError):
        w.run(p["q"], kv, 1.0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_as_flashinfer_is_called(cuda_torch, dtype):
    """On the GPU with torch tensors as FlashInfer's users pass them: a 128 MB uint8 workspace, the table
    on the device, one [num_pages, 2, ...] cache; against the reference (lse base 2)."""
    torch = cuda_torch
    p, last = last_page_len_of(make_problem(seed_of("fi-cuda", dtype), LENS, 8, 2, dtype=dtype))
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    assert w.native.backend == "cuda" and w.native._ws is ws
    dev = {n: torch.from_numpy(p[n]).cuda() for n in ("indptr", "indices")}
    w.plan(dev["indptr"], dev["indices"], torch.from_numpy(last).cuda(), 8, 2, 64, 16,
           q_data_type=getattr(torch, dtype))
    q = _to_torch(torch, p["q"], dtype, "cuda")
    kv = torch.stack([_to_torch(torch, p["k"], dtype, "cuda"), _to_torch(torch, p["v"], dtype, "cuda")], dim=1)
    o, lse = w.run(q, kv, return_lse=True)
    torch.cuda.synchronize()
    assert o.is_cuda and o.dtype == q.dtype and lse.is_cuda and lse.dtype == torch.float32
    assert_close(_from_torch(torch, o), lse.cpu().numpy().astype(np.float64) / LOG2E, ref_of(p), dtype, p["lens"])


@pytest.mark.parametrize("form", ["use_cuda_graph", "CUDAGraphBatchDecodeWithPagedKVCacheWrapper"])
def test_cuda_graph_as_flashinfer(cuda_torch, form):
    """use_cuda_graph=True as FlashInfer's users run it: fixed table buffers, a graph captured around run()
    once, then each step plan() (new lengths: empty, one-token, short and split rows) and replay with a new
    q in the captured buffer; against the reference.  A batch of another size is refused."""
    torch = cuda_torch
    from test_binding import to_dtype
    dtype, B, hq, hkv, d = "float16", 4, 8, 2, 64
    full = make_problem(seed_of("fi-graph"), [3000, 700, 40, 1500], hq, hkv, dtype=dtype)
    ps = full["ps"]
    kv = torch.stack([_to_torch(torch, full["k"], dtype, "cuda"), _to_torch(torch, full["v"], dtype, "cuda")], dim=1)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    bufs = dict(paged_kv_indptr_buffer=torch.zeros(B + 1, dtype=torch.int32, device="cuda"),
                paged_kv_indices_buffer=torch.zeros(len(full["indices"]), dtype=torch.int32, device="cuda"),
                paged_kv_last_page_len_buffer=torch.zeros(B, dtype=torch.int32, device="cuda"))
    if form == "use_cuda_graph":
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True, **bufs)
    else:  # FlashInfer's older class: the buffers positional
        w = flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(ws, *bufs.values(), "NHD")
    assert w.is_cuda_graph_enabled
    rng = np.random.default_rng(20261201)

    def step(lens):
        lens = np.asarray(lens, np.int32)
        pages = (lens + ps - 1) // ps
        indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        indices = np.concatenate([full["indices"][full["indptr"][r]:full["indptr"][r] + pages[r]]
                                  for r in range(B)]).astype(np.int32)
        last = np.where(lens > 0, lens - (pages - 1) * ps, 0).astype(np.int32)
        q = to_dtype(rng.standard_normal((B, hq, d), dtype=np.float32), dtype)
        p = dict(full, indptr=indptr, indices=indices, lens=lens, q=q)
        w.plan(torch.from_numpy(indptr).cuda(), torch.from_numpy(indices).cuda(), torch.from_numpy(last).cuda(),
               hq, hkv, d, ps, q_data_type=torch.float16)
        q_static.copy_(_to_torch(torch, q, dtype, "cuda"))
        return p

    q_static = torch.empty((B, hq, d), dtype=torch.float16, device="cuda")
    step(full["lens"])
    w.run(q_static, kv, return_lse=True)  # eager first (the cache's pool is learned here)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o_static, lse_static = w.run(q_static, kv, return_lse=True)
    for k in range(6):
        lens = [int(rng.choice([0, 1, int(rng.integers(2, 60)), int(rng.integers(1, n + 1))])) for n in full["lens"]]
        if k == 0:
            lens = list(full["lens"])
        p = step(lens)
        g.replay()
        torch.cuda.synchronize()
        assert_close(_from_torch(torch, o_static), lse_static.cpu().numpy().astype(np.float64) / LOG2E, ref_of(p),
                     dtype, p["lens"])
    with pytest.raises(ValueError, match="fixed to 4"):
        w.plan(np.array([0, 1, 2], np.int32), full["indices"][:2], np.array([3, 3], np.int32), hq, hkv, d, ps)

