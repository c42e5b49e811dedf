"""Decode-step traces (workloads.md): deterministic generators, CSR tables, trace files."""

import ctypes
import os
import weakref

from . import _arrays as A
from . import _lib as L
from ._lib import check, lib, parse_code


def _family_code(family):
    return parse_code(lib.pkv_trace_family_parse, family)


class Trace:
    """A sequence of decode steps; each lists its active rows (request id, current length)."""

    def __init__(self, handle):
        self._h = handle
        self._free = weakref.finalize(self, lib.pkv_trace_free, handle)

    @classmethod
    def read(cls, path):
        """Reads a trace file written by write() or `pkv trace`."""
        h = ctypes.c_void_p()
        check(lib.pkv_trace_read(os.fsencode(path), ctypes.byref(h)), call="pkv_trace_read")
        return cls(h)

    def write(self, path):
        check(lib.pkv_trace_write(self._h, os.fsencode(path)), call="pkv_trace_write")

    @property
    def num_steps(self):
        return int(lib.pkv_trace_num_steps(self._h))

    def __len__(self):
        return self.num_steps

    @property
    def num_requests(self):
        return int(lib.pkv_trace_num_requests(self._h))

    @property
    def num_pages(self):
        """Pages of the pool, holes included (the num_pages to plan with)."""
        return int(lib.pkv_trace_num_pages(self._h))

    @property
    def checksum(self):
        """64-bit FNV-1a over every step's rows and lengths and every request's pages."""
        return int(lib.pkv_trace_checksum(self._h))

    @property
    def config(self):
        c = lib.pkv_trace_get_config(self._h).contents
        return {"family": lib.pkv_trace_family_name(c.family).decode(), "seed": int(c.seed),
                "num_requests": int(c.num_requests), "max_active": int(c.max_active),
                "max_steps": int(c.max_steps), "page_size": int(c.page_size),
                "hole_fraction": float(c.hole_fraction)}

    @property
    def page_size(self):
        return int(lib.pkv_trace_get_config(self._h).contents.page_size)

    def _check_step(self, s):
        s = L.as_int(s, "step")
        if not 0 <= s < self.num_steps:
            raise IndexError(f"step {s} outside [0, {self.num_steps})")
        return s

    def step(self, s):
        """(request_ids, seq_lens) of step s, int32 numpy arrays [B]."""
        np = A.numpy()
        s = self._check_step(s)
        ids, lens = L._i32p(), L._i32p()
        n = int(lib.pkv_trace_step(self._h, s, ctypes.byref(ids), ctypes.byref(lens)))
        if n == 0:
            return np.zeros(0, np.int32), np.zeros(0, np.int32)
        return np.ctypeslib.as_array(ids, (n,)).copy(), np.ctypeslib.as_array(lens, (n,)).copy()

    def step_table(self, s):
        """(indptr [B+1], indices [nnz], seq_lens [B]) of step s, int32 numpy arrays (CSR)."""
        np = A.numpy()
        _, lens = self.step(s)
        ps = self.page_size
        nnz = int(((lens.astype(np.int64) + ps - 1) // ps).sum())
        indptr = np.zeros(len(lens) + 1, np.int32)
        indices = np.zeros(max(nnz, 1), np.int32)
        out_lens = np.zeros(max(len(lens), 1), np.int32)
        i32 = ctypes.POINTER(ctypes.c_int32)
        check(lib.pkv_trace_step_table(self._h, s, indptr.ctypes.data_as(i32), indices.ctypes.data_as(i32),
                                       nnz, out_lens.ctypes.data_as(i32)), call="pkv_trace_step_table")
        return indptr, indices[:nnz].copy(), out_lens[:len(lens)].copy()

    def request(self, r):
        """(prompt_len, decode_len) of request r."""
        r = L.as_int(r, "request")
        if not 0 <= r < self.num_requests:
            raise IndexError(f"request {r} outside [0, {self.num_requests})")
        p, d = ctypes.c_int32(), ctypes.c_int32()
        lib.pkv_trace_request(self._h, r, ctypes.byref(p), ctypes.byref(d))
        return int(p.value), int(d.value)

    def __repr__(self):
        c = self.config
        return (f"Trace({c['family']!r}, seed={c['seed']}, steps={self.num_steps}, "
                f"requests={self.num_requests}, checksum={self.checksum:#018x})")


def generate_trace(family, seed, max_active=None, num_requests=None, page_size=16, max_steps=None,
                   hole_fraction=None):
    """Generates a trace of `family` ('uniform', 'bimodal', 'zipf', 'bucketed', 'homogeneous').

    Unset arguments keep the family's defaults (pkv_trace_config_default): B8 runs of 24 requests
    and 48 steps, or the B1 bucketed run.  Deterministic for a seed on every platform.
    """
    cfg = L.TraceConfig()
    lib.pkv_trace_config_default(ctypes.byref(cfg), _family_code(family))
    cfg.seed = int(seed)
    cfg.page_size = int(page_size)
    if max_active is not None:
        cfg.max_active = int(max_active)
    if num_requests is not None:
        cfg.num_requests = int(num_requests)
    if max_steps is not None:
        cfg.max_steps = int(max_steps)
    if hole_fraction is not None:
        cfg.hole_fraction = float(hole_fraction)
    h = ctypes.c_void_p()
    check(lib.pkv_trace_generate(ctypes.byref(cfg), ctypes.byref(h)), call="pkv_trace_generate")
    return Trace(h)
