#!/usr/bin/python3
"""mxtrain vs the PyTorch reference on this CPU, side by side in one run, 2 threads each.

Model: hidden 512, 8 layers, 8 heads, 4 KV heads, intermediate 1536, vocab 32000, untied, fp32.
Shapes: seq 512 x batch 4 and seq 2048 x batch 1. Each side runs a few full training steps
(forward + backward + AdamW); the first steps are warm-up and not timed. A shared 2-core VM drifts
by 10% and more within minutes, so the two sides run in interleaved rounds (--rounds, default 5;
the order alternates each round) and the table reports the median of the per-round ratios with
their range, and the median tokens/s of each side. Prints that table, the machine's SGEMM rate
(`mxtrain bench sgemm`), mxtrain's achieved GEMM rate and its share of that, the CPU's fp32 FMA
peak (`mxtrain bench fma`) and what each ratio target asks of it; appends a dated
section to bench/RESULTS.md.

Usage: /usr/bin/python3 bench/cpu_vs_torch.py [--steps 6] [--skip 2] [--rounds 5] [--no-record]
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "python"))

# Before numpy and torch load OpenBLAS: both sides on the same OpenBLAS kernels (on a CPU
# OpenBLAS does not know, mxtrain replaces its SSE3 fallback; PyTorch gets the same).
import blas_env  # noqa: E402

BLAS = blas_env.match_mxtrain_blas(os.environ.get("MXTRAIN_BIN", str(REPO / "build" / "mxtrain")))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import llama_ref  # noqa: E402

THREADS = 2
SHAPE = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False)
RUNS = [(512, 4), (2048, 1)]  # (seq_len, micro_batch)
LR = 3e-4


def mxtrain_bin():
    return os.environ.get("MXTRAIN_BIN", str(REPO / "build" / "mxtrain"))


def child_env():
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(THREADS)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


def run_mxtrain(seq, batch, steps, skip, workdir):
    metrics = Path(workdir) / f"metrics_{seq}x{batch}.jsonl"
    sets = {f"model.{k}": v for k, v in SHAPE.items()}
    sets.update({
        "train.steps": steps, "train.micro_batch": batch, "train.seq_len": seq,
        "train.grad_accum": 1, "train.lr": LR, "train.min_lr": LR / 10, "train.warmup_steps": 1,
        "train.log_every": 1, "train.eval_every": 0, "data.format": "random",
        "data.val_fraction": 0.0, "run.name": f"bench_{seq}x{batch}",
        "run.out_dir": Path(workdir) / f"run_{seq}x{batch}", "run.metrics": metrics,
        "run.sample_tokens": 0, "checkpoint.resume": "none",
        "run.profile": True,  # where the step time goes: GEMMs, attention, the rest
    })
    argv = [mxtrain_bin(), "train"]
    for k, v in sets.items():
        v = ("true" if v else "false") if isinstance(v, bool) else v
        argv += ["--set", f"{k}={v}"]
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=child_env(), timeout=600)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"mxtrain train failed ({p.returncode}):\n{p.stderr[-2000:]}")
    steps_m, summary = [], {}
    for line in metrics.read_text().splitlines():
        if line.strip():
            o = json.loads(line)
            (summary.update(o) if o.get("summary") else steps_m.append(o))
    timed = [s for s in steps_m if s["step"] > skip]
    tokens = seq * batch
    # Same tokens every step: the overall rate is total tokens over total time.
    secs = sum(tokens / s["tokens_per_s"] for s in timed)
    tok_s = tokens * len(timed) / secs
    # The trainer's MFU is model FLOP/s over its own start-up SGEMM measurement; keep the model
    # FLOP/s so the table can divide by the bench's (longer, before-and-after) measurement.
    model_gflops = float(np.mean([s["mfu"] for s in timed])) * summary["sgemm_peak_gflops"]
    # mxtrain's model FLOPs per token (the MFU's numerator; the same every step of one shape)
    flops_per_token = float(np.mean([s["mfu"] * summary["sgemm_peak_gflops"] * 1e9
                                     / s["tokens_per_s"] for s in timed]))
    # Shares of the profiled steps' time (the steps after the first: run.profile)
    ops = {o["op"]: o["share"] for o in summary.get("op_profile", {}).get("ops", [])}
    gemm_share = ops.get("gemm", 0.0)
    attn_share = ops.get("attention_forward", 0.0) + ops.get("attention_backward", 0.0)
    return dict(tokens_per_s=tok_s, gemm_gflops=summary.get("gemm_gflops"),
                peak_mem_bytes=max(s["peak_mem_bytes"] for s in steps_m), wall_s=wall,
                model_gflops=model_gflops, flops_per_token=flops_per_token, time_gemm=gemm_share, time_attention=attn_share)


def run_torch(seq, batch, steps, skip):
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    cfg = llama_ref.make_shape(**SHAPE)
    params = llama_ref.random_params(cfg, seed=0, std=0.02, norm_jitter=0.0)
    p = llama_ref.to_torch(params, dtype=torch.float32)
    decay = [t for t in p.values() if t.dim() >= 2]
    no_decay = [t for t in p.values() if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.95))
    rng = np.random.default_rng(1)
    times = []
    for s in range(steps):
        tok = torch.tensor(rng.integers(0, SHAPE["vocab_size"], size=(batch, seq + 1)))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = llama_ref.loss_fn(p, cfg, tok[:, :-1], tok[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    timed = times[skip:]
    return dict(tokens_per_s=seq * batch * len(timed) / sum(timed))


SGEMM_SECONDS = 3
FMA_SECONDS = 3
TARGETS = {512: 2.0, 2048: 4.0}  # issue 2's ratio targets by sequence length


def sgemm_rate():
    # Best of repeated 2048^3 GEMMs over SGEMM_SECONDS (see `mxtrain bench sgemm --help`).
    p = subprocess.run([mxtrain_bin(), "bench", "sgemm", "--size", "2048", "--seconds",
                        str(SGEMM_SECONDS)], capture_output=True, text=True,
                       env=child_env(), timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"mxtrain bench sgemm failed:\n{p.stderr[-2000:]}")
    for line in reversed(p.stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return float(json.loads(line)["gflops"])
    raise RuntimeError(f"no JSON in `mxtrain bench sgemm` output:\n{p.stdout}")


def fma_peak():
    # The CPU's fp32 multiply-add peak on THREADS threads (`mxtrain bench fma`): the roof above
    # any fp32 GEMM, OpenBLAS's included.
    p = subprocess.run([mxtrain_bin(), "bench", "fma", "--seconds", str(FMA_SECONDS)],
                       capture_output=True, text=True, env=child_env(), timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"mxtrain bench fma failed:\n{p.stderr[-2000:]}")
    return float(json.loads(p.stdout.strip().splitlines()[-1])["gflops"])


def roof_lines(rows, sgemm, fma):
    """What each ratio target asks of this machine: the target times the reference's tokens/s
    times the arithmetic a token cannot avoid, against the FMA peak and the SGEMM rate; and
    where mxtrain's median run stands. The arithmetic is mxtrain's MFU count (PaLM's: 6 FLOPs a
    weight, 12 L H D T for attention as if unmasked) less the causal mask's half of attention
    (6 L H D T): the forward's two attention products and the backward's four, on the scores
    at or below the diagonal. Flash attention's recomputed scores are extra work on top."""
    head_dim = SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
    out = [f"Roof: the CPU's fp32 FMA peak (`mxtrain bench fma --seconds {FMA_SECONDS}`, "
           f"{THREADS} threads, best of before and after) is {fma:.1f} GFLOP/s; SGEMM reaches "
           f"{100 * sgemm / fma:.0f}% of it. What each target asks, in arithmetic a step cannot "
           f"avoid (the MFU count with attention's masked half taken out):"]
    for seq, batch, mx, th, _ in rows:
        target = TARGETS.get(seq)
        if target is None:
            continue
        per_token = mx["flops_per_token"] - 6.0 * SHAPE["num_hidden_layers"] * \
            SHAPE["num_attention_heads"] * head_dim * seq
        need = target * th["tokens_per_s"] * per_token / 1e9
        have = mx["tokens_per_s"] * per_token / 1e9
        out.append(f"- seq {seq}: {target:g}x the reference's {th['tokens_per_s']:.0f} tok/s is "
                   f"{target * th['tokens_per_s']:.0f} tok/s x {per_token / 1e6:.0f} MFLOP = "
                   f"{need:.0f} GFLOP/s: {100 * need / fma:.0f}% of the FMA peak, "
                   f"{100 * need / sgemm:.0f}% of SGEMM. mxtrain's median ran {have:.0f} GFLOP/s "
                   f"({100 * have / fma:.0f}% of the peak, {100 * have / sgemm:.0f}% of SGEMM).")
    return "\n".join(out)


