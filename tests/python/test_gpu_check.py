"""bench/gpu/check.sh end to end, without a GPU: a dry run of the prepared GPU check on mxemu's
binaries (docs/cuda_emu.md), so a bug in its glue (arguments, JSON rows, the table, file names,
exit code) shows here, not in a GPU session lent for minutes.

The script's MXTRAIN_GPU_* variables (its header; docs/cuda.md, "Running the GPU check") point it
at a directory whose `mxtrain` and `cuda_op_check` are mxtrain_emu and cuda_emu_op_check, and
shrink every step: a few op-check cases, a 2-step loss match of three recipes, speed runs of the
tiny preset (widened to 128, 4 KV heads, so fp8-block's 128-element blocks take all 7 Linears) at
seq 64, PyTorch on the CPU. A fake `nvidia-smi` says the device is an H200 (compute capability
9.0), which the emulator also is (MXEMU_SM=90). What is checked is that every step ran, wrote
what the table and the device tool read, and that the table reports it; not the GPU's numbers."""
import importlib.util
import json
import os
import re
import resource
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from conftest import MXTRAIN_BIN, REPO, require_binary

EMU_DIR = Path(MXTRAIN_BIN).absolute().parent  # absolute: the links below point here
EMU_BINS = {"mxtrain": EMU_DIR / "mxtrain_emu", "cuda_op_check": EMU_DIR / "cuda_emu_op_check"}
CHECK = REPO / "bench" / "gpu" / "check.sh"

SEQ, TOKENS = 64, 128  # micro-batches tried: 2, then 1
SEQ2 = 32  # the second shape (MXTRAIN_GPU_SEQ2): micro-batches 4, 2, 1
OPCHECK_FILTER = ["rmsnorm_forward", "adamw", "fp8_linear_forward", "attention_cudnn"]
LOSS_RECIPES = ["fp32", "bf16", "fp8-delayed"]
LOSS_STEPS = 2
# The trainer paths' rows (MXTRAIN_GPU_FEATURE_RECIPES; check.sh's default has five), and the
# resume check's steps (MXTRAIN_GPU_RESUME_STEPS: 2 straight against 1 + a resume).
FEATURE_RECIPES = ["fp8-delayed+emulate"]  # (one: the emulated trainer is slow under load)
RESUME_STEPS = 2
FP8 = ["fp8-delayed", "fp8-current", "fp8-block"]
# What check.sh's header promises under $OUT (the device tool returns at most eight files).
OUT_FILES = {"check.log", "op_check.json", "op_check.txt", "loss_match.json", "speed.json",
             "errors.txt", "runs_stderr.tgz"}
HAS_TORCH = importlib.util.find_spec("torch") is not None  # in the Python running this (and check.sh)
FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *compute_cap*) echo "9.0" ;;
  *) echo "NVIDIA H200, 999.99, 143771 MiB" ;;
