"""The CUDA backend's trainer path, run here under mxemu (tests/cuda_emu): `mxtrain_emu` is mxtrain
built with the CUDA backend's own sources (kernels, cuBLASLt calls, NCCL communicator, arenas,
the trainer's device paths) against a CPU emulation of the CUDA runtime, cuBLASLt and NCCL.

Each case trains the tiny preset a few steps with run.device = cuda on the emulated device and
with run.device = cpu, same seed, data and recipe, and compares the losses and gradient norms
step by step. The reference is the CPU run (itself checked against PyTorch by test_train_ref,
test_grads and test_recipes); under a recipe the CPU runs its emulation of the recipe, the CUDA
side the recipe's GEMMs on the (emulated) tensor cores: the same codes and scales, products
accumulated in another order. The tolerances are for that order (the emulated GEMM accumulates
in double, the CPU's in fp32) and its effect on the next operands' codes, a few steps in; a
wrong scale, layout or kernel index moves the loss by far more (see docs/cuda_emu.md). Every
emulated run is under the race check (MXEMU_RACECHECK=1): a kernel access two threads or blocks
make unordered fails the run."""
import os
import re
import subprocess
import time

import pytest

from conftest import MXTRAIN_BIN
from cuda_emu_run import (EMU_BIN, FP8, MPIRUN_FLAGS, STEPS, WIDE, compare, corpus, require_emu,
                          train)

# (recipe, emulated compute capability, loss tolerance, what the trainer must say it runs, sets).
CASES = [
    ("fp32", "90", 1e-6, "device cuda mxemu sm_90", ()),
    ("bf16", "90", 1e-4, "device cuda mxemu sm_90", ()),
    ("fp8-current", "90", 1e-3, FP8, ()),
    ("fp8-delayed", "90", 1e-3, FP8, ()),
    ("fp8-block", "90", 1e-3, FP8, WIDE),
    ("fp8-block", "100", 1e-3, FP8, WIDE),
    ("mxfp8", "100", 1e-3, FP8, ()),
    # (profiled: its quantizers read the bf16 path's codes, none widened to fp32 first)
    ("nvfp4", "100", 1e-3, "on the backend's FP4 GEMMs", ("--set", "run.profile=true")),
    # FP8 attention: mxemu has no cuDNN, so the fp32 kernel with the twin's rounding inside
    ("fp8-delayed", "90", 1e-3, "on the fp32 attention kernel with the CPU twin's FP8 rounding",
     ("--set", "precision.fp8_attention=true")),
    # the FP8 head on the FP8 GEMMs (tiny: vocabulary, width, tokens and chunk multiples of 16),
    # with telemetry steps: its logits gradient's amax from the kernel against the twin's
    ("fp8-delayed", "90", 1e-3, "; precision.fp8_head on FP8 GEMMs, its data gradient in bf16",
     ("--set", "precision.fp8_head=true", "--set", "precision.stats_every=2")),
    # and with its data gradient in FP8 too
    ("fp8-delayed", "90", 1e-3, "; precision.fp8_head on FP8 GEMMs, its data gradient too",
     ("--set", "precision.fp8_head=true", "--set", "precision.fp8_head_dgrad=fp8")),
]


def case_id(c):
    return (f"{c[0]}-sm{c[1]}" + ("-fp8attn" if "precision.fp8_attention=true" in c[4] else "")
            + ("-fp8head" if "precision.fp8_head=true" in c[4] else "")
            + ("-fp8dgrad" if "precision.fp8_head_dgrad=fp8" in c[4] else ""))


