#!/usr/bin/env python3
"""Where FP8 attention's gradient error comes from (docs/numerics.md, "FP8 attention").

Trains the `small` preset 120 steps under fp8-current (or takes --model, a Hugging Face
directory), then runs one forward-backward (`mxtrain debug grads`) on the same 4 x 512 bytes of
the corpus under several settings and prints, per projection kind, the relative L2 distance of
the gradients from a baseline: ||g - g_base|| / ||g_base|| over every block's tensors of that kind.

  .venv/bin/python bench/attention_fp8_error.py [--model DIR] [--work /tmp/attn_fp8_error]
      [--patched]

Rows without --patched (any build): bf16, fp8-current and both with FP8 attention against
recipe fp32; FP8 attention, the FP8 head and both against fp8-current without them.

--patched needs a binary built with bench/patches/fp8_attention_exact_scales_and_ablation.patch
applied (`git apply` it, rebuild, point MXTRAIN_BIN at that build; never commit it): the CPU twin
then reads MXEXP_ORACLE (dS, dQ, dK and dV encoded at the current scale of their exact amax
instead of the bounds' scales: what perfect delayed scaling would give) and MXEXP_SKIP (a list of
roundings to leave out: `e4,` q, k, v and O; `p,` P; `e5,` dO, dQ, dK and dV; `ds,` dS), and the
script adds those rows against fp8-current.
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "python"))
import hf_io  # noqa: E402

BIN = os.environ.get("MXTRAIN_BIN", str(REPO / "build" / "mxtrain"))
BATCH, SEQ = 4, 512
KINDS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "embed_tokens", "lm_head"]


def run(args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run([BIN, *map(str, args)], env=e, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"error: mxtrain {' '.join(map(str, args[:3]))} exited {r.returncode}:\n"
                 f"{r.stderr[-2000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="Hugging Face directory (default: train the small preset)")
    ap.add_argument("--work", default="/tmp/attn_fp8_error")
    ap.add_argument("--patched", action="store_true")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    corpus = REPO / "build" / "corpus.txt"
    if not corpus.exists() or corpus.stat().st_size == 0:
        subprocess.run([str(REPO / "scripts" / "make_corpus.sh"), str(corpus)], check=True)
    model = a.model
    if not model:
        model = work / "hf"
        if not (model / "config.json").exists():
            print("training the small preset, 120 steps of fp8-current ...", flush=True)
            run(["train", "--set", "model.preset=small", "--set", "train.steps=120",
                 "--set", "train.seq_len=256", "--set", "train.micro_batch=4",
                 "--set", "precision.recipe=fp8-current", "--set", f"data.path={corpus}",
                 "--set", f"run.out_dir={work / 'train'}"])
            run(["ckpt", "export-hf", work / "train" / "checkpoints", model])
    data = np.frombuffer(corpus.read_bytes(), dtype=np.uint8)
    starts = np.random.default_rng(7).integers(0, len(data) - SEQ - 1, size=BATCH)
    tok = work / "tokens.bin"
    np.stack([data[s:s + SEQ + 1] for s in starts]).astype("<i4").tofile(tok)

    def grads(args, env=None):
        out = work / "grads.safetensors"
        run(["debug", "grads", "--init", model, "--tokens", tok, "--batch", BATCH, "--seq", SEQ,
             "--out", out, *args], env)
        return hf_io.read_safetensors(out)

    def dist(g, base, kind):
        names = [n for n in base if kind in n]
        num = sum(float(np.sum((g[n].astype(np.float64) - base[n]) ** 2)) for n in names)
        den = sum(float(np.sum(base[n].astype(np.float64) ** 2)) for n in names)
        return (num / den) ** 0.5

    print("| setting | baseline | " + " | ".join(KINDS) + " |")
    print("|---|---|" + "---|" * len(KINDS))

    def row(name, base_name, base, args, env=None):
        g = grads(args, env)
        print(f"| {name} | {base_name} | " +
              " | ".join(f"{dist(g, base, k):.4f}" for k in KINDS) + " |", flush=True)

    fp32 = grads(["--recipe", "fp32"])
    row("bf16", "fp32", fp32, ["--recipe", "bf16"])
    row("bf16 + FP8 attention", "fp32", fp32, ["--recipe", "bf16", "--fp8-attention"])
    row("fp8-current", "fp32", fp32, ["--recipe", "fp8-current"])
    row("fp8-current + FP8 attention", "fp32", fp32, ["--recipe", "fp8-current", "--fp8-attention"])
    cur = grads(["--recipe", "fp8-current"])
    fa = ["--recipe", "fp8-current", "--fp8-attention"]
    row("FP8 attention", "fp8-current", cur, fa)
    for dgrad in ("bf16", "fp8"):
        head = ["--fp8-head", "--fp8-head-dgrad", dgrad]
        row(f"FP8 head ({dgrad} data gradient)", "fp8-current", cur,
            ["--recipe", "fp8-current", *head])
        row(f"FP8 attention + FP8 head ({dgrad} data gradient)", "fp8-current", cur, fa + head)
    if a.patched:
        row("FP8 attention, exact-amax scales for dS, dQ, dK, dV", "fp8-current", cur, fa,
            {"MXEXP_ORACLE": "1"})
        for skip, what in [("e4,", "q, k, v, O"), ("p,", "P"), ("e5,", "dO, dQ, dK, dV"),
                           ("ds,", "dS"), ("p,e5,ds,", "all but q, k, v, O"),
                           ("e4,p,e5,", "all but dS"), ("e4,p,ds,", "all but dO, dQ, dK, dV")]:
            row(f"FP8 attention without rounding {what}", "fp8-current", cur, fa,
                {"MXEXP_SKIP": skip})


if __name__ == "__main__":
    main()
