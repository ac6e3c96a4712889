#!/usr/bin/env python3
"""mxtrain's two trainer steps of bench/gpu/check.sh (standard library only):

  loss-match  the tiny preset trained 50 steps with run.device = cuda and = cpu (same seed, same
              text, same schedule): per step |loss_cuda - loss_cpu| / loss_cpu, its maximum
              against a stated tolerance, for each of --recipes: fp32, bf16 (CUDA's bf16 GEMM vs
              the CPU's emulation of it), fp8-current and fp8-delayed (CUDA's FP8 tensor-core
              GEMMs vs the CPU's emulation). These run the CUDA side's fp32 attention kernel
              (MXTRAIN_CUDA_ATTENTION=fp32), so they measure what they name; a recipe written
              NAME+cudnn (e.g. bf16+cudnn) runs the default attention instead, cuDNN's bf16
              SDPA, against the CPU's fp32 attention. More modifiers (NAME+MOD[+MOD...],
              MODIFIERS below) run the trainer's other paths, each on both devices:
              +ckpt (activation checkpointing full and 2 micro-batches a step), +tf32
              (MXTRAIN_CUDA_GEMM=tf32), +emulate (MXTRAIN_CUDA_FP8=emulate), +wide (widths
              of 128, so that fp8-block's Linears run on the block-scaled GEMM), +stats
              (precision.stats_every = 10) and +hp (precision.high_precision_last = 1).
  resume      resume and generation on the device: recipe bf16 trained --steps straight, and
              the same run stopped at half of them and resumed from its checkpoint (the losses
              after the resume must be the straight run's: bit for bit where every kernel is
              deterministic, as these are with untuned GEMMs and the fp32 attention kernel);
              the same again with run.deterministic = true on the default attention and GEMM
              settings (row "bf16 resume det": bit for bit, losses and gradient norms, or FAIL);
              then generation from the straight run's checkpoint (temperature 1, one seed) with
              --device cuda against --device cpu (the same token ids); then the two memory
              errors, a scratch arena larger than the GPU and one too small for an op (each
              one error line, exit 2).
  speed       tokens/s and MFU of a Llama-3.2-1B shape at the given sequence lengths: the
              largest micro-batch that starts (the arenas are sized and allocated before the
              first step, so a shape that does not fit fails within seconds), activation
              checkpointing `none` first, then `full`. The run is stopped (SIGKILL) once its
              timed steps are in metrics.jsonl: the end-of-run checkpoint of 1.2B parameters
              (15 GB) is not what is measured.

Each writes one JSON object per line to --json and prints it. Every subprocess has a time limit.
Runs here without a GPU too (loss-match then reports the cuda runs' `error:` line).
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

# fp8-current / fp8-delayed: CUDA's FP8 tensor-core GEMMs vs the CPU's emulation over the same
# codes differ only in fp32 accumulation order, but a last-bit difference can move an FP8 code
# of the next operand: a guess (5e-3) until a GPU run has measured it.
TOL = {"fp32": 1e-4, "bf16": 2e-3, "fp8-current": 5e-3, "fp8-delayed": 5e-3,
       # cuDNN's attention in bf16 (P, outputs and gradients rounded to bf16) on top of recipe
       # bf16, against the CPU's fp32 attention: a guess until a GPU run has measured it.
       "bf16+cudnn": 5e-3,
       # The trainer's paths not run on a GPU before (guesses too, until a run measures them):
       # fp8-block on the VEC128 / BLK128x128 GEMM against the CPU's emulation; recipe bf16
       # with activation checkpointing and gradient accumulation; fp32 on tf32 tensor cores
       # (operands rounded to 10 mantissa bits, as bf16's 7 are); the FP8 recipe's exact
       # emulation on the GPU (fp32 GEMMs over the same codes).
       "fp8-block+wide": 5e-3, "bf16+ckpt": 2e-3, "fp32+tf32": 2e-3,
       "fp8-delayed+emulate": 5e-3, "fp8-current+stats+hp": 5e-3,
       # FP8 attention (cuDNN's fused FP8 SDPA against the CPU twin): the two round the
       # probabilities at different points (docs/numerics.md, "FP8 attention"), FP8 noise that
       # 50 steps compound; a guess
       "fp8-delayed+fp8attn": 2e-2,
       # The FP8 head (FP8 GEMMs on cuda against the twin's fp32 sums over the same FP8
       # values: a gradient element now and then one E5M2 step apart); a guess
       "fp8-delayed+fp8head": 5e-3}
# A recipe's +MOD: (mxtrain --set overrides, environment) on both devices (the CPU backend
# reads none of the MXTRAIN_CUDA_* variables). Without +cudnn the CUDA side runs the fp32
# attention kernel.
MODIFIERS = {"cudnn": ({}, {"MXTRAIN_CUDA_ATTENTION": "cudnn"}),
             "ckpt": ({"memory.activation_checkpointing": "full", "train.grad_accum": 2}, {}),
             "tf32": ({}, {"MXTRAIN_CUDA_GEMM": "tf32"}),
             "emulate": ({}, {"MXTRAIN_CUDA_FP8": "emulate"}),
             # numerics telemetry every 10 steps (the operands' amax, SQNR, ... measured on
             # the device), and the last block kept in precision.high_precision (bf16)
             "stats": ({"precision.stats_every": 10}, {}),
             "hp": ({"precision.high_precision_last": 1}, {}),
             # the attention in FP8 too (cuDNN's fused FP8 SDPA on cuda, the twin on cpu)
             "fp8attn": ({"precision.fp8_attention": "true"}, {}),
             # the head's GEMMs in FP8 (FP8 GEMMs on cuda, the twin on cpu)
             "fp8head": ({"precision.fp8_head": "true"}, {}),
             # every Linear width and a micro-batch's tokens multiples of 128, so that
             # fp8-block's Linears run on the GPU's block-scaled GEMM (the tiny preset's 64
             # keeps them emulated): hidden 128, 4 heads of 32, as many KV heads
             "wide": ({"model.hidden_size": 128, "model.intermediate_size": 256,
                       "model.num_key_value_heads": 4}, {})}


def attention_of(log):
    """Which attention the CUDA backend said it ran (its `cuda attention:` lines)."""
    if "cuda attention: cudnn" in log:
        return "cudnn"
    if "cuda attention: fp32" in log:
        return "fp32"
    return None


def die_with_parent():
    """Child-side (preexec_fn): mxtrain gets SIGKILL when this wrapper dies. check.sh bounds the
    wrapper with `timeout`, whose signal reaches the wrapper only: a 1B run went on training, and
    writing its end-of-run checkpoint, beside the next step's run."""
    import ctypes
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != WRAPPER_PID:  # the wrapper died before the prctl: no signal will come
        os._exit(1)