@pytest.mark.parametrize("recipe,sm,tol,says,extra", CASES, ids=[case_id(c) for c in CASES])
def test_cuda_trainer_matches_cpu(tmp_path, recipe, sm, tol, says, extra):
    require_emu()
    cpu, _, _ = train(tmp_path, "cpu", MXTRAIN_BIN, "cpu", recipe, extra=extra)
    cuda, summary, log = train(tmp_path, "cuda", EMU_BIN, "cuda", recipe, sm=sm, extra=extra)
    assert f"mxemu sm_{sm}" in log, log[-2000:]
    assert says in log, log[-2000:]
    assert summary["device_mem_bytes"] > 0  # the device arenas were used
    if recipe.startswith("fp8") or recipe in ("mxfp8", "nvfp4"):
        # Only the tensor-core Linears keep a shared input's operand: the FP8 GEMMs ran.
        assert summary["fp8_shared_operands"] > 0, summary
    if recipe.startswith("fp8") or recipe in ("mxfp8", "nvfp4"):
        # fp8-current's and nvfp4's h1 and h2 took their amax from the RMSNorm kernel (2 a
        # block and step; tiny: 2 blocks): Fp8Operand::x_amax. The others need none.
        norm = 2 * 2 * STEPS if recipe in ("fp8-current", "nvfp4") else 0
        assert summary["fp8_norm_amax_inputs"] == norm, summary
        # and fp8-current's o and down took the residual gradient's from the norm's backward
        grads = 3 * STEPS if recipe == "fp8-current" else 0
        assert summary["fp8_norm_amax_grads"] == grads, summary
        # and fp8-current's and nvfp4's weights' data-gradient casts took each W's amax from
        # its forward cast
        reuses = 7 * 2 * STEPS if recipe in ("fp8-current", "nvfp4") else 0
        assert summary["fp8_weight_amax_reuses"] == reuses, summary
    if recipe == "nvfp4":  # and each Linear's backward took dy's two operands from one read
        ops = {o["op"] for o in summary["op_profile"]["ops"]}
        assert "nvfp4_operand" in ops and "unpack_bf16" not in ops, ops
        assert "rmsnorm_forward_bf16 (amax)" in ops, ops
        assert "nvfp4_operand (dy both)" in ops, ops
        # the bf16 path's outputs (v, gate, up; dx) as codes out of the FP4 GEMM's epilogue,
        # the residual adds in it: no fp32 output rounded or added by a pass of its own
        assert not [o for o in ops if o.endswith("(round)") or o == "add"], ops
    compare(cpu, cuda, tol)
    stats = [(c, g) for c, g in zip(cpu, cuda) if "numerics" in c]
    assert len(stats) == sum("numerics" in g for g in cuda)
    if "precision.stats_every=2" in extra:
        assert stats
        for c, g in stats:
            a, b = c["numerics"]["head.bwd.grad_output"], g["numerics"]["head.bwd.grad_output"]
            assert a["scale"] == b["scale"], (a, b)
            assert abs(b["amax"] - a["amax"]) <= 1e-3 * a["amax"], (c["step"], a, b)


@pytest.mark.parametrize("recipe,tol,ranks", [("fp32", 1e-6, 2), ("bf16", 1e-4, 2),
                                              ("fp8-delayed", 1e-3, 2), ("fp32", 1e-6, 4)])
@pytest.mark.parametrize("streams", ["compute-late", "comm-late"])
def test_fsdp_over_emulated_nccl_matches_cpu(tmp_path, recipe, tol, ranks, streams):
    """Two ranks (and four, in fp32) under mpirun: the CUDA trainer's FSDP over the NCCL communicator (emulated over
    MPI) against the CPU's two-rank FSDP over MPI, same global batch. Under recipe bf16 the
    device gathers the blocks as bf16 codes (NCCL's bf16 all-gather), the values its bf16
    GEMMs would round them to anyway; under fp8-delayed the tensor-core Linears run on the
    gathered blocks. The collectives run on their own stream: once as early
    and the compute as late as the backend's event waits allow, once the other way round
    (MXEMU_STREAMS), so a missing or misplaced wait between the streams changes the losses."""
    require_emu()
    cpu, _, _ = train(tmp_path, "cpu", MXTRAIN_BIN, "cpu", recipe, np_=ranks)
    cuda, summary, log = train(tmp_path, "cuda", EMU_BIN, "cuda", recipe, np_=ranks,
                               streams=streams)
    assert "mxemu sm_90" in log and "sharding full over nccl" in log, log[-2000:]
    if recipe == "bf16":
        assert "(bf16 block gathers)" in log, log[-2000:]
    if recipe.startswith("fp8"):  # the FP8 GEMMs ran on the gathered blocks
        assert summary["fp8_shared_operands"] > 0, summary
    compare(cpu, cuda, tol)


