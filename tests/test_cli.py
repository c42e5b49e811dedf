#!/usr/bin/env python3
"""test_cli.py PKV - the pkv tool for real on the CPU backend: help, trace (golden checksum, file
round trip), check, bench (Markdown + JSON with every counter; launches per step of bucketed and
workqueue on the B8 bimodal anchor step), and bad options."""
import json
import os
import re
import subprocess
import sys
import tempfile

pkv = sys.argv[1]
passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)


# every run: a PKV_* setting the bench JSON must record (quotes escaped), and a PKV_COMMIT it must not
os.environ["PKV_TEST_MARK"] = 'a "b"'
os.environ["PKV_COMMIT"] = "cli-test"


def run(*args, rc=0):
    p = subprocess.run([pkv, *args], capture_output=True, text=True, timeout=600)
    if rc is not None:
        check(p.returncode == rc, f"pkv {' '.join(args)} exited {p.returncode}, expected {rc}: {p.stderr[-500:]}")
    return p


for cmd in ("trace", "bench", "check"):
    check("usage: pkv " + cmd in run(cmd, "--help").stdout, f"pkv {cmd} --help")
run("nonsense", rc=2)
run("bench", "--no-such-option", "1", rc=2)
run("trace", "--family", "nope", rc=2)
run("bench", "--backend", "cpu", "--lens", "5", "--pdl", "2", rc=2)
# numbers out of range, empty, or past int32 (not wrapped: 4294967297 reps is not 1), unknown names (not the
# default), a JSON file that cannot be written (before measuring, and a failed write), a directory as input
for args in (("--page-size", "0"), ("--page-size", "-16"), ("--reps", "4294967297"), ("--pdl", ""),
             ("--rotate-gib", "nan"), ("--rotate-gib", "-5"), ("--dtype", "fp4"), ("--layout", "xyz"),
             ("--parallelism", "100000"), ("--lens", ",".join(["5"] * 4097))):
    p = run("bench", "--backend", "cpu", "--lens", "5", *args, rc=2) if args[0] != "--lens" else \
        run("bench", "--backend", "cpu", *args, rc=2)
    check(p.stderr.strip() != "", f"bench {args[0]} {args[1][:20]}: no message")
run("bench", "--backend", "cpu", "--lens", "5", "--json", os.path.join("no-such-dir", "x", "out.json"), rc=1)
if os.path.exists("/dev/full"):
    p = run("bench", "--backend", "cpu", "--lens", "5", "--route", "single", "--reps", "1", "--wall-reps", "1",
            "--json", "/dev/full", rc=1)
    check("failed" in p.stderr, f"a failed JSON write: {p.stderr[-300:]}")
run("check", "--count", "0", rc=2)
run("check", "--backend", "garbage", rc=2)
run("trace", "--batch", "1000000000", rc=2)
p = run("calibrate", "--from-json", os.path.dirname(os.path.abspath(pkv)), rc=None)  # a directory
check(p.returncode > 0 and "cannot read" in p.stderr, f"calibrate on a directory: rc {p.returncode} {p.stderr[-200:]}")
# --shape HQ:HKV:D: any model's heads (G = 12 at d = 64 here), recorded in the repro line; malformed ones are
# refused as options, shapes the library does not take too, with its message, before anything is measured
with tempfile.TemporaryDirectory() as tmp:
    js = os.path.join(tmp, "s.json")
    run("bench", "--backend", "cpu", "--shape", "48:4:64", "--dtype", "bf16", "--lens", "300,17", "--route", "split",
        "--reps", "1", "--wall-reps", "1", "--json", js)
    doc = json.load(open(js))
    sh = doc["meta"]["shape"]
    check((sh.get("num_qo_heads"), sh.get("num_kv_heads"), sh.get("head_dim"), sh.get("dtype")) == (48, 4, 64, "bf16"),
          f"custom shape in the JSON: {sh}")
    row = doc["rows"][0]
    check("--shape 48:4:64 --dtype bf16" in row["repro"] and row["rel_err"] < 2e-3, f"custom shape row: {row}")
