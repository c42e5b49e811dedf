"""Array adapters: numpy arrays and torch tensors described without copies; lazy imports."""

import ctypes
import sys
from collections import namedtuple

from . import _lib

Arr = namedtuple("Arr", "obj kind device dtype shape contiguous ptr")
# kind: "numpy" | "torch"; device: "cpu" | "cuda:N"; dtype: a name such as "float16", "bfloat16",
# "uint16", "float32", "int32"; ptr: the address of element 0.


def numpy():
    """numpy, imported on first use (the CPU backend, traces and the reference need it)."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("numpy is needed for the CPU backend, traces and the reference: "
                          "pip install numpy") from None
    return np


def torch():
    """torch, imported on first use (the CUDA backend needs it)."""
    try:
        import torch as t
    except ImportError:
        raise ImportError("torch is needed for the CUDA backend: pip install torch") from None
    return t


def is_torch(x):
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def is_numpy(x):
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


NO_MEMO = object()  # memo_key of an argument whose checks cannot be remembered


def memo_key(x):
    """What the argument checks of a tensor or array read, as a key of the checks' memos: its kind, shape,
    element strides, dtype, device and its address modulo 16 (the alignment the checks ask for; numpy: whether it
    is writable) - not its identity or its address, so the fresh views a model makes at every layer (q =
    qkv[:, :Hq * d].view(...) of a new QKV output) are the same argument, whose address the call then takes anew
    (data_ptr); a tensor resized or re-strided in place is another.  Tuples and lists are looked into; None is a
    key; anything else is NO_MEMO."""
    if x is None:
        return None
    if isinstance(x, (tuple, list)):
        keys = tuple(memo_key(y) for y in x)
        return NO_MEMO if any(k is NO_MEMO for k in keys) else keys
    if is_torch(x):
        return ("torch", x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15)
    if is_numpy(x):
        return ("numpy", x.shape, x.strides, x.dtype, x.flags.writeable, x.ctypes.data & 15)
    return NO_MEMO


def data_ptr(x):
    """The address of a tensor or array that memo_key took (None for None)."""
    if x is None:
        return None
    return x.data_ptr() if is_torch(x) else x.ctypes.data


def raw_stream(device_index):
    """The handle of torch's current CUDA stream on the device (torch's raw accessor where it has one: no Stream
    object made per call)."""
    t = torch()
    get = getattr(t._C, "_cuda_getCurrentRawStream", None)
    return get(device_index) if get is not None else t.cuda.current_stream(device_index).cuda_stream


def torch_cuda_usable():
    """True when torch imports and sees a CUDA device (never raises)."""
    try:
        import torch as t
        return bool(t.cuda.is_available())
    except Exception:
        return False


def describe(x, name):
    """Arr for a numpy array or torch tensor; TypeError naming `name` for anything else."""
    if is_numpy(x):
        return Arr(x, "numpy", "cpu", x.dtype.name, tuple(x.shape), bool(x.flags.c_contiguous),
                   int(x.ctypes.data))
    if is_torch(x):
        dev = x.device
        device = "cpu" if dev.type == "cpu" else f"{dev.type}:{dev.index if dev.index is not None else 0}"
        return Arr(x, "torch", device, str(x.dtype).replace("torch.", ""), tuple(x.shape),
                   bool(x.is_contiguous()), int(x.data_ptr()))
    raise TypeError(f"{name} must be a numpy array or a torch tensor, not {type(x).__name__}")


# ---- dtypes -----------------------------------------------------------------------------------
_DTYPE_ALIASES = {"float16": "float16", "fp16": "float16", "half": "float16",
                  "bfloat16": "bfloat16", "bf16": "bfloat16",
                  "float32": "float32", "fp32": "float32", "float": "float32"}
# fp8 KV-cache types (pkv_problem.kv_dtype): torch's and ml_dtypes' names, and vLLM's kv_cache_dtype strings
# ("fp8" is e4m3 there)
_FP8_ALIASES = {"float8_e4m3fn": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "e4m3": "float8_e4m3fn",
                "fp8": "float8_e4m3fn", "float8_e5m2": "float8_e5m2", "fp8_e5m2": "float8_e5m2", "e5m2": "float8_e5m2"}
_DTYPE_CODES = {"float16": _lib.DTYPE_FP16, "bfloat16": _lib.DTYPE_BF16, "float32": _lib.DTYPE_FP32,
                "float8_e4m3fn": _lib.DTYPE_FP8_E4M3, "float8_e5m2": _lib.DTYPE_FP8_E5M2}
FP8_NAMES = ("float8_e4m3fn", "float8_e5m2")


def _key(dt):
    """A dtype given as a string, numpy dtype / scalar type or torch dtype, as a lower-case name."""
    if isinstance(dt, str):
        key = dt.lower()
    elif type(dt).__module__ == "torch":  # torch.float16 -> "torch.float16"
        key = str(dt)
    else:
        try:
            key = numpy().dtype(dt).name  # also ml_dtypes.bfloat16 -> "bfloat16", ml_dtypes.float8_e5m2
        except TypeError:
            key = None
    return key.replace("torch.", "") if key else key


def dtype_name(dt):
    """Normalizes a dtype of q and o (float16, bfloat16; float32 for lse) to its name."""
    key = _key(dt)
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"unknown data type {dt!r}: expected float16 or bfloat16")
    return _DTYPE_ALIASES[key]


def kv_dtype_name(dt):
    """Normalizes a KV-cache dtype: float16, bfloat16, or fp8 (float8_e4m3fn, float8_e5m2; also their torch and
    ml_dtypes types and vLLM's strings "fp8", "fp8_e4m3", "fp8_e5m2")."""
    key = _key(dt)
    if key in _FP8_ALIASES:
        return _FP8_ALIASES[key]
    if key in _DTYPE_ALIASES and _DTYPE_ALIASES[key] != "float32":
        return _DTYPE_ALIASES[key]
    raise ValueError(f"unknown KV-cache data type {dt!r}: expected float16, bfloat16, float8_e4m3fn or float8_e5m2")


def is_fp8(name):
    return name in FP8_NAMES


def itemsize(name):
    """Bytes of an element of a normalized dtype name."""
    return 1 if name in FP8_NAMES else 4 if name == "float32" else 2


def dtype_code(name):
    return _DTYPE_CODES[name]


def accepts_dtype(arr, want):
    """Whether arr holds `want`: numpy uint16 counts as bf16 bits, uint8 (numpy or torch) as fp8 codes."""
    if arr.dtype == want:
        return True
    if want in FP8_NAMES:
        return arr.dtype == "uint8"
    return want == "bfloat16" and arr.kind == "numpy" and arr.dtype == "uint16"


def kv_scale(scale, name, hkv, device):
    """(per-tensor scale, per-head address or None, the array to keep alive) of an fp8 cache's k_scale or
    v_scale: None (0: 1.0), a number, a one-element array / tensor, or [hkv] per-KV-head scales - float32 in the
    backend's memory (device "cpu": a host array; "cuda:N": a tensor on that GPU)."""
    if scale is None:
        return 0.0, None, None
    if not (is_numpy(scale) or is_torch(scale)):
        return _lib.as_float(scale, name, finite=False), None, None
    n = int(scale.numel()) if is_torch(scale) else int(scale.size)
    if n == 1 and len(scale.shape) <= 1:
        return float(scale.reshape(-1)[0]), None, None
    if len(scale.shape) != 1 or n != hkv:
        raise ValueError(f"{name} must be a number or [num_kv_heads = {hkv}] per-head scales, got shape "
                         f"{list(scale.shape)}")
    if device != "cpu":
        if not (is_torch(scale) and scale.device.type == "cuda"):
            raise TypeError(f"per-head {name} must be a CUDA tensor for the cuda backend")
        arr = scale.to(device=device, dtype=torch().float32).contiguous()
        return 0.0, arr.data_ptr(), arr
    if is_torch(scale):
        if scale.device.type != "cpu":
            raise ValueError(f"per-head {name} is on {scale.device}, the cpu backend needs host memory")
        scale = scale.detach().numpy()
    arr = numpy().ascontiguousarray(scale, dtype=numpy().float32)
    return 0.0, int(arr.ctypes.data), arr


# ---- host int32 vectors (page tables) -----------------------------------------------------------
class HostInt32:
    """A 1-D int32 vector in host memory: numpy, a torch CPU tensor or a ctypes array (lists
    without numpy).  .ptr, len(), [i], .max_of(n) (max of the first n entries)."""

    def __init__(self, x, name):
        self.name = name
        self._torch = False
        if is_torch(x):
            if x.is_floating_point() or x.is_complex() or x.dtype == sys.modules["torch"].bool:
                raise TypeError(f"{name} must hold integers, not {x.dtype}")
            if x.dim() != 1:
                raise ValueError(f"{name} must be 1-D, got shape {tuple(x.shape)}")
            t = sys.modules["torch"]
            if x.device.type != "cpu":
                raise ValueError(f"{name}: internal error, device tensors are copied in plan")
            if x.numel() and x.dtype != t.int32 and (int(x.min()) < -2**31 or int(x.max()) >= 2**31):
                raise ValueError(f"{name} has values outside int32")
            y = x.to(t.int32).contiguous()
            self.data, self._torch = y, True
            self.ptr, self._len = y.data_ptr(), y.numel()
            return
        np = sys.modules.get("numpy")
        if np is None and isinstance(x, (list, tuple)):
            for v in x:
                if not isinstance(v, int) or isinstance(v, bool):
                    raise TypeError(f"{name} must hold integers")
            self.data = (ctypes.c_int32 * len(x))(*x)
            self.ptr, self._len = ctypes.addressof(self.data), len(x)
            return
        np = numpy()
        a = np.asarray(x)
        if a.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
        if a.size and a.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers, not {a.dtype}")
        if a.size and a.dtype != np.int32 and (a.min() < -2**31 or a.max() >= 2**31):
            raise ValueError(f"{name} has values outside int32")
        a = np.ascontiguousarray(a, dtype=np.int32)
        self.data, self.ptr, self._len = a, int(a.ctypes.data), int(a.size)

    def __len__(self):
        return self._len

    def __getitem__(self, i):
        return int(self.data[i])

    def max_of(self, n):
        if n <= 0:
            return None
        if self._torch:
            return int(self.data[:n].max())
        if isinstance(self.data, ctypes.Array):
            return max(self.data[:n])
        return int(self.data[:n].max())

    def c_ptr(self):
        return ctypes.cast(ctypes.c_void_p(self.ptr), ctypes.POINTER(ctypes.c_int32))
