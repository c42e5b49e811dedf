"""Loading of libpersistentkv, ctypes mirrors of the C structs, prototypes and errors."""

import ctypes
import ctypes.util
import enum
import math
import operator
import os
import sys
from pathlib import Path

__all__ = ["lib", "library_path", "LibraryNotFoundError", "PkvError", "Status", "check"]

_LIB_NAME = "libpersistentkv.so"
_LAB_NAME = "libpersistentkv_lab.so"
_BUILD_DIRS = ("build", "build-gpu", "build-cpu")


def _package_lib_dirs():
    """<package>/lib for every folder of this package: where pip install ./python puts the libraries."""
    pkg = sys.modules.get(__package__)
    dirs = list(getattr(pkg, "__path__", None) or []) + [str(Path(__file__).resolve().parent)]
    out = []
    for d in dirs:
        lib_dir = Path(d).resolve() / "lib"
        if lib_dir not in out:
            out.append(lib_dir)
    return out


def _checkout_root():
    """The repository root when this package runs from a source checkout (python/persistentkv), else None."""
    root = Path(__file__).resolve().parents[2]
    if (root / "include" / "persistentkv.h").is_file() and (root / "python" / "pyproject.toml").is_file():
        return root
    return None


_REPO_ROOT = _checkout_root()


class LibraryNotFoundError(ImportError):
    """libpersistentkv could not be found or loaded; the message lists every place tried."""


def _candidates(name):
    """Where a library is looked for, in order: the package's own lib/, then (in a source checkout)
    its build folders, then the environment's prefix (cmake --install build --prefix "$VIRTUAL_ENV")."""
    cands = [d / name for d in _package_lib_dirs()]
    if _REPO_ROOT is not None:
        cands += [_REPO_ROOT / d / name for d in _BUILD_DIRS]
    cands += [Path(sys.prefix) / sub / name for sub in ("lib", "lib64")]
    return cands


def _load():
    tried = []
    env = os.environ.get("PKV_LIBRARY")
    if env:
        # An explicit choice is never silently replaced by another library.
        try:
            return ctypes.CDLL(env), env
        except OSError as e:
            raise LibraryNotFoundError(f"PKV_LIBRARY={env!r} could not be loaded: {e}") from None
    tried.append("$PKV_LIBRARY (unset)")
    if _REPO_ROOT is None:
        tried.append("the build folders of a source checkout (not running from one)")
    for cand in _candidates(_LIB_NAME):
        if cand.is_file():
            try:
                return ctypes.CDLL(str(cand)), str(cand)
            except OSError as e:
                tried.append(f"{cand} ({e})")
        else:
            tried.append(f"{cand} (missing)")
    found = ctypes.util.find_library("persistentkv")
    if found:
        try:
            return ctypes.CDLL(found), found
        except OSError as e:
            tried.append(f"find_library: {found} ({e})")
    else:
        tried.append('ctypes.util.find_library("persistentkv") (not found)')
    raise LibraryNotFoundError(
        "libpersistentkv.so not found: pip install ./python (builds it into the package), or in a checkout "
        "cmake -S . -B build && cmake --build build, or set PKV_LIBRARY to its path. Tried:\n  "
        + "\n  ".join(tried))


_serving, library_path = _load()


# The lab's shared library (libpersistentkv_lab.so: traces, the float64 reference, plan internals), found
# at $PKV_LAB_LIBRARY or next to the serving library, then where the serving library is looked for;
# optional for serving.
def _load_lab():
    env = os.environ.get("PKV_LAB_LIBRARY")
    cands = [env] if env else []
    base = Path(library_path).resolve().parent if os.path.sep in str(library_path) else None
    if base is not None:
        cands.append(str(base / _LAB_NAME))
    cands += [str(c) for c in _candidates(_LAB_NAME)]
    for cand in cands:
        if cand and Path(cand).is_file():
            try:
                return ctypes.CDLL(cand)
            except OSError:
                continue
    return None