WRAPPER_PID = os.getpid()


def emit(args, obj):
    line = json.dumps(obj)
    print(line, flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(line + "\n")


def read_steps(path):
    steps = []
    try:
        for line in Path(path).read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a line being written
            if not r.get("summary") and "loss" in r:
                steps.append(r)
    except FileNotFoundError:
        pass
    return steps


def mxtrain_env(env_extra):
    """The environment of an mxtrain process: ours, env_extra (a value None: unset), and the
    carried libraries."""
    env = dict(os.environ)
    for k, v in env_extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    if os.environ.get("MXTRAIN_LD_LIBRARY_PATH"):  # the carried libraries: for mxtrain only
        env["LD_LIBRARY_PATH"] = os.environ["MXTRAIN_LD_LIBRARY_PATH"]
    return env


def run_train(binary, sets, env_extra, out, limit, stop_after=None):
    """Runs `mxtrain train`; returns (rc, stderr tail, metrics steps, seconds).
    stop_after: SIGKILL once that many step records are in the metrics (rc is then 'stopped')."""
    out.mkdir(parents=True, exist_ok=True)
    metrics = out / "metrics.jsonl"
    argv = [binary, "train"]
    for k, v in sets.items():
        argv += ["--set", f"{k}={v}"]
    argv += ["--set", f"run.out_dir={out}", "--set", f"run.metrics={metrics}"]
    metrics.unlink(missing_ok=True)  # a rerun must not read the last run's steps
    env = mxtrain_env(env_extra)
    t0 = time.time()
    with open(out / "stderr.txt", "w") as err:
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env,
                             preexec_fn=die_with_parent)
        rc = None
        while True:
            try:
                rc = p.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            if stop_after and len(read_steps(metrics)) >= stop_after:
                p.send_signal(signal.SIGKILL)
                p.wait()
                rc = "stopped"
                break
            if time.time() - t0 > limit:
                p.send_signal(signal.SIGKILL)
                p.wait()
                rc = "timeout"
                break
    tail = (out / "stderr.txt").read_text(errors="replace").strip().splitlines()[-3:]
    return rc, tail, read_steps(metrics), time.time() - t0


