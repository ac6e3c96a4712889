"""run.device: the CUDA backend's error on a machine or build without a GPU, and the host<->device
staging paths the trainer takes on a GPU, run here on the CPU.

A GPU's buffers are not host memory, so the trainer reaches them only through the backend's
copy calls (token batches and rope tables in, recipe operands out and back, FSDP scatter/gather,
checkpoint staging, resume). MXTRAIN_TEST_STAGING=1 makes the CPU backend report its memory as
not host-addressable, so those staging paths run with memcpy as the copy. The reference is the
ordinary CPU run (itself checked against PyTorch by test_train_ref / test_grads): staging moves
bytes without changing them, so every loss, gradient norm, checkpoint byte and sampled token
must be identical."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import MXTRAIN_BIN, require_binary, tiny_checkpoint

MPIRUN_FLAGS = os.environ.get("MXTRAIN_MPIRUN_FLAGS", "--oversubscribe --bind-to none").split()


def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    if not path.exists():
        path.write_text(("A tale of two cities, a tale of staging buffers between host and "
                         "device, told twice and compared byte for byte. ") * 50)
    return path


def train(tmp_path, name, staged, np_=1, extra=(), timeout=180, env_extra=None):
    require_binary()
    out = tmp_path / name
    args = [MXTRAIN_BIN, "train", "--set", "model.preset=tiny",
            "--set", f"data.path={corpus(tmp_path)}", "--set", "train.steps=12",
            "--set", "train.seq_len=32", "--set", f"train.micro_batch={4 // np_}",
            "--set", "train.warmup_steps=3", "--set", "train.grad_clip=0.5",
            "--set", "train.eval_every=0", "--set", "train.log_every=1",
            "--set", "checkpoint.every=6", "--set", f"run.out_dir={out}"] + list(extra)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               MXTRAIN_TEST_STAGING="1" if staged else "0", **(env_extra or {}))
    cmd = (["mpirun", "-np", str(np_)] + MPIRUN_FLAGS + args) if np_ > 1 else args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, f"{cmd}\n{p.stderr[-3000:]}"
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [(r["step"], r["loss"], r["grad_norm"]) for r in records if not r.get("summary")]
    return steps, out, p.stdout


def checkpoint_files(out, step):
    d = out / "checkpoints" / f"step_{step:08d}"
    return {f.name: f.read_bytes() for f in sorted(d.glob("rank_*.safetensors"))}


def train_cuda_without_gpu(tmp_path, **env):
    """One step with run.device = cuda and no GPU visible; returns the process."""
    require_binary()
    return subprocess.run([MXTRAIN_BIN, "train", "--set", "model.preset=tiny",
                           "--set", f"data.path={corpus(tmp_path)}", "--set", "train.steps=1",
                           "--set", "run.device=cuda", "--set", f"run.out_dir={tmp_path / 'o'}"],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES="", **env))


def test_cuda_without_gpu_is_a_clear_error(tmp_path):
    # This machine has no GPU: a CUDA build says so, a CPU-only build says it has no CUDA.
    p = train_cuda_without_gpu(tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines[-1].startswith("error: run.device = cuda: "), p.stderr
    assert "no usable CUDA GPU" in lines[-1] or "built without the CUDA backend" in lines[-1]
    assert not (tmp_path / "o" / "checkpoints").exists()


def test_a_command_flag_is_named_as_the_flag(tmp_path, mxtrain):
    """`bench sgemm --device cuda` and `generate --device cuda` on a machine without a GPU said
    "run.device = cuda", a key those commands do not have: their flag is named now."""
    root = tiny_checkpoint(mxtrain, tmp_path / "run")
    for args in (["bench", "sgemm", "--device", "cuda", "--size", "64"],
                 ["generate", "--model", str(root), "--prompt", "hi", "--device", "cuda"]):
        p = subprocess.run([MXTRAIN_BIN] + args, capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
        errs = [l for l in p.stderr.splitlines() if l.startswith("error:")]
        assert p.returncode == 2 and len(errs) == 1, p.stderr
        assert errs[0].startswith("error: --device cuda: ") and "run.device" not in errs[0], errs


def test_bad_cuda_attention_setting_is_a_clear_error(tmp_path):
    # MXTRAIN_CUDA_ATTENTION is read before the GPU is looked for: a bad value is an error on any
    # machine (a CPU-only build has no CUDA backend to read it, and says so instead).
    p = train_cuda_without_gpu(tmp_path, MXTRAIN_CUDA_ATTENTION="flash")
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert (last == "error: MXTRAIN_CUDA_ATTENTION must be cudnn or fp32 (got 'flash')"
            or "built without the CUDA backend" in last), p.stderr
    assert not (tmp_path / "o" / "checkpoints").exists()


def test_bad_gemm_tune_setting_is_a_clear_error(tmp_path):
    # MXTRAIN_CUDA_GEMM_TUNE (0, 1 or all) is read with the other CUDA settings, before the GPU
    # is looked for.
    p = train_cuda_without_gpu(tmp_path, MXTRAIN_CUDA_GEMM_TUNE="yes")
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert (last.startswith("error: MXTRAIN_CUDA_GEMM_TUNE must be 0 ") and last.endswith("(got 'yes')")
            or "built without the CUDA backend" in last), p.stderr
    assert not (tmp_path / "o" / "checkpoints").exists()


@pytest.mark.parametrize("value", ["yes", "", "2"])
def test_bad_cast_tune_setting_is_a_clear_error(tmp_path, value):
    # MXTRAIN_CUDA_CAST_TUNE (0, 1 or all) is read with the other CUDA settings, before the GPU
    # is looked for, not at the first cast.
    p = train_cuda_without_gpu(tmp_path, MXTRAIN_CUDA_CAST_TUNE=value)
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert (last.startswith("error: MXTRAIN_CUDA_CAST_TUNE must be 0 ")
            and last.endswith(f"(got '{value}')")
            or "built without the CUDA backend" in last), p.stderr
    assert not (tmp_path / "o" / "checkpoints").exists()


@pytest.mark.parametrize("value", ["3", "", "2 "])
def test_bad_fp8_cast_unroll_setting_is_a_clear_error(tmp_path, value):
    # MXTRAIN_FP8_CAST_UNROLL (1, 2 or 4) too is read before the GPU is looked for, not at the
    # first FP8 cast.
    p = train_cuda_without_gpu(tmp_path, MXTRAIN_FP8_CAST_UNROLL=value)
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert (last == f"error: MXTRAIN_FP8_CAST_UNROLL must be 1, 2 or 4 (got '{value}')"
            or "built without the CUDA backend" in last), p.stderr
    assert not (tmp_path / "o" / "checkpoints").exists()


@pytest.mark.parametrize("recipe,stats,activations", [("fp32", 0, ""), ("nvfp4", 0, ""),
                                                      ("nvfp4", 5, ""), ("mxfp8", 0, ""),
                                                      ("bf16", 0, "bf16")])
def test_staged_run_is_identical(tmp_path, recipe, stats, activations):
    # nvfp4 and mxfp8 take the backend's quantize_dequantize when staged (a GPU's emulated
    # path; the CPU's form is the recipe's quantizers): operands and, for nvfp4, the weight
    # gradient's transpose + Hadamard transform. Telemetry steps (precision.stats_every) take
    # the host round trip instead: the two must interleave without a difference.
    extra = ["--set", f"precision.recipe={recipe}", "--set", "run.sample_tokens=12",
             "--set", f"precision.stats_every={stats}"]
    if activations:  # bf16 activations (a GPU's default under a recipe): pack / unpack staged
        extra += ["--set", f"precision.activations={activations}"]
    ref, ref_out, ref_stdout = train(tmp_path, "direct", False, extra=extra)
    got, got_out, got_stdout = train(tmp_path, "staged", True, extra=extra)
    assert len(ref) == 12 and got == ref
    for step in (6, 12):
        a, b = checkpoint_files(ref_out, step), checkpoint_files(got_out, step)
        assert a and a == b, step
    assert "--- sample" in ref_stdout and got_stdout == ref_stdout
    # Resume through the staged load path continues the uninterrupted trajectory exactly.
    resumed, _, _ = train(tmp_path, "staged_resume", True, extra=extra + [
        "--set", f"checkpoint.resume={ref_out / 'checkpoints' / 'step_00000006'}"])
    assert resumed == ref[6:]


@pytest.mark.parametrize("recipe,policy", [("bf16", "none"), ("bf16", "full"),
                                           ("mxfp8", "selective")])
def test_bf16_path_on_device_memory_is_identical(tmp_path, recipe, policy):
    # What a GPU run under a recipe does: bf16 activations on a backend with native bf16 GEMMs
    # (the bf16 path, MXTRAIN_TEST_BF16_GEMM on the CPU; mxfp8's Linears widen its codes),
    # staged, in arenas on counted device memory sized by activation_bytes (which must hold the
    # path: an overflow fails the run), with validation (a full-recompute forward). Same losses,
    # checkpoints and text as the direct run that rounds in place.
    extra = ["--set", f"precision.recipe={recipe}", "--set", "precision.activations=bf16",
             "--set", f"memory.activation_checkpointing={policy}", "--set", "train.eval_every=6",
             "--set", "run.sample_tokens=12"]
    ref, ref_out, ref_stdout = train(tmp_path, "direct", False, extra=extra)
    got, got_out, got_stdout = train(tmp_path, "path", True, extra=extra, env_extra={
        "MXTRAIN_TEST_BF16_GEMM": "1", "MXTRAIN_TEST_DEVICE_MEMORY": "1"})
    assert len(ref) == 12 and got == ref
    val = lambda out: [json.loads(l).get("val_loss") for l in
                       (out / "metrics.jsonl").read_text().splitlines()]
    assert [v for v in val(ref_out) if v] and val(got_out) == val(ref_out)
    for step in (6, 12):
        a, b = checkpoint_files(ref_out, step), checkpoint_files(got_out, step)
        assert a and a == b, step
    assert "--- sample" in ref_stdout and got_stdout == ref_stdout


# Shapes where different phases set the scratch arena's peak: blocks (long sequence, small
# vocabulary, wide MLP), the attention half (intermediate below hidden), the head (large
# vocabulary). activation_bytes' bound for the bf16 path alone (recipe bf16) must hold every
# allocation under every policy, evaluation included: an arena overflow fails the run.
@pytest.mark.parametrize("shape", [
    {"model.hidden_size": 64, "model.intermediate_size": 256, "model.vocab_size": 256},
    {"model.hidden_size": 96, "model.intermediate_size": 40, "model.num_attention_heads": 6,
     "model.num_key_value_heads": 2, "model.vocab_size": 256},
    {"model.hidden_size": 64, "model.intermediate_size": 128, "model.vocab_size": 2000},
], ids=["wide-mlp", "narrow-mlp", "large-vocab"])
@pytest.mark.parametrize("policy", ["none", "selective", "full"])
def test_bf16_path_arenas_hold_every_phase(tmp_path, shape, policy):
    extra = ["--set", "precision.recipe=bf16", "--set", "precision.activations=bf16",
             "--set", f"memory.activation_checkpointing={policy}", "--set", "train.eval_every=2",
             "--set", "train.steps=2", "--set", "train.seq_len=96", "--set", "run.sample_tokens=0",
             "--set", "checkpoint.every=0"]
    for k, v in shape.items():
        extra += ["--set", f"{k}={v}"]
    steps, _, _ = train(tmp_path, "arena", True, extra=extra, env_extra={
        "MXTRAIN_TEST_BF16_GEMM": "1", "MXTRAIN_TEST_DEVICE_MEMORY": "1"})
    assert len(steps) == 2


def test_staged_two_process_fsdp_is_identical(tmp_path):
    # Two ranks, full sharding: gathers for the sample and checkpoint staging of the shards.
    extra = ["--set", "parallel.sharding=full", "--set", "run.sample_tokens=8"]
    ref, ref_out, ref_stdout = train(tmp_path, "direct2", False, np_=2, extra=extra)
    got, got_out, got_stdout = train(tmp_path, "staged2", True, np_=2, extra=extra)
    assert len(ref) == 12 and got == ref
    a, b = checkpoint_files(ref_out, 12), checkpoint_files(got_out, 12)
    assert len(a) == 2 and a == b
    assert "--- sample" in ref_stdout and got_stdout == ref_stdout


def test_generate_on_device_memory_is_identical(tmp_path):
    # `mxtrain generate` decodes on the backend's memory: the weights copied over once, the KV
    # cache and every activation there, only the token, the RoPE angles and the logits crossing
    # per step. Staged, and staged on counted device memory, the text is the host run's; with
    # too little device memory it says so once and decodes on the host, with the same text.
    _, out, _ = train(tmp_path, "model", False, extra=["--set", "run.sample_tokens=0"])
    args = [MXTRAIN_BIN, "generate", "--model", str(out / "checkpoints"), "--prompt", "A tale",
            "--max-tokens", "40", "--seed", "5"]

    def generate(**env):
        p = subprocess.run(args, capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, OMP_NUM_THREADS="1", **env))
        assert p.returncode == 0, p.stderr
        return p

    ref = generate()
    assert ref.stdout.startswith("A tale") and len(ref.stdout) > 40
    for env in ({"MXTRAIN_TEST_STAGING": "1"},
                {"MXTRAIN_TEST_STAGING": "1", "MXTRAIN_TEST_DEVICE_MEMORY": "1"}):
        got = generate(**env)
        assert got.stdout == ref.stdout, env
        assert "warning" not in got.stderr, got.stderr
    small = generate(MXTRAIN_TEST_STAGING="1", MXTRAIN_TEST_DEVICE_MEMORY="1",
                     MXTRAIN_TEST_DEVICE_MEMORY_LIMIT="100000")
    assert small.stdout == ref.stdout
    warnings = [l for l in small.stderr.splitlines() if l.startswith("warning:")]
    assert len(warnings) == 1 and "out of device memory" in warnings[0] and \
        "decoding on the CPU instead" in warnings[0], small.stderr


PLUGIN = Path(MXTRAIN_BIN).parent / "libmxcuda.so"


def needs_plugin():
    require_binary()
    if not PLUGIN.exists():
        pytest.skip("this build has no CUDA backend (no nvcc / NCCL): no libmxcuda.so")


def test_a_cpu_run_of_a_cuda_build_loads_no_cuda_library(tmp_path):
    """The CUDA backend was linked into mxtrain: every command, a CPU run included, loaded
    cudart, cuBLASLt and NCCL (227 MB resident for `mxtrain --help`; no start at all on a
    machine without them). It is libmxcuda.so now, loaded at the first run.device = cuda. The
    dynamic linker's own list of what a CPU run loads is the reference."""
    needs_plugin()
    deps = subprocess.run(["ldd", MXTRAIN_BIN], capture_output=True, text=True).stdout
    assert not any(n in deps for n in ("libcudart", "libcublas", "libnccl")), deps
    env = dict(os.environ, LD_DEBUG="files", OMP_NUM_THREADS="1")
    p = subprocess.run([MXTRAIN_BIN, "train", "--set", "model.preset=tiny", "--set",
                        "data.format=random", "--set", "train.steps=1", "--set",
                        "train.seq_len=16", "--set", "run.sample_tokens=0", "--set",
                        f"run.out_dir={tmp_path / 'cpu'}"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    loaded = [l for l in p.stderr.splitlines() if "calling init:" in l]
    assert loaded and not any("cuda" in l or "cublas" in l or "nccl" in l for l in loaded), loaded
    # run.device = cuda loads it (and, without a GPU here, says so)
    p = train_cuda_without_gpu(tmp_path, LD_DEBUG="files")
    assert p.returncode == 2 and "libmxcuda.so" in p.stderr and "libcublasLt" in p.stderr
    errs = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert len(errs) == 1 and "no usable CUDA GPU" in errs[0], p.stderr[-2000:]


@pytest.mark.parametrize("case", ["missing", "not_a_library", "no_entry"])
def test_a_cuda_backend_that_cannot_load_is_named(tmp_path, case):
    """mxtrain without its libmxcuda.so beside it (copied alone), or with a file there that is
    not one: one error naming the file and why, exit 2; a CPU run of the same copy works."""
    needs_plugin()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "mxtrain").write_bytes(Path(MXTRAIN_BIN).read_bytes())
    (bindir / "mxtrain").chmod(0o755)
    if case == "not_a_library":
        (bindir / "libmxcuda.so").write_text("not an ELF file\n")
    elif case == "no_entry":  # a real shared library, but not mxtrain's CUDA backend
        libc = subprocess.run(["sh", "-c", "ldd /bin/sh | awk '/libc.so/{print $3}'"],
                              capture_output=True, text=True).stdout.strip()
        (bindir / "libmxcuda.so").write_bytes(Path(libc).read_bytes())
    args = ["train", "--set", "model.preset=tiny", "--set", "data.format=random",
            "--set", "train.steps=1", "--set", "train.seq_len=16", "--set", "run.sample_tokens=0"]
    p = subprocess.run([str(bindir / "mxtrain")] + args + [
        "--set", "run.device=cuda", "--set", f"run.out_dir={tmp_path / 'o'}"],
        capture_output=True, text=True, timeout=60)
    errs = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert p.returncode == 2 and len(errs) == 1, p.stderr
    assert str(bindir / "libmxcuda.so") in errs[0], errs
    want = {"missing": "is missing", "not_a_library": "cannot load",
            "no_entry": "not mxtrain's CUDA backend"}[case]
    assert want in errs[0], errs
    p = subprocess.run([str(bindir / "mxtrain")] + args + ["--set", f"run.out_dir={tmp_path / 'c'}"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-2000:]