_lab = _load_lab()
if _lab is not None:
    _lab.pkv_last_error.restype, _lab.pkv_last_error.argtypes = ctypes.c_char_p, []
# the lab's functions (their errors are the lab library's own thread-local message)
LAB_FUNCTIONS = ("pkv_reference", "pkv_reference_kv", "pkv_plan_num_state_slots", "pkv_plan_problem", "pkv_plan_batch_size")
LAB_PREFIXES = ("pkv_trace_", "pkv_rng_")


def _is_lab(name):
    return name in LAB_FUNCTIONS or name.startswith(LAB_PREFIXES)


class _Libraries:
    """The serving library's functions, and the lab's by their names (pkv_lab.h)."""

    def __getattr__(self, name):
        if _is_lab(name):
            if _lab is None:
                raise LibraryNotFoundError(
                    f"{name} is in the lab library ({_LAB_NAME}), which was not found next to {library_path}; "
                    "build it (cmake --build build) or set PKV_LAB_LIBRARY")
            fn = getattr(_lab, name)
        else:
            fn = getattr(_serving, name)
        setattr(self, name, fn)
        return fn


lib = _Libraries()

# ---- enums (C enums are int) ------------------------------------------------------------------
c_enum = ctypes.c_int


class Status(enum.IntEnum):
    OK = 0
    NULL_POINTER = 1
    INVALID_ARGUMENT = 2
    HEAD_GROUP = 3
    UNSUPPORTED_HEAD_DIM = 4
    UNSUPPORTED_DTYPE = 5
    NEGATIVE_LENGTH = 6
    LENGTH_EXCEEDS_PAGES = 7
    PAGE_OUT_OF_RANGE = 8
    WORKSPACE_TOO_SMALL = 9
    BAD_INDPTR = 10
    UNSUPPORTED = 11
    BACKEND_UNAVAILABLE = 12
    CUDA = 13
    OUT_OF_MEMORY = 14
    PLAN_MISMATCH = 15
    IO = 16
    PARSE = 17
    PAGE_SIZE = 18
    BATCH_SIZE = 19
    POOL_EXHAUSTED = 20
    UNKNOWN_REQUEST = 21
    REQUEST_FREED = 22
    BEYOND_LENGTH = 23
    FOREIGN_PAGE = 24


DTYPE_FP16, DTYPE_BF16, DTYPE_FP32, DTYPE_FP8_E4M3, DTYPE_FP8_E5M2 = 0, 1, 2, 3, 4
LAYOUT_NHD, LAYOUT_HND = 0, 1
BACKEND_CPU, BACKEND_CUDA, BACKEND_BEST = 0, 1, 2


# ---- structs (field order and types as in persistentkv.h) ---------------------------------------
class Problem(ctypes.Structure):
    _fields_ = [("num_qo_heads", ctypes.c_int32), ("num_kv_heads", ctypes.c_int32),
                ("head_dim", ctypes.c_int32), ("page_size", ctypes.c_int32),
                ("num_pages", ctypes.c_int64), ("layout", c_enum), ("dtype", c_enum),
                ("sm_scale", ctypes.c_float), ("logits_soft_cap", ctypes.c_float), ("window", ctypes.c_int32),
                ("kv_dtype", c_enum)]


_i32p = ctypes.POINTER(ctypes.c_int32)


class PageTable(ctypes.Structure):
    _fields_ = [("batch_size", ctypes.c_int32), ("kv_indptr", _i32p),
                ("kv_page_indices", _i32p), ("seq_lens", _i32p)]


class PlanOptions(ctypes.Structure):
    _fields_ = [("route", c_enum), ("parallelism", ctypes.c_int32), ("ctas_per_unit", ctypes.c_int32),
                ("num_splits", ctypes.c_int32), ("chunk_pages", ctypes.c_int32),
                ("min_chunk_tokens", ctypes.c_int32), ("max_splits", ctypes.c_int32),
                ("graph_max_batch", ctypes.c_int32), ("graph_tasks", ctypes.c_int32)]


