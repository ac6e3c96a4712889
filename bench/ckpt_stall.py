#!/usr/bin/env python3
"""How long the training loop waits for checkpoints: asynchronous against synchronous.

Trains the `125m` preset (about 134M parameters: 1.6 GB of master weights + AdamW moments per
checkpoint) for a few steps with a checkpoint every `--every` steps, once with
checkpoint.async = true and once with false, on the same machine in one run, and reads the
summary record of each run's metrics: `checkpoint_stall_seconds` (what the step loop waited
for its periodic checkpoints) and `checkpoint_write_seconds` (what the writes took). Appends a
table to bench/RESULTS.md with the commit.

    bench/ckpt_stall.py [--steps 9] [--every 3] [--seq 128] [--dir /tmp/mx_stall]
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(binary, out, async_, a):
    if out.exists():
        shutil.rmtree(out)
    args = [binary, "train", "--set", "model.preset=125m", "--set", "data.format=random",
            "--set", f"train.steps={a.steps}", "--set", "train.micro_batch=1",
            "--set", f"train.seq_len={a.seq}", "--set", "train.eval_every=0",
            "--set", "run.sample_tokens=0", "--set", f"checkpoint.every={a.every}",
            "--set", f"checkpoint.async={'true' if async_ else 'false'}",
            "--set", "checkpoint.resume=none", "--set", f"run.out_dir={out}"]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"mxtrain failed:\n{p.stderr}")
    summary = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()][-1]
    n_ckpt = (a.steps - 1) // a.every  # periodic checkpoints (the final one is counted apart)
    size = sum(f.stat().st_size for f in (out / "checkpoints").rglob("*") if f.is_file())
    return dict(summary=summary, periodic=n_ckpt, bytes=size)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=str(REPO / "build" / "mxtrain"))
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dir", default="/tmp/mx_ckpt_stall")
    ap.add_argument("--no-record", action="store_true")
    a = ap.parse_args()
    base = Path(a.dir)
    res = {}
    for async_ in (True, False):
        res[async_] = run(a.binary, base / ("async" if async_ else "sync"), async_, a)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=REPO).stdout.strip()
    load = os.getloadavg()
    lines = [f"\n## {datetime.datetime.utcnow():%Y-%m-%d %H:%M} — checkpoint stall, async vs sync "
             f"— commit {commit}\n",
             f"`125m` preset, {a.steps} steps of 1 x {a.seq} tokens, a checkpoint every {a.every} "
             f"steps ({res[True]['periodic']} periodic + the final one), local disk under "
             f"{a.dir}; `bench/ckpt_stall.py`. Load average at the end: "
             f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.\n",
             "| mode | step time s | loop stall per checkpoint s | write time per checkpoint s "
             "| final checkpoint s | checkpoint size MB |",
             "|---|---|---|---|---|---|"]
    for async_ in (True, False):
        s = res[async_]["summary"]
        n = res[async_]["periodic"]
        total = n + 1
        step_s = s["train_seconds"] / s["steps"]
        lines.append(f"| {'async' if async_ else 'sync'} | {step_s:.2f} | "
                     f"{s['checkpoint_stall_seconds'] / n:.3f} | "
                     f"{s['checkpoint_write_seconds'] / total:.2f} | "
                     f"{s['checkpoint_final_seconds']:.2f} | "
                     f"{res[async_]['bytes'] / 1e6 / total:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not a.no_record:
        with open(REPO / "bench" / "RESULTS.md", "a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