def nccl_job(tmp_path, out, steps):
    """A two-rank recipe-bf16 job's mxtrain_emu arguments (tiny, FSDP over the emulated NCCL;
    for mpirun -np 2) and its environment."""
    args = [EMU_BIN, "train", "--set", "model.preset=tiny", "--set",
            f"data.path={corpus(tmp_path)}", "--set", f"train.steps={steps}", "--set",
            "train.seq_len=64", "--set", "train.micro_batch=2", "--set", "data.val_fraction=0.0",
            "--set", "run.sample_tokens=0", "--set", "run.device=cuda", "--set",
            "precision.recipe=bf16", "--set", f"run.out_dir={tmp_path / out}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MXEMU_SM="90",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return args, env


def test_one_rank_failing_over_nccl_ends_the_job_at_once(tmp_path):
    """One of two ranks fails as a step starts (MXTRAIN_TEST_FAIL_AT_STEP), while the other goes
    on into the step's all-gathers over NCCL. The failing rank's NCCL communicator used to wait
    for its stream and call ncclCommDestroy as the error unwound: NCCL's destroy is a collective
    among the node's ranks (mxemu's now is too), which the other rank, blocked in its
    collective, never reaches, so the error never reached abort_all and the job hung until the
    watchdog (30 minutes by default). Now it aborts the communicator (ncclCommAbort): the job
    ends within seconds, exit 2, with the failing rank's one error line."""
    require_emu()
    args, env = nccl_job(tmp_path, "fail", steps=4)
    env["MXTRAIN_TEST_FAIL_AT_STEP"] = "1:2"
    t0 = time.time()
    try:
        p = subprocess.run(["mpirun", "-np", "2"] + MPIRUN_FLAGS + args, capture_output=True,
                           text=True, timeout=180, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the job hung after rank 1 failed: {(e.stderr or b'')[-2000:]!r}")
    errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert p.returncode == 2 and errors, p.stderr[-3000:]
    assert errors[0] == "error: rank 1: test: rank 1 fails at step 2 (MXTRAIN_TEST_FAIL_AT_STEP)", \
        errors
    assert "sharding full over nccl" in p.stderr and time.time() - t0 < 120


@pytest.mark.parametrize("case", ["two ranks on one gpu", "old nccl"])
def test_nccl_setups_that_cannot_work_are_refused_before_nccl_init(tmp_path, case):
    """Two ranks on a host with one GPU (MXEMU_DEVICE_COUNT=1: the local ranks wrap around to
    device 0): NCCL does not support two ranks of a communicator on one GPU (a hang, or its
    "Duplicate GPU detected" at init, which mxemu's ncclCommInitRank also returns), so every
    rank says so in one line naming the host, the PCI bus id and the counts, exit 2. A libnccl
    older than 2.18 (MXEMU_NCCL_VERSION) lacks ncclCommSplit: refused the same way, rather than
    dying on an unresolved symbol at the first split."""
    require_emu()
    args, env = nccl_job(tmp_path, "out", steps=2)
    if case == "two ranks on one gpu":
        env["MXEMU_DEVICE_COUNT"] = "1"
        want = re.compile(r"^error: (rank \d: )?ranks 0 and 1 on host \S+ both drive the GPU at "
                          r"PCI 0000:18:00\.0: NCCL needs one rank per GPU, and this host has 2 "
                          r"ranks for 1 visible GPUs")
    else:
        env["MXEMU_NCCL_VERSION"] = "21705"
        want = re.compile(r"^error: (rank \d: )?the NCCL library loaded \(libnccl\.so\.2\) is "
                          r"version 2\.17\.5; mxtrain needs 2\.18 or newer \(it was built "
                          r"against 2\.28\.9\)$")
    p = subprocess.run(["mpirun", "-np", "2"] + MPIRUN_FLAGS + args, capture_output=True,
                       text=True, timeout=180, env=env)
    errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert p.returncode == 2 and errors and all(want.match(l) for l in errors), p.stderr[-3000:]
    assert not (tmp_path / "out" / "checkpoints").exists()
    # The same job with a GPU per rank (mxemu's default: 8 on the node) and NCCL 2.28 trains.
    env.pop("MXEMU_DEVICE_COUNT", None)
    env.pop("MXEMU_NCCL_VERSION", None)
    p = subprocess.run(["mpirun", "-np", "2"] + MPIRUN_FLAGS + args, capture_output=True,
                       text=True, timeout=300, env=env)
    assert p.returncode == 0 and "sharding full over nccl" in p.stderr, p.stderr[-3000:]


@pytest.mark.parametrize("knob,value,expected", [
    ("MXEMU_RACECHECK", "yes", "0 or 1"),
    ("MXEMU_STREAMS", "late", "eager, compute-late or comm-late"),
    ("MXEMU_LT_HEURISTIC_BF16_OUT", "bogus", "invalid or failed"),
    ("MXEMU_LT_REFUSE_OUT_OF_PLACE", "yes", "0 or 1"),
])
def test_mxemu_knobs_with_bad_values_stop_every_run_at_start(tmp_path, knob, value, expected):
    """A bad value for one of mxemu's knobs is one error line and exit 2 before the run
    starts, whatever the run would have used: here a bf16 run, which never asks cuBLASLt's
    heuristic about the FP8 / FP4 GEMMs that MXEMU_LT_HEURISTIC_BF16_OUT changes (it used to
    be read only there, so such a run ignored a typo in it), nor makes the out-of-place FP8
    GEMMs that MXEMU_LT_REFUSE_OUT_OF_PLACE refuses (read at each, and only its first
    character: "yes" was taken as off)."""
    require_emu()
    args, env = nccl_job(tmp_path, "out", steps=1)
    env[knob] = value
    p = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert p.returncode == 2 and errors == [f"error: {knob}={value}: expected {expected}"], \
        p.stderr[-3000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("policy", ["full"])
def test_checkpointing_eval_and_sample_on_the_device_match_cpu(tmp_path, policy):
    """Recompute in backward (fp8-delayed, bf16 activations: the GPU's default), validation
    forwards and the end-of-run sample, on the emulated device and on the CPU."""
    require_emu()
    extra = ("--set", f"memory.activation_checkpointing={policy}", "--set", "train.eval_every=3",
             "--set", "data.val_fraction=0.1", "--set", "run.sample_tokens=16")
    cpu, _, _ = train(tmp_path, "cpu", MXTRAIN_BIN, "cpu", "fp8-delayed", extra=extra)
    cuda, _, _ = train(tmp_path, "cuda", EMU_BIN, "cuda", "fp8-delayed", extra=extra)
    compare(cpu, cuda, 1e-3)
    val = lambda steps: [s["val_loss"] for s in steps if s.get("val_loss")]
    assert val(cpu) and len(val(cuda)) == len(val(cpu))
    for c, g in zip(val(cpu), val(cuda)):
        assert abs(g - c) / c <= 1e-3, (val(cpu), val(cuda))


def test_resume_on_the_device_continues_exactly(tmp_path):
    """A checkpoint written from device memory resumes on the device (staged load, optimizer
    state, data position, the resident block codes remade from the loaded weights) onto the
    uninterrupted run's trajectory, bit for bit (the emulated device is deterministic), and `mxtrain generate --device cuda` decodes the same text as on
    the CPU from it."""
    require_emu()
    extra = ("--set", "checkpoint.every=2", "--set", "run.sample_tokens=0")
    full, summary, log = train(tmp_path, "full", EMU_BIN, "cuda", "bf16", extra=extra)
    # one process on the bf16 path: the blocks' codes resident, written by the device's AdamW
    assert "(bf16 block codes resident)" in log and summary["fsdp_resident_code_bytes"] > 0
    ckpt = tmp_path / "full" / "checkpoints" / "step_00000002"
    resumed, _, _ = train(tmp_path, "resumed", EMU_BIN, "cuda", "bf16", extra=extra[:2] + (
        "--set", f"checkpoint.resume={ckpt}"), steps=STEPS - 2)
    assert [(s["loss"], s["grad_norm"]) for s in resumed] == \
        [(s["loss"], s["grad_norm"]) for s in full[2:]]

    def generate(binary, device):
        p = subprocess.run([binary, "generate", "--model", str(tmp_path / "full" / "checkpoints"),
                            "--prompt", "The emulated", "--max-tokens", "30", "--seed", "5",
                            "--device", device], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert p.returncode == 0, p.stderr[-2000:]
        return p.stdout

    host = generate(MXTRAIN_BIN, "cpu")
    assert host.startswith("The emulated") and len(host) > 30
    assert generate(EMU_BIN, "cuda") == host


def test_head_chunks_grow_into_spare_device_memory(tmp_path):
    """With MXTRAIN_CUDA_HEAD_CHUNK_MB unset, a run whose GPU has memory to spare once its arenas
    are allocated takes the head's logits in larger chunks there (model/llama.h,
    spare_head_chunk_rows); the variable pins the planned chunk. The planned chunk is made 16
    rows here (a test hook: the tiny shapes' 256 rows fit any real chunk), so the run with the
    variable set takes 16 chunks, accumulating the head's weight gradient over them, and the
    other grows to one chunk of all 256 rows in the emulated device's 8 GiB. Both match the CPU."""
    require_emu()
    cpu, _, _ = train(tmp_path, "cpu", MXTRAIN_BIN, "cpu", "bf16")
    hook = {"MXTRAIN_TEST_HEAD_CHUNK_ROWS": "16"}
    grown, summary, log = train(tmp_path, "grown", EMU_BIN, "cuda", "bf16", env_extra=hook)
    # tiny: hidden 64, vocabulary 256; recipe bf16's head keeps bf16 operand copies after the
    # fp32 logits: W's, the logits gradient's and h's (2 bytes each), or the CPU's fp32 copies
    # of W and h where larger (backend.h, head_workspace_floats), each part padded to 16 bytes
    rows, C, V = 4 * 64, 64, 256
    pad = lambda b: (b + 15) // 16 * 16
    want = pad(4 * rows * V) + max(pad(2 * V * C) + pad(2 * rows * V) + pad(2 * rows * C),
                                   4 * (V * C + rows * C))
    assert summary["head_chunk_rows"] == rows and summary["head_spare_bytes"] == want, summary
    assert f"head: logits in chunks of {rows} of {rows} rows ({want / 1024:.1f} KiB of spare" in log
    compare(cpu, grown, 1e-4)
    pinned, summary, log = train(tmp_path, "pinned", EMU_BIN, "cuda", "bf16",
                                 env_extra=dict(hook, MXTRAIN_CUDA_HEAD_CHUNK_MB="16"))
    assert summary["head_chunk_rows"] == 16 and "head_spare_bytes" not in summary, summary
    assert "head: logits in chunks of 16 of 256 rows (MXTRAIN_CUDA_HEAD_CHUNK_MB)" in log
    compare(cpu, pinned, 1e-4)


def test_deterministic_run_resumes_bit_for_bit_whatever_the_free_memory(tmp_path):
    """run.deterministic = true: the head's chunks are the planned ones, not grown into the memory
    free at start-up (which a resumed run, another job on the GPU or a smaller card changes, and
    with it the order of the head's weight-gradient sums); GEMM tuning is off (a contradicting
    MXTRAIN_CUDA_GEMM_TUNE is refused). So a run resumed on a device with less memory free
    continues the uninterrupted run bit for bit. Without the setting the 8 GiB device grows the
    chunks to all 256 rows (test_head_chunks_grow_into_spare_device_memory) and a 4 GiB one
    keeps the planned 16: their weight gradients are summed over different chunks."""
    require_emu()
    hook = {"MXTRAIN_TEST_HEAD_CHUNK_ROWS": "16"}
    det = ("--set", "run.deterministic=true", "--set", "train.steps=4")
    straight, summary, log = train(tmp_path, "straight", EMU_BIN, "cuda", "bf16", extra=det,
                                   steps=4, env_extra=hook)
    assert "run.deterministic: each GEMM shape on cuBLASLt's heuristic first algorithm " \
        "(no tuning)" in log, log[-3000:]
    assert "head: logits in chunks of 16 of 256 rows (planned; run.deterministic takes no " \
        "spare memory)" in log, log[-3000:]
    assert summary["head_chunk_rows"] == 16 and "head_spare_bytes" not in summary, summary
    cpu, _, _ = train(tmp_path, "cpu", MXTRAIN_BIN, "cpu", "bf16", extra=det, steps=4)
    compare(cpu, straight, 1e-4)
    # the same run stopped after 2 steps on the 8 GiB device, resumed on a 4 GiB one
    train(tmp_path, "split", EMU_BIN, "cuda", "bf16", extra=det[:2] + ("--set", "train.steps=2"),
          steps=2, env_extra=hook)
    resumed, summary, log = train(
        tmp_path, "split", EMU_BIN, "cuda", "bf16", steps=4,
        extra=det + ("--set", "checkpoint.resume=auto"),
        env_extra=dict(hook, MXEMU_DEVICE_MB="4096"))
    assert "resumed from" in log and summary["head_chunk_rows"] == 16, log[-3000:]
    assert [(s["step"], s["loss"], s["grad_norm"]) for s in resumed[2:]] == \
        [(s["step"], s["loss"], s["grad_norm"]) for s in straight[2:]]
    # tuning asked for beside it: refused at start-up, one line, exit 2
    for tune in ("1", "all"):
        p = subprocess.run(
            [EMU_BIN, "train", "--set", "model.preset=tiny", "--set", f"data.path={corpus(tmp_path)}",
             "--set", "run.device=cuda", "--set", "run.deterministic=true",
             "--set", f"run.out_dir={tmp_path / 'tuned'}"], capture_output=True, text=True,
            timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1", MXEMU_SM="90",
                                  MXTRAIN_CUDA_GEMM_TUNE=tune))
        errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
        assert p.returncode == 2 and len(errors) == 1, p.stderr[-2000:]
        assert errors[0] == (
            "error: run.deterministic = true takes each GEMM shape's first algorithm from "
            f"cuBLASLt's heuristic, and MXTRAIN_CUDA_GEMM_TUNE={tune} picks by timing, which can "
            "differ run to run: unset it or set 0"), errors[0]


def test_device_profile_charges_no_time_between_steps(tmp_path):
    """run.profile on the device charges each op the device time since the previous op's event.
    The time between two steps (logging, the profile's read-back: outside every step's time)
    went to the next step's first op, so the ops added up to more than the profiled steps took.
    Each step now restarts the clock: the rows fit inside the steps' time, which is the sum of
    the profiled steps' step_time_s."""
    require_emu()
    steps, summary, log = train(tmp_path, "prof", EMU_BIN, "cuda", "bf16",
                                extra=("--set", "run.profile=true"))
    prof = summary["op_profile"]
    assert (prof["first_step"], prof["last_step"]) == (2, STEPS), prof
    want = sum(s["step_time_s"] for s in steps if s["step"] >= 2)
    assert abs(prof["seconds"] - want) <= 1e-9 * want, (prof["seconds"], want)
    in_ops = sum(o["seconds"] for o in prof["ops"])
    assert 0 < in_ops <= prof["seconds"], (in_ops, prof["seconds"])
    assert {"gemm_bf16", "rmsnorm_backward", "adamw"} <= {o["op"] for o in prof["ops"]}, prof


# Shapes where different phases set the device scratch arena's peak (blocks, the attention
# half, the head): the CUDA backend's own arena sizing must hold every allocation under every
# policy, evaluation included, or the run fails.
@pytest.mark.parametrize("shape,recipe,policy", [
    ({"model.hidden_size": 64, "model.intermediate_size": 256, "model.vocab_size": 256},
     "bf16", "none"),
    # x^T's FP8 codes kept by the forward: the inputs' bf16 codes in scratch during it
    ({"model.hidden_size": 64, "model.intermediate_size": 256, "model.vocab_size": 256},
     "fp8-delayed", "none"),
    ({"model.hidden_size": 96, "model.intermediate_size": 40, "model.num_attention_heads": 6,
      "model.num_key_value_heads": 2, "model.vocab_size": 256}, "fp8-delayed", "selective"),
    ({"model.hidden_size": 64, "model.intermediate_size": 128, "model.vocab_size": 2000},
     "bf16", "full"),
], ids=["wide-mlp", "wide-mlp-fp8", "narrow-mlp", "large-vocab"])
def test_device_arenas_hold_every_phase(tmp_path, shape, recipe, policy):
    require_emu()
    extra = ["--set", f"memory.activation_checkpointing={policy}", "--set", "train.eval_every=2",
             "--set", "data.val_fraction=0.1", "--set", "train.seq_len=96", "--set", "train.steps=2"]
    for k, v in shape.items():
        extra += ["--set", f"{k}={v}"]
    train(tmp_path, "arena", EMU_BIN, "cuda", recipe, extra=extra, steps=2)


def test_debug_grads_on_the_device_matches_cpu(tmp_path):
    """`debug grads --device cuda` wrote the HF weights with memcpy into device memory and read
    the gradients back the same way: a crash on any GPU (mxemu: 'host code dereferencing a
    device pointer'). Now they go through the backend's copies; the gradients match the CPU's."""
    require_emu()
    import numpy as np
    import hf_io
    import llama_ref
    from conftest import write_model
    cfg = llama_ref.make_shape(48, 96, 2, 4, 2, 256)
    d = write_model(tmp_path / "m", cfg, llama_ref.random_params(cfg, 3, std=0.3))
    tokens = tmp_path / "tok.i32"
    np.random.default_rng(1).integers(0, 256, 2 * 9, dtype=np.int32).tofile(tokens)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MXEMU_SM="90",
               MXEMU_RACECHECK="1")
    grads = {}
    for name, binary, device in (("cpu", MXTRAIN_BIN, "cpu"), ("cuda", EMU_BIN, "cuda")):
        out = tmp_path / f"{name}.safetensors"
        p = subprocess.run([binary, "debug", "grads", "--init", str(d), "--tokens", str(tokens),
                            "--batch", "2", "--seq", "8", "--out", str(out), "--device", device],
                           capture_output=True, text=True, timeout=300, env=env)
        assert p.returncode == 0, p.stderr[-2000:]
        grads[name] = hf_io.read_safetensors(str(out))
    assert grads["cuda"].keys() == grads["cpu"].keys()
    for k, c in grads["cpu"].items():
        g = grads["cuda"][k]
        assert np.abs(g - c).max() <= 1e-5 * np.abs(c).max() + 1e-8, k


def test_device_memory_shortfalls_are_errors_that_say_what_to_change(tmp_path):
    """A scratch arena too small for an op, or larger than the GPU, ended with "internal error
    (a bug in mxtrain, please report)", exit 1, naming neither MXTRAIN_CUDA_SCRATCH_MB nor the
    memory. Now exit 2 with one error line naming it. And MFU's SGEMM probe (12 MiB, taken
    after every training arena on a GPU the datasheet list lacks) failed a run that fitted;
    now it measures smaller."""
    require_emu()
    base = [EMU_BIN, "train", "--set", "model.preset=tiny", "--set", "model.num_hidden_layers=1",
            "--set", f"data.path={corpus(tmp_path)}", "--set", "train.steps=1",
            "--set", "train.seq_len=16", "--set", "train.micro_batch=2",
            "--set", "data.val_fraction=0", "--set", "run.sample_tokens=0",
            "--set", "run.device=cuda"]

    def run(name, **env):
        e = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MXEMU_SM="90", **env)
        p = subprocess.run(base + ["--set", f"run.out_dir={tmp_path / name}"],
                           capture_output=True, text=True, timeout=300, env=e)
        return p, [l for l in p.stderr.splitlines() if l.startswith("error:")]

    p, errors = run("small", MXTRAIN_CUDA_SCRATCH_MB="16")  # below the 32 MiB GEMM workspace
    assert p.returncode == 2 and len(errors) == 1, p.stderr[-2000:]
    assert "'cuda-scratch' is full" in errors[0] and "MXTRAIN_CUDA_SCRATCH_MB, now 16" in errors[0]
    p, errors = run("big", MXEMU_DEVICE_MB="256", MXTRAIN_CUDA_SCRATCH_MB="1024")
    assert p.returncode == 2 and len(errors) == 1, p.stderr[-2000:]
    assert errors[0].startswith("error: out of GPU memory: arena 'cuda-scratch' needs 1073741824")
    assert "MXTRAIN_CUDA_SCRATCH_MB, now 1024" in errors[0] and "internal" not in p.stderr
    # 40 MiB of scratch on a 46 MiB device: the training arenas fit, 12 MiB more do not
    p, errors = run("probe", MXEMU_DEVICE_MB="46", MXTRAIN_CUDA_SCRATCH_MB="40")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "MFU's SGEMM rate measured at 256^3" in p.stderr
