"""The page manager and the append in the Python binding (CPU backend, numpy): PagePool's operations and
errors, its tables, append_paged_kv_cache with FlashInfer's signature (and get_batch_indices_positions),
the ragged and decode forms, copy-on-write through copy_pages, all against a plain numpy scatter."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import persistentkv as pkv  # noqa: E402
from persistentkv import PkvError, Status  # noqa: E402


def test_pool_operations_and_counters():
    pool = pkv.PagePool(num_pages=8, page_size=4, max_requests=4)
    pool.create(0, 6)
    assert list(pool.pages(0)) == [0, 1] and pool.length(0) == 6
    assert pool.extend(0, 1) is None
    pool.fork(0, 1)
    assert pool.page_refs(1) == 2
    assert pool.extend(1, 1) == (1, 2)  # the shared partial page is copied onto the next free page
    assert list(pool.pages_from(1, 1)) == [2] and list(pool.pages_from(1, 2)) == []  # the copy replaced page 1
    with pytest.raises(PkvError):
        pool.pages_from(1, 3)
    s = pool.stats()
    assert s["pages_used"] == 3 and s["pages_shared"] == 1 and s["cow_copies"] == 1 and s["fragmentation"] == 1
    pool.truncate(1, 5)
    indptr, indices, last, lens = pool.table([0, 1])
    assert list(indptr) == [0, 2, 4] and list(indices) == [0, 1, 0, 2]
    assert list(last) == [3, 1] and list(lens) == [7, 5]
    pool.check_table([0, 1], indptr, indices, lens)
    with pytest.raises(PkvError) as e:
        pool.check_table([1, 0], indptr, indices, lens)
    assert e.value.status == Status.FOREIGN_PAGE


def test_pool_errors():
    pool = pkv.PagePool(num_pages=2, page_size=16, max_requests=2)
    with pytest.raises(PkvError) as e:
        pool.extend(0)
    assert e.value.status == Status.UNKNOWN_REQUEST
    pool.create(0, 16)
    pool.free(0)
    for call in (lambda: pool.free(0), lambda: pool.extend(0)):
        with pytest.raises(PkvError) as e:
            call()
        assert e.value.status == Status.REQUEST_FREED and "freed" in e.value.message
    with pytest.raises(PkvError) as e:
        pool.create(1, 33)
    assert e.value.status == Status.POOL_EXHAUSTED
    assert pool.stats()["pages_used"] == 0
    with pytest.raises(PkvError) as e:
        pool.create(5, 1)
    assert e.value.status == Status.UNKNOWN_REQUEST


def _scatter(cache_k, cache_v, k, v, rows, pos, indptr, indices, layout):
    """The numpy reference of an append."""
    ps = cache_k.shape[1] if layout == "NHD" else cache_k.shape[2]
    for t in range(k.shape[0]):
        page = indices[indptr[rows[t]] + pos[t] // ps]
        slot = pos[t] % ps
        if layout == "NHD":
            cache_k[page, slot], cache_v[page, slot] = k[t], v[t]
        else:
            cache_k[page, :, slot], cache_v[page, :, slot] = k[t], v[t]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [np.float16, np.uint16])  # uint16: bf16 bits
def test_append_forms_against_numpy(layout, dtype):
    rng = np.random.default_rng(35)
    P, ps, H, d = 40, 16, 2, 64
    shape = (P, ps, H, d) if layout == "NHD" else (P, H, ps, d)
    kc, vc = np.zeros(shape, dtype), np.zeros(shape, dtype)
    rk, rv = kc.copy(), vc.copy()
    pool = pkv.PagePool(P, ps, 4)
    prompts = [5, 0, 40]
    for r, n in enumerate(prompts):
        pool.create(r, n)
    indptr, indices, last, lens = pool.table([0, 1, 2])
    append_indptr = np.concatenate([[0], np.cumsum(prompts)]).astype(np.int32)
    nnz = int(append_indptr[-1])
    k = rng.integers(1, 30000, (nnz, H, d)).astype(dtype)
    v = rng.integers(1, 30000, (nnz, H, d)).astype(dtype)
    bidx, pos = pkv.get_batch_indices_positions(append_indptr, lens, nnz)
    assert list(bidx[:5]) == [0] * 5 and list(pos[5:8]) == [0, 1, 2]
    pkv.append_paged_kv_cache(k, v, bidx, pos, (kc, vc), indices, indptr, last, kv_layout=layout)
    _scatter(rk, rv, k, v, bidx, pos, indptr, indices, layout)
    assert np.array_equal(kc, rk) and np.array_equal(vc, rv)
    # decode steps: the decode form, with a fork and its copy-on-write
    pool.fork(0, 3)
    for step in range(20):
        copies = [c for c in (pool.extend(r, 1) for r in range(4)) if c]
        pkv.copy_pages(copies, (kc, vc), kv_layout=layout)
        for a, b in copies:
            rk[b], rv[b] = rk[a], rv[a]
        indptr, indices, last, lens = pool.table([0, 1, 2, 3])
        k = rng.integers(1, 30000, (4, H, d)).astype(dtype)
        v = rng.integers(1, 30000, (4, H, d)).astype(dtype)
        pkv.append_kv(k, v, (kc, vc), indptr, indices, kv_last_page_len=last, kv_layout=layout)
        _scatter(rk, rv, k, v, np.arange(4), lens - 1, indptr, indices, layout)
        assert np.array_equal(kc, rk) and np.array_equal(vc, rv), step
    assert pool.stats()["cow_copies"] >= 1


def test_append_interleaved_cache_and_errors():
    P, ps, H, d = 6, 4, 1, 64
    kv = np.zeros((P, 2, ps, H, d), np.float16)  # FlashInfer's / vLLM's one-tensor cache
    pool = pkv.PagePool(P, ps, 2)
    pool.create(0, 3)
    indptr, indices, last, lens = pool.table([0])
    k = np.full((3, H, d), 1.5, np.float16)
    v = np.full((3, H, d), -2.0, np.float16)
    pkv.append_kv(k, v, kv, indptr, indices, seq_lens=lens, append_indptr=np.array([0, 3], np.int32))
    page = indices[0]
    assert (kv[page, 0, :3] == 1.5).all() and (kv[page, 1, :3] == -2.0).all() and (kv[page, :, 3] == 0).all()
    with pytest.raises(PkvError) as e:  # position 3 of a 3-token row
        pkv.append_paged_kv_cache(k[:1], v[:1], np.array([0], np.int32), np.array([3], np.int32), kv, indices,
                                  indptr, last)
    assert e.value.status == Status.BEYOND_LENGTH


def test_cuda_append_from_views_of_a_qkv_output():
    """CUDA: decode appends as a model makes them - k and v fresh strided views of one QKV output at every layer,
    two layers' caches, tables made anew at every step - against the numpy scatter; the calls after a layer's
    first are made from append_kv's memo of checked arguments, so a stale memo shows here as a wrong cache."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or not pkv.cuda_available():
        pytest.skip("no CUDA device (or a library without CUDA)")
    rng = np.random.default_rng(37)
    P, ps, H, d, B, hq = 48, 16, 2, 64, 3, 4
    caches = [(torch.zeros((P, ps, H, d), dtype=torch.float16, device="cuda"),
               torch.zeros((P, ps, H, d), dtype=torch.float16, device="cuda")) for _ in range(2)]
    refs = [(np.zeros((P, ps, H, d), np.float16), np.zeros((P, ps, H, d), np.float16)) for _ in range(2)]
    pool = pkv.PagePool(P, ps, B)
    for r, n in enumerate((5, 16, 33)):
        pool.create(r, n)
    row = (hq + 2 * H) * d
    qkv = torch.empty((B, row), dtype=torch.float16, device="cuda")
    for step in range(40):
        for r in range(B):
            pool.extend(r, 1)
        indptr, indices, last, lens = pool.table(list(range(B)))
        tabs = [torch.from_numpy(np.ascontiguousarray(x, np.int32)).cuda() for x in (indptr, indices, last)]
        for layer in range(2):
            vals = rng.integers(1, 30000, (B, row)).astype(np.uint16).view(np.float16)
            qkv.copy_(torch.from_numpy(vals))
            k = qkv[:, hq * d:(hq + H) * d].view(B, H, d)  # fresh views, rows `row` elements apart
            v = qkv[:, (hq + H) * d:].view(B, H, d)
            pkv.append_kv(k, v, caches[layer], tabs[0], tabs[1], kv_last_page_len=tabs[2])
            kn = vals[:, hq * d:(hq + H) * d].reshape(B, H, d)
            vn = vals[:, (hq + H) * d:].reshape(B, H, d)
            _scatter(refs[layer][0], refs[layer][1], kn, vn, np.arange(B), lens - 1, indptr, indices, "NHD")
        torch.cuda.synchronize()
        for layer in range(2):
            for c, ref in zip(caches[layer], refs[layer]):
                assert np.array_equal(c.cpu().numpy().view(np.uint16), ref.view(np.uint16)), (step, layer)
