"""PersistentKV: decode attention over a paged KV cache (grouped-query attention), via ctypes.

    import persistentkv as pkv
    w = pkv.BatchDecodeWithPagedKVCacheWrapper(backend="cpu")
    w.plan(indptr, indices, seq_lens, num_qo_heads, num_kv_heads, head_dim, page_size, num_pages=P)
    o, lse = w.run(q, k_cache, v_cache, return_lse=True)

`pip install ./python` builds the shared library and puts it inside the package (persistentkv/lib).
It is found through $PKV_LIBRARY, then the package's own lib/, then (when running from a source
checkout) ../build, ../build-gpu, ../build-cpu of the repository, then <sys.prefix>/lib (cmake
--install build --prefix "$VIRTUAL_ENV"), then ctypes.util.find_library("persistentkv").

numpy is needed for the CPU backend, traces and the reference; torch for the CUDA backend.  numpy
has no bfloat16: pass uint16 arrays holding bf16 bits (see bf16_bits) or ml_dtypes.bfloat16 arrays.
"""

import ctypes

from . import _arrays
from . import _lib
from ._lib import (LibraryNotFoundError, PkvError, ROUTES, TRACE_FAMILIES, Status, lib, library_path,
                   status_string)
from .reference import reference
from .trace import Trace, generate_trace
from .wrapper import BatchDecodeWithPagedKVCacheWrapper, cuda_available
from .pages import PagePool, append_kv, append_paged_kv_cache, copy_pages, get_batch_indices_positions
from . import flashinfer  # FlashInfer's decode wrapper (its plan/run order and lse base) on PersistentKV

# The loaded library's version (pkv_version(), which _lib checks against the binding's ABI_VERSION): the
# project's version in CMakeLists.txt, which the pip package's metadata reads too.
__version__ = "{}.{}.{}".format(_lib.ABI_VERSION // 10000, _lib.ABI_VERSION // 100 % 100, _lib.ABI_VERSION % 100)

__all__ = ["BatchDecodeWithPagedKVCacheWrapper", "PkvError", "LibraryNotFoundError", "Status", "ROUTES",
           "TRACE_FAMILIES", "Trace", "generate_trace", "reference", "cuda_available", "library_path",
           "status_string", "flashinfer", "PagePool", "append_kv", "append_paged_kv_cache", "copy_pages",
           "get_batch_indices_positions", "bf16_bits", "bf16_to_float32", "block_table_to_csr", "__version__"]


def bf16_bits(x):
    """uint16 numpy array of the bf16 bits of x (round to nearest even, as the library does)."""
    np = _arrays.numpy()
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[nan] = 0x7FC0
    return r


def bf16_to_float32(bits):
    """float32 numpy array from uint16 bf16 bits."""
    np = _arrays.numpy()
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def block_table_to_csr(block_table, seq_lens, page_size):
    """(indptr [B+1], indices [nnz]) int32 from a vLLM-style padded block table [B, max_pages]."""
    np = _arrays.numpy()

    def int_array(x, name):  # integers only: no silent truncation (3.7 -> 3)
        a = np.asarray(x.cpu() if _arrays.is_torch(x) else x)
        if a.dtype.kind not in "iub" and a.size > 0:
            raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
        return a

    def outside_int32(a):
        return a.size > 0 and (int(a.min()) < -2**31 or int(a.max()) > 2**31 - 1)

    page_size = _lib.as_int(page_size, "page_size")
    bt, lens = int_array(block_table, "block_table"), int_array(seq_lens, "seq_lens")
    if bt.ndim != 2 or lens.ndim != 1 or bt.shape[0] != lens.shape[0]:
        raise ValueError(f"block_table must be [B, max_pages] and seq_lens [B], got {bt.shape}, {lens.shape}")
    if outside_int32(lens):
        raise ValueError("seq_lens has values outside int32")  # not wrapped (2**32 + 20 -> 20)
    if page_size > 0:
        # the used entries only (padding past a row's pages is ignored, whatever its value): not wrapped
        used = np.arange(bt.shape[1])[None, :] < ((lens.astype(np.int64).clip(min=0) + page_size - 1)
                                                  // page_size)[:, None]
        if outside_int32(bt[used]):
            raise ValueError("block_table has page ids outside int32")
        bt = np.where(used, bt, 0) if bt.dtype.itemsize > 4 or bt.dtype.kind == "u" else bt
    bt = np.ascontiguousarray(bt, dtype=np.int32)
    lens = np.ascontiguousarray(lens, dtype=np.int32)
    B, max_pages = bt.shape
    cap = int(((lens.astype(np.int64).clip(min=0) + page_size - 1) // max(page_size, 1)).sum())
    indptr = np.zeros(B + 1, np.int32)
    indices = np.zeros(max(cap, 1), np.int32)
    i32 = ctypes.POINTER(ctypes.c_int32)
    from ._lib import check
    check(lib.pkv_block_table_to_csr(bt.ctypes.data_as(i32), B, max_pages, lens.ctypes.data_as(i32),
                                     int(page_size), indptr.ctypes.data_as(i32), indices.ctypes.data_as(i32),
                                     cap), call="pkv_block_table_to_csr")
    return indptr, indices[:indptr[-1]].copy()