class Tensors(ctypes.Structure):
    _fields_ = [("q", ctypes.c_void_p), ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p),
                ("kv_page_indices", ctypes.c_void_p), ("o", ctypes.c_void_p),
                ("lse", ctypes.c_void_p), ("kv_page_stride", ctypes.c_int64),
                ("q_row_stride", ctypes.c_int64), ("o_row_stride", ctypes.c_int64),
                ("k_scale", ctypes.c_float), ("v_scale", ctypes.c_float),
                ("k_head_scales", ctypes.c_void_p), ("v_head_scales", ctypes.c_void_p)]


class Counters(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in (
        "launches", "tasks", "grid_ctas", "merges", "kv_bytes", "qo_bytes", "merge_state_bytes",
        "total_tokens")]

    def to_dict(self):
        return {n: int(getattr(self, n)) for n, _ in self._fields_}


class ContextConfig(ctypes.Structure):
    _fields_ = [("backend", c_enum), ("device", ctypes.c_int32), ("num_threads", ctypes.c_int32),
                ("pdl", ctypes.c_int32), ("check_pages", ctypes.c_int32)]


class PageFault(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in ("row", "kv_head", "page", "page_id")]


class Task(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in (
        "row", "kv_head", "tok_begin", "tok_end", "page_base", "state_slot", "merge")]


class Merge(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in ("row", "kv_head", "first_slot", "count")]


class Phase(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in (
        "task_begin", "task_end", "merge_begin", "merge_end", "grid_splits", "row_begin", "row_end")]


class RowSched(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in (
        "row", "seq_len", "page_base", "chunk_tokens", "num_splits", "slot_base", "tok_begin")]


class TraceConfig(ctypes.Structure):
    _fields_ = [("family", c_enum), ("seed", ctypes.c_uint64), ("num_requests", ctypes.c_int32),
                ("max_active", ctypes.c_int32), ("max_steps", ctypes.c_int32),
                ("page_size", ctypes.c_int32), ("hole_fraction", ctypes.c_double)]


class Rng(ctypes.Structure):
    _fields_ = [("state", ctypes.c_uint64)]


class CostModel(ctypes.Structure):
    """pkv_cost_model: the roofline model's coefficients (PKV_COEF_* in persistentkv.h)."""
    _fields_ = [("coef", ctypes.c_double * 8), ("parallelism", ctypes.c_int32), ("cuda_version", ctypes.c_int32),
                ("device", ctypes.c_char * 128), ("rms_us", ctypes.c_double), ("samples", ctypes.c_int32)]


class PagePoolStats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in (
        "num_pages", "pages_used", "pages_free", "peak_used", "pages_shared", "live_requests", "tokens",
        "fragmentation", "cow_copies")]

    def to_dict(self):
        return {n: int(getattr(self, n)) for n, _ in self._fields_}


class PageCopy(ctypes.Structure):
    _fields_ = [("src_page", ctypes.c_int32), ("dst_page", ctypes.c_int32)]


class AppendTensors(ctypes.Structure):
    _fields_ = [("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("k_token_stride", ctypes.c_int64),
                ("v_token_stride", ctypes.c_int64), ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p),
                ("kv_page_stride", ctypes.c_int64)] + [(n, ctypes.c_void_p) for n in (
                    "kv_indptr", "kv_page_indices", "kv_last_page_len", "seq_lens", "batch_indices", "positions",
                    "append_indptr")] + [("k_scale", ctypes.c_float), ("v_scale", ctypes.c_float),
                                         ("k_head_scales", ctypes.c_void_p), ("v_head_scales", ctypes.c_void_p)]


