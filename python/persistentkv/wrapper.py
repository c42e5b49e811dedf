"""BatchDecodeWithPagedKVCacheWrapper: plan once per decode step on the host, run per layer."""

import ctypes
import weakref

from . import _arrays as A
from . import _lib as L
from ._lib import PkvError, check, lib, parse_code

_LAYOUTS = {"NHD": L.LAYOUT_NHD, "HND": L.LAYOUT_HND}
_BACKENDS = ("auto", "cpu", "cuda")
_WS_ALIGN = 256  # PKV_WS_ALIGN: the library lays out its workspace in 256-byte steps
_CUDA_ALIGN = 16  # the CUDA kernels use 16-byte vector loads and stores


def cuda_available():
    """True when the library has the CUDA backend and sees a device (torch is not consulted)."""
    return bool(lib.pkv_cuda_available())


def _cuda_int32_vector(x, device=None):
    """x is a contiguous 1-D int32 torch tensor on a GPU (on cuda:device when device is given): one the
    kernels can read in place as page ids or table entries."""
    return (A.is_torch(x) and x.device.type == "cuda" and (device is None or x.device.index == device)
            and x.dtype == A.torch().int32 and x.is_contiguous() and x.dim() == 1)


def _route_code(route):
    return parse_code(lib.pkv_route_parse, route)


def _lens_from_last_page(h_indptr, h_last, page_size):
    """Row lengths from FlashInfer's last_page_len: (pages - 1) * page_size + last page's tokens."""
    if page_size <= 0:
        raise ValueError(f"page_size must be positive, got {page_size}")
    lens = []
    for r in range(len(h_last)):
        n, lp = h_indptr[r + 1] - h_indptr[r], h_last[r]
        if n < 0:
            raise ValueError(f"indptr decreases at row {r} ({h_indptr[r]} -> {h_indptr[r + 1]})")
        if n == 0 and lp != 0:
            raise ValueError(f"row {r} has no pages but last_page_len {lp} (0 expected)")
        if n > 0 and not 1 <= lp <= page_size:
            raise ValueError(f"last_page_len[{r}] = {lp} is outside 1..page_size ({page_size})")
        length = 0 if n == 0 else (n - 1) * page_size + lp
        if length >= 2**31:
            raise ValueError(f"row {r} would hold {length} tokens, more than int32")
        lens.append(length)
    return A.HostInt32(lens, "seq_lens")


_RUN_MEMO_SIZE = 64


