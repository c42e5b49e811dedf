"""The KV cache's pages: the page manager (PagePool) and appending new K/V into the pages.

    pool = PagePool(num_pages=4096, page_size=16, max_requests=256)
    pool.create(0, prompt_len=37)                  # request 0 owns ceil(37 / 16) pages
    copy = pool.extend(0, 1)                       # one decode step; (src, dst) when a shared page was copied
    indptr, indices, last_page_len, seq_lens = pool.table([0, ...])   # the step's CSR page table
    append_paged_kv_cache(k, v, batch_indices, positions, (k_cache, v_cache), indices, indptr, last_page_len)

append_paged_kv_cache has FlashInfer's signature (flashinfer.page.append_paged_kv_cache), so a serving stack
can swap one for the other; append_kv also takes the ragged form (append_indptr) and the decode form (one
token per row).  numpy arrays (and torch CPU tensors) run on the CPU backend, torch CUDA tensors on the CUDA
backend on torch.cuda.current_stream(); K, V and the caches are read and written in place (no copies).
"""

import ctypes

from . import _arrays as A
from . import _lib as L
from ._lib import check, lib

__all__ = ["PagePool", "append_kv", "append_paged_kv_cache", "copy_pages", "get_batch_indices_positions"]


def _int32_host(x, name):
    np = A.numpy()
    if A.is_torch(x):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, not {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.int32).reshape(-1)


class PagePool:
    """The page manager (persistentkv.h, pkv_page_pool): num_pages pages of page_size tokens, requests with
    ids in [0, max_requests).  Every method raises PkvError (with .status, e.g. Status.POOL_EXHAUSTED) on
    failure and then leaves the pool unchanged."""

    def __init__(self, num_pages, page_size, max_requests):
        self.page_size = L.as_int(page_size, "page_size")
        self.num_pages = L.as_int(num_pages, "num_pages", 1, 2**31 - 1)
        self.max_requests = L.as_int(max_requests, "max_requests")
        h = ctypes.c_void_p()
        check(lib.pkv_page_pool_create(self.num_pages, self.page_size, self.max_requests, ctypes.byref(h)),
              call="pkv_page_pool_create")
        self._h = h
        import weakref
        self._free = weakref.finalize(self, lib.pkv_page_pool_free, h)
        self._cap = 0
        self._buf = None

    def create(self, req, prompt_len=0):
        check(lib.pkv_request_create(self._h, L.as_int(req, "req"), L.as_int(prompt_len, "prompt_len")),
              call="pkv_request_create")

    def free(self, req):
        check(lib.pkv_request_free(self._h, L.as_int(req, "req")), call="pkv_request_free")

    def extend(self, req, n=1):
        """Grows the request by n tokens; (src_page, dst_page) when its shared last page was copied first
        (copy-on-write: copy_pages must run before appending into it), else None."""
        c = L.PageCopy()
        check(lib.pkv_request_extend(self._h, L.as_int(req, "req"), L.as_int(n, "n"), ctypes.byref(c)),
              call="pkv_request_extend")
        return (c.src_page, c.dst_page) if c.src_page >= 0 else None

    def truncate(self, req, new_len):
        check(lib.pkv_request_truncate(self._h, L.as_int(req, "req"), L.as_int(new_len, "new_len")),
              call="pkv_request_truncate")

    def fork(self, src, dst):
        check(lib.pkv_request_fork(self._h, L.as_int(src, "src"), L.as_int(dst, "dst")), call="pkv_request_fork")

    def length(self, req):
        n = ctypes.c_int32()
        check(lib.pkv_request_length(self._h, L.as_int(req, "req"), ctypes.byref(n)), call="pkv_request_length")
        return n.value

    def pages(self, req):
        """The request's pages in order (numpy int32)."""
        np = A.numpy()
        n = ctypes.c_int32()
        check(lib.pkv_request_pages(self._h, L.as_int(req, "req"), None, 0, ctypes.byref(n)), call="pkv_request_pages")
        out = np.empty(n.value, dtype=np.int32)
        check(lib.pkv_request_pages(self._h, req, out.ctypes.data, out.size, ctypes.byref(n)), call="pkv_request_pages")
        return out

    def pages_from(self, req, first):
        """The request's pages from index first on (numpy int32): O(pages returned) - a step's last and new
        page, for a server that keeps each row's page ids in place on the device (docs/pages.md)."""
        np = A.numpy()
        n = ctypes.c_int32()
        req, first = L.as_int(req, "req"), L.as_int(first, "first")
        check(lib.pkv_request_pages(self._h, req, None, 0, ctypes.byref(n)), call="pkv_request_pages")
        out = np.empty(max(n.value - first, 0), dtype=np.int32)
        check(lib.pkv_request_pages_from(self._h, req, first, out.ctypes.data if out.size else None, out.size,
                                         ctypes.byref(n)), call="pkv_request_pages_from")
        return out

    def page_refs(self, page):
        return int(lib.pkv_page_pool_page_refs(self._h, L.as_int(page, "page")))

    def stats(self):
        """dict: num_pages, pages_used, pages_free, peak_used, pages_shared, live_requests, tokens,
        fragmentation (unused slots in the live requests' last pages), cow_copies."""
        s = L.PagePoolStats()
        check(lib.pkv_page_pool_get_stats(self._h, ctypes.byref(s)), call="pkv_page_pool_get_stats")
        return s.to_dict()

    def table(self, reqs):
        """(kv_indptr [B+1], kv_indices, kv_last_page_len [B], seq_lens [B]) numpy int32 of the rows reqs, as
        FlashInfer's plan and BatchDecodeWithPagedKVCacheWrapper.plan take them."""
        np = A.numpy()
        r = _int32_host(reqs, "reqs")
        n = ctypes.c_int64()
        check(lib.pkv_page_pool_table_size(self._h, r.ctypes.data, r.size, ctypes.byref(n)),
              call="pkv_page_pool_table_size")
        indptr = np.empty(r.size + 1, dtype=np.int32)
        indices = np.empty(max(n.value, 1), dtype=np.int32)
        last = np.empty(r.size, dtype=np.int32)
        lens = np.empty(r.size, dtype=np.int32)
        check(lib.pkv_page_pool_table(self._h, r.ctypes.data, r.size, indptr.ctypes.data, indices.ctypes.data,
                                      indices.size, last.ctypes.data, lens.ctypes.data), call="pkv_page_pool_table")
        return indptr, indices[:n.value], last, lens

    def check_table(self, reqs, kv_indptr, kv_indices, seq_lens):
        """Raises PkvError (FOREIGN_PAGE, BEYOND_LENGTH, ...) unless every page row i names is request reqs[i]'s."""
        r = _int32_host(reqs, "reqs")
        ip, ix, sl = (_int32_host(kv_indptr, "kv_indptr"), _int32_host(kv_indices, "kv_indices"),
                      _int32_host(seq_lens, "seq_lens"))
        if ip.size != r.size + 1 or sl.size != r.size:
            raise ValueError("kv_indptr must have len(reqs) + 1 entries and seq_lens len(reqs)")
        p32 = ctypes.POINTER(ctypes.c_int32)
        t = L.PageTable(r.size, ctypes.cast(ip.ctypes.data, p32), ctypes.cast(ix.ctypes.data, p32),
                        ctypes.cast(sl.ctypes.data, p32))
        check(lib.pkv_page_pool_check_table(self._h, r.ctypes.data, ctypes.byref(t)), call="pkv_page_pool_check_table")