esac
"""


def require_emu():
    require_binary()
    for path in EMU_BINS.values():
        if not (path.is_file() and os.access(path, os.X_OK)):
            pytest.fail(f"{path} not built (CMake builds it with the tests; it needs python3)")


def check_env(tmp, **extra):
    fake = tmp / "fakebin"
    fake.mkdir(exist_ok=True)
    (fake / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (fake / "nvidia-smi").chmod(0o755)
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", OUT=str(tmp / "out"),
               MXTRAIN_GPU_PYTHON=sys.executable, MXTRAIN_GPU_WORK=str(work),
               MXTRAIN_GPU_THREADS="2", OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="1",
               MXEMU_SM="90")
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """check.sh run once on the emulated binaries: (exit code, stdout, $OUT, seconds, CPU
    seconds of the whole process tree)."""
    require_emu()
    tmp = tmp_path_factory.mktemp("gpu_check")
    bindir = tmp / "bin"
    bindir.mkdir()
    for name, target in EMU_BINS.items():
        (bindir / name).symlink_to(target)
    env = check_env(
        tmp, MXTRAIN_GPU_BINDIR=str(bindir), MXTRAIN_GPU_OPCHECK_FILTER=",".join(OPCHECK_FILTER),
        MXTRAIN_GPU_LOSS_RECIPES=" ".join(LOSS_RECIPES), MXTRAIN_GPU_LOSS_STEPS=str(LOSS_STEPS),
        MXTRAIN_GPU_SEQ=str(SEQ), MXTRAIN_GPU_TOKENS=str(TOKENS), MXTRAIN_GPU_PRESET="tiny",
        MXTRAIN_GPU_SEQ2=str(SEQ2), MXTRAIN_GPU_FEATURE_RECIPES=" ".join(FEATURE_RECIPES),
        MXTRAIN_GPU_RESUME_STEPS=str(RESUME_STEPS),
        MXTRAIN_GPU_SPEED_SETS="model.hidden_size=128 model.intermediate_size=256 "
                               "model.num_key_value_heads=4",
        MXTRAIN_GPU_TORCH_ARGS="--device cpu --no-compile",
        # every GEMM shape tuned (the tiny shapes are under the default's 2^30 FLOPs), so the
        # table's tuning lines have something to show; the notune row sets 0 itself
        MXTRAIN_CUDA_GEMM_TUNE="all",
        # and every cast (the tiny shapes are under the default's 2^22 elements); the casts0
        # row sets 0 itself
        MXTRAIN_CUDA_CAST_TUNE="all",
        # the FP8-attention rows' other heads (on a GPU below compute capability 10 with the 1B
        # preset: 16 of 128, which cuDNN's FP8 backward there needs): the same q and kv widths
        MXTRAIN_GPU_HD_SETS="model.num_attention_heads=2 model.num_key_value_heads=2 "
                            "model.head_dim=32")
    t0, before = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    # From another directory: the script must find the repository itself.
    p = subprocess.run(["bash", str(CHECK)], capture_output=True, text=True, env=env,
                       timeout=400, cwd=tmp)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return p.returncode, p.stdout + p.stderr, tmp / "out", time.time() - t0, cpu


def lines_up_to_the_op_check(env):
    """check.sh's output lines up to its op check's line ("op check: exit ..."), the rest of the
    run killed: what it says before it tests anything."""
    p = subprocess.Popen(["bash", str(CHECK)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=env, start_new_session=True)
    lines = []
    try:
        for line in p.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("op check:"):
                break
    finally:
        os.killpg(p.pid, 9)
        p.wait()
    return lines


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_exit_code_and_files(dry_run):
    rc, log, out, *_ = dry_run
    assert rc == 0, log[-6000:]
    assert {p.name for p in out.iterdir()} == OUT_FILES, log[-3000:]
    assert len(OUT_FILES) <= 8
    # check.log is the same output (tee)
    assert "== mxtrain GPU check" in (out / "check.log").read_text()
    assert "NVIDIA H200, 999.99, 143771 MiB" in log
    # runs_stderr.tgz: every run's stderr, not its checkpoints; well under the tool's 16 MiB
    with tarfile.open(out / "runs_stderr.tgz") as t:
        names = t.getnames()
    runs = {n.split("/")[1] for n in names if n.endswith("/stderr.txt")}
    want = ({f"loss_{r}_{d}" for r in LOSS_RECIPES + FEATURE_RECIPES for d in ("cpu", "cuda")} |
            {"resume_straight", "resume_split", "resume_det_straight", "resume_det_split",
             "memory_1000000", "memory_16"} |
            {f"speed_{r}__{SEQ}_2_none" for r in ["bf16"] + FP8} | {f"speed_bf16_fp32_{SEQ}_2_none"} |
            {f"speed_bf16__{SEQ}_2_none_notune", f"speed_fp8-block__{SEQ}_2_none_casts0",
             f"speed_fp8-delayed__{SEQ}_2_none_fastacc",
             f"speed_fp8-delayed__{SEQ}_2_none_fp8attn-hd", f"speed_bf16__{SEQ}_2_none_hd",
             f"speed_fp8-delayed__{SEQ}_2_none_savext0",
             f"speed_fp8-delayed__{SEQ}_2_none_fuse0",
             f"speed_fp8-block__{SEQ}_2_none_fuse0",
             f"speed_fp8-block__{SEQ}_2_none_savext0",
             f"speed_fp8-delayed__{SEQ}_2_none_fp8attn-head-hd"} |
            {f"speed_{r}__{SEQ2}_4_none" for r in ("bf16", "fp8-delayed")})
    assert runs == want
    assert not [n for n in names if "checkpoints" in n]
    assert (out / "runs_stderr.tgz").stat().st_size < 4 << 20


def test_op_check(dry_run):
    rc, log, out, *_ = dry_run
    res = json.loads((out / "op_check.json").read_text())
    assert "sm_90" in res["device"]
    assert res["passed"] >= 10 and res["failed"] == 0, res
    assert all(r["pass"] for r in res["results"])
    ops = {r["op"] for r in res["results"]}
    assert all(any(f in op for f in OPCHECK_FILTER) for op in ops), ops  # the filter got there
    assert {"rmsnorm_forward", "adamw", "fp8_linear_forward"} <= ops
    assert "op check: exit 0" in log
    assert f"  PASS cases: {res['passed']}" in log and "  FAIL cases: 0" in log
    # the per-op table: its header, then a line per op with passed/all
    lines = log.splitlines()
    head = next(i for i, l in enumerate(lines) if re.match(r"\s+op\s+pass/all\s+worst e/t$", l))
    n_adamw = sum(r["op"] == "adamw" for r in res["results"])
    assert re.match(rf"\s+adamw\s+{n_adamw}/{n_adamw}\s", lines[head + 1]), lines[head:head + 3]


def test_loss_match(dry_run):
    rc, log, out, *_ = dry_run
    every = rows(out / "loss_match.json")
    res = every[:len(LOSS_RECIPES)]  # first; then the feature rows (test_feature_rows)
    assert [r["recipe"] for r in res] == LOSS_RECIPES
    assert [r["recipe"] for r in every[len(LOSS_RECIPES):]] == FEATURE_RECIPES + [
        "bf16 resume", "bf16 resume det", "generate", "gpu memory", "scratch full"]
    for r in res:
        assert r["ok"] is True, r
        assert r["steps"] == LOSS_STEPS and len(r["rel_per_step"]) == LOSS_STEPS
        assert r["max_rel"] <= r["tolerance_rel"]
        assert r["attention"] == "fp32"  # MXTRAIN_CUDA_ATTENTION=fp32 reached the trainer
        assert re.search(rf"^loss match {re.escape(r['recipe'])}\s*: max rel diff \S+ at step "
                         rf"{r['worst_step']} \(tolerance \S+\) -> PASS; .*attention fp32"
                         r"(; Linears native)?$",
                         log, re.M), r["recipe"]


def test_feature_rows(dry_run):
    """The trainer's paths no GPU run had reached: their loss-match rows (after the speed rows),
    the resume check and generation on cuda against cpu, each in the table."""
    rc, log, out, *_ = dry_run
    res = rows(out / "loss_match.json")
    feat = {r["recipe"]: r for r in res if r["recipe"] in FEATURE_RECIPES}
    assert sorted(feat) == sorted(FEATURE_RECIPES), res
    for name, r in feat.items():
        assert r["ok"] is True and r["steps"] == LOSS_STEPS, r
        assert re.search(rf"^loss match {re.escape(name)}\s*: max rel diff \S+ at step \d+ .*-> "
                         r"PASS; .*attention fp32", log, re.M), name
    # +emulate reached the trainer: fp8-delayed's Linears emulated on the (emulated) GPU, where
    # the plain fp8-delayed row's run on its FP8 GEMMs
    assert feat["fp8-delayed+emulate"]["native_linears"] is False
    assert [r["native_linears"] for r in res if r["recipe"] == "fp8-delayed"] == [True]
    assert re.search(r"^loss match fp8-delayed\+emulate: .*; Linears emulated$", log, re.M)
    resume = [r for r in res if r.get("check") == "resume"]
    assert [r["recipe"] for r in resume] == ["bf16 resume", "bf16 resume det"], resume
    for r in resume:
        assert r["ok"] is True and r["resumed"] and r["bit_exact"], r
        assert r["resumed_at"] == RESUME_STEPS // 2 and r["attention"] == "fp32 kernel", r
        assert re.search(rf"^resume {r['recipe']}\s*: steps {RESUME_STEPS // 2 + 1}-{RESUME_STEPS} "
                         rf"after a resume at {RESUME_STEPS // 2}, max rel diff 0.00e\+00 .*"
                         r"attention fp32 kernel, bit-exact -> PASS$", log, re.M), r
    # the second pair ran with run.deterministic (its rule: tolerance 0, bit for bit or FAIL)
    assert resume[0]["tolerance_rel"] == 1e-6 and resume[1]["tolerance_rel"] == 0
    gen = [r for r in res if r.get("check") == "generate"]
    assert len(gen) == 1 and gen[0]["ok"] is True, gen
    assert len(gen[0]["ids_cuda"]) > 4 and gen[0]["ids_cuda"] == gen[0]["ids_cpu"]
    assert re.search(r"^generate cuda vs cpu\s*: sampled, \d+ ids on cpu, \d+ on cuda, the first "
                     r"\d+ the same -> PASS$", log, re.M)
    # the two memory errors: one error line each, exit 2, naming the setting
    memory = {r["recipe"]: r for r in res if r.get("check") == "memory"}
    assert sorted(memory) == ["gpu memory", "scratch full"] and all(
        r["ok"] and r["rc"] == 2 for r in memory.values()), memory
    assert memory["gpu memory"]["error_line"].startswith(
        "error: out of GPU memory: arena 'cuda-scratch' needs 1048576000000 bytes")
    assert re.search(r"^memory gpu memory\s*: MXTRAIN_CUDA_SCRATCH_MB=1000000, exit 2: error: out "
                     r"of GPU memory: .* -> PASS$", log, re.M)
    assert re.search(r"^memory scratch full\s*: MXTRAIN_CUDA_SCRATCH_MB=16, exit 2: error: device "
                     r"arena 'cuda-scratch' is full: .* -> PASS$", log, re.M)
    # after the FP8 speed rows (the targets' figures come first)
    assert log.index("mxtrain FP8 speed:") < log.index("features: loss match exit 0, resume exit 0")


def speed_stderr(out, recipe, variant):
    """The stderr of the seq-SEQ, micro-batch-2 speed run of `recipe` `variant`, as check.sh
    packed it in runs_stderr.tgz."""
    with tarfile.open(out / "runs_stderr.tgz") as t:
        name = f"mxgpu-runs/speed_{recipe}__{SEQ}_2_none_{variant}/stderr.txt"
        return t.extractfile(name).read().decode()


def test_speed_rows(dry_run):
    rc, log, out, *_ = dry_run
    res_all = rows(out / "speed.json")
    res = [r for r in res_all if r["seq"] == SEQ]
    mx = {(r["recipe"], r.get("activations")): r for r in res
          if r["impl"] == "mxtrain" and not r.get("variant")}
    variants = {r["variant"]: r for r in res if r.get("variant") and
                r["recipe"] != "fp8-block" or r.get("variant") == "casts0"}
    # (the FP8-attention rows at MXTRAIN_GPU_HD_SETS's heads, the fake GPU being 9.0, beside a
    # bf16 row of that shape)
    assert sorted(variants) == ["casts0", "fastacc", "fp8attn-hd", "fp8attn-head-hd", "fuse0",
                                "hd", "notune", "savext0"], variants
    assert variants["hd"]["recipe"] == "bf16" and variants["hd"]["tokens_per_s"] > 0
    # fp8-delayed with FP8 attention ran with its setting: mxemu does not emulate cuDNN, so on
    # the fp32 attention kernel with the CPU twin's rounding, as a GPU without cuDNN's FP8 SDPA
    fa = variants["fp8attn-hd"]
    assert fa["recipe"] == "fp8-delayed" and fa["tokens_per_s"] > 0, fa
    text = speed_stderr(out, "fp8-delayed", "fp8attn-hd")
    assert "attention: FP8 in the blocks precision.recipe covers" in text
    assert "on the fp32 attention kernel with the CPU twin's FP8 rounding" in text
    assert "2 heads / 2 kv" in text, text[-3000:]  # MXTRAIN_GPU_HD_SETS reached the run
    # and with the head in FP8 too: on the FP8 GEMMs (the tiny shape's dimensions are
    # multiples of 16)
    fh = variants["fp8attn-head-hd"]
    assert fh["recipe"] == "fp8-delayed" and fh["tokens_per_s"] > 0, fh
    text = speed_stderr(out, "fp8-delayed", "fp8attn-head-hd")
    assert "; precision.fp8_head on FP8 GEMMs" in text, text[-2000:]
    assert "on the fp32 attention kernel with the CPU twin's FP8 rounding" in text
    assert variants["notune"]["recipe"] == "bf16" and variants["notune"]["tokens_per_s"] > 0
    # fast accumulation on fp8-delayed's forward GEMMs: the setting reached the run, its ratio
    fast = variants["fastacc"]
    assert fast["recipe"] == "fp8-delayed" and fast["tokens_per_s"] > 0, fast
    text = speed_stderr(out, "fp8-delayed", "fastacc")
    assert "cuda fp8: fast accumulation on the per-tensor FP8 forward GEMMs" in text, text[-2000:]
    assert re.search(rf"^seq {SEQ}: mxtrain fp8-delayed, fast accumulation on the forward "
                     r"GEMMs / off = \d+\.\d{3}$", log, re.M)
    assert variants["casts0"]["recipe"] == "fp8-block"
    assert variants["casts0"]["tokens_per_s"] > 0
    # x^T's codes not kept: the same recipe, and its activations arena the larger (the bf16
    # codes of h1, h2 and s at 2 bytes an element against the FP8 codes' 1)
    sx = variants["savext0"]
    assert sx["recipe"] == "fp8-delayed" and sx["tokens_per_s"] > 0, sx
    assert sx["peak_mem_bytes"] > mx[("fp8-delayed", "default")]["peak_mem_bytes"], (sx, mx)
    # SwiGLU not fused (MXTRAIN_FP8_FUSE_SWIGLU=0): the same recipe, its ratio line
    assert variants["fuse0"]["recipe"] == "fp8-delayed"
    assert variants["fuse0"]["tokens_per_s"] > 0
    assert re.search(rf"^seq {SEQ}: mxtrain fp8-delayed, SwiGLU fused / not fused = "
                     r"\d+\.\d{3}$", log, re.M)
    # and fp8-block's (its gradients' block-scaled operands from SwiGLU's backward)
    fb = [r for r in res if (r.get("variant"), r.get("recipe")) == ("fuse0", "fp8-block")]
    assert len(fb) == 1 and fb[0]["tokens_per_s"] > 0, fb
    assert re.search(rf"^seq {SEQ}: mxtrain fp8-block, SwiGLU fused / not fused = "
                     r"\d+\.\d{3}$", log, re.M)
    # and without fp8-block's kept x^T codes (128x1 with block scales)
    fx = [r for r in res if (r.get("variant"), r.get("recipe")) == ("savext0", "fp8-block")]
    assert len(fx) == 1 and fx[0]["tokens_per_s"] > 0, fx
    assert re.search(rf"^seq {SEQ}: mxtrain fp8-block, x\^T codes kept / not kept = "
                     r"\d+\.\d{3}$", log, re.M)

    for recipe in ["bf16"] + FP8:
        r = mx[(recipe, "default")]
        assert r["seq"] == SEQ and r["micro_batch"] == TOKENS // SEQ, r
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1, r
        # mxtrain plan's prediction for the same config on the GPU nvidia-smi names (the fake
        # one's H200), its step the sum of its parts (one GPU: no communication), in the table
        pl = r["plan"]
        assert pl["gpu"] == "h200" and pl["tokens_per_s"] > 0, pl
        parts = pl["gemm_s"] + pl["attention_s"] + pl["memory_bound_s"] + pl["optimizer_s"]
        assert abs(pl["step_s"] - parts) <= 1e-9 * parts, pl
        assert abs(pl["tokens_per_s"] * pl["step_s"] - TOKENS) <= 1e-6 * TOKENS, pl
        assert re.search(rf"^plan mx {re.escape(recipe)}\s+seq {SEQ} \(h200\): modelled\s+\d+ "
                         rf"tok/s, measured/modelled {r['tokens_per_s'] / pl['tokens_per_s']:.3f};",
                         log, re.M), recipe
        assert r["checkpointing"] == "none" and r["attention"] == "fp32"
        ops = [o["op"] for o in r["op_profile"]["ops"]]
        assert ops and all(o["seconds"] >= 0 for o in r["op_profile"]["ops"])
        if recipe == "bf16":
            assert "gemm_bf16" in ops, ops
        else:
            assert r["fp8_tensor_cores"] is True and r["fp8_shared_operands"] > 0, r
            assert ("fp8_block_gemm" if recipe == "fp8-block" else "fp8_gemm") in ops, ops
    a32 = mx[("bf16", "fp32")]  # the last run, the budget having room
    assert a32["tokens_per_s"] > 0 and "gemm" in [o["op"] for o in a32["op_profile"]["ops"]]
    for recipe in ("mxfp8", "nvfp4"):  # compute capability 9.0: no run
        r = mx[(recipe, None)]
        assert r["error"].startswith("skipped") and "compute capability 9.0" in r["error"], r
        assert "tokens_per_s" not in r
    # the second shape (MXTRAIN_GPU_SEQ2): mxtrain bf16, PyTorch, mxtrain fp8-delayed, each a
    # row at SEQ2 with its largest micro-batch
    res2 = [r for r in res_all if r["seq"] == SEQ2]
    assert [(r["impl"], r.get("recipe")) for r in res2] == \
        [("mxtrain", "bf16"), ("torch", None), ("mxtrain", "fp8-delayed")], res2
    for r in res2:
        if r["impl"] == "mxtrain" or HAS_TORCH:
            assert r["micro_batch"] == TOKENS // SEQ2 and r["tokens_per_s"] > 0, r
        else:
            assert "torch" in r["error"], r
    assert {r["seq"] for r in res_all} == {SEQ, SEQ2}
    torch_rows = [r for r in res if r["impl"] == "torch"]
    assert len(torch_rows) == 1
    t = torch_rows[0]
    if not HAS_TORCH:  # this Python has no torch: a row saying so
        assert "torch" in t["error"] and "tokens_per_s" not in t, t
        assert re.search(rf"^torch\s+{SEQ}  did not run: exit 1: .*torch", log, re.M)
        return
    import torch.nn.functional as F
    assert t["tokens_per_s"] > 0 and t["seq"] == SEQ and t["micro_batch"] == TOKENS // SEQ, t
    assert t["device"] == "cpu" and t["preset"] == "tiny" and t["compiled"] is False
    assert t["attention"] == ("torch sdpa" if hasattr(F, "scaled_dot_product_attention")
                              else "torch math (no sdpa)")
    # one more step profiled (torch.profiler; on the CPU its operators): the matrix products
    # are among them, each op's own time within the step's
    prof = t["op_profile"]
    names = [o["op"] for o in prof["ops"]]
    assert prof["measured"] == "operators (cpu)" and prof["first_step"] == prof["last_step"]
    assert any(n in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul") for n in names), names
    assert all(0 < o["seconds"] <= prof["seconds"] and o["calls"] >= 1 for o in prof["ops"])
    assert [o["seconds"] for o in prof["ops"]] == sorted((o["seconds"] for o in prof["ops"]),
                                                          reverse=True)


def test_table(dry_run):
    rc, log, out, *_ = dry_run
    res = [r for r in rows(out / "speed.json") if r["seq"] == SEQ]
    tps = {("mx " + r["recipe"] + ("/a32" if r["activations"] == "fp32" else "") +
            (" " + r["variant"] if r.get("variant") else "")): r["tokens_per_s"]
           for r in res if r["impl"] == "mxtrain" and "tokens_per_s" in r}
    tps.update({r["impl"]: r["tokens_per_s"] for r in res if r["impl"] == "torch"
                and "tokens_per_s" in r})
    assert re.search(r"^impl\s+seq\s+batch\s+ckpt\s+tok/s\s+MFU attention$", log, re.M)
    assert re.search(rf"^mx bf16\s+{SEQ}\s+2\s+none\s+{tps['mx bf16']:.0f}\s+[\d.]+% fp32$",
                     log, re.M)
    assert re.search(rf"^mx bf16/a32\s+{SEQ}\s+2\s+none\s+\d+\s+[\d.]+% fp32$", log, re.M)
    for fp8 in FP8:
        native = (r"\(tensor cores: VEC128/BLK128x128 GEMM\)" if fp8 == "fp8-block"
                  else r"\(tensor cores\)")
        assert re.search(rf"^mx {fp8}\s+{SEQ}\s+2\s+none\s+\d+\s+[\d.]+% fp32 {native} "
                         r"shared \d+$", log, re.M), fp8
        ratio = tps[f"mx {fp8}"] / tps["mx bf16"]
        assert f"seq {SEQ}: mxtrain {fp8} / bf16 = {ratio:.3f} (target >= 1.3)" in log
    for recipe in ("mxfp8", "nvfp4"):
        assert re.search(rf"^mxtrain {recipe}\s+{SEQ}  did not run: skipped: runs natively on "
                         r"sm_100 only \(this GPU: compute capability 9\.0\)$", log, re.M)
    assert re.search(rf"^mx bf16 notune\s+{SEQ}\s+2\s+none\s+\d+\s+[\d.]+% fp32$", log, re.M)
    # GEMM tuning: the bf16 run's tuned shapes summed up, the notune run's none (its variable
    # reached the trainer); under mxemu each shape has 3 candidates, 2 of them timed
    m = re.search(r"^gemm tune \(mx bf16\): (\d+) shapes timed, (\d+) took another", log, re.M)
    assert m and int(m[1]) > 0 and int(m[2]) <= int(m[1]), log[-3000:]
    lines = re.findall(r"^  gemm\s+[\d.]+ GFLOP: candidate [01] of 3, [\d.]+ ms \(first [\d.]+ ms, "
                       r"\d+ TFLOP/s\)$", log, re.M)
    assert 0 < len(lines) <= min(8, int(m[1])), log[-3000:]
    assert "cuda gemm tune:" not in speed_stderr(out, "bf16", "notune")
    assert (f"seq {SEQ}: mxtrain bf16, tuned / untuned GEMMs = "
            f"{tps['mx bf16'] / tps['mx bf16 notune']:.3f}") in log
    # the FP8-attention rows at MXTRAIN_GPU_HD_SETS's heads against bf16 at the same heads
    assert (f"seq {SEQ}: mxtrain fp8-delayed + FP8 attention / bf16, MXTRAIN_GPU_HD_SETS's "
            f"heads = {tps['mx fp8-delayed fp8attn-hd'] / tps['mx bf16 hd']:.3f} "
            "(target >= 1.3)") in log, log[-3000:]
    # cast tuning: the untuned fp8-block row and its ratio; the FP8 runs' tuned casts summed up
    # (each family's forms timed: fp8-block's 1x128 and 128x1 operands and dy's both at
    # once, fp8-delayed's per-tensor casts), the casts0 run's none (its variable reached the
    # trainer)
    assert re.search(rf"^mx fp8-block casts0\s+{SEQ}\s+2\s+none\s+\d+\s+[\d.]+% fp32 ",
                     log, re.M)
    assert (f"seq {SEQ}: mxtrain fp8-block, tuned / untuned casts = "
            f"{tps['mx fp8-block'] / tps['mx fp8-block casts0']:.3f}") in log
    for recipe, families in (("fp8-block", ("fp8_block_1x128", "fp8_block_128x1_t",
                                            "fp8_block_both")),
                             ("fp8-delayed", ("fp8_codes", "fp8_codes_both"))):
        m = re.search(rf"^cast tune \(mx {recipe}\): (\d+) shapes timed$", log, re.M)
        assert m and int(m[1]) > 0, log[-3000:]
        for family in families:
            assert re.search(rf"^  {family} (fp32|bf16) \d+x\d+: kept \S+ \(.* GB/s\)$", log,
                             re.M), (family, log[-3000:])
    assert "cuda cast tune:" not in speed_stderr(out, "fp8-block", "casts0")
    assert (f"seq {SEQ}: mxtrain bf16, bf16 / fp32 activations = "
            f"{tps['mx bf16'] / tps['mx bf16/a32']:.3f}") in log
    if "torch" in tps:
        assert re.search(rf"^profile torch seq {SEQ} x 2 \(steps (\d+)-\1, [\d.]+ s\):$", log,
                         re.M), log[-3000:]
        assert re.search(rf"^torch\s+{SEQ}\s+2\s+none\s+\d+\s+[\d.]+% torch (sdpa|math)", log,
                         re.M)
        assert f"seq {SEQ}: mxtrain bf16 / torch = {tps['mx bf16'] / tps['torch']:.3f}" in log
    for recipe in ["bf16"] + FP8:  # each profiled run's top ops
        assert re.search(rf"^profile mx {recipe} seq {SEQ} x 2 \(steps 2-3, [\d.]+ s\):$", log,
                         re.M), recipe
    # the second shape's rows and its own ratios
    res2 = {(r["impl"], r.get("recipe")): r for r in rows(out / "speed.json")
            if r["seq"] == SEQ2 and "tokens_per_s" in r}
    bf16_2 = res2[("mxtrain", "bf16")]["tokens_per_s"]
    assert re.search(rf"^mx bf16\s+{SEQ2}\s+4\s+none\s+{bf16_2:.0f}\s+[\d.]+% fp32$", log, re.M)
    ratio2 = res2[("mxtrain", "fp8-delayed")]["tokens_per_s"] / bf16_2
    assert f"seq {SEQ2}: mxtrain fp8-delayed / bf16 = {ratio2:.3f} (target >= 1.3)" in log
    if ("torch", None) in res2:
        assert (f"seq {SEQ2}: mxtrain bf16 / torch = "
                f"{bf16_2 / res2[('torch', None)]['tokens_per_s']:.3f}") in log
    if HAS_TORCH:  # nothing else did not run
        others = [line for line in log.splitlines() if "did not run" in line and
                  "did not run: skipped" not in line]
        assert not others, others
    assert re.search(r"^total: \d+ s$", log, re.M)


FAKE_MXTRAIN = """#!/bin/sh
# mxtrain as mxtrain_runs.py sees it: its arguments and MXTRAIN_CUDA_* on stderr, two steps in
# the run.metrics file it is given
for a in "$@"; do echo "arg $a" >&2; done
env | grep '^MXTRAIN_CUDA_' | sed 's/^/env /' >&2
m=$(printf '%s\\n' "$@" | sed -n 's/^run.metrics=//p')
printf '{"step": 1, "loss": 5.0, "grad_norm": 1.0}\\n{"step": 2, "loss": 4.0, "grad_norm": 1.0}\\n' > "$m"
"""


def test_recipe_modifiers_reach_both_runs(tmp_path):
    """Each +MOD of a loss-match recipe puts its settings on the mxtrain command line of the cpu
    run and of the cuda run, and its environment in both (a fake mxtrain records them): the
    sets-only modifiers (+ckpt, +wide, +stats, +hp) are too slow for the emulated dry run, and
    +fp8attn on mxemu would run the fp32 attention kernel, not cuDNN's FP8 SDPA the GPU row is
    for (test_cuda_emu.py trains that path)."""
    fake = tmp_path / "mxtrain"
    fake.write_text(FAKE_MXTRAIN)
    fake.chmod(0o755)
    corpus = tmp_path / "c.txt"
    corpus.write_text("text\n")
    recipes = ["bf16+ckpt", "fp8-block+wide", "fp8-current+stats+hp", "fp32+tf32",
               "fp8-delayed+fp8attn", "fp8-delayed+fp8head"]
    p = subprocess.run([sys.executable, str(REPO / "bench" / "gpu" / "mxtrain_runs.py"),
                        "loss-match", "--bin", str(fake), "--corpus", str(corpus), "--work",
                        str(tmp_path / "w"), "--steps", "2", "--recipes"] + recipes,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    rows_ = [json.loads(line) for line in p.stdout.splitlines()]
    assert [r["recipe"] for r in rows_] == recipes and all(r["ok"] for r in rows_), rows_
    want = {"bf16+ckpt": {"arg memory.activation_checkpointing=full", "arg train.grad_accum=2",
                          "arg precision.recipe=bf16", "env MXTRAIN_CUDA_ATTENTION=fp32"},
            "fp8-block+wide": {"arg model.hidden_size=128", "arg model.intermediate_size=256",
                               "arg model.num_key_value_heads=4",
                               "arg precision.recipe=fp8-block"},
            "fp8-current+stats+hp": {"arg precision.stats_every=10",
                                     "arg precision.high_precision_last=1",
                                     "arg precision.recipe=fp8-current"},
            "fp32+tf32": {"env MXTRAIN_CUDA_GEMM=tf32", "arg precision.recipe=fp32"},
            "fp8-delayed+fp8attn": {"arg precision.fp8_attention=true",
                                    "arg precision.recipe=fp8-delayed"},
            "fp8-delayed+fp8head": {"arg precision.fp8_head=true",
                                    "arg precision.recipe=fp8-delayed"}}
    for recipe, lines in want.items():
        for device in ("cpu", "cuda"):
            said = set((tmp_path / "w" / f"loss_{recipe}_{device}" / "stderr.txt")
                       .read_text().splitlines())
            assert lines | {f"arg run.device={device}"} <= said, (recipe, device, said)
            # one --set each: no modifier's setting given twice
            sets = [line for line in said if line.startswith("arg ") and "=" in line]
            keys = [line.split("=")[0] for line in sets]
            assert len(keys) == len(set(keys)), (recipe, device, keys)


def test_runtime(dry_run):
    """The dry run is part of the suite: it must stay short. Counted in the CPU seconds of its
    whole process tree (about 140 since the trainer-paths step: 286 s of wall time on 2 cores
    shared with a CI run and the README's job), which a busy machine does not stretch as it
    does wall time; 240 is less than the 200 wall seconds allowed before on 2 idle cores."""
    assert dry_run[4] < 240, f"check.sh dry run took {dry_run[4]:.0f} CPU s ({dry_run[3]:.0f} s)"


def test_bindir_without_binaries_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    env = check_env(tmp_path, MXTRAIN_GPU_BINDIR=str(tmp_path / "empty"))
    p = subprocess.run(["bash", str(CHECK)], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    err = [l for l in p.stdout.splitlines() if l.startswith("error:")]
    assert err == [f"error: MXTRAIN_GPU_BINDIR={tmp_path / 'empty'} has no executable mxtrain"]


def test_steps_that_die_still_get_rows(tmp_path):
    """A step that dies before writing its row (here: bad arguments, exit 2; on a GPU a crash or
    its time limit) still gets one saying so, and the table shows it, instead of leaving it out."""
    require_emu()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, target in EMU_BINS.items():
        (bindir / name).symlink_to(target)
    env = check_env(
        tmp_path, MXTRAIN_GPU_BINDIR=str(bindir), MXTRAIN_GPU_OPCHECK_FILTER="adamw",
        MXTRAIN_GPU_LOSS_RECIPES="fp32 no-such-recipe", MXTRAIN_GPU_SEQ=str(SEQ),
        MXTRAIN_GPU_TOKENS=str(TOKENS), MXTRAIN_GPU_PRESET="tiny",
        MXTRAIN_GPU_SPEED_SETS="no-equals-sign", MXTRAIN_GPU_TORCH_ARGS="--no-such-flag",
        # no feature rows (empty: none), and a resume check refused (an odd step count)
        MXTRAIN_GPU_FEATURE_RECIPES="", MXTRAIN_GPU_RESUME_STEPS="3")
    p = subprocess.run(["bash", str(CHECK)], capture_output=True, text=True, env=env, timeout=120)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-4000:]  # the op check passed; the rest is reported, not fatal
    out = tmp_path / "out"
    loss = rows(out / "loss_match.json")
    assert [r["recipe"] for r in loss] == ["fp32", "no-such-recipe", "bf16 resume",
                                           "bf16 resume det", "generate", "gpu memory",
                                           "scratch full"]
    for r in loss[:2]:
        assert r["ok"] is False and r["error"] == "no result: mxtrain_runs.py loss-match exit 2"
        assert re.search(rf"^loss match {r['recipe']}\s*: FAILED TO RUN no result", log, re.M)
    for r in loss[2:]:
        assert r["ok"] is False and r["error"] == "no result: mxtrain_runs.py resume exit 2"
        assert re.search(rf"^resume {r['recipe']}\s*: FAILED TO RUN no result", log, re.M), r
    speed = {(r["impl"], r.get("recipe"), r.get("activations")): r for r in rows(out / "speed.json")}
    bad_set = "exit 2: error: --set takes KEY=VALUE (e.g. model.hidden_size=128), got 'no-equals-sign'"
    for recipe, act in [("bf16", None), ("fp8-delayed", None), ("fp8-current", None),
                        ("fp8-block", None), ("bf16", "fp32")]:
        assert speed[("mxtrain", recipe, act)]["error"] == bad_set, speed
        label = f"mxtrain {recipe}" + ("/a32" if act else "")
        assert re.search(rf"^{re.escape(label)}\s+{SEQ}  did not run: {re.escape(bad_set)}$",
                         log, re.M), label
    torch_row = speed[("torch", None, None)]
    # (without torch, the import fails first: exit 1)
    why = "exit 2: .*--no-such-flag" if HAS_TORCH else "exit 1: .*No module named 'torch'"
    assert re.match(why, torch_row["error"]), torch_row
    assert f"torch seq 64: exit {2 if HAS_TORCH else 1} (see errors.txt)" in log
    assert re.search(rf"^torch\s+{SEQ}  did not run: {why}", log, re.M)
    assert len(speed) == 8  # five mxtrain runs, torch, mxfp8 and nvfp4 skipped


def test_op_check_stopped_at_its_time_limit_keeps_what_ran(tmp_path):
    """check.sh gives the op check a time limit (`timeout -k 10`, SIGTERM first). Stopped there,
    the op check skips the cases left and writes op_check.json for the cases that ran, marked
    "stopped", exiting 124 (which check.sh reports as its own exit 4), instead of dying with
    every result in memory: on a GPU whose op check outgrew its cap the JSON would otherwise be
    missing. Here mxemu's op check (some 2,200 cases, minutes) is sent SIGTERM once a few dozen
    have printed."""
    require_emu()
    out_json = tmp_path / "op_check.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MXEMU_SM="90")
    with open(tmp_path / "op_check.txt", "w") as txt:
        p = subprocess.Popen([str(EMU_BINS["cuda_op_check"]), "--json", str(out_json)],
                             stdout=txt, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 120
        while time.time() < deadline and p.poll() is None:
            if (tmp_path / "op_check.txt").read_text().count("\nPASS") >= 40:
                break
            time.sleep(0.2)
        assert p.poll() is None, "the op check ended before it was stopped"
        p.send_signal(15)
        rc = p.wait(timeout=60)
    text = (tmp_path / "op_check.txt").read_text()
    ran = [l for l in text.splitlines() if l.startswith(("PASS", "FAIL"))]
    assert rc == 124, text[-2000:]
    assert "stopped by signal 15: the cases after it did not run" in text
    doc = json.loads(out_json.read_text())
    assert doc["stopped"] == f"signal 15 after {len(ran)} cases: the rest did not run", doc
    assert len(doc["results"]) == len(ran) == doc["passed"] + doc["failed"]
    assert 40 <= len(ran) < 1000
    assert [r["op"] for r in doc["results"]] == [l.split()[1] for l in ran]


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_torch_reference_takes_a_wrapped_out_of_memory_as_one():
    """torch_llama.py tries smaller micro-batches on CUDA's out-of-memory error; torch.compile
    can re-raise it wrapped in an error of its own (a RuntimeError whose cause is the OOM), which
    ended the PyTorch row instead of trying the next micro-batch. Any other error still ends it."""
    import torch
    spec = importlib.util.spec_from_file_location("torch_llama",
                                                  REPO / "bench" / "gpu" / "torch_llama.py")
    tl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tl)
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert tl.out_of_memory(oom)
    try:
        try:
            raise oom
        except torch.cuda.OutOfMemoryError as e:
            raise RuntimeError("backend='inductor' raised: see the cause") from e
    except RuntimeError as wrapped:
        assert tl.out_of_memory(wrapped)
    assert not tl.out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not tl.out_of_memory(ValueError("bad preset"))


def test_binaries_built_from_other_sources_are_said_at_once(tmp_path):
    """prepare.sh writes SOURCES.sha256 beside the bundle's binaries (the sources CMake compiles,
    hashed); check.sh compares it with the tree it runs in and says at once, before the op
    check, when they differ: a bundle not rebuilt after a change would spend the GPU session
    testing old code. Here a bin directory whose list has one file as it is in this tree, one
    changed and one gone: the warning names the two. The same list with the right hashes only:
    no warning."""
    require_emu()
    import hashlib
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, target in EMU_BINS.items():
        (bindir / name).symlink_to(target)
    same = hashlib.sha256((REPO / "CMakeLists.txt").read_bytes()).hexdigest()

    def first_lines(sources):
        (bindir / "SOURCES.sha256").write_text(sources)
        return lines_up_to_the_op_check(check_env(tmp_path, MXTRAIN_GPU_BINDIR=str(bindir),
                                                  MXTRAIN_GPU_OPCHECK_FILTER="no-such-op"))

    lines = first_lines(f"{same}  CMakeLists.txt\n{'0' * 64}  core/error.h\n"
                        f"{same}  core/no_such_file.h\n")
    warn = [l for l in lines if l.startswith("WARNING: the binaries were built")]
    assert len(warn) == 1, lines
    assert "(2 files differ or are missing, e.g. core/error.h core/no_such_file.h )" in warn[0]
    assert warn[0].endswith("run bench/gpu/prepare.sh again")
    assert not [l for l in first_lines(f"{same}  CMakeLists.txt\n") if l.startswith("WARNING")]


def test_binaries_that_cannot_load_stop_the_check_at_once(tmp_path):
    """A library the loader cannot find (a bundle carried without its lib/, a wheel missing on
    the GPU machine) would fail the op check and every mxtrain row in turn, minutes of a lent
    GPU for nothing: check.sh names it in one RESULT line and exits 3 before the op check. Here
    an `mxtrain` linked against a library that is then deleted."""
    import shutil
    require_emu()
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc) on PATH")
    src = tmp_path / "main.c"
    src.write_text("int mx_gone(void);\nint main(void) { return mx_gone(); }\n")
    (tmp_path / "gone.c").write_text("int mx_gone(void) { return 0; }\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libmxgone.so"),
                    str(tmp_path / "gone.c")], check=True)
    subprocess.run([cc, "-o", str(bindir / "mxtrain"), str(src), f"-L{tmp_path}", "-lmxgone"],
                   check=True)
    (tmp_path / "libmxgone.so").unlink()
    (bindir / "cuda_op_check").symlink_to(EMU_BINS["cuda_op_check"])
    env = check_env(tmp_path, MXTRAIN_GPU_BINDIR=str(bindir))
    p = subprocess.run(["bash", str(CHECK)], capture_output=True, text=True, env=env, timeout=120)
    log = p.stdout + p.stderr
    assert p.returncode == 3, log[-3000:]
    result = [l for l in p.stdout.splitlines() if l.startswith("RESULT:")]
    assert len(result) == 1, log[-3000:]
    assert result[0].startswith("RESULT: the binaries cannot load: libmxgone.so not found ("), result
    assert not re.search(r"^op check:", log, re.M) and "loss match" not in log
    # the same binaries with the library where the loader finds it: no such line, the op check runs
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libmxgone.so"),
                    str(tmp_path / "gone.c")], check=True)
    lines = lines_up_to_the_op_check(check_env(
        tmp_path, MXTRAIN_GPU_BINDIR=str(bindir), LD_LIBRARY_PATH=str(tmp_path),
        MXTRAIN_GPU_OPCHECK_FILTER="no-such-op"))
    assert lines and lines[-1].startswith("op check:"), lines
    assert not [l for l in lines if l.startswith("RESULT:")], lines