def loss_match(args):
    # lr 1e-3, not the tiny preset's 3e-3: on the first H200 run (2026-12-04) lr 3e-3 had a
    # gradient spike at step 35 (grad norm 0.6 to 11 between runs that differ only in rounding)
    # that turned rounding differences into 1e-2 loss differences for ten steps, in every recipe
    # and between the CPU's own fp32 and bf16 runs: a test of chaos, not of the arithmetic. At
    # 1e-3 the CPU's fp32 and bf16 runs stay within 6e-5 of each other over the 50 steps.
    corpus = Path(args.corpus)
    base = {"model.preset": "tiny", "train.steps": args.steps, "train.micro_batch": 4,
            "train.seq_len": 64, "train.lr": 1e-3, "train.min_lr": 1e-4,
            "train.warmup_steps": 5, "train.seed": 1, "train.grad_clip": 1.0,
            "train.log_every": 1, "train.eval_every": 0, "data.path": corpus,
            "data.format": "text", "data.val_fraction": 0.0, "run.sample_tokens": 0,
            "checkpoint.resume": "none"}
    for recipe in args.recipes:
        runs = {}
        name, *mods = recipe.split("+")
        env = {"OMP_NUM_THREADS": str(args.threads), "MXTRAIN_CUDA_ATTENTION": "fp32"}
        extra = {}
        for mod in mods:
            extra.update(MODIFIERS[mod][0])
            env.update(MODIFIERS[mod][1])
        for device in ("cpu", "cuda"):
            sets = dict(base, **extra, **{"run.device": device, "precision.recipe": name})
            if name != "fp32":  # the GPU's default under a recipe, set on the CPU twin too
                sets["precision.activations"] = "bf16"
            runs[device] = run_train(args.bin, sets, env,
                                     Path(args.work) / f"loss_{recipe}_{device}", args.limit)
        res = {"check": "loss_match", "recipe": recipe, "steps": args.steps,
               "tolerance_rel": TOL[recipe]}
        log = Path(args.work) / f"loss_{recipe}_cuda" / "stderr.txt"
        said = log.read_text(errors="replace") if log.exists() else ""
        res["attention"] = attention_of(said) if said else None
        if name.startswith("fp8-") or name in ("mxfp8", "nvfp4"):
            # the trainer's line: the block Linears on the backend's GEMMs, or emulated
            res["native_linears"] = bool(re.search(r"block Linears( |: \d of 7 )on the backend's",
                                                  said))
        (crc, ctail, cpu, cs), (grc, gtail, gpu, gs) = runs["cpu"], runs["cuda"]
        res["seconds"] = {"cpu": round(cs, 1), "cuda": round(gs, 1)}
        if crc != 0 or grc != 0 or len(cpu) != args.steps or len(gpu) != args.steps:
            res.update(ok=False, error={"cpu": [crc] + ctail, "cuda": [grc] + gtail})
        else:
            rel = [abs(g["loss"] - c["loss"]) / abs(c["loss"]) for c, g in zip(cpu, gpu)]
            norm_rel = [abs(g["grad_norm"] - c["grad_norm"]) / abs(c["grad_norm"])
                        for c, g in zip(cpu, gpu)]
            res.update(ok=max(rel) <= TOL[recipe], max_rel=max(rel),
                       worst_step=1 + rel.index(max(rel)), rel_per_step=rel,
                       max_rel_grad_norm=max(norm_rel), loss_first=cpu[0]["loss"],
                       loss_last_cpu=cpu[-1]["loss"], loss_last_cuda=gpu[-1]["loss"])
        emit(args, res)