def blas_line():
    if not BLAS:
        return "BLAS: unknown (mxtrain did not report it)."
    core = os.environ.get("OPENBLAS_CORETYPE", BLAS["blas_core"])
    line = f"BLAS: {BLAS['blas']}, {core} kernels on both sides"
    if BLAS["blas_core_replaced"]:
        line += f" (OpenBLAS's own pick for this CPU: {BLAS['blas_core_replaced']})"
    return line + "."


def loadavg():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "unknown"


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit():
    try:
        p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                           text=True, cwd=REPO)
        return p.stdout.strip() if p.returncode == 0 else "uncommitted"
    except OSError:
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5,
                    help="interleaved mxtrain/PyTorch rounds per shape (median reported)")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    args = ap.parse_args()
    if not os.access(mxtrain_bin(), os.X_OK):
        sys.exit(f"error: mxtrain binary not found at {mxtrain_bin()} (build it, or set MXTRAIN_BIN)")

    load_before = loadavg()
    sgemm_before = sgemm_rate()
    fma_before = fma_peak()
    if args.rounds < 1 or args.steps <= args.skip:
        sys.exit("error: --rounds must be >= 1 and --steps greater than --skip")
    per = {run: [] for run in RUNS}  # (seq, batch) -> [(mx, th)] per round
    with tempfile.TemporaryDirectory(prefix="mxbench_") as work:
        for r in range(args.rounds):
            for seq, batch in RUNS:
                # Alternate which side goes first, so a drift within a round favours neither.
                if r % 2 == 0:
                    mx = run_mxtrain(seq, batch, args.steps, args.skip, work)
                    th = run_torch(seq, batch, args.steps, args.skip)
                else:
                    th = run_torch(seq, batch, args.steps, args.skip)
                    mx = run_mxtrain(seq, batch, args.steps, args.skip, work)
                per[(seq, batch)].append((mx, th))
                print(f"round {r + 1}/{args.rounds}, seq {seq} x batch {batch}: mxtrain "
                      f"{mx['tokens_per_s']:.0f} tok/s, torch {th['tokens_per_s']:.0f} tok/s, "
                      f"ratio {mx['tokens_per_s'] / th['tokens_per_s']:.2f}", flush=True)
    rows = []
    for (seq, batch), res in per.items():
        ratios = [m["tokens_per_s"] / t["tokens_per_s"] for m, t in res]
        # The round with the median ratio supplies mxtrain's GEMM rate, MFU and memory.
        mid = sorted(range(len(res)), key=lambda i: ratios[i])[len(res) // 2]
        mx = dict(res[mid][0])
        mx["flops_per_token"] = float(np.median([m["flops_per_token"] for m, _ in res]))
        mx["tokens_per_s"] = float(np.median([m["tokens_per_s"] for m, _ in res]))
        th = {"tokens_per_s": float(np.median([t["tokens_per_s"] for _, t in res]))}
        rows.append((seq, batch, mx, th, ratios))
    # Measured before and after: a big gap means something else used the CPU meanwhile.
    sgemm_after = sgemm_rate()
    sgemm = max(sgemm_before, sgemm_after)
    fma = max(fma_before, fma_peak())
    load_after = loadavg()

    lines = [
        "| seq x batch | mxtrain tok/s | PyTorch tok/s | ratio (mxtrain/PyTorch), median "
        "[range] | mxtrain GEMM GFLOP/s | share of SGEMM | mxtrain MFU | mxtrain peak MiB | "
        "mxtrain step time: GEMM / attention / rest |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for seq, batch, mx, th, ratios in rows:
        g = mx["gemm_gflops"]
        gtxt = f"{g:.1f}" if g is not None else "n/a"
        share = f"{100 * g / sgemm:.0f}%" if g is not None else "n/a"
        lines.append(f"| {seq} x {batch} | {mx['tokens_per_s']:.0f} | {th['tokens_per_s']:.0f} | "
                     f"{float(np.median(ratios)):.2f} [{min(ratios):.2f}, {max(ratios):.2f}] | "
                     f"{gtxt} | {share} | {mx['model_gflops'] / sgemm:.3f} | "
                     f"{mx['peak_mem_bytes'] / 2**20:.0f} | "
                     f"{100 * mx['time_gemm']:.0f}% / {100 * mx['time_attention']:.0f}% / "
                     f"{100 * (1 - mx['time_gemm'] - mx['time_attention']):.0f}% |")
    table = "\n".join(lines) + "\n\n" + roof_lines(rows, sgemm, fma)
    header = (f"Model: hidden 512, 8 layers, 8 heads / 4 KV, intermediate 1536, vocab 32000, untied, "
              f"fp32; {THREADS} threads each; {args.steps} steps, first {args.skip} untimed; "
              f"{args.rounds} interleaved rounds (tokens/s: medians; ratio: median of the "
              f"per-round ratios, range in brackets).\n"
              f"Machine SGEMM (`mxtrain bench sgemm --size 2048 --seconds {SGEMM_SECONDS}`: the "
              f"fastest of repeated 2048^3 GEMMs over {SGEMM_SECONDS} s, 2 threads), before / "
              f"after: {sgemm_before:.1f} / {sgemm_after:.1f} GFLOP/s; GEMM shares and MFU below "
              f"use the higher, {sgemm:.1f}. Load average (1/5/15 min) at start: {load_before}; "
              f"at end: {load_after}. PyTorch {torch.__version__}. {blas_line()} "
              f"The last column: shares of "
              f"mxtrain's step time (`run.profile`, steps after the first) in `gemm` and in "
              f"attention forward + backward.")
    if (min(sgemm_before, sgemm_after) < 0.85 * sgemm
            or float(load_before.split()[0]) > 1.0):
        # (The load at the end includes the benchmark's own two threads: only the start counts.)
        header += ("\n\n**Warning: the machine was not idle (load average or SGEMM drift); "
                   "treat these numbers as noisy.**")
    print()
    print(header + "\n")
    print(table)

    if not args.no_record:
        now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        section = (f"\n## {now} — commit {git_commit()}\n\nCPU: {cpu_model()} "
                   f"({os.cpu_count()} logical CPUs)\n\n{header}\n\n{table}\n")
        results = REPO / "bench" / "RESULTS.md"
        if not results.exists():
            results.write_text("# CPU benchmark results (bench/cpu_vs_torch.py)\n")
        with open(results, "a") as f:
            f.write(section)
        print(f"\nappended to {results}")


if __name__ == "__main__":
    main()