for bad in ("48:4", "48:4:64x", "0:4:64", "a:b:c"):
    check("unknown shape" in run("bench", "--backend", "cpu", "--shape", bad, "--lens", "5", rc=2).stderr, bad)
for bad, msg in (("48:5:64", "not a multiple"), ("48:4:96", "head dim"), ("68:4:128", "group size")):
    p = run("bench", "--backend", "cpu", "--shape", bad, "--lens", "5", "--reps", "1", "--wall-reps", "1", rc=2)
    check(msg in p.stderr and p.stdout == "", f"--shape {bad}: {p.stderr[-300:]}")
p = run("bench", "--backend", "cpu", "--lens", "64", "--reps", "1", "--wall-reps", "1", "--pdl", "0", "--behind-producer")
check("ignored on the CPU backend" in p.stderr and "| lens |" in p.stdout, "--behind-producer on the CPU: " + p.stderr[-200:])

out = run("trace", "--family", "bimodal", "--seed", "20260623", "--show", "2").stdout
check("checksum e54cc4d234228ff6" in out and "48 steps" in out, "bimodal trace checksum: " + out[:200])
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "t.csv")
    run("trace", "--family", "zipf", "--seed", "7", "--out", path, "--show", "0")
    a = run("trace", "--family", "zipf", "--seed", "7", "--show", "0").stdout.split("checksum")[1].split()[0]
    b = run("trace", "--in", path, "--show", "0").stdout.split("checksum")[1].split()[0]
    check(a == b, f"trace file round trip {a} != {b}")

    out = run("check", "--backend", "cpu", "--count", "4").stdout
    m = re.search(r"(\d+) passed, 0 failed, 0 unsupported .*fp8 caches: (\d+) runs", out)
    check(m is not None and int(m.group(1)) >= int(m.group(2)) > 0, "pkv check (fp8 caches among the cases): " + out[-300:])

    js = os.path.join(tmp, "b.json")
    out = run("bench", "--backend", "cpu", "--lens", "300,0,1,2000", "--reps", "1", "--wall-reps", "1",
              "--json", js).stdout
    check("| lens |" in out, "bench prints a Markdown table")
    rows = json.load(open(js))["rows"]
    check(len(rows) == 6, f"6 routes, got {len(rows)}")
    for r in rows:
        for k in ("kernel_us", "wall_us", "kv_bytes", "launches", "tasks", "merge_state_bytes", "achieved_gbps",
                  "rel_err", "repro", "floor_us", "pages_floor_us"):
            check(k in r, f"row has {k}")
        check(r["pages_floor_us"] is None, "no pages floor on the CPU backend")
        check(r["rel_err"] is not None and r["rel_err"] < 2e-3, f"{r['route']} rel_err {r['rel_err']}")
        check(r["unwritten_outputs"] == 0, "outputs written")
        check(r["kv_bytes"] == 2301 * 8 * 128 * 2 * 2, "kv bytes")

    # graph-stable plans: the work queue on a fixed grid, 2 launches, right; other routes refused
    js_g = os.path.join(tmp, "bg.json")
    run("bench", "--backend", "cpu", "--lens", "300,0,1,2000", "--route", "workqueue", "--graph-max-batch", "pow2",
        "--parallelism", "132", "--reps", "1", "--wall-reps", "1", "--json", js_g)
    g = json.load(open(js_g))["rows"][0]
    check(g["launches"] == 2 and g["grid_ctas"] >= g["tasks"] > 0 and g["rel_err"] < 2e-3,
          f"graph-stable row: {g['launches']} launches, {g['grid_ctas']} CTAs for {g['tasks']} tasks, "
          f"rel_err {g['rel_err']}")
    out = run("bench", "--backend", "cpu", "--lens", "300,2000", "--route", "split", "--graph-max-batch", "4",
              "--reps", "1", "--wall-reps", "1", rc=None)
    check(out.returncode != 0 and "graph-stable plans run the work queue" in out.stdout + out.stderr,
          "bench refuses a graph-stable split plan with the reason")
    run("bench", "--backend", "cpu", "--lens", "5", "--graph-max-batch", "-3", rc=2)

    # K and V interleaved per page in one pool: the same rows, checked against the reference
    js2 = os.path.join(tmp, "bi.json")
    out = run("bench", "--backend", "cpu", "--kv-interleaved", "--lens", "300,0,1,2000", "--reps", "1",
              "--wall-reps", "1", "--json", js2).stdout
    check("K/V interleaved per page" in out, "bench says the pool is interleaved")
    doc = json.load(open(js2))
    check(doc["meta"]["shape"]["kv_interleaved"] is True, "JSON records the interleaved pool")
    check(doc["meta"]["env"].get("PKV_TEST_MARK") == "a \"b\"" and "PKV_COMMIT" not in doc["meta"]["env"],
          "JSON records the run's PKV_* settings (not PKV_COMMIT)")
    for r in doc["rows"]:
        check(r["rel_err"] is not None and r["rel_err"] < 2e-3, f"interleaved {r['route']} rel_err {r['rel_err']}")
        check(r["unwritten_outputs"] == 0, "interleaved outputs written")
        check(r["kv_bytes"] == 2301 * 8 * 128 * 2 * 2, "interleaved kv bytes")

    js = os.path.join(tmp, "a.json")
    run("bench", "--backend", "cpu", "--anchor", "B8_bimodal", "--reps", "1", "--wall-reps", "1",
        "--ctas-per-unit", "2", "--threads", "66", "--json", js)
    rows = {r["route"]: r for r in json.load(open(js))["rows"]}
    # 66 threads x 2 = a wave of 132 tasks, as on a GPU of 66 SMs: every route splits
    check(rows["workqueue"]["launches"] == 2, f"workqueue launches {rows['workqueue']['launches']}")
    check(rows["fused"]["launches"] == 1, f"fused launches {rows['fused']['launches']}")
    check(rows["bucketed"]["launches"] == 4, f"bucketed launches {rows['bucketed']['launches']} (2 buckets)")
    check(rows["single"]["launches"] == 1 and rows["single"]["tasks"] == 64, "single: 1 launch, 64 tasks")
    # the plans an H200 gets (132 SMs), executed by the CPU backend
    run("bench", "--backend", "cpu", "--anchor", "B8_bimodal", "--reps", "1", "--wall-reps", "1",
        "--parallelism", "132", "--json", js)
    rows = {r["route"]: r for r in json.load(open(js))["rows"]}
    check(rows["workqueue"]["launches"] == 2, f"132 SMs: workqueue launches {rows['workqueue']['launches']}")
    check(rows["bucketed"]["launches"] == 4, f"132 SMs: bucketed launches {rows['bucketed']['launches']}")
    check(rows["fused"]["launches"] == 1 and rows["auto"]["launches"] == 1, "132 SMs: fused and auto one launch")
    check(all(r["rel_err"] < 2e-3 for r in rows.values()), "132 SMs plans are right on the CPU")

    # the cost model: --explain, calibration from this run, offline refit and replay, --policy
    js = os.path.join(tmp, "c.json")
    pol = os.path.join(tmp, "c.policy")
    out = run("bench", "--backend", "cpu", "--trace", "uniform", "--batch", "2", "--steps", "3", "--reps", "1",
              "--wall-reps", "1", "--no-check", "--explain", "--calibrate-out", pol, "--json", js).stdout
    check("| predicted us | measured us |" in out, "--explain prints predicted next to measured")
    check("calibrated on 12 measurements" in out, "calibration from the run: " + out[-400:])
    check(open(pol).readline().strip() == "persistentkv-policy 2", "policy file header")
    pol2 = os.path.join(tmp, "d.policy")
    out = run("calibrate", "--from-json", js, "--evaluate", js, "--out", pol2).stdout
    check("fit on 12 measurements" in out and "held-out: evaluation on 3 measured steps in 1 workload rows" in out,
          "calibrate: " + out)
    check("| paper --trace uniform --batch 2 --requests 6 | 3 |" in out, "calibrate: regret per workload row: " + out)
    out = run("bench", "--backend", "cpu", "--lens", "500,3000", "--route", "auto", "--policy", pol2, "--reps", "1",
              "--wall-reps", "1").stdout
    check("auto:" in out, "auto with a policy file")
    # auto does not weigh a single-route plan that fills fewer than half of the SMs (pkv_cost_candidate):
    # Gemma-2's local layers at B8_uniform under the H200 policy, planned for 132 SMs on the CPU (on the
    # H200 auto picked single there before: 94.9 us against fused 71.4)
    h200 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "results", "h200.policy")
    out = run("bench", "--backend", "cpu", "--parallelism", "132", "--policy", h200, "--shape", "d256", "--soft-cap",
              "50", "--window", "4096", "--anchor", "B8_uniform", "--route", "all", "--explain", "--reps", "1",
              "--wall-reps", "1", "--no-check").stdout
    # the single plan is predicted faster than auto's pick, so the rule (not the model) keeps auto off it
    m_single = re.search(r"\| B8_uniform \| single \| ([0-9.]+) \(not weighed\) \|", out)
    m_auto = re.search(r"\| B8_uniform \| auto:(\w+) \| ([0-9.]+) \|", out)
    check(m_single is not None and m_auto is not None and m_auto.group(1) != "single"
          and float(m_single.group(1)) < float(m_auto.group(2)),
          "auto skips a single plan of 64 tasks on 132 SMs that the model predicts faster: " + out[-1500:])
    # --replay-auto re-plans each step with auto as the run did: with the policy that ran (a ragged step
    # planned for 132 SMs on the CPU) the re-planned step is the plan the measured auto ran
    js3 = os.path.join(tmp, "e.json")
    run("bench", "--backend", "cpu", "--lens", "3000,200,9000,50,700,1200", "--reps", "1", "--wall-reps", "1",
        "--no-check", "--parallelism", "132", "--policy", pol2, "--json", js3)
    check(json.load(open(js3))["meta"]["parallelism"] == 132, "bench JSON: the parallelism the plans were made for")
    out = run("calibrate", "--policy", pol2, "--evaluate", js3, "--replay-auto").stdout
    check("its plan was measured on 1 of 1 steps" in out and "a plan other than the measured auto's on 0" in out,
          "calibrate --replay-auto reproduces auto's plans: " + out[-400:])
    run("bench", "--backend", "cpu", "--lens", "5", "--policy", os.path.join(tmp, "missing.policy"), rc=2)

    # a sliding window and a soft cap: the attended tokens only (300 + 0 + 1 + 500), checked against the
    # reference with both, recorded in the JSON and in each row's repro command
    js4 = os.path.join(tmp, "bw.json")
    out = run("bench", "--backend", "cpu", "--window", "500", "--soft-cap", "30", "--lens", "300,0,1,2000",
              "--reps", "1", "--wall-reps", "1", "--json", js4).stdout
    check("window 500, soft cap 30" in out, "bench names the window and the cap")
    doc = json.load(open(js4))
    check(doc["meta"]["shape"]["window"] == 500 and doc["meta"]["shape"]["logits_soft_cap"] == 30,
          "JSON records the window and the cap")
    for r in doc["rows"]:
        check(r["rel_err"] is not None and r["rel_err"] < 2e-3, f"windowed {r['route']} rel_err {r['rel_err']}")
        check(r["unwritten_outputs"] == 0, "windowed outputs written")
        check(r["kv_bytes"] == 801 * 8 * 128 * 2 * 2, f"windowed kv bytes {r['kv_bytes']}")
        check("--window 500 --soft-cap 30" in r["repro"], "repro carries the window and the cap")
    run("bench", "--backend", "cpu", "--window", "-3", "--lens", "5", rc=2)

    # fp8 KV caches: e4m3 at a scale, against the float64 reference (which reads the same codes at the same
    # scale); one byte an element in the KV bytes; the type and the scale in the JSON, the footer and each
    # row's repro command, which runs as it is
    js5 = os.path.join(tmp, "f8.json")
    out = run("bench", "--backend", "cpu", "--kv-dtype", "fp8_e4m3", "--kv-scale", "0.05", "--lens", "300,0,1,2000",
              "--reps", "1", "--wall-reps", "1", "--json", js5).stdout
    check("fp16 q and o, fp8_e4m3 KV cache (scale 0.05)" in out, "bench names the fp8 cache: " + out[-400:])
    doc = json.load(open(js5))
    sh = doc["meta"]["shape"]
    check((sh.get("dtype"), sh.get("kv_dtype"), sh.get("kv_scale")) == ("fp16", "fp8_e4m3", 0.05),
          f"JSON records the fp8 cache: {sh}")
    check(len(doc["rows"]) == 6, f"fp8: 6 routes, got {len(doc['rows'])}")
    for r in doc["rows"]:
        check(r["rel_err"] is not None and r["rel_err"] < 2e-3, f"fp8 {r['route']} rel_err {r['rel_err']}")
        check(r["unwritten_outputs"] == 0, "fp8 outputs written")
        check(r["kv_bytes"] == 2301 * 8 * 128 * 2 * 1, f"fp8 kv bytes {r['kv_bytes']}")
        check("--kv-dtype fp8_e4m3 --kv-scale 0.05" in r["repro"], "repro carries the fp8 cache: " + r["repro"])
    repro = doc["rows"][1]["repro"].split()
    check(repro[:2] == ["pkv", "bench"], "repro starts with pkv bench")
    js6 = os.path.join(tmp, "f8r.json")
    run(*repro[1:], "--reps", "1", "--wall-reps", "1", "--json", js6)
    r6 = json.load(open(js6))["rows"][0]
    check(r6["repro"] == doc["rows"][1]["repro"] and r6["rel_err"] < 2e-3, f"the repro line reruns: {r6['repro']}")
    # e5m2 beside bf16 q in an interleaved HND pool (an anchor step), and --dtype fp8 on a trace step
    js7 = os.path.join(tmp, "f8a.json")
    run("bench", "--backend", "cpu", "--dtype", "bf16", "--kv-dtype", "fp8_e5m2", "--kv-scale", "4", "--layout", "hnd",
        "--kv-interleaved", "--anchor", "B1_N2048", "--route", "split", "--reps", "1", "--wall-reps", "1", "--json", js7)
    doc = json.load(open(js7))
    r = doc["rows"][0]
    check((doc["meta"]["shape"]["kv_dtype"], doc["meta"]["shape"]["dtype"]) == ("fp8_e5m2", "bf16")
          and r["rel_err"] < 1e-2 and r["kv_bytes"] == 2048 * 8 * 128 * 2 and r["flashinfer_best_us"] is None,
          f"e5m2 anchor row: {r['rel_err']} {r['kv_bytes']}")
    out = run("bench", "--backend", "cpu", "--dtype", "fp8", "--trace", "bimodal", "--batch", "1", "--requests", "1", "--steps", "1",
              "--route", "fused", "--reps", "1", "--wall-reps", "1").stdout
    check("fp8_e4m3 KV cache (scale 1)" in out and "| fused | 1 |" in out, "--dtype fp8 on a trace: " + out[-400:])
    # a cache of q's type is recorded as such, at scale 1
    check((json.load(open(js4))["meta"]["shape"].get("kv_dtype"), json.load(open(js4))["meta"]["shape"].get("kv_scale"))
          == ("fp16", 1), "JSON records an fp16 cache")
    run("bench", "--backend", "cpu", "--soft-cap", "-1", "--lens", "5", rc=2)
    run("bench", "--backend", "cpu", "--soft-cap", "nan", "--lens", "5", rc=2)