class BatchDecodeWithPagedKVCacheWrapper:
    """Decode attention over a paged KV cache (grouped-query attention), FlashInfer-style.

    w = BatchDecodeWithPagedKVCacheWrapper(backend="cpu")
    w.plan(indptr, indices, seq_lens, Hq, Hkv, d, page_size, num_pages=P)  # once per step
    o = w.run(q, k_cache, v_cache)                                          # once per layer

    Unlike FlashInfer's plan(), the third argument is seq_lens (tokens per row); FlashInfer's
    last_page_len is accepted by keyword (plan(indptr, indices, last_page_len=..., num_qo_heads=...)).

    backend: "cpu" (numpy arrays or torch CPU tensors), "cuda" (torch CUDA tensors on `device`),
    "auto" (cuda when the library has CUDA, a GPU is visible and torch can use it, else cpu).
    workspace_bytes: initial workspace; plan() grows it when a plan needs more (run() never
    allocates a workspace).  num_threads: CPU backend threads (<= 0: all processors).
    pdl: on sm_90 GPUs, run()'s kernels are programmatic dependents of the kernel before them on the
    stream (scheduled while it drains; they touch q, the cache and the outputs only after it completed);
    False keeps plain stream order.
    check_pages: bounds mode (pkv_context_config.check_pages): on CUDA every page id a run reads is
    checked against the pool first and one outside it stops the run with a trap (the CUDA context is
    then lost; page_fault() says where it was); off costs nothing.
    Not thread-safe: use one wrapper per thread.
    """

    def __init__(self, workspace_bytes=None, kv_layout="NHD", backend="auto", device=0, num_threads=0, policy=None,
                 pdl=True, check_pages=False):
        if kv_layout not in _LAYOUTS:
            raise ValueError(f"kv_layout must be 'NHD' or 'HND', not {kv_layout!r}")
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS}, not {backend!r}")
        if backend == "auto":
            backend = "cuda" if cuda_available() and A.torch_cuda_usable() else "cpu"
        self._kv_layout = kv_layout
        self._device = int(device)
        cfg = L.ContextConfig()
        lib.pkv_context_config_default(ctypes.byref(cfg))
        cfg.backend = L.BACKEND_CUDA if backend == "cuda" else L.BACKEND_CPU
        cfg.device = self._device
        cfg.num_threads = int(num_threads)
        cfg.pdl = 1 if pdl else 0
        cfg.check_pages = 1 if check_pages else 0
        self._pdl = bool(pdl)
        ctx = ctypes.c_void_p()
        check(lib.pkv_context_create(ctypes.byref(cfg), ctypes.byref(ctx)), call="pkv_context_create")
        self._ctx = ctx
        self._free_ctx = weakref.finalize(self, lib.pkv_context_free, ctx)
        self._backend = "cuda" if lib.pkv_context_backend(ctx) == L.BACKEND_CUDA else "cpu"
        if policy is not None:  # a policy file from `pkv calibrate`: route="auto" then follows its cost model
            model = L.CostModel()
            check(lib.pkv_cost_model_load(str(policy).encode(), ctypes.byref(model)), call="pkv_cost_model_load")
            check(lib.pkv_context_set_cost_model(ctx, ctypes.byref(model)), ctx=ctx, call="pkv_context_set_cost_model")
        self._torch = A.torch() if self._backend == "cuda" else None
        plan = ctypes.c_void_p()
        check(lib.pkv_plan_create(ctypes.byref(plan)), call="pkv_plan_create")
        self._plan = plan
        self._free_plan = weakref.finalize(self, lib.pkv_plan_free, plan)
        self._ws = None       # owning buffer (numpy uint8 or torch CUDA uint8), 256 bytes of slack
        self._ws_ptr = None   # 256-byte aligned address inside it
        self._ws_bytes = 0
        self._planned = False
        self._meta = None
        self._run_memo = {}  # run()'s checked arguments by the tensors they were checked for (_arrays.memo_key)
        self._indices_dev = None  # kv_page_indices as run() passes them (backend memory)
        self._seq_lens = None
        self._graph_key = None  # graph-stable plans: (signature, workspace, page-id buffer) of the first
        if workspace_bytes:
            self._grow_workspace(int(workspace_bytes))

    # ---- properties -----------------------------------------------------------------------------
    @property
    def backend(self):
        """'cpu' or 'cuda'."""
        return self._backend

    @property
    def device(self):
        return self._device if self._backend == "cuda" else "cpu"

    @property
    def device_name(self):
        return lib.pkv_context_device_name(self._ctx).decode()

    @property
    def parallelism(self):
        """Parallel units the planner splits over (SMs or threads)."""
        return int(lib.pkv_context_parallelism(self._ctx))

    @property
    def kv_layout(self):
        return self._kv_layout

    @property
    def route(self):
        """The route of the current plan ('single', 'split', 'bucketed', 'workqueue'), or None."""
        if not self._planned:
            return None
        return lib.pkv_route_name(lib.pkv_plan_route(self._plan)).decode()

    def page_fault(self):
        """The first page id outside the pool a run met, as a dict (row, kv_head, page: its place in the
        row's pages, page_id), or None: CUDA in bounds mode (check_pages=True), or the CPU run that failed."""
        f = L.PageFault()
        if not lib.pkv_context_page_fault(self._ctx, ctypes.byref(f)):
            return None
        return {n: int(getattr(f, n)) for n, _ in f._fields_}

    @property
    def counters(self):
        """Counters of the current plan (launches, tasks, kv_bytes, ...) as a dict, or None."""
        if not self._planned:
            return None
        return lib.pkv_plan_counters(self._plan).contents.to_dict()

    @property
    def workspace_size(self):
        """Bytes of workspace the wrapper holds."""
        return self._ws_bytes

    @property
    def plan_workspace_size(self):
        """Bytes of workspace the current plan needs (0 before plan)."""
        return int(lib.pkv_plan_workspace_size(self._plan)) if self._planned else 0

    @property
    def plan_info(self):
        """Sizes of the current plan: batch_size, tasks, merges, phases, state_slots, grid_tasks (the task
        grid's CTAs: a graph-stable plan's fixed grid, else the tasks) and graph_signature (0 unless
        graph-stable; equal signatures replay one captured graph)."""
        if not self._planned:
            return None
        p = self._plan
        return {"batch_size": int(lib.pkv_plan_batch_size(p)), "tasks": int(lib.pkv_plan_num_tasks(p)),
                "merges": int(lib.pkv_plan_num_merges(p)), "phases": int(lib.pkv_plan_num_phases(p)),
                "state_slots": int(lib.pkv_plan_num_state_slots(p)), "grid_tasks": int(lib.pkv_plan_grid_tasks(p)),
                "graph_signature": int(lib.pkv_plan_graph_signature(p))}

    def validate_plan(self):
        """Checks the plan's internal consistency (pkv_plan_validate); raises PkvError."""
        self._require_plan()
        check(lib.pkv_plan_validate(self._plan, self._seq_lens.c_ptr()), call="pkv_plan_validate")

    # ---- workspace ------------------------------------------------------------------------------
    def _grow_workspace(self, need):
        if need <= self._ws_bytes:
            return
        need = (need + _WS_ALIGN - 1) // _WS_ALIGN * _WS_ALIGN
        if self._backend == "cuda":
            t = self._torch
            buf = t.empty(need + _WS_ALIGN, dtype=t.uint8, device=f"cuda:{self._device}")
            base = buf.data_ptr()
        else:
            np = A.numpy()
            buf = np.empty(need + _WS_ALIGN, dtype=np.uint8)
            base = buf.ctypes.data
        self._ws = buf
        self._ws_ptr = base + (-base) % _WS_ALIGN
        self._ws_bytes = need

    def _adopt_workspace(self, buf):
        """Uses buf (a contiguous torch tensor on this wrapper's GPU, or a host numpy array / torch CPU
        tensor for the CPU backend) as the workspace from now on; a plan that needs more grows it by
        a new allocation, as before.  The library never needs it zeroed."""
        a = A.describe(buf, "float_workspace_buffer")
        want = f"cuda:{self._device}" if self._backend == "cuda" else "cpu"
        if a.device != want:
            raise ValueError(f"float_workspace_buffer is on {a.device}, the wrapper runs on {want}")
        if not a.contiguous:
            raise ValueError("float_workspace_buffer must be contiguous")
        nbytes = int(buf.nbytes) if a.kind == "numpy" else int(buf.numel() * buf.element_size())
        ptr = a.ptr + (-a.ptr) % _WS_ALIGN
        usable = (nbytes - (ptr - a.ptr)) // _WS_ALIGN * _WS_ALIGN
        if usable <= 0:
            raise ValueError(f"float_workspace_buffer holds {nbytes} bytes, too few for a {_WS_ALIGN}-byte "
                             "aligned workspace")
        self._ws, self._ws_ptr, self._ws_bytes = buf, ptr, usable
        if self._planned:
            self._grow_workspace(int(lib.pkv_plan_workspace_size(self._plan)))

    # ---- plan -----------------------------------------------------------------------------------
    def _host_tables(self, indptr, indices, seq_lens):
        """Host copies of the three page-table vectors; CUDA tensors come back in one copy."""
        items = {"indptr": indptr, "indices": indices, "seq_lens": seq_lens}
        dev = {k: v for k, v in items.items() if A.is_torch(v) and v.device.type != "cpu"}
        if dev:
            t = A.torch()
            for k, v in dev.items():
                if v.dim() != 1:
                    raise ValueError(f"{k} must be 1-D, got shape {tuple(v.shape)}")
                if v.is_floating_point():
                    raise TypeError(f"{k} must hold integers, not {v.dtype}")
            parts = [v.to(t.int32) for v in dev.values()]
            host = t.cat(parts).cpu() if len(parts) > 1 else parts[0].cpu()  # the one D2H copy
            at = 0
            for k, v in dev.items():
                items[k] = host[at:at + v.numel()]
                at += v.numel()
        return (A.HostInt32(items["indptr"], "indptr"), A.HostInt32(items["indices"], "indices"),
                A.HostInt32(items["seq_lens"], "seq_lens"))

    def plan(self, indptr, indices, seq_lens=None, num_qo_heads=None, num_kv_heads=None, head_dim=None,
             page_size=None, num_pages=None, q_data_type="float16", kv_data_type=None, sm_scale=None,
             route="auto", num_splits=0, chunk_pages=0, ctas_per_unit=0, min_chunk_tokens=0, max_splits=0,
             parallelism=0, last_page_len=None, logits_soft_cap=None, window_left=-1, graph_max_batch=0,
             graph_tasks=0, indices_device=None, _check_pages=None):
        """Plans one decode step from the page table (CSR: indptr [B+1], indices [nnz], seq_lens [B]).

        seq_lens is the number of tokens of each row; a row may hold more pages than that needs (the
        spare ones are not read).  FlashInfer's plan() takes last_page_len [B] in that place instead:
        pass it by keyword (last_page_len=..., seq_lens left out) and each row's length is
        (its pages - 1) * page_size + last_page_len (1..page_size; 0 for a row without pages).

        The table may be numpy int32 arrays, lists, or torch CPU/CUDA integer tensors (CUDA ones are
        copied to the host once, here).  num_pages is the size of the page pool (k_cache.shape[0]);
        without it the pool is taken as max(indices) + 1, so ids past the real pool cannot be caught:
        pass num_pages for full range checking.  route: 'auto', 'single', 'split', 'bucketed',
        'workqueue'; the other keywords are pkv_plan_options (0 = the library's choice).
        kv_data_type: the caches' dtype, as FlashInfer's: None or q_data_type (caches of q's dtype), or an
        fp8 type - torch.float8_e4m3fn / float8_e5m2 (or their names, ml_dtypes' types, vLLM's "fp8",
        "fp8_e4m3", "fp8_e5m2") - whose caches run() dequantizes with its k_scale and v_scale (both
        backends; on CUDA per-head scales are device tensors).
        logits_soft_cap: as FlashInfer's (Gemma-2: 50), each score s -> cap * tanh(s / cap).
        window_left: as FlashInfer's, a sliding window (-1: none; w >= 0: each row attends to its
        last w + 1 tokens).  Both on either backend.
        graph_max_batch > 0: a graph-stable plan (CUDA graphs: capture run() once, then for each later
        step plan() and replay the graph).  Its launches depend only on the shape, graph_max_batch and
        graph_tasks, never on the lengths; plan() uploads it at once (outside any capture) into the
        same workspace, and run() reads the page ids from the same device buffer: indices_device, or
        indices itself when it is a CUDA int32 tensor (keep that buffer: the graph holds its address).
        Pass num_pages (the pool's size, fixed); a plan whose launches differ from the first
        graph-stable plan's (pkv_plan_graph_signature) raises ValueError.  Route: auto or workqueue.
        Grows the workspace when the plan needs more.  Raises PkvError, ValueError, TypeError.
        """
        self._planned = False
        missing = [n for n, v in (("num_qo_heads", num_qo_heads), ("num_kv_heads", num_kv_heads),
                                  ("head_dim", head_dim), ("page_size", page_size)) if v is None]
        if missing:
            raise TypeError(f"plan() missing required argument(s): {', '.join(missing)}")
        if (seq_lens is None) == (last_page_len is None):
            raise ValueError("pass seq_lens (tokens per row) or, as FlashInfer does, last_page_len "
                             "(tokens in each row's last page) by keyword: exactly one of them")
        lens_name = "seq_lens" if seq_lens is not None else "last_page_len"
        q_dtype = A.dtype_name(q_data_type)
        kv_dtype = q_dtype if kv_data_type is None else A.kv_dtype_name(kv_data_type)
        if not A.is_fp8(kv_dtype) and kv_dtype != q_dtype:
            raise ValueError(f"kv_data_type {kv_data_type!r} must equal q_data_type {q_data_type!r} or be an fp8 type")
        h_indptr, h_indices, h_lens = self._host_tables(indptr, indices,
                                                        seq_lens if seq_lens is not None else last_page_len)
        B = len(h_lens)
        if len(h_indptr) != B + 1:
            raise ValueError(f"indptr has {len(h_indptr)} entries, expected len({lens_name}) + 1 = {B + 1}")
        if last_page_len is not None:
            h_lens = _lens_from_last_page(h_indptr, h_lens, int(page_size))
        nnz = h_indptr[B]
        if nnz > len(h_indices):
            raise ValueError(f"indptr[-1] = {nnz} but indices has only {len(h_indices)} entries")
        if num_pages is None:
            top = h_indices.max_of(nnz) if h_indptr[0] == 0 else None
            num_pages = max(top + 1, 0) if top is not None else 0

        prob = L.Problem()
        lib.pkv_problem_default(ctypes.byref(prob))
        prob.num_qo_heads = L.as_int(num_qo_heads, "num_qo_heads")
        prob.num_kv_heads = L.as_int(num_kv_heads, "num_kv_heads")
        prob.head_dim, prob.page_size = L.as_int(head_dim, "head_dim"), L.as_int(page_size, "page_size")
        prob.num_pages = L.as_int(num_pages, "num_pages", 0, 2**31 - 1)
        prob.layout = _LAYOUTS[self._kv_layout]
        prob.dtype = A.dtype_code(q_dtype)
        if A.is_fp8(kv_dtype):
            prob.kv_dtype = A.dtype_code(kv_dtype)
        L.set_score_options(prob, sm_scale, logits_soft_cap, window_left)

        opts = L.PlanOptions()
        lib.pkv_plan_options_default(ctypes.byref(opts))
        opts.route = _route_code(route)
        given = {"parallelism": parallelism, "ctas_per_unit": ctas_per_unit, "num_splits": num_splits,
                 "chunk_pages": chunk_pages, "min_chunk_tokens": min_chunk_tokens, "max_splits": max_splits,
                 "graph_max_batch": graph_max_batch, "graph_tasks": graph_tasks}
        for field, value in given.items():
            setattr(opts, field, L.as_int(value, field))
        graph = opts.graph_max_batch > 0
        if graph and self._backend == "cuda":
            fixed = indices_device if indices_device is not None else indices
            if not _cuda_int32_vector(fixed, self._device):
                raise ValueError("a graph-stable plan reads the page ids from one fixed buffer: pass a contiguous "
                                 f"1-D int32 tensor on cuda:{self._device} as indices (or indices_device)")
            if fixed.numel() < nnz:
                raise ValueError(f"the page-id buffer holds {fixed.numel()} ids, the table {nnz}")

        table = L.PageTable(B, h_indptr.c_ptr(), h_indices.c_ptr(), h_lens.c_ptr())
        check(lib.pkv_plan_step(self._ctx, ctypes.byref(prob), ctypes.byref(table), ctypes.byref(opts),
                                self._plan), self._ctx, "pkv_plan_step")
        self._grow_workspace(int(lib.pkv_plan_workspace_size(self._plan)))

        if graph and self._backend == "cuda":
            self._indices_dev = indices_device if indices_device is not None else indices
            self._indices_ptr = self._indices_dev.data_ptr()
        elif self._backend == "cuda":
            t, dev = self._torch, f"cuda:{self._device}"
            if _cuda_int32_vector(indices, self._device):
                self._indices_dev = indices  # the user's device tensor, used in place
            else:
                src = h_indices.data
                src = list(src) if isinstance(src, ctypes.Array) else src
                self._indices_dev = t.as_tensor(src, dtype=t.int32).to(dev)  # one H2D copy per plan
            self._indices_ptr = self._indices_dev.data_ptr()
        else:
            self._indices_dev = h_indices
            self._indices_ptr = h_indices.ptr
        self._seq_lens = h_lens
        self._meta = dict(B=B, Hq=prob.num_qo_heads, Hkv=prob.num_kv_heads, d=prob.head_dim,
                          page_size=prob.page_size, num_pages=int(prob.num_pages), dtype=q_dtype, kv_dtype=kv_dtype)
        if _check_pages is not None:  # the pool is not known (persistentkv.flashinfer's graphs): ids checked
            self._meta["num_pages"] = int(_check_pages)
        # what run()'s checks of its tensors depend on besides the tensors themselves (_run_memo)
        self._meta_key = (self._kv_layout, *(self._meta[k] for k in ("B", "Hq", "Hkv", "d", "page_size", "num_pages",
                                                                      "dtype", "kv_dtype")))
        if graph:
            key = (int(lib.pkv_plan_graph_signature(self._plan)), self._ws_ptr, self._ws_bytes,
                   self._indices_ptr if self._backend == "cuda" else None)
            if self._graph_key is not None and key != self._graph_key:
                raise ValueError("this graph-stable plan does not launch what the first one did (another shape, "
                                 "pool, capacity, workspace or page-id buffer): a graph captured before would not "
                                 "replay it; use a new wrapper for it")
            self._graph_key = key
            if self._backend == "cuda":  # now, outside any capture: the graph replays what is in the workspace
                stream = self._torch.cuda.current_stream(self._device).cuda_stream
                check(lib.pkv_plan_upload(self._ctx, self._plan, self._ws_ptr, self._ws_bytes, stream), self._ctx,
                      "pkv_plan_upload")
        self._planned = True

    # ---- run ------------------------------------------------------------------------------------
    def _require_plan(self):
        if not self._planned:
            raise RuntimeError("call plan() (successfully) before run()")

    @staticmethod
    def _lead_stride(a, name, unit):
        """Elements from one entry of the first dimension (a page of a cache, a row of q or out) to the
        next, where each entry is dense (a C-contiguous tensor, or a view such as kv_cache[:, 0] of one
        [num_pages, 2, ...] tensor or q = qkv[:, :Hq * d].view(B, Hq, d) of a fused projection's output);
        ValueError for entries that are not dense or overlap."""
        o = a.obj
        if a.kind == "numpy" and any(s % o.itemsize for s in o.strides):
            raise ValueError(f"{name}: byte strides {list(o.strides)} are not whole {o.itemsize}-byte elements")
        st = list(o.stride()) if a.kind == "torch" else [s // o.itemsize for s in o.strides]
        dense = 1
        if 0 in a.shape:  # nothing to read or write: any strides
            for n in a.shape[1:]:
                dense *= n
            return dense
        for i in range(len(a.shape) - 1, 0, -1):
            if a.shape[i] > 1 and st[i] != dense:
                raise ValueError(f"{name}: each {unit} must be dense (strides {st} for shape {list(a.shape)}); "
                                 f"{unit}s themselves may be strided")
            dense *= a.shape[i]
        if a.shape[0] <= 1:
            return dense
        if st[0] < dense:
            raise ValueError(f"{name}: {unit}s {st[0]} elements apart overlap (each holds {dense})")
        return st[0]

    def _check_placement(self, a, name, strided=False):
        if self._backend == "cuda":
            want = f"cuda:{self._device}"
            if a.kind != "torch":
                raise TypeError(f"{name} must be a torch CUDA tensor for the cuda backend, not a numpy array")
            if a.device != want:
                raise ValueError(f"{name} is on {a.device}, the wrapper runs on {want}")
            if a.ptr % _CUDA_ALIGN:
                raise ValueError(f"{name} must be {_CUDA_ALIGN}-byte aligned (data_ptr {a.ptr:#x})")
        elif a.device != "cpu":
            raise ValueError(f"{name} is on {a.device}, the cpu backend needs host memory "
                             "(numpy arrays or torch CPU tensors)")
        if not a.contiguous and not strided:
            raise ValueError(f"{name} must be C-contiguous")

    def _check_data(self, a, name, shape, dtype, strided=False):
        self._check_placement(a, name, strided)
        if dtype == "float32":
            if a.dtype != "float32":
                raise TypeError(f"{name} must be float32, not {a.dtype}")
        elif not A.accepts_dtype(a, dtype):
            extra = " (or uint16 holding bf16 bits)" if dtype == "bfloat16" and a.kind == "numpy" else ""
            extra = " (or uint8 holding its codes)" if A.is_fp8(dtype) else extra
            raise TypeError(f"{name} has dtype {a.dtype}, the plan expects {dtype}{extra}")
        if shape is not None and a.shape != shape:
            raise ValueError(f"{name} has shape {list(a.shape)}, expected {list(shape)}")

    def _alloc_like(self, a, shape, float32=False):
        if a.kind == "numpy":
            np = A.numpy()
            return np.empty(shape, dtype=np.float32 if float32 else a.obj.dtype)
        t = A.torch()
        return t.empty(shape, dtype=t.float32 if float32 else a.obj.dtype, device=a.obj.device)

    def _scale(self, scale, name):
        """run()'s k_scale or v_scale as (per-tensor, per-head address or None, array kept alive)."""
        device = f"cuda:{self._device}" if self._backend == "cuda" else "cpu"
        return A.kv_scale(scale, name, self._meta["Hkv"], device)

    def run(self, q, k_cache, v_cache=None, return_lse=False, out=None, lse=None, k_scale=None, v_scale=None):
        """o [B, Hq, d] (and lse [B, Hq] fp32 when return_lse) for the planned step.

        q [B, Hq, d]; k_cache, v_cache NHD [num_pages, page_size, Hkv, d] or HND
        [num_pages, Hkv, page_size, d]; dtype as planned (numpy bf16: uint16 bits or ml_dtypes; fp8
        caches: torch.float8_e4m3fn / float8_e5m2, ml_dtypes' float8 types, or uint8 arrays / tensors of
        the codes, the type plan()'s kv_data_type).
        k_scale, v_scale: an fp8 cache's dequantization scales, as FlashInfer's and vLLM's (stored value x
        scale = real value): None (1.0), a positive number, or [num_kv_heads] per-head scales (float32 in
        the backend's memory).  A cache of q's dtype takes None or 1.0 only (pkv_tensors).
        As in FlashInfer, run(q, (k_cache, v_cache)) and run(q, kv_cache) with one tensor that holds
        K and V of each page together, NHD [num_pages, 2, page_size, Hkv, d] or HND
        [num_pages, 2, Hkv, page_size, d] (vLLM's FlashInfer layout), read in place too; so are k and v
        views whose pages are dense but strided (kv_cache[:, 0], kv_cache[:, 1]), one stride for both,
        and q and out whose rows are dense but strided (q = qkv[:, :Hq * d].view(B, Hq, d), the query
        part of a fused QKV projection; CUDA: row strides a multiple of 8 elements).
        Nothing is copied; out/lse, when given, are written in place (lse is written whenever it
        is given).  CUDA: runs on torch.cuda.current_stream().
        """
        self._require_plan()
        # tensors as a run checked before (every layer of a model calls run with its own caches and views of the same
        # q and out, step after step): their arguments as checked then, the checks skipped
        memo = None
        if out is not None and lse is None and not return_lse and k_scale is None and v_scale is None:
            memo = (self._meta_key, A.memo_key(q), A.memo_key(k_cache), A.memo_key(v_cache), A.memo_key(out))
            if any(k is A.NO_MEMO for k in memo):
                memo = None
            else:
                hit = self._run_memo.get(memo)
                if hit is not None:  # the addresses of these tensors, into the arguments as checked
                    t, v_offset = hit
                    if v_cache is None and isinstance(k_cache, (tuple, list)):
                        k_cache, v_cache = k_cache
                    t.q, t.o = A.data_ptr(q), A.data_ptr(out)
                    t.k_cache = A.data_ptr(k_cache)
                    t.v_cache = t.k_cache + v_offset if v_cache is None else A.data_ptr(v_cache)
                    return self._launch(t, out, None, False)
        m = self._meta
        if self._kv_layout == "NHD":
            tail, names = (m["page_size"], m["Hkv"], m["d"]), "[num_pages, page_size, num_kv_heads, head_dim]"
        else:
            tail, names = (m["Hkv"], m["page_size"], m["d"]), "[num_pages, num_kv_heads, page_size, head_dim]"
        qa = A.describe(q, "q")
        self._check_data(qa, "q", (m["B"], m["Hq"], m["d"]), m["dtype"], strided=True)  # q [B, Hq, d]
        row_elems = m["Hq"] * m["d"]
        q_stride = self._lead_stride(qa, "q", "row")  # rows of a fused QKV output are read in place
        page_elems = tail[0] * tail[1] * tail[2]
        page_stride = 0
        if v_cache is None and isinstance(k_cache, (tuple, list)) and len(k_cache) == 2:
            k_cache, v_cache = k_cache
        if v_cache is None:  # one cache with K and V interleaved per page
            kva = A.describe(k_cache, "kv_cache")
            self._check_data(kva, "kv_cache", None, m["kv_dtype"])
            if not A.is_fp8(m["kv_dtype"]) and kva.dtype != qa.dtype:
                raise TypeError(f"q and kv_cache must share a dtype (got {qa.dtype}, {kva.dtype})")
            if len(kva.shape) != 5 or kva.shape[1] != 2 or kva.shape[2:] != tail:
                raise ValueError(f"kv_cache has shape {list(kva.shape)}, expected {self._kv_layout} "
                                 f"[num_pages, 2, {names[len('[num_pages, '):]} = [*, 2, {', '.join(map(str, tail))}] "
                                 "(or pass k_cache and v_cache)")
            if kva.shape[0] < m["num_pages"]:
                raise ValueError(f"kv_cache holds {kva.shape[0]} pages, the plan's pool has num_pages = "
                                 f"{m['num_pages']}")
            k_ptr = kva.ptr
            v_ptr = kva.ptr + page_elems * A.itemsize(m["kv_dtype"])
            page_stride = 2 * page_elems
        else:
            ka, va = A.describe(k_cache, "k_cache"), A.describe(v_cache, "v_cache")
            self._check_data(ka, "k_cache", None, m["kv_dtype"], strided=True)
            self._check_data(va, "v_cache", None, m["kv_dtype"], strided=True)
            if A.is_fp8(m["kv_dtype"]):
                if ka.dtype != va.dtype:
                    raise TypeError(f"k_cache and v_cache must share a dtype (got {ka.dtype}, {va.dtype})")
            elif ka.dtype != qa.dtype or va.dtype != qa.dtype:
                raise TypeError(f"q, k_cache and v_cache must share a dtype (got {qa.dtype}, {ka.dtype}, {va.dtype})")
            for a, name in ((ka, "k_cache"), (va, "v_cache")):
                if len(a.shape) != 4 or a.shape[1:] != tail:
                    raise ValueError(f"{name} has shape {list(a.shape)}, expected {self._kv_layout} "
                                     f"{names} = [*, {', '.join(map(str, tail))}]")
                if a.shape[0] < m["num_pages"]:
                    raise ValueError(f"{name} holds {a.shape[0]} pages, the plan's pool has num_pages = "
                                     f"{m['num_pages']}")
            if va.shape != ka.shape:
                raise ValueError(f"v_cache has shape {list(va.shape)}, k_cache {list(ka.shape)}")
            k_ptr, v_ptr = ka.ptr, va.ptr
            # views whose pages are dense but strided (kv_cache[:, 0] and kv_cache[:, 1] of one
            # [num_pages, 2, ...] tensor): one page stride for both, checked by the library
            ks, vs = self._lead_stride(ka, "k_cache", "page"), self._lead_stride(va, "v_cache", "page")
            if ks != vs:
                raise ValueError(f"k_cache and v_cache step {ks} and {vs} elements from page to page: they "
                                 "must share one page stride")
            if ks != page_elems:
                page_stride = ks

        if out is None:
            out = self._alloc_like(qa, qa.shape)
        oa = A.describe(out, "out")
        self._check_data(oa, "out", qa.shape, m["dtype"], strided=True)
        o_stride = self._lead_stride(oa, "out", "row")
        if oa.dtype != qa.dtype:
            raise TypeError(f"out has dtype {oa.dtype}, q has {qa.dtype}")
        if oa.kind == "numpy" and not out.flags.writeable:
            raise ValueError("out is read-only")
        if lse is None and return_lse:
            lse = self._alloc_like(qa, (m["B"], m["Hq"]), float32=True)
        lse_ptr = None
        if lse is not None:
            la = A.describe(lse, "lse")
            self._check_data(la, "lse", (m["B"], m["Hq"]), "float32")  # lse [B, Hq]
            if la.kind == "numpy" and not lse.flags.writeable:
                raise ValueError("lse is read-only")
            lse_ptr = la.ptr

        t = L.Tensors(qa.ptr, k_ptr, v_ptr, self._indices_ptr, oa.ptr, lse_ptr, page_stride,
                      q_stride if q_stride != row_elems else 0, o_stride if o_stride != row_elems else 0)
        t.k_scale, t.k_head_scales, k_keep = self._scale(k_scale, "k_scale")
        t.v_scale, t.v_head_scales, v_keep = self._scale(v_scale, "v_scale")
        res = self._launch(t, out, lse, return_lse)
        del k_keep, v_keep  # alive until the run is queued (CUDA: torch's allocator keeps it for the stream)
        if memo is not None:
            if len(self._run_memo) >= _RUN_MEMO_SIZE:
                self._run_memo.clear()
            # the arguments and where V starts in a one-tensor cache; the memo keeps no tensor alive
            self._run_memo[memo] = (t, v_ptr - k_ptr)
        return res

    def _launch(self, t, out, lse, return_lse):
        """pkv_run with the checked arguments t (the plan's page ids set here: each plan has its own)."""
        t.kv_page_indices = self._indices_ptr
        stream = None
        if self._backend == "cuda":
            stream = A.raw_stream(self._device)
        check(lib.pkv_run(self._ctx, self._plan, self._ws_ptr, self._ws_bytes, ctypes.byref(t), stream),
              self._ctx, "pkv_run")
        return (out, lse) if return_lse else out

    forward = run

    def __repr__(self):
        state = f"route={self.route!r}" if self._planned else "unplanned"
        return (f"BatchDecodeWithPagedKVCacheWrapper(backend={self._backend!r}, device={self.device_name!r}, "
                f"kv_layout={self._kv_layout!r}, {state}, workspace={self._ws_bytes})")
