#!/usr/bin/env python3
"""compare_flashinfer.py - FlashInfer and PersistentKV side by side, in one process, on the GPU.

Both libraries run the same decode steps over the same page tables and the same K/V bytes, and are
timed the same way; the outputs are cross-checked on every row.  Writes compare.json (every number)
and compare.md (tables for people), and prints a short table on stdout last.

Workloads (workloads.md, anchors.md):
  anchors  the 26 anchor steps of the `paper` shape (Hq 32, Hkv 8, d 128, fp16); lengths by the rule
           of anchors.md (splitmix64 seeded 20250000 + 100 B + kind), checked against anchor-steps.txt
  traces   uniform, bimodal, zipf, bucketed traces (persistentkv.generate_trace), B in
           1..128 with 3 B requests, the held-out seeds 20260623..27; a fixed sample of steps per
           trace (--trace-steps, default first, mid, last), `paper` shape
  shapes   g8 (fp16, bf16), g7, mha, d256, d64 at B1_N8192, B1_N32768, B8_bimodal, B32_bimodal,
           B64_uniform (the "Other model shapes" table of anchors.md)

Method (the same for both libraries, as in tools/bench.c and anchors.md):
  - one flat device buffer, filled once per dtype with uniform random values in [-1, 1];
    the K and V pools of a step are views into it, shaped [R * P, ...] (P = pages of the step);
  - the step's page ids are a random permutation of [0, P) (scattered); rotation r runs the same
    page ids on the views pool[r * P:(r + 1) * P], so R disjoint page sets cover >= --rotate-gib
    (default 2 GiB, R in [2, 256]) and L2 does not help; the page tables and plans stay fixed;
  - kernel time: CUDA events around one run, runs queued in batches of 16 behind a spin kernel
    (torch.cuda._sleep) long enough for the host to enqueue the batch, so launch cost is off the
    clock; median of --reps (anchors, shapes; default 100) or --trace-reps (default 30) runs;
  - plan time: host clock around plan() with a device sync before and after; wall time: host clock
    around plan() + run() + sync; median of --wall-reps;
  - CUDA graphs: one graph per rotation (up to --graph-rotations) of one run, replayed and timed
    like the eager runs: FlashInfer's best eager configuration with use_cuda_graph=True and its
    fixed buffers, PersistentKV auto and its best route;
  - floor of a step: a streaming read (16-byte loads, PersistentKV's pkv_dev_time_read, best of 3
    grids) of the step's K/V bytes, timed like the steps, windows moving through the flat buffer;
    torch.sum over a float32 view when the library lacks the helper (--floor torch forces it);
  - read ceiling: the same read kernel over 4 GiB, and torch.sum over a 4 GiB float32 view; the
    higher of the two is `read_gbps` (both are in the JSON);
  - FlashInfer: every decode path that runs for the shape on Hopper (bench/FLASHINFER.md, "Decode paths"):
    BatchDecodeWithPagedKVCacheWrapper (128 MB workspace) with use_tensor_cores=False (CUDA-core decode; G in
    {1,2,3,4,6,8}) and True, and a split sweep of the tensor-core plan (fixed_split_size = --split-tokens /
    page size pages, and disable_split_kv=True; the best setting is the path's time); XQA through
    trtllm_batch_decode_with_kv_cache(backend="xqa") on a padded [B, max pages] block table, and through
    flashinfer.xqa.xqa with sm_count = k x SMs (its sub-sequence count; --xqa-sm-multiples); BatchAttention
    (the persistent kernel); cuDNN decode when its Python module imports (HND only).  A path that does not
    take the shape is listed as refused with the reason; each setting is checked against the float64
    reference, and FlashInfer's best is the fastest path that agrees.  Wrappers: plan() once per step
    (indptr and last_page_len on the host, indices on the device);
  - order: --passes passes (default 2) per step, FlashInfer first in even passes and PersistentKV first in
    odd ones, reps / passes runs each; a configuration's time is the median of its pass medians, and the
    pass medians are kept (spread); --repeat-procs N measures the --repeat-steps anchors (default B8, B16)
    again in N separate processes;
  - reported: ours auto against FlashInfer's best (the headline), ours best route against it (an oracle),
    and a column per FlashInfer path;
    PersistentKV: every route (auto, single, split, bucketed, workqueue, fused) through the
    binding's route=, plan() from host numpy tables (it copies the indices to the device);
  - cross-check: every output poisoned with NaN first; every PersistentKV route compared with
    FlashInfer's best configuration (relative L2 and max abs; tolerance 2e-3 fp16, 1.5e-2 bf16),
    both libraries compared with a float64 torch reference on up to 3 rows; graph replays compared
    with the eager outputs.  Rows that disagree are flagged; the exit status is 1 if any does.
  - fp8 caches (--kv-dtype q,fp8_e4m3[,fp8_e5m2], --kv-scale S; issue 38): each step runs once per cache type,
    the fp8 twin right after its 16-bit step with the same lengths, pages and q; its pools hold the fp8 codes of
    uniform [-1, 1] values / S (saturated, round to nearest; S defaults to 1 / the format's largest code) and
    both libraries get k_scale = v_scale = S: ours plan(kv_data_type=torch.float8_*), run(k_scale=, v_scale=) on
    every route; FlashInfer's decode wrapper plan(q_data_type=q's type, kv_data_type=float8_*), run(k_scale=,
    v_scale=) (CUDA cores, tensor cores, split sweep), XQA with bmm1_scale = S / sqrt(d) and bmm2_scale = S (e4m3
    only), BatchAttention plan(kv_data_type=), run(k_scale=, v_scale=); cuDNN is refused (no scales).  The float64
    reference reads float(code) x S.  Tolerance: q's type, except 8e-2 for XQA's e4m3 kernel (its GEMMs run in
    e4m3).  Bytes, floors, fractions of the ceiling and efficiencies count the fp8 bytes; each fp8 row records
    its 16-bit twin's times and the speedups (compare.md: "fp8 caches against the 16-bit cache");

Usage:
  python3 bench/compare_flashinfer.py --out DIR [--matrix full|quick] [--jit-warmup] ...
  python3 bench/compare_flashinfer.py --dry-run [--out DIR]   # no CUDA: plans, checks, fake rows
  python3 bench/compare_flashinfer.py --jit-warmup-only        # compile FlashInfer's modules only
  python3 bench/compare_flashinfer.py --out DIR --groups anchors --kv-dtype q,fp8_e4m3   # fp8 beside fp16
Environment: PKV_LIBRARY (the CUDA build of libpersistentkv), PKV_COMMIT (else git), the
FlashInfer variables of bench/FLASHINFER.md (bench/install_wheelhouse.sh prints them).
"""

import argparse
import copy
import ctypes
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import types
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "python") not in sys.path:
    sys.path.insert(0, str(REPO / "python"))

# ---- shapes and workloads --------------------------------------------------------------------------
SHAPES = {  # name: (Hq, Hkv, d, default dtype)   (workloads.md)
    "paper": (32, 8, 128, "fp16"),
    "g8": (64, 8, 128, "fp16"),
    "g7": (28, 4, 128, "bf16"),
    "mha": (32, 32, 128, "fp16"),
    "d256": (16, 8, 256, "bf16"),
    "d64": (14, 2, 64, "bf16"),
    "g16": (128, 8, 128, "bf16"),  # Llama-3.1-405B; not in workloads.md's matrix (--shapes g16:bf16)
}
SHAPE_RUNS = ["g8:fp16", "g8:bf16", "g7:bf16", "mha:fp16", "d256:bf16", "d64:bf16"]
SHAPE_POINTS = ["B1_N8192", "B1_N32768", "B8_bimodal", "B32_bimodal", "B64_uniform"]
FI_CUDACORE_GROUPS = (1, 2, 3, 4, 6, 8)  # FlashInfer's CUDA-core decode dispatches these G only
# FlashInfer's decode paths on Hopper (bench/FLASHINFER.md, "Decode paths"), in the order they are set up
FI_PATHS = ["cudacore", "tensorcore", "split_sweep", "xqa", "xqa_sweep", "batch_attention", "cudnn"]
FI_PATH_LABELS = {
    "cudacore": "decode wrapper, CUDA cores", "tensorcore": "decode wrapper, tensor cores (fa2)",
    "split_sweep": "decode wrapper (split sweep)", "xqa": "XQA (trtllm_batch_decode_with_kv_cache)",
    "xqa_sweep": "XQA (sm_count sweep)", "batch_attention": "BatchAttention (persistent)", "cudnn": "cuDNN decode"}
FI_SHORT = {"cudacore": "CC", "tensorcore": "TC", "split_sweep": "SP", "xqa": "XQ", "xqa_sweep": "XS",
            "batch_attention": "BA", "cudnn": "DN"}
FI_MODULE_OF = {"cudacore": "cudacore", "tensorcore": "tensorcore", "split_sweep": "tensorcore", "xqa": "xqa",
                "xqa_sweep": "xqa", "batch_attention": "batch_attention"}  # JIT module kind; cuDNN has none
SPLIT_TOKENS = [512, 1024, 2048, 4096, 8192]  # fixed_split_size of the split sweep, in tokens (plan() takes pages)
XQA_PAGE_SIZES = (16, 32, 64, 128)
XQA_SM_MULTIPLES = [2, 4, 8]  # sm_count = k * SMs handed to flashinfer.xqa.xqa (its sub-sequence count)
FAMILIES = ["uniform", "bimodal", "zipf", "bucketed"]
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128]
HELD_OUT_SEEDS = [20260623, 20260624, 20260625, 20260626, 20260627]
ROUTES = ["auto", "single", "split", "bucketed", "workqueue", "fused"]
TOL = {"fp16": 2e-3, "bf16": 1.5e-2}
# KV-cache element types (--kv-dtype): a cache of q's 16-bit type, or fp8 codes (OCP e4m3 "fn" and e5m2) that both
# libraries dequantize as float(code) x scale (k_scale, v_scale)
KV_DTYPES = ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2")
FP8_MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}  # the largest finite code of each format
# XQA's Hopper kernel for e4m3 caches (mha_sm90.cu, MathElem = the cache type) rounds q and the softmax weights to
# e4m3 and runs both GEMMs in fp8: about 3e-2 relative L2 against the float64 reference on uniform data (a torch
# model of that rounding gave 2.4e-2 to 3.2e-2 for d 64..256, 256..32768 tokens), so those paths are checked at
# 8e-2; every other path dequantizes the codes exactly into fp16/bf16/fp32 arithmetic and keeps TOL of q's type
TOL_FP8_MATH = 8e-2
FI_FP8_MATH_PATHS = ("xqa", "xqa_sweep")
LONG_KV_MB = 64.0  # "long" steps of the fp8 / 16-bit summary: at least this many MB of 16-bit K/V

# Anchor steps in the order of anchors.md: name, B, kind (0 uniform, 1 bimodal, 2 zipf, 3 fixed),
# fixed length, FlashInfer's best time and path measured there (for reference only).
ANCHORS = [
    ("B1_N2048", 1, 3, 2048, 13.3, "tensorcore"), ("B1_N8192", 1, 3, 8192, 20.6, "cudacore"),
    ("B1_N32768", 1, 3, 32768, 45.6, "tensorcore"), ("B1_N65536", 1, 3, 65536, 76.2, "tensorcore"),
    ("B1_N131072", 1, 3, 131072, 136.8, "tensorcore"), ("B4_homo8K", 4, 3, 8192, 44.7, "tensorcore"),
    ("B4_zipf", 4, 2, 0, 55.8, "tensorcore"), ("B4_bimodal", 4, 1, 0, 69.0, "tensorcore"),
    ("B4_uniform", 4, 0, 0, 102.4, "tensorcore"), ("B4_homo32K", 4, 3, 32768, 132.3, "tensorcore"),
    ("B8_zipf", 8, 2, 0, 70.8, "tensorcore"), ("B8_bimodal", 8, 1, 0, 72.8, "tensorcore"),
    ("B8_uniform", 8, 0, 0, 176.9, "tensorcore"), ("B16_homo8K", 16, 3, 8192, 133.6, "tensorcore"),
    ("B16_bimodal", 16, 1, 0, 216.1, "tensorcore"), ("B16_zipf", 16, 2, 0, 238.9, "tensorcore"),
    ("B16_uniform", 16, 0, 0, 264.8, "tensorcore"), ("B16_homo32K", 16, 3, 32768, 482.9, "tensorcore"),
    ("B32_bimodal", 32, 1, 0, 490.6, "tensorcore"), ("B32_zipf", 32, 2, 0, 542.5, "tensorcore"),
    ("B32_uniform", 32, 0, 0, 647.4, "tensorcore"), ("B64_homo8K", 64, 3, 8192, 485.8, "tensorcore"),
    ("B64_bimodal", 64, 1, 0, 711.1, "tensorcore"), ("B64_zipf", 64, 2, 0, 1058.5, "tensorcore"),
    ("B64_uniform", 64, 0, 0, 1244.5, "tensorcore"), ("B64_homo32K", 64, 3, 32768, 1893.3, "tensorcore"),
]
ANCHOR_BY_NAME = {a[0]: a for a in ANCHORS}

QUICK = {
    "anchors": ["B1_N2048", "B1_N32768", "B4_bimodal", "B16_zipf", "B32_bimodal", "B64_homo32K"],
    "families": ["uniform", "bimodal"], "batches": [1, 8, 64], "seeds": [20260623], "trace_steps": ["mid"],
    "shape_runs": SHAPE_RUNS, "shape_points": ["B1_N8192", "B32_bimodal"],
}


def log(msg):
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


# ---- the anchor-length rule (anchors.md; tools/common.c) -------------------------------------------
_M64 = (1 << 64) - 1


class SplitMix64:
    """splitmix64 as src/trace/rng.c: state += golden gamma, then the two xor-shift-multiplies."""

    def __init__(self, seed):
        self.state = seed & _M64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & _M64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        return z ^ (z >> 31)

    def uniform_int(self, lo, hi):  # lo + next() % (hi - lo + 1), modulo bias included
        return lo + self.next() % (hi - lo + 1)

    def uniform01(self):  # top 53 bits, [0, 1)
        return (self.next() >> 11) * 2.0 ** -53


def anchor_lens(batch, kind, fixed_len):
    r = SplitMix64(20250000 + 100 * batch + kind)
    w = [k ** -1.1 for k in range(1, 65)]
    total, acc, cdf = sum(w), 0.0, []
    for x in w:
        acc += x
        cdf.append(acc / total)
    lens = []
    for _ in range(batch):
        if kind == 0:
            lens.append(r.uniform_int(1024, 32768))
        elif kind == 1:
            lens.append(r.uniform_int(256, 1024) if r.uniform01() < 0.5 else r.uniform_int(16384, 32768))
        elif kind == 2:
            u = r.uniform01()
            k = 1
            while k < 64 and u > cdf[k - 1]:
                k += 1
            n = math.floor(32768.0 / k ** 1.1 + 0.5)
            lens.append(int(min(max(n, 256), 32768)))
        else:
            lens.append(fixed_len)
    return lens


# A few rows of the shared anchor-steps.txt, embedded so the rule is checked on any machine.
_ANCHOR_CHECKS = {
    "B4_uniform": [27620, 18860, 22224, 23985],
    "B4_bimodal": [28833, 460, 27530, 418],
    "B4_zipf": [32768, 1363, 5579, 4565],
    "B8_bimodal": [910, 539, 29200, 1006, 553, 839, 567, 27555],
    "B8_zipf": [32768, 4565, 1552, 1950, 839, 839, 15287, 376],
    "B8_uniform": [12349, 24525, 30497, 16786, 17280, 23566, 23502, 23916],
}
_ANCHOR_TOTALS = {"B16_uniform": 264416, "B16_bimodal": 207845, "B16_zipf": 234397, "B32_uniform": 577644,
                  "B32_bimodal": 361619, "B32_zipf": 440486, "B64_uniform": 1164405, "B64_bimodal": 674232,
                  "B64_zipf": 985427, "B64_homo32K": 2097152}


def check_anchor_rule():
    for name, want in _ANCHOR_CHECKS.items():
        _, b, kind, fixed, _, _ = ANCHOR_BY_NAME[name]
        got = anchor_lens(b, kind, fixed)
        assert got == want, f"anchor rule: {name} gives {got}, anchor-steps.txt has {want}"
    for name, want in _ANCHOR_TOTALS.items():
        _, b, kind, fixed, _, _ = ANCHOR_BY_NAME[name]
        got = sum(anchor_lens(b, kind, fixed))
        assert got == want, f"anchor rule: {name} totals {got} tokens, anchor-steps.txt has {want}"
    # the whole file, when it is at hand (it does not travel to the GPU machine)
    for cand in (REPO / "shared" / "anchor-steps.txt", REPO.parent / "shared" / "anchor-steps.txt"):
        if cand.is_file():
            n = 0
            for line in cand.read_text().splitlines():
                parts = dict(p.split("=", 1) for p in line.split()[1:] if "=" in p)
                name = line.split()[0] if line.strip() else ""
                if name in ANCHOR_BY_NAME and "lens" in parts:
                    _, b, kind, fixed, _, _ = ANCHOR_BY_NAME[name]
                    want = [int(x) for x in parts["lens"].split(",")]
                    assert anchor_lens(b, kind, fixed) == want, f"anchor rule: {name} differs from {cand}"
                    n += 1
            return f"{n} anchor steps match {cand}"
    return f"{len(_ANCHOR_CHECKS)} embedded anchor steps match"