# issue 34: bad options fail at once, with a message about the option given (exit 2, nothing on stdout)
def refused(args, *words, rc=2, stdout_empty=True):
    p = run(*args, rc=rc)
    check(all(w in p.stderr for w in words) and (p.stdout == "" or not stdout_empty),
          f"pkv {' '.join(args)[:120]}: expected {words} in the message, got {p.stderr[-300:]!r}, "
          f"stdout {p.stdout[:200]!r}")
    return p


# a shape the library does not take: its message before any set-up or step (no --lens: the default trace)
refused(("bench", "--backend", "cpu", "--shape", "30:8:128"), "--shape 30:8:128", "not a multiple")
refused(("bench", "--backend", "cpu", "--shape", "30:10:96"), "head_dim 96")
# one message per option, about that option
p = refused(("bench", "--backend", "cpu", "--dtype", "fp4"), "--dtype", "fp4")
check("--layout" not in p.stderr, "--dtype fp4 names --dtype only: " + p.stderr)
# the KV cache's type and an fp8 cache's scale
refused(("bench", "--backend", "cpu", "--lens", "5", "--kv-dtype", "fp4"), "--kv-dtype", "fp8_e4m3", "'fp4'")
refused(("bench", "--backend", "cpu", "--lens", "5", "--kv-dtype", "fp8_e4m3", "--kv-scale", "-1"), "--kv-scale",
        "positive")
