"""FlashInfer's decode wrapper on PersistentKV: code written for

    flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout).plan(indptr, indices,
        last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, ...).run(q, paged_kv_cache)

runs unchanged with `from persistentkv import flashinfer` (or `import persistentkv.flashinfer as
flashinfer`): the same positional order (last_page_len third), the same keywords, the same run()
(a (k_cache, v_cache) tuple or one [num_pages, 2, ...] tensor; out=, lse=, return_lse=) and the same
lse, base 2 (FlashInfer's; the native wrapper's is the natural log).  What FlashInfer offers and
PersistentKV does not is refused with PkvError(Status.UNSUPPORTED) and a message that says what to do,
never run with other semantics:
  - pos_encoding_mode other than "NONE" (apply RoPE to q and k before writing the cache), ALiBi;
  - q_len_per_req > 1 (decode is one query token per request), window_right other than 0 / -1;
  - o_data_type other than q's, q_scale != 1 (fp8 q), k_scale / v_scale != 1 on a cache of q's dtype
    (FlashInfer folds them into the scores and the output; here they belong to fp8 caches), sinks;
use_cuda_graph=True works as FlashInfer's: the batch size is fixed by paged_kv_indptr_buffer
(len - 1), plan() copies the table into the three given buffers and uploads a graph-stable plan
(pkv_plan_options.graph_max_batch) into the workspace, so a CUDA graph captured around run() replays
every later plan().  The page pool's size is not a plan() argument in FlashInfer: page ids are checked
against the cache each run() is given, and a later plan()'s against the largest cache run() saw.
FlashInfer's CUDAGraphBatchDecodeWithPagedKVCacheWrapper (the buffers as constructor arguments) is here
too.
Mapped: disable_split_kv=True -> the `single` route (no splits); fixed_split_size=P -> the `workqueue`
route with chunks of P pages (split bounds then depend on each row alone, as FlashInfer's batch-invariant
mode); block_tables, when given, must agree with the CSR table; non_blocking, rope_scale and rope_theta
(with pos_encoding_mode "NONE"), use_tensor_cores, backend and jit_args choose nothing here (one engine).
The float workspace buffer is used as the workspace (grown by a new allocation if a plan needs more).
fp8 caches: plan(..., kv_data_type=torch.float8_e4m3fn or torch.float8_e5m2) and run(..., k_scale=,
v_scale=) with the scales FlashInfer takes (numbers; [num_kv_heads] tensors too), dequantized as stored
value x scale, on either backend.
"""

import math

from . import _arrays as A
from . import _lib as L
from ._lib import PkvError, Status
from .wrapper import BatchDecodeWithPagedKVCacheWrapper as _Native, _cuda_int32_vector, _lens_from_last_page

__all__ = ["BatchDecodeWithPagedKVCacheWrapper", "CUDAGraphBatchDecodeWithPagedKVCacheWrapper"]

_LOG2E = 1.0 / math.log(2.0)
# FlashInfer 0.7's optional plan() arguments after page_size, in its deprecated positional order
_PLAN_POSITIONAL = ("pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type", "kv_data_type",
                    "o_data_type", "data_type", "sm_scale", "rope_scale", "rope_theta", "non_blocking",
                    "block_tables", "seq_lens", "fixed_split_size", "disable_split_kv", "q_len_per_req")
_PLAN_DEFAULTS = dict(pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
                      kv_data_type=None, o_data_type=None, data_type=None, sm_scale=None, rope_scale=None,
                      rope_theta=None, non_blocking=True, block_tables=None, seq_lens=None, fixed_split_size=None,
                      disable_split_kv=False, q_len_per_req=1, window_right=0, is_causal=None)


def _unsupported(what, instead):
    return PkvError(Status.UNSUPPORTED, f"{what} is not supported by PersistentKV; {instead}", "flashinfer")


def _host_ints(x, name):
    """A 1-D or 2-D integer array (numpy, list or torch tensor, any device) as a host numpy array."""
    np = A.numpy()
    if A.is_torch(x):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, not {a.dtype}")
    return a


