#!/usr/bin/env python3
"""Roofline-form cost model for the auto route: fit on the calibration traces, evaluate on held-out steps.

  python3 dev/host/roofline_fit.py DIR       (numpy)

DIR holds the policy data measured at commit 172211f (the hand rule's held-out run), which left the
tree with the older results; it is in git at 8d2bad8:
  mkdir -p old && git archive 8d2bad8 bench/results/policy_172211f | tar -x -C old   # DIR: old/bench/results/policy_172211f
Reads the JSON's six terms of the linear model (files measured before "terms_version": 2); the C
model (src/plan/cost.c) is this script's R3, and `pkv calibrate --from-json ... --evaluate ...`
reproduces its numbers.

Fits only on DIR/calibration.json (paper shape, seed 20260622) and evaluates only on
DIR/heldout_*.json, replaying the route each policy picks among single, fused, split
and workqueue exactly as bench/policy_rule_eval.py does (regret per step against the fastest measured
route, bucketed included; pooled per workload row).  Prints the planner's rule and the linear model
of that time (bench/results/h200.policy at 172211f) from the same code for comparison.

Every feature is O(1) per candidate from the tallies candidate_terms() already makes in its O(B) pass
(planner.c): the six cost terms, the candidate's task count, tokens, Hkv, d, dtype size, SMs and the
resident CTAs per SM (resident_ctas()).  Per candidate (one CTA task = one (row, KV head, chunk)):
  b      = d * es * 2 / 1e6           MB per token of one task (K and V of one KV head)
  MB     = terms[2]                   KV + q/o + partial-state MB of the plan
  L      = terms[3] / b               tokens of the longest task
  mMB    = terms[5]                   states of the largest merge (max count x G x (d+1) x 4) in MB
  N      = tasks; R = SMs x resident CTAs per SM; w = ceil(N / R); n_last = N - (w - 1) R
  m      = tokens x Hkv / N           mean task tokens
and four device constants fitted here: a = 1/BW (us per MB), rho = tau/a (the critical path of one
task per token, in MB of device streaming), p (soft max), plus the linear coefficients.
"""
import collections
import itertools
import json
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from policy_rule_eval import row_key, rule  # noqa: E402  (the same row keys and rule mirror)
if len(sys.argv) != 2:
    sys.exit(__doc__.split("\n\n")[1])
POL = sys.argv[1]
CALIB = ["calibration"]
HELDOUT = ["heldout_paper", "heldout_g8", "heldout_g7", "heldout_mha", "heldout_d256", "heldout_d64"]
CANDIDATES = ("single", "fused", "split", "workqueue")  # the planner's tie order: earlier wins
LINEAR_NAMES = ("const_us", "launch_us", "us_per_mb", "task_us_per_mb", "wave_us", "merge_us_per_mb")
# bench/results/h200.policy as of commit 172211f (version 1, the linear model), in LINEAR_NAMES order
LINEAR_H200_172211F = (0.0, 0.0, 0.166710226, 28.4130958, 12.6336223, 150.846732)


# ---- data ------------------------------------------------------------------------------------------
def features(sh, sms, r):
    hkv, d = sh["num_kv_heads"], sh["head_dim"]
    G = sh["num_qo_heads"] // hkv
    es = 2  # fp16 / bf16
    t = r["terms"]
    resident = 3 if (G <= 8 and d <= 128) else 2  # resident_ctas(): heads-in-N kernel 3, the other 2 (H200)
    b = d * es * 2 / 1e6
    return dict(route=r["route"], us=r["kernel_us"], terms=t, d=d, b=b, hkv=hkv,
                launches=t[1], MB=t[2], L=t[3] / b, mMB=t[5], N=max(1, r["tasks"]), R=sms * resident,
                tokens=sum(r["lens"]))


def load(names):
    steps = []
    for name in names:
        j = json.load(open(os.path.join(POL, name + ".json")))
        sh, sms = j["meta"]["shape"], j["meta"]["gpu"]["sms"]
        by = collections.OrderedDict()
        for r in j["rows"]:
            by.setdefault(r["args"], {})[r["route"]] = r
        for args, R in by.items():
            steps.append(dict(key=row_key(sh["name"], args), R=R,
                              best=min(R[c]["kernel_us"] for c in R if c != "auto"),
                              F={c: features(sh, sms, R[c]) for c in CANDIDATES}))
    return steps


# ---- the roofline model ----------------------------------------------------------------------------
def waves(f):
    w = max(1, math.ceil(f["N"] / f["R"]))
    return w, f["N"] - (w - 1) * f["R"]


