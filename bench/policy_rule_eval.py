#!/usr/bin/env python3
"""Offline evaluation of route policies on measured held-out steps (pkv bench --heldout-set JSON).

Every held-out step was measured on every fixed route, so a policy's time on a step is the measured
time of the route it picks; the oracle is the fastest fixed route (bucketed included).  Regret is
pooled per workload row (shape, family, B; seeds and steps together), as issue 5 asks.

  bench/policy_rule_eval.py [--rule] HELDOUT.json [...]

Policies: `auto measured` (the auto row as run: the cost model of the build that measured it, or the
rule before the roofline model), the oracle among the four candidates, and with --rule planner.c's
auto_rule (the policy without a cost model), mirrored from each step's lengths; that mirror reads
whether the rows fill the planner's wave from the measured auto row, so it holds only for JSON
measured while auto was the rule (commit 172211f's held-out data).  The cost model's replay on the
same files: `pkv calibrate --policy POLICY --evaluate HELDOUT.json,...` (the C model itself).
"""
import collections
import json
import sys

CANDIDATES = ("single", "fused", "split", "workqueue")


def row_key(shape, args):
    out, skip = [], False
    for tok in args.split():
        if skip:
            skip = False
            continue
        if tok in ("--seed", "--step"):
            skip = True
            continue
        out.append(tok)
    return shape + " " + " ".join(out)


def rule(routes):
    """planner.c auto_rule: single for even batches that fill a wave, the work queue for ragged ones
    that do and for one row of >= 4096 tokens, fused otherwise.  Whether the rows fill the planner's
    wave P (rows x Hkv >= P, with P from resolve_params) is read from the measured auto row: the rule
    these steps were measured with picked single exactly then."""
    lens = [n for n in routes["single"]["lens"] if n > 0]
    if not lens:
        return "fused"
    ragged = 4 * max(lens) * len(lens) > 5 * sum(lens)
    if routes["auto"]["route_used"] == "single":
        return "workqueue" if ragged else "single"
    if len(lens) == 1 and lens[0] >= 4096:
        return "workqueue"
    return "fused"


def main():
    args = sys.argv[1:]
    with_rule = "--rule" in args
    steps = collections.OrderedDict()
    for path in [a for a in args if a != "--rule"]:
        j = json.load(open(path))
        shape = j["meta"]["shape"]
        for r in j["rows"]:
            steps.setdefault((shape["name"], shape["num_kv_heads"], r["args"]), {})[r["route"]] = r
    policies = {"auto measured": lambda R, hkv: "auto"}
    if with_rule:
        policies["rule"] = lambda R, hkv: rule(R)
    policies["oracle (4 candidates)"] = lambda R, hkv: min(CANDIDATES, key=lambda c: R[c]["kernel_us"])
    for name, pick in policies.items():
        rows = collections.defaultdict(list)
        for (shape, hkv, args), R in steps.items():
            best = min(R[c]["kernel_us"] for c in R if c != "auto")
            rows[row_key(shape, args)].append(R[pick(R, hkv)]["kernel_us"] / best - 1)
        allr = [x for v in rows.values() for x in v]
        means = {k: sum(v) / len(v) for k, v in rows.items()}
        over = sorted(((v, k) for k, v in means.items() if v > 0.03), reverse=True)
        print(f"{name}: {len(allr)} steps in {len(rows)} rows; mean regret {100 * sum(allr) / len(allr):.2f}%, "
              f"worst step {100 * max(allr):.1f}%, rows with a mean regret over 3%: {len(over)}")
        for v, k in over:
            print(f"    {k}: {100 * v:.1f}%")


if __name__ == "__main__":
    main()