# ---- prototypes ---------------------------------------------------------------------------------
_vp, _cp, _P = ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER
_protos = {
    "pkv_status_string": (_cp, [c_enum]),
    "pkv_problem_default": (None, [_P(Problem)]),
    "pkv_block_table_to_csr": (c_enum, [_i32p, ctypes.c_int32, ctypes.c_int32, _i32p, ctypes.c_int32,
                                        _i32p, _i32p, ctypes.c_int64]),
    "pkv_check_page_table": (c_enum, [_P(Problem), _P(PageTable)]),
    "pkv_context_config_default": (None, [_P(ContextConfig)]),
    "pkv_context_create": (c_enum, [_P(ContextConfig), _P(_vp)]),
    "pkv_context_free": (None, [_vp]),
    "pkv_last_error": (_cp, []),
    "pkv_context_backend": (c_enum, [_vp]),
    "pkv_context_parallelism": (ctypes.c_int32, [_vp]),
    "pkv_context_device_name": (_cp, [_vp]),
    "pkv_cuda_available": (ctypes.c_int, []),
    "pkv_context_page_fault": (ctypes.c_int, [_vp, _P(PageFault)]),
    "pkv_route_name": (_cp, [c_enum]),
    "pkv_route_parse": (c_enum, [_cp, _P(c_enum)]),
    "pkv_plan_options_default": (None, [_P(PlanOptions)]),
    "pkv_plan_create": (c_enum, [_P(_vp)]),
    "pkv_plan_free": (None, [_vp]),
    "pkv_plan_step": (c_enum, [_vp, _P(Problem), _P(PageTable), _P(PlanOptions), _vp]),
    "pkv_plan_step_host": (c_enum, [_P(Problem), _P(PageTable), _P(PlanOptions), _vp]),
    "pkv_plan_route": (c_enum, [_vp]),
    "pkv_plan_counters": (_P(Counters), [_vp]),
    "pkv_plan_num_tasks": (ctypes.c_int32, [_vp]),
    "pkv_plan_tasks": (_P(Task), [_vp]),
    "pkv_plan_num_merges": (ctypes.c_int32, [_vp]),
    "pkv_plan_merges": (_P(Merge), [_vp]),
    "pkv_plan_num_phases": (ctypes.c_int32, [_vp]),
    "pkv_plan_phases": (_P(Phase), [_vp]),
    "pkv_plan_num_rows": (ctypes.c_int32, [_vp]),
    "pkv_plan_rows": (_P(RowSched), [_vp]),
    "pkv_plan_num_state_slots": (ctypes.c_int32, [_vp]),
    "pkv_plan_problem": (_P(Problem), [_vp]),
    "pkv_plan_batch_size": (ctypes.c_int32, [_vp]),
    "pkv_plan_workspace_size": (ctypes.c_size_t, [_vp]),
    "pkv_plan_graph_signature": (ctypes.c_uint64, [_vp]),
    "pkv_plan_grid_tasks": (ctypes.c_int32, [_vp]),
    "pkv_plan_validate": (c_enum, [_vp, _i32p]),
    "pkv_workspace_size": (c_enum, [_vp, _P(Problem), ctypes.c_int32, _P(PlanOptions),
                                    _P(ctypes.c_size_t)]),
    "pkv_run": (c_enum, [_vp, _vp, _vp, ctypes.c_size_t, _P(Tensors), _vp]),
    "pkv_plan_upload": (c_enum, [_vp, _vp, _vp, ctypes.c_size_t, _vp]),
    "pkv_reference": (c_enum, [_P(Problem), _P(PageTable), _vp, _vp, _vp, _P(ctypes.c_double),
                               _P(ctypes.c_double)]),
    "pkv_reference_kv": (c_enum, [_P(Problem), _P(PageTable), _vp, _vp, _vp, ctypes.c_float, ctypes.c_float, _vp, _vp,
                                  _P(ctypes.c_double), _P(ctypes.c_double)]),
    "pkv_trace_family_name": (_cp, [c_enum]),
    "pkv_trace_family_parse": (c_enum, [_cp, _P(c_enum)]),
    "pkv_trace_config_default": (None, [_P(TraceConfig), c_enum]),
    "pkv_trace_generate": (c_enum, [_P(TraceConfig), _P(_vp)]),
    "pkv_trace_free": (None, [_vp]),
    "pkv_trace_num_steps": (ctypes.c_int32, [_vp]),
    "pkv_trace_num_requests": (ctypes.c_int32, [_vp]),
    "pkv_trace_get_config": (_P(TraceConfig), [_vp]),
    "pkv_trace_step": (ctypes.c_int32, [_vp, ctypes.c_int32, _P(_i32p), _P(_i32p)]),
    "pkv_trace_request": (None, [_vp, ctypes.c_int32, _i32p, _i32p]),
    "pkv_trace_num_pages": (ctypes.c_int64, [_vp]),
    "pkv_trace_page": (ctypes.c_int32, [_vp, ctypes.c_int32, ctypes.c_int32]),
    "pkv_trace_step_table": (c_enum, [_vp, ctypes.c_int32, _i32p, _i32p, ctypes.c_int64, _i32p]),
    "pkv_trace_checksum": (ctypes.c_uint64, [_vp]),
    "pkv_trace_write": (c_enum, [_vp, _cp]),
    "pkv_trace_read": (c_enum, [_cp, _P(_vp)]),
    "pkv_rng_seed": (None, [_P(Rng), ctypes.c_uint64]),
    "pkv_rng_next": (ctypes.c_uint64, [_P(Rng)]),
    "pkv_rng_uniform_int": (ctypes.c_int64, [_P(Rng), ctypes.c_int64, ctypes.c_int64]),
    "pkv_rng_uniform01": (ctypes.c_double, [_P(Rng)]),
    "pkv_cost_model_load": (c_enum, [_cp, _P(CostModel)]),
    "pkv_context_set_cost_model": (c_enum, [_vp, _P(CostModel)]),
    "pkv_page_pool_create": (c_enum, [ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, _P(_vp)]),
    "pkv_page_pool_free": (None, [_vp]),
    "pkv_page_pool_get_stats": (c_enum, [_vp, _P(PagePoolStats)]),
    "pkv_page_pool_page_refs": (ctypes.c_int32, [_vp, ctypes.c_int32]),
    "pkv_request_create": (c_enum, [_vp, ctypes.c_int32, ctypes.c_int32]),
    "pkv_request_free": (c_enum, [_vp, ctypes.c_int32]),
    "pkv_request_extend": (c_enum, [_vp, ctypes.c_int32, ctypes.c_int32, _P(PageCopy)]),
    "pkv_request_truncate": (c_enum, [_vp, ctypes.c_int32, ctypes.c_int32]),
    "pkv_request_fork": (c_enum, [_vp, ctypes.c_int32, ctypes.c_int32]),
    "pkv_request_length": (c_enum, [_vp, ctypes.c_int32, _i32p]),
    "pkv_request_pages": (c_enum, [_vp, ctypes.c_int32, _vp, ctypes.c_int64, _i32p]),
    "pkv_request_pages_from": (c_enum, [_vp, ctypes.c_int32, ctypes.c_int32, _vp, ctypes.c_int64, _i32p]),
    "pkv_page_pool_table_size": (c_enum, [_vp, _vp, ctypes.c_int32, _P(ctypes.c_int64)]),
    "pkv_page_pool_table": (c_enum, [_vp, _vp, ctypes.c_int32, _vp, _vp, ctypes.c_int64, _vp, _vp]),
    "pkv_page_pool_check_table": (c_enum, [_vp, _vp, _P(PageTable)]),
    "pkv_append_kv": (c_enum, [_vp, _P(Problem), ctypes.c_int32, ctypes.c_int32, _P(AppendTensors), _vp]),
    "pkv_copy_pages": (c_enum, [_vp, _P(Problem), _P(PageCopy), ctypes.c_int32, _vp, _vp, ctypes.c_int64, _vp]),
}
for _name, (_res, _args) in _protos.items():
    if _is_lab(_name) and _lab is None:
        continue  # set when the lab is found; its functions raise LibraryNotFoundError until then
    _fn = getattr(lib, _name)  # AttributeError here: the library is older than this binding
    _fn.restype, _fn.argtypes = _res, _args

