#!/usr/bin/env python3
"""e2e_flashinfer.py - the end-to-end decode loop with FlashInfer's attention beside ours, in one process (issue 36).

A Llama-style decoder in torch (bf16, random weights) decodes a continuous batch of B requests over a paged KV
cache.  Every step runs once per attention library - PersistentKV (the headline: its Python wrapper, plan per
step, route auto) and each FlashInfer decode path - on the same state: the same weights, the same pages, the same
input tokens, the same GEMMs (torch, cuBLAS) and element-wise ops; only the attention calls (and each library's own
append of the step's K/V, see --append) differ.  Reported per (trace family, B): tokens/s of each loop, FlashInfer's
best path, the ratio ours / FlashInfer's best, attention's share of the step, and the agreement of the loops'
logits and greedy tokens.  Writes e2e.json (every number), e2e.md (the table) and e2e.png (when matplotlib imports).

One step, per loop (the order of the loops rotates from step to step: ABAB):
  host      plan attention once for the step (PersistentKV: BatchDecodeWithPagedKVCacheWrapper.plan from the host
            table, route auto; FlashInfer's decode wrapper: plan(indptr host, indices device, last_page_len host);
            XQA: the padded block table built on the host and copied)
  device    embedding; per layer: RMSNorm, the fused QKV GEMM, RoPE in place on q and k (the interleaved, complex
            form of Meta's Llama code), the step's K and V appended into the layer's pages, attention reading q in
            place from the QKV output, the O GEMM, the residual, RMSNorm, the gate/up GEMM, SwiGLU, the down GEMM,
            the residual; then the final RMSNorm, the LM head over the vocabulary and the greedy argmax
  timing    host clock around the whole step between two torch.cuda.synchronize() (wall time: launches, host plan,
            Python overhead and the GPU's work); every other measured step also has CUDA events around each
            attention and append call (attention's share of that step: summed attention events / its wall time).
            tokens/s = B / the median wall time of the steps without events (events between kernels stop PDL's
            overlap, so those steps are not used for throughput)

The trace (workloads.md): B rows kept full - when a request has produced its decode tokens it leaves and the next
request of the trace takes its row in the next step.  Requests come from the lab's generator
(persistentkv.generate_trace: uniform, bimodal, zipf, bucketed, homogeneous) or from `long` (defined here: prompt
U[32768, 130944] rounded up to 16, decode U[32, 96]; contexts up to 128K).  The first B requests start at a random
point of their decode (a server's rows are of different ages).  Prefill is synthetic and not timed: a request's
prompt pages hold whatever the pool holds (random values filled at the cell's start, or an earlier request's); the
decode steps that follow read and write real bytes of the right sizes.

Pages: PersistentKV's page manager (persistentkv.PagePool) hands out the page ids, mapped through a seeded random
permutation of the pool (pages scattered as in a long-running server); one table per step, the same for every
loop.  Each layer has its own K and V pools (page 16, NHD) when they fit in the GPU's memory; a cell whose pools do
not fit lets layers l, l + P, l + 2P, ... share pool l (P as large as fits, reported per cell; --no-pool-sharing
skips such cells instead).  Sharing does not let a layer find another's pages in L2: between two attention calls
the GEMMs stream a layer's weights (436 MB at Llama-3-8B's shape) through the 50 MB L2.

Agreement: at a cell's first step every loop starts from the same state, so its logits are compared with ours
(relative L2 over [B, vocab]); at every step each loop's greedy tokens are compared with ours (the loops are all
fed our tokens).  Random weights give nearly flat logits (margins of a few bf16 steps), so a few flips are
expected; a loop whose first-step logits differ by more than --tol is flagged and not counted as FlashInfer's best.

Usage:
  python3 bench/e2e_flashinfer.py --out DIR [--layers 8] [--families uniform,bimodal,zipf,long] [--batches 1,8,...]
  python3 bench/e2e_flashinfer.py --dry-run [--out DIR]     # CPU: tiny model, our CPU backend, torch stand-in
  python3 bench/e2e_flashinfer.py --plan-only               # the cells, their memory and pool sharing; no GPU
  python3 bench/e2e_flashinfer.py --jit-warmup-only         # compile FlashInfer's modules for the paths, then exit
On the GPU machine bench/run_e2e.sh installs FlashInfer, builds the library and runs this.
Environment: PKV_LIBRARY (the CUDA build of libpersistentkv; the lab library next to it), PKV_COMMIT.
"""

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "python", REPO / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import compare_flashinfer as cf  # noqa: E402  (stdlib only at import: SplitMix64, padded_block_table, jit_one)

# ---- model shapes ----------------------------------------------------------------------------------------------
MODELS = {  # as model/pkv_model.h's shapes
    "llama3-8b": dict(layers=32, hidden=4096, q_heads=32, kv_heads=8, head_dim=128, mlp=14336, vocab=128256,
                      rope_theta=500000.0, rms_eps=1e-5),
    "tiny": dict(layers=2, hidden=256, q_heads=4, kv_heads=2, head_dim=64, mlp=512, vocab=1024,
                 rope_theta=10000.0, rms_eps=1e-5),  # the dry run (CPU)
}
LAB_FAMILIES = ("uniform", "bimodal", "zipf", "bucketed", "homogeneous")
FAMILIES = LAB_FAMILIES + ("long",)
LONG_PROMPT = (32768, 131072 - 128)  # the `long` family: prompt U[...] rounded up to 16, decode U[32, 96]
LONG_DECODE = (32, 96)
MIN_DECODE = 8  # the shortest decode of any family (bimodal, zipf): bounds the requests a row needs
PATHS = ("pkv", "fi_tensorcore", "fi_cudacore", "fi_xqa", "torch_ref")
PATH_LABELS = {
    "pkv": "PersistentKV: BatchDecodeWithPagedKVCacheWrapper, plan per step, route auto",
    "fi_tensorcore": "FlashInfer: BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True), plan per step",
    "fi_cudacore": "FlashInfer: BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=False), plan per step",
    "fi_xqa": "FlashInfer: trtllm_batch_decode_with_kv_cache(backend='xqa'), block table per step",
    "torch_ref": "torch: per-row float32 attention over the gathered pages (the dry run's stand-in for FlashInfer)",
}
SHORT = {"pkv": "ours", "fi_tensorcore": "TC", "fi_cudacore": "CC", "fi_xqa": "XQA", "torch_ref": "torch"}
JIT_KIND = {"fi_tensorcore": "tensorcore", "fi_cudacore": "cudacore", "fi_xqa": "xqa"}
LONG_CTX = 16384  # cells whose mean context is at least this are the long-context cells of the geomean
HBM_BPS = 2.5e12  # for the time estimate of a cell only


def log(msg):
    print(f"[e2e] {msg}", file=sys.stderr, flush=True)


# ---- requests and the continuous batch ------------------------------------------------------------------------
def round_up(x, m):
    return (x + m - 1) // m * m


