#!/usr/bin/env python3
"""Held-out judgement of `auto` policies on a FlashInfer side-by-side run (bench/compare_flashinfer.py JSON).

Each row of that JSON was measured on every fixed route of ours (its "pkv" field: single, split, bucketed,
workqueue, fused, and auto as it ran) and on FlashInfer's best path.  For every row this script

  1. rebuilds the step's lengths: anchors carry "lens"; trace rows are regenerated with the library's own
     trace generator (family, seed, max_active = B, 3 B requests, page 16, as compare_flashinfer.py made
     them) and checked against the row's total_tokens, lens_min/mean/max, trace_steps and trace_checksum;
  2. asks the C planner (pkv_lab_plan_step_caps, the lab library) which plan `auto` makes under each policy,
     for an H100's capabilities: 132 SMs, the CUDA backend's wave of 2 tasks per SM, 3 resident CTAs per SM
     of the d = 128, G <= 8 kernel (4 at d = 64), pages of < 8 tokens gathered row by row (as
     bench/bench_decode_host.c); the fixed routes are re-planned the same way and checked against the plans
     the run measured (route, tasks, launches, merge-state bytes);
  3. looks up the measured time of auto's plan: the fixed route's row when its plan is the same (route,
     tasks, launches, merge-state bytes), else the measured auto's when that ran the same plan.  A route's
     measured rows are at the planner's own wave; where auto picks a split route at one wave of every
     resident CTA (steps of >= 2 rows with fewer (row, KV head) pairs than resident slots) that plan may not
     have been measured: such steps are counted as `unmeasured` and left out of that policy's regrets (the
     fixed route's time at the planner's wave is shown beside them, as an approximation only).

Policies: the policy file(s) given (default bench/results/h100.policy) and the constants the CUDA backend
derives from an H100 (cuda_backend.cu: read bandwidth 0.92 x 2 x memory clock x bus width, 3 us a launch;
cost.c pkv_cost_model_default), which is what `auto` ran with in that run.  The replay under the device
constants must reproduce the plan the run's auto used (pkv_auto_route_used and its tasks) on every row;
the script says where it does not.

Regret = policy's time / the fastest measured fixed route (bucketed included) - 1, per step.  Versus
FlashInfer: FlashInfer's best time / ours (above 1: ours is faster), geomean per group.

  bench/policy_heldout_compare.py [--compare JSON] [--policy FILE]... [--md OUT.md] [--json OUT.json]
      [--heldout-json OUT.json [--crosscheck]]  # the rows as `pkv bench --json` rows with their plans' terms, and
                                                # pkv calibrate --policy P --evaluate OUT.json --replay-auto on them
      [--explain ROW,ROW]                       # each route's predicted time by part beside its measured time
      [--device-policy-out FILE]                # the device-derived constants as a policy file

The committed report (bench/results/h100_policy_heldout_82fdf6f.*):

  bench/policy_heldout_compare.py --md bench/results/h100_policy_heldout_82fdf6f.md \
      --json bench/results/h100_policy_heldout_82fdf6f.json --heldout-json build/h100_heldout_rows.json --crosscheck \
      --explain B16_homo8K,uniform_B2_s20260623_t24,bimodal_B1_s20260625_t47,bucketed_B128_s20260623_t0,zipf_B16_s20260624_t0

Stdlib only; needs the repository's build (build/libpersistentkv_lab.so, or $PKV_LAB_LIBRARY).
"""
import argparse
import ctypes
import datetime
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# ---- the lab library (ctypes mirrors of persistentkv.h / pkv_lab.h, ABI 0.6.0) -----------------------------
c_enum, i32, i64 = ctypes.c_int, ctypes.c_int32, ctypes.c_int64
i32p = ctypes.POINTER(i32)


class Problem(ctypes.Structure):
    _fields_ = [("num_qo_heads", i32), ("num_kv_heads", i32), ("head_dim", i32), ("page_size", i32),
                ("num_pages", i64), ("layout", c_enum), ("dtype", c_enum), ("sm_scale", ctypes.c_float),
                ("logits_soft_cap", ctypes.c_float), ("window", i32), ("kv_dtype", c_enum)]


class PageTable(ctypes.Structure):
    _fields_ = [("batch_size", i32), ("kv_indptr", i32p), ("kv_page_indices", i32p), ("seq_lens", i32p)]


class PlanOptions(ctypes.Structure):
    _fields_ = [(n, i32) for n in ("route", "parallelism", "ctas_per_unit", "num_splits", "chunk_pages",
                                   "min_chunk_tokens", "max_splits", "graph_max_batch", "graph_tasks")]


class Counters(ctypes.Structure):
    _fields_ = [(n, i64) for n in ("launches", "tasks", "grid_ctas", "merges", "kv_bytes", "qo_bytes",
                                   "merge_state_bytes", "total_tokens")]


class Task(ctypes.Structure):
    _fields_ = [(n, i32) for n in ("row", "kv_head", "tok_begin", "tok_end", "page_base", "state_slot", "merge")]


class Merge(ctypes.Structure):
    _fields_ = [(n, i32) for n in ("row", "kv_head", "first_slot", "count")]