# ---- contexts: one per backend and device, made on first use ------------------------------------------
_contexts = {}


def _context(device):
    if device in _contexts:
        return _contexts[device]
    cfg = L.ContextConfig()
    lib.pkv_context_config_default(ctypes.byref(cfg))
    if device == "cpu":
        cfg.backend, cfg.num_threads = L.BACKEND_CPU, 1
    else:
        cfg.backend, cfg.device = L.BACKEND_CUDA, int(device.split(":")[1])
    ctx = ctypes.c_void_p()
    check(lib.pkv_context_create(ctypes.byref(cfg), ctypes.byref(ctx)), call="pkv_context_create")
    _contexts[device] = ctx  # lives as long as the process
    return ctx


def _split_cache(paged_kv_cache, kv_layout):
    """(k Arr, v Arr, page_stride elements, page_size, num_kv_heads, head_dim, num_pages) of FlashInfer's
    paged_kv_cache: a (k_cache, v_cache) pair, or one tensor [num_pages, 2, ...]."""
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout must be 'NHD' or 'HND', not {kv_layout!r}")
    if isinstance(paged_kv_cache, (tuple, list)):
        k, v = (A.describe(x, n) for x, n in zip(paged_kv_cache, ("k_cache", "v_cache")))
        if k.shape != v.shape or len(k.shape) != 4 or not (k.contiguous and v.contiguous):
            raise ValueError(f"k_cache and v_cache must be contiguous [num_pages, ...] of one 4-D shape, got "
                             f"{list(k.shape)} and {list(v.shape)}")
        shape, stride = k.shape, 0
    else:
        kv = A.describe(paged_kv_cache, "paged_kv_cache")
        if len(kv.shape) != 5 or kv.shape[1] != 2 or not kv.contiguous:
            raise ValueError(f"paged_kv_cache must be a contiguous [num_pages, 2, ...] tensor, got {list(kv.shape)}")
        shape = (kv.shape[0],) + kv.shape[2:]
        half = shape[1] * shape[2] * shape[3]
        item = 1 if kv.dtype == "uint8" or A.is_fp8(kv.dtype) else 2
        k = kv._replace(shape=shape)
        v = kv._replace(shape=shape, ptr=kv.ptr + half * item)
        stride = 2 * half
    ps, hkv = (shape[1], shape[2]) if kv_layout == "NHD" else (shape[2], shape[1])
    return k, v, stride, ps, hkv, shape[3], shape[0]