refused(("bench", "--backend", "cpu", "--lens", "5", "--dtype", "fp8", "--kv-scale", "nan"), "--kv-scale", "finite")
refused(("bench", "--backend", "cpu", "--lens", "5", "--kv-scale", "2"), "--kv-scale applies to an fp8 cache")
refused(("bench", "--backend", "cpu", "--lens", "5", "--kv-dtype", "bf16"), "--kv-dtype bf16", "q's type")
p = refused(("bench", "--backend", "cpu", "--layout", "foo"), "--layout", "foo")
check("--dtype" not in p.stderr, "--layout foo names --layout only: " + p.stderr)
# --lens: which length is wrong and why
refused(("bench", "--backend", "cpu", "--lens", "10,-5"), "-5", "at least 0")
refused(("bench", "--backend", "cpu", "--lens", "5000000000"), "5000000000", "2^30")
refused(("bench", "--backend", "cpu", "--lens", "5,,6"), "length 2")
refused(("bench", "--backend", "cpu", "--lens", "1073741824,1073741824,1073741824", "--page-size", "1"),
        "more than a page table holds")
# --threads 0 is not "every core" by accident; negative or huge numbers are refused, not wrapped
refused(("bench", "--backend", "cpu", "--lens", "5", "--threads", "0"), "--threads", "[1, 1024]")
refused(("check", "--backend", "cpu", "--count", "1", "--threads", "0"), "--threads")
refused(("check", "--backend", "cpu", "--count", "1", "--seed", "-1"), "--seed")
refused(("trace", "--show", "-5"), "--show")
# one workload at a time, and no option of another workload silently ignored
refused(("bench", "--backend", "cpu", "--anchor", "B1_N2048", "--lens", "5"), "--anchor", "--lens", "give one")
refused(("bench", "--backend", "cpu", "--lens", "5", "--batch", "4"), "--batch applies to --trace")
with tempfile.TemporaryDirectory() as tmp:
    # trace --out to a directory that does not exist: the error, not the steps first
    p = run("trace", "--family", "zipf", "--out", os.path.join(tmp, "no-such-dir", "t.csv"), rc=1)
    check("step 0" not in p.stdout and "cannot open" in p.stderr, "trace --out fails first: " + p.stdout[:200])
    tpath = os.path.join(tmp, "t.csv")
    run("trace", "--family", "zipf", "--out", tpath, "--show", "0")
    refused(("trace", "--in", tpath, "--seed", "3"), "--seed", "--in")
    # --calibrate-out that cannot be written fails before measuring
    refused(("bench", "--backend", "cpu", "--lens", "5", "--calibrate-out", os.path.join(tmp, "no", "x.policy")),
            "cannot write", rc=1)
    # an option given twice takes its last value
    ja, jb = os.path.join(tmp, "first.json"), os.path.join(tmp, "last.json")
    run("bench", "--backend", "cpu", "--lens", "64", "--route", "single", "--reps", "1", "--wall-reps", "1",
        "--json", ja, "--json", jb)
    check(os.path.exists(jb) and not os.path.exists(ja), "the last --json wins")
    # --no-check: '-' where nothing was compared, never nan
    out = run("bench", "--backend", "cpu", "--lens", "64", "--route", "single", "--reps", "1", "--wall-reps", "1",
              "--no-check").stdout
    check("nan" not in out.lower() and "| lens |" in out, "--no-check prints '-', not nan: " + out[-400:])
    out = run("bench", "--backend", "cpu", "--trace", "bimodal", "--batch", "1", "--steps", "1", "--route", "single",
              "--reps", "1", "--wall-reps", "1", "--no-check").stdout
    check("nan" not in out.lower() and "| single |" in out, "--no-check summary: " + out[-400:])
    # calibrate: a file it cannot read stops it (no fit of 0 measurements, nothing written), and its
    # messages carry its own name, also those of the measurements it runs through pkv bench
    pol = os.path.join(tmp, "m.policy")
    p = run("calibrate", "--from-json", os.path.join(tmp, "missing.json"), "--out", pol, rc=1)
    check("cannot read" in p.stderr and "measurements" not in p.stderr and not os.path.exists(pol),
          "calibrate --from-json missing.json: " + p.stderr)
    run("bench", "--backend", "cpu", "--lens", "64", "--reps", "1", "--wall-reps", "1", "--json", ja)
    p = run("calibrate", "--from-json", ja + "," + os.path.join(tmp, "missing.json"), "--out", pol, rc=1)
    check("cannot read" in p.stderr and "fit" not in p.stderr and not os.path.exists(pol),
          "a missing file of several: no fit of the others: " + p.stderr)
    p = run("calibrate", "--from-json", tpath, "--out", pol, rc=1)
    check("no measured rows" in p.stderr and not os.path.exists(pol), "a file without rows: " + p.stderr)
    for args in (("--backend", "cuda", "--json", os.path.join(tmp, "no", "c.json")), ("--reps", "0")):
        p = run("calibrate", *args, rc=None)
        check(p.returncode != 0 and p.stderr.startswith("pkv calibrate:") and "pkv bench:" not in p.stderr,
              f"calibrate {' '.join(args)}: its own name: {p.stderr[-300:]!r}")
    refused(("calibrate", "--policy", pol), "--policy needs --evaluate")
    refused(("calibrate", "--from-json", ja, "--backend", "cpu"), "--backend applies to a live calibration")

