#!/usr/bin/python3
"""Plots of an `mxtrain sweep` directory: DIR/tokens_per_s.png (measured tokens/s per point,
predicted as markers) and DIR/memory.png (predicted vs measured peak memory per point).

Usage: /usr/bin/python3 scripts/sweep_plot.py DIR   (reads DIR/results.json)
Needs Debian's python3-matplotlib; exits 3 with a message when it is missing.
"""
import json
import os
import sys


SHORT = {"activation_checkpointing": "ckpt", "micro_batch": "mb", "seq_len": "seq",
         "grad_accum": "accum"}


def label(point):
    parts = []
    for k in point["override_order"]:
        name = k.split(".")[-1]
        parts.append(f"{SHORT.get(name, name)}={point['overrides'][k]}")
    return "\n".join(parts)


def main():
    if len(sys.argv) != 2:
        print("usage: sweep_plot.py DIR", file=sys.stderr)
        return 2
    out = sys.argv[1]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("warning: matplotlib is not installed (apt-get install python3-matplotlib)",
              file=sys.stderr)
        return 3
    with open(os.path.join(out, "results.json")) as f:
        res = json.load(f)
    pts = [p for p in res["points"] if p.get("tokens_per_s") is not None]
    if not pts:
        print("warning: no measured points to plot", file=sys.stderr)
        return 0
    names = [label(p) for p in pts]
    xs = range(len(pts))
    width = max(6.0, 1.1 * len(pts))

    fig, ax = plt.subplots(figsize=(width, 4.8))
    ax.bar(xs, [p["tokens_per_s"] for p in pts], color="tab:blue", label="measured")
    ax.plot(xs, [p["predicted_tokens_per_s"] for p in pts], "o", color="tab:orange",
            label="predicted (planner)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"mxtrain sweep: tokens/s ({res['steps']} steps, {res['np']} process(es))")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "tokens_per_s.png"), dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(width, 4.8))
    w = 0.4
    mib = 1024.0 * 1024.0
    ax.bar([x - w / 2 for x in xs], [p["predicted_mem_bytes"] / mib for p in pts], w,
           color="tab:orange", label="predicted (planner)")
    ax.bar([x + w / 2 for x in xs], [p["peak_mem_bytes"] / mib for p in pts], w,
           color="tab:blue", label="measured peak")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("peak memory per process (MiB)")
    ax.set_title("mxtrain sweep: predicted vs measured peak memory")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "memory.png"), dpi=100)
    plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