class CostModel(ctypes.Structure):
    _fields_ = [("coef", ctypes.c_double * 8), ("parallelism", i32), ("cuda_version", i32),
                ("device", ctypes.c_char * 128), ("rms_us", ctypes.c_double), ("samples", i32)]


class LabCaps(ctypes.Structure):
    _fields_ = [("parallelism", i32), ("ctas_per_unit", i32), ("resident", (i32 * 2) * 3), ("row_gather_below", i32)]


class TraceConfig(ctypes.Structure):
    _fields_ = [("family", c_enum), ("seed", ctypes.c_uint64), ("num_requests", i32), ("max_active", i32),
                ("max_steps", i32), ("page_size", i32), ("hole_fraction", ctypes.c_double)]


def load_lab():
    path = os.environ.get("PKV_LAB_LIBRARY") or str(ROOT / "build" / "libpersistentkv_lab.so")
    if not Path(path).is_file():
        sys.exit(f"{path} not found: build the repository first (cmake -S . -B build && cmake --build build)")
    lab = ctypes.CDLL(path)
    vp, P = ctypes.c_void_p, ctypes.POINTER
    protos = {
        "pkv_version": (ctypes.c_uint32, []),
        "pkv_last_error": (ctypes.c_char_p, []),
        "pkv_problem_default": (None, [P(Problem)]),
        "pkv_plan_options_default": (None, [P(PlanOptions)]),
        "pkv_plan_create": (c_enum, [P(vp)]),
        "pkv_plan_free": (None, [vp]),
        "pkv_lab_plan_step_caps": (c_enum, [P(LabCaps), P(CostModel), P(Problem), P(PageTable), P(PlanOptions), vp]),
        "pkv_plan_route": (c_enum, [vp]),
        "pkv_plan_counters": (P(Counters), [vp]),
        "pkv_plan_num_tasks": (i32, [vp]),
        "pkv_plan_tasks": (P(Task), [vp]),
        "pkv_plan_num_merges": (i32, [vp]),
        "pkv_plan_merges": (P(Merge), [vp]),
        "pkv_route_name": (ctypes.c_char_p, [c_enum]),
        "pkv_cost_model_load": (c_enum, [ctypes.c_char_p, P(CostModel)]),
        "pkv_trace_family_parse": (c_enum, [ctypes.c_char_p, P(c_enum)]),
        "pkv_trace_config_default": (None, [P(TraceConfig), c_enum]),
        "pkv_trace_generate": (c_enum, [P(TraceConfig), P(vp)]),
        "pkv_trace_free": (None, [vp]),
        "pkv_trace_num_steps": (i32, [vp]),
        "pkv_trace_step": (i32, [vp, i32, P(i32p), P(i32p)]),
        "pkv_trace_checksum": (ctypes.c_uint64, [vp]),
    }
    for name, (res, args) in protos.items():
        fn = getattr(lab, name)
        fn.restype, fn.argtypes = res, args
    if lab.pkv_version() != 600:
        sys.exit(f"{path} is PersistentKV {lab.pkv_version()}; this script mirrors the structs of 0.6.0")
    return lab, path


LAB, LAB_PATH = load_lab()
ROUTES = [LAB.pkv_route_name(k).decode() for k in range(6)]  # auto, single, split, bucketed, workqueue, fused
FIXED = ["single", "split", "bucketed", "workqueue", "fused"]
CANDIDATES = ["single", "split", "workqueue", "fused"]  # what auto chooses among

# ---- the H100 as the planner sees it ------------------------------------------------------------------------
H100_SMS = 132
H100_CAPS = dict(parallelism=H100_SMS, ctas_per_unit=2, resident=((4, 0), (3, 0), (0, 0)), row_gather_below=8)
# cuda_backend.cu: peak = 2 x memory clock x bus width; nvidia-smi's memory clock of the run's H100 80GB HBM3
# is 2619 MHz (bench/results/gpu_check/h100_*_stdout.txt), its bus 5120 bits (HBM3, 5 stacks)
H100_MEM_MHZ, H100_BUS_BITS = 2619, 5120
STREAM_READ_SHARE, LAUNCH_US = 0.92, 3.0


def device_default_model(sms, mem_mhz, bus_bits):
    """pkv_cost_model_default(m, SMs, 0.92 x peak, 3 us), as the CUDA backend sets it (src/plan/cost.c)."""
    peak = 2.0 * mem_mhz * 1e6 * (bus_bits / 8.0) / 1e9
    read = STREAM_READ_SHARE * peak
    m = CostModel()
    coefs = [0.0, 2.0 * LAUNCH_US, 1e3 / 10.0, 0.0, 1e3 / read, 0.4 * 1e3 / read, 1.2 * sms * 512e-6, 3.0]
    for k, v in enumerate(coefs):
        m.coef[k] = v
    m.parallelism = sms
    m.device = f"defaults for an H100 ({peak:.0f} GB/s peak)".encode()
    return m, peak


COEF_NAMES = ["const_us", "launch_us", "fused_merge_us_per_mb", "merge_us_per_mb", "us_per_mb", "idle_us_per_mb",
              "rho_mb_per_token", "softmax_p"]


def model_dict(m):
    return {n: m.coef[k] for k, n in enumerate(COEF_NAMES)}