def resume_pair(args, base, env, work, label, sub, tolerance_rel):
    """--steps straight, against half of them and a resume from that checkpoint: the resumed
    steps' losses, relative difference and whether bit for bit; one row, `label`."""
    half = args.steps // 2
    res = {"check": "resume", "recipe": label, "steps": args.steps, "resumed_at": half,
           "tolerance_rel": tolerance_rel}
    t0 = time.time()
    straight = run_train(args.bin, dict(base, **{"train.steps": args.steps,
                                                 "checkpoint.resume": "none"}),
                         env, work / f"{sub}_straight", args.limit)
    first = run_train(args.bin, dict(base, **{"train.steps": half, "checkpoint.resume": "none"}),
                      env, work / f"{sub}_split", args.limit)
    # the same run_dir: resume = auto finds the step-`half` checkpoint the first run ended with
    second = run_train(args.bin, dict(base, **{"train.steps": args.steps,
                                               "checkpoint.resume": "auto"}),
                       env, work / f"{sub}_split", args.limit)
    res["seconds"] = round(time.time() - t0, 1)
    log = (work / f"{sub}_split" / "stderr.txt").read_text(errors="replace")  # the second run's
    res["resumed"] = bool(re.search(rf"resumed from \S+ at step {half} ", log))
    m = re.search(r"cuda attention: (cudnn SDPA[^;)]*|fp32 kernel)", log)
    res["attention"] = m.group(1) if m else None
    bad = {name: [rc] + tail for name, (rc, tail, steps, _) in
           (("straight", straight), ("first", first), ("resumed", second))
           if rc != 0}
    want = {r["step"]: r for r in straight[2] if r["step"] > half}
    got = {r["step"]: r for r in second[2]}
    if bad or not res["resumed"] or sorted(got) != sorted(want) or \
            len(want) != args.steps - half:
        res.update(ok=False, error=bad or {"steps": {"straight": sorted(want),
                                                     "resumed": sorted(got)},
                                           "log": log.strip().splitlines()[-3:]})
    else:
        rel = [abs(got[k]["loss"] - want[k]["loss"]) / abs(want[k]["loss"]) for k in sorted(want)]
        res.update(ok=max(rel) <= res["tolerance_rel"], max_rel=max(rel),
                   worst_step=sorted(want)[rel.index(max(rel))], rel_per_step=rel,
                   bit_exact=all(got[k]["loss"] == want[k]["loss"] and
                                 got[k]["grad_norm"] == want[k]["grad_norm"] for k in want),
                   loss_last_straight=want[args.steps]["loss"],
                   loss_last_resumed=got[args.steps]["loss"])
        if tolerance_rel == 0:  # bit for bit is the claim: the gradient norms too
            res["ok"] = res["bit_exact"]
    emit(args, res)


