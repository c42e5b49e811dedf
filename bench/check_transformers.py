#!/usr/bin/env python3
"""Checks `pkv decode` against Hugging Face transformers (issue 36 item 4): code nobody here wrote.

A LlamaForCausalLM from a small LlamaConfig (the hf-small shape: 4 layers, hidden 1024, 16 query and 4 KV
heads of 64, MLP 2816, vocabulary 32000) with transformers' own random initialisation (seeded) in bf16 on
the GPU generates greedily with its own attention for 16 ragged prompts; its weights are written in the
PKVW layout and `pkv decode --weights` generates from the same prompts through our layers, page manager,
append and attention.  Reported: per prompt, how many of the new tokens agree before the first difference
(and at that step, the margin between transformers' top two logits - a near tie explains a flip), and the
first token's logits against each other (relative L2, max abs).  JSON with --json.

A random model's logits are nearly flat: its greedy picks meet exact bf16 ties within a few dozen tokens, in
transformers' own bf16 run against its fp32 one as much as in ours.  So the model is first trained
(--train-steps, at most 3000 steps or --train-seconds, 150 s, or until the loss is below 0.02), with
transformers' own training step (AdamW, bf16 autocast over fp32 weights), on a task that only attention can do:
sequences that repeat a random segment of 8..64 distinct tokens (drawn from the first --train-vocab ids, 512, so
that each id is seen often enough to learn), the loss on every token after the first period (the model must find
the token one period back: induction heads over the whole context).  The prompts are then such sequences too (a
segment repeated to 8..300 tokens, ragged), and a trained model continues the period with margins far above
bf16's noise, so 256 new tokens can agree token for token - each one read from the right place of a context
that crosses pages.  --train-steps 0 keeps the random model (the first token's logits are still compared).

Run on the GPU machine (transformers' wheels travel in .whl-hf, bench/FLASHINFER.md):
    eval "$(PKV_SKIP_IMPORT_CHECK=1 bash bench/install_wheelhouse.sh .whl-hf /tmp/hf-site)"
    python3 bench/check_transformers.py --pkv build-gpu/pkv
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def periodic(rng, vocab, n, period=None):
    """n tokens in [0, vocab) that repeat a random segment of distinct tokens (its length `period`, else 8..64 and
    at most n // 2 + 1): each token's successor is then the same wherever it appears."""
    if period is None:
        period = int(rng.integers(8, max(9, min(65, n // 2 + 2))))
    seg = rng.choice(vocab, period, replace=False)
    return [int(seg[i % period]) for i in range(n)]


def train_periodic(model, vocab, steps, rng, batch=32, length=512, device="cuda", seconds=None, stop_loss=0.02):
    """Trains model (fp32 weights, on the GPU) on repeated random segments of tokens in [0, vocab): the loss on
    each token after the segment's first period.  Stops after `steps` steps, `seconds` seconds, or once the mean
    loss of the last 20 steps is below stop_loss.  Returns the loss of the first and the last step and the steps
    taken."""
    import time
    import numpy as np
    import torch
    t0 = time.time()
    recent = []
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / 50) * max(0.1, 1 - k / steps))
    first = last = None
    for k in range(steps):
        periods = rng.integers(8, 65, batch)
        ids = np.array([periodic(rng, vocab, length, int(p)) for p in periods])
        labels = ids.copy()
        for i, p in enumerate(periods):
            labels[i, :p] = -100  # the first period cannot be predicted
        ids_t = torch.tensor(ids, device=device)
        lab_t = torch.tensor(labels, device=device)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=ids_t, labels=lab_t).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        last = float(loss.detach())
        if k == 0:
            first = last
        recent = (recent + [last])[-20:]
        if (k + 1) % 250 == 0:
            print(f"  train step {k + 1}: loss {last:.4f} ({time.time() - t0:.0f} s)", flush=True)
        if (len(recent) == 20 and sum(recent) / 20 < stop_loss) or (seconds and time.time() - t0 > seconds):
            break
    model.eval()
    return first, last, k + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pkv", required=True, help="the pkv binary (a CUDA build)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn", default="sdpa", help="transformers' attention implementation (sdpa, eager)")
    ap.add_argument("--init-range", type=float, default=0.02,
                    help="LlamaConfig.initializer_range (0.02: transformers' default, whose random model's logits are "
                         "nearly flat, so greedy picks meet exact bf16 ties; larger spreads them)")
    ap.add_argument("--train-steps", type=int, default=3000,
                    help="train on repeated random segments first, at most this many steps (0: the random model; "
                         "see above)")
    ap.add_argument("--train-seconds", type=float, default=150.0,
                    help="stop training after this many seconds (or once the loss is below 0.02)")
    ap.add_argument("--train-vocab", type=int, default=512,
                    help="the trained task's and the prompts' tokens are drawn from [0, N): each token is then seen "
                         "often enough for its embedding and LM-head row to learn the copy")
    ap.add_argument("--json")
    args = ap.parse_args()

    import numpy as np
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                      num_attention_heads=16, num_key_value_heads=4, head_dim=64, rms_norm_eps=1e-6,
                      rope_theta=10000.0, max_position_embeddings=4096, tie_word_embeddings=False,
                      attention_bias=False, mlp_bias=False, attn_implementation=args.attn,
                      initializer_range=args.init_range)
    model = LlamaForCausalLM(cfg).cuda()
    rng = np.random.default_rng(args.seed + 1)
    train_s = 0.0
    train_loss = None
    trained = 0
    if args.train_steps > 0:
        t0 = time.time()
        *train_loss, trained = train_periodic(model, args.train_vocab, args.train_steps, rng,
                                              seconds=args.train_seconds)
        train_s = time.time() - t0
        print(f"trained {trained} steps on repeated segments in {train_s:.1f} s: loss after the first period "
              f"{train_loss[0]:.3f} -> {train_loss[1]:.4f}", flush=True)
    model = model.to(torch.bfloat16).eval()

    work = tempfile.mkdtemp(prefix="pkv_hf_")
    wpath, ppath, tpath, lpath = (os.path.join(work, n) for n in ("w.bin", "prompts.txt", "tokens.txt", "logits.bin"))
    # the weights in transformers' order (pkv_model.h, pkv_decoder_load_weights)
    sd = model.state_dict()
    order = ["model.embed_tokens.weight"]
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        order += [p + "input_layernorm.weight", p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                  p + "self_attn.v_proj.weight", p + "self_attn.o_proj.weight", p + "post_attention_layernorm.weight",
                  p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"]
    order += ["model.norm.weight", "lm_head.weight"]
    with open(wpath, "wb") as f:
        f.write(b"PKVW")
        f.write(np.array([cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                          cfg.head_dim, cfg.intermediate_size, cfg.vocab_size], dtype=np.int32).tobytes())
        for name in order:
            f.write(sd[name].contiguous().view(torch.int16).cpu().numpy().tobytes())

    if args.train_steps > 0:
        prompts = [periodic(rng, args.train_vocab, int(rng.integers(8, 300))) for _ in range(args.prompts)]
    else:
        prompts = [rng.integers(0, cfg.vocab_size, int(rng.integers(8, 300))).tolist() for _ in range(args.prompts)]
    with open(ppath, "w") as f:
        for p in prompts:
            f.write(" ".join(map(str, p)) + "\n")

    # transformers: each prompt alone (no padding), greedy, its own attention
    t0 = time.time()
    hf_tokens, hf_first_logits, hf_scores = [], [], []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p], device="cuda")
            out = model.generate(ids, max_new_tokens=args.new_tokens, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, eos_token_id=None, pad_token_id=0,
                                 min_new_tokens=args.new_tokens)
            hf_tokens.append(out.sequences[0, len(p):].tolist())
            logits = torch.stack([lg[0].float() for lg in out.logits])  # [new, vocab]
            hf_first_logits.append(logits[0].cpu().numpy())
            hf_scores.append(logits.cpu().numpy())
    hf_s = time.time() - t0

    t0 = time.time()
    r = subprocess.run([args.pkv, "decode", "--model", "hf-small", "--backend", "cuda", "--weights", wpath,
                        "--prompts", ppath, "--max-new", str(args.new_tokens), "--batch", str(args.prompts),
                        "--out-tokens", tpath, "--out-logits", lpath], capture_output=True, text=True)
    pkv_s = time.time() - t0
    if r.returncode != 0:
        print(r.stdout, r.stderr, file=sys.stderr)
        raise SystemExit(f"pkv decode failed ({r.returncode})")
    # the judge of the two bf16 runs: transformers' same model in fp32, its first-token logits
    model32 = LlamaForCausalLM(cfg).cuda().eval()
    model32.load_state_dict({k: v.float() for k, v in sd.items()})
    with torch.no_grad():
        fp32_first = [model32(torch.tensor([p], device="cuda")).logits[0, -1].float().cpu().numpy() for p in prompts]
    del model32
    ours = [list(map(int, line.split())) for line in open(tpath)]
    our_logits = np.fromfile(lpath, dtype=np.float32).reshape(len(prompts), cfg.vocab_size)

    rows = []
    for i, p in enumerate(prompts):
        a, b = hf_tokens[i], ours[i]
        agree = next((k for k in range(len(a)) if a[k] != b[k]), len(a))
        margin = None
        if agree < len(a):
            s = np.sort(hf_scores[i][agree])
            margin = float(s[-1] - s[-2])
        ref = hf_first_logits[i]
        rel = float(np.linalg.norm(our_logits[i] - ref) / np.linalg.norm(ref))
        judge = fp32_first[i]
        jn = np.linalg.norm(judge)
        rows.append({"prompt_len": len(p), "agree": agree, "of": len(a), "margin_at_first_difference": margin,
                     "first_logits_rel_l2": rel, "first_logits_max_abs": float(np.max(np.abs(our_logits[i] - ref))),
                     "ours_vs_fp32_rel_l2": float(np.linalg.norm(our_logits[i] - judge) / jn),
                     "hf_bf16_vs_fp32_rel_l2": float(np.linalg.norm(ref - judge) / jn)})
    full = sum(r_["agree"] == r_["of"] for r_ in rows)
    kind = f"trained {trained} steps, repeated-segment prompts" if args.train_steps > 0 else "random model"
    print(f"transformers {transformers.__version__} ({args.attn}, initializer_range {args.init_range}, {kind}) against pkv decode, hf-small, bf16, "
          f"{torch.cuda.get_device_name()}: {full} of {len(rows)} prompts agree on all {args.new_tokens} new tokens")
    print("| prompt | length | tokens agreeing | top-2 margin at the first difference | first logits rel L2 | max abs |"
          " ours vs fp32 | transformers bf16 vs fp32 |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for i, r_ in enumerate(rows):
        m = "-" if r_["margin_at_first_difference"] is None else f"{r_['margin_at_first_difference']:.4f}"
        print(f"| {i} | {r_['prompt_len']} | {r_['agree']} / {r_['of']} | {m} | {r_['first_logits_rel_l2']:.2e} | "
              f"{r_['first_logits_max_abs']:.3f} | {r_['ours_vs_fp32_rel_l2']:.2e} | {r_['hf_bf16_vs_fp32_rel_l2']:.2e} |")
    print(f"transformers generate {hf_s:.1f} s (one prompt at a time), pkv decode {pkv_s:.1f} s (all at once, incl. set-up)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "bench/check_transformers.py", "commit": os.environ.get("PKV_COMMIT", "unknown"),
                       "device": torch.cuda.get_device_name(), "transformers": transformers.__version__,
                       "attn_implementation": args.attn, "initializer_range": args.init_range,
                       "train_steps": trained, "train_vocab": args.train_vocab,
                       "train_loss_first_last": train_loss, "train_s": train_s,
                       "prompts_kind": "repeated random segments" if args.train_steps > 0 else "random tokens",
                       "new_tokens": args.new_tokens, "prompts": rows,
                       "all_agree": full, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, f, indent=1)


if __name__ == "__main__":
    main()