def save_policy(m, path, note):
    """A policy file (version 2) holding m's coefficients, so pkv calibrate --policy can read the same model."""
    lines = ["persistentkv-policy 2", f"device = {m.device.decode()}", f"parallelism = {m.parallelism}",
             "cuda_version = 13000", "samples = 0", "rms_us = 0"]
    lines += [f"{n} = {m.coef[k]:.9g}" for k, n in enumerate(COEF_NAMES)]
    Path(path).write_text("\n".join(lines) + "\n")
    print(f"wrote {path} ({note})", file=sys.stderr)


# ---- planning -------------------------------------------------------------------------------------------------
class Planner:
    def __init__(self, shape):
        self.prob = Problem()
        LAB.pkv_problem_default(ctypes.byref(self.prob))
        self.prob.num_qo_heads, self.prob.num_kv_heads = shape["Hq"], shape["Hkv"]
        self.prob.head_dim, self.prob.page_size = shape["d"], shape["page_size"]
        assert shape["dtype"] == "fp16" and shape["layout"] == "NHD", "this script replays fp16 NHD runs"
        self.prob.num_pages = 2 ** 31 - 1
        self.caps = LabCaps()
        self.caps.parallelism, self.caps.ctas_per_unit = H100_CAPS["parallelism"], H100_CAPS["ctas_per_unit"]
        for a, row in enumerate(H100_CAPS["resident"]):
            for b, v in enumerate(row):
                self.caps.resident[a][b] = v
        self.caps.row_gather_below = H100_CAPS["row_gather_below"]
        self.plan = ctypes.c_void_p()
        if LAB.pkv_plan_create(ctypes.byref(self.plan)) != 0:
            sys.exit("pkv_plan_create failed")

    def slots(self):
        """plan_resident_slots: SMs x max(resident of the light kernel, the wave, the exact residency)."""
        d, G = self.prob.head_dim, self.prob.num_qo_heads // self.prob.num_kv_heads
        per_unit = self.caps.ctas_per_unit
        light = self.caps.resident[1][0]
        resident = light if (light > 0 and G <= 8 and d <= 128) else per_unit
        di = {64: 0, 128: 1, 256: 2}[d]
        rx = self.caps.resident[di][1 if G > 8 else 0] or resident
        return self.caps.parallelism * max(rx, max(resident, per_unit))

    def run(self, lens, route, model=None):
        """Plans lens with route (model for auto): the plan's route, counters and cost terms."""
        B = len(lens)
        ps = self.prob.page_size
        indptr = (i32 * (B + 1))()
        for b, n in enumerate(lens):
            indptr[b + 1] = indptr[b] + (n + ps - 1) // ps
        seq = (i32 * max(B, 1))(*lens)
        table = PageTable(B, indptr, None, seq)
        opts = PlanOptions()
        LAB.pkv_plan_options_default(ctypes.byref(opts))
        opts.route = ROUTES.index(route)
        st = LAB.pkv_lab_plan_step_caps(ctypes.byref(self.caps), ctypes.byref(model) if model else None,
                                        ctypes.byref(self.prob), ctypes.byref(table), ctypes.byref(opts), self.plan)
        if st != 0:
            raise RuntimeError(f"planning {route}: {LAB.pkv_last_error().decode()}")
        c = LAB.pkv_plan_counters(self.plan).contents
        r = ROUTES[LAB.pkv_plan_route(self.plan)]
        out = {"route": r, "tasks": c.tasks, "grid_ctas": c.grid_ctas, "launches": c.launches,
               "merge_state_bytes": c.merge_state_bytes, "kv_bytes": c.kv_bytes}
        out["terms"] = self.terms(r, c)
        return out

    def terms(self, route, c):
        """pkv_cost_terms (src/plan/cost.c) from the plan's public views; checked against the C terms of the
        calibration JSON by --check-terms."""
        nt, tasks = LAB.pkv_plan_num_tasks(self.plan), LAB.pkv_plan_tasks(self.plan)
        longest = max((tasks[k].tok_end - tasks[k].tok_begin for k in range(nt)), default=0)
        nm, merges = LAB.pkv_plan_num_merges(self.plan), LAB.pkv_plan_merges(self.plan)
        widest = max((merges[k].count for k in range(nm)), default=0) if route != "single" else 0
        d, G = self.prob.head_dim, self.prob.num_qo_heads // self.prob.num_kv_heads
        token_mb = d * 2 * 2.0 / 1e6
        return [float(c.launches), (c.kv_bytes + c.qo_bytes + c.merge_state_bytes) / 1e6, longest * token_mb,
                widest * G * (d + 1.0) * 4.0 / 1e6, float(c.tasks), float(self.slots()),
                (c.kv_bytes / 1e6) / c.tasks if c.tasks > 0 else 0.0, token_mb,
                1.0 if route in ("single", "split") else 0.0, 1.0 if route == "fused" else 0.0]