def resume(args):
    corpus = Path(args.corpus)
    base = {"model.preset": "tiny", "train.micro_batch": 4, "train.seq_len": 64,
            "train.lr": 1e-3, "train.min_lr": 1e-4, "train.warmup_steps": 2, "train.seed": 1,
            "train.grad_clip": 1.0, "train.log_every": 1, "train.eval_every": 0,
            "data.path": corpus, "data.format": "text", "data.val_fraction": 0.0,
            "run.sample_tokens": 0, "run.device": "cuda", "precision.recipe": "bf16",
            "precision.activations": "bf16"}
    # the same GEMM algorithm in every run (tuning times candidates, and may pick another)
    env = {"OMP_NUM_THREADS": str(args.threads), "MXTRAIN_CUDA_ATTENTION": "fp32",
           "MXTRAIN_CUDA_GEMM_TUNE": "0"}
    work = Path(args.work)
    resume_pair(args, base, env, work, "bf16 resume", "resume", 1e-6)
    # run.deterministic on the defaults (cuDNN's attention, GEMM tuning, the head's chunks in
    # spare memory), which it turns into their fixed forms: bit for bit or FAIL. (A tuning
    # variable in our environment is unset: beside the setting it is refused.)
    resume_pair(args, dict(base, **{"run.deterministic": "true"}),
                {"OMP_NUM_THREADS": str(args.threads), "MXTRAIN_CUDA_ATTENTION": None,
                 "MXTRAIN_CUDA_GEMM_TUNE": None}, work, "bf16 resume det", "resume_det", 0)
    # Generation from the straight run's last checkpoint on both devices, sampled at temperature
    # 1 with one seed (a barely trained model's greedy text is one token over and over): the
    # same draws, so the same ids unless the logits differ where a draw falls between two.
    gen = {"check": "generate", "recipe": "generate", "tokens": args.gen_tokens}
    ids = {}
    for device in ("cpu", "cuda"):
        argv = [args.bin, "generate", "--model", str(work / "resume_straight" / "checkpoints"),
                "--prompt", "The ", "--max-tokens", str(args.gen_tokens), "--temperature", "1",
                "--seed", "7", "--ids", "--device", device]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, env=mxtrain_env(env),
                               timeout=args.limit, preexec_fn=die_with_parent)
            ids[device] = p.stdout.split() if p.returncode == 0 else None
            if p.returncode != 0:
                gen.setdefault("error", {})[device] = [p.returncode] + \
                    p.stderr.strip().splitlines()[-2:]
        except subprocess.TimeoutExpired:
            ids[device] = None
            gen.setdefault("error", {})[device] = ["timeout"]
    if ids["cpu"] is None or ids["cuda"] is None:
        gen["ok"] = False
    else:
        same = 0
        while same < min(len(ids["cpu"]), len(ids["cuda"])) and \
                ids["cpu"][same] == ids["cuda"][same]:
            same += 1
        gen.update(ok=ids["cpu"] == ids["cuda"] and len(ids["cpu"]) > 0,
                   ids_cpu=ids["cpu"], ids_cuda=ids["cuda"], same_prefix=same)
    emit(args, gen)
    # The memory errors no GPU run has met (nothing ran out): a scratch arena larger than the
    # GPU (cudaMalloc fails: "out of GPU memory") and one below the 32 MiB GEMM workspace (the
    # arena full at an op). Each must be one error line naming MXTRAIN_CUDA_SCRATCH_MB, exit 2.
    for label, mb, want in (("gpu memory", "1000000",
                             "error: out of GPU memory: arena 'cuda-scratch' needs "),
                            ("scratch full", "16", "'cuda-scratch' is full")):
        out = work / f"memory_{mb}"
        rc, tail, _, _ = run_train(args.bin, dict(base, **{"train.steps": 1,
                                                           "checkpoint.resume": "none"}),
                                   dict(env, MXTRAIN_CUDA_SCRATCH_MB=mb), out, args.limit)
        said = (out / "stderr.txt").read_text(errors="replace").splitlines()
        errs = [line for line in said if line.startswith("error:")]
        emit(args, {"check": "memory", "recipe": label, "scratch_mb": int(mb), "rc": rc,
                    "ok": rc == 2 and len(errs) == 1 and want in errs[0] and
                    f"MXTRAIN_CUDA_SCRATCH_MB, now {mb}" in errs[0],
                    "error_line": errs[0] if len(errs) == 1 else errs or tail})


def plan_gpu():
    """The `mxtrain plan --gpu` name of this machine's GPU (nvidia-smi's name), or None."""
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.lower()
    except (OSError, subprocess.SubprocessError):
        return None
    return next((g for g in ("h100", "h200", "b200", "b300") if g in name), None)


