#!/usr/bin/env python3
"""CPU scaling of FSDP: the same model and global batch trained by 1, 2 and 4 processes
(4 oversubscribed on a 2-core machine), with the time blocked in communication separated from
compute. Appends a section to bench/RESULTS.md.

  /usr/bin/python3 bench/fsdp_scaling.py [--steps 8] [--skip 2] [--no-record]

Each run: `mpirun -np N mxtrain train` on the `small` preset with random tokens, global batch 8
x 256 tokens, `parallel.sharding=full`, OMP_NUM_THREADS = max(1, cores / N). Per step the
metrics give step_time_s and comm_wait_s (time blocked in gathers, reduce-scatters and the
gradient all-reduce: the communication that compute did not hide); compute = step - comm."""
import argparse
import datetime
import json
import os
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = os.environ.get("MXTRAIN_BIN", str(REPO / "build" / "mxtrain"))


def run(np_, steps, sharding, tmp):
    cores = os.cpu_count() or 2
    out = Path(tmp) / f"np{np_}_{sharding}"
    args = [BIN, "train", "--set", "model.preset=small", "--set", "data.format=random",
            "--set", "train.seq_len=256", "--set", f"train.micro_batch={8 // np_}",
            "--set", f"train.steps={steps}", "--set", "train.eval_every=0",
            "--set", "run.sample_tokens=0", "--set", f"parallel.sharding={sharding}",
            "--set", "checkpoint.resume=none", "--set", f"run.out_dir={out}"]
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, cores // np_)),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = args if np_ == 1 else ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none"] + args
    subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
    recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if not r.get("summary")], recs[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--no-record", action="store_true")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for np_, sharding in ((1, "full"), (2, "full"), (2, "none"), (4, "full")):
            steps, summary = run(np_, a.steps, sharding, tmp)
            timed = steps[a.skip:]
            step_s = sum(r["step_time_s"] for r in timed) / len(timed)
            comm_s = sum(r.get("comm_wait_s", 0.0) for r in timed) / len(timed)
            tok = 8 * 256 / step_s
            rows.append((np_, sharding, tok, step_s, comm_s, step_s - comm_s,
                         summary["peak_mem_bytes"] / 2**20,
                         summary.get("peak_mem_bytes_max_rank", summary["peak_mem_bytes"]) / 2**20,
                         summary["fsdp_state_bytes"] / 2**20))
            print(f"np {np_} {sharding}: {tok:.0f} tok/s, step {step_s:.3f} s, comm {comm_s:.3f} s",
                  flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    lines = [f"\n## {datetime.datetime.now():%Y-%m-%d %H:%M} — FSDP CPU scaling — commit {commit}\n",
             f"CPU: {cpu} ({os.cpu_count()} logical CPUs). `small` preset, random tokens, global "
             f"batch 8 x 256, {a.steps} steps (first {a.skip} untimed), OMP threads = cores / ranks "
             "(4 ranks oversubscribe 2 cores). comm = time blocked in communication; "
             "compute = step - comm.\n",
             "| ranks | sharding | tok/s | step s | comm s | compute s | peak MiB (rank 0) | peak MiB (max rank) | sharded state MiB/rank |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r[0]} | {r[1]} | {r[2]:.0f} | {r[3]:.3f} | {r[4]:.3f} | {r[5]:.3f} | "
                     f"{r[6]:.0f} | {r[7]:.0f} | {r[8]:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not a.no_record:
        with open(REPO / "bench" / "RESULTS.md", "a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