def predict(m, t):
    """pkv_cost_predict (src/plan/cost.c), for the explanations: predicted us and its parts."""
    c = list(m.coef)
    rho, p = c[6], c[7]
    b, mb = t[7], t[1]
    N, R = max(t[4], 1.0), max(t[5], 1.0)
    L = t[2] / b if b > 0 else 0.0
    w = math.ceil(N / R)
    n_last = N - (w - 1) * R
    X = mb
    if (w <= 1 or t[8] > 0) and b > 0:
        q = rho / b / min(N, R)
        if q < 1:
            mean = t[6] / b
            lo = max(0.0, 2 * mean - L)
            X += rho * q * (L - lo) / 2
    Y = rho * L
    stream = max(X, Y) if p <= 0 else (X ** p + Y ** p) ** (1 / p)
    idle = (1 - n_last / R) * mb * R / N if w > 1 else 0.0
    merge = (c[2] if t[9] > 0 else c[3]) * t[3]
    parts = {"fixed": c[0] + c[1] * t[0], "merge": merge, "stream": c[4] * stream, "idle": c[5] * idle,
             "X_mb": X, "Y_mb": Y}
    return parts["fixed"] + merge + parts["stream"] + parts["idle"], parts


# ---- the steps' lengths ---------------------------------------------------------------------------------------
_TRACES = {}


def trace_lens(family, seed, batch, step, page_size):
    key = (family, seed, batch, page_size)
    if key not in _TRACES:
        fam = c_enum()
        if LAB.pkv_trace_family_parse(family.encode(), ctypes.byref(fam)) != 0:
            raise ValueError(f"unknown trace family {family}")
        cfg = TraceConfig()
        LAB.pkv_trace_config_default(ctypes.byref(cfg), fam.value)
        cfg.seed, cfg.max_active, cfg.num_requests, cfg.page_size = seed, batch, 3 * batch, page_size
        h = ctypes.c_void_p()
        if LAB.pkv_trace_generate(ctypes.byref(cfg), ctypes.byref(h)) != 0:
            raise RuntimeError(LAB.pkv_last_error().decode())
        n = LAB.pkv_trace_num_steps(h)
        steps = []
        for s in range(n):
            ids, ls = i32p(), i32p()
            B = LAB.pkv_trace_step(h, s, ctypes.byref(ids), ctypes.byref(ls))
            steps.append([ls[i] for i in range(B)])
        _TRACES[key] = (steps, f"{LAB.pkv_trace_checksum(h):#018x}")
        LAB.pkv_trace_free(h)
    steps, checksum = _TRACES[key]
    return steps[step], len(steps), checksum


def row_lens(row, problems):
    """The row's lengths, checked against what the row recorded (mismatches appended to problems)."""
    if row["group"] == "anchor":
        lens = list(row["lens"])
    else:
        lens, nsteps, checksum = trace_lens(row["family"], row["seed"], row["batch"], row["trace_step"],
                                            row["page_size"])
        if nsteps != row["trace_steps"]:
            problems.append(f"{row['name']}: {nsteps} trace steps, the row says {row['trace_steps']}")
        if checksum != row["trace_checksum"]:
            problems.append(f"{row['name']}: checksum {checksum}, the row says {row['trace_checksum']}")
    got = (sum(lens), min(lens), max(lens), sum(lens) / len(lens))
    want = (row["total_tokens"], row["lens_min"], row["lens_max"], row["lens_mean"])
    if got[:3] != want[:3] or abs(got[3] - want[3]) > 1e-9 * max(1.0, want[3]):
        problems.append(f"{row['name']}: lengths {got}, the row says {want}")
    return lens


# ---- evaluation -----------------------------------------------------------------------------------------------
def same_plan(plan, meas):
    return (plan["route"] == meas.get("route_used") and plan["tasks"] == meas.get("tasks")
            and plan["launches"] == meas.get("launches") and plan["merge_state_bytes"] == meas.get("merge_state_bytes"))


def lookup(plan, pkv):
    """The measured time of plan: a fixed route's row with the same plan, else the measured auto's."""
    for r in FIXED:
        if r in pkv and "us" in pkv[r] and same_plan(plan, pkv[r]):
            return pkv[r]["us"], r
    if "auto" in pkv and same_plan(plan, pkv["auto"]):
        return pkv["auto"]["us"], "auto"
    return None, None


def group_of(row):
    return "anchors" if row["group"] == "anchor" else f"{row['family']} B{row['batch']}"


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summarize(steps, pols):
    out = {"steps": len(steps)}
    for p in pols:
        got = [s for s in steps if s["pick"][p]["us"] is not None]
        regs = [s["pick"][p]["us"] / s["oracle_us"] - 1 for s in got]
        ratios = [s["fi_us"] / s["pick"][p]["us"] for s in got]
        out[p] = {"measured": len(got), "unmeasured": len(steps) - len(got),
                  "mean_regret": sum(regs) / len(regs) if regs else float("nan"),
                  "max_regret": max(regs) if regs else float("nan"),
                  "oracle_picks": sum(r <= 0 for r in regs),
                  "geomean_vs_fi": geomean(ratios), "at_least_fi": sum(x >= 1 for x in ratios)}
    asrun = [s["asrun_us"] / s["oracle_us"] - 1 for s in steps]
    out["as_run"] = {"mean_regret": sum(asrun) / len(asrun), "max_regret": max(asrun),
                     "geomean_vs_fi": geomean([s["fi_us"] / s["asrun_us"] for s in steps]),
                     "at_least_fi": sum(s["fi_us"] >= s["asrun_us"] for s in steps)}
    out["oracle"] = {"geomean_vs_fi": geomean([s["fi_us"] / s["oracle_us"] for s in steps]),
                     "at_least_fi": sum(s["fi_us"] >= s["oracle_us"] for s in steps)}
    return out