# scripts/bench.sh says what it builds; with nvcc but no GPU it builds the CPU path only (unless
# PKV_BUILD_CUDA=1): a fake nvcc and a failing nvidia-smi, a dry run that builds nothing
bench_sh = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "bench.sh")
with tempfile.TemporaryDirectory() as tmp:
    fake = os.path.join(tmp, "bin")
    os.mkdir(fake)
    for tool, rc in (("nvcc", 0), ("nvidia-smi", 9)):
        with open(os.path.join(fake, tool), "w") as f:
            f.write(f"#!/bin/sh\nexit {rc}\n")
        os.chmod(os.path.join(fake, tool), 0o755)
    env = dict(os.environ, PATH=fake + os.pathsep + os.environ.get("PATH", ""), PKV_BENCH_DRY_RUN="1",
               PKV_BUILD_DIR=os.path.join(tmp, "build"))
    env.pop("PKV_BUILD_CUDA", None)
    for setting, want, rc in ((None, "CUDA backend OFF (nvcc but no GPU", 0), ("1", "CUDA backend ON", 0),
                              ("0", "CUDA backend OFF", 0), ("maybe", "PKV_BUILD_CUDA takes 1 or 0", 2)):
        e = dict(env, **({"PKV_BUILD_CUDA": setting} if setting else {}))
        try:
            p = subprocess.run(["bash", bench_sh, "--lens", "5"], capture_output=True, text=True, timeout=60, env=e)
            ok = p.returncode == rc and want in p.stderr and p.stdout == "" and \
                not os.path.exists(os.path.join(tmp, "build"))
            got = f"rc {p.returncode}: {p.stderr[-300:]!r}"
        except subprocess.TimeoutExpired:
            ok, got = False, "still running after 60 s"
        check(ok, f"bench.sh with nvcc, no GPU, PKV_BUILD_CUDA={setting}: expected {want!r}, {got}")

print(f"test_cli: {passed} passed, {failed} failed")
sys.exit(0 if failed == 0 and passed > 0 else 1)