def _ptr_int32(x, name, device, keep):
    """Address of x as int32 in the backend's memory (host arrays are converted; device tensors must be int32)."""
    if x is None:
        return None
    if device == "cpu":
        a = _int32_host(x, name)
        keep.append(a)
        return a.ctypes.data
    t = A.torch()
    if not (A.is_torch(x) and x.device.type == "cuda"):
        x = t.as_tensor(_int32_host(x, name), device=device)
    if x.dtype != t.int32:
        x = x.to(t.int32)
    x = x.contiguous()
    keep.append(x)
    return x.data_ptr()


def _token_stride(a, name):
    """Elements from one token of append_key/value to the next; each token's [Hkv, d] must be dense."""
    if len(a.shape) != 3:
        raise ValueError(f"{name} must be [num_tokens, num_kv_heads, head_dim], got {list(a.shape)}")
    if a.kind == "torch":
        st = a.obj.stride()
    else:
        st = tuple(s // a.obj.itemsize for s in a.obj.strides)
    if st[2] != 1 or (a.shape[1] > 1 and st[1] != a.shape[2]):
        raise ValueError(f"{name}: each token's [num_kv_heads, head_dim] must be dense (strides {st})")
    return int(st[0]) if a.shape[0] > 1 else 0


def _cache_kv_dtype(k, kv_data_type):
    """The cache's element type: an fp8 type (torch's or ml_dtypes', or uint8 codes with kv_data_type naming the
    format), else fp16 / bf16 (numpy uint16: bf16 bits)."""
    named = None if kv_data_type is None else A.kv_dtype_name(kv_data_type)
    if k.dtype == "uint8":
        if named is None or not A.is_fp8(named):
            raise TypeError("a uint8 cache holds fp8 codes: pass kv_data_type (float8_e4m3fn or float8_e5m2)")
        return named
    have = "bfloat16" if k.dtype == "uint16" else A.kv_dtype_name(k.dtype)
    if named is not None and named != have:
        raise TypeError(f"the cache holds {k.dtype}, kv_data_type says {kv_data_type!r}")
    return have


def append_kv(append_key, append_value, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len=None,
              seq_lens=None, batch_indices=None, positions=None, append_indptr=None, kv_layout="NHD",
              kv_data_type=None, k_scale=None, v_scale=None):
    """Writes the new tokens' K and V ([nnz, Hkv, d]) into their pages (pkv_append_kv): with batch_indices and
    positions (FlashInfer's form), with append_indptr (ragged: each row's tokens are its last ones), or one
    token per row (decode form: neither).  kv_indptr, kv_indices and the lengths (kv_last_page_len or
    seq_lens) describe the rows' pages after the extend (PagePool.table).  In place, no copies of K/V.
    An fp8 cache (torch.float8_e4m3fn / float8_e5m2, ml_dtypes' float8 types, or uint8 codes with
    kv_data_type): append_key / append_value in float16 or bfloat16, each value stored as the fp8 code nearest
    value / scale (saturating at the largest finite; NaN kept) with k_scale / v_scale as run() takes them."""
    tables = (kv_indptr, kv_indices, kv_last_page_len, seq_lens, batch_indices, positions, append_indptr)
    memo = _append_memo_key(append_key, append_value, paged_kv_cache, tables, kv_layout, kv_data_type, k_scale,
                            v_scale)
    hit = None if memo is None else _append_memo.get(memo)
    if hit is not None:  # arguments checked before (every layer of every step): the call as made then, at the
        ctx, prob, batch, nnz, t, dev, v_offset = hit  # addresses these tensors have now
        t.k, t.v = append_key.data_ptr(), append_value.data_ptr()
        if isinstance(paged_kv_cache, (tuple, list)):
            t.k_cache, t.v_cache = paged_kv_cache[0].data_ptr(), paged_kv_cache[1].data_ptr()
        else:
            t.k_cache = paged_kv_cache.data_ptr()
            t.v_cache = t.k_cache + v_offset
        (t.kv_indptr, t.kv_page_indices, t.kv_last_page_len, t.seq_lens, t.batch_indices, t.positions,
         t.append_indptr) = (None if x is None else x.data_ptr() for x in tables)
        check(lib.pkv_append_kv(ctx, ctypes.byref(prob), batch, nnz, ctypes.byref(t), A.raw_stream(dev)),
              call="pkv_append_kv")
        return
    k, v, page_stride, ps, hkv, d, num_pages = _split_cache(paged_kv_cache, kv_layout)
    ak, av = A.describe(append_key, "append_key"), A.describe(append_value, "append_value")
    if ak.shape != av.shape or ak.shape[1:] != (hkv, d):
        raise ValueError(f"append_key and append_value must be [nnz, {hkv}, {d}], got {list(ak.shape)} and "
                         f"{list(av.shape)}")
    kv_name = _cache_kv_dtype(k, kv_data_type)
    if A.is_fp8(kv_name):
        if ak.dtype != av.dtype or ak.dtype not in ("float16", "bfloat16", "uint16"):
            raise TypeError(f"append_key and append_value of an fp8 cache must share float16 or bfloat16 ({ak.dtype}, "
                            f"{av.dtype})")
        dname = "bfloat16" if ak.dtype in ("bfloat16", "uint16") else "float16"
    elif not (ak.dtype == av.dtype == k.dtype):
        raise TypeError(f"append_key, append_value and the cache must share a dtype ({ak.dtype}, {av.dtype}, {k.dtype})")
    else:
        dname = kv_name
    devices = {ak.device, av.device, k.device}
    if len(devices) != 1:
        raise ValueError(f"append_key, append_value and the cache must be on one device, got {sorted(devices)}")
    device = k.device
    prob = L.Problem()
    lib.pkv_problem_default(ctypes.byref(prob))
    prob.num_kv_heads = prob.num_qo_heads = hkv
    prob.head_dim, prob.page_size, prob.num_pages = d, ps, num_pages
    prob.layout = L.LAYOUT_NHD if kv_layout == "NHD" else L.LAYOUT_HND
    prob.dtype = A.dtype_code(dname)
    if A.is_fp8(kv_name):
        prob.kv_dtype = A.dtype_code(kv_name)
    keep = []
    batch = len(kv_indptr) - 1
    t = L.AppendTensors()
    t.k, t.v = ak.ptr, av.ptr
    t.k_token_stride, t.v_token_stride = _token_stride(ak, "append_key"), _token_stride(av, "append_value")
    t.k_cache, t.v_cache, t.kv_page_stride = k.ptr, v.ptr, page_stride
    t.kv_indptr = _ptr_int32(kv_indptr, "kv_indptr", device, keep)
    t.kv_page_indices = _ptr_int32(kv_indices, "kv_indices", device, keep)
    t.kv_last_page_len = _ptr_int32(kv_last_page_len, "kv_last_page_len", device, keep)
    t.seq_lens = _ptr_int32(seq_lens, "seq_lens", device, keep)
    t.batch_indices = _ptr_int32(batch_indices, "batch_indices", device, keep)
    t.positions = _ptr_int32(positions, "positions", device, keep)
    t.append_indptr = _ptr_int32(append_indptr, "append_indptr", device, keep)
    t.k_scale, t.k_head_scales, ks = A.kv_scale(k_scale, "k_scale", hkv, device)
    t.v_scale, t.v_head_scales, vs = A.kv_scale(v_scale, "v_scale", hkv, device)
    keep += [ks, vs]
    stream = None
    if device != "cpu":
        stream = A.torch().cuda.current_stream(int(device.split(":")[1])).cuda_stream
    check(lib.pkv_append_kv(_context(device), ctypes.byref(prob), batch, ak.shape[0], ctypes.byref(t), stream),
          call="pkv_append_kv")
    if memo is not None:
        if len(_append_memo) >= _APPEND_MEMO_SIZE:
            _append_memo.clear()
        _append_memo[memo] = (_context(device), prob, batch, ak.shape[0], t, int(device.split(":")[1]), v.ptr - k.ptr)


_APPEND_MEMO_SIZE = 256
_append_memo = {}  # append_kv's checked calls by their arguments' memo keys (_append_memo_key)


def _append_memo_key(append_key, append_value, paged_kv_cache, tables, kv_layout, kv_data_type, k_scale, v_scale):
    """The memo key of an append_kv call whose checks depend only on its tensors' shapes, strides, dtypes, devices
    and alignments (A.memo_key): CUDA tensors throughout, the tables int32 and contiguous (used as they are,
    nothing converted), per-tensor scales of 1 (None); else None (the call is checked).  Every call a batch of B
    makes at every layer and step has one key: the lengths and page ids are the tables' contents, which the
    library reads on the device."""
    if (k_scale is not None or v_scale is not None or not isinstance(kv_layout, str) or not A.is_torch(append_key) or
            append_key.device.type != "cuda"):
        return None
    t = A.torch()
    for x in tables:
        if x is not None and not (A.is_torch(x) and x.device.type == "cuda" and x.dtype == t.int32 and
                                  x.is_contiguous()):
            return None
    keys = (A.memo_key(append_key), A.memo_key(append_value), A.memo_key(paged_kv_cache), A.memo_key(tables))
    if any(k is A.NO_MEMO for k in keys):
        return None
    return (*keys, kv_layout, str(kv_data_type))


def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices, kv_indptr,
                          kv_last_page_len, kv_layout="NHD", kv_data_type=None, k_scale=None, v_scale=None):
    """FlashInfer's flashinfer.page.append_paged_kv_cache on PersistentKV: append_key/value [nnz, Hkv, d],
    batch_indices and positions [nnz] (see get_batch_indices_positions), paged_kv_cache a (k_cache, v_cache)
    pair or one [num_pages, 2, ...] tensor, kv_indices, kv_indptr, kv_last_page_len of the rows after the
    append.  An fp8 cache quantizes on write with k_scale / v_scale (append_kv)."""
    append_kv(append_key, append_value, paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len=kv_last_page_len,
              batch_indices=batch_indices, positions=positions, kv_layout=kv_layout, kv_data_type=kv_data_type,
              k_scale=k_scale, v_scale=v_scale)