def heldout_rows(row, lens, fixed_plans, asrun_plan):
    """The row as `pkv bench --json` rows (one per measured route), with the plans' terms (pkv calibrate)."""
    if row["group"] == "anchor":
        step, args = row["name"], f"--anchor {row['name']}"
    else:
        step = f"step{row['trace_step']}"
        args = (f"--trace {row['family']} --seed {row['seed']} --batch {row['batch']} --requests {3 * row['batch']} "
                f"--step {row['trace_step']}")
    out = []
    for r in FIXED + ["auto"]:
        m = row["pkv"].get(r)
        if not m or "us" not in m:
            continue
        plan = fixed_plans.get(r) if r != "auto" else asrun_plan
        rec = {"step": step, "batch": len(lens), "total_tokens": row["total_tokens"], "route": r,
               "route_used": m["route_used"], "kernel_us": m["us"], "tasks": m["tasks"],
               "grid_ctas": plan["grid_ctas"] if plan and same_plan(plan, m) else 0,
               "launches": m["launches"], "merge_state_bytes": m["merge_state_bytes"],
               "flashinfer_best_us": row["fi_best_us"], "args": args}
        if plan and same_plan(plan, m):
            rec["terms"] = plan["terms"]
        rec["lens"] = lens
        out.append(rec)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compare", default=str(ROOT / "bench/results/h100_compare_flashinfer_82fdf6f.json"))
    ap.add_argument("--policy", action="append", help="policy file(s); default bench/results/h100.policy")
    ap.add_argument("--md", help="write the Markdown report here")
    ap.add_argument("--json", dest="json_out", help="write the JSON report here")
    ap.add_argument("--heldout-json", help="write the rows as pkv bench JSON (for pkv calibrate --evaluate)")
    ap.add_argument("--crosscheck", action="store_true",
                    help="with --heldout-json: also run build/pkv calibrate --policy P --evaluate OUT --replay-auto for "
                    "every policy (the C replay) and keep its totals")
    ap.add_argument("--device-policy-out", help="write the H100's device-derived constants as a policy file")
    ap.add_argument("--explain", default="", help="comma-separated row names: each candidate route's predicted "
                    "time by part under every policy, beside its measured time (pkv bench --explain style)")
    ap.add_argument("--check-terms", default=str(ROOT / "bench/results/h100_calibration.json"),
                    help="pkv bench JSON whose C terms the script's terms are checked against ('' to skip)")
    a = ap.parse_args()
    policies = a.policy or [str(ROOT / "bench/results/h100.policy")]

    data = json.load(open(a.compare))
    meta, rows = data["meta"], data["rows"]
    models = {}
    dev_model, dev_peak = device_default_model(H100_SMS, H100_MEM_MHZ, H100_BUS_BITS)
    models["device"] = dev_model
    names = {"device": f"device-derived constants (H100: {dev_peak:.0f} GB/s peak x 0.92, 3 us a launch)"}
    policy_path = {}
    for p in policies:
        m = CostModel()
        if LAB.pkv_cost_model_load(p.encode(), ctypes.byref(m)) != 0:
            sys.exit(f"{p}: {LAB.pkv_last_error().decode()}")
        key = Path(p).name
        models[key] = m
        policy_path[key] = p
        names[key] = f"{key} ({m.device.decode()})"
    pols = list(models)
    if a.device_policy_out:
        save_policy(dev_model, a.device_policy_out, "the H100's device-derived constants")

    problems = []
    planner = Planner(rows[0])
    # the terms mirror against the C terms of a pkv bench JSON of the same shape and GPU
    terms_checked = 0
    if a.check_terms:
        cal = json.load(open(a.check_terms))
        for r in cal["rows"]:
            if r["route"] == "auto" or "terms" not in r:
                continue
            got = planner.run(r["lens"], r["route"])
            if got["tasks"] != r["tasks"] or any(abs(x - y) > 1e-6 * max(1.0, abs(y)) for x, y in zip(got["terms"], r["terms"])):
                problems.append(f"terms of {r['step']} {r['route']}: {got['terms']} against the JSON's {r['terms']}")
            terms_checked += 1

    explain_names = set(x for x in a.explain.split(",") if x)
    steps, conv_rows = [], []
    plan_mismatch, asrun_mismatch = [], []
    for row in rows:
        if not row.get("ok", True) or not row.get("pkv"):
            problems.append(f"{row['name']}: not ok in the run, skipped")
            continue
        lens = row_lens(row, problems)
        pkv = row["pkv"]
        fixed_plans = {r: planner.run(lens, r) for r in FIXED}
        for r, pl in fixed_plans.items():
            if r in pkv and not same_plan(pl, pkv[r]):
                plan_mismatch.append(f"{row['name']} {r}: planned {pl['route']} {pl['tasks']} tasks, measured "
                                     f"{pkv[r].get('route_used')} {pkv[r].get('tasks')} tasks")
        oracle_route = min((r for r in FIXED if r in pkv), key=lambda r: pkv[r]["us"])
        st = {"name": row["name"], "group": group_of(row), "B": len(lens), "oracle_route": oracle_route,
              "oracle_us": pkv[oracle_route]["us"], "fi_us": row["fi_best_us"], "fi_path": row["fi_best_config"],
              "asrun_route": row["pkv_auto_route_used"], "asrun_us": row["pkv_auto_us"],
              "asrun_tasks": pkv["auto"]["tasks"], "pick": {},
              "measured_fixed": {r: pkv[r]["us"] for r in FIXED if r in pkv and "us" in pkv[r]}}
        for p in pols:
            plan = planner.run(lens, "auto", models[p])
            us, src = lookup(plan, pkv)
            approx = pkv[plan["route"]]["us"] if us is None else None
            pred = {r: predict(models[p], fixed_plans[r]["terms"])[0] for r in CANDIDATES}
            st["pick"][p] = {"route": plan["route"], "tasks": plan["tasks"], "us": us, "from": src,
                             "approx_us": approx, "predicted_us": predict(models[p], plan["terms"])[0],
                             "predicted_parts": predict(models[p], plan["terms"])[1],
                             "predicted_fixed_us": pred}
            if p == "device":
                if not same_plan(plan, pkv["auto"]):
                    asrun_mismatch.append(f"{row['name']}: replay {plan['route']} {plan['tasks']} tasks, the run's "
                                          f"auto {pkv['auto']['route_used']} {pkv['auto']['tasks']} tasks")
                asrun_plan = plan
        if row["name"] in explain_names:
            st["explain"] = {p: {r: dict(zip(("us", "parts"), predict(models[p], fixed_plans[r]["terms"])),
                                         tasks=fixed_plans[r]["tasks"], terms=fixed_plans[r]["terms"])
                                 for r in CANDIDATES} for p in pols}
        steps.append(st)
        conv_rows += heldout_rows(row, lens, fixed_plans, asrun_plan)

    groups = {}
    for s in steps:
        groups.setdefault(s["group"], []).append(s)
    fam_order = ["anchors"] + [f"{f} B{b}" for f in ("uniform", "bimodal", "zipf", "bucketed")
                               for b in (1, 2, 4, 8, 16, 32, 64, 128)]
    order = [g for g in fam_order if g in groups] + sorted(g for g in groups if g not in fam_order)
    table = {g: summarize(groups[g], pols) for g in order}
    traces = [s for s in steps if s["group"] != "anchors"]
    totals = {"anchors": table.get("anchors"), "traces": summarize(traces, pols), "all": summarize(steps, pols)}
    for fam in ("uniform", "bimodal", "zipf", "bucketed"):
        fs = [s for s in traces if s["group"].startswith(fam + " ")]
        if fs:
            totals[fam] = summarize(fs, pols)

    spreads = sorted(abs(m["passes_us"][0] - m["passes_us"][1]) / m["us"] for row in rows for r, m in row["pkv"].items()
                     if r in FIXED and len(m.get("passes_us", [])) == 2)
    noise = {"pass_spread_median": spreads[len(spreads) // 2], "pass_spread_p90": spreads[int(0.9 * len(spreads))],
             "route_steps": len(spreads)}
    paired = {}
    for p in pols[1:]:
        diff = [s for s in steps if (s["pick"][p]["route"], s["pick"][p]["tasks"]) !=
                (s["pick"][pols[0]]["route"], s["pick"][pols[0]]["tasks"])
                and s["pick"][p]["us"] is not None and s["pick"][pols[0]]["us"] is not None]
        d = [s["pick"][p]["us"] / s["pick"][pols[0]]["us"] - 1 for s in diff]
        paired[p] = {"against": pols[0], "steps_planned_differently": len(diff), "faster": sum(x < 0 for x in d),
                     "slower": sum(x > 0 for x in d), "mean_time_change": sum(d) / len(d) if d else 0.0,
                     "by_group": {}}
        for s, x in zip(diff, d):
            g = paired[p]["by_group"].setdefault(s["group"], [0, 0, 0.0])
            g[0] += x < 0
            g[1] += x > 0
            g[2] += x
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    rel = lambda p: os.path.relpath(p, ROOT) if os.path.isabs(p) else p
    report = {
        "tool": "bench/policy_heldout_compare.py", "script_commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "bench/policy_heldout_compare.py " + " ".join(rel(x) if x.startswith("/") else x for x in sys.argv[1:]),
        "data": {"file": rel(a.compare), "commit": meta.get("commit"), "date": meta.get("date"),
                 "gpu": meta.get("gpu", {}).get("name"), "flashinfer": meta.get("flashinfer"),
                 "rows": len(rows), "truncated": meta.get("truncated")},
        "caps": H100_CAPS, "policies": {p: {"name": names[p], "coef": model_dict(models[p])} for p in pols},
        "checks": {"lengths_and_checksums": "every row" if not problems else problems,
                   "terms_mirror_checked_rows": terms_checked,
                   "fixed_route_plans_differing_from_the_run": plan_mismatch,
                   "device_replay_differing_from_the_runs_auto": asrun_mismatch},
        "noise": noise, "paired": paired, "groups": table, "totals": totals, "steps": steps,
    }
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {a.json_out}", file=sys.stderr)
    if a.heldout_json:
        hmeta = {"tool": "bench/policy_heldout_compare.py (converted from bench/compare_flashinfer.py JSON)",
                 "commit": meta.get("commit"), "date": meta.get("date"), "backend": "cuda",
                 "gpu": {"name": meta.get("gpu", {}).get("name"), "sms": H100_SMS, "cuda_runtime": 13000},
                 "workload": f"held-out rows of {Path(a.compare).name}", "parallelism": H100_SMS,
                 "ctas_per_unit": 0,
                 "shape": {"name": "paper", "num_qo_heads": rows[0]["Hq"], "num_kv_heads": rows[0]["Hkv"],
                           "head_dim": rows[0]["d"], "page_size": rows[0]["page_size"], "layout": "NHD",
                           "dtype": "fp16"}, "terms_version": 2}
        with open(a.heldout_json, "w") as f:
            f.write('{\n  "meta": ' + json.dumps(hmeta) + ',\n  "rows": [\n')
            f.write(",\n".join("    " + json.dumps(r) for r in conv_rows))
            f.write("\n  ]\n}\n")
        print(f"wrote {a.heldout_json} ({len(conv_rows)} rows)", file=sys.stderr)
    if a.crosscheck and a.heldout_json:
        import tempfile
        pkv_bin = ROOT / "build" / "pkv"
        report["crosscheck"] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for p in pols:
                pf = policy_path[p] if p != "device" else str(Path(tmp) / "device.policy")
                if p == "device":
                    save_policy(dev_model, pf, "for the cross-check")
                res = subprocess.run([str(pkv_bin), "calibrate", "--policy", pf, "--evaluate", a.heldout_json,
                                      "--replay-auto"], capture_output=True, text=True)
                tail = [x for x in res.stdout.splitlines() if x.startswith("held-out:")]
                report["crosscheck"][p] = {"command": f"build/pkv calibrate --policy {rel(pf) if p != 'device' else 'DEVICE.policy'} "
                                                      f"--evaluate {rel(a.heldout_json)} --replay-auto",
                                           "rc": res.returncode, "totals": tail}
        if a.json_out:
            Path(a.json_out).write_text(json.dumps(report, indent=1) + "\n")
    md = markdown(report, order, pols, names)
    if a.md:
        Path(a.md).write_text(md)
        print(f"wrote {a.md}", file=sys.stderr)
    else:
        print(md)
    return 0


def pct(x):
    return "-" if x != x else f"{100 * x:.2f}%"


def markdown(rep, order, pols, names):
    d = rep["data"]
    L = [f"# `auto` policies judged on held-out H100 steps ({Path(d['file']).name})", "",
         f"Data: `{d['file']}` - {d['gpu']}, measured at commit {d['commit']} on {d['date']} "
         f"(FlashInfer {d['flashinfer']}, {d['rows']} rows). Replayed by `{rep['command']}` at {rep['script_commit']} "
         f"on {rep['date']} (host only: the C planner for an H100's capabilities, the measured times looked up).", "",
         "Policies:"]
    for p in pols:
        c = rep["policies"][p]["coef"]
        L.append(f"- **{p}**: {names[p]}: " + ", ".join(f"{k} {v:.4g}" for k, v in c.items()))
    ch = rep["checks"]
    L += ["", "Checks: lengths and trace checksums " + ("match on every row" if ch["lengths_and_checksums"] == "every row"
                                                       else f"{len(ch['lengths_and_checksums'])} problems (JSON)") +
          f"; the script's cost terms equal the C terms of {ch['terms_mirror_checked_rows']} calibration rows; "
          f"fixed-route plans re-planned here differ from the run's on {len(ch['fixed_route_plans_differing_from_the_run'])} "
          f"route-steps; the replay under the device constants differs from the run's auto on "
          f"{len(ch['device_replay_differing_from_the_runs_auto'])} of {rep['totals']['all']['steps']} steps.", "",
          "Regret: the policy's step time / the fastest measured fixed route of the step - 1. vs FI: FlashInfer's best "
          "time / ours (above 1: ours faster), geomean; >= FI: steps where ours is at least as fast as FlashInfer's best. "
          "`unmeas.`: steps whose auto plan (a split route at the resident wave) no measured row ran (left out of that "
          "policy's numbers).", ""]
    hdr = "| group | steps | " + " | ".join(
        f"{p}: mean regret | max | picks oracle | vs FI | >= FI | unmeas." for p in pols) + " | as run: mean regret | oracle vs FI |"
    L += [hdr, "| --- | ---: |" + " ---: | ---: | ---: | ---: | ---: | ---: |" * len(pols) + " ---: | ---: |"]

    def line(name, s):
        cells = [name, str(s["steps"])]
        for p in pols:
            x = s[p]
            cells += [pct(x["mean_regret"]), pct(x["max_regret"]), f"{x['oracle_picks']}/{x['measured']}",
                      f"{x['geomean_vs_fi']:.3f}", str(x["at_least_fi"]), str(x["unmeasured"])]
        cells += [pct(s["as_run"]["mean_regret"]), f"{s['oracle']['geomean_vs_fi']:.3f}"]
        return "| " + " | ".join(cells) + " |"

    for g in order:
        L.append(line(g, rep["groups"][g]))
    for k in ("uniform", "bimodal", "zipf", "bucketed", "traces", "all"):
        if k in rep["totals"]:
            L.append(line(f"**{k}**" + (" (all B)" if k not in ("traces", "all") else ""), rep["totals"][k]))
    if rep.get("crosscheck"):
        L += ["", "The C replay of the same steps (`pkv calibrate --evaluate --replay-auto` on the rows converted by "
              "--heldout-json; DEVICE.policy: the device constants above, written by --device-policy-out):"]
        for p, x in rep["crosscheck"].items():
            L += ["", f"- {p}: `{x['command']}` (exit {x['rc']})"] + [f"  - {t}" for t in x["totals"]]
    nz = rep["noise"]
    L += ["", f"Noise: the two passes of a fixed route differ by {pct(nz['pass_spread_median'])} (median) and "
          f"{pct(nz['pass_spread_p90'])} (90th percentile) of its time over {nz['route_steps']} route-steps."]
    for p, x in rep["paired"].items():
        L += ["", f"Paired, {p} against {x['against']}: they plan {x['steps_planned_differently']} steps differently; "
              f"{p}'s plan is faster on {x['faster']}, slower on {x['slower']}, by {pct(x['mean_time_change'])} in mean "
              "step time there. By group (faster / slower / mean change over the group's differing steps): "
              + "; ".join(f"{g} {v[0]}/{v[1]}/{pct(v[2] / (v[0] + v[1]) if v[0] + v[1] else 0)}"
                          for g, v in x["by_group"].items()) + "."]
    ex = [s for s in rep["steps"] if "explain" in s]
    for s in ex:
        L += ["", f"Explain {s['name']} ({s['group']}; FlashInfer best {s['fi_us']:.1f} us, {s['fi_path']}): each route at "
              "the planner's wave, predicted us = fixed (const + launches) + merge + stream + idle; X, Y the streamed "
              "and critical-path MB; auto's picks: " + ", ".join(f"{p} {s['pick'][p]['route']} ({s['pick'][p]['tasks']} tasks)"
                                                                for p in pols), "",
              "| route | tasks | measured us | " + " | ".join(f"{p}: predicted (fixed + merge + stream + idle; X, Y MB)" for p in pols) + " |",
              "| --- | ---: | ---: |" + " --- |" * len(pols)]
        for r in CANDIDATES:
            cells = [r, str(s["explain"][pols[0]][r]["tasks"]), f"{s['measured_fixed'][r]:.1f}"]
            for p in pols:
                e = s["explain"][p][r]
                q = e["parts"]
                cells.append(f"{e['us']:.1f} ({q['fixed']:.1f} + {q['merge']:.1f} + {q['stream']:.1f} + {q['idle']:.1f}; "
                             f"{q['X_mb']:.0f}, {q['Y_mb']:.0f})")
            L.append("| " + " | ".join(cells) + " |")
        for p in pols:
            x = s["pick"][p]
            q = x["predicted_parts"]
            cells = [f"auto under {p}: {x['route']}", str(x["tasks"]), f"{x['us']:.1f}" if x["us"] is not None else "unmeas."]
            cells += [f"{x['predicted_us']:.1f} ({q['fixed']:.1f} + {q['merge']:.1f} + {q['stream']:.1f} + {q['idle']:.1f}; "
                      f"{q['X_mb']:.0f}, {q['Y_mb']:.0f})" if pp == p else "" for pp in pols]
            L.append("| " + " | ".join(cells) + " |")
    # where the policies disagree
    a, b = pols[0], pols[1] if len(pols) > 1 else None
    if b:
        diff = [s for s in rep["steps"] if s["pick"][a]["route"] != s["pick"][b]["route"]
                or s["pick"][a]["tasks"] != s["pick"][b]["tasks"]]
        L += ["", f"Steps where {b} and {a} plan differently: {len(diff)}.", "",
              f"| step | oracle | {a} pick | {b} pick | {a} regret | {b} regret | {b} predicted: single / split / workqueue / fused (us) | measured: same |",
              "| --- | --- | --- | --- | ---: | ---: | --- | --- |"]
        for s in diff:
            def reg(p):
                x = s["pick"][p]
                return pct(x["us"] / s["oracle_us"] - 1) if x["us"] is not None else f"unmeas. (~{pct(x['approx_us'] / s['oracle_us'] - 1)})"
            pr = s["pick"][b]["predicted_fixed_us"]
            L.append(f"| {s['name']} | {s['oracle_route']} {s['oracle_us']:.1f} | {s['pick'][a]['route']} ({s['pick'][a]['tasks']}) | "
                     f"{s['pick'][b]['route']} ({s['pick'][b]['tasks']}) | {reg(a)} | {reg(b)} | "
                     + " / ".join(f"{pr[r]:.1f}" for r in CANDIDATES) + " | "
                     + " / ".join(f"{s['measured_fixed'][r]:.1f}" if r in s.get('measured_fixed', {}) else "-" for r in CANDIDATES)
                     + " |")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    sys.exit(main())