def stream_mb(f, rho, tail=True):
    """X: MB streamed at BW plus the under-filled end of the last window of resident tasks.  Fluid
    model: all active tasks share BW, each capped at one task's rate (1/tau); while fewer than
    n_sat = rho / b tasks are active the device idles.  Assuming the window's lengths spread evenly
    over [max(0, 2m - L), L], the idle integral is rho * q * (L - lo) / 2 with q = n_sat / window.
    Rect grids (single, split) dispatch rows fastest, so their last window holds every row length;
    the work queue runs longest first, so after its first wave the tail is short (no term)."""
    if not tail:
        return f["MB"]
    w, _ = waves(f)
    if w > 1 and f["route"] not in ("single", "split"):
        return f["MB"]
    q = rho / f["b"] / min(f["N"], f["R"])
    if q >= 1:
        return f["MB"]
    m = f["tokens"] * f["hkv"] / f["N"]
    lo = max(0.0, 2 * m - f["L"])
    return f["MB"] + rho * q * (f["L"] - lo) / 2


def idle_wave_mb(f):
    """Quant: idle slots of the last partial wave of a multi-wave grid, in MB of a full wave."""
    w, n_last = waves(f)
    return 0.0 if w <= 1 else (1 - n_last / f["R"]) * f["MB"] * f["R"] / f["N"]


def softmax_p(x, y, p):
    return max(x, y) if p is None else (x ** p + y ** p) ** (1.0 / p)


FORMS = {
    # name: (design(f, rho, p) -> linear columns, column names, p grid)
    "R1 max(MB/BW, L*tau) + launch + merge": (
        lambda f, rho, p: [1, f["launches"], f["mMB"], max(f["MB"], rho * f["L"])],
        ["const_us", "launch_us", "merge_us_per_MB", "a_us_per_MB"], [None]),
    "R2 + fluid tail + wave idle + fused merge (hard max)": (
        lambda f, rho, p: [1, f["launches"], f["mMB"] * (f["route"] == "fused"), f["mMB"] * (f["route"] != "fused"),
                           max(stream_mb(f, rho), rho * f["L"]), idle_wave_mb(f)],
        ["const_us", "launch_us", "fused_merge_us_per_MB", "kernel_merge_us_per_MB", "a_us_per_MB", "idle_us_per_MB"],
        [None]),
    "R3 = R2 with a soft max (p fitted)": (
        lambda f, rho, p: [1, f["launches"], f["mMB"] * (f["route"] == "fused"), f["mMB"] * (f["route"] != "fused"),
                           softmax_p(stream_mb(f, rho), rho * f["L"], p), idle_wave_mb(f)],
        ["const_us", "launch_us", "fused_merge_us_per_MB", "kernel_merge_us_per_MB", "a_us_per_MB", "idle_us_per_MB"],
        [2, 2.5, 3, 3.5, 4, 5, 6, 8, None]),
}


def nnls_rel(X, y):
    """Relative least squares (rows weighted 1/y) made non-negative by elimination, as cost.c does."""
    w = 1.0 / y
    Xw, yw = X * w[:, None], y * w
    act = np.ones(X.shape[1], bool)
    while True:
        c = np.zeros(X.shape[1])
        if act.any():
            c[act] = np.linalg.lstsq(Xw[:, act], yw, rcond=None)[0]
        neg = np.where(act & (c < 0))[0]
        if len(neg) == 0:
            return c
        act[neg[np.argmin(c[neg])]] = False


def fit(design, pgrid, samples):
    """Grid over rho (and p); linear coefficients by relative NNLS; keep the least relative SSE."""
    y = np.array([f["us"] for f in samples])
    best = None
    for rho, p in itertools.product(np.geomspace(0.01, 0.2, 161), pgrid):
        X = np.array([design(f, rho, p) for f in samples], float)
        c = nnls_rel(X, y)
        e = float(np.sum((X @ c / y - 1) ** 2))
        if best is None or e < best[0]:
            best = (e, rho, p, c)
    return best


# ---- evaluation (as bench/policy_rule_eval.py) ----------------------------------------------------
def evaluate(steps, pick):
    rows = collections.defaultdict(list)
    for s in steps:
        rows[s["key"]].append(s["R"][pick(s)]["kernel_us"] / s["best"] - 1)
    allr = [x for v in rows.values() for x in v]
    means = {k: sum(v) / len(v) for k, v in rows.items()}
    return dict(steps=len(allr), rows=len(rows), mean=100 * sum(allr) / len(allr), worst=100 * max(allr),
                rowmean=100 * sum(means.values()) / len(means),
                rowmeans={k: 100 * v for k, v in means.items()},
                over=sorted(((100 * v, k) for k, v in means.items() if v > 0.03), reverse=True))