# ---- steps -----------------------------------------------------------------------------------------
class Step:
    """One decode step to measure: lengths, CSR page table over [0, pages), rotations."""

    def __init__(self, group, name, shape, dtype, lens, indices, layout, page_size, reps, **meta):
        import numpy as np
        self.group, self.name, self.shape, self.dtype = group, name, shape, dtype
        self.Hq, self.Hkv, self.d, _ = SHAPES[shape]
        self.G = self.Hq // self.Hkv
        self.layout, self.page_size, self.reps = layout, page_size, reps
        self.lens = np.asarray(lens, dtype=np.int32)
        self.B = int(len(self.lens))
        pages = (self.lens.astype(np.int64) + page_size - 1) // page_size
        self.indptr = np.zeros(self.B + 1, dtype=np.int32)
        self.indptr[1:] = np.cumsum(pages)
        self.pages = int(self.indptr[-1])
        self.indices = np.asarray(indices, dtype=np.int32)
        assert len(self.indices) == self.pages, (name, len(self.indices), self.pages)
        assert self.pages == 0 or (self.indices.min() >= 0 and self.indices.max() < self.pages)
        self.last_page_len = (self.lens - (pages - 1) * page_size).astype(np.int32)
        self.total_tokens = int(self.lens.astype(np.int64).sum())
        self.kv_dtype, self.kv_scale, self.fp8 = dtype, None, False  # the caches' type (set_kv)
        self.elem = 2
        self.token_bytes = self.Hkv * self.d * self.elem * 2            # K and V
        self.kv_bytes = self.total_tokens * self.token_bytes              # true tokens, K + V (attended)
        self.page_elems = page_size * self.Hkv * self.d                   # one page of K (or V)
        self.meta = meta
        self.rotations = 1
        self.pool_bytes = 0

    def set_kv(self, kv_dtype, scale=None):
        """The caches' element type: q's 16-bit type, or fp8 (fp8_e4m3, fp8_e5m2) of one byte an element whose
        codes both libraries read as float(code) x scale (k_scale = v_scale = scale).  Before set_window."""
        self.kv_dtype = kv_dtype
        self.fp8 = kv_dtype in FP8_MAX
        self.kv_scale = scale if self.fp8 else None
        self.elem = 1 if self.fp8 else 2
        self.token_bytes = self.Hkv * self.d * self.elem * 2
        self.kv_bytes = self.total_tokens * self.token_bytes

    def set_window(self, window_left):
        """Under a sliding window a row attends to (and the floor reads) its last window_left + 1 tokens."""
        import numpy as np
        if window_left >= 0:
            attended = np.minimum(self.lens.astype(np.int64), window_left + 1)
            self.kv_bytes = int(attended.sum()) * self.token_bytes

    def set_rotations(self, rotate_bytes, cap_bytes):
        step_pool = 2 * self.pages * self.page_elems * self.elem
        r = max(2, min(256, -(-rotate_bytes // max(self.kv_bytes, 1))))
        while r > 1 and r * step_pool > cap_bytes:
            r -= 1
        self.rotations = int(r)
        self.pool_bytes = self.rotations * step_pool

    @property
    def fi_configs(self):
        """The decode-wrapper configurations that take this shape (the JIT modules of the decode wrapper)."""
        cfgs = ["cudacore"] if self.G in FI_CUDACORE_GROUPS else []
        return cfgs + ["tensorcore"]

    def fi_paths(self, args):
        """[(path, refusal or None)] for the FlashInfer paths asked for (--fi-configs)."""
        return [(p, fi_refusal(self, p, args)) for p in args.fi_configs]

    def base_key(self):
        """The step without its cache type: the fp8 twin of a step shares its pages, lengths and q."""
        return f"{self.group}/{self.name}/{self.shape}/{self.dtype}"

    def key(self):
        return self.base_key() + (f"/{self.kv_dtype}" if self.kv_dtype != self.dtype else "")


def fi_refusal(st, path, args):
    """Why FlashInfer's `path` does not take the step's shape, from the checks in its source (0.7.0.post1),
    or None.  Checks that need the device (compute capability, an importable cuDNN) come at run time."""
    soft_cap = getattr(args, "soft_cap", 0.0) or 0.0
    window = getattr(args, "window_left", -1)
    if path in ("xqa", "xqa_sweep") and st.kv_dtype == "fp8_e5m2":
        return ("XQA takes fp8 e4m3 caches only (flashinfer/jit/xqa.py maps float8_e4m3fn to CACHE_ELEM_ENUM=2, any "
                "other type to 0: q's 16-bit type, so e5m2 codes would be read as 2-byte values)")
    if path == "cudnn" and st.fp8:
        return ("cudnn_batch_decode_with_kv_cache has no fp8 scales (no k_scale / v_scale; its sdpa graph takes the "
                "caches as they are)")
    if path == "cudacore" and st.G not in FI_CUDACORE_GROUPS:
        return f"G={st.G}: the CUDA-core decode kernel dispatches G in {FI_CUDACORE_GROUPS} only"
    if path in ("xqa", "xqa_sweep"):
        if st.page_size not in XQA_PAGE_SIZES:
            return f"page size {st.page_size}: XQA is compiled for pages of {XQA_PAGE_SIZES} tokens only"
        if st.d % 16 or not 16 <= st.d <= 512:
            return f"head_dim {st.d}: XQA takes multiples of 16 in [16, 512]"
        if st.d > 256 and st.G > 16:
            return f"head_dim {st.d} > 256 needs G <= 16 in XQA (G={st.G})"
        if soft_cap > 0:
            return "XQA has no logits soft cap (trtllm_batch_decode_with_kv_cache takes none)"
    if path == "batch_attention":
        if window >= 0:
            return "BatchAttention.plan() has no sliding window (window_left)"
        if st.d > 256:
            return f"head_dim {st.d}: BatchAttention refuses head_dim > 256"
    if path == "cudnn":
        if st.layout != "HND":
            return "cuDNN decode takes HND caches [pages, Hkv, page, d] only"
        if soft_cap > 0 or window >= 0:
            return "cudnn_batch_decode_with_kv_cache takes no soft cap and no sliding window"
    return None


def fi_tol(st, path):
    """The relative-L2 tolerance of a FlashInfer path's output against the float64 reference."""
    return TOL_FP8_MATH if st.fp8 and path in FI_FP8_MATH_PATHS else TOL[st.dtype]


def as_f32(x):
    """x rounded to float32, as a Python float: the scale every kernel and the reference use."""
    return struct.unpack("f", struct.pack("f", x))[0]


def kv_scale_for(kv_dtype, args):
    """The scale of an fp8 cache: --kv-scale, else amax / the format's largest code with amax = 1 (vLLM's per-tensor
    calibration of the uniform [-1, 1] data), so the codes span the format; None for a 16-bit cache."""
    if kv_dtype not in FP8_MAX:
        return None
    s = getattr(args, "kv_scale", None)
    return as_f32(s if s else 1.0 / FP8_MAX[kv_dtype])


def quantize_fp8(torch, real, kv_dtype, scale):
    """fp8 codes of real values: real / scale, saturated at the format's largest finite code (torch's conversion
    alone gives NaN (e4m3) or inf (e5m2) beyond it), rounded to nearest even by torch's conversion."""
    fmax = FP8_MAX[kv_dtype]
    t = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[kv_dtype]
    return (real.float() / scale).clamp_(-fmax, fmax).to(t)


def kv_dtypes_of(st, args):
    """The cache types a step runs with (--kv-dtype; default q's type) and the ones it does not take: [(kv, why)]."""
    want = getattr(args, "kv_dtypes", None) or ["q"]
    run, skip = [], []
    for kv in want:
        kv = st.dtype if kv == "q" else kv
        if kv in run:
            continue
        if kv not in FP8_MAX and kv != st.dtype:
            skip.append((kv, f"{kv} cache with {st.dtype} q: neither library pairs two 16-bit types (use q)"))
            continue
        run.append(kv)
    return run, skip


def expand_kv(steps, args):
    """Each step once per cache type of --kv-dtype, the twins one after the other (a run stopped by --max-minutes
    keeps pairs); steps of the 16-bit type are the Step objects themselves.  Returns (steps, skipped)."""
    if not getattr(args, "kv_dtypes", None):
        return steps, []
    out, skipped = [], []
    for st in steps:
        run, skip = kv_dtypes_of(st, args)
        skipped += [(st.key(), kv, why) for kv, why in skip]
        for kv in run:
            t = st if kv == st.dtype else copy.copy(st)
            if t is not st:
                t.meta = dict(st.meta)
                t.set_kv(kv, kv_scale_for(kv, args))
            out.append(t)
    return out, skipped


def padded_block_table(indptr, indices, pad=0):
    """The CSR page table as XQA and cuDNN take it: int32 [B, max pages of a row], rows padded with `pad`
    (a valid page id: the kernels stop at seq_lens)."""
    import numpy as np
    indptr = np.asarray(indptr, dtype=np.int64)
    counts = np.diff(indptr)
    width = max(1, int(counts.max()) if len(counts) else 1)
    bt = np.full((len(counts), width), pad, dtype=np.int32)
    bt[np.arange(width)[None, :] < counts[:, None]] = np.asarray(indices, dtype=np.int32)
    return bt


def split_settings(lens, page_size, split_tokens, window_left=-1):
    """The split sweep of the decode wrapper: [(setting, plan keywords, same_as)].  fixed_split_size is in
    pages (the fa2 planner's kv_chunk_size counts pages); a split of at least every row's attended tokens
    is the same plan as disable_split_kv=True and is not timed again (same_as = "nosplit")."""
    longest = max(int(x) for x in lens) if len(lens) else 0
    if window_left >= 0:
        longest = min(longest, window_left + 1)
    out = [("nosplit", {"disable_split_kv": True}, None)]
    for tok in split_tokens:
        pages = max(1, tok // page_size)
        same = "nosplit" if pages * page_size >= longest else None
        out.append((f"split{tok}", {"fixed_split_size": pages}, same))
    return out


def combine_passes(ts):
    """One timing from the passes' timings (time_calls dicts): the median of the pass medians, every pass's
    median, and their spread ((max - min) / median)."""
    us = [t["us"] for t in ts]
    c = dict(ts[0])
    c["us"] = statistics.median(us)
    c["passes_us"] = us
    c["min_us"] = min(t["min_us"] for t in ts)
    c["p10_us"] = statistics.median(t["p10_us"] for t in ts)
    c["p90_us"] = statistics.median(t["p90_us"] for t in ts)
    c["reps"] = sum(t["reps"] for t in ts)
    c["pass_spread"] = (max(us) - min(us)) / c["us"] if c["us"] else None
    return c


def random_pages(n, name):
    import numpy as np
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return rng.permutation(n).astype(np.int32)


def isolated_step(group, name, shape, dtype, lens, args, reps, **meta):
    ps = args.page_size
    n = sum((x + ps - 1) // ps for x in lens)
    return Step(group, name, shape, dtype, lens, random_pages(n, f"{group}/{name}/{shape}/{dtype}"),
                args.layout, ps, reps, **meta)


def sample_steps(num_steps, which):
    out = []
    for w in which:
        s = {"first": 0, "mid": num_steps // 2, "last": num_steps - 1}.get(w)
        if s is None:
            s = int(w)
        if 0 <= s < num_steps and s not in out:
            out.append(s)
    return out


def build_steps(args):
    """The matrix, in the order it is measured (anchors, shapes, traces by seed), as Step objects."""
    import numpy as np
    sel = QUICK if args.matrix == "quick" else {
        "anchors": [a[0] for a in ANCHORS], "families": FAMILIES, "batches": BATCHES, "seeds": HELD_OUT_SEEDS,
        "trace_steps": ["mid", "first", "last"], "shape_runs": SHAPE_RUNS, "shape_points": SHAPE_POINTS}
    anchors = args.anchors.split(",") if args.anchors else sel["anchors"]
    families = args.families.split(",") if args.families else sel["families"]
    batches = [int(x) for x in args.batches.split(",")] if args.batches else sel["batches"]
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else sel["seeds"]
    tsteps = args.trace_steps.split(",") if args.trace_steps else sel["trace_steps"]
    shape_runs = args.shapes.split(",") if args.shapes else sel["shape_runs"]
    points = args.shape_points.split(",") if args.shape_points else sel["shape_points"]
    groups = args.groups.split(",")
    steps = []
    if "anchors" in groups:
        for name in anchors:
            if name not in ANCHOR_BY_NAME:
                raise SystemExit(f"unknown anchor {name!r}")
            _, b, kind, fixed, fi_us, fi_path = ANCHOR_BY_NAME[name]
            if score_kw(args):  # anchors.md's FlashInfer times are for every token, uncapped
                fi_us, fi_path = None, None
            steps.append(isolated_step("anchor", name, "paper", "fp16", anchor_lens(b, kind, fixed), args,
                                       args.reps, anchors_md_fi_us=fi_us, anchors_md_fi_path=fi_path))
    if "shapes" in groups:
        for run in shape_runs:
            shape, _, dtype = run.partition(":")
            dtype = dtype or SHAPES[shape][3]
            if shape not in SHAPES or dtype not in TOL:
                raise SystemExit(f"unknown shape run {run!r} (shape:dtype, e.g. g8:bf16)")
            for name in points:
                _, b, kind, fixed, _, _ = ANCHOR_BY_NAME[name]
                steps.append(isolated_step("shape", name, shape, dtype, anchor_lens(b, kind, fixed), args, args.reps))
    if "traces" in groups:
        import persistentkv as pkv
        traces = {}
        for seed in seeds:
            for fam in families:
                for b in batches:
                    tr = pkv.generate_trace(fam, seed, max_active=b, num_requests=3 * b, page_size=args.page_size)
                    traces[(seed, fam, b)] = (tr, sample_steps(tr.num_steps, tsteps))
        # Order: the k-th sampled step of every trace before the (k+1)-th, seeds before families, so
        # that a run stopped by --max-minutes still covers every seed, family and B.
        for k in range(max((len(v[1]) for v in traces.values()), default=0)):
            for (seed, fam, b), (tr, picks) in traces.items():
                if k >= len(picks):
                    continue
                s, n = picks[k], tr.num_steps
                indptr, idx, lens = tr.step_table(s)
                # the trace's own pages, renumbered by rank into [0, pages): same relative order
                uniq = np.unique(idx)
                assert len(uniq) == len(idx), "a trace step uses a page twice"
                compact = np.searchsorted(uniq, idx).astype(np.int32)
                st = Step("trace", f"{fam}_B{b}_s{seed}_t{s}", "paper", "fp16", lens, compact,
                          args.layout, args.page_size, args.trace_reps, family=fam, batch=b, seed=seed,
                          trace_step=s, trace_steps=n, trace_checksum=f"{tr.checksum:#018x}")
                assert np.array_equal(st.indptr, indptr), "trace CSR differs from the lengths"
                steps.append(st)
    steps, args.kv_skipped = expand_kv(steps, args)
    for st in steps:
        st.set_window(args.window_left)
        st.set_rotations(int(args.rotate_gib * 2 ** 30), int(args.pool_cap_gib * 2 ** 30))
    return steps


def fi_modules(steps, args):
    """The FlashInfer JIT modules the steps need: (q dtype, cache dtype, head_dim, module kind, G) -> (Hq, Hkv).
    The decode wrapper's and BatchAttention's modules do not depend on G (recorded as 0); XQA's do (and on the
    page size and on a window, which are the run's).  An fp8 cache is a module of its own on every path."""
    mods = {}
    for st in steps:
        for path, why in st.fi_paths(args):
            kind = FI_MODULE_OF.get(path)
            if why is None and kind is not None:
                mods.setdefault((st.dtype, st.kv_dtype, st.d, kind, st.G if kind == "xqa" else 0), (st.Hq, st.Hkv))
    return mods


def jit_spec(key, hq, hkv):
    """--jit-one's argument for a module of fi_modules: dtype,d,kind,Hq,Hkv[,cache dtype when it is fp8]."""
    dt, kv, d, kind, _ = key
    return f"{dt},{d},{kind},{hq},{hkv}" + (f",{kv}" if kv != dt else "")


# ---- the GPU side -----------------------------------------------------------------------------------
class DevHelpers:
    """PersistentKV's device helpers (lab/pkv_lab.h: the streaming-read floor, launch latency and device
    info), from the lab's shared library (libpersistentkv_lab.so) through a private ctypes handle.  The lab
    carries its own copy of the core, so the context they run on is created by the lab's pkv_context_create:
    a context from the serving library would belong to another copy of the core and its CUDA runtime."""

    class Info(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char * 128), ("sms", ctypes.c_int32), ("cc_major", ctypes.c_int32),
                    ("cc_minor", ctypes.c_int32), ("runtime_version", ctypes.c_int32),
                    ("driver_version", ctypes.c_int32), ("l2_bytes", ctypes.c_int64), ("mem_bytes", ctypes.c_int64)]

    def __init__(self):
        from persistentkv import _lib as L
        if L._lab is None:
            raise RuntimeError(f"the lab library ({L._LAB_NAME}) was not found next to {L.library_path} "
                               "(build the persistentkv_lab target)")
        self.dll = ctypes.CDLL(L._lab._name)  # the lab library, own function objects
        vp, sz, P = ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER
        self.dll.pkv_dev_time_read.argtypes = [vp, vp, sz, sz, ctypes.c_int32, P(ctypes.c_double)]
        self.dll.pkv_dev_time_read.restype = ctypes.c_int
        self.dll.pkv_dev_launch_latency.argtypes = [vp, P(ctypes.c_double), P(ctypes.c_double)]
        self.dll.pkv_dev_launch_latency.restype = ctypes.c_int
        self.dll.pkv_dev_get_info.argtypes = [vp, P(self.Info)]
        self.dll.pkv_dev_get_info.restype = ctypes.c_int
        self.dll.pkv_last_error.argtypes = []
        self.dll.pkv_last_error.restype = ctypes.c_char_p
        self.dll.pkv_context_config_default.argtypes = [P(L.ContextConfig)]
        self.dll.pkv_context_config_default.restype = None
        self.dll.pkv_context_create.argtypes = [P(L.ContextConfig), P(vp)]
        self.dll.pkv_context_create.restype = ctypes.c_int
        self.dll.pkv_context_free.argtypes = [vp]
        self.dll.pkv_context_free.restype = None
        cfg = L.ContextConfig()
        self.dll.pkv_context_config_default(ctypes.byref(cfg))
        cfg.backend = L.BACKEND_CUDA
        ctx = ctypes.c_void_p()
        if self.dll.pkv_context_create(ctypes.byref(cfg), ctypes.byref(ctx)) != 0:
            raise RuntimeError("pkv_context_create (lab library) failed")
        self.ctx = ctx
        self._free = self.dll.pkv_context_free

    def _check(self, st, what):
        if st != 0:
            raise RuntimeError(f"{what}: {(self.dll.pkv_last_error() or b'').decode(errors='replace')}")

    def time_read(self, ptr, buf_bytes, nbytes, reps):
        us = ctypes.c_double()
        self._check(self.dll.pkv_dev_time_read(self.ctx, ptr, buf_bytes, nbytes, reps, ctypes.byref(us)),
                    "pkv_dev_time_read")
        return us.value

    def launch_latency(self):
        a, b = ctypes.c_double(), ctypes.c_double()
        self._check(self.dll.pkv_dev_launch_latency(self.ctx, ctypes.byref(a), ctypes.byref(b)), "launch latency")
        return a.value, b.value

    def info(self):
        i = self.Info()
        self._check(self.dll.pkv_dev_get_info(self.ctx, ctypes.byref(i)), "pkv_dev_get_info")
        return {"name": i.name.decode(), "sms": i.sms, "cc": f"{i.cc_major}.{i.cc_minor}", "l2_bytes": i.l2_bytes,
                "mem_bytes": i.mem_bytes, "cuda_runtime": i.runtime_version, "cuda_driver": i.driver_version}


def _pct(sorted_vals, q):
    i = int(q * (len(sorted_vals) - 1) + 0.5)
    return sorted_vals[max(0, min(len(sorted_vals) - 1, i))]


class Gpu:
    def __init__(self, args, flat_bytes):
        import torch
        self.torch, self.args = torch, args
        if not torch.cuda.is_available():
            raise SystemExit("torch sees no CUDA device (use --dry-run on a machine without a GPU)")
        self.dev = torch.device("cuda", 0)
        torch.cuda.set_device(self.dev)
        self.tdt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn,
                    "fp8_e5m2": torch.float8_e5m2}
        flat_bytes = -(-flat_bytes // (2 << 20)) * (2 << 20)
        log(f"allocating the flat K/V buffer: {flat_bytes / 2 ** 30:.1f} GiB")
        self.flat = torch.empty(flat_bytes, dtype=torch.uint8, device=self.dev)
        self.flat_bytes = flat_bytes
        self.filled, self.filled_bytes = None, 0
        self.has_sleep = hasattr(torch.cuda, "_sleep")
        if not self.has_sleep:
            log("warning: torch.cuda._sleep is missing: runs are not queued behind a spin")
        self.cycles_per_us = self._calibrate_spin()
        try:
            self.devh = DevHelpers()
        except Exception as e:  # an older library or a CPU build: torch floors only
            log(f"PersistentKV device helpers unavailable ({e}); floors use torch.sum")
            self.devh = None
        self.fi_wrappers = {}
        self.fi_failed = {}  # (dtype, head_dim, config) -> why
        self.pkv_wrappers = {}

    # -- data --
    def fill(self, dtype, scale=None, nbytes=None):
        """The flat buffer as `dtype`: 16-bit types uniform [-1, 1] over the whole buffer; fp8 the codes of uniform
        [-1, 1] real values at `scale` (quantize_fp8) over its first nbytes (what the step's pools take)."""
        if dtype in FP8_MAX:
            nbytes = self.flat_bytes if nbytes is None else min(int(nbytes), self.flat_bytes)
            if self.filled == (dtype, scale) and self.filled_bytes >= nbytes:
                return
            torch, t0 = self.torch, time.perf_counter()
            x = self.flat[:nbytes].view(self.tdt[dtype])
            chunk = 1 << 27
            for i in range(0, nbytes, chunk):
                m = min(chunk, nbytes - i)
                x[i:i + m].copy_(quantize_fp8(torch, torch.empty(m, dtype=torch.float32, device=self.dev)
                                              .uniform_(-1.0, 1.0), dtype, scale))
            torch.cuda.synchronize()
            self.filled, self.filled_bytes = (dtype, scale), nbytes
            log(f"filled {nbytes / 2 ** 30:.2f} GiB with {dtype} codes of uniform [-1, 1] / {scale:.6g} "
                f"({(time.perf_counter() - t0) * 1e3:.0f} ms)")
            return
        if self.filled != dtype:
            t0 = time.perf_counter()
            self.flat.view(self.tdt[dtype]).uniform_(-1.0, 1.0)
            self.torch.cuda.synchronize()
            self.filled, self.filled_bytes = dtype, self.flat_bytes
            log(f"filled {self.flat_bytes / 2 ** 30:.1f} GiB with uniform [-1, 1] {dtype} "
                f"({(time.perf_counter() - t0) * 1e3:.0f} ms)")

    def pools(self, st):
        """K and V views per rotation: [P, ps, Hkv, d] (NHD) or [P, Hkv, ps, d] (HND), of the cache's type."""
        P, R, pe = st.pages, st.rotations, st.page_elems
        self.fill(st.kv_dtype, st.kv_scale, 2 * R * P * pe * st.elem)
        x = self.flat.view(self.tdt[st.kv_dtype])
        shape = ((R * P, st.page_size, st.Hkv, st.d) if st.layout == "NHD" else (R * P, st.Hkv, st.page_size, st.d))
        K = x[: R * P * pe].view(shape)
        V = x[R * P * pe: 2 * R * P * pe].view(shape)
        return [K[r * P:(r + 1) * P] for r in range(R)], [V[r * P:(r + 1) * P] for r in range(R)]

    # -- timing --
    def _calibrate_spin(self):
        torch = self.torch
        if not self.has_sleep:
            return 0.0
        best = 0.0
        for _ in range(3):  # the clock ramps up from idle: keep the fastest (spins then err long)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(20_000_000)
            a.record()
            torch.cuda._sleep(2_000_000)
            b.record()
            torch.cuda.synchronize()
            best = max(best, 2_000_000 / max(a.elapsed_time(b) * 1e3, 1.0))
        return best

    def spin(self, us):
        if self.has_sleep and us > 0:
            self.torch.cuda._sleep(int(us * self.cycles_per_us))

    def time_calls(self, call, nrot, reps, warmup=None, batch=16):
        """Kernel time of call(r) (r: rotation): CUDA events around each call, calls queued in batches
        behind a spin sized from the measured host enqueue time.  Returns a dict of us."""
        torch, E = self.torch, (lambda: self.torch.cuda.Event(enable_timing=True))
        warmup = self.args.warmup if warmup is None else warmup
        w = max(warmup, 2)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(w):  # host enqueue cost (also warms caches of both libraries)
            call(i % nrot)
        host_us = (time.perf_counter() - t0) / w * 1e6
        torch.cuda.synchronize()
        ev = [(E(), E()) for _ in range(w)]
        self.spin(1.5 * w * host_us + 20)
        for i, (a, b) in enumerate(ev):  # queued: an estimate of the device time alone
            a.record()
            call(i % nrot)
            b.record()
        torch.cuda.synchronize()
        k_est = min(a.elapsed_time(b) for a, b in ev) * 1e3
        # the spin must outlast the host's enqueue of a whole batch: sized without crediting the
        # device time of the calls (k_est), since a short spin lets the queue drain and puts host
        # time between the events (auto, timed first, read 1.4x slow on B1-B2 rows at 3a84848 while
        # its CUDA-graph replay was as fast as the best route)
        spin_us = min(50000.0, max(20.0, 2.0 * batch * host_us))
        ev = [(E(), E()) for _ in range(reps)]
        for i, (a, b) in enumerate(ev):
            if i % batch == 0:
                self.spin(spin_us)
            a.record()
            call((w + i) % nrot)
            b.record()
        torch.cuda.synchronize()
        s = sorted(a.elapsed_time(b) * 1e3 for a, b in ev)
        return {"us": statistics.median(s), "p10_us": _pct(s, 0.1), "p90_us": _pct(s, 0.9), "min_us": s[0],
                "reps": reps, "host_us": host_us, "spin_us": spin_us, "queued_estimate_us": k_est}

    def host_times(self, fn, reps, sync_inside=True):
        """Median host-clock time of fn() bracketed by device syncs."""
        torch = self.torch
        v = []
        for i in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn(i)
            if sync_inside:
                torch.cuda.synchronize()
            v.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(v)

    # -- ceilings --
    def torch_read_us(self, nbytes, reps):
        x = self.flat.view(self.torch.float32)
        n = max(1, nbytes // 4)
        windows = max(1, x.numel() // n)
        return self.time_calls(lambda r: x[r * n:(r + 1) * n].sum(), windows, reps)["us"]

    def floor_us(self, nbytes, reps):
        if nbytes < 16:
            return None, None
        if self.devh is not None and self.args.floor == "pkv":
            return self.devh.time_read(self.flat.data_ptr(), self.flat_bytes, nbytes, reps), "pkv_dev_time_read"
        return self.torch_read_us(nbytes, reps), "torch.sum(float32 view)"

    def ceilings(self):
        nb = 4 << 30
        out = {"read_bytes": nb}
        out["torch_sum_us"] = self.torch_read_us(nb, 10)
        out["torch_sum_gbps"] = nb / (out["torch_sum_us"] * 1e3)
        if self.devh is not None:
            us = self.devh.time_read(self.flat.data_ptr(), self.flat_bytes, nb, 10)
            out["pkv_read_us"], out["pkv_read_gbps"] = us, nb / (us * 1e3)
            out["empty_launch_us"], out["graph_launch_us"] = self.devh.launch_latency()
        best = max(out.get("pkv_read_gbps", 0.0), out["torch_sum_gbps"])
        out["read_gbps"] = best
        out["read_kernel"] = ("pkv_dev_time_read (16-byte loads, best of 3 grids)"
                              if best == out.get("pkv_read_gbps") else "torch.sum over a float32 view")
        return out

    # -- libraries --
    def fi_wrapper(self, cfg):
        """A decode wrapper per configuration: cudacore, tensorcore, and tensorcore_split (the split sweep's own
        wrapper, so that its plans never replace the tensorcore wrapper's).  The default wrappers get the 128 MB
        workspace FlashInfer's users give them; the split sweep's gets 512 MB, so that its short splits of long
        batches (whose partial outputs overflow 128 MB) run instead of being refused."""
        import flashinfer
        key = (self.args.layout, cfg)
        if key not in self.fi_wrappers:
            ws = self.torch.zeros((512 if cfg == "tensorcore_split" else 128) << 20, dtype=self.torch.uint8,
                                  device=self.dev)
            self.fi_wrappers[key] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                ws, self.args.layout, use_tensor_cores=(cfg != "cudacore"))
        return self.fi_wrappers[key]

    def fi_buffer(self, name, nbytes=128 << 20):
        """A zeroed uint8 workspace kept for the run: XQA's (its first 8 MB are semaphores that must start at
        zero; the kernel leaves them at zero) and cuDNN's."""
        if name not in self.fi_wrappers:
            self.fi_wrappers[name] = self.torch.zeros(nbytes, dtype=self.torch.uint8, device=self.dev)
        return self.fi_wrappers[name]

    def fi_batch_attention(self):
        import flashinfer
        key = (self.args.layout, "batch_attention")
        if key not in self.fi_wrappers:  # owns a 384 MB float workspace
            self.fi_wrappers[key] = flashinfer.BatchAttention(kv_layout=self.args.layout, device="cuda")
        return self.fi_wrappers[key]

    def sm_count(self):
        return self.torch.cuda.get_device_properties(self.dev).multi_processor_count

    def pkv_wrapper(self, route):
        import persistentkv as pkv
        if route not in self.pkv_wrappers:
            self.pkv_wrappers[route] = pkv.BatchDecodeWithPagedKVCacheWrapper(
                kv_layout=self.args.layout, backend="cuda")
        return self.pkv_wrappers[route]


def nan_count(a):
    return int(a.isnan().sum().item())


def safe_sync(torch):
    """None, or the error text when the device is in an error state (sticky CUDA errors)."""
    try:
        torch.cuda.synchronize()
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def rel_err(a, b):
    """(relative L2 of a against b, max abs difference, NaN count of a), in float64."""
    a64, b64 = a.double(), b.double()
    nan = int(a64.isnan().sum().item())
    d = (a64 - b64)
    den = b64.norm().item()
    return (d.norm().item() / den if den > 0 else d.norm().item()), d.abs().max().item(), nan


def pick_ref_rows(lens, budget=300_000):
    order = [int(lens.argmax()), int(lens.argmin()), 0, len(lens) - 1]
    rows, used = [], 0
    for r in order:
        if r in rows or (rows and used + int(lens[r]) > budget):
            continue
        rows.append(r)
        used += int(lens[r])
        if len(rows) == 3:
            break
    return rows


def torch_reference(torch, st, q, K0, V0, rows, soft_cap=0.0, window_left=-1, k_scale=None, v_scale=None):
    """float64 attention of the given rows over rotation 0: [len(rows), Hq, d]; scores capped as
    cap * tanh(s / cap) when soft_cap > 0, only the last window_left + 1 tokens when window_left >= 0.
    fp8 caches (K0, V0 of torch.float8_e4m3fn / float8_e5m2): each element is float(code) x k_scale (v_scale),
    exactly (an fp8 code is exact in float32, the product exact in float64)."""
    outs = []
    scale = 1.0 / math.sqrt(st.d)
    idx_all = torch.as_tensor(st.indices, device=K0.device, dtype=torch.long)
    fp8 = K0.element_size() == 1
    for r in rows:
        a, b, n = int(st.indptr[r]), int(st.indptr[r + 1]), int(st.lens[r])
        idx = idx_all[a:b]
        if fp8:  # the gather on the bytes (indexing of float8 tensors is not in every torch build), then decode
            k, v = K0.view(torch.uint8)[idx].view(K0.dtype), V0.view(torch.uint8)[idx].view(V0.dtype)
        else:
            k, v = K0[idx], V0[idx]
        if st.layout == "HND":  # [p, Hkv, ps, d] -> [p, ps, Hkv, d]
            k, v = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)
        first = max(0, n - (window_left + 1)) if window_left >= 0 else 0
        if fp8:
            k = k.reshape(-1, st.Hkv, st.d)[first:n].float().double() * (1.0 if k_scale is None else k_scale)
            v = v.reshape(-1, st.Hkv, st.d)[first:n].float().double() * (1.0 if v_scale is None else v_scale)
        else:
            k = k.reshape(-1, st.Hkv, st.d)[first:n].double()
            v = v.reshape(-1, st.Hkv, st.d)[first:n].double()
        qq = q[r].double().view(st.Hkv, st.G, st.d)
        s = torch.einsum("hgd,nhd->hgn", qq, k) * scale
        if soft_cap > 0:
            s = soft_cap * torch.tanh(s / soft_cap)
        p = torch.softmax(s, dim=-1)
        outs.append(torch.einsum("hgn,nhd->hgd", p, v).reshape(st.Hq, st.d))
    return torch.stack(outs)


def score_kw(args):
    """The score options (--soft-cap, --window-left) as both libraries' plan() keywords."""
    kw = {}
    if args.soft_cap > 0:
        kw["logits_soft_cap"] = args.soft_cap
    if args.window_left >= 0:
        kw["window_left"] = args.window_left
    return kw


def fi_variants(gpu, st, path, q, Ks, Vs, tabs, args, notes=None):
    """The settings of one FlashInfer path for the step: [(setting, plan, run, graph, same_as)].
    plan() does the path's host work for the step (plan() of a wrapper, or the padded block table and its copy
    to the device), run(r, out) one decode over rotation r into out, graph() a callable r -> out that a CUDA
    graph may capture (a use_cuda_graph wrapper for the decode wrapper), same_as a setting whose plan this
    one repeats (not timed again).  Raises when FlashInfer lacks the path.
    fp8 caches: plan(kv_data_type=float8_*) with q's 16-bit type, run(k_scale=S, v_scale=S) (the decode wrapper
    folds k_scale into sm_scale and applies v_scale by a separate `out *= v_scale` after its kernel, inside the
    timed call; BatchAttention passes v_scale to its kernel); XQA takes them as bmm1_scale = sm_scale x S and
    bmm2_scale = S.  notes (a dict), when given, receives what plan() resolved (the decode wrapper's backend)."""
    import numpy as np
    import flashinfer
    torch, dev = gpu.torch, gpu.dev
    tdt = gpu.tdt[st.dtype]
    kv_tdt = gpu.tdt[st.kv_dtype]
    indptr_h, indices_d, last_h = tabs
    plan_kw = dict(q_data_type=tdt, kv_data_type=kv_tdt, **score_kw(args))
    sm_scale = 1.0 / math.sqrt(st.d)
    kv_scale = st.kv_scale if st.fp8 else 1.0
    run_kw = dict(k_scale=kv_scale, v_scale=kv_scale) if st.fp8 else {}

    def eager_graph(run):
        def make():
            gout = torch.full_like(q, float("nan"))

            def on(r):
                run(r, gout)
                return gout
            return on
        return make

    if path in ("cudacore", "tensorcore", "split_sweep"):
        cfg = {"split_sweep": "tensorcore_split"}.get(path, path)
        w = gpu.fi_wrapper(cfg)
        if path == "split_sweep":
            settings = split_settings(st.lens, st.page_size, args.split_tokens, args.window_left)
        else:
            settings = [("default", {}, None)]
        res = []
        for name, extra, same in settings:
            def plan(_=None, w=w, extra=extra):
                w.plan(indptr_h, indices_d, last_h, st.Hq, st.Hkv, st.d, st.page_size, **plan_kw, **extra)
                if notes is not None and path != "cudacore":  # tensor cores: fp8 makes "auto" ask
                    # determine_attention_backend
                    notes["backend"] = getattr(w, "_backend", None)

            def run(r, out, w=w):
                w.run(q, (Ks[r], Vs[r]), out=out, **run_kw)

            def graph(extra=extra):
                gw = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                    torch.zeros(128 << 20, dtype=torch.uint8, device=dev), st.layout, use_cuda_graph=True,
                    use_tensor_cores=(path != "cudacore"),
                    paged_kv_indptr_buffer=torch.empty(st.B + 1, dtype=torch.int32, device=dev),
                    paged_kv_indices_buffer=torch.empty(max(st.pages, 1), dtype=torch.int32, device=dev),
                    paged_kv_last_page_len_buffer=torch.empty(st.B, dtype=torch.int32, device=dev))
                gw.plan(indptr_h, indices_d, last_h, st.Hq, st.Hkv, st.d, st.page_size, **plan_kw, **extra)
                gout = torch.full_like(q, float("nan"))

                def on(r, gw=gw):
                    gw.run(q, (Ks[r], Vs[r]), out=gout, **run_kw)
                    return gout
                return on
            res.append((name, plan, run, graph, same))
        return res

    if path in ("xqa", "xqa_sweep", "cudnn"):
        cap = torch.cuda.get_device_capability(dev)
        if path != "cudnn" and cap[0] not in (9, 10, 12):
            raise NotImplementedError(f"XQA runs on sm_90, sm_100 and sm_12x only (this is sm_{cap[0]}{cap[1]})")
        tables = {}

        def tplan(_=None):
            # what a caller of this API does per step: the padded [B, max pages] block table and the lengths
            bt = padded_block_table(st.indptr, st.indices)
            tables["bt"] = torch.from_numpy(bt).to(dev)
            # FlashInfer documents uint32 lengths; its own decode wrapper hands int32 (same bits below 2^31)
            seq = torch.from_numpy(st.lens.astype(np.int32)).to(dev)
            tables["seq"] = seq
            tables["seq2"] = seq.unsqueeze(1)               # flashinfer.xqa.xqa: [B, beam_width]
            tables["seq4"] = seq.view(st.B, 1, 1, 1)        # cuDNN: [B, 1, 1, 1]
            tables["max_len"] = int(st.lens.max())
        tplan()
        ws = gpu.fi_buffer("xqa_ws" if path != "cudnn" else "cudnn_ws")
        if path == "xqa":
            def run(r, out):
                # bmm1_scale: the whole score scale (k_scale folded in); bmm2_scale: v_scale (xqa() then gets
                # kv_scale = bmm2_scale and q_scale = bmm1_scale / bmm2_scale x sqrt(d))
                flashinfer.decode.trtllm_batch_decode_with_kv_cache(
                    q, (Ks[r], Vs[r]), ws, tables["bt"], tables["seq"], tables["max_len"],
                    bmm1_scale=sm_scale * kv_scale, bmm2_scale=kv_scale, window_left=args.window_left, out=out,
                    kv_layout=st.layout, backend="xqa")
            return [("default", tplan, run, eager_graph(run), None)]
        if path == "xqa_sweep":
            # the one knob of XQA's sub-sequence (multi-CTA) split on fp16/bf16 caches: launchMHAFlashInfer takes
            # nbSubSeqPerSeq = min(max(1, sm_count / (B * Hkv)), ceil(max_seq_len / tile)); sm_count is an
            # argument of flashinfer.xqa.xqa (trtllm_batch_decode_with_kv_cache passes the device's SM count)
            from flashinfer.xqa import xqa as xqa_fn
            sem, scratch = ws[: 8 << 20], ws[8 << 20:]
            sms = gpu.sm_count()
            res = []
            for k in args.xqa_sm_multiples:
                def run(r, out, smc=k * sms):
                    # one kv_scale for K and V inside: q_scale = k_scale / v_scale, kv_scale = v_scale (here both S)
                    xqa_fn(q.unsqueeze(1), Ks[r], Vs[r], tables["bt"], tables["seq2"], out.unsqueeze(1), scratch, sem,
                           st.Hkv, st.page_size, q_scale=1.0, kv_scale=kv_scale,
                           sliding_win_size=args.window_left + 1 if args.window_left >= 0 else 0,
                           kv_layout=st.layout, sm_count=smc)
                # the split count saturates at ceil(max_seq_len / tile): a larger sm_count may change nothing
                res.append((f"sm_count={k}x{sms}", tplan, run, eager_graph(run), None))
            return res
        # cuDNN
        from flashinfer.cudnn import decode as cudnn_decode
        if not getattr(cudnn_decode, "CUDNN_AVAILABLE", False):
            raise NotImplementedError(
                "not run: the python module cudnn (nvidia-cudnn-frontend) is not installed - it does not travel "
                "in the wheelhouse (size limit), and FlashInfer's fallback loads downloaded cubins "
                "(FLASHINFER_NO_DOWNLOAD=1 offline)")

        def run(r, out):
            cudnn_decode.cudnn_batch_decode_with_kv_cache(
                q, Ks[r], Vs[r], sm_scale, ws, max_sequence_kv=tables["max_len"], actual_seq_lens_kv=tables["seq4"],
                block_tables=tables["bt"], out=out)
        return [("default", tplan, run, eager_graph(run), None)]

    if path == "batch_attention":
        ba = gpu.fi_batch_attention()
        qo_indptr = torch.arange(st.B + 1, dtype=torch.int32)
        kv_len = torch.from_numpy(st.lens.astype(np.int32))
        lse = torch.empty(st.B, st.Hq, dtype=torch.float32, device=dev)
        cap = args.soft_cap if args.soft_cap > 0 else 0.0

        def plan(_=None):
            ba.plan(qo_indptr, indptr_h, indices_d, kv_len, st.Hq, st.Hkv, st.d, st.d, st.page_size, causal=False,
                    logits_soft_cap=cap or None, q_data_type=tdt, kv_data_type=kv_tdt)

        def run(r, out):  # fp8: k_scale folded into sm_scale, v_scale into the kernel's output (floats)
            ba.run(q, (Ks[r], Vs[r]), out=out, lse=lse, logits_soft_cap=cap, **run_kw)
        return [("default", plan, run, eager_graph(run), None)]
    raise ValueError(f"unknown FlashInfer path {path!r}")


def measure_step(gpu, st, args):
    """Every measurement of one step; returns the row dict."""
    torch = gpu.torch
    row = base_row(st, args)
    problems, errors = [], []
    Ks, Vs = gpu.pools(st)
    R = st.rotations
    tdt = gpu.tdt[st.dtype]
    gen = torch.Generator(device=gpu.dev)
    gen.manual_seed(zlib.crc32(st.base_key().encode()))  # an fp8 twin gets the same q as its 16-bit step
    q = torch.empty(st.B, st.Hq, st.d, dtype=tdt, device=gpu.dev).uniform_(-1.0, 1.0, generator=gen)
    indptr_h = torch.from_numpy(st.indptr)
    last_h = torch.from_numpy(st.last_page_len)
    indices_d = torch.from_numpy(st.indices).to(gpu.dev)
    reps, wall_reps = st.reps, args.wall_reps
    tol = TOL[st.dtype]
    ref_rows = pick_ref_rows(st.lens) if not args.no_reference else []
    ref = torch_reference(torch, st, q, Ks[0], Vs[0], ref_rows, args.soft_cap, args.window_left, st.kv_scale,
                          st.kv_scale) if ref_rows else None
    row["ref_rows"] = ref_rows
    # PersistentKV's fp8 keywords (a 16-bit step passes none, as before)
    pk_plan_kw = dict(kv_data_type=gpu.tdt[st.kv_dtype]) if st.fp8 else {}
    pk_run_kw = dict(k_scale=st.kv_scale, v_scale=st.kv_scale) if st.fp8 else {}

    # floor of the step: a streaming read of its K/V bytes, timed like the steps
    fl, kind = gpu.floor_us(st.kv_bytes, min(args.floor_reps, reps))
    row["floor_us"], row["floor_kernel"] = fl, kind

    def check_ref(name, out):
        if ref is None:
            return None
        e, m, _ = rel_err(out[ref_rows], ref)
        if not (e <= tol):
            problems.append(f"{name}: rel err {e:.2e} against the float64 reference")
        return e

    # ---- FlashInfer: every path that takes the shape, each setting planned, run once and checked ----
    fi, fi_out, fi_var = {}, {}, {}   # fi_var[(path, setting)] = (plan, run, graph, out)
    tabs = (indptr_h, indices_d, last_h)
    for path, why in st.fi_paths(args):
        if why:
            fi[path] = {"refused": why, "label": FI_PATH_LABELS[path]}
            continue
        mod = (path, st.dtype, st.d, st.G, st.layout, st.kv_dtype)
        if mod in gpu.fi_failed:  # do not recompile a module that failed on an earlier step
            fi[path] = dict(gpu.fi_failed[mod], label=FI_PATH_LABELS[path])
            continue
        entry = {"label": FI_PATH_LABELS[path], "sweep": {}}
        ptol = fi_tol(st, path)
        notes = {}
        if st.fp8:
            entry["tol"] = ptol
        try:
            variants = fi_variants(gpu, st, path, q, Ks, Vs, tabs, args, notes)
        except (ValueError, NotImplementedError, ImportError, AttributeError) as e:  # FlashInfer lacks it here
            fi[path] = {"refused": f"{type(e).__name__}: {e}", "label": FI_PATH_LABELS[path]}
            gpu.fi_failed[mod] = {"refused": fi[path]["refused"]}
            continue
        for setting, plan, run, graph, same in variants:
            if same is not None:
                entry["sweep"][setting] = {"same_as": same}
                continue
            try:
                plan()
                out = torch.full_like(q, float("nan"))
                run(0, out)
                torch.cuda.synchronize()
                res = {"nan_outputs": nan_count(out), "ref_rel_err": None}
                if ref is not None:
                    res["ref_rel_err"] = rel_err(out[ref_rows], ref)[0]
                if res["nan_outputs"] or (res["ref_rel_err"] is not None and not res["ref_rel_err"] <= ptol):
                    res["wrong"] = (f"{res['nan_outputs']} NaN outputs, rel err {fmt(res['ref_rel_err'], '.2e')} "
                                    f"against the float64 reference")
                    problems.append(f"FlashInfer {path} {setting}: {res['wrong']}")
                else:
                    fi_var[(path, setting)] = (plan, run, graph, out.clone())
                for r in range(min(R, 4)):  # warm, as the PersistentKV routes
                    run(r, out)
                torch.cuda.synchronize()
                entry["sweep"][setting] = res
            except (ValueError, NotImplementedError, AssertionError) as e:  # FlashInfer's checks of the shape
                entry["sweep"][setting] = {"refused": f"{type(e).__name__}: {e}"}
                safe_sync(torch)
            except Exception as e:  # a JIT build or a launch that failed: recorded, not fatal
                entry["sweep"][setting] = {"error": f"{type(e).__name__}: {e}"}
                errors.append(f"FlashInfer {path} {setting}: {type(e).__name__}: {e}")
                if safe_sync(torch) is None and len(variants) == 1:
                    gpu.fi_failed[mod] = {"error": f"failed on an earlier step: {type(e).__name__}: {str(e)[:300]}"}
        if not any(k[0] == path for k in fi_var):
            states = [v for v in entry["sweep"].values() if "same_as" not in v]
            if states and all("refused" in v for v in states):
                entry["refused"] = states[0]["refused"]
            elif not any("wrong" in v for v in states):
                entry["error"] = "; ".join(v.get("error", v.get("refused", "?")) for v in states)
            else:
                entry["wrong"] = "; ".join(v["wrong"] for v in states if "wrong" in v)
        if st.fp8 and notes.get("backend"):
            entry["backend"] = notes["backend"]
        fi[path] = entry

    # ---- PersistentKV: every route planned, run and checked ----
    pk, pk_out, wrappers = {}, {}, {}
    for route in args.routes:
        try:
            w = gpu.pkv_wrapper(route)

            def pplan(_=None, w=w, route=route):
                w.plan(st.indptr, st.indices, st.lens, st.Hq, st.Hkv, st.d, st.page_size, num_pages=st.pages,
                       q_data_type=st.dtype, route=route, **pk_plan_kw, **score_kw(args))
            pplan()
            out = torch.full_like(q, float("nan"))
            w.run(q, Ks[0], Vs[0], out=out, **pk_run_kw)
            torch.cuda.synchronize()
            pk_out[route] = out.clone()
            for r in range(min(R, 4)):  # warm: every route runs before any is timed
                w.run(q, Ks[r], Vs[r], out=out, **pk_run_kw)
            torch.cuda.synchronize()
            wrappers[route] = (w, pplan, out)
        except Exception as e:
            pk[route] = {"error": f"{type(e).__name__}: {e}"}
            problems.append(f"PersistentKV {route}: {type(e).__name__}: {e}")
            safe_sync(torch)

    # ---- timing: --passes passes, the libraries' order alternating (FlashInfer first in even passes) ----
    # Within PersistentKV, auto is timed after the fixed routes; a FlashInfer path is re-planned before its
    # timing (the split sweep's settings share a wrapper).  Each pass times reps / passes runs.
    passes = max(1, args.passes)
    preps = max(10, -(-reps // passes))
    fi_t, pk_t, pk_failed = {}, {}, set()
    order = [r for r in wrappers if r != "auto"] + [r for r in wrappers if r == "auto"]
    for p in range(passes):
        for lib in (("fi", "pkv") if p % 2 == 0 else ("pkv", "fi")):
            if lib == "fi":
                for key, (plan, run, _, out) in fi_var.items():
                    if key in fi_t and fi_t[key] is None:
                        continue
                    try:
                        plan()
                        o = torch.empty_like(q)
                        fi_t.setdefault(key, []).append(gpu.time_calls(lambda r, run=run, o=o: run(r, o), R, preps))
                    except Exception as e:
                        fi[key[0]]["sweep"][key[1]] = {"error": f"timing: {type(e).__name__}: {e}"}
                        errors.append(f"FlashInfer {key[0]} {key[1]} (timing): {type(e).__name__}: {e}")
                        fi_t[key] = None
                        safe_sync(torch)
            else:
                for route in order:
                    if route in pk_failed:
                        continue
                    w, pplan, out = wrappers[route]
                    try:
                        pk_t.setdefault(route, []).append(
                            gpu.time_calls(lambda r, w=w, out=out: w.run(q, Ks[r], Vs[r], out=out, **pk_run_kw), R,
                                           preps))
                    except Exception as e:
                        pk[route] = {"error": f"{type(e).__name__}: {e}"}
                        problems.append(f"PersistentKV {route}: {type(e).__name__}: {e}")
                        pk_failed.add(route)
                        safe_sync(torch)

    # ---- FlashInfer: each path's best setting, the best path ----
    for (path, setting), ts in fi_t.items():
        if ts:
            fi[path]["sweep"][setting].update(combine_passes(ts))
    for path, entry in fi.items():
        sw = {k: v for k, v in entry.get("sweep", {}).items() if "us" in v}
        if not sw:
            continue
        best_set = min(sw, key=lambda k: sw[k]["us"])
        entry.update({k: v for k, v in sw[best_set].items()})
        entry["setting"] = best_set
        fi_out[path] = fi_var[(path, best_set)][3]
        if path not in ("split_sweep", "xqa_sweep"):
            entry.pop("sweep", None)  # one setting: its numbers are the entry's
        else:
            entry["sweep"] = {k: (dict(us=v["us"], passes_us=v.get("passes_us")) if "us" in v else v)
                              for k, v in entry["sweep"].items()}
        try:
            entry["plan_us"] = gpu.host_times(fi_var[(path, best_set)][0], wall_reps)
        except Exception as e:
            errors.append(f"FlashInfer {path} plan timing: {type(e).__name__}: {e}")
    row["fi"] = fi
    ok_fi = {c: v for c, v in fi.items() if "us" in v}
    best_fi = min(ok_fi, key=lambda c: ok_fi[c]["us"]) if ok_fi else None
    row["fi_best_config"] = best_fi
    row["fi_path_us"] = {c: v.get("us") for c, v in fi.items()}
    row["fi_path_status"] = {c: fi_status(v) for c, v in fi.items()}
    if best_fi is None:
        problems.append("no FlashInfer path ran: nothing to compare PersistentKV with")
    else:
        row["fi_best_us"] = ok_fi[best_fi]["us"]
        row["fi_best_setting"] = ok_fi[best_fi].get("setting")
        row["fi_best_label"] = FI_PATH_LABELS[best_fi]
        row["fi_plan_us"] = ok_fi[best_fi].get("plan_us")
        row["fi_best_passes_us"] = ok_fi[best_fi].get("passes_us")
        for c in ok_fi:
            if c != best_fi:
                fi[c]["rel_err_vs_best"] = rel_err(fi_out[c], fi_out[best_fi])[0]
        if "cudacore" in fi_out and "tensorcore" in fi_out:
            row["fi_cudacore_vs_tensorcore_rel_err"] = rel_err(fi_out["cudacore"], fi_out["tensorcore"])[0]
    if st.fp8:
        fi_exact_best(row, ok_fi)

    # ---- PersistentKV: checks against FlashInfer's best and the reference ----
    for route in order:
        if route in pk_failed or route not in pk_t:
            continue
        w, pplan, out = wrappers[route]
        try:
            t = combine_passes(pk_t[route])
            t["route_used"] = w.route
            c = w.counters or {}
            t.update({k: c.get(k) for k in ("launches", "tasks", "merge_state_bytes")})
            nan = t["nan_outputs"] = nan_count(pk_out[route])
            if nan:
                problems.append(f"PersistentKV {route}: {nan} NaN outputs")
            if best_fi:
                e, m, _ = rel_err(pk_out[route], fi_out[best_fi])
                t["rel_err_vs_fi"], t["max_abs_vs_fi"] = e, m
                if not (e <= max(tol, fi_tol(st, best_fi))):  # XQA's fp8 GEMMs: its own tolerance
                    problems.append(f"PersistentKV {route} vs FlashInfer {best_fi}: rel err {e:.2e} (max abs {m:.2e})")
            t["ref_rel_err"] = check_ref(f"PersistentKV {route}", pk_out[route])
            if route == "auto":
                t["plan_us"] = gpu.host_times(pplan, wall_reps)
            pk[route] = t
        except Exception as e:
            pk[route] = {"error": f"{type(e).__name__}: {e}"}
            problems.append(f"PersistentKV {route}: {type(e).__name__}: {e}")
            safe_sync(torch)
    row["pkv"] = pk
    ok_pk = {r: v for r, v in pk.items() if "us" in v}
    best_pk = min(ok_pk, key=lambda r: ok_pk[r]["us"]) if ok_pk else None
    row["pkv_best_route"] = best_pk
    if best_pk:
        row["pkv_best_us"] = ok_pk[best_pk]["us"]
        row["pkv_best_route_used"] = ("auto:" if best_pk == "auto" else "") + str(ok_pk[best_pk]["route_used"])
        row["pkv_best_passes_us"] = ok_pk[best_pk].get("passes_us")
    if "auto" in ok_pk:
        row["pkv_auto_us"] = ok_pk["auto"]["us"]
        row["pkv_auto_route_used"] = ok_pk["auto"]["route_used"]
        row["pkv_plan_us"] = ok_pk["auto"].get("plan_us")
        row["pkv_auto_passes_us"] = ok_pk["auto"].get("passes_us")
    errs = [v["rel_err_vs_fi"] for v in ok_pk.values() if v.get("rel_err_vs_fi") is not None]
    row["max_rel_err"] = max(errs) if errs else None
    row["max_abs_err"] = max((v["max_abs_vs_fi"] for v in ok_pk.values() if "max_abs_vs_fi" in v), default=None)

    # ---- CUDA graphs: one graph per rotation, replayed like the eager runs ----
    if not args.no_graphs:
        ng = min(R, args.graph_rotations, max(2, -(-(256 << 20) // max(st.kv_bytes, 1))))
        row["graph_rotations"] = ng
        pool = torch.cuda.graph_pool_handle()

        def graph_time(label, run_on, eager_out, gtol=tol):
            graphs = []
            try:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    run_on(0)
                torch.cuda.current_stream().wait_stream(s)
                torch.cuda.synchronize()
                for r in range(ng):
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=pool):
                        res = run_on(r)
                    graphs.append((g, res))
                graphs[0][0].replay()
                torch.cuda.synchronize()
                e = rel_err(graphs[0][1], eager_out)[0]
                if not (e <= gtol):
                    problems.append(f"{label} graph replay vs eager: rel err {e:.2e}")
                t = gpu.time_calls(lambda r: graphs[r][0].replay(), ng, reps)
                t["rel_err_vs_eager"] = e
                return t
            except Exception as ex:
                safe_sync(torch)
                errors.append(f"{label} graph: {type(ex).__name__}: {ex}")
                return {"error": f"{type(ex).__name__}: {ex}"}
            finally:
                del graphs

        graphs = {}
        if best_fi:
            try:  # the decode wrapper: a use_cuda_graph wrapper and its fixed buffers; the others: the eager call
                make = fi_var[(best_fi, row["fi_best_setting"])][2]
                graphs["fi"] = graph_time(f"FlashInfer {best_fi}", make(), fi_out[best_fi], fi_tol(st, best_fi))
                graphs["fi"]["config"] = best_fi
                graphs["fi"]["setting"] = row["fi_best_setting"]
            except Exception as ex:
                graphs["fi"] = {"error": f"{type(ex).__name__}: {ex}"}
                errors.append(f"FlashInfer graph wrapper: {type(ex).__name__}: {ex}")
        for label, route in (("pkv_auto", "auto"), ("pkv_best", best_pk)):
            if route is None or route not in ok_pk:
                continue
            if label == "pkv_best" and route == "auto":
                graphs["pkv_best"] = dict(graphs.get("pkv_auto", {}), route=route)
                continue
            w = gpu.pkv_wrapper(route)
            gout = torch.full_like(q, float("nan"))

            def pk_run(r, w=w, gout=gout):
                w.run(q, Ks[r], Vs[r], out=gout, **pk_run_kw)
                return gout
            graphs[label] = graph_time(f"PersistentKV {route}", pk_run, pk_out[route])
            graphs[label]["route"] = route
        row["graphs"] = graphs
        row["fi_graph_us"] = graphs.get("fi", {}).get("us")
        row["pkv_graph_auto_us"] = graphs.get("pkv_auto", {}).get("us")
        row["pkv_graph_best_us"] = graphs.get("pkv_best", {}).get("us")

    # ---- wall: plan + run + sync on the host clock (after the graphs: re-planning may move buffers) ----
    if best_fi:
        fplan, frun = fi_var[(best_fi, row["fi_best_setting"])][:2]
        out = torch.empty_like(q)

        def fwall(i, out=out):
            fplan()
            frun(i % R, out)
        fwall(0)
        row["fi_wall_us"] = gpu.host_times(fwall, wall_reps)
    if "auto" in ok_pk:
        w = gpu.pkv_wrapper("auto")
        out = torch.empty_like(q)

        def pwall(i, w=w, out=out):
            w.plan(st.indptr, st.indices, st.lens, st.Hq, st.Hkv, st.d, st.page_size, num_pages=st.pages,
                   q_data_type=st.dtype, route="auto", **pk_plan_kw, **score_kw(args))
            w.run(q, Ks[i % R], Vs[i % R], out=out, **pk_run_kw)
        pwall(0)
        row["pkv_wall_us"] = gpu.host_times(pwall, wall_reps)

    row["problems"], row["errors"] = problems, errors
    derive(row, gpu.read_gbps)
    return row


# ---- rows --------------------------------------------------------------------------------------------
def base_row(st, args):
    r = {"group": st.group, "name": st.name, "shape": st.shape, "dtype": st.dtype, "layout": st.layout,
         "Hq": st.Hq, "Hkv": st.Hkv, "d": st.d, "G": st.G, "page_size": st.page_size, "B": st.B,
         "total_tokens": st.total_tokens, "kv_bytes": st.kv_bytes, "kv_mb": st.kv_bytes / 1e6,
         "pages": st.pages, "rotations": st.rotations, "pool_mb": st.pool_bytes / 1e6, "reps": st.reps,
         "lens_min": int(st.lens.min()), "lens_mean": float(st.lens.mean()), "lens_max": int(st.lens.max())}
    if st.group != "trace":
        r["lens"] = [int(x) for x in st.lens]
    if getattr(args, "kv_dtypes", None):  # --kv-dtype given: every row says its cache (kv_bytes count its bytes)
        r.update(kv_dtype=st.kv_dtype, kv_scale=st.kv_scale, kv_elem_bytes=st.elem, kv_pair=st.base_key())
    r.update(st.meta)
    return r


def fi_status(entry):
    """One word (and the reason) for a FlashInfer path of a row: ok, refused, wrong or error."""
    if "us" in entry:
        return "ok"
    for k in ("refused", "wrong", "error"):
        if k in entry:
            return f"{k}: {entry[k]}"
    return "not run"


def derive(row, read_gbps):
    """Ratios, fractions of the read ceiling and step efficiencies from the measured times."""
    fi, pb, pa, fl = row.get("fi_best_us"), row.get("pkv_best_us"), row.get("pkv_auto_us"), row.get("floor_us")
    kvb = row["kv_bytes"]

    def frac(us):
        return kvb / (us * 1e3) / read_gbps if us and read_gbps else None

    row["ratio"] = fi / pb if fi and pb else None                 # > 1: PersistentKV is faster
    row["ratio_auto"] = fi / pa if fi and pa else None            # the headline: auto against FlashInfer's best
    row["ratio_best_route"] = row["ratio"]                        # the oracle: our best route
    row["ratio_auto_by_path"] = {c: (us / pa if us and pa else None) for c, us in row.get("fi_path_us", {}).items()}
    pfa, pfb = row.get("pkv_auto_passes_us"), row.get("fi_best_passes_us")
    if pfa and pfb and len(pfa) == len(pfb):  # the ratio pass by pass (each pass alternates which library goes first)
        row["ratio_auto_passes"] = [f / a for f, a in zip(pfb, pfa) if f and a]
    fg, pg = row.get("fi_graph_us"), row.get("pkv_graph_best_us")
    row["ratio_graph"] = fg / pg if fg and pg else None
    row["fi_frac_ceiling"], row["pkv_frac_ceiling"], row["pkv_auto_frac_ceiling"] = frac(fi), frac(pb), frac(pa)
    row["fi_step_eff"] = fl / fi if fl and fi else None
    row["pkv_step_eff"] = fl / pb if fl and pb else None
    row["pkv_auto_step_eff"] = fl / pa if fl and pa else None
    row["ok"] = not row.get("problems")


def fi_exact_best(row, ok_fi):
    """fp8 rows: FlashInfer's fastest path among those that dequantize exactly (not XQA's e4m3 GEMMs), the like
    of ours in arithmetic: fi_exact_best_config, fi_exact_best_us."""
    ex = {c: v for c, v in ok_fi.items() if c not in FI_FP8_MATH_PATHS}
    if ex:
        c = min(ex, key=lambda k: ex[k]["us"])
        row["fi_exact_best_config"], row["fi_exact_best_us"] = c, ex[c]["us"]


def fake_row(st, args, rnd):
    """A plausible made-up row for --dry-run (tests the writers and the plot, never a result)."""
    row = base_row(st, args)
    floor = 3.9 + st.kv_bytes / 4.55e6
    row["floor_us"], row["floor_kernel"] = floor, "dry-run"
    row["fi"] = {}
    for path, why in st.fi_paths(args):
        if why:
            row["fi"][path] = {"refused": why, "label": FI_PATH_LABELS[path]}
            continue
        e = {"label": FI_PATH_LABELS[path], "plan_us": rnd.uniform(3, 9), "ref_rel_err": rnd.uniform(1e-4, 6e-4)}
        if st.fp8:
            e["tol"] = fi_tol(st, path)
            if path in FI_FP8_MATH_PATHS:
                e["ref_rel_err"] = rnd.uniform(2e-2, 3.5e-2)
        if path == "split_sweep":
            e["sweep"] = {n: ({"same_as": same} if same else {"us": floor / rnd.uniform(0.4, 1.0)})
                          for n, _, same in split_settings(st.lens, st.page_size, args.split_tokens, args.window_left)}
        elif path == "xqa_sweep":
            e["sweep"] = {f"sm_count={k}x132": {"us": floor / rnd.uniform(0.4, 1.0)} for k in args.xqa_sm_multiples}
        elif path == "cudnn":
            row["fi"][path] = {"refused": "dry run: cuDNN not importable", "label": FI_PATH_LABELS[path]}
            continue
        else:
            e["sweep"] = {"default": {"us": floor / rnd.uniform(0.3, 1.0)}}
        best_set = min((k for k in e["sweep"] if "us" in e["sweep"][k]), key=lambda k: e["sweep"][k]["us"])
        e.update(us=e["sweep"][best_set]["us"], setting=best_set)
        e["passes_us"] = [e["us"] * rnd.uniform(0.98, 1.02) for _ in range(args.passes)]
        if path not in ("split_sweep", "xqa_sweep"):
            e.pop("sweep")
        row["fi"][path] = e
    ok = {c: v for c, v in row["fi"].items() if "us" in v}
    best = min(ok, key=lambda c: ok[c]["us"])
    row.update(fi_best_config=best, fi_best_us=ok[best]["us"], fi_plan_us=ok[best]["plan_us"],
               fi_best_setting=ok[best]["setting"], fi_best_label=FI_PATH_LABELS[best],
               fi_best_passes_us=ok[best]["passes_us"], fi_wall_us=ok[best]["us"] + 9,
               fi_path_us={c: v.get("us") for c, v in row["fi"].items()},
               fi_path_status={c: fi_status(v) for c, v in row["fi"].items()})
    if st.fp8:
        fi_exact_best(row, ok)
    row["pkv"] = {r: {"us": floor / rnd.uniform(0.6, 0.98), "route_used": r if r != "auto" else "fused",
                      "rel_err_vs_fi": rnd.uniform(1e-4, 6e-4)} for r in args.routes}
    best_pk = min(row["pkv"], key=lambda r: row["pkv"][r]["us"])
    row.update(pkv_best_route=best_pk, pkv_best_us=row["pkv"][best_pk]["us"],
               pkv_best_route_used=row["pkv"][best_pk]["route_used"])
    if "auto" in row["pkv"]:
        row.update(pkv_auto_us=row["pkv"]["auto"]["us"], pkv_auto_route_used="fused", pkv_plan_us=rnd.uniform(1, 4),
                   pkv_wall_us=row["pkv"]["auto"]["us"] + 6,
                   pkv_auto_passes_us=[row["pkv"]["auto"]["us"] * rnd.uniform(0.98, 1.02) for _ in range(args.passes)])
    row["max_rel_err"] = max(v["rel_err_vs_fi"] for v in row["pkv"].values())
    row["fi_graph_us"], row["pkv_graph_best_us"] = row["fi_best_us"] * 0.97, row["pkv_best_us"] * 0.98
    row["problems"], row["errors"] = [], []
    derive(row, 4600.0)
    return row


# ---- output --------------------------------------------------------------------------------------------
def fmt(x, spec=".1f", none="-"):
    return none if x is None else format(x, spec)


def geomean(v):
    v = [x for x in v if x]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None


def spread(v):
    v = [x for x in v if x is not None]
    if not v:
        return None, None, None
    return statistics.mean(v), min(v), max(v)


def kv_tag(r):
    """A row's fp8 cache type ("fp8_e4m3", "fp8_e5m2"), or "" for a cache of q's type."""
    kv = r.get("kv_dtype")
    return kv if kv and kv != r.get("dtype") else ""


def kv_short(tag):
    return tag.replace("fp8_", "")


def trace_aggregates(rows):
    """Per (family, B) (and fp8 cache type): mean and range over the held-out seeds and sampled steps
    (workloads.md)."""
    agg = {}
    for r in rows:
        if r["group"] == "trace":
            agg.setdefault((r.get("family"), r.get("batch", r["B"]), kv_tag(r)), []).append(r)
    out = []
    for (fam, b, kv), rs in sorted(agg.items(), key=lambda kv: (FAMILIES.index(kv[0][0]) if kv[0][0] in FAMILIES
                                                                else 99, kv[0][1], kv[0][2])):
        out.append({"family": fam, "B": b, **({"kv_dtype": kv} if kv else {}), "rows": len(rs),
                    "seeds": len({r.get("seed") for r in rs}),
                    "kv_mb": statistics.mean(r["kv_mb"] for r in rs),
                    "ratio": spread([r.get("ratio") for r in rs]), "ratio_auto": spread([r.get("ratio_auto") for r in rs]),
                    "fi_eff": spread([r.get("fi_step_eff") for r in rs]),
                    "pkv_eff": spread([r.get("pkv_step_eff") for r in rs]),
                    "pkv_auto_eff": spread([r.get("pkv_auto_step_eff") for r in rs]),
                    "fi_us": statistics.mean(r["fi_best_us"] for r in rs if r.get("fi_best_us")) if any(
                        r.get("fi_best_us") for r in rs) else None,
                    "pkv_us": statistics.mean(r["pkv_best_us"] for r in rs if r.get("pkv_best_us")) if any(
                        r.get("pkv_best_us") for r in rs) else None,
                    "bad": sum(1 for r in rs if not r.get("ok", True))})
    return out


def group_summary(rows):
    out = []
    tags = sorted({kv_tag(r) for r in rows})  # "" (q's type) first
    for g, tag in ((g, t) for g in ("anchor", "shape", "trace") for t in tags):
        rs = [r for r in rows if r["group"] == g and kv_tag(r) == tag]
        if not rs:
            continue

        def stats(key):
            v = sorted(r[key] for r in rs if r.get(key) is not None)
            return (v[0], statistics.median(v), v[-1]) if v else (None, None, None)
        out.append({"group": g + (f" {tag}" if tag else ""), "rows": len(rs),
                    "geomean_ratio": geomean([r.get("ratio") for r in rs]),
                    "geomean_ratio_auto": geomean([r.get("ratio_auto") for r in rs]),
                    "pkv_wins": sum(1 for r in rs if (r.get("ratio") or 0) > 1),
                    "fi_eff": stats("fi_step_eff"), "pkv_eff": stats("pkv_step_eff"),
                    "pkv_auto_eff": stats("pkv_auto_step_eff"), "bad": sum(1 for r in rs if not r.get("ok", True)),
                    "pkv_auto_wins": sum(1 for r in rs if (r.get("ratio_auto") or 0) > 1),
                    "fi_best_paths": {c: sum(1 for r in rs if r.get("fi_best_config") == c)
                                      for c in FI_PATHS if any(r.get("fi_best_config") == c for r in rs)}})
    return out


def fi_cell(r, path):
    """A FlashInfer path's cell in the per-path table: its us, or why it has none."""
    e = r.get("fi", {}).get(path)
    if e is None:
        return "-"
    if "us" in e:
        return ("**" if r.get("fi_best_config") == path else "") + f"{e['us']:.1f}" + (
            "**" if r.get("fi_best_config") == path else "")
    for k in ("refused", "wrong", "error"):
        if k in e:
            return k
    return "-"


def fi_refusals(rows):
    """(path, reason) -> rows, for the paths that refused or failed."""
    out = {}
    for r in rows:
        for path, e in r.get("fi", {}).items():
            for k in ("refused", "wrong", "error"):
                if k in e:
                    out.setdefault((path, k, str(e[k])[:200]), []).append(row_label(r))
                    break
    return out


def pass_spreads(rows, meta):
    """Rows with more than one pass: spread of FlashInfer's best, ours auto and their ratio across passes."""
    out = []
    for r in rows:
        fb, pa, ra = r.get("fi_best_passes_us"), r.get("pkv_auto_passes_us"), r.get("ratio_auto_passes")
        if fb and pa and len(fb) > 1:
            sp = lambda v: (max(v) - min(v)) / statistics.median(v) if v and statistics.median(v) else None
            out.append({"label": row_label(r), "group": r["group"], "B": r["B"], "fi_best": sp(fb), "pkv_auto": sp(pa),
                        "ratio_auto_min": min(ra) if ra else None, "ratio_auto_max": max(ra) if ra else None})
    return out


def losses(rows):
    out = []
    for r in rows:
        lb, la = (r.get("ratio") or 9) < 1, (r.get("ratio_auto") or 9) < 1
        if lb or la:
            out.append((r, lb, la))
    return out


def row_label(r):
    tag = f" {kv_short(kv_tag(r))}" if kv_tag(r) else ""
    if r["group"] == "anchor":
        return r["name"] + tag
    if r["group"] == "shape":
        return f"{r['shape']}:{r['dtype']} {r['name']}" + tag
    return r["name"] + tag


def pair_kv_rows(rows):
    """fp8 rows beside the 16-bit row of the same step (same lengths, pages and q; --kv-dtype q,fp8_...): each
    fp8 row gets `vs16`, its 16-bit twin's times and the speedups (16-bit us / fp8 us, > 1: fp8 faster)."""
    by = {}
    for r in rows:
        if r.get("kv_pair") and not kv_tag(r):
            by[r["kv_pair"]] = r
    for r in rows:
        b = by.get(r.get("kv_pair")) if kv_tag(r) else None
        if b is None:
            continue
        sp = lambda k16, k8: (b[k16] / r[k8] if b.get(k16) and r.get(k8) else None)
        r["vs16"] = {"kv_dtype": b.get("kv_dtype"), "kv_mb": b["kv_mb"], "pkv_auto_us": b.get("pkv_auto_us"),
                     "pkv_best_us": b.get("pkv_best_us"), "pkv_best_route_used": b.get("pkv_best_route_used"),
                     "fi_best_us": b.get("fi_best_us"), "fi_best_config": b.get("fi_best_config"),
                     "pkv_auto_speedup": sp("pkv_auto_us", "pkv_auto_us"),
                     "pkv_best_speedup": sp("pkv_best_us", "pkv_best_us"),
                     "fi_best_speedup": sp("fi_best_us", "fi_best_us"),
                     "pkv_auto_step_eff": b.get("pkv_auto_step_eff"), "long": b["kv_mb"] >= LONG_KV_MB}


def fp8_summary(rows):
    """Per (workload, fp8 type): geomean speedups of the fp8 cache over the 16-bit cache of the same steps, all
    pairs and the long ones (>= LONG_KV_MB of 16-bit K/V)."""
    out = []
    for g in ("anchor", "shape", "trace"):
        for tag in sorted({kv_tag(r) for r in rows if kv_tag(r)}):
            ps = [r for r in rows if r["group"] == g and kv_tag(r) == tag and r.get("vs16")]
            if not ps:
                continue
            lg = [r for r in ps if r["vs16"]["long"]]
            sp = lambda rs, k: [r["vs16"][k] for r in rs if r["vs16"].get(k)]
            out.append({"group": g, "kv_dtype": tag, "pairs": len(ps), "long_pairs": len(lg),
                        "pkv_auto": geomean(sp(ps, "pkv_auto_speedup")),
                        "pkv_auto_long": geomean(sp(lg, "pkv_auto_speedup")),
                        "pkv_auto_long_min": min(sp(lg, "pkv_auto_speedup"), default=None),
                        "pkv_best": geomean(sp(ps, "pkv_best_speedup")),
                        "pkv_best_long": geomean(sp(lg, "pkv_best_speedup")),
                        "fi_best": geomean(sp(ps, "fi_best_speedup")),
                        "fi_best_long": geomean(sp(lg, "fi_best_speedup"))})
    return out


def finite(x):
    """x with every non-finite float replaced by None (strict JSON)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):  # numpy scalars
        return finite(x.item())
    return x


def write_outputs(out_dir, meta, rows):
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(meta, rows=len(rows), disagreements=sum(1 for r in rows if not r.get("ok", True)),
                summary=group_summary(rows), trace_aggregates=trace_aggregates(rows))
    if meta.get("kv_dtypes"):
        pair_kv_rows(rows)
        meta["fp8_vs_16bit"] = fp8_summary(rows)
    tmp = out_dir / "compare.json.tmp"
    tmp.write_text(json.dumps(finite({"meta": meta, "rows": rows}), indent=1, allow_nan=False))
    tmp.replace(out_dir / "compare.json")
    (out_dir / "compare.md").write_text(markdown(meta, rows))


def markdown(meta, rows):
    L = []
    ce = meta.get("ceilings", {})
    L.append("# FlashInfer vs PersistentKV, same steps, pages and data, one process\n")
    if meta.get("dry_run"):
        L.append("**DRY RUN: made-up numbers that only test the writers. Not a measurement.**\n")
    L.append(f"- GPU: {meta.get('gpu', {}).get('name', '?')}; CUDA (torch) {meta.get('cuda')}; torch "
             f"{meta.get('torch')}; FlashInfer {meta.get('flashinfer')}; PersistentKV commit {meta.get('commit')}")
    L.append(f"- date {meta.get('date')}; matrix `{meta.get('matrix')}`, layout {meta.get('layout')}, page size "
             f"{meta.get('page_size')}; command `{meta.get('command')}`")
    if ce:
        L.append(f"- read ceiling {fmt(ce.get('read_gbps'), '.0f')} GB/s ({ce.get('read_kernel')}; torch.sum "
                 f"{fmt(ce.get('torch_sum_gbps'), '.0f')} GB/s, PersistentKV read kernel "
                 f"{fmt(ce.get('pkv_read_gbps'), '.0f')} GB/s, 4 GiB); empty launch "
                 f"{fmt(ce.get('empty_launch_us'), '.2f')} us, graph replay {fmt(ce.get('graph_launch_us'), '.2f')} us")
    L.append(f"- rows {meta.get('rows')}, rows that disagree or failed: **{meta.get('disagreements')}**"
             + (f"; stopped early at the time limit, {len(meta.get('skipped', []))} steps not run"
                if meta.get("truncated") else ""))
    L.append("- ratio = FlashInfer best kernel us / PersistentKV kernel us (> 1: PersistentKV is faster); "
             "of ceil = KV bytes / kernel time / read ceiling; eff = floor (streaming read of the step's bytes, "
             "timed like the steps) / kernel time. Method: see the header of bench/compare_flashinfer.py.\n")
    L.append("- FlashInfer's best = the fastest of every FlashInfer decode path that ran on the step and agreed with "
             "the float64 reference (paths: " + ", ".join(f"{FI_SHORT[p]} {FI_PATH_LABELS[p]}" for p in FI_PATHS)
             + "); **ours: auto** (the headline) and ours: best route (an oracle: the fastest route, known only "
             f"after timing them all) are both against it. Timing: {meta.get('passes', 1)} passes per step, the "
             "libraries' order alternating.\n")
    if meta.get("kv_dtypes"):
        sc = ", ".join(f"{k} S = {v:.6g}" for k, v in (meta.get("kv_scale") or {}).items()) or "-"
        L.append(f"- **KV caches: {', '.join(meta['kv_dtypes'])}** (q: each step's 16-bit type). fp8 scales: {sc} "
                 "(k_scale = v_scale = S; code x S = value): the caches hold the codes of uniform [-1, 1] values / S, "
                 "saturated at the format's largest code and rounded to nearest, and the float64 reference "
                 "dequantizes the same codes. On fp8 rows KV MB, of ceil, floor and eff count the fp8 bytes (one "
                 "per element: half the 16-bit bytes). Tolerance against the reference: q's type (fp16 "
                 f"{TOL['fp16']:g}, bf16 {TOL['bf16']:g}) for ours and every FlashInfer path that dequantizes "
                 f"exactly; {TOL_FP8_MATH:g} for XQA's e4m3 kernel, whose GEMMs run in e4m3 (q and the softmax "
                 "weights rounded to e4m3). FlashInfer's decode wrapper applies v_scale by a separate "
                 "`out *= v_scale` after its kernel, inside its timed call.")
        sk = meta.get("kv_skipped") or []
        if sk:
            L.append(f"- cache types not run on {len(sk)} steps: " + "; ".join(sorted({x['why'] for x in sk})))
        L.append("")
    L.append("## Summary by workload\n")
    L.append("| workload | rows | **geomean ours auto / FI best** | geomean ours best route / FI best | auto faster "
             "| best route faster | FI best path (rows) | FI eff min/med/max | PKV eff min/med/max "
             "| PKV auto eff min/med/max | bad |")
    L.append("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- | ---: |")
    for s in meta.get("summary", []):
        e = lambda t: "/".join(fmt(x, ".2f") for x in t)
        paths = ", ".join(f"{FI_SHORT.get(c, c)} {n}" for c, n in s.get("fi_best_paths", {}).items()) or "-"
        L.append(f"| {s['group']} | {s['rows']} | **{fmt(s['geomean_ratio_auto'], '.2f')}** "
                 f"| {fmt(s['geomean_ratio'], '.2f')} | {s.get('pkv_auto_wins', '-')} | {s['pkv_wins']} | {paths} "
                 f"| {e(s['fi_eff'])} | {e(s['pkv_eff'])} | {e(s['pkv_auto_eff'])} | {s['bad']} |")
    L.append("\n(ratio = FlashInfer's best kernel us / ours; > 1: ours is faster.)")
    ta = meta.get("trace_aggregates", [])
    if ta:
        L.append("\n## Traces: mean [min, max] over held-out seeds and sampled steps\n")
        L.append("| family | B | rows | seeds | KV MB | FI us | PKV us | ratio | ratio auto | FI eff | PKV eff | bad |")
        L.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- | ---: |")
        sp = lambda t: "-" if t[0] is None else f"{t[0]:.2f} [{t[1]:.2f}, {t[2]:.2f}]"
        for a in ta:
            fam = a["family"] + (f" {a['kv_dtype']}" if a.get("kv_dtype") else "")
            L.append(f"| {fam} | {a['B']} | {a['rows']} | {a['seeds']} | {a['kv_mb']:.0f} | {fmt(a['fi_us'])} "
                     f"| {fmt(a['pkv_us'])} | {sp(a['ratio'])} | {sp(a['ratio_auto'])} | {sp(a['fi_eff'])} "
                     f"| {sp(a['pkv_eff'])} | {a['bad']} |")
    fs = meta.get("fp8_vs_16bit") or []
    if fs:
        L += fp8_markdown(fs, rows)
    lo = losses(rows)
    L.append(f"\n## Rows where PersistentKV loses ({len(lo)})\n")
    if not lo:
        L.append("None: PersistentKV (best route and auto) is at least as fast as FlashInfer's best on every row.")
    for r, lb, la in lo:
        which = "best route and auto" if lb and la else ("best route" if lb else "auto only")
        L.append(f"- {r['group']} {row_label(r)} (B={r['B']}, {r['kv_mb']:.1f} MB, {which}): FlashInfer "
                 f"{fmt(r.get('fi_best_us'))} us ({r.get('fi_best_config')}) vs PersistentKV "
                 f"{fmt(r.get('pkv_best_us'))} us ({r.get('pkv_best_route_used')}), auto {fmt(r.get('pkv_auto_us'))} us "
                 f"({r.get('pkv_auto_route_used')}); ratio {fmt(r.get('ratio'), '.2f')}, auto "
                 f"{fmt(r.get('ratio_auto'), '.2f')}; step eff FI {fmt(r.get('fi_step_eff'), '.2f')}, PKV "
                 f"{fmt(r.get('pkv_step_eff'), '.2f')}, floor {fmt(r.get('floor_us'))} us")
    bad = [r for r in rows if not r.get("ok", True) or r.get("errors")]
    if bad:
        L.append("\n## Disagreements and errors\n")
        for r in bad:
            for p in r.get("problems", []):
                L.append(f"- **{r['group']} {row_label(r)}**: {p}")
            for p in r.get("errors", []):
                L.append(f"- {r['group']} {row_label(r)} (recorded, not a disagreement): {p}")
    L.append("\n## FlashInfer paths per step (kernel us; bold: FlashInfer's best)\n")
    hdr = [FI_SHORT[p] for p in FI_PATHS]
    L.append("| workload | step | B | FI best | FI best us | ours auto us | ours best us | **auto / FI best** "
             "| best route / FI best | " + " | ".join(hdr) + " | split winner | XQA sm_count winner |")
    L.append("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in hdr)
             + " | --- | --- |")
    for r in rows:
        best = r.get("fi_best_config")
        bl = f"{FI_SHORT.get(best, best)}" + (f" ({r['fi_best_setting']})" if r.get("fi_best_setting") not in
                                               (None, "default") else "") if best else "-"
        sp, xs = r.get("fi", {}).get("split_sweep", {}), r.get("fi", {}).get("xqa_sweep", {})
        L.append(f"| {r['group']} | {row_label(r)} | {r['B']} | {bl} | {fmt(r.get('fi_best_us'))} "
                 f"| {fmt(r.get('pkv_auto_us'))} | {fmt(r.get('pkv_best_us'))} | **{fmt(r.get('ratio_auto'), '.2f')}** "
                 f"| {fmt(r.get('ratio'), '.2f')} | " + " | ".join(fi_cell(r, p) for p in FI_PATHS)
                 + f" | {sp.get('setting', '-')} | {xs.get('setting', '-')} |")
    ref = fi_refusals(rows)
    if ref:
        L.append("\n## FlashInfer paths that did not run\n")
        for (path, kind, why), labels in sorted(ref.items()):
            L.append(f"- {FI_SHORT[path]} {FI_PATH_LABELS[path]}, {kind} on {len(labels)} rows "
                     f"({', '.join(labels[:4])}{', ...' if len(labels) > 4 else ''}): {why}")
    ps = [x for x in pass_spreads(rows, meta) if x["group"] == "anchor" or x["B"] in (8, 16)]
    if ps:
        L.append("\n## Spread across passes (anchors; (max - min) / median of the pass medians)\n")
        L.append("| step | B | FI best | ours auto | auto / FI best, min..max over passes |")
        L.append("| --- | ---: | ---: | ---: | --- |")
        for x in ps:
            L.append(f"| {x['label']} | {x['B']} | {fmt(x['fi_best'], '.1%')} | {fmt(x['pkv_auto'], '.1%')} "
                     f"| {fmt(x['ratio_auto_min'], '.3f')}..{fmt(x['ratio_auto_max'], '.3f')} |")
    rep = meta.get("repeats") or []
    if rep:
        L.append(f"\n## Steps repeated in separate processes ({meta.get('repeat_procs')} each, no graphs)\n")
        L.append("| step | runs | FI best us mean [min, max] | FI best paths | ours auto us mean [min, max] "
                 "| auto / FI best mean [min, max] | best route / FI best mean [min, max] |")
        L.append("| --- | ---: | --- | --- | --- | --- | --- |")
        sp3 = lambda t: "-" if not t or t[0] is None else f"{t[0]:.3g} [{t[1]:.3g}, {t[2]:.3g}]"
        for x in rep:
            L.append(f"| {x['name']} | {x['runs']} | {sp3(x.get('fi_best_us'))} | {', '.join(x.get('fi_best_paths', []))} "
                     f"| {sp3(x.get('pkv_auto_us'))} | {sp3(x.get('ratio_auto'))} | {sp3(x.get('ratio'))} |")
    L.append("\n## All rows\n")
    L.append("| workload | step | shape | B | KV MB | FI us | FI cfg | FI plan us | FI wall us | PKV us | PKV route "
             "| PKV auto us | PKV plan us | PKV wall us | ratio | ratio auto | FI graph us | PKV graph us "
             "| FI of ceil | PKV of ceil | floor us | FI eff | PKV eff | max rel err | ok |")
    L.append("| --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: "
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        L.append(f"| {r['group']} | {r['name']} | {r['shape']}:{r['dtype']}"
                 + (f"/{kv_short(kv_tag(r))}" if kv_tag(r) else "") + f" | {r['B']} | {r['kv_mb']:.1f} "
                 f"| {fmt(r.get('fi_best_us'))} | {r.get('fi_best_config') or '-'} | {fmt(r.get('fi_plan_us'))} "
                 f"| {fmt(r.get('fi_wall_us'))} | {fmt(r.get('pkv_best_us'))} | {r.get('pkv_best_route_used') or '-'} "
                 f"| {fmt(r.get('pkv_auto_us'))} | {fmt(r.get('pkv_plan_us'))} | {fmt(r.get('pkv_wall_us'))} "
                 f"| {fmt(r.get('ratio'), '.2f')} | {fmt(r.get('ratio_auto'), '.2f')} | {fmt(r.get('fi_graph_us'))} "
                 f"| {fmt(r.get('pkv_graph_best_us'))} | {fmt(r.get('fi_frac_ceiling'), '.2f')} "
                 f"| {fmt(r.get('pkv_frac_ceiling'), '.2f')} | {fmt(r.get('floor_us'))} | {fmt(r.get('fi_step_eff'), '.2f')} "
                 f"| {fmt(r.get('pkv_step_eff'), '.2f')} | {fmt(r.get('max_rel_err'), '.1e')} "
                 f"| {'yes' if r.get('ok', True) else '**NO**'} |")
    return "\n".join(L) + "\n"


def fp8_markdown(fs, rows):
    """The section comparing each fp8 row with the 16-bit row of the same step."""
    L = ["\n## fp8 caches against the 16-bit cache of the same steps\n",
         "Speedup = 16-bit kernel us / fp8 kernel us on the same lengths, pages and q (> 1: the fp8 cache is "
         f"faster); long steps: at least {LONG_KV_MB:g} MB of 16-bit K/V (issue 38's bar: ~1.9x for ours). FI fp8 "
         "best exact-dequant: FlashInfer's fastest fp8 path other than XQA's e4m3 kernel (whose GEMMs run in e4m3), "
         "the paths that compute as ours does.\n",
         "| workload | cache | pairs | **ours auto, geomean** | ours auto, long steps: geomean (min) [pairs] "
         "| ours best route | ours best route, long | FI best | FI best, long |",
         "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for x in fs:
        L.append(f"| {x['group']} | {x['kv_dtype']} | {x['pairs']} | **{fmt(x['pkv_auto'], '.2f')}** "
                 f"| {fmt(x['pkv_auto_long'], '.2f')} ({fmt(x['pkv_auto_long_min'], '.2f')}) [{x['long_pairs']}] "
                 f"| {fmt(x['pkv_best'], '.2f')} | {fmt(x['pkv_best_long'], '.2f')} | {fmt(x['fi_best'], '.2f')} "
                 f"| {fmt(x['fi_best_long'], '.2f')} |")
    L.append("\n| workload | step | cache | B | KV MB 16-bit / fp8 | ours auto us 16-bit / fp8 | **speedup auto** "
             "| ours best us 16-bit / fp8 | speedup best | FI best us 16-bit / fp8 (paths) | FI speedup "
             "| ours fp8 auto / FI fp8 best | FI fp8 best exact-dequant us (path) | ours auto eff 16-bit / fp8 "
             "| ours fp8 auto of ceil |")
    L.append("| --- | --- | --- | ---: | --- | --- | ---: | --- | ---: | --- | ---: | ---: | --- | --- | ---: |")
    for r in rows:
        v = r.get("vs16")
        if not v:
            continue
        L.append(f"| {r['group']} | {row_label(r)} | {r['kv_dtype']} | {r['B']} | {v['kv_mb']:.1f} / {r['kv_mb']:.1f} "
                 f"| {fmt(v['pkv_auto_us'])} / {fmt(r.get('pkv_auto_us'))} | **{fmt(v['pkv_auto_speedup'], '.2f')}** "
                 f"| {fmt(v['pkv_best_us'])} / {fmt(r.get('pkv_best_us'))} | {fmt(v['pkv_best_speedup'], '.2f')} "
                 f"| {fmt(v['fi_best_us'])} / {fmt(r.get('fi_best_us'))} ({FI_SHORT.get(v['fi_best_config'], '-')} / "
                 f"{FI_SHORT.get(r.get('fi_best_config'), '-')}) | {fmt(v['fi_best_speedup'], '.2f')} "
                 f"| {fmt(r.get('ratio_auto'), '.2f')} | {fmt(r.get('fi_exact_best_us'))} "
                 f"({FI_SHORT.get(r.get('fi_exact_best_config'), '-')}) | {fmt(v['pkv_auto_step_eff'], '.2f')} / "
                 f"{fmt(r.get('pkv_auto_step_eff'), '.2f')} | {fmt(r.get('pkv_auto_frac_ceiling'), '.2f')} |")
    return L


def short_table(meta, rows):
    """The few lines printed last on stdout (the device tool returns the tail of the output)."""
    L = []
    rs = [r for r in rows if r["group"] in ("anchor", "shape")]
    sw = 31 if any(kv_tag(r) for r in rows) else 26  # the step column (fp8 rows carry their cache type)
    tw = 15 if sw > 26 else 10
    if rs:
        L.append(f"{'step':<{sw}}{'B':>4}{'KV MB':>9}{'FI us':>9} {'cfg':<3}{'PKV us':>9} {'route':<10}{'auto us':>9}"
                 f"{'ratio':>7}{'r.auto':>7}{'FIeff':>6}{'PKVeff':>7} ok")
        for r in rs:
            cfg = FI_SHORT.get(r.get("fi_best_config"), "-")
            L.append(f"{row_label(r)[:sw - 1]:<{sw}}{r['B']:>4}{r['kv_mb']:>9.1f}{fmt(r.get('fi_best_us')):>9} {cfg:<3}"
                     f"{fmt(r.get('pkv_best_us')):>9} {(r.get('pkv_best_route_used') or '-')[:9]:<10}"
                     f"{fmt(r.get('pkv_auto_us')):>9}{fmt(r.get('ratio'), '.2f'):>7}{fmt(r.get('ratio_auto'), '.2f'):>7}"
                     f"{fmt(r.get('fi_step_eff'), '.2f'):>6}{fmt(r.get('pkv_step_eff'), '.2f'):>7} "
                     f"{'y' if r.get('ok', True) else 'NO'}")
    ta = trace_aggregates(rows)
    if ta:
        L.append("")
        L.append(f"{'trace':<{tw}}{'B':>4}{'rows':>5}{'KV MB':>8}{'ratio mean[min,max]':>22}{'auto mean':>10}"
                 f"{'FIeff':>7}{'PKVeff':>7}{'bad':>4}")
        for a in ta:
            r = a["ratio"]
            rr = "-" if r[0] is None else f"{r[0]:.2f} [{r[1]:.2f},{r[2]:.2f}]"
            fam = a["family"] + (f" {kv_short(a['kv_dtype'])}" if a.get("kv_dtype") else "")
            L.append(f"{fam:<{tw}}{a['B']:>4}{a['rows']:>5}{a['kv_mb']:>8.0f}{rr:>22}"
                     f"{fmt(a['ratio_auto'][0], '.2f'):>10}{fmt(a['fi_eff'][0], '.2f'):>7}{fmt(a['pkv_eff'][0], '.2f'):>7}"
                     f"{a['bad']:>4}")
    L.append("")
    for s in group_summary(rows):
        L.append(f"{s['group']}: {s['rows']} rows, geomean ours auto / FI best {fmt(s['geomean_ratio_auto'], '.2f')} "
                 f"(best route {fmt(s['geomean_ratio'], '.2f')}), auto faster on {s.get('pkv_auto_wins')}, best route "
                 f"on {s['pkv_wins']}, FI best paths {s.get('fi_best_paths')}, median eff FI "
                 f"{fmt(s['fi_eff'][1], '.2f')} PKV {fmt(s['pkv_eff'][1], '.2f')}, bad {s['bad']}")
    for x in fp8_summary(rows):  # (pair_kv_rows ran in write_outputs)
        L.append(f"{x['group']} {x['kv_dtype']} vs 16-bit cache, 16-bit us / fp8 us: ours auto geomean "
                 f"{fmt(x['pkv_auto'], '.2f')} over {x['pairs']} steps, long steps (>= {LONG_KV_MB:g} MB) "
                 f"{fmt(x['pkv_auto_long'], '.2f')} (min {fmt(x['pkv_auto_long_min'], '.2f')}) over {x['long_pairs']}; "
                 f"ours best route {fmt(x['pkv_best'], '.2f')}; FI best {fmt(x['fi_best'], '.2f')}")
    ce = meta.get("ceilings", {})
    nbad = sum(1 for r in rows if not r.get("ok", True))
    L.append(f"read ceiling {fmt(ce.get('read_gbps'), '.0f')} GB/s; rows {len(rows)}; PKV loses on "
             f"{len(losses(rows))}; disagreements {nbad}" + ("; TRUNCATED at the time limit" if meta.get("truncated") else ""))
    return "\n".join(L)


# ---- meta ----------------------------------------------------------------------------------------------
def commit_id():
    c = os.environ.get("PKV_COMMIT")
    if c:
        return c
    try:
        c = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                           text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (c + ("+dirty" if dirty else "")) if c else "unknown"
    except Exception:
        return "unknown"


def base_meta(args):
    m = {"tool": "bench/compare_flashinfer.py", "commit": commit_id(),
         "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
         "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv), "python": platform.python_version(),
         "matrix": args.matrix, "layout": args.layout, "page_size": args.page_size, "reps": args.reps,
         "soft_cap": args.soft_cap, "window_left": args.window_left,
         "trace_reps": args.trace_reps, "wall_reps": args.wall_reps, "floor_reps": args.floor_reps,
         "warmup": args.warmup, "rotate_gib": args.rotate_gib, "routes": args.routes, "fi_configs": args.fi_configs,
         "graphs": not args.no_graphs, "graph_rotations": args.graph_rotations, "passes": args.passes,
         "split_tokens": args.split_tokens, "xqa_sm_multiples": args.xqa_sm_multiples,
         "repeat_procs": args.repeat_procs, "fi_path_labels": FI_PATH_LABELS,
         "method": {
             "kernel_time": "CUDA events around one run; runs queued in batches of 16 behind torch.cuda._sleep sized "
                            "from the host enqueue time; median",
             "rotation": "pool [R*P] views, rotation r = pool[r*P:(r+1)*P], same scattered page ids in [0, P)",
             "data": "uniform [-1, 1] K, V and q (torch uniform_)",
             "fi": "every FlashInfer decode path that takes the shape (bench/FLASHINFER.md, Decode paths): "
                   "BatchDecodeWithPagedKVCacheWrapper (128 MB workspace, plan(indptr host, indices device, "
                   "last_page_len host) once per step, run(q, (k, v), out=)) with use_tensor_cores False and True, "
                   "and tensor cores with plan(fixed_split_size=tokens / page size) and plan(disable_split_kv=True) "
                   "(best of the sweep); trtllm_batch_decode_with_kv_cache(backend='xqa') on a padded block table; "
                   "flashinfer.xqa.xqa with sm_count = k x SMs (best of the sweep); BatchAttention plan/run; "
                   "cudnn_batch_decode_with_kv_cache when cuDNN imports (HND only). Each checked against the float64 "
                   "reference; FlashInfer's best = the fastest that agrees",
             "passes": "each step timed in `passes` passes, FlashInfer's paths first in even passes and "
                       "PersistentKV's routes first in odd ones; reps / passes runs each; a configuration's time is "
                       "the median of its pass medians",
             "pkv": "BatchDecodeWithPagedKVCacheWrapper(backend='cuda'); plan(host numpy tables, route=...); "
                    "run(q, k, v, out=)",
             "wall": "host clock: sync, plan, run, sync; median of wall_reps",
             "plan": "host clock: sync, plan, sync; median of wall_reps",
             "graphs": "one CUDA graph per rotation of one run, replays timed like eager runs",
             "floor": "streaming read of the step's true K/V bytes, timed like the steps",
             "trace_steps": "the listed steps of each trace (first = 0, mid = n // 2, last = n - 1)",
             "ratio": "FlashInfer best kernel us / PersistentKV kernel us",
         }}
    if args.kv_dtypes:
        fp8 = [k for k in args.kv_dtypes if k in FP8_MAX]
        m.update(kv_dtypes=args.kv_dtypes, kv_scale={k: kv_scale_for(k, args) for k in fp8},
                 kv_skipped=[{"step": k, "kv_dtype": kv, "why": why} for k, kv, why in getattr(args, "kv_skipped", [])],
                 tolerances={"fp16": TOL["fp16"], "bf16": TOL["bf16"], "fp8_math": TOL_FP8_MATH,
                             "fp8_math_paths": list(FI_FP8_MATH_PATHS)}, long_kv_mb=LONG_KV_MB)
        m["method"]["fp8"] = (
            "an fp8 step is its 16-bit step (same lengths, pages, q) with the caches as fp8 codes: uniform [-1, 1] "
            "values / S, clamped to the format's largest code, converted by torch (round to nearest even); "
            "k_scale = v_scale = S. Ours: plan(kv_data_type=torch.float8_*), run(k_scale=S, v_scale=S) on every "
            "route. FlashInfer: the decode wrapper plan(q_data_type=q's type, kv_data_type=torch.float8_*), "
            "run(k_scale=S, v_scale=S) (CUDA cores, tensor cores, split sweep); XQA with bmm1_scale = S / sqrt(d), "
            "bmm2_scale = S, and flashinfer.xqa.xqa(q_scale=1, kv_scale=S) (e4m3 only); BatchAttention "
            "plan(kv_data_type=), run(k_scale=S, v_scale=S); cuDNN refused (no scales). The float64 reference "
            "reads float(code) x S. Bytes (KV MB, floor, fractions of the ceiling, efficiency) are the fp8 bytes")
    return m


# ---- JIT warm-up (parallel subprocesses, one per FlashInfer module) ---------------------------------------
def jit_one(spec, layout, args):
    """Child: compile and load one FlashInfer module by running a tiny problem on it.  spec: dtype,d,kind,Hq,Hkv
    and, for an fp8 cache, its type (jit_spec): the module is built with kv_data_type=float8_* and run with its
    scales, as measure_step calls it."""
    import torch
    import flashinfer
    dtype, d, kind, hq, hkv, *kv = spec.split(",")
    d, hq, hkv = int(d), int(hq), int(hkv)
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    kv = kv[0] if kv else dtype
    fp8 = kv in FP8_MAX
    kv_tdt = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}.get(kv, tdt)
    sc = 0.5 if fp8 else 1.0  # any scale: a run argument, not part of the module
    run_kw = dict(k_scale=sc, v_scale=sc) if fp8 else {}
    dev = torch.device("cuda", 0)
    t0 = time.perf_counter()
    ps, n = args.page_size, 64
    pages = -(-n // ps)
    indptr = torch.tensor([0, pages], dtype=torch.int32)
    indices = torch.arange(pages, dtype=torch.int32, device=dev)
    last = torch.tensor([n - (pages - 1) * ps], dtype=torch.int32)
    shape = (pages, ps, hkv, d) if layout == "NHD" else (pages, hkv, ps, d)
    k = torch.rand(shape, dtype=tdt, device=dev)
    if fp8:
        k = k.to(kv_tdt)
    q = torch.rand(1, hq, d, dtype=tdt, device=dev)
    if kind in ("cudacore", "tensorcore"):
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.zeros(16 << 20, dtype=torch.uint8, device=dev),
                                                          layout, use_tensor_cores=(kind == "tensorcore"))
        w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=tdt, kv_data_type=kv_tdt, **score_kw(args))
        o = w.run(q, (k, k.clone()), **run_kw)
    elif kind == "xqa":
        ws = torch.zeros(32 << 20, dtype=torch.uint8, device=dev)
        o = flashinfer.decode.trtllm_batch_decode_with_kv_cache(
            q, (k, k.clone()), ws, indices.view(1, -1), torch.tensor([n], dtype=torch.int32, device=dev), n,
            bmm1_scale=sc / math.sqrt(d), **(dict(bmm2_scale=sc) if fp8 else {}), window_left=args.window_left,
            kv_layout=layout, backend="xqa")
    elif kind == "batch_attention":
        w = flashinfer.BatchAttention(kv_layout=layout, device="cuda")
        cap = args.soft_cap if args.soft_cap > 0 else 0.0
        w.plan(torch.tensor([0, 1], dtype=torch.int32), indptr, indices, torch.tensor([n], dtype=torch.int32), hq, hkv,
               d, d, ps, causal=False, logits_soft_cap=cap or None, q_data_type=tdt, kv_data_type=kv_tdt)
        o = w.run(q, (k, k.clone()), logits_soft_cap=cap, **run_kw)[0]
    else:
        raise SystemExit(f"unknown module kind {kind!r}")
    torch.cuda.synchronize()
    assert torch.isfinite(o).all()
    print(f"[jit] {spec}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)


def jit_children(cmds, jobs, env):
    """Runs the JIT warm-up's child processes, cmds = [(name, argv)], `jobs` at a time (their output to a temporary
    file each, so a chatty child never blocks on a full pipe); logs each one's last line, or the tail of its output
    when it failed; returns the names that failed.  Shared with bench/e2e_flashinfer.py."""
    pending, running, failed = list(cmds), [], []
    while pending or running:
        while pending and len(running) < jobs:
            name, argv = pending.pop(0)
            out = tempfile.TemporaryFile(mode="w+")
            running.append((name, subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, text=True), out))
        time.sleep(0.5)
        for item in list(running):
            name, p, out = item
            if p.poll() is None:
                continue
            running.remove(item)
            out.seek(0)
            outp = out.read()
            out.close()
            if p.returncode != 0:
                failed.append(name)
                log(f"JIT warm-up of {name} FAILED (exit {p.returncode}):\n{outp[-1500:]}")
            else:
                log(outp.strip().splitlines()[-1] if outp.strip() else f"{name} done")
    return failed


def jit_warmup(mods, layout, jobs, args):
    """Builds the modules in parallel child processes (ninja -j MAX_JOBS each); returns seconds."""
    if not mods:
        return 0.0
    t0 = time.perf_counter()
    ncpu = os.cpu_count() or 8
    specs = [jit_spec(key, hq, hkv) for key, (hq, hkv) in sorted(mods.items())]
    jobs = max(1, min(jobs or len(specs), len(specs)))
    env = dict(os.environ)
    env.setdefault("MAX_JOBS", str(max(2, math.ceil(1.25 * ncpu / jobs))))
    log(f"JIT warm-up: {len(specs)} FlashInfer modules, {jobs} at a time, MAX_JOBS={env['MAX_JOBS']}: {specs}")
    me = str(Path(__file__).resolve())
    failed = jit_children([(s, [sys.executable, me, "--jit-one", s, "--layout", layout, "--soft-cap", str(args.soft_cap),
                                "--window-left", str(args.window_left), "--page-size", str(args.page_size)])
                           for s in specs], jobs, env)
    dt = time.perf_counter() - t0
    log(f"JIT warm-up done in {dt:.0f} s" + (f"; failed: {failed}" if failed else ""))
    return dt


# ---- dry run ---------------------------------------------------------------------------------------------
def dry_run(args, steps):
    import persistentkv as pkv
    log("dry run: no CUDA; planning every step on the CPU backend with parallelism 132 (an H200's SMs)")
    missing = [r for r in args.routes if r not in pkv.ROUTES]
    assert not missing, f"the library does not know routes {missing} (it has {pkv.ROUTES})"
    total_plans, t0 = 0, time.perf_counter()
    w = pkv.BatchDecodeWithPagedKVCacheWrapper(kv_layout=args.layout, backend="cpu")
    for st in steps:
        kw = dict(kv_data_type=st.kv_dtype) if st.fp8 else {}  # the binding takes "fp8_e4m3" / "fp8_e5m2"
        for route in args.routes:
            w.plan(st.indptr, st.indices, st.lens, st.Hq, st.Hkv, st.d, st.page_size, num_pages=st.pages,
                   q_data_type=st.dtype, route=route, parallelism=132, **kw)
            w.validate_plan()
            total_plans += 1
    log(f"{total_plans} plans made and validated in {time.perf_counter() - t0:.1f} s")
    # the reference and the layouts, against the library's CPU backend (torch on the CPU)
    try:
        import torch
        self_test_reference(torch, pkv, args)
        fp8 = [k for k in (args.kv_dtypes or []) if k in FP8_MAX]
        if fp8:
            self_test_fp8(torch, pkv, args, fp8)
    except ImportError:
        log("torch not importable here: reference self-test skipped")
    # FlashInfer's API as used here
    try:
        check_flashinfer_api()
    except ImportError as e:
        log(f"flashinfer not importable here ({e}): API check skipped")
    print_plan(args, steps)


def self_test_reference(torch, pkv, args):
    """torch_reference (gathers, layouts, GQA grouping) against PersistentKV's CPU backend."""
    for layout in ("NHD", "HND"):
        for shape in ("paper", "g7", "mha", "d64"):
            a = types.SimpleNamespace(page_size=16, layout=layout)
            st = isolated_step("selftest", f"t_{layout}_{shape}", shape, "fp16", [37, 300, 16, 129], a, 1)
            g = torch.Generator().manual_seed(1)
            shp = ((st.pages, 16, st.Hkv, st.d) if layout == "NHD" else (st.pages, st.Hkv, 16, st.d))
            K = (torch.rand(shp, generator=g) * 2 - 1).half()
            V = (torch.rand(shp, generator=g) * 2 - 1).half()
            q = (torch.rand(st.B, st.Hq, st.d, generator=g) * 2 - 1).half()
            w = pkv.BatchDecodeWithPagedKVCacheWrapper(kv_layout=layout, backend="cpu")
            w.plan(st.indptr, st.indices, st.lens, st.Hq, st.Hkv, st.d, 16, num_pages=st.pages, q_data_type="fp16")
            o = w.run(q, K, V)
            rows = list(range(st.B))
            ref = torch_reference(torch, st, q, K, V, rows)
            e, m, nan = rel_err(o.float(), ref)
            assert e < 2e-3 and nan == 0, f"reference self-test {layout} {shape}: rel err {e:.2e}"
            assert pick_ref_rows(st.lens) and len(pick_ref_rows(st.lens)) <= 3
    log("reference self-test: torch_reference matches the PersistentKV CPU backend (NHD, HND; G 4, 7, 1; d 128, 64)")


def self_test_fp8(torch, pkv, args, kv_dtypes):
    """The fp8 side, on the CPU: quantize_fp8 (finite codes, saturation, rounding within half a step), the fp8
    branch of torch_reference against the library's float64 reference (pkv_reference_kv: the same codes times
    the same scales; to 1e-7, the library rounding 1 / sqrt(d) to float), and PersistentKV's CPU backend (plan(kv_data_type=), run(k_scale=, v_scale=))
    against both, for NHD and HND, fp16 and bf16 q."""
    worst, worst_ref = {}, 0.0
    for kv in kv_dtypes:
        S = kv_scale_for(kv, args)
        fmax, mbits = FP8_MAX[kv], (3 if kv == "fp8_e4m3" else 2)
        tdt = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[kv]
        real = torch.linspace(-1.0, 1.0, 20001)
        c = quantize_fp8(torch, real, kv, S).float()
        assert c.isfinite().all(), f"{kv}: quantize_fp8 gave non-finite codes"
        big = quantize_fp8(torch, torch.tensor([-3.0, 3.0]) * fmax * S, kv, S).float()
        assert big.tolist() == [-fmax, fmax], f"{kv}: saturation gave {big.tolist()}"
        normal = real.abs() / S >= {"fp8_e4m3": 2.0 ** -6, "fp8_e5m2": 2.0 ** -14}[kv]  # the smallest normal
        rel = ((c * S - real).abs() / real.abs().clamp_min(1e-30))[normal]
        assert rel.max().item() <= 2.0 ** -(mbits + 1) * (1 + 1e-6), f"{kv}: rounding error {rel.max().item():.3g}"
        for layout in ("NHD", "HND"):
            for shape, dt in (("paper", "fp16"), ("g7", "bf16")):
                a = types.SimpleNamespace(page_size=16, layout=layout)
                st = isolated_step("selftest", f"t8_{layout}_{shape}", shape, dt, [37, 300, 16, 129], a, 1)
                st.set_kv(kv, S)
                g = torch.Generator().manual_seed(2)
                shp = ((st.pages, 16, st.Hkv, st.d) if layout == "NHD" else (st.pages, st.Hkv, 16, st.d))
                K = quantize_fp8(torch, torch.rand(shp, generator=g) * 2 - 1, kv, S)
                V = quantize_fp8(torch, torch.rand(shp, generator=g) * 2 - 1, kv, S)
                q = (torch.rand(st.B, st.Hq, st.d, generator=g) * 2 - 1).to(
                    torch.float16 if dt == "fp16" else torch.bfloat16)
                rows = list(range(st.B))
                ref = torch_reference(torch, st, q, K, V, rows, k_scale=S, v_scale=S)
                lib_ref, _ = pkv.reference(q, K, V, st.indptr, st.indices, st.lens, kv_layout=layout,
                                           kv_data_type=tdt, k_scale=S, v_scale=S)
                e = rel_err(torch.from_numpy(lib_ref), ref)[0]
                # to 1e-7: the library's reference rounds the score scale 1 / sqrt(d) to float (~2e-8), this one not
                assert e < 1e-7, f"fp8 self-test {kv} {layout} {shape}: torch_reference vs pkv_reference_kv {e:.2e}"
                worst_ref = max(worst_ref, e)
                w = pkv.BatchDecodeWithPagedKVCacheWrapper(kv_layout=layout, backend="cpu")
                w.plan(st.indptr, st.indices, st.lens, st.Hq, st.Hkv, st.d, 16, num_pages=st.pages, q_data_type=dt,
                       kv_data_type=tdt)
                o = w.run(q, K, V, k_scale=S, v_scale=S)
                e, _, nan = rel_err(o.float(), ref)
                worst[dt] = max(worst.get(dt, 0.0), e)
                assert e < TOL[dt] and nan == 0, f"fp8 self-test {kv} {layout} {shape}: CPU backend rel err {e:.2e}"
                # the scale is applied: the same codes read at scale 1 are far off
                o1 = w.run(q, K, V)
                assert rel_err(o1.float(), ref)[0] > 0.5, f"fp8 self-test {kv}: k_scale / v_scale had no effect"
    log(f"fp8 self-test: quantize_fp8 and torch_reference's fp8 branch match pkv_reference_kv ({worst_ref:.1e}) and the "
        f"PersistentKV CPU backend (worst rel err {', '.join(f'{v:.1e} {k} q' for k, v in worst.items())}) for "
        f"{', '.join(kv_dtypes)} "
        f"(scales {', '.join(f'{kv_scale_for(k, args):.6g}' for k in kv_dtypes)}), NHD and HND, fp16 and bf16 q")


def check_flashinfer_api():
    import inspect
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")  # no device query at import
    import flashinfer
    W = flashinfer.BatchDecodeWithPagedKVCacheWrapper
    init = inspect.signature(W.__init__).parameters
    for p in ("float_workspace_buffer", "kv_layout", "use_cuda_graph", "use_tensor_cores", "paged_kv_indptr_buffer",
              "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer"):
        assert p in init, f"FlashInfer wrapper __init__ lacks {p}"
    plan_impl = getattr(W, "_plan_impl", None) or W.plan
    pp = inspect.signature(plan_impl).parameters
    for p in ("q_data_type", "kv_data_type"):
        assert p in pp, f"FlashInfer plan lacks {p}"
    rp = inspect.signature(W.run).parameters
    assert "out" in rp, "FlashInfer run lacks out="
    for p in ("k_scale", "v_scale"):  # the fp8 caches' scales
        assert p in rp, f"FlashInfer run lacks {p}"
        assert p in inspect.signature(flashinfer.BatchAttention.run).parameters, f"BatchAttention.run lacks {p}"
    for p in ("fixed_split_size", "disable_split_kv"):  # plan(*args, **kwargs) forwards to _plan_impl
        assert p in pp, f"FlashInfer plan lacks {p}"
    tp = inspect.signature(flashinfer.decode.trtllm_batch_decode_with_kv_cache).parameters
    for p in ("query", "kv_cache", "workspace_buffer", "block_tables", "seq_lens", "max_seq_len", "bmm1_scale",
              "bmm2_scale", "window_left", "out", "kv_layout", "backend"):
        assert p in tp, f"trtllm_batch_decode_with_kv_cache lacks {p}"
    from flashinfer.xqa import xqa
    for p in ("sm_count", "q_scale", "kv_scale"):
        assert p in inspect.signature(xqa).parameters, f"flashinfer.xqa.xqa lacks {p}"
    bp = inspect.signature(flashinfer.BatchAttention.plan).parameters
    for p in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr", "head_dim_qk", "head_dim_vo", "causal",
              "logits_soft_cap", "q_data_type", "kv_data_type"):
        assert p in bp, f"BatchAttention.plan lacks {p}"
    assert "lse" in inspect.signature(flashinfer.BatchAttention.run).parameters, "BatchAttention.run lacks lse="
    log(f"FlashInfer {flashinfer.__version__}: the decode wrapper, XQA, BatchAttention accept the arguments used here")


def print_plan(args, steps):
    mods = fi_modules(steps, args)
    flat = max([8 << 30] + [s.pool_bytes for s in steps])
    print(f"plan of runs: {len(steps)} steps, layout {args.layout}, page size {args.page_size}")
    print(f"flat K/V buffer: {flat / 2 ** 30:.1f} GiB (largest pool; >= 8 GiB for the 4 GiB read ceiling)")
    print(f"FlashInfer paths: {args.fi_configs}; split sweep {args.split_tokens} tokens + no split; XQA sm_count x "
          f"{args.xqa_sm_multiples}; passes {args.passes}; JIT modules needed ({len(mods)}):")
    what = {"cudacore": "CUDA-core decode module", "tensorcore": "tensor-core (fa2 prefill module)",
            "xqa": "XQA (mha.cu, page size {ps}, G {g})", "batch_attention": "BatchAttention (persistent module)"}
    for (dt, kv, d, kind, g), (hq, hkv) in sorted(mods.items()):
        w = what[kind] if not (kind == "xqa" and kv in FP8_MAX) else (
            "XQA (mha.cu; mha_sm90.cu's e4m3 GMMA kernel runs at d <= 256 on sm_90, page size {ps}, G {g})")
        print(f"  {dt}{f' q, {kv} cache,' if kv != dt else ''} head_dim {d} {w.format(ps=args.page_size, g=g)}")
    refused = {}
    for s in steps:
        for path, why in s.fi_paths(args):
            if why:
                refused.setdefault((path, why), []).append(s.key())
    for (path, why), keys in sorted(refused.items()):
        print(f"  refused: {path} on {len(keys)} steps ({keys[0]}, ...): {why}")
    print(f"PersistentKV routes: {args.routes}; graphs: {'no' if args.no_graphs else 'yes'}")
    if args.kv_dtypes:
        sc = ", ".join(f"{k} {kv_scale_for(k, args):.6g}" for k in args.kv_dtypes if k in FP8_MAX)
        print(f"KV caches: {args.kv_dtypes} (q: q's type); fp8 scales (k_scale = v_scale): {sc or '-'}; tolerance "
              f"q's type, XQA's e4m3 kernel {TOL_FP8_MATH:g}")
        skipped = {}
        for key, kv, why in getattr(args, "kv_skipped", []):
            skipped.setdefault(why, []).append(key)
        for why, keys in skipped.items():
            print(f"  not run on {len(keys)} steps ({keys[0]}, ...): {why}")
    est = 0.0
    shw = 16 if args.kv_dtypes else 10
    print(f"{'#':>4} {'group':<7}{'step':<32}{'shape':<{shw}}{'B':>4}{'tokens':>9}{'KV MB':>9}{'R':>4}{'pool MB':>9}"
          f"{'reps':>5} {'FI configs'}")
    for i, s in enumerate(steps):
        sh = s.shape + ":" + s.dtype + (f"/{kv_short(s.kv_dtype)}" if s.fp8 else "")
        print(f"{i:>4} {s.group:<7}{s.name[:31]:<32}{sh:<{shw}}{s.B:>4}{s.total_tokens:>9}"
              f"{s.kv_bytes / 1e6:>9.1f}{s.rotations:>4}{s.pool_bytes / 1e6:>9.0f}{s.reps:>5} "
              f"{','.join(FI_SHORT[p] for p, why in s.fi_paths(args) if not why)}")
        est += estimate_step_s(s, args)
    by = {}
    for s in steps:
        by[s.group] = by.get(s.group, 0) + 1
    print(f"steps by group: {by}; estimated measuring time {est / 60:.1f} min (+ FlashInfer JIT on first use)")


def estimate_step_s(st, args):
    """Rough seconds for one step: ~12 timed configurations + floor + wall, plus fixed overhead."""
    floor_us = 3.9 + st.kv_bytes / 4.0e6
    kern = floor_us / 0.8
    nfi = 0
    for path, why in st.fi_paths(args):
        if not why and path != "cudnn":
            nfi += {"split_sweep": 1 + len(args.split_tokens), "xqa_sweep": len(args.xqa_sm_multiples)}.get(path, 1)
    passes = max(1, args.passes)
    per = max(10, -(-st.reps // passes)) * passes + passes * (2 * args.warmup + 2)
    runs = (nfi + len(args.routes)) * per + (0 if args.no_graphs else 3) * (st.reps + 2 * args.warmup + 2)
    runs += 3 * min(args.floor_reps, st.reps) + 4 * args.wall_reps
    return 0.25 + runs * max(kern, 60.0) * 1e-6


# ---- main ------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="output folder for compare.json and compare.md")
    p.add_argument("--matrix", choices=("full", "quick"), default="full",
                   help="full (default): 26 anchors, 30 shape rows, 4 families x 8 B x 5 seeds x 3 steps; quick: a smoke subset")
    p.add_argument("--groups", default="anchors,shapes,traces", help="subset of anchors,shapes,traces")
    p.add_argument("--anchors", help="anchor names (comma-separated; default: the matrix's)")
    p.add_argument("--shapes", help="shape runs shape:dtype (e.g. g8:bf16,d64:bf16)")
    p.add_argument("--shape-points", help="anchor points for the shape runs (default B1_N8192,...,B64_uniform)")
    p.add_argument("--families", help="trace families (default uniform,bimodal,zipf,bucketed)")
    p.add_argument("--batches", help="trace batch sizes (default 1,2,4,...,128)")
    p.add_argument("--seeds", help="trace seeds (default the held-out 20260623..27)")
    p.add_argument("--trace-steps", help="trace steps to sample: first, mid, last or numbers (default mid,first,last: measured in that order)")
    p.add_argument("--layout", choices=("NHD", "HND"), default="NHD")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--soft-cap", type=float, default=0.0,
                   help="logits soft cap for both libraries (Gemma-2: 50; default 0: none)")
    p.add_argument("--window-left", type=int, default=-1,
                   help="sliding window for both libraries, as FlashInfer's window_left (the last W + 1 tokens; "
                        "Gemma-2's local layers: 4095; default -1: none)")
    p.add_argument("--kv-dtype", dest="kv_dtype",
                   help="the caches' types, comma-separated, each step run once per type, twins one after the other: "
                        "q (q's 16-bit type; the default), fp16, bf16 (run only on steps of that q type), fp8_e4m3, "
                        "fp8_e5m2 (codes of the uniform [-1, 1] values / --kv-scale; both libraries get "
                        "k_scale = v_scale = the scale). With q and an fp8 type, each fp8 row is compared with the "
                        "16-bit row of its step (ours fp16 us / ours fp8 us). Example: q,fp8_e4m3")
    p.add_argument("--kv-scale", type=float, default=None,
                   help="the fp8 caches' scale S (stored code x S = value; k_scale = v_scale = S); default 1 / the "
                        "format's largest code (448 e4m3, 57344 e5m2): the uniform [-1, 1] data span the codes")
    p.add_argument("--routes", default=",".join(ROUTES), help="PersistentKV routes (default all six)")
    p.add_argument("--fi-configs", default=",".join(FI_PATHS),
                   help=f"FlashInfer paths to time (default all: {','.join(FI_PATHS)})")
    p.add_argument("--split-tokens", default=",".join(map(str, SPLIT_TOKENS)),
                   help="fixed_split_size settings of the split sweep, in tokens (plan() gets tokens / page size "
                        "pages); disable_split_kv=True is always in the sweep")
    p.add_argument("--xqa-sm-multiples", default=",".join(map(str, XQA_SM_MULTIPLES)),
                   help="the xqa_sweep path: sm_count = k x SMs handed to flashinfer.xqa.xqa (more sub-sequences)")
    p.add_argument("--passes", type=int, default=2,
                   help="timing passes per step, FlashInfer first in even passes and PersistentKV first in odd "
                        "ones; each times reps / passes runs; a path's time is the median of its passes")
    p.add_argument("--repeat-procs", type=int, default=0,
                   help="after the run, measure each --repeat-steps anchor again in this many separate processes "
                        "(no graphs) and report the spread (meta.repeats, the Markdown's last table)")
    p.add_argument("--repeat-steps", default=",".join(a[0] for a in ANCHORS if a[1] in (8, 16)),
                   help="anchor steps repeated by --repeat-procs (default the B8 and B16 anchors)")
    p.add_argument("--reps", type=int, default=100, help="timed runs per configuration, anchors and shapes")
    p.add_argument("--trace-reps", type=int, default=30, help="timed runs per configuration, trace steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs before each timing (twice: host cost, then device estimate)")
    p.add_argument("--wall-reps", type=int, default=10, help="plan and plan+run+sync repetitions")
    p.add_argument("--floor-reps", type=int, default=20)
    p.add_argument("--floor", choices=("pkv", "torch"), default="pkv", help="kernel for the step floor")
    p.add_argument("--rotate-gib", type=float, default=2.0, help="rotate K/V over at least this much")
    p.add_argument("--pool-cap-gib", type=float, default=48.0, help="largest K+V pool of one step")
    p.add_argument("--graph-rotations", type=int, default=16, help="graphs captured per configuration and step")
    p.add_argument("--no-graphs", action="store_true", help="time eager runs only")
    p.add_argument("--no-reference", action="store_true", help="skip the float64 reference rows")
    p.add_argument("--max-minutes", type=float, help="stop starting new steps after this long; outputs are written")
    p.add_argument("--jit-warmup", action="store_true", help="first compile the FlashInfer modules in parallel")
    p.add_argument("--jit-warmup-only", action="store_true", help="compile the FlashInfer modules, then exit")
    p.add_argument("--jit-jobs", type=int, default=0, help="modules compiled at once (default all)")
    p.add_argument("--jit-one", help=argparse.SUPPRESS)
    p.add_argument("--append", action="store_true",
                   help="issue 35: time the append of new K/V (B = --append-batches) instead of decode: "
                        "PersistentKV's pkv_append_kv against flashinfer.page.append_paged_kv_cache and a pure "
                        "write of the same bytes, on the same pages; writes append.json and append.md to --out")
    p.add_argument("--append-batches", default="1,2,4,8,16,32,64,128,256")
    p.add_argument("--append-shape", default="paper", help="shape of the append runs (default paper: Hkv 8, d 128)")
    p.add_argument("--append-dtype", choices=("fp16", "bf16"), default="fp16")
    p.add_argument("--dry-run", action="store_true", help="no CUDA: build and plan everything, print the plan, "
                   "self-test the reference; with --out, write made-up rows to test the writers")
    a = p.parse_args(argv)
    a.routes = [r for r in a.routes.split(",") if r]
    a.fi_configs = [c for c in a.fi_configs.split(",") if c]
    a.split_tokens = [int(x) for x in a.split_tokens.split(",") if x]
    a.xqa_sm_multiples = [int(x) for x in a.xqa_sm_multiples.split(",") if x]
    a.kv_dtypes = None
    if a.kv_dtype is not None:
        a.kv_dtypes = list(dict.fromkeys(x for x in a.kv_dtype.split(",") if x))
        bad = [x for x in a.kv_dtypes if x not in ("q",) + KV_DTYPES]
        if bad or not a.kv_dtypes:
            p.error(f"--kv-dtype: unknown cache types {bad} (q, {', '.join(KV_DTYPES)})")
    if a.kv_scale is not None:
        if not (math.isfinite(a.kv_scale) and a.kv_scale > 0):
            p.error(f"--kv-scale must be positive and finite, got {a.kv_scale}")
        for k in (a.kv_dtypes or []):
            if k in FP8_MAX and 1.0 / a.kv_scale > FP8_MAX[k]:
                log(f"warning: --kv-scale {a.kv_scale:g}: values above {FP8_MAX[k] * a.kv_scale:g} saturate in {k}")
    bad = [r for r in a.routes if r not in ROUTES] + [c for c in a.fi_configs if c not in FI_PATHS]
    if bad:
        p.error(f"unknown routes or FlashInfer configs: {bad}")
    bad = [n for n in a.repeat_steps.split(",") if n and n not in ANCHOR_BY_NAME]
    if bad:
        p.error(f"--repeat-steps: unknown anchors {bad}")
    bad = [g for g in a.groups.split(",") if g not in ("anchors", "shapes", "traces")]
    if bad:
        p.error(f"unknown groups {bad}")
    if not (a.dry_run or a.jit_one or a.jit_warmup_only) and not a.out:
        p.error("--out DIR is required")
    return a


def run_repeats(args, deadline=None):
    """--repeat-procs: each --repeat-steps anchor measured again in separate processes (this script, that step
    alone, no graphs), one after another; returns one entry per step with the spread over the processes."""
    import tempfile
    names = [n for n in args.repeat_steps.split(",") if n]
    tmp = Path(tempfile.mkdtemp(prefix="pkv-repeat-"))
    out = []
    for name in names:
        runs = {}  # label (the anchor, and its cache type on fp8 rows) -> per-run dicts
        for k in range(args.repeat_procs):
            left = None if deadline is None else deadline - time.perf_counter()
            if left is not None and left < 60:
                log(f"repeats: no time left for {name} run {k + 1}")
                break
            d = tmp / f"{name}_{k}"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--groups", "anchors", "--anchors", name, "--out",
                   str(d), "--no-graphs", "--layout", args.layout, "--page-size", str(args.page_size), "--reps",
                   str(args.reps), "--passes", str(args.passes), "--fi-configs", ",".join(args.fi_configs), "--routes",
                   ",".join(args.routes), "--split-tokens", ",".join(map(str, args.split_tokens)),
                   "--xqa-sm-multiples", ",".join(map(str, args.xqa_sm_multiples)), "--soft-cap", str(args.soft_cap),
                   "--window-left", str(args.window_left), "--warmup", str(args.warmup), "--wall-reps", "2",
                   "--rotate-gib", str(args.rotate_gib), "--floor", args.floor]
            if args.kv_dtypes:
                cmd += ["--kv-dtype", ",".join(args.kv_dtypes)]
            if args.kv_scale is not None:
                cmd += ["--kv-scale", repr(args.kv_scale)]
            if left is not None:
                cmd += ["--max-minutes", f"{(left - 20) / 60:.2f}"]
            t0 = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=None if left is None else max(30, left - 10))
            try:
                rows = json.loads((d / "compare.json").read_text())["rows"]
                rows[0]
            except Exception as e:
                log(f"repeats: {name} run {k + 1} gave no row (exit {p.returncode}, {type(e).__name__}): "
                    f"{p.stderr[-800:]}")
                continue
            for r in rows:  # one row, or one per cache type (--kv-dtype)
                label = row_label(r)
                runs.setdefault(label, []).append(
                    {key: r.get(key) for key in ("fi_best_us", "fi_best_config", "fi_best_setting", "pkv_auto_us",
                                                 "pkv_auto_route_used", "pkv_best_us", "pkv_best_route_used",
                                                 "ratio", "ratio_auto", "fi_path_us", "ok")})
                log(f"repeats: {label} run {k + 1}/{args.repeat_procs}: FI {fmt(r.get('fi_best_us'))} us "
                    f"({r.get('fi_best_config')}), auto {fmt(r.get('pkv_auto_us'))} us, auto / FI best "
                    f"{fmt(r.get('ratio_auto'), '.3f')} ({time.perf_counter() - t0:.0f} s)")
        for label, rl in runs.items():
            out.append({"name": label, "runs": len(rl), "per_run": rl,
                        "fi_best_us": spread([x["fi_best_us"] for x in rl]),
                        "pkv_auto_us": spread([x["pkv_auto_us"] for x in rl]),
                        "pkv_best_us": spread([x["pkv_best_us"] for x in rl]),
                        "ratio_auto": spread([x["ratio_auto"] for x in rl]),
                        "ratio": spread([x["ratio"] for x in rl]),
                        "fi_best_paths": sorted({str(x["fi_best_config"]) for x in rl})})
    return out


def run_append(args):
    """--append (issue 35 item 5): the step's new K and V ([B, Hkv, d], one token per row) written into a
    scattered page pool by (1) flashinfer.page.append_paged_kv_cache, (2) PersistentKV's
    append_paged_kv_cache (the same call, FlashInfer's form: batch_indices + positions), (3) PersistentKV's
    decode form (pkv.append_kv, one token per row, no batch_indices), and (4) a pure write of the same bytes
    (torch index_copy_ of the B x Hkv x d rows into their NHD slots: the scatter with nothing else), and (5)
    a dense copy of the same bytes (the floor).  Every implementation writes into its own copy of the same
    pool and the caches are compared bitwise at the end of each B.  Timing as for decode: CUDA events
    around each call, calls queued in batches of 16 behind a spin kernel (launch cost off the clock),
    median of --reps; rows of random lengths (100..4000) so the slots are scattered.  Target (issue 35):
    at B >= 64, PersistentKV within 10% of the pure write."""
    import json
    import torch
    import flashinfer
    import persistentkv as pkv
    if args.layout != "NHD":
        raise SystemExit("--append times the NHD layout (the pure write is an NHD row scatter)")
    _, hkv, d = SHAPES[args.append_shape][:3]
    dt = torch.float16 if args.append_dtype == "fp16" else torch.bfloat16
    ps, dev = args.page_size, torch.device("cuda:0")
    batches = [int(b) for b in args.append_batches.split(",") if b]
    rng = SplitMix64(35)
    spin_cycles = 2_000_000
    rows_out = []

    def time_call(fn, reps):
        ev = []
        for start in range(0, reps, 16):
            torch.cuda._sleep(spin_cycles)  # the host queues the batch while the GPU spins
            for _ in range(min(16, reps - start)):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                ev.append((a, b))
        torch.cuda.synchronize()
        t = sorted(a.elapsed_time(b) * 1e3 for a, b in ev)
        return t[len(t) // 2]

    for B in batches:
        lens = [rng.uniform_int(100, 4000) for _ in range(B)]
        pool = pkv.PagePool(num_pages=sum((n + ps) // ps for n in lens) + 64, page_size=ps, max_requests=B)
        # scatter the pages: requests of random lengths come and go first
        for r in range(B):
            pool.create(r, lens[r] - 1)
        for r in range(0, B, 2):
            pool.free(r)
            pool.create(r, lens[r] - 1)
        for r in range(B):
            pool.extend(r, 1)
        indptr, indices, last, seq = pool.table(list(range(B)))
        P = pool.num_pages
        base_k = torch.randn(P, ps, hkv, d, device=dev).to(dt)
        base_v = torch.randn(P, ps, hkv, d, device=dev).to(dt)
        caches = {name: (base_k.clone(), base_v.clone()) for name in ("fi", "pkv_fi_form", "pkv_decode", "write")}
        k = torch.randn(B, hkv, d, device=dev).to(dt)
        v = torch.randn(B, hkv, d, device=dev).to(dt)
        d_indptr = torch.as_tensor(indptr, device=dev)
        d_indices = torch.as_tensor(indices, device=dev)
        d_last = torch.as_tensor(last, device=dev)
        bidx = torch.arange(B, device=dev, dtype=torch.int32)
        pos = torch.as_tensor(seq - 1, device=dev)
        page = indices[indptr[:-1] + (seq - 1) // ps]
        slot_rows = torch.as_tensor(page.astype("int64") * ps + (seq - 1) % ps, device=dev)
        dense_k, dense_v = torch.empty_like(k), torch.empty_like(v)
        calls = {
            "fi": lambda: flashinfer.page.append_paged_kv_cache(k, v, bidx, pos, caches["fi"], d_indices, d_indptr,
                                                                d_last, kv_layout="NHD"),
            "pkv_fi_form": lambda: pkv.append_paged_kv_cache(k, v, bidx, pos, caches["pkv_fi_form"], d_indices,
                                                             d_indptr, d_last, kv_layout="NHD"),
            "pkv_decode": lambda: pkv.append_kv(k, v, caches["pkv_decode"], d_indptr, d_indices,
                                                kv_last_page_len=d_last, kv_layout="NHD"),
            "write": lambda: (caches["write"][0].view(P * ps, hkv * d).index_copy_(0, slot_rows, k.view(B, -1)),
                              caches["write"][1].view(P * ps, hkv * d).index_copy_(0, slot_rows, v.view(B, -1))),
            "dense_copy": lambda: (dense_k.copy_(k), dense_v.copy_(v)),
        }
        row = {"B": B, "Hkv": hkv, "d": d, "page_size": ps, "dtype": args.append_dtype,
               "bytes": 2 * B * hkv * d * k.element_size()}
        for name, fn in calls.items():
            for _ in range(args.warmup):
                fn()
            row[name + "_us"] = time_call(fn, args.reps)
        torch.cuda.synchronize()
        ref = caches["write"]
        row["equal"] = all(torch.equal(caches[n][0], ref[0]) and torch.equal(caches[n][1], ref[1])
                           for n in ("fi", "pkv_fi_form", "pkv_decode"))
        row["pkv_vs_write"] = row["pkv_decode_us"] / row["write_us"]
        row["pkv_vs_fi"] = row["pkv_decode_us"] / row["fi_us"]
        rows_out.append(row)
        log(f"append B={B}: FI {row['fi_us']:.2f} us, PKV (FI form) {row['pkv_fi_form_us']:.2f} us, PKV (decode "
            f"form) {row['pkv_decode_us']:.2f} us, index_copy_ {row['write_us']:.2f} us, dense copy "
            f"{row['dense_copy_us']:.2f} us; equal {row['equal']}")
    meta = dict(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, flashinfer=flashinfer.__version__,
                pkv_library=str(pkv.library_path), reps=args.reps, cmd=" ".join(sys.argv))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "append.json").write_text(json.dumps({"meta": meta, "rows": rows_out}, indent=1))
    lines = [f"# Append K/V: PersistentKV vs FlashInfer ({meta['gpu']})", "",
             f"`{meta['cmd']}`; kernel us (CUDA events, median of {args.reps}); Hkv {hkv}, d {d}, page {ps}, "
             f"{args.append_dtype}, NHD, one token per row", "",
             "| B | bytes | FlashInfer | PKV (FI form) | PKV (decode form) | pure write (index_copy_) | dense copy "
             "| PKV / write | PKV / FI | equal |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |"]
    for r in rows_out:
        lines.append(f"| {r['B']} | {r['bytes']} | {r['fi_us']:.2f} | {r['pkv_fi_form_us']:.2f} | "
                     f"{r['pkv_decode_us']:.2f} | {r['write_us']:.2f} | {r['dense_copy_us']:.2f} | "
                     f"{r['pkv_vs_write']:.2f} | {r['pkv_vs_fi']:.2f} | {'yes' if r['equal'] else 'NO'} |")
    (args.out / "append.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["equal"] for r in rows_out) else 1


def main(argv=None):
    t_start = time.perf_counter()
    args = parse_args(argv)
    if args.jit_one:
        jit_one(args.jit_one, args.layout, args)
        return 0
    if args.append:
        return run_append(args)
    log(check_anchor_rule())
    if args.jit_warmup_only:  # no PersistentKV needed: can run while the library builds
        traces = "traces" in args.groups.split(",")
        args.groups = ",".join(g for g in args.groups.split(",") if g != "traces")
        mods = fi_modules(build_steps(args), args) if args.groups else {}
        if traces:  # the trace steps use the paper shape
            a = types.SimpleNamespace(page_size=args.page_size, layout=args.layout)
            st = isolated_step("trace", "jit", "paper", "fp16", [1024], a, 1)
            mods.update({k: v for k, v in fi_modules(expand_kv([st], args)[0], args).items() if k not in mods})
        jit_warmup(mods, args.layout, args.jit_jobs, args)
        return 0
    steps = build_steps(args)
    log(f"{len(steps)} steps: " + ", ".join(f"{g} {sum(1 for s in steps if s.group == g)}"
                                           for g in ("anchor", "shape", "trace")))
    if args.dry_run:
        dry_run(args, steps)
        if args.out:
            import random
            rnd = random.Random(7)
            meta = dict(base_meta(args), dry_run=True, gpu={"name": "none (dry run)"},
                        ceilings={"read_gbps": 4600.0, "read_kernel": "dry-run"})
            rows = [fake_row(s, args, rnd) for s in steps]
            if args.repeat_procs:
                meta["repeats"] = [{"name": n, "runs": args.repeat_procs,
                                    "fi_best_us": (50.0, 49.0, 51.0), "pkv_auto_us": (48.0, 47.5, 48.6),
                                    "ratio_auto": (1.04, 1.02, 1.06), "ratio": (1.05, 1.03, 1.07),
                                    "fi_best_paths": ["split_sweep"]} for n in args.repeat_steps.split(",") if n]
            write_outputs(args.out, meta, rows)
            log(f"dry run: wrote made-up rows to {args.out}/compare.json and compare.md")
            print(short_table(meta, rows))
        return 0

    import torch
    import persistentkv as pkv
    import flashinfer
    if not pkv.cuda_available():
        raise SystemExit(f"{pkv.library_path} has no CUDA backend or sees no GPU (set PKV_LIBRARY to the CUDA build)")
    meta = base_meta(args)
    meta.update(torch=torch.__version__, cuda=torch.version.cuda, flashinfer=flashinfer.__version__,
                pkv_library=str(pkv.library_path), gpu={"name": torch.cuda.get_device_name(0)})
    if args.jit_warmup:
        meta["jit_warmup_s"] = jit_warmup(fi_modules(steps, args), args.layout, args.jit_jobs, args)
    flat = max([8 << 30] + [s.pool_bytes for s in steps])
    gpu = Gpu(args, flat)
    if gpu.devh is not None:
        meta["gpu"] = gpu.devh.info()
    gpu.fill("fp16")
    ce = gpu.ceilings()
    gpu.read_gbps = ce["read_gbps"]
    meta["ceilings"] = ce
    meta["spin_cycles_per_us"] = gpu.cycles_per_us
    log(f"{meta['gpu'].get('name')}: read ceiling {ce['read_gbps']:.0f} GB/s ({ce['read_kernel']}); torch.sum "
        f"{ce['torch_sum_gbps']:.0f} GB/s; spin clock {gpu.cycles_per_us:.0f} cycles/us")

    budget = args.max_minutes * 60 if args.max_minutes else None
    # --repeat-procs: keep ~30 s per child process (start, JIT load, buffer fill, one step) out of the steps' time
    reserve = 30.0 * args.repeat_procs * len([n for n in args.repeat_steps.split(",") if n]) if args.repeat_procs else 0
    rows, skipped, last_write, longest = [], [], time.perf_counter(), 0.0
    for i, st in enumerate(steps):
        elapsed = time.perf_counter() - t_start
        if budget is not None and elapsed + max(estimate_step_s(st, args), 1.5 * longest) + 10 + reserve > budget:
            skipped = [s.key() for s in steps[i:]]
            log(f"time limit: stopping before step {i + 1}/{len(steps)} ({st.key()}); {len(skipped)} steps not run")
            break
        t0 = time.perf_counter()
        try:
            row = measure_step(gpu, st, args)
        except Exception as e:  # e.g. out of memory: record and go on
            import traceback
            traceback.print_exc()
            row = base_row(st, args)
            row.update(problems=[f"step failed: {type(e).__name__}: {e}"], errors=[], ok=False)
            broken = safe_sync(torch)
            if broken:  # a sticky CUDA error: nothing after this can run in this process
                rows.append(row)
                skipped = [s.key() for s in steps[i + 1:]]
                meta["device_error"] = broken
                log(f"the device is in an error state ({broken}); stopping, {len(skipped)} steps not run")
                break
        dt = time.perf_counter() - t0
        longest = max(longest, dt)
        row["seconds"] = dt
        rows.append(row)
        log(f"[{i + 1}/{len(steps)}] {st.key()} B={st.B} {st.kv_bytes / 1e6:.1f} MB: FI {fmt(row.get('fi_best_us'))} us "
            f"({row.get('fi_best_config')}), PKV {fmt(row.get('pkv_best_us'))} us ({row.get('pkv_best_route_used')}), "
            f"auto {fmt(row.get('pkv_auto_us'))} us, ratio {fmt(row.get('ratio'), '.2f')}, eff FI "
            f"{fmt(row.get('fi_step_eff'), '.2f')} PKV {fmt(row.get('pkv_step_eff'), '.2f')}"
            f"{'' if row.get('ok') else '  <-- ' + '; '.join(row.get('problems', []))} ({dt:.1f} s)")
        if time.perf_counter() - last_write > 30:
            write_outputs(args.out, dict(meta, partial=True, elapsed_s=time.perf_counter() - t_start), rows)
            last_write = time.perf_counter()
    if args.repeat_procs > 0 and "device_error" not in meta:
        write_outputs(args.out, dict(meta, partial=True, elapsed_s=time.perf_counter() - t_start), rows)
        gpu.flat = None  # the children allocate their own buffers
        gpu.fi_wrappers.clear()
        gpu.pkv_wrappers.clear()
        torch.cuda.empty_cache()
        meta["repeats"] = run_repeats(args, None if budget is None else t_start + budget)
    meta.update(truncated=bool(skipped), skipped=skipped, elapsed_s=time.perf_counter() - t_start)
    write_outputs(args.out, meta, rows)
    log(f"wrote {args.out / 'compare.json'} and {args.out / 'compare.md'} ({meta['elapsed_s']:.0f} s)")
    print(short_table(meta, rows))
    bad = sum(1 for r in rows if not r.get("ok", True))
    if bad:
        log(f"{bad} rows disagree or failed (see compare.md)")
    return 1 if bad or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
