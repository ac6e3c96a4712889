#!/usr/bin/env python3
"""Convergence study of the precision recipes on CPU (issue 3, "Must show"), over several seeds.

The `small` preset (6 x 384, about 10M parameters) trained the same number of steps under fp32,
bf16, fp8-delayed, fp8-current, fp8-block, mxfp8 and nvfp4 (nvfp4 with its recommended setting:
the last block, about 15% of the six, kept in high precision, `precision.high_precision_last =
1`), once per seed. The seed (train.seed) changes the initialization and the order of the
training batches; the validation windows are the same fixed held-out windows for every run.
Runs are sequential (seed by seed, so an interrupted study keeps whole seeds), each with
OMP_NUM_THREADS threads (default 2) and OMP_WAIT_POLICY=passive.

  .venv/bin/python bench/convergence.py [--seeds 1234,4321,777] [--steps 120] [--micro-batch 4]
      [--seq-len 64] [--warmup 12] [--eval-every 60] [--eval-batches 16] [--out docs]
      [--keep-runs DIR] [--recipes a,b,...]
      [--from-json docs/numerics_convergence.json]   (re-plot and re-tabulate saved runs)

A recipe may carry +MOD suffixes: +fp8head (precision.fp8_head), +fp8attn
(precision.fp8_attention), e.g. --recipes bf16,fp8-delayed,fp8-delayed+fp8head --out /tmp/s.

Writes OUT/numerics_convergence.png (per recipe: the seed-mean loss curves, the band between the
lowest and highest seed), OUT/numerics_convergence.json (every run's numbers, written after each
run) and prints the markdown table of docs/numerics.md.

What is compared: the *final validation loss* (mean cross-entropy over the same fixed
eval_batches x micro_batch held-out windows at the last step). Per recipe: its mean over seeds
and the seed-to-seed standard deviation; the relative difference of the seed means,
(mean - mean_bf16) / mean_bf16 (positive = worse than bf16); and the paired difference, the same
ratio per seed (each seed has the same initialization and batches under every recipe), as mean
+- std over seeds with the 95% Student-t interval of that mean. Targets (issue 3): |diff| <= 1%
for FP8 and MXFP8, <= 3% for NVFP4. Verdict: "met" when the seed-mean difference is inside the
target and so is the whole paired interval; "met on the mean" when only the former; "missed"
when the whole interval is outside.
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
# A recipe name may carry +MOD suffixes (e.g. fp8-delayed+fp8head): the base recipe with these
# settings too; its target is the base recipe's.
MODS = {"fp8head": {"precision.fp8_head": "true"},
        "fp8attn": {"precision.fp8_attention": "true"}}
TARGET = {"fp8-delayed": 0.01, "fp8-current": 0.01, "fp8-block": 0.01, "mxfp8": 0.01,
          "nvfp4": 0.03}


def corpus_path():
    p = REPO / "build" / "corpus.txt"
    if not p.exists() or p.stat().st_size == 0:
        subprocess.run([str(REPO / "scripts" / "make_corpus.sh"), str(p)], check=True)
    return p


def run_one(recipe, seed, a, root, corpus):
    out = Path(root) / f"{recipe}_seed{seed}"
    settings = {
        "model.preset": "small", "train.steps": a.steps, "train.micro_batch": a.micro_batch,
        "train.seq_len": a.seq_len, "train.seed": seed, "train.warmup_steps": a.warmup,
        "train.eval_every": a.eval_every, "train.eval_batches": a.eval_batches,
        "train.log_every": 1, "data.path": corpus, "data.format": "text",
        "precision.recipe": recipe.split("+")[0], "run.out_dir": out,
        "run.name": f"{recipe}_seed{seed}", "run.sample_tokens": 0, "checkpoint.resume": "none",
    }
    settings.update(EXTRA.get(recipe.split("+")[0], {}))
    for mod in recipe.split("+")[1:]:
        if mod not in MODS:
            sys.exit(f"{recipe}: unknown modifier +{mod} (known: {', '.join(MODS)})")
        settings.update(MODS[mod])
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
        sys.exit(f"{recipe} seed {seed}: mxtrain exited {p.returncode}\n{p.stderr[-3000:]}")
    recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l.strip()]
    steps = [r for r in recs if not r.get("summary")]
    summary = recs[-1]
    losses = [r["loss"] for r in steps]
    vals = [(r["step"], r["val_loss"]) for r in steps if "val_loss" in r]
    return {
        "recipe": recipe, "seed": seed, "settings": {k: str(v) for k, v in settings.items()},
        "steps": [r["step"] for r in steps], "loss": losses, "lr": [r["lr"] for r in steps],
        "val": vals, "final_val_loss": vals[-1][1] if vals else None,
        "smoothed_train_loss": sum(losses[-10:]) / len(losses[-10:]),
        "tokens_per_s": summary["tokens_per_s"], "wall_s": wall,
    }


def mean_std(xs):
    m = sum(xs) / len(xs)
    sd = (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0
    return m, sd


def by_recipe(results):
    """{recipe: {seed: run}} in the order recipes first appear."""
    out = {}
    for r in results:
        out.setdefault(r["recipe"], {})[r["seed"]] = r
    return out


def moving_mean(xs, k=10):
    return [sum(xs[max(0, i - k + 1):i + 1]) / len(xs[max(0, i - k + 1):i + 1])
            for i in range(len(xs))]


def plot(results, path, meta):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(19, 5.5),
                                        gridspec_kw={"width_ratios": [1.2, 1, 1]})
    groups = by_recipe(results)
    lo = hi = None
    for i, (recipe, runs) in enumerate(groups.items()):
        color = f"C{i}"
        label = f"{recipe} ({len(runs)} seeds)"
        curves = [moving_mean(r["loss"]) for r in runs.values()]
        steps = next(iter(runs.values()))["steps"]
        n = min(len(c) for c in curves)
        mean = [sum(c[j] for c in curves) / len(curves) for j in range(n)]
        ax1.plot(steps[:n], mean, color=color, lw=1.3, label=label)
        ax1.fill_between(steps[:n], [min(c[j] for c in curves) for j in range(n)],
                         [max(c[j] for c in curves) for j in range(n)], color=color, alpha=0.12)
        tail = mean[n // 3:]
        lo = min(tail) if lo is None else min(lo, min(tail))
        hi = max(tail) if hi is None else max(hi, max(tail))
        vals = [r["val"] for r in runs.values() if r["val"]]
        if vals:
            m = min(len(v) for v in vals)
            vs = [vals[0][j][0] for j in range(m)]
            vm = [sum(v[j][1] for v in vals) / len(vals) for j in range(m)]
            ax2.plot(vs, vm, color=color, marker="o", ms=3, lw=1.2, label=label)
            ax2.fill_between(vs, [min(v[j][1] for v in vals) for j in range(m)],
                             [max(v[j][1] for v in vals) for j in range(m)], color=color,
                             alpha=0.12)
    ax1.set_title(f"train loss (10-step moving mean; line = seed mean, band = min..max over "
                  f"seeds)\nsmall preset, {meta['micro_batch']}x{meta['seq_len']} tokens/step",
                  fontsize=10)
    ax2.set_title(f"validation loss ({meta['eval_batches']} x {meta['micro_batch']} x "
                  f"{meta['seq_len']} fixed held-out tokens; seed mean, band = min..max)",
                  fontsize=10)
    for ax in (ax1, ax2):
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats/byte)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if lo is not None:
        ax1.set_ylim(lo - 0.05, hi + 0.05)
    # the paired differences of the final validation loss from bf16, per seed, with the seed
    # mean, its 95% t-interval and the targets
    rows = [r for r in summarize(results) if r.get("paired") and r["recipe"] != "bf16"]
    for i, r in enumerate(rows):
        color = f"C{list(groups).index(r['recipe'])}"
        ax3.scatter([i] * len(r["paired"]), [100 * p for p in r["paired"]], color=color, s=18,
                    alpha=0.7)
        ci = r.get("ci95")
        ax3.errorbar([i + 0.15], [100 * r["paired_mean"]],
                     yerr=[[100 * ci], [100 * ci]] if ci is not None else None, fmt="D",
                     color=color, capsize=4, ms=6)
        t = TARGET.get(r["recipe"].split("+")[0])
        if t is not None:
            ax3.hlines([-100 * t, 100 * t], i - 0.35, i + 0.35, colors="k", linestyles="--",
                       lw=1)
    ax3.axhline(0, color="gray", lw=0.8)
    ax3.set_xticks(range(len(rows)), [r["recipe"] for r in rows], rotation=30, fontsize=8)
    ax3.set_ylabel("final val loss vs bf16, same seed (%)")
    ax3.set_title("paired difference from bf16: dots = seeds, diamond = mean with 95% t-interval,"
                  "\ndashed = target (±1% FP8/MXFP8, ±3% NVFP4)", fontsize=10)
    ax3.grid(alpha=0.3, axis="y")
    if rows:
        span = max(max(abs(100 * p) for r in rows for p in r["paired"]), 3.5)
        ax3.set_ylim(-1.3 * span, 1.3 * span)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# two-sided 95% Student t quantiles by degrees of freedom (n seeds - 1)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262}


def summarize(results):
    """Per recipe: seed-mean/std of the final validation loss; the difference of the seed means
    from bf16's (over the seeds both have); the paired per-seed differences (mean, std, each) and
    the 95% t-interval of their mean; the verdict against the target."""
    groups = by_recipe(results)
    base = groups.get("bf16", {})
    rows = []
    for recipe, runs in groups.items():
        vals = [r["final_val_loss"] for r in runs.values()]
        m, sd = mean_std(vals)
        row = {"recipe": recipe, "seeds": sorted(runs), "mean": m, "std": sd,
               "train_mean": mean_std([r["smoothed_train_loss"] for r in runs.values()])[0],
               "tokens_per_s": mean_std([r["tokens_per_s"] for r in runs.values()])[0],
               "wall_s": sum(r["wall_s"] for r in runs.values())}
        common = [s for s in sorted(runs) if s in base]
        if common:
            rm = mean_std([runs[s]["final_val_loss"] for s in common])[0]
            bm = mean_std([base[s]["final_val_loss"] for s in common])[0]
            row["diff"] = (rm - bm) / bm
            paired = [(runs[s]["final_val_loss"] - base[s]["final_val_loss"])
                      / base[s]["final_val_loss"] for s in common]
            row["paired"] = paired
            row["paired_mean"], row["paired_std"] = mean_std(paired)
            n = len(paired)
            row["ci95"] = T95.get(n - 1, 2.0) * row["paired_std"] / n ** 0.5 if n > 1 else None
        target = TARGET.get(recipe.split("+")[0])
        if target is not None and "diff" in row:
            d, ci = row["diff"], row["ci95"]
            if ci is None:
                row["verdict"] = "met (one seed)" if abs(d) <= target else "missed (one seed)"
            elif abs(d) <= target and abs(row["paired_mean"]) + ci <= target:
                row["verdict"] = "met"
            elif abs(d) <= target:
                row["verdict"] = "met on the mean; the 95% interval reaches past the target"
            elif abs(row["paired_mean"]) - ci > target:
                row["verdict"] = "**missed**"
            else:
                row["verdict"] = "**missed** on the mean; the 95% interval reaches back inside"
        rows.append(row)
    return rows


def table(results):
    rows = summarize(results)
    lines = ["| recipe | seeds | final val loss, mean ± std over seeds | vs bf16 (seed means) | "
             "paired vs bf16: mean ± std [95% interval] (each seed) | target | verdict | "
             "tokens/s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        diff = f"{100 * r['diff']:+.2f}%" if "diff" in r else "—"
        paired = "—"
        if r.get("paired") and r["recipe"] != "bf16":
            ci = r.get("ci95")
            interval = (f" [{100 * (r['paired_mean'] - ci):+.2f}, {100 * (r['paired_mean'] + ci):+.2f}]"
                        if ci is not None else "")
            paired = (f"{100 * r['paired_mean']:+.2f}% ± {100 * r['paired_std']:.2f}%{interval} ("
                      + ", ".join(f"{100 * p:+.2f}" for p in r["paired"]) + ")")
        target = TARGET.get(r["recipe"].split("+")[0])
        t = f"≤ {100 * target:.0f}%" if target is not None else "—"
        lines.append(f"| {r['recipe']} | {len(r['seeds'])} | {r['mean']:.4f} ± {r['std']:.4f} | "
                     f"{diff} | {paired} | {t} | {r.get('verdict', '—')} | "
                     f"{r['tokens_per_s']:.0f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=12)
    ap.add_argument("--eval-every", type=int, default=60)
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--seeds", default="1234,4321,777")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--out", default=str(REPO / "docs"))
    ap.add_argument("--from-json", default="", help="tabulate and plot a saved study instead")
    ap.add_argument("--keep-runs", default="", help="directory for the runs (default: a temp dir)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in a.seeds.split(",")]
    meta = {"steps": a.steps, "micro_batch": a.micro_batch, "seq_len": a.seq_len,
            "warmup": a.warmup, "eval_every": a.eval_every, "eval_batches": a.eval_batches,
            "seeds": seeds, "threads": a.threads, "binary": BIN,
            "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                     capture_output=True, text=True).stdout.strip()}
    results = []
    if a.from_json:  # re-plot / re-tabulate saved runs
        saved = json.loads(Path(a.from_json).read_text())
        results, meta = saved["runs"], saved["meta"]
    else:
        corpus = corpus_path()
        root = a.keep_runs or tempfile.mkdtemp(prefix="mxtrain_convergence_")
        t_start = time.time()
        for seed in seeds:
            for recipe in a.recipes.split(","):
                r = run_one(recipe, seed, a, root, corpus)
                print(f"seed {seed:5d} {recipe:12s} val {r['final_val_loss']:.4f}  train(last10) "
                      f"{r['smoothed_train_loss']:.4f}  {r['tokens_per_s']:.0f} tok/s  "
                      f"{r['wall_s']:.0f} s", flush=True)
                results.append(r)
                meta["elapsed_s"] = time.time() - t_start
                # saved after every run, so an interrupted study keeps what it finished
                (out / "numerics_convergence.json").write_text(
                    json.dumps({"meta": meta, "runs": results}, indent=1))
    plot(results, out / "numerics_convergence.png", meta)
    print(table(results))


if __name__ == "__main__":
    main()