# The structs above mirror this version of persistentkv.h: refuse a library of another version.
ABI_VERSION = 600  # 0.6.0
lib.pkv_version.restype, lib.pkv_version.argtypes = ctypes.c_uint32, []
if lib.pkv_version() != ABI_VERSION:
    raise LibraryNotFoundError(
        f"{library_path} is PersistentKV {lib.pkv_version()}, this binding needs {ABI_VERSION}: rebuild the library")


def _names(fn):
    """Names fn(0), fn(1), ... up to the first "unknown" (the library's enum, not a copy)."""
    out = []
    while len(out) < 64:
        name = fn(len(out)).decode()
        if name == "unknown":
            break
        out.append(name)
    return tuple(out)


ROUTES = _names(lib.pkv_route_name)              # ("auto", "single", "split", ...)
TRACE_FAMILIES = _names(lib.pkv_trace_family_name) if _lab is not None else ()  # ("uniform", "bimodal", ...)


def parse_code(parse_fn, name):
    """An enum code from an int or from its name through the library's parser (pkv_*_parse)."""
    if isinstance(name, int):
        return name
    code = ctypes.c_int(0)
    check(parse_fn(str(name).encode(), ctypes.byref(code)), call=parse_fn.__name__)
    return code.value


# ---- arguments ----------------------------------------------------------------------------------
def as_int(x, name, lo=-2**31, hi=2**31 - 1):
    """x as a Python int in [lo, hi] (int32 by default): a TypeError for a non-integer (3.7, "1"), a
    ValueError outside the range - never the silent wrap of a ctypes field."""
    try:
        v = operator.index(x)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(x).__name__} {x!r}") from None
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {v}")
    return v