def family_requests(family, seed, B, n, page_size, ctx_scale):
    """[(prompt, decode)] * n for the family: the lab's generator for its families, `long` here.  ctx_scale > 1
    divides the prompt lengths (the dry run's small contexts)."""
    if family in LAB_FAMILIES:
        import persistentkv as pkv
        t = pkv.generate_trace(family, seed, max_active=B, num_requests=n, page_size=page_size)
        reqs = [t.request(i) for i in range(n)]
    elif family == "long":
        r = cf.SplitMix64(seed ^ 0x6C6F6E67)
        reqs = []
        for _ in range(n):
            p = round_up(r.uniform_int(*LONG_PROMPT), 16)
            reqs.append((p, r.uniform_int(*LONG_DECODE)))
    else:
        raise ValueError(f"unknown family {family!r} (one of {', '.join(FAMILIES)})")
    if ctx_scale > 1:
        reqs = [(max(page_size, round_up(-(-p // ctx_scale), page_size)), d) for p, d in reqs]
    return reqs


class Schedule:
    """The continuous batch: B rows, each a live request (its context length and decode tokens left); a request
    that has produced its decode tokens leaves after the step and the next request takes its row.  The first B
    requests start at a random point of their decode.  Pure host logic, run twice: once without pages (simulate:
    the pool size, mean context and requests needed) and once with PersistentKV's page manager."""

    def __init__(self, reqs, B, seed, pool=None):
        self.reqs, self.B, self.pool = reqs, B, pool
        self.rng = cf.SplitMix64(seed * 7919 + B)
        self.rows, self.ctx, self.left = [], [], []
        self.next_req = 0
        self.first_tokens = []  # (row, token) of requests that arrived since the last call of take_arrivals
        for row in range(B):
            self._arrive(row, staggered=True)

    def _arrive(self, row, staggered):
        if self.next_req >= len(self.reqs):
            raise RuntimeError("the trace ran out of requests (raise the request count)")
        req = self.next_req
        self.next_req += 1
        prompt, dec = self.reqs[req]
        done = self.rng.uniform_int(0, dec - 1) if staggered else 0
        ctx, left = prompt + done, dec - done
        if self.pool is not None:
            self.pool.create(req, ctx)
        if row == len(self.rows):
            self.rows.append(req), self.ctx.append(ctx), self.left.append(left)
        else:
            self.rows[row], self.ctx[row], self.left[row] = req, ctx, left
        self.first_tokens.append((row, self.rng.next()))

    def extend(self):
        """Each row grows by the step's token (the page manager gives it a slot)."""
        for i, req in enumerate(self.rows):
            self.ctx[i] += 1
            if self.pool is not None:
                self.pool.extend(req, 1)

    def retire(self):
        """After the step: requests with no decode tokens left leave; the next ones take their rows."""
        for i, req in enumerate(self.rows):
            self.left[i] -= 1
            if self.left[i] <= 0:
                if self.pool is not None:
                    self.pool.free(req)
                self._arrive(i, staggered=False)

    def take_arrivals(self):
        out, self.first_tokens = self.first_tokens, []
        return out


def simulate(reqs, B, seed, steps, page_size):
    """(peak pages in flight, mean context over the steps, max context, requests used) of `steps` steps."""
    s = Schedule(reqs, B, seed)
    peak, ctx_sum, ctx_max = 0, 0.0, 0
    for _ in range(steps):
        s.extend()
        peak = max(peak, sum(-(-c // page_size) for c in s.ctx))
        ctx_sum += sum(s.ctx) / B
        ctx_max = max(ctx_max, max(s.ctx))
        s.retire()
    return peak, ctx_sum / steps, ctx_max, s.next_req


# ---- the model ------------------------------------------------------------------------------------------------
# Random weights: normal, std gain / sqrt(fan_in) (norms 1, embedding std 1), the gains chosen so that attention
# matters to the output: q 4x the std of k and v (std 1, as the random cache), so that the softmax over the random
# cache is peaked rather than flat (a flat one averages the values of 20K random tokens to ~0 and attention would
# not move the residual stream, nor any difference between two attention libraries show in the logits); the O
# projection 4 (the attention output is a weighted mean, smaller than its values); the LM head 4 (logits of std 4:
# greedy margins above bf16's resolution more often).
GAINS = {"q": 4.0, "kv": 1.0, "o": 4.0, "gate_up": 1.0, "down": 1.0, "lm": 4.0}
KV_FILL_STD = 1.0  # the synthetic prefill's K and V: the std of the projections' k and v


class Model:
    """Random bf16 weights of a Llama-style decoder (GAINS) and its step, with the attention library as a
    parameter.  Every op but the attention and the append is the same code for every library."""

    def __init__(self, torch, shape, layers, device, seed):
        self.t, self.dev = torch, device
        s = self.s = dict(shape, layers=layers)
        H, Hq, Hkv, d, M, V = s["hidden"], s["q_heads"], s["kv_heads"], s["head_dim"], s["mlp"], s["vocab"]
        self.H, self.Hq, self.Hkv, self.d, self.M, self.V, self.L = H, Hq, Hkv, d, M, V, layers
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        bf = torch.bfloat16

        def w(rows, fan_in, gain):
            return torch.empty(rows, fan_in, dtype=bf, device=device).normal_(0.0, gain / math.sqrt(fan_in),
                                                                              generator=g)

        self.embed = w(V, H, math.sqrt(H))  # std 1
        self.layers = []
        for _ in range(layers):
            qkv = torch.cat([w(Hq * d, H, GAINS["q"]), w(2 * Hkv * d, H, GAINS["kv"])])
            self.layers.append(dict(ln1=torch.ones(H, dtype=bf, device=device), qkv=qkv,
                                    o=w(H, Hq * d, GAINS["o"]), ln2=torch.ones(H, dtype=bf, device=device),
                                    gu=w(2 * M, H, GAINS["gate_up"]), down=w(H, M, GAINS["down"])))
        self.norm = torch.ones(H, dtype=bf, device=device)
        self.lm = w(V, H, GAINS["lm"])
        self.inv_freq = 1.0 / (s["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
        self.weight_bytes = sum(x.numel() * 2 for x in [self.embed, self.lm, self.norm] +
                                [v for lw in self.layers for v in lw.values()])

    @staticmethod
    def layer_weight_bytes(s):
        H, d = s["hidden"], s["head_dim"]
        return 2 * (H * (s["q_heads"] + 2 * s["kv_heads"]) * d + H * s["q_heads"] * d + 3 * H * s["mlp"] + 2 * H)

    @staticmethod
    def total_weight_bytes(s, layers):
        return layers * Model.layer_weight_bytes(s) + 2 * (2 * s["vocab"] * s["hidden"] + s["hidden"])

    def rms_norm(self, x, w):
        return self.t.nn.functional.rms_norm(x, (self.H,), w, self.s["rms_eps"])

    def rope_cis(self, pos):
        """cos + i sin of each row's position [B, 1, d/2] (complex64), once per step for every layer."""
        t = self.t
        ang = pos.to(t.float32)[:, None] * self.inv_freq[None, :]
        return t.polar(t.ones_like(ang), ang).unsqueeze(1)

    def rope_(self, qkv, cis):
        """RoPE in place on the q and k parts of the fused QKV output [B, (Hq + 2 Hkv) d] (pairs (2i, 2i + 1))."""
        t = self.t
        nqk = self.Hq + self.Hkv
        qk = qkv[:, :nqk * self.d].unflatten(1, (nqk, self.d // 2, 2))
        qk.copy_(t.view_as_real(t.view_as_complex(qk.float()) * cis))

    def step(self, eng, tabs, tokens, pools, out, timer):
        """One decode step of the batch through every layer with engine eng's attention: (logits, next tokens)."""
        t, F = self.t, self.t.nn.functional
        B, Hq, Hkv, d = tabs.B, self.Hq, self.Hkv, self.d
        x = F.embedding(tokens, self.embed)                               # [B, H]
        cis = self.rope_cis(tabs.pos_dev)
        for li, lw in enumerate(self.layers):
            kc, vc = pools[li % len(pools)]
            h = self.rms_norm(x, lw["ln1"])
            qkv = F.linear(h, lw["qkv"])                                   # [B, (Hq + 2 Hkv) d]
            self.rope_(qkv, cis)
            q = qkv[:, :Hq * d].view(B, Hq, d)                             # views: rows (Hq + 2 Hkv) d apart
            k = qkv[:, Hq * d:(Hq + Hkv) * d].view(B, Hkv, d)
            v = qkv[:, (Hq + Hkv) * d:].view(B, Hkv, d)
            timer.begin("append")
            eng.append(k, v, kc, vc, tabs)
            timer.end("append")
            timer.begin("attention")
            eng.attend(q, kc, vc, out, tabs)                               # out [B, Hq, d]
            timer.end("attention")
            x.add_(F.linear(out.view(B, Hq * d), lw["o"]))
            h = self.rms_norm(x, lw["ln2"])
            gu = F.linear(h, lw["gu"])                                     # [B, 2 M]: gate, up
            x.add_(F.linear(F.silu(gu[:, :self.M]) * gu[:, self.M:], lw["down"]))
        logits = F.linear(self.rms_norm(x, self.norm), self.lm)            # [B, V]
        return logits, logits.argmax(dim=-1)


# ---- the attention engines ------------------------------------------------------------------------------------
class Engine:
    """One attention library in the loop: plan(tabs) once per step, append and attend once per layer."""
    path = None

    def __init__(self, ctx):
        self.ctx = ctx
        self.name = self.path
        self.label = PATH_LABELS[self.path]
        self.notes = []
        self.failed = None

    def setup_cell(self, cell):
        pass

    def plan(self, tabs):
        pass

    def append(self, k, v, kc, vc, tabs):
        """The step's K and V [B, Hkv, d] (rows strided) into their slots; --append pkv: ours for every engine."""
        if self.ctx.args.append == "pkv":
            return pkv_append(self.ctx, k, v, kc, vc, tabs)
        return self.own_append(k, v, kc, vc, tabs)

    def own_append(self, k, v, kc, vc, tabs):
        return pkv_append(self.ctx, k, v, kc, vc, tabs)

    def attend(self, q, kc, vc, out, tabs):
        raise NotImplementedError

    def info(self):
        return {}


def pkv_append(ctx, k, v, kc, vc, tabs):
    import persistentkv as pkv
    if ctx.cuda:
        pkv.append_kv(k, v, (kc, vc), tabs.indptr_dev, tabs.indices_dev, kv_last_page_len=tabs.last_dev)
    else:
        pkv.append_kv(k, v, (kc, vc), tabs.indptr, tabs.indices, kv_last_page_len=tabs.last)


class PkvEngine(Engine):
    path = "pkv"

    def __init__(self, ctx):
        super().__init__(ctx)
        import persistentkv as pkv
        self.w = pkv.BatchDecodeWithPagedKVCacheWrapper(kv_layout="NHD", backend="cuda" if ctx.cuda else "cpu")
        self.routes = {}

    def setup_cell(self, cell):
        self.routes = {}

    def plan(self, tabs):
        m = self.ctx.model
        # host tables: the plan copies the page ids to the device once (its run reads that copy)
        self.w.plan(tabs.indptr, tabs.indices, tabs.lens, m.Hq, m.Hkv, m.d, tabs.page_size, num_pages=tabs.num_pages,
                    q_data_type="bfloat16", route=self.ctx.args.route)
        r = self.w.route
        self.routes[r] = self.routes.get(r, 0) + 1

    def attend(self, q, kc, vc, out, tabs):
        self.w.run(q, kc, vc, out=out)

    def info(self):
        return {"routes": dict(self.routes), "device": self.w.device_name}


class FiEngine(Engine):
    """FlashInfer's paths.  q is handed as the strided view of the QKV output when the path takes it (checked on
    the cell's first step against a contiguous copy); otherwise a contiguous copy is made, inside the timing."""

    def __init__(self, ctx):
        super().__init__(ctx)
        import flashinfer
        self.fi = flashinfer
        self.strided_q = None  # decided on the first call

    def own_append(self, k, v, kc, vc, tabs):
        self.fi.page.append_paged_kv_cache(k, v, tabs.bidx_dev, tabs.pos_dev, (kc, vc), tabs.indices_dev,
                                           tabs.indptr_dev, tabs.last_dev, kv_layout="NHD")

    def attend(self, q, kc, vc, out, tabs):
        # decided at the first call of more than one row: a single row reads the same whatever the row stride, so
        # a probe at B = 1 cannot see a path that ignores it (XQA's did, and its later cells read other rows' q)
        if self.strided_q is None and tabs.B > 1:
            self.strided_q = self._probe_strided(q, kc, vc, out, tabs)
            return
        self._run(q if self.strided_q is not False else q.contiguous(), kc, vc, out, tabs)

    def _probe_strided(self, q, kc, vc, out, tabs):
        t = self.ctx.torch
        ref = t.empty_like(out)
        self._run(q.contiguous(), kc, vc, ref, tabs)
        try:
            self._run(q, kc, vc, out, tabs)
            t.cuda.synchronize()
            err = rel_l2(t, out, ref)
            ok = err <= 1e-3  # a misread stride gives another row's or head's values: far above this
            why = "" if ok else f"its output differs from the contiguous copy's by {err:.2e} (rel L2)"
        except Exception as e:  # the path refuses strided q: copies it (counted in its time)
            ok, why = False, f"{type(e).__name__}: {str(e)[:200]}"
        if not ok:
            out.copy_(ref)  # the layer goes on with the contiguous call's output
            self.notes.append(f"q copied to a contiguous tensor before each call (strided q: {why})")
        else:
            self.notes.append("q read in place from the QKV output (strided rows)")
        return ok


class FiDecodeEngine(FiEngine):
    def __init__(self, ctx, tensor_cores):
        self.path = "fi_tensorcore" if tensor_cores else "fi_cudacore"
        super().__init__(ctx)
        t = ctx.torch
        ws = t.zeros(ctx.args.fi_workspace_mb << 20, dtype=t.uint8, device=ctx.dev)
        self.w = self.fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tensor_cores)

    def plan(self, tabs):
        m, t = self.ctx.model, self.ctx.torch
        self.w.plan(tabs.indptr_host_t, tabs.indices_dev, tabs.last_host_t, m.Hq, m.Hkv, m.d, tabs.page_size,
                    q_data_type=t.bfloat16, kv_data_type=t.bfloat16)

    def _run(self, q, kc, vc, out, tabs):
        self.w.run(q, (kc, vc), out=out)


class FiXqaEngine(FiEngine):
    path = "fi_xqa"

    def __init__(self, ctx):
        super().__init__(ctx)
        t = ctx.torch
        self.ws = t.zeros(ctx.args.fi_workspace_mb << 20, dtype=t.uint8, device=ctx.dev)  # first 8 MB: semaphores
        self.bt = None
        self.max_len = 0

    def plan(self, tabs):
        # what a caller of this API does per step: the padded [B, max pages] block table, copied to the device
        self.bt = self.ctx.torch.from_numpy(cf.padded_block_table(tabs.indptr, tabs.indices)).to(self.ctx.dev)
        self.max_len = int(tabs.lens.max())

    def _run(self, q, kc, vc, out, tabs):
        self.fi.decode.trtllm_batch_decode_with_kv_cache(
            q, (kc, vc), self.ws, self.bt, tabs.lens_dev, self.max_len, bmm1_scale=1.0 / math.sqrt(self.ctx.model.d),
            bmm2_scale=1.0, window_left=-1, out=out, kv_layout="NHD", backend="xqa")


class TorchRefEngine(Engine):
    """Attention and append in plain torch (float32 softmax, row by row): the dry run's second loop."""
    path = "torch_ref"

    def own_append(self, k, v, kc, vc, tabs):
        kc.view(-1, *kc.shape[2:]).index_copy_(0, tabs.slots_t, k)
        vc.view(-1, *vc.shape[2:]).index_copy_(0, tabs.slots_t, v)

    def attend(self, q, kc, vc, out, tabs):
        t, m = self.ctx.torch, self.ctx.model
        G = m.Hq // m.Hkv
        for b in range(tabs.B):
            idx = tabs.indices_t[int(tabs.indptr[b]):int(tabs.indptr[b + 1])]
            n = int(tabs.lens[b])
            K = kc[idx].reshape(-1, m.Hkv, m.d)[:n].float()
            V = vc[idx].reshape(-1, m.Hkv, m.d)[:n].float()
            s = t.einsum("hgd,nhd->hgn", q[b].float().view(m.Hkv, G, m.d), K) / math.sqrt(m.d)
            out[b] = t.einsum("hgn,nhd->hgd", t.softmax(s, dim=-1), V).reshape(m.Hq, m.d).to(out.dtype)


def make_engine(ctx, path):
    if path == "pkv":
        return PkvEngine(ctx)
    if path in ("fi_tensorcore", "fi_cudacore"):
        return FiDecodeEngine(ctx, tensor_cores=(path == "fi_tensorcore"))
    if path == "fi_xqa":
        return FiXqaEngine(ctx)
    if path == "torch_ref":
        return TorchRefEngine(ctx)
    raise ValueError(path)


# ---- timing ---------------------------------------------------------------------------------------------------
class Timer:
    """Per-part time of one step: CUDA events around each call (evented steps on the GPU), the host clock on the
    CPU (its ops are synchronous), nothing otherwise."""

    def __init__(self, torch, cuda, on):
        self.t, self.cuda, self.on = torch, cuda, on
        self.open, self.pairs = {}, []

    def _stamp(self):
        """Now: a recorded CUDA event, or the host clock."""
        if not self.cuda:
            return time.perf_counter()
        e = self.t.cuda.Event(enable_timing=True)
        e.record()
        return e

    def begin(self, part):
        if self.on:
            self.open[part] = self._stamp()

    def end(self, part):
        if self.on:
            self.pairs.append((part, self.open.pop(part), self._stamp()))

    def totals_ms(self):
        out = {}
        for part, a, b in self.pairs:
            ms = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
            out[part] = out.get(part, 0.0) + ms
        return out


def sync(ctx):
    if ctx.cuda:
        ctx.torch.cuda.synchronize()


# ---- one cell -------------------------------------------------------------------------------------------------
def step_tables(ctx, sched, pool, perm, page_size, num_pages):
    """The step's page table, host and device (shared by every loop; built before the loops' timing)."""
    import numpy as np
    t = ctx.torch
    indptr, indices, last, lens = pool.table(sched.rows)
    indices = perm[indices]                       # pages scattered over the pool
    tabs = types.SimpleNamespace(B=len(lens), indptr=indptr, indices=indices, last=last, lens=lens,
                                 page_size=page_size, num_pages=num_pages)
    pos = (lens - 1).astype(np.int32)             # the new token's position
    dev = ctx.dev
    tabs.indptr_host_t, tabs.last_host_t = t.from_numpy(indptr), t.from_numpy(last)
    if ctx.cuda:
        tabs.indptr_dev = tabs.indptr_host_t.to(dev)
        tabs.indices_dev = t.from_numpy(indices).to(dev)
        tabs.last_dev = tabs.last_host_t.to(dev)
        tabs.lens_dev = t.from_numpy(lens).to(dev)
        tabs.pos_dev = t.from_numpy(pos).to(dev)
        tabs.bidx_dev = t.arange(len(lens), dtype=t.int32, device=dev)
    else:
        tabs.pos_dev = t.from_numpy(pos)
    if ctx.torch_tables:  # the torch stand-in's gather and scatter
        tabs.indices_t = t.from_numpy(indices.astype(np.int64)).to(dev)
        page = indices[indptr[:-1] + pos // page_size].astype(np.int64)
        tabs.slots_t = t.from_numpy(page * page_size + pos % page_size).to(dev)
    return tabs


def rel_l2(t, a, b):
    a, b = a.double(), b.double()
    den = b.norm().item()
    return (a - b).norm().item() / den if den > 0 else (a - b).norm().item()


def median(xs):
    return statistics.median(xs) if xs else None


def run_cell(ctx, engines, family, B, plan):
    """Runs one cell's steps on every engine; returns the cell's row."""
    import numpy as np
    import persistentkv as pkv
    t, args, m = ctx.torch, ctx.args, ctx.model
    ps = args.page_size
    row = dict(plan)
    t_cell = time.perf_counter()
    num_pages, P = plan["num_pages"], plan["kv_pools"]
    page_elems = ps * m.Hkv * m.d
    # the pools: one buffer, P (K, V) pairs of [num_pages, page, Hkv, d], random values (the synthetic prefill)
    if ctx.cuda:
        t.cuda.empty_cache()
    flat = t.empty(P * 2 * num_pages * page_elems, dtype=t.bfloat16, device=ctx.dev)
    g = t.Generator(device=ctx.dev)
    g.manual_seed(args.seed + B)
    flat.normal_(0.0, KV_FILL_STD, generator=g)
    views = flat.view(P, 2, num_pages, ps, m.Hkv, m.d)
    pools = [(views[i, 0], views[i, 1]) for i in range(P)]
    pool = pkv.PagePool(num_pages=num_pages, page_size=ps, max_requests=plan["requests"])
    perm = np.random.default_rng(args.seed + 1000 * B).permutation(num_pages).astype(np.int32)
    sched = Schedule(plan["reqs"], B, args.seed, pool)
    tokens = t.zeros(B, dtype=t.int64, device=ctx.dev)
    out = t.empty(B, m.Hq, m.d, dtype=t.bfloat16, device=ctx.dev)
    for e in engines:
        e.setup_cell(row)
    live = [e for e in engines if e.failed is None]
    stats = {e.path: dict(wall=[], wall_evented=[], host=[], plan=[], attention=[], append=[], share=[])
             for e in engines}
    agree = {e.path: [0, 0] for e in engines}
    first_logits, table_ms, ctx_means = {}, [], []
    total = args.warmup + args.steps
    stopped = None
    for s in range(total):
        if ctx.deadline and time.time() > ctx.deadline and s >= args.warmup + 2:
            stopped = f"time limit after {s - args.warmup} measured steps"
            break
        arrivals = sched.take_arrivals()
        if arrivals:
            rows = t.tensor([r for r, _ in arrivals], dtype=t.int64)
            toks = t.tensor([x % m.V for _, x in arrivals], dtype=t.int64)
            tokens[rows.to(ctx.dev)] = toks.to(ctx.dev)
        th = time.perf_counter()
        sched.extend()
        tabs = step_tables(ctx, sched, pool, perm, ps, num_pages)
        sync(ctx)
        table_ms.append((time.perf_counter() - th) * 1e3)
        ctx_means.append(float(tabs.lens.mean()))
        measured = s >= args.warmup
        evented = measured and (s - args.warmup) % 2 == 1
        k = s % len(live)
        order = live[k:] + live[:k]                  # ABAB: the loops' order rotates every step
        nxt = {}
        for e in order:
            timer = Timer(t, ctx.cuda, evented or not ctx.cuda)
            try:
                sync(ctx)
                t0 = time.perf_counter()
                e.plan(tabs)
                t1 = time.perf_counter()
                logits, nt = m.step(e, tabs, tokens, pools, out, timer)
                t2 = time.perf_counter()
                sync(ctx)
                t3 = time.perf_counter()
            except Exception as ex:  # a path that fails is recorded and left out of the later steps
                e.failed = f"step {s}: {type(ex).__name__}: {str(ex)[:400]}"
                log(f"{e.path} failed at {family} B{B} step {s}: {e.failed}")
                if ctx.cuda:
                    try:
                        t.cuda.synchronize()
                    except Exception as ex2:  # a sticky CUDA error: nothing more can run in this process
                        raise RuntimeError(f"CUDA error after {e.path} failed: {ex2}") from ex
                continue
            nxt[e.path] = nt
            if s == 0:
                first_logits[e.path] = logits.float() if e.path == "pkv" else logits
            st = stats[e.path]
            st["plan"].append((t1 - t0) * 1e3)
            if measured:
                parts = timer.totals_ms()
                wall = (t3 - t0) * 1e3
                if evented or not ctx.cuda:
                    st["wall_evented"].append(wall)
                    st["attention"].append(parts.get("attention", 0.0))
                    st["append"].append(parts.get("append", 0.0))
                    st["share"].append(parts.get("attention", 0.0) / wall)
                if not evented:
                    st["wall"].append(wall)
                    st["host"].append((t2 - t0) * 1e3)
        live = [e for e in live if e.failed is None]
        if "pkv" not in nxt:
            raise RuntimeError(f"PersistentKV's loop failed: {engines[0].failed}")
        if s == 0:
            for path, lg in first_logits.items():
                if path != "pkv":
                    row.setdefault("logits_rel_l2", {})[path] = rel_l2(t, lg, first_logits["pkv"])
        for path, nt in nxt.items():
            agree[path][0] += int((nt == nxt["pkv"]).sum().item())
            agree[path][1] += B
        tokens = nxt["pkv"]
        sched.retire()
    del flat, views, pools
    if ctx.cuda:
        t.cuda.empty_cache()
    row["measured_steps"] = (s - args.warmup) if stopped else args.steps
    if stopped:
        row["stopped"] = stopped
    row["mean_ctx_run"] = statistics.fmean(ctx_means[args.warmup:] or ctx_means)
    row["table_ms"] = median(table_ms)
    row["cell_s"] = time.perf_counter() - t_cell
    loops = {}
    for e in engines:
        st = stats[e.path]
        wall = median(st["wall"])
        if wall is None:
            loops[e.path] = {"failed": e.failed or "no measured step", "label": e.label}
            continue
        loops[e.path] = {
            "label": e.label, "tokens_per_s": B / (wall / 1e3), "step_ms": wall, "host_enqueue_ms": median(st["host"]),
            "plan_ms": median(st["plan"]), "attention_ms": median(st["attention"]), "append_ms": median(st["append"]),
            "attention_share": median(st["share"]), "step_ms_evented": median(st["wall_evented"]),
            "steps_wall": st["wall"], "token_agreement": agree[e.path][0] / agree[e.path][1] if agree[e.path][1] else None,
            "notes": list(e.notes), **e.info()}
        if e.failed:
            loops[e.path]["failed_later"] = e.failed
    row["loops"] = loops
    best = None
    for path, lp in loops.items():
        if path == "pkv" or "tokens_per_s" not in lp:
            continue
        err = row.get("logits_rel_l2", {}).get(path)
        lp["agrees"] = err is not None and err <= args.tol
        if lp["agrees"] and (best is None or lp["tokens_per_s"] > loops[best]["tokens_per_s"]):
            best = path
    row["other_best"] = best
    ours = loops.get("pkv", {})
    if best and "tokens_per_s" in ours:
        row["ratio"] = ours["tokens_per_s"] / loops[best]["tokens_per_s"]
        for path, lp in loops.items():
            if path != "pkv" and "tokens_per_s" in lp:
                lp["ratio_ours_over"] = ours["tokens_per_s"] / lp["tokens_per_s"]
    row["status"] = "ok" if best else "no agreeing comparison loop"
    row.pop("reqs", None)
    return row


# ---- the cells ------------------------------------------------------------------------------------------------
def plan_cells(args, shape, budget_bytes):
    """Every (family, B) cell with its requests, pool size, mean context and KV pool sharing, or why it is
    skipped; no GPU needed."""
    ps = args.page_size
    total = args.warmup + args.steps
    kv_token = 2 * shape["kv_heads"] * shape["head_dim"] * 2   # K and V bytes of a token in one layer
    lw = Model.layer_weight_bytes(shape)
    cells = []
    for family in args.families:
        for B in args.batches:
            n = B * (2 + -(-total // MIN_DECODE)) + 8
            reqs = family_requests(family, args.seed, B, n, ps, args.ctx_scale)
            peak, mean_ctx, max_ctx, used = simulate(reqs, B, args.seed, total, ps)
            # the simulated peak, plus the largest request's pages: an arrival in a step the simulation's count
            # does not reach must not find the pool exhausted
            num_pages = peak + max(-(-(p + d) // ps) for p, d in reqs[:used + B]) + B + 16
            pool_bytes = num_pages * ps * kv_token
            P = min(args.layers, budget_bytes // pool_bytes) if budget_bytes is not None else args.layers
            c = dict(family=family, B=B, seed=args.seed, requests=used, reqs=reqs[:used], num_pages=num_pages,
                     mean_ctx=mean_ctx, max_ctx=max_ctx, kv_pools=int(P), pool_gib=pool_bytes / 2**30,
                     kv_gib=P * pool_bytes / 2**30, kv_gib_per_layer_step=mean_ctx * B * kv_token / 2**30)
            if P < 1:
                c["skip"] = (f"the K/V pool of one layer ({pool_bytes / 2**30:.1f} GiB) does not fit the "
                             f"{budget_bytes / 2**30:.1f} GiB left for KV")
            elif P < args.layers and args.no_pool_sharing:
                c["skip"] = (f"{args.layers} layers' pools ({args.layers * pool_bytes / 2**30:.1f} GiB) do not fit "
                             f"the {budget_bytes / 2**30:.1f} GiB left for KV (--no-pool-sharing)")
            # time estimate (s): every loop streams the step's KV and the weights once per step, plus launches
            step_s = (args.layers * (mean_ctx * B * kv_token + lw) + 2 * shape["vocab"] * shape["hidden"]) / HBM_BPS
            c["est_s"] = total * len(args.paths) * (step_s + 0.004 + args.layers * 4e-4) + P * pool_bytes / 5e11 + 2
            cells.append(c)
    return cells


def cell_plan_table(cells):
    lines = ["| family | B | requests | mean ctx | max ctx | pages/pool | KV pools | KV GiB | est s | skip |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for c in cells:
        lines.append(f"| {c['family']} | {c['B']} | {c['requests']} | {c['mean_ctx']:.0f} | {c['max_ctx']} | "
                     f"{c['num_pages']} | {c['kv_pools']} | {c['kv_gib']:.1f} | {c['est_s']:.0f} | "
                     f"{c.get('skip', '')} |")
    return "\n".join(lines)


# ---- outputs --------------------------------------------------------------------------------------------------
def fmt(x, spec=".1f", none="-"):
    return none if x is None else format(x, spec)


def geomean(v):
    v = [x for x in v if x and x > 0]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None


def summarize(rows):
    ok = [r for r in rows if r.get("ratio")]
    longc = [r for r in ok if r["mean_ctx_run"] >= LONG_CTX]
    return {"cells_run": len(ok), "geomean_ratio_all": geomean([r["ratio"] for r in ok]),
            "geomean_ratio_long_ctx": geomean([r["ratio"] for r in longc]), "long_ctx_cells": len(longc),
            "long_ctx_threshold": LONG_CTX,
            "first_logits_max_rel_l2": max((v for r in rows for v in r.get("logits_rel_l2", {}).values()),
                                           default=None),
            "cells_skipped": [f"{r['family']} B{r['B']}: {r['skip']}" for r in rows if r.get("skip")]}


def markdown(meta, rows):
    s = meta["summary"]
    other = "the torch stand-in" if meta["dry_run"] else "FlashInfer's best"
    L = [f"# End-to-end decode: PersistentKV against {'a torch stand-in (dry run)' if meta['dry_run'] else 'FlashInfer'}"
         f", one process", "",
         f"- {meta['device']}; torch {meta['torch']}; FlashInfer {meta.get('flashinfer') or '-'}; PersistentKV commit "
         f"{meta['commit']}; {meta['date']}",
         f"- model {meta['model']} shape with **{meta['layers']} layers** (of {meta['model_layers']}), random bf16 "
         f"weights; page {meta['page_size']}, NHD; {meta['warmup']} warm-up + {meta['steps']} measured steps per "
         f"cell; append: {meta['append']}; prefill synthetic, not timed",
         f"- command: `{meta['command']}`",
         f"- tokens/s = B / median wall time of a step (host clock between two synchronizes, plan included) over the "
         f"measured steps without CUDA events; attention share = CUDA-event time of the attention calls / wall time "
         f"of the same step (the other measured steps); ratio = ours / {other} (> 1: ours faster)",
         f"- **geomean ratio over the long-context cells (mean context >= {s['long_ctx_threshold']}): "
         f"{fmt(s['geomean_ratio_long_ctx'], '.3f')}** ({s['long_ctx_cells']} cells); over all "
         f"{s['cells_run']} cells {fmt(s['geomean_ratio_all'], '.3f')}; largest first-step logits rel L2 "
         f"{fmt(s['first_logits_max_rel_l2'], '.2e')}", ""]
    paths = [p for p in meta["paths"] if p != "pkv"]
    head = ("| family | B | mean ctx | KV pools | ours tok/s | " + " | ".join(f"{SHORT[p]} tok/s" for p in paths) +
            f" | best | **ratio** | step ms ours / best | attn share ours / best | host ms ours | "
            "logits rel L2 | tokens agree |")
    L += [head, "| --- | ---: | ---: | ---: | ---: | " + " | ".join(["---:"] * len(paths)) +
          " | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if r.get("skip"):
            L.append(f"| {r['family']} | {r['B']} | {r['mean_ctx']:.0f} | - | skipped: {r['skip']} |")
            continue
        lp = r.get("loops", {})
        ours = lp.get("pkv", {})
        best = r.get("other_best")
        bl = lp.get(best, {}) if best else {}

        def tps(p):
            x = lp.get(p, {})
            if "tokens_per_s" not in x:
                return "failed" if x.get("failed") else "-"
            return f"{x['tokens_per_s']:.1f}" + ("" if x.get("agrees", True) else " (disagrees)")
        err = r.get("logits_rel_l2", {}).get(best) if best else None
        agr = bl.get("token_agreement")
        L.append(f"| {r['family']} | {r['B']} | {r['mean_ctx_run']:.0f} | {r['kv_pools']} | {tps('pkv')} | " +
                 " | ".join(tps(p) for p in paths) +
                 f" | {SHORT.get(best, '-')} | **{fmt(r.get('ratio'), '.3f')}** | {fmt(ours.get('step_ms'), '.2f')} / "
                 f"{fmt(bl.get('step_ms'), '.2f')} | {fmt(_pct(ours.get('attention_share')))} / "
                 f"{fmt(_pct(bl.get('attention_share')))} | {fmt(ours.get('host_enqueue_ms'), '.2f')} | "
                 f"{fmt(err, '.2e')} | {fmt(_pct(agr))} |")
    L.append("")
    L.append("Attention shares in %; `host ms` = time to enqueue our step (when it nears the step time, the loop is "
             "bound by Python and launches, not the GPU); `KV pools` < layers: layers share pools (see the script's "
             "header).  Token agreement: greedy tokens equal to ours, every row of every step, all loops fed ours.")
    notes = [f"- {p}: {n}" for p, ns in meta.get("engine_notes", {}).items() for n in ns]
    if notes:
        L += ["", "Engines:"] + notes
    if s["cells_skipped"]:
        L += ["", "Skipped:"] + [f"- {x}" for x in s["cells_skipped"]]
    routes = {}
    for r in rows:
        for k, v in r.get("loops", {}).get("pkv", {}).get("routes", {}).items():
            routes[k] = routes.get(k, 0) + v
    if routes:
        L += ["", "Routes `auto` took (steps): " + ", ".join(f"{k} {v}" for k, v in sorted(routes.items()))]
    return "\n".join(L) + "\n"


def _pct(x):
    return None if x is None else 100.0 * x


def short_table(rows):
    L = ["family   B    ctx      ours tok/s   best tok/s (path)    ratio  attn% ours/best"]
    for r in rows:
        if r.get("skip"):
            L.append(f"{r['family']:<8} {r['B']:<4} {r['mean_ctx']:<8.0f} skipped: {r['skip']}")
            continue
        lp = r.get("loops", {})
        best = r.get("other_best")
        o, b = lp.get("pkv", {}), lp.get(best, {}) if best else {}
        L.append(f"{r['family']:<8} {r['B']:<4} {r['mean_ctx_run']:<8.0f} {fmt(o.get('tokens_per_s')):>10}   "
                 f"{fmt(b.get('tokens_per_s')):>10} ({SHORT.get(best, '-'):<5})  {fmt(r.get('ratio'), '.3f'):>6}  "
                 f"{fmt(_pct(o.get('attention_share')), '.0f')}/{fmt(_pct(b.get('attention_share')), '.0f')}")
    return "\n".join(L)


def plot(meta, rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plot")
        return False
    ok = [r for r in rows if r.get("ratio")]
    if not ok:
        return False
    fams = sorted({r["family"] for r in ok})
    colors = {f: plt.cm.tab10(i) for i, f in enumerate(fams)}
    fig, ax = plt.subplots(1, 3, figsize=(17, 5))
    for f in fams:
        rs = sorted((r for r in ok if r["family"] == f), key=lambda r: r["B"])
        Bs = [r["B"] for r in rs]
        ax[0].plot(Bs, [r["loops"]["pkv"]["tokens_per_s"] for r in rs], "o-", color=colors[f], label=f"{f} ours")
        ax[0].plot(Bs, [r["loops"][r["other_best"]]["tokens_per_s"] for r in rs], "x--", color=colors[f],
                   label=f"{f} other")
        for r in rs:
            x = r["mean_ctx_run"]
            ax[1].scatter([x], [100 * (r["loops"]["pkv"].get("attention_share") or 0)], marker="o", color=colors[f])
            ax[1].scatter([x], [100 * (r["loops"][r["other_best"]].get("attention_share") or 0)], marker="x",
                          color=colors[f])
            ax[1].annotate(f"B{r['B']}", (x, 100 * (r["loops"]["pkv"].get("attention_share") or 0)), fontsize=7)
            ax[2].scatter([x], [r["ratio"]], color=colors[f], s=12 + 3 * math.sqrt(r["B"]) * 4)
            ax[2].annotate(f"B{r['B']}", (x, r["ratio"]), fontsize=7)
    other = "torch stand-in" if meta["dry_run"] else "FlashInfer best"
    ax[0].set(xscale="log", yscale="log", xlabel="batch B", ylabel="tokens/s",
              title=f"tokens/s (o-: ours, x--: {other})")
    bs = sorted({r["B"] for r in ok})
    ax[0].set_xticks(bs, [str(b) for b in bs])
    ax[0].minorticks_off()
    ax[0].legend(fontsize=7, ncol=2)
    ax[1].set(xscale="log", xlabel="mean context (tokens)", ylabel="attention share of the step (%)",
              title="attention share (o: ours, x: other)")
    ax[2].axhline(1.0, color="gray", lw=0.8)
    ax[2].set(xscale="log", xlabel="mean context (tokens)", ylabel=f"tokens/s ours / {other}",
              title="ratio (> 1: ours faster; size ~ B)")
    fig.suptitle(f"{meta['model']} ({meta['layers']} layers) decode loop, {meta['device']}, commit {meta['commit']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_outputs(out, meta, rows, final=False):
    out.mkdir(parents=True, exist_ok=True)
    meta["summary"] = summarize(rows)
    (out / "e2e.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    (out / "e2e.md").write_text(markdown(meta, rows))
    if final and not meta.get("no_plot"):
        try:
            if plot(meta, rows, out / "e2e.png"):
                log(f"wrote {out / 'e2e.png'}")
        except Exception as e:  # a plot that fails leaves the tables
            log(f"plot failed: {type(e).__name__}: {e}")


# ---- JIT warm-up ----------------------------------------------------------------------------------------------
def jit_one(kind, args):
    """Child: compile and load one FlashInfer module by running a tiny problem on it."""
    t0 = time.perf_counter()
    if kind == "append":
        import torch
        import flashinfer
        dev = torch.device("cuda", 0)
        hkv, d = MODELS[args.model]["kv_heads"], MODELS[args.model]["head_dim"]
        kc = torch.zeros(4, args.page_size, hkv, d, dtype=torch.bfloat16, device=dev)
        k = torch.ones(1, hkv, d, dtype=torch.bfloat16, device=dev)
        i32 = dict(dtype=torch.int32, device=dev)
        flashinfer.page.append_paged_kv_cache(k, k, torch.zeros(1, **i32), torch.zeros(1, **i32), (kc, kc.clone()),
                                              torch.arange(1, **i32), torch.tensor([0, 1], **i32),
                                              torch.ones(1, **i32), kv_layout="NHD")
        torch.cuda.synchronize()
        print(f"[jit] append: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        return
    ns = types.SimpleNamespace(page_size=args.page_size, soft_cap=0.0, window_left=-1)
    s = MODELS[args.model]
    cf.jit_one(f"bf16,{s['head_dim']},{kind},{s['q_heads']},{s['kv_heads']}", "NHD", ns)


def jit_warmup(args):
    kinds = [JIT_KIND[p] for p in args.paths if p in JIT_KIND]
    if any(p.startswith("fi_") for p in args.paths) and args.append == "own":
        kinds.append("append")
    if not kinds:
        return 0.0
    t0 = time.perf_counter()
    env = dict(os.environ)
    env.setdefault("MAX_JOBS", str(max(2, math.ceil(1.25 * (os.cpu_count() or 8) / len(kinds)))))
    log(f"JIT warm-up: FlashInfer modules {kinds} in parallel, MAX_JOBS={env['MAX_JOBS']}")
    me = str(Path(__file__).resolve())
    failed = cf.jit_children([(k, [sys.executable, me, "--jit-one", k, "--model", args.model, "--page-size",
                                   str(args.page_size)]) for k in kinds], len(kinds), env)
    dt = time.perf_counter() - t0
    log(f"JIT warm-up done in {dt:.0f} s" + (f"; failed: {failed}" if failed else ""))
    return dt


# ---- main -----------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="output folder (e2e.json, e2e.md, e2e.png)")
    p.add_argument("--model", choices=sorted(MODELS), default="llama3-8b")
    p.add_argument("--layers", type=int, default=8, help="the model's first N layers (default 8; llama3-8b has 32)")
    p.add_argument("--families", default="uniform,bimodal,zipf,long",
                   help=f"trace families (of {','.join(FAMILIES)}; default uniform,bimodal,zipf,long)")
    p.add_argument("--batches", default="1,8,32,64,128", help="batch sizes B (rows kept full)")
    p.add_argument("--paths", default="pkv,fi_tensorcore,fi_cudacore,fi_xqa",
                   help=f"attention loops, ours first (of {','.join(PATHS)})")
    p.add_argument("--route", default="auto", help="PersistentKV's route (default auto: the headline)")
    p.add_argument("--append", choices=("own", "pkv"), default="own",
                   help="own (default): each library appends the step's K/V with its own call (FlashInfer's "
                        "append_paged_kv_cache, ours pkv.append_kv); pkv: ours in every loop")
    p.add_argument("--steps", type=int, default=16, help="measured steps per cell (half of them with CUDA events)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (JIT loads, plan caches)")
    p.add_argument("--seed", type=int, default=20260623, help="trace seed (default the first held-out seed)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--ctx-scale", type=int, default=1, help="divide the prompt lengths by this (the dry run: 64)")
    p.add_argument("--tol", type=float, default=0.05, help="largest first-step logits rel L2 that counts as agreeing")
    p.add_argument("--kv-reserve-gib", type=float, default=4.0,
                   help="GPU memory kept free for activations and workspaces when sizing the KV pools")
    p.add_argument("--gpu-mem-gib", type=float, default=79.0, help="--plan-only: the GPU memory to plan for")
    p.add_argument("--no-pool-sharing", action="store_true",
                   help="skip cells whose per-layer pools do not fit instead of letting layers share pools")
    p.add_argument("--fi-workspace-mb", type=int, default=256, help="each FlashInfer path's float workspace")
    p.add_argument("--max-minutes", type=float, help="start no cell that would end after this; outputs are written")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU: the tiny model, our CPU backend and the torch stand-in; B 1,4; small contexts")
    p.add_argument("--plan-only", action="store_true", help="print the cells (memory, pool sharing); no GPU")
    p.add_argument("--jit-warmup-only", action="store_true", help="compile FlashInfer's modules for --paths, then exit")
    p.add_argument("--jit-one", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.dry_run:  # the defaults of the CPU run, unless given
        given = set(x.split("=")[0] for x in (argv if argv is not None else sys.argv[1:]))
        for opt, val in (("--model", "tiny"), ("--layers", 2), ("--batches", "1,4"), ("--families", "uniform,long"),
                         ("--paths", "pkv,torch_ref"), ("--steps", 4), ("--warmup", 1), ("--ctx-scale", 64),
                         ("--tol", 0.02)):
            if opt not in given:
                setattr(a, opt[2:].replace("-", "_"), val)
    a.families = [f for f in str(a.families).split(",") if f]
    a.batches = [int(b) for b in str(a.batches).split(",") if b]
    a.paths = [x for x in str(a.paths).split(",") if x]
    bad = [f for f in a.families if f not in FAMILIES] + [x for x in a.paths if x not in PATHS]
    if bad:
        p.error(f"unknown families or paths: {bad}")
    if not a.paths or a.paths[0] != "pkv" or len(a.paths) < 2:
        p.error("--paths: pkv first, then at least one other loop")
    if a.layers < 1 or a.layers > MODELS[a.model]["layers"]:
        p.error(f"--layers must be in 1..{MODELS[a.model]['layers']}")
    if a.steps < 2 or a.warmup < 1:
        p.error("--steps >= 2 and --warmup >= 1 (the first step is the logits check)")
    if not (a.jit_one or a.jit_warmup_only or a.plan_only) and not a.out:
        if a.dry_run:
            import tempfile
            a.out = Path(tempfile.mkdtemp(prefix="pkv-e2e-dry-"))
        else:
            p.error("--out DIR is required")
    return a


def commit_id():
    return cf.commit_id()


def main(argv=None):
    args = parse_args(argv)
    if args.jit_one:
        jit_one(args.jit_one, args)
        return 0
    if args.jit_warmup_only:
        jit_warmup(args)
        return 0
    shape = MODELS[args.model]
    if args.plan_only:
        budget = int((args.gpu_mem_gib - args.kv_reserve_gib) * 2**30 - Model.total_weight_bytes(shape, args.layers))
        cells = plan_cells(args, shape, budget)
        print(f"{args.model}, {args.layers} layers: weights {Model.total_weight_bytes(shape, args.layers) / 2**30:.1f} "
              f"GiB, KV budget {budget / 2**30:.1f} GiB of {args.gpu_mem_gib} GiB; loops {args.paths}")
        print(cell_plan_table(cells))
        run = [c for c in cells if not c.get("skip")]
        print(f"estimated {sum(c['est_s'] for c in run):.0f} s for {len(run)} cells")
        return 0

    try:
        import numpy  # noqa: F401  (the page tables, the lab's traces)
        import torch
    except ImportError as e:
        log(f"{e.name} is not installed: nothing to run (pip install numpy torch)")
        return 77 if args.dry_run else 2  # 77: CTest's skip
    import persistentkv as pkv
    cuda = not args.dry_run
    if cuda and not torch.cuda.is_available():
        log("no CUDA device visible to torch (--dry-run runs on the CPU)")
        return 2
    if cuda and not pkv.cuda_available():
        log(f"{pkv.library_path} has no CUDA backend or sees no GPU (set PKV_LIBRARY to a CUDA build)")
        return 2
    t_start = time.time()
    ctx = types.SimpleNamespace(args=args, torch=torch, cuda=cuda, dev=torch.device("cuda", 0) if cuda else "cpu",
                                deadline=t_start + 60 * args.max_minutes if args.max_minutes else None,
                                torch_tables="torch_ref" in args.paths)
    if not cuda:
        torch.set_num_threads(max(1, os.cpu_count() or 1))
    fi_version = None
    if any(p.startswith("fi_") for p in args.paths):
        import flashinfer
        fi_version = flashinfer.__version__
    ctx.model = Model(torch, shape, args.layers, ctx.dev, args.seed)
    engines = [make_engine(ctx, p) for p in args.paths]
    device = torch.cuda.get_device_name(0) if cuda else f"CPU ({platform.processor() or platform.machine()}), " \
                                                        f"{engines[0].w.device_name}"
    sync(ctx)
    if cuda:
        free, total_mem = torch.cuda.mem_get_info()
        budget = int(free - args.kv_reserve_gib * 2**30)
    else:
        total_mem, budget = None, 4 << 30
    cells = plan_cells(args, shape, budget)
    log(f"{device}: {args.model} with {args.layers} layers ({ctx.model.weight_bytes / 2**30:.2f} GiB of weights), "
        f"KV budget {budget / 2**30:.1f} GiB; loops {', '.join(args.paths)}; {len(cells)} cells")
    meta = {"tool": "bench/e2e_flashinfer.py", "commit": commit_id(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv), "device": device,
            "gpu_memory_gib": total_mem / 2**30 if total_mem else None, "torch": torch.__version__,
            "cuda": torch.version.cuda, "flashinfer": fi_version, "persistentkv": pkv.__version__,
            "pkv_library": str(pkv.library_path), "python": platform.python_version(), "dry_run": args.dry_run,
            "model": args.model, "model_layers": shape["layers"], "layers": args.layers, "shape": shape,
            "weights_gib": ctx.model.weight_bytes / 2**30, "kv_budget_gib": budget / 2**30,
            "page_size": args.page_size, "layout": "NHD", "paths": args.paths,
            "path_labels": {p: PATH_LABELS[p] for p in args.paths}, "route": args.route, "append": args.append,
            "steps": args.steps, "warmup": args.warmup, "seed": args.seed, "ctx_scale": args.ctx_scale,
            "tol": args.tol, "no_plot": args.no_plot, "max_minutes": args.max_minutes,
            "method": {
                "step": "per loop: host plan, embedding, per layer RMSNorm, fused QKV GEMM, RoPE, append, attention, "
                        "O GEMM, residual, RMSNorm, gate/up GEMM, SwiGLU, down GEMM, residual; final norm, LM head, "
                        "argmax; GEMMs torch (cuBLAS) bf16, identical in every loop",
                "order": "every step runs every loop on the same state, the loops' order rotating step by step; all "
                         "loops append into the same slots, all are fed our greedy tokens",
                "wall": "host clock between torch.cuda.synchronize() before and after the step (plan included)",
                "tokens_per_s": "B / median wall over the measured steps without events",
                "attention_share": "sum of CUDA-event times around the attention calls / wall, median over the "
                                   "measured steps with events",
                "prefill": "synthetic (random K/V in the pools, not timed)",
                "pages": "PersistentKV's PagePool ids through a seeded random permutation; one table for all loops",
                "kv_pools": "one K and V pool per layer, or layers l, l+P, ... share pool l when all do not fit"}}
    out = args.out
    rows = []
    rc = 0
    try:
        for c in cells:
            if c.get("skip"):
                rows.append({k: v for k, v in c.items() if k != "reqs"})
                log(f"{c['family']} B{c['B']}: skipped ({c['skip']})")
                continue
            if ctx.deadline and time.time() + c["est_s"] > ctx.deadline:
                c["skip"] = f"time limit (--max-minutes {args.max_minutes}; estimated {c['est_s']:.0f} s)"
                rows.append({k: v for k, v in c.items() if k != "reqs"})
                log(f"{c['family']} B{c['B']}: {c['skip']}")
                continue
            log(f"{c['family']} B{c['B']}: mean ctx {c['mean_ctx']:.0f}, {c['num_pages']} pages x {c['kv_pools']} "
                f"pools ({c['kv_gib']:.1f} GiB), estimated {c['est_s']:.0f} s")
            row = run_cell(ctx, engines, c["family"], c["B"], c)
            rows.append(row)
            lp = row["loops"]
            log(f"{c['family']} B{c['B']}: ours {fmt(lp['pkv'].get('tokens_per_s'))} tok/s, best other "
                f"{row.get('other_best')} {fmt(lp.get(row.get('other_best') or '', {}).get('tokens_per_s'))} tok/s, "
                f"ratio {fmt(row.get('ratio'), '.3f')}, logits rel L2 {row.get('logits_rel_l2')}, "
                f"{row['cell_s']:.1f} s")
            meta["engine_notes"] = {e.path: e.notes for e in engines if e.notes}
            write_outputs(out, meta, rows)
    except Exception as e:
        import traceback
        traceback.print_exc()
        meta["error"] = f"{type(e).__name__}: {e}"
        rc = 1
    meta["engine_notes"] = {e.path: e.notes for e in engines if e.notes}
    meta["engine_failures"] = {e.path: e.failed for e in engines if e.failed}
    meta["elapsed_s"] = time.time() - t_start
    write_outputs(out, meta, rows, final=True)
    log(f"wrote {out / 'e2e.json'} and {out / 'e2e.md'} ({meta['elapsed_s']:.0f} s)")
    bad = [f"{r['family']} B{r['B']}" for r in rows if r.get("loops") and r.get("status") != "ok"]
    if args.dry_run:  # both loops compute the attention in fp32 on the CPU: the tokens must agree too
        bad += [f"{r['family']} B{r['B']} tokens" for r in rows
                if (r.get("loops", {}).get("torch_ref", {}).get("token_agreement") or 0) < 0.9]
        if len([r for r in rows if r.get("ratio")]) < len(rows):
            bad.append("a cell did not run")
    if bad:
        log(f"cells without an agreeing comparison loop: {bad}")
        rc = 1
    print(short_table(rows))
    s = meta["summary"]
    print(f"geomean ratio ours / {'torch stand-in' if args.dry_run else 'FlashInfer best'}: long-context cells "
          f"{fmt(s['geomean_ratio_long_ctx'], '.3f')} ({s['long_ctx_cells']}), all {fmt(s['geomean_ratio_all'], '.3f')} "
          f"({s['cells_run']}); first-step logits rel L2 max {fmt(s['first_logits_max_rel_l2'], '.2e')}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