class BatchDecodeWithPagedKVCacheWrapper:
    """flashinfer.BatchDecodeWithPagedKVCacheWrapper's constructor, plan() and run() on PersistentKV.

    backend_device: 'auto' (CUDA when torch sees a GPU and the library has CUDA), 'cuda' or 'cpu'
    (numpy arrays; not a FlashInfer argument).  pdl: PersistentKV's programmatic dependent launch of a
    run's kernels (on by default; run(enable_pdl=...) cannot change it per call, see run).
    """

    def __init__(self, float_workspace_buffer=None, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None, backend_device="auto", pdl=True):
        self._graph = None
        if use_cuda_graph:
            bufs = dict(paged_kv_indptr_buffer=paged_kv_indptr_buffer,
                        paged_kv_indices_buffer=paged_kv_indices_buffer,
                        paged_kv_last_page_len_buffer=paged_kv_last_page_len_buffer)
            for name, b in bufs.items():
                if not _cuda_int32_vector(b):
                    raise ValueError(f"{name} must be a contiguous 1-D int32 CUDA tensor in cudagraph mode")
            batch = paged_kv_indptr_buffer.numel() - 1
            if batch < 1 or paged_kv_last_page_len_buffer.numel() < batch:
                raise ValueError("paged_kv_indptr_buffer must hold batch_size + 1 entries and "
                                 "paged_kv_last_page_len_buffer batch_size")
            self._graph = dict(batch=batch, indptr=paged_kv_indptr_buffer, indices=paged_kv_indices_buffer,
                               last=paged_kv_last_page_len_buffer, pool=None)
            backend_device = "cuda"
        self._w = _Native(kv_layout=kv_layout, backend=backend_device, pdl=pdl)
        self._use_tensor_cores = bool(use_tensor_cores)
        if float_workspace_buffer is not None:
            self._w._adopt_workspace(float_workspace_buffer)
        self._window_left = -1
        self._fp8 = False  # plan()'s kv_data_type is an fp8 type: run() passes k_scale and v_scale on

    # ---- what FlashInfer's wrapper exposes ------------------------------------------------------
    @property
    def is_cuda_graph_enabled(self):
        return self._graph is not None

    @property
    def use_tensor_cores(self):
        return self._use_tensor_cores

    @property
    def native(self):
        """The persistentkv.BatchDecodeWithPagedKVCacheWrapper underneath (route, counters, ...)."""
        return self._w

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        self._w._adopt_workspace(float_workspace_buffer)

    # ---- plan -----------------------------------------------------------------------------------
    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             *positional, **kwargs):
        if len(positional) > len(_PLAN_POSITIONAL):
            raise TypeError(f"plan() takes at most {len(_PLAN_POSITIONAL)} optional positional arguments after "
                            f"page_size, got {len(positional)}")
        unknown = set(kwargs) - set(_PLAN_DEFAULTS)
        if unknown:
            raise TypeError(f"plan() got unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        a = dict(_PLAN_DEFAULTS)
        for name, value in zip(_PLAN_POSITIONAL, positional):
            if name in kwargs:
                raise TypeError(f"plan() got multiple values for argument {name!r}")
            a[name] = value
        a.update(kwargs)

        mode = a["pos_encoding_mode"]
        if mode not in ("NONE", 0, None):
            raise _unsupported(f"pos_encoding_mode={mode!r}", "apply the rotary embedding to q and k before "
                               "writing them (pos_encoding_mode='NONE')")
        if a["q_len_per_req"] not in (None, 1):
            raise _unsupported(f"q_len_per_req={a['q_len_per_req']}", "decode takes one query token per request")
        if a["window_right"] not in (0, -1, None):
            raise _unsupported(f"window_right={a['window_right']}", "decode attends up to the query's own token")
        q_dtype = a["q_data_type"]
        if a["data_type"] is not None:  # FlashInfer's deprecated name for both
            q_dtype = a["data_type"]
        q_name = A.dtype_name(q_dtype)
        kv_name = q_name
        for k in ("kv_data_type", "o_data_type"):
            if a[k] is None:
                continue
            try:
                name = A.kv_dtype_name(a[k]) if k == "kv_data_type" else A.dtype_name(a[k])
            except ValueError:  # nvfp4, ...: not a dtype of this library
                name = None
            if k == "kv_data_type" and name is not None and A.is_fp8(name):
                kv_name = name
            elif name != q_name:
                raise _unsupported(f"{k}={a[k]!r} with q_data_type {q_name}",
                                   "the output shares q's dtype (float16 or bfloat16), and the cache too unless "
                                   "it is fp8 (torch.float8_e4m3fn or float8_e5m2)")
        self._fp8 = A.is_fp8(kv_name)

        # host copies of the table only for the cross-checks (the native plan copies it once itself)
        if a["block_tables"] is not None:
            self._check_block_tables(_host_ints(a["block_tables"], "block_tables"), _host_ints(indptr, "indptr"),
                                     _host_ints(indices, "indices"))

        route, chunk_pages = "auto", 0
        if a["disable_split_kv"]:
            route = "single"
        elif a["fixed_split_size"] is not None:
            split = L.as_int(a["fixed_split_size"], "fixed_split_size")
            if split > 0:
                route, chunk_pages = "workqueue", split

        lens = {}
        if a["seq_lens"] is not None:
            seq = _host_ints(a["seq_lens"], "seq_lens")
            if last_page_len is not None:
                self._check_lengths(seq, _host_ints(last_page_len, "last_page_len"), _host_ints(indptr, "indptr"),
                                    int(page_size))
            lens["seq_lens"] = seq
        else:
            lens["last_page_len"] = last_page_len
        soft_cap = None if a["logits_soft_cap"] is None else L.as_float(a["logits_soft_cap"], "logits_soft_cap", finite=False)
        graph_kw = {}
        if self._graph is not None:  # the native plan takes the host copies _graph_plan made
            indptr, indices, h_last, graph_kw = self._graph_plan(indptr, indices, last_page_len, route)
            if "last_page_len" in lens:
                lens["last_page_len"] = h_last
        self._w.plan(indptr, indices, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     page_size=page_size, q_data_type=q_name, kv_data_type=kv_name, sm_scale=a["sm_scale"],
                     logits_soft_cap=soft_cap if soft_cap and soft_cap > 0 else None,
                     window_left=-1 if a["window_left"] is None else int(a["window_left"]), route=route,
                     chunk_pages=chunk_pages, **lens, **graph_kw)
        self._window_left = -1 if a["window_left"] is None else int(a["window_left"])

    begin_forward = plan  # FlashInfer's older names

    # the pool size a graph-stable plan is made for when the cache is not known (FlashInfer's plan() has no
    # such argument): the page ids are checked against each run()'s cache instead
    _GRAPH_POOL = 2**31 - 1

    def _graph_plan(self, indptr, indices, last_page_len, route):
        """cudagraph mode: the table into the fixed buffers (as FlashInfer's plan() does).  Returns the
        host copies of indptr, indices and last_page_len (None when not given) and the native plan's
        graph keywords."""
        g = self._graph
        h_indptr = _host_ints(indptr, "indptr")
        batch = len(h_indptr) - 1
        if batch != g["batch"]:
            raise ValueError(f"the batch size is fixed to {g['batch']} in cudagraph mode (paged_kv_indptr_buffer), "
                             f"got {batch}")
        if route not in ("auto", "workqueue"):
            raise _unsupported("disable_split_kv=True in cudagraph mode", "graph-stable plans run the work queue")
        nnz = int(h_indptr[-1])
        if nnz > g["indices"].numel():
            raise ValueError(f"the table has {nnz} page ids, paged_kv_indices_buffer holds {g['indices'].numel()}")
        h_indices = _host_ints(indices, "indices")
        top = int(h_indices[:nnz].max()) if nnz > 0 else -1
        if g["pool"] is not None and top >= g["pool"]:
            raise ValueError(f"page id {top} is outside the cache of {g['pool']} pages run() was given")
        torch = A.torch()
        g["indptr"].copy_(torch.as_tensor(h_indptr, dtype=torch.int32), non_blocking=False)
        if nnz > 0:
            g["indices"][:nnz].copy_(torch.as_tensor(h_indices[:nnz], dtype=torch.int32), non_blocking=False)
        h_last = None
        if last_page_len is not None:
            h_last = _host_ints(last_page_len, "last_page_len")
            g["last"][:batch].copy_(torch.as_tensor(h_last, dtype=torch.int32))
        return h_indptr, h_indices, h_last, dict(graph_max_batch=batch, indices_device=g["indices"],
                                                 num_pages=self._GRAPH_POOL, _check_pages=top + 1)

    @staticmethod
    def _check_block_tables(bt, h_indptr, h_indices):
        if bt.ndim != 2 or bt.shape[0] != len(h_indptr) - 1:
            raise ValueError(f"block_tables has shape {list(bt.shape)}, expected [batch_size = {len(h_indptr) - 1}, "
                             "max_pages]")
        for r in range(bt.shape[0]):
            n = int(h_indptr[r + 1] - h_indptr[r])
            if n > bt.shape[1] or (bt[r, :n] != h_indices[h_indptr[r]:h_indptr[r + 1]]).any():
                raise ValueError(f"block_tables row {r} does not hold the pages indptr/indices give that row")

    @staticmethod
    def _check_lengths(seq, last, h_indptr, page_size):
        want = _lens_from_last_page(h_indptr, last, page_size)  # how the native plan reads last_page_len
        if len(seq) != len(want):
            raise ValueError(f"seq_lens has {len(seq)} entries, last_page_len {len(want)}")
        for r in range(len(seq)):
            if int(seq[r]) != want[r]:
                raise ValueError(f"seq_lens[{r}] = {int(seq[r])}, but indptr and last_page_len give that row "
                                 f"{want[r]} tokens")

    # ---- run ------------------------------------------------------------------------------------
    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, window_left=None, sinks=None, q_len_per_req=None,
            skip_softmax_threshold_scale_factor=None, kv_cache_sf=None):
        """o [B, Hq, d], or (o, lse) with lse [B, Hq] in base 2 as FlashInfer's, when return_lse.

        enable_pdl: None or True run as the wrapper was made (PDL on by default); False is refused
        (make the wrapper with pdl=False instead).
        """
        if args:
            raise TypeError(f"run() takes no extra positional arguments here, got {len(args)}")
        if q_scale is not None and float(q_scale) != 1.0:
            raise _unsupported(f"q_scale={q_scale}", "q is float16 or bfloat16 (no fp8 q)")
        if not self._fp8:
            for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
                if value is not None and (A.is_numpy(value) or A.is_torch(value) or float(value) != 1.0):
                    raise _unsupported(f"{name}={value}", "scales belong to fp8 caches (plan with kv_data_type="
                                       "torch.float8_e4m3fn or float8_e5m2); a float16 / bfloat16 cache is read as it is")
            k_scale = v_scale = None
        if sinks is not None:
            raise _unsupported("sinks (attention-sink logits)", "run without sinks")
        if kv_cache_sf is not None:
            raise _unsupported("kv_cache_sf (nvfp4 caches)", "pass float16 or bfloat16 data")
        if skip_softmax_threshold_scale_factor is not None:
            raise _unsupported("skip_softmax_threshold_scale_factor", "leave it unset (every score is computed)")
        if q_len_per_req not in (None, 1):
            raise _unsupported(f"q_len_per_req={q_len_per_req}", "decode takes one query token per request")
        if window_left is not None and int(window_left) != self._window_left:
            raise ValueError(f"run(window_left={window_left}) differs from plan()'s {self._window_left}")
        if enable_pdl is False and self._w._pdl:
            raise _unsupported("enable_pdl=False on a wrapper made with pdl=True",
                               "make the wrapper with pdl=False")
        with_lse = return_lse or lse is not None
        res = self._w.run(q, paged_kv_cache, return_lse=with_lse, out=out, lse=lse, k_scale=k_scale, v_scale=v_scale)
        if self._graph is not None:  # the cache's pages: what later plans' page ids are checked against
            c = paged_kv_cache[0] if isinstance(paged_kv_cache, (tuple, list)) else paged_kv_cache
            self._graph["pool"] = max(self._graph["pool"] or 0, int(c.shape[0]))
        if not with_lse:
            return res
        o, l_ = res
        l_ *= _LOG2E  # natural log -> base 2, in place (lse= buffers included); -inf stays -inf
        return (o, l_) if return_lse else o

    def run_return_lse(self, q, paged_kv_cache, *args, **kwargs):
        kwargs["return_lse"] = True
        return self.run(q, paged_kv_cache, *args, **kwargs)

    forward = run

    def forward_return_lse(self, q, paged_kv_cache, *args, **kwargs):
        return self.run_return_lse(q, paged_kv_cache, *args, **kwargs)

    def end_forward(self):
        """FlashInfer's old no-op."""

    def __repr__(self):
        return f"persistentkv.flashinfer.BatchDecodeWithPagedKVCacheWrapper({self._w!r})"


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper: the decode wrapper with use_cuda_graph=True
    and the three fixed table buffers as its constructor's positional arguments."""

    def __init__(self, workspace_buffer, indptr_buffer, indices_buffer, last_page_len_buffer, kv_layout="NHD",
                 use_tensor_cores=False, pdl=True):
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph=True, use_tensor_cores=use_tensor_cores,
                         paged_kv_indptr_buffer=indptr_buffer, paged_kv_indices_buffer=indices_buffer,
                         paged_kv_last_page_len_buffer=last_page_len_buffer, pdl=pdl)

    def __repr__(self):
        return f"persistentkv.flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper({self._w!r})"