def get_batch_indices_positions(append_indptr, seq_lens, nnz):
    """FlashInfer's helper: (batch_indices, positions) [nnz] int32 of ragged appends whose rows hold seq_lens
    tokens after the append (row i's tokens are its last append_indptr[i+1] - append_indptr[i])."""
    if A.is_torch(append_indptr):
        t = A.torch()
        ap = append_indptr.to(t.int64)
        counts = ap[1:] - ap[:-1]
        rows = t.repeat_interleave(t.arange(counts.numel(), device=ap.device), counts)
        k = t.arange(int(nnz), device=ap.device) - ap[:-1][rows]
        pos = seq_lens.to(t.int64)[rows] - counts[rows] + k
        return rows.to(t.int32), pos.to(t.int32)
    np = A.numpy()
    ap = _int32_host(append_indptr, "append_indptr").astype(np.int64)
    sl = _int32_host(seq_lens, "seq_lens").astype(np.int64)
    counts = ap[1:] - ap[:-1]
    rows = np.repeat(np.arange(counts.size), counts)
    k = np.arange(int(nnz)) - ap[:-1][rows]
    return rows.astype(np.int32), (sl[rows] - counts[rows] + k).astype(np.int32)


def copy_pages(copies, paged_kv_cache, kv_layout="NHD"):
    """Executes copy-on-write copies [(src_page, dst_page), ...] (PagePool.extend's) on the cache's backend."""
    k, v, page_stride, ps, hkv, d, num_pages = _split_cache(paged_kv_cache, kv_layout)
    copies = list(copies)
    if not copies:
        return
    arr = (L.PageCopy * len(copies))(*[L.PageCopy(int(a), int(b)) for a, b in copies])
    prob = L.Problem()
    lib.pkv_problem_default(ctypes.byref(prob))
    prob.num_kv_heads = prob.num_qo_heads = hkv
    prob.head_dim, prob.page_size, prob.num_pages = d, ps, num_pages
    prob.layout = L.LAYOUT_NHD if kv_layout == "NHD" else L.LAYOUT_HND
    kv_name = "float8_e4m3fn" if k.dtype == "uint8" else _cache_kv_dtype(k, None)  # a copy moves bytes alike
    prob.dtype = A.dtype_code("float16" if A.is_fp8(kv_name) else kv_name)
    if A.is_fp8(kv_name):
        prob.kv_dtype = A.dtype_code(kv_name)
    stream = None if k.device == "cpu" else A.torch().cuda.current_stream(int(k.device.split(":")[1])).cuda_stream
    check(lib.pkv_copy_pages(_context(k.device), ctypes.byref(prob), arr, len(copies), k.ptr, v.ptr, page_stride,
                             stream), call="pkv_copy_pages")
