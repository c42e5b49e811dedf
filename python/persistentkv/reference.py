"""The float64 CPU reference (pkv_reference): the definition every backend is checked against."""

import ctypes

from . import _arrays as A
from . import _lib as L
from ._lib import check, lib


def reference(q, k_cache, v_cache, indptr, indices, seq_lens, kv_layout="NHD", sm_scale=None,
              num_pages=None, q_data_type=None, logits_soft_cap=None, window_left=-1, kv_data_type=None,
              k_scale=None, v_scale=None):
    """(o [B, Hq, d], lse [B, Hq]) as float64 numpy arrays, for host q/k_cache/v_cache.

    Shapes as in BatchDecodeWithPagedKVCacheWrapper.run; num_pages defaults to k_cache.shape[0].
    q_data_type defaults to q's dtype; numpy uint16 arrays are taken as bfloat16 bits.  kv_data_type (default:
    q's) may be an fp8 type (caches of its codes, uint8 arrays accepted), each element read as the double of
    its code times k_scale / v_scale (numbers or [num_kv_heads] arrays, as run() takes them).
    Slow (plain float64 loops): for tests and small problems.
    """
    np = A.numpy()
    qa, ka, va = A.describe(q, "q"), A.describe(k_cache, "k_cache"), A.describe(v_cache, "v_cache")
    if q_data_type is None:
        q_data_type = "bfloat16" if qa.dtype == "uint16" else qa.dtype
    dt = A.dtype_name(q_data_type)
    kvt = dt if kv_data_type is None else A.kv_dtype_name(kv_data_type)
    for a, name, want in ((qa, "q", dt), (ka, "k_cache", kvt), (va, "v_cache", kvt)):
        if a.device != "cpu":
            raise ValueError(f"{name} must be in host memory, not on {a.device}")
        if not a.contiguous:
            raise ValueError(f"{name} must be C-contiguous")
        if not A.accepts_dtype(a, want):
            raise TypeError(f"{name} has dtype {a.dtype}, expected {want}")
    if len(qa.shape) != 3:
        raise ValueError(f"q must be [B, Hq, d], got shape {list(qa.shape)}")
    if len(ka.shape) != 4 or va.shape != ka.shape:
        raise ValueError(f"k_cache and v_cache must be 4-D and alike, got {list(ka.shape)}, {list(va.shape)}")
    B, hq, d = qa.shape
    if kv_layout == "NHD":
        pool, ps, hkv, dk = ka.shape
    elif kv_layout == "HND":
        pool, hkv, ps, dk = ka.shape
    else:
        raise ValueError(f"kv_layout must be 'NHD' or 'HND', not {kv_layout!r}")
    if dk != d:
        raise ValueError(f"k_cache head_dim {dk} differs from q's {d}")
    h_indptr = A.HostInt32(indptr, "indptr")
    h_indices = A.HostInt32(indices, "indices")
    h_lens = A.HostInt32(seq_lens, "seq_lens")
    if len(h_lens) != B or len(h_indptr) != B + 1:
        raise ValueError(f"seq_lens needs {B} entries and indptr {B + 1} (q has B = {B})")
    if h_indptr[B] > len(h_indices):
        raise ValueError(f"indptr[-1] = {h_indptr[B]} but indices has only {len(h_indices)} entries")
    if num_pages is None:
        num_pages = pool
    elif num_pages > pool:
        raise ValueError(f"num_pages {num_pages} exceeds the {pool} pages of k_cache")

    prob = L.Problem()
    lib.pkv_problem_default(ctypes.byref(prob))
    prob.num_qo_heads, prob.num_kv_heads, prob.head_dim, prob.page_size = hq, hkv, d, ps
    prob.num_pages = int(num_pages)
    prob.layout = L.LAYOUT_NHD if kv_layout == "NHD" else L.LAYOUT_HND
    prob.dtype = A.dtype_code(dt)
    if A.is_fp8(kvt):
        prob.kv_dtype = A.dtype_code(kvt)
    L.set_score_options(prob, sm_scale, logits_soft_cap, window_left)
    ks, kh, k_keep = A.kv_scale(k_scale, "k_scale", hkv, "cpu")
    vs, vh, v_keep = A.kv_scale(v_scale, "v_scale", hkv, "cpu")
    table = L.PageTable(B, h_indptr.c_ptr(), h_indices.c_ptr(), h_lens.c_ptr())
    o = np.zeros((B, hq, d), np.float64)  # o [B, Hq, d]
    lse = np.zeros((B, hq), np.float64)   # lse [B, Hq]
    f64 = ctypes.POINTER(ctypes.c_double)
    check(lib.pkv_reference_kv(ctypes.byref(prob), ctypes.byref(table), qa.ptr, ka.ptr, va.ptr, ks, vs, kh, vh,
                               o.ctypes.data_as(f64), lse.ctypes.data_as(f64)), call="pkv_reference_kv")
    del k_keep, v_keep
    return o, lse
