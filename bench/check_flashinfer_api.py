#!/usr/bin/env python3
"""check_flashinfer_api.py - the same FlashInfer wrapper calls made on FlashInfer and on
persistentkv.flashinfer, on the GPU, compared output by output (o by relative L2 error, lse - base 2
in both - by absolute error).  Calls: plain fp16 and bf16, NHD and HND, a (k, v) tuple and one
[num_pages, 2, ...] cache, out=/lse= buffers, logits_soft_cap, window_left, sm_scale, disable_split_kv,
deprecated positional arguments after page_size; and use_cuda_graph=True (fixed table buffers, one
CUDA graph captured around run(), replayed after each new plan()).  Prints a line per call and exits 1 on any mismatch.

  PKV_LIBRARY=build-gpu/libpersistentkv.so python3 bench/check_flashinfer_api.py [--json OUT.json]

(bench/run_compare.sh runs it after installing FlashInfer and building the library.)
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    import torch
    import flashinfer as fi
    from persistentkv import flashinfer as pfi

    dev = "cuda"
    gen = torch.Generator(device="cpu").manual_seed(20261201)
    rows, bad = [], 0

    def problem(lens, hq, hkv, d, ps, layout, dtype):
        pages = [(n + ps - 1) // ps for n in lens]
        indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0).tolist()), dtype=torch.int32)
        pool = int(indptr[-1]) + 9
        indices = torch.randperm(pool, generator=gen)[: int(indptr[-1])].to(torch.int32)
        last = torch.tensor([n - (p - 1) * ps if n > 0 else 0 for n, p in zip(lens, pages)], dtype=torch.int32)
        shape = (pool, 2, ps, hkv, d) if layout == "NHD" else (pool, 2, hkv, ps, d)
        kv = torch.randn(shape, generator=gen).to(dtype).to(dev)
        q = torch.randn((len(lens), hq, d), generator=gen).to(dtype).to(dev)
        return dict(indptr=indptr.to(dev), indices=indices.to(dev), last=last.to(dev), kv=kv, q=q, hq=hq, hkv=hkv,
                    d=d, ps=ps, lens=lens)

    cases = [
        dict(name="fp16 NHD (k, v) views of one cache", dtype=torch.float16, layout="NHD", cache="tuple", plan={}, run={}),
        dict(name="bf16 HND interleaved", dtype=torch.bfloat16, layout="HND", cache="one", plan={}, run={}),
        dict(name="out= lse= buffers", dtype=torch.float16, layout="NHD", cache="one", plan={}, run={"buffers": 1}),
        dict(name="soft cap 30, sm_scale 0.1", dtype=torch.bfloat16, layout="NHD", cache="tuple",
             plan={"logits_soft_cap": 30.0, "sm_scale": 0.1}, run={}),
        dict(name="window_left 255", dtype=torch.float16, layout="NHD", cache="one", plan={"window_left": 255},
             run={}),
        dict(name="disable_split_kv", dtype=torch.float16, layout="NHD", cache="one",
             plan={"disable_split_kv": True}, run={}),
        dict(name="deprecated positional (NONE, -1, None, dtype)", dtype=torch.float16, layout="NHD", cache="one",
             plan={"positional": True}, run={}),
    ]
    lens = [1, 17, 300, 4097, 2, 1500, 33, 12000]  # no empty row: FlashInfer's CSR form has none
    for c in cases:
        p = problem(lens, 32, 8, 128, 16, c["layout"], c["dtype"])
        cache = (p["kv"][:, 0], p["kv"][:, 1]) if c["cache"] == "tuple" else p["kv"]
        outs = {}
        for mod_name, mod in (("flashinfer", fi), ("persistentkv", pfi)):
            ws = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)
            w = mod.BatchDecodeWithPagedKVCacheWrapper(ws, c["layout"])
            plan_kw = dict(c["plan"])
            pos = ()
            if plan_kw.pop("positional", False):
                pos = ("NONE", -1, None, c["dtype"])
            else:
                plan_kw["q_data_type"] = c["dtype"]
            w.plan(p["indptr"], p["indices"], p["last"], p["hq"], p["hkv"], p["d"], p["ps"], *pos, **plan_kw)
            if c["run"].get("buffers"):
                o = torch.full_like(p["q"], float("nan"))
                lse = torch.full((len(lens), p["hq"]), float("nan"), dtype=torch.float32, device=dev)
                r = w.run(p["q"], cache, out=o, lse=lse)
                assert r.data_ptr() == o.data_ptr()
            else:
                o, lse = w.run(p["q"], cache, return_lse=True)
            torch.cuda.synchronize()
            outs[mod_name] = (o.float(), lse)
        (fo, fl), (po, pl) = outs["flashinfer"], outs["persistentkv"]
        rel = ((po - fo).norm() / fo.norm().clamp_min(1e-30)).item()
        lse_err = (pl - fl).abs().max().item()
        tol = 4e-3 if c["dtype"] == torch.float16 else 2e-2
        ok = rel < tol and lse_err < 2e-3 and math.isfinite(rel)
        bad += not ok
        rows.append(dict(call=c["name"], rel_l2_o=rel, max_abs_lse=lse_err, ok=ok))
        print(f"{'ok ' if ok else 'BAD'} {c['name']:<48} o rel L2 {rel:.2e}  lse max abs {lse_err:.2e}")
    # use_cuda_graph=True on both: FlashInfer's fixed table buffers, a CUDA graph captured around run() once,
    # then new lengths planned (outside the graph) and the graph replayed with a new q, step after step
    base = problem(lens, 32, 8, 128, 16, "NHD", torch.float16)
    B, ps = len(lens), 16
    graphs = {}
    for mod_name, mod in (("flashinfer", fi), ("persistentkv", pfi)):
        bufs = dict(paged_kv_indptr_buffer=torch.zeros(B + 1, dtype=torch.int32, device=dev),
                    paged_kv_indices_buffer=torch.zeros(int(base["indptr"][-1]), dtype=torch.int32, device=dev),
                    paged_kv_last_page_len_buffer=torch.zeros(B, dtype=torch.int32, device=dev))
        w = mod.BatchDecodeWithPagedKVCacheWrapper(torch.zeros(128 << 20, dtype=torch.uint8, device=dev), "NHD",
                                                   use_cuda_graph=True, **bufs)
        graphs[mod_name] = dict(w=w, q=torch.empty_like(base["q"]))
    h_indptr, h_indices = base["indptr"].cpu(), base["indices"].cpu()
    for step in range(4):
        # rows of 1 .. their first length (FlashInfer's CSR form has no empty row)
        step_lens = lens if step == 0 else [int(torch.randint(1, n + 1, (1,), generator=gen)) for n in lens]
        pages = [(n + ps - 1) // ps for n in step_lens]
        indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0).tolist()), dtype=torch.int32)
        indices = torch.cat([h_indices[int(h_indptr[r]):int(h_indptr[r]) + pages[r]] for r in range(B)])
        last = torch.tensor([n - (p_ - 1) * ps if n > 0 else 0 for n, p_ in zip(step_lens, pages)], dtype=torch.int32)
        q = torch.randn(base["q"].shape, generator=gen).to(torch.float16).to(dev)
        outs = {}
        for mod_name, g in graphs.items():
            g["w"].plan(indptr.to(dev), indices.to(dev), last.to(dev), 32, 8, 128, ps, q_data_type=torch.float16)
            g["q"].copy_(q)
            if step == 0:  # eager once, then the capture
                g["w"].run(g["q"], base["kv"])
                torch.cuda.synchronize()
                g["graph"] = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g["graph"]):
                    g["o"] = g["w"].run(g["q"], base["kv"])
            g["graph"].replay()
        torch.cuda.synchronize()
        fo, po = graphs["flashinfer"]["o"].float(), graphs["persistentkv"]["o"].float()
        rel = ((po - fo).norm() / fo.norm().clamp_min(1e-30)).item()
        ok = rel < 4e-3 and math.isfinite(rel)
        bad += not ok
        name = f"use_cuda_graph: replay {step} (lengths {step_lens[:4]}...)"
        rows.append(dict(call=name, rel_l2_o=rel, max_abs_lse=None, ok=ok))
        print(f"{'ok ' if ok else 'BAD'} {name:<48} o rel L2 {rel:.2e}")
    print(f"check_flashinfer_api: {len(rows) - bad} of {len(rows)} calls agree (flashinfer {fi.__version__})")
    if args.json:
        meta = dict(flashinfer=fi.__version__, commit=_commit(), gpu=torch.cuda.get_device_name(),
                    cuda=torch.version.cuda, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    command="python3 bench/check_flashinfer_api.py --json OUT.json")
        with open(args.json, "w") as f:
            json.dump(dict(meta, rows=rows), f, indent=1)
    return 1 if bad else 0


def _commit():
    """PKV_COMMIT, else the checkout's short hash (the GPU machine's copy may have no .git)."""
    if os.environ.get("PKV_COMMIT"):
        return os.environ["PKV_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