def as_float(x, name, finite=True):
    """x as a Python float: a TypeError for a non-number; with finite, a ValueError for NaN or infinity (else
    those go on to the library, which refuses them by name)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {type(x).__name__} {x!r}") from None
    if finite and not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


# ---- errors -------------------------------------------------------------------------------------
def set_score_options(prob, sm_scale, logits_soft_cap, window_left):
    """A Problem's score options: sm_scale (None: 1 / sqrt(head_dim); else > 0), logits_soft_cap (None or
    0: none) and FlashInfer's window_left (-1 or None: no window; w >= 0: the last w + 1 tokens)."""
    w = -1 if window_left is None else as_int(window_left, "window_left")
    if not -1 <= w < 2**31 - 1:
        raise ValueError(f"window_left must be -1 (no window) or in [0, 2^31 - 1), got {window_left}")
    scale = 0.0 if sm_scale is None else as_float(sm_scale, "sm_scale", finite=False)
    if sm_scale is not None and not scale > 0.0:
        raise ValueError(f"sm_scale must be > 0 (None: 1 / sqrt(head_dim)), got {sm_scale}")
    prob.sm_scale = scale
    prob.logits_soft_cap = (as_float(logits_soft_cap, "logits_soft_cap", finite=False)
                            if logits_soft_cap is not None else 0.0)
    prob.window = 0 if w < 0 else w + 1


def status_string(status):
    return lib.pkv_status_string(int(status)).decode()


class PkvError(RuntimeError):
    """A library call failed: .status (Status), .status_name (pkv_status_string), .message."""

    def __init__(self, status, message="", call=None):
        try:
            status = Status(status)
        except ValueError:
            status = int(status)
        self.status = status
        self.status_name = status_string(status)
        self.message = message or self.status_name
        self.call = call
        super().__init__(f"{call}: {self.message}" if call else self.message)


def check(status, ctx=None, call=None):
    """Raises PkvError when status != PKV_OK, with the calling thread's message (the lab's for its calls)."""
    if status != 0:
        raw = _lab.pkv_last_error() if call and _is_lab(call) and _lab is not None else lib.pkv_last_error()
        raise PkvError(status, (raw or b"").decode(errors="replace"), call)