def short(k):
    return k.replace(" --trace", "").replace(" --batch ", " B").split(" --requests")[0]


def line(name, r):
    return (f"{name:<52} mean {r['mean']:5.2f}%  rows-mean {r['rowmean']:5.2f}%  worst step {r['worst']:5.1f}%  "
            f"rows>3%: {len(r['over'])}")


def main():
    calib, held = load(CALIB), load(HELDOUT)
    cal_samples = [f for s in calib for f in s["F"].values()]
    print(f"fit on {len(cal_samples)} measurements ({len(calib)} calibration steps); "
          f"evaluate on {len(held)} held-out steps\n")

    results = collections.OrderedDict()
    results["rule (auto_rule)"] = (evaluate(held, lambda s: rule(s["R"])), evaluate(calib, lambda s: rule(s["R"])), None)
    # the linear model this replaced (policy version 1, fitted live on the H200 at commit 172211f)
    lin = LINEAR_H200_172211F
    lin_pred = lambda f: sum(a * b for a, b in zip(lin, f["terms"]))
    lin_pick = lambda s: min(CANDIDATES, key=lambda c: lin_pred(s["F"][c]))
    results["linear model (policy v1)"] = (evaluate(held, lin_pick), evaluate(calib, lin_pick), lin_pred)

    for name, (design, cols, pgrid) in FORMS.items():
        e, rho, p, c = fit(design, pgrid, cal_samples)
        pred = (lambda design, rho, p, c: lambda f: float(np.dot(design(f, rho, p), c)))(design, rho, p, c)
        pick = (lambda pred: lambda s: min(CANDIDATES, key=lambda k: pred(s["F"][k])))(pred)
        results[name] = (evaluate(held, pick), evaluate(calib, pick), pred)
        a = c[cols.index("a_us_per_MB")]
        print(f"{name}\n  rho = {rho:.5f} MB/token, p = {p if p is not None else 'inf (max)'}, rel SSE {e:.3f}; "
              f"BW = 1/a = {1e3 / a:.0f} GB/s, tau = a*rho = {1e3 * a * rho:.2f} ns/token, "
              f"n_sat(d128) = {rho / 512e-6:.0f} tasks")
        print("  " + ", ".join(f"{n} = {v:.4g}" for n, v in zip(cols, c)))
        if "idle_us_per_MB" in cols:
            print(f"  (idle / a = {c[cols.index('idle_us_per_MB')] / a:.3f} of the idle wave's MB is lost)")
    oracle = lambda s: min(CANDIDATES, key=lambda c: s["R"][c]["kernel_us"])
    results["oracle (4 candidates)"] = (evaluate(held, oracle), evaluate(calib, oracle), None)

    print("\nheld-out (600 steps, 140 workload rows); mean = over steps as policy_rule_eval.py, rows-mean = over rows")
    for name, (h, c, _) in results.items():
        print(line(name, h) + f"   | calib mean {c['mean']:.2f}%")
    for name, (h, _, _) in results.items():
        if h["over"]:
            print(f"  {name}: rows over 3%: " + "; ".join(f"{short(k)} {v:.1f}%" for v, k in h["over"]))
    best = list(FORMS)[-1]
    h = results[best][0]
    top = sorted(((v, k) for k, v in h["rowmeans"].items()), reverse=True)[:6]
    print(f"  {best}: largest row means: " + "; ".join(f"{short(k)} {v:.2f}%" for v, k in top))
    d64 = [k for k in h["rowmeans"] if k.startswith("d64 --trace homogeneous --batch 64 ")][0]
    print(f"  d64 homogeneous B64 (the rule's miss): rule {results['rule (auto_rule)'][0]['rowmeans'][d64]:.2f}%, "
          f"{best.split()[0]} {h['rowmeans'][d64]:.2f}%")
    print("\nmedian |predicted / measured - 1| per route on held-out (calibration in brackets)")
    for name, (_, _, pred) in results.items():
        if pred is None:
            continue
        parts = []
        for c in CANDIDATES:
            eh = np.median([abs(pred(s["F"][c]) / s["F"][c]["us"] - 1) for s in held]) * 100
            ec = np.median([abs(pred(s["F"][c]) / s["F"][c]["us"] - 1) for s in calib]) * 100
            parts.append(f"{c} {eh:.1f}% ({ec:.1f})")
        allh = np.median([abs(pred(f) / f["us"] - 1) for s in held for f in s["F"].values()]) * 100
        print(f"  {name:<52} all {allh:.1f}%  " + "  ".join(parts))


if __name__ == "__main__":
    sys.exit(main())
