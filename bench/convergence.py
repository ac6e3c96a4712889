#!/usr/bin/env python3
"""Convergence study of the precision recipes on CPU (issue 3, "Must show").

The `small` preset (6 x 384, about 10M parameters) trained the same number of steps, with the same
seed, data order and held-out windows, under fp32, bf16, fp8-delayed, fp8-current, fp8-block,
mxfp8 and nvfp4 (nvfp4 with its recommended setting: the last block, about 15% of the six, kept in
high precision, `precision.high_precision_last = 1`). Runs are sequential, each with
OMP_NUM_THREADS threads (default 2).

  /work/main/.venv/bin/python bench/convergence.py [--steps 90] [--micro-batch 4] [--seq-len 64]
      [--eval-every 45] [--eval-batches 4] [--out docs] [--keep-runs DIR] [--recipes a,b,...]
      [--from-json docs/numerics_convergence.json]   (re-plot and re-tabulate saved runs)

Writes OUT/numerics_convergence.png (loss curves), OUT/numerics_convergence.json (every run's
numbers) and prints a markdown table for docs/numerics.md.

What is compared: the *final validation loss* (mean cross-entropy over the same fixed
eval_batches x micro_batch held-out windows at the last step; identical windows for every run)
and, as a smoothed training loss, the mean of the last 10 logged training losses. The relative
difference is (loss - loss_bf16) / loss_bf16, so positive = worse than bf16. Targets (issue 3):
|diff| <= 1% for FP8 and MXFP8, <= 3% for NVFP4, on the validation loss.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = os.environ.get("MXTRAIN_BIN", str(REPO / "build" / "mxtrain"))

# bf16 first (the baseline of every comparison), fp32 last (the least needed if time runs out)
RECIPES = ["bf16", "fp8-delayed", "fp8-current", "fp8-block", "mxfp8", "nvfp4", "fp32"]
EXTRA = {"nvfp4": {"precision.high_precision_last": 1}}  # ~15% of 6 blocks
TARGET = {"fp8-delayed": 0.01, "fp8-current": 0.01, "fp8-block": 0.01, "mxfp8": 0.01,
          "nvfp4": 0.03}


def corpus_path():
    p = REPO / "build" / "corpus.txt"
    if not p.exists() or p.stat().st_size == 0:
        subprocess.run([str(REPO / "scripts" / "make_corpus.sh"), str(p)], check=True)
    return p


def run_one(recipe, a, root, corpus):
    out = Path(root) / recipe
    settings = {
        "model.preset": "small", "train.steps": a.steps, "train.micro_batch": a.micro_batch,
        "train.seq_len": a.seq_len, "train.seed": a.seed, "train.warmup_steps": a.warmup,
        "train.eval_every": a.eval_every, "train.eval_batches": a.eval_batches,
        "train.log_every": 1, "data.path": corpus, "data.format": "text",
        "precision.recipe": recipe, "run.out_dir": out, "run.name": recipe,
        "run.sample_tokens": 0, "checkpoint.resume": "none",
    }
    settings.update(EXTRA.get(recipe, {}))
    args = [BIN, "train"]
    for k, v in settings.items():
        args += ["--set", f"{k}={v}"]
    # passive waiting: on a shared, oversubscribed machine spinning OpenMP threads cost 3x
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS="1",
               OMP_WAIT_POLICY="passive")
    t0 = time.time()
    p = subprocess.run(args, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        sys.exit(f"{recipe}: mxtrain exited {p.returncode}\n{p.stderr[-3000:]}")
    recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l.strip()]
    steps = [r for r in recs if not r.get("summary")]
    summary = recs[-1]
    losses = [r["loss"] for r in steps]
    vals = [(r["step"], r["val_loss"]) for r in steps if "val_loss" in r]
    # Also keep a mid-run train-throughput figure: steps past the first 3 (warm caches).
    return {
        "recipe": recipe, "settings": {k: str(v) for k, v in settings.items()},
        "steps": [r["step"] for r in steps], "loss": losses, "val": vals,
        "final_val_loss": vals[-1][1] if vals else None,
        "smoothed_train_loss": sum(losses[-10:]) / len(losses[-10:]),
        "tokens_per_s": summary["tokens_per_s"], "wall_s": wall,
    }


def plot(results, path, a):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for r in results:
        # training loss: a 10-step moving average, so the curves are readable
        k = 10
        sm = [sum(r["loss"][max(0, i - k + 1):i + 1]) / len(r["loss"][max(0, i - k + 1):i + 1])
              for i in range(len(r["loss"]))]
        ax1.plot(r["steps"], sm, label=r["recipe"], lw=1.2)
        if r["val"]:
            ax2.plot([s for s, _ in r["val"]], [v for _, v in r["val"]], marker="o", ms=3,
                     label=r["recipe"], lw=1.2)
    ax1.set_title(f"train loss (10-step moving mean), small preset, {a.micro_batch}x{a.seq_len} tok/step")
    ax2.set_title(f"validation loss ({a.eval_batches} x {a.micro_batch} fixed held-out windows)")
    for ax in (ax1, ax2):
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats/byte)")
        ax.grid(alpha=0.3)
        ax.legend()
    lo = min(min(r["loss"][len(r["loss"]) // 3:]) for r in results)
    hi = max(max(r["loss"][len(r["loss"]) // 3:]) for r in results)
    ax1.set_ylim(lo - 0.05, hi + 0.05)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(results):
    base = next((r for r in results if r["recipe"] == "bf16"), None)
    lines = ["| recipe | final val loss | vs bf16 | train loss (mean of last 10) | vs bf16 | "
             "tokens/s | target (val) |", "|---|---|---|---|---|---|---|"]
    for r in results:
        dv = dt = ""
        verdict = "—"
        if base and r["final_val_loss"] is not None and base["final_val_loss"]:
            d = (r["final_val_loss"] - base["final_val_loss"]) / base["final_val_loss"]
            dv = f"{100 * d:+.2f}%"
            if r["recipe"] in TARGET:
                verdict = (f"≤ {100 * TARGET[r['recipe']]:.0f}%: "
                           + ("met" if abs(d) <= TARGET[r["recipe"]] else "**missed**"))
        if base:
            d = (r["smoothed_train_loss"] - base["smoothed_train_loss"]) / base["smoothed_train_loss"]
            dt = f"{100 * d:+.2f}%"
        fv = f"{r['final_val_loss']:.4f}" if r["final_val_loss"] is not None else "—"
        lines.append(f"| {r['recipe']} | {fv} | {dv} | {r['smoothed_train_loss']:.4f} | {dt} | "
                     f"{r['tokens_per_s']:.0f} | {verdict} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=90)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=9)
    ap.add_argument("--eval-every", type=int, default=45)
    ap.add_argument("--eval-batches", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--out", default=str(REPO / "docs"))
    ap.add_argument("--from-json", default="", help="tabulate and plot a saved study instead")
    ap.add_argument("--keep-runs", default="", help="directory for the runs (default: a temp dir)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"steps": a.steps, "micro_batch": a.micro_batch, "seq_len": a.seq_len,
            "eval_every": a.eval_every, "eval_batches": a.eval_batches, "seed": a.seed,
            "threads": a.threads, "binary": BIN,
            "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                     capture_output=True, text=True).stdout.strip()}
    results = []
    if a.from_json:  # re-plot / re-tabulate saved runs
        results = json.loads(Path(a.from_json).read_text())["runs"]
    else:
        corpus = corpus_path()
        root = a.keep_runs or tempfile.mkdtemp(prefix="mxtrain_convergence_")
        for recipe in a.recipes.split(","):
            r = run_one(recipe, a, root, corpus)
            print(f"{recipe:12s} val {r['final_val_loss']}  train(last10) "
                  f"{r['smoothed_train_loss']:.4f}  {r['tokens_per_s']:.0f} tok/s  "
                  f"{r['wall_s']:.0f} s", flush=True)
            results.append(r)
            # saved after every run, so an interrupted study keeps what it finished
            (out / "numerics_convergence.json").write_text(
                json.dumps({"meta": meta, "runs": results}, indent=1))
    plot(results, out / "numerics_convergence.png", a)
    print(table(results))


if __name__ == "__main__":
    main()