def plan_prediction(binary, gpu, sets):
    """What `mxtrain plan` predicts for a speed run's config on this GPU (docs/plan.md,
    Calibration): its tokens/s and step split, so each GPU run checks the model and gives the
    figures to recalibrate it. Where the plan fails: {"gpu", "error"}."""
    argv = [binary, "plan", "--gpu", gpu, "--gpus", "1", "--json"]
    for k, v in sets.items():
        if k != "run.profile":
            argv += ["--set", f"{k}={v}"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                           env=mxtrain_env({}))
        j = json.loads(r.stdout)
        t = j["time"]
        return {"gpu": gpu, "tokens_per_s": j["tokens_per_s"], "step_s": t["step_s"],
                "gemm_s": t["gemm_s"], "attention_s": t["attention_s"],
                "memory_bound_s": t["memory_bound_s"], "optimizer_s": t["optimizer_s"]}
    except (OSError, subprocess.SubprocessError, ValueError, KeyError) as e:
        return {"gpu": gpu, "error": f"{type(e).__name__}: {e}"[:300]}


def speed(args):
    deadline = time.time() + args.budget
    gpu = plan_gpu()  # the planner's name for this GPU (none: no plan rows)
    for seq in args.seq:
        result = {"impl": "mxtrain", "seq": seq, "recipe": args.recipe,
                  "activations": args.activations or "default",
                  **({"variant": args.variant} if args.variant else {}),
                  "gemm_env": os.environ.get("MXTRAIN_CUDA_GEMM", "fp32"), "tried": []}
        for batch in args.batches:
            done = False
            for policy in ("none", "full"):
                left = deadline - time.time()
                if left < 20:
                    result["tried"].append({"micro_batch": batch, "policy": policy,
                                            "skipped": "time budget"})
                    continue
                sets = {"model.preset": args.preset, "train.steps": args.steps + 5,
                        "train.micro_batch": batch, "train.seq_len": seq,
                        "train.warmup_steps": 1, "train.log_every": 1, "train.eval_every": 0,
                        "data.format": "random", "data.val_fraction": 0.0,
                        "run.sample_tokens": 0, "run.device": "cuda",
                        "precision.recipe": args.recipe,
                        "memory.activation_checkpointing": policy, "checkpoint.resume": "none"}
                if args.activations:
                    sets["precision.activations"] = args.activations
                sets.update(args.sets)  # --set: last, so they override the above
                if args.profile:  # each op's own GPU time (one CUDA event per op)
                    sets["run.profile"] = "true"
                out = Path(args.work) / (f"speed_{args.recipe}_{args.activations}_{seq}_{batch}_"
                                         f"{policy}{'_' + args.variant if args.variant else ''}")
                rc, tail, steps, secs = run_train(args.bin, sets, {}, out,
                                                  min(args.limit, left), stop_after=args.steps)
                tried = {"micro_batch": batch, "policy": policy, "rc": rc,
                         "seconds": round(secs, 1), "steps_done": len(steps)}
                if rc not in ("stopped", 0, "timeout") or (rc == "timeout" and len(steps) < 2):
                    tried["error"] = tail[-1:] if tail else []
                    result["tried"].append(tried)
                    # Only running out of memory (the GPU's, or a device arena's: "arena
                    # 'scratch' is full") makes a smaller shape worth a try; a timeout (fits,
                    # too slow) or any other failure would repeat.
                    said = " ".join(tail)
                    if rc == "timeout" or not ("out of GPU memory" in said or
                                               ("arena" in said and "is full" in said)):
                        done = True
                        break
                    continue
                result["tried"].append(tried)
                log = (out / "stderr.txt").read_text(errors="replace")
                result["attention"] = attention_of(log)
                if result["attention"] != "cudnn":  # the speed is then not the engine's own
                    print(f"WARNING: mxtrain {args.recipe} seq {seq}: attention ran on "
                          f"{result['attention'] or 'an unnamed path'}, not cuDNN: its speed "
                          f"is not comparable (see {out}/stderr.txt)", file=sys.stderr, flush=True)
                # the trainer's line says which path ran
                if args.recipe.startswith("fp8-") or args.recipe in ("mxfp8", "nvfp4"):
                    # all 7 Linears of a block; "k of 7" where the shape keeps some emulated
                    result["fp8_tensor_cores"] = ("block Linears on the backend's FP8 GEMMs" in log
                                                  or "block Linears on the backend's FP4 GEMMs" in log)
                    part = re.search(r"block Linears: (\d) of 7 on the backend's", log)
                    if part:
                        result["fp8_native_linears"] = f"{part.group(1)} of 7"
                timed = steps[args.skip:] if len(steps) > args.skip else steps[-1:]
                dt = sum(s["step_time_s"] for s in timed)
                tokens = batch * seq * len(timed)
                result.update(micro_batch=batch, checkpointing=policy,
                              tokens_per_s=tokens / dt, mfu_reported=timed[-1]["mfu"],
                              step_s=[s["step_time_s"] for s in steps],
                              loss=[s["loss"] for s in steps],
                              peak_mem_bytes=max(s["peak_mem_bytes"] for s in steps))
                result["mfu"] = result["mfu_reported"] * result["tokens_per_s"] / \
                    timed[-1]["tokens_per_s"]
                if "fp8_shared_operands" in steps[-1]:  # q/k/v and gate/up sharing x's codes
                    result["fp8_shared_operands"] = steps[-1]["fp8_shared_operands"]
                prof = steps[-1].get("op_profile")
                if prof:  # the steps after the first, as timed (--skip 1): the top ops
                    result["op_profile"] = dict(prof, ops=prof["ops"][:15])
                if gpu:  # the planner's prediction for the same config, beside the measurement
                    result["plan"] = plan_prediction(args.bin, gpu, sets)
                done = True
                break
            if done:
                break
        emit(args, result)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["loss-match", "resume", "speed"])
    ap.add_argument("--bin", default="build/mxtrain")
    ap.add_argument("--work", default="/tmp/mxtrain-gpu-runs")
    ap.add_argument("--json")
    ap.add_argument("--limit", type=float, default=120, help="seconds per mxtrain run")
    ap.add_argument("--threads", type=int, default=8, help="loss-match: CPU run's threads")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--corpus", default="")
    ap.add_argument("--preset", default="llama3.2-1b")
    ap.add_argument("--seq", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--batches", type=int, nargs="+", default=[4, 2, 1])
    ap.add_argument("--recipe", default="bf16", help="speed: precision.recipe")
    ap.add_argument("--activations", default="",
                    help="speed: precision.activations (default: the GPU's, bf16 under a recipe)")
    ap.add_argument("--recipes", nargs="+", default=["fp32", "bf16"], choices=sorted(TOL),
                    help="loss-match: the recipes compared")
    ap.add_argument("--variant", default="",
                    help="speed: a label for the row (the table shows it after the recipe), "
                         "e.g. for a run under an environment variable")
    ap.add_argument("--gen-tokens", type=int, default=32,
                    help="resume: the generated tokens (sampled, one seed)")
    ap.add_argument("--skip", type=int, default=1, help="speed: untimed first steps")
    ap.add_argument("--budget", type=float, default=200, help="speed: seconds for all shapes")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="speed: an extra mxtrain --set for every run (repeatable), e.g. "
                         "model.hidden_size=128 with a small --preset for a dry run")
    ap.add_argument("--profile", action="store_true",
                    help="speed: run.profile on; the top ops of the last step's profile go "
                         "into the result")
    args = ap.parse_args()
    for kv in args.sets:
        if "=" not in kv or not kv.partition("=")[0]:
            print(f"error: --set takes KEY=VALUE (e.g. model.hidden_size=128), got '{kv}'",
                  file=sys.stderr)
            sys.exit(2)
    args.sets = dict(kv.split("=", 1) for kv in args.sets)
    if args.what == "loss-match":
        args.steps = args.steps or 50
        if not args.corpus:
            print("error: loss-match needs --corpus FILE (text)", file=sys.stderr)
            sys.exit(2)
        loss_match(args)
    elif args.what == "resume":
        args.steps = args.steps or 20
        if not args.corpus or args.steps < 2 or args.steps % 2:
            print("error: resume needs --corpus FILE (text) and an even --steps of at least 2",
                  file=sys.stderr)
            sys.exit(2)
        resume(args)
    else:
        args.steps = args.steps or 4
        speed(args)


if __name__ == "__main__":
    main()
