"""The CUDA trainer under mxemu with its features together, as users set them, against the CPU
(test_cuda_emu.py runs each alone; these share its helpers, cuda_emu_run.py, and are a file of
their own so that the test workers split the emulated runs, --dist loadfile): FSDP over the
emulated NCCL under every low-precision recipe, gradient accumulation on the device, a
two-rank checkpoint written from device memory resumed on two ranks and on one, and
combinations of telemetry, high-precision blocks, recompute, the FP8 attention and head."""
import pytest

from conftest import MXTRAIN_BIN
from cuda_emu_run import EMU_BIN, STEPS, WIDE, compare, require_emu, train


@pytest.mark.parametrize("recipe,sm,extra", [("fp8-current", "90", ()), ("fp8-block", "100", WIDE),
                                             ("mxfp8", "100", ()), ("nvfp4", "100", ())])
def test_fsdp_under_each_low_precision_recipe_matches_cpu(tmp_path, recipe, sm, extra):
    """The other low-precision recipes over FSDP (two ranks, the NCCL communicator; fp8-delayed
    runs in test_cuda_emu.py under both stream schedules): current scaling's amaxes, fp8-block's blocks on
    the MXFP8 GEMM and mxfp8's and nvfp4's block-scaled operands (sm_100) made from the
    gathered blocks, and each weight's amax kept from its forward cast (fp8-current, nvfp4)
    for the gathered weights of each micro-batch, against the CPU's two-rank FSDP."""
    require_emu()
    cpu, _, _ = train(tmp_path, "cpu", MXTRAIN_BIN, "cpu", recipe, np_=2, extra=extra)
    cuda, summary, log = train(tmp_path, "cuda", EMU_BIN, "cuda", recipe, sm=sm, np_=2,
                               extra=extra)
    assert f"mxemu sm_{sm}" in log and "sharding full over nccl" in log, log[-2000:]
    assert summary["fp8_shared_operands"] > 0, summary  # the tensor-core Linears ran
    reuses = 7 * 2 * STEPS if recipe in ("fp8-current", "nvfp4") else 0
    assert summary["fp8_weight_amax_reuses"] == reuses, summary
    compare(cpu, cuda, 1e-3)


@pytest.mark.parametrize("recipe,sm,ranks,extra", [
    ("fp8-delayed", "90", 2, ("--set", "memory.activation_checkpointing=selective")),
    ("fp8-current", "90", 1, ()),
    ("nvfp4", "100", 2, ())])
def test_gradient_accumulation_on_the_device_matches_cpu(tmp_path, recipe, sm, ranks, extra):
    """Two micro-batches a step (train.grad_accum = 2) on the device, against the CPU with the
    same global batch: the gradients summed over micro-batches (and, with two ranks, each
    micro-batch's gathers and reduce-scatters over the NCCL communicator), fp8-delayed's
    amax histories updated a micro-batch at a time under selective recompute, and the
    weights' amax kept from the first micro-batch's forward cast until the optimizer step
    (fp8-current, nvfp4: LlamaModel::weight_amax): each weight is cast four times a step (the
    forward and the data gradient of two micro-batches); the first takes its amax, the other
    three reuse it: 3 a Linear and step (tiny: 2 blocks of 7 Linears)."""
    require_emu()
    extra = ("--set", "train.grad_accum=2") + extra
    cpu, _, _ = train(tmp_path, "cpu", MXTRAIN_BIN, "cpu", recipe, np_=ranks, extra=extra)
    cuda, summary, log = train(tmp_path, "cuda", EMU_BIN, "cuda", recipe, sm=sm, np_=ranks,
                               extra=extra)
    assert f"mxemu sm_{sm}" in log, log[-2000:]
    assert summary["fp8_shared_operands"] > 0, summary
    reuses = 3 * 7 * 2 * STEPS if recipe in ("fp8-current", "nvfp4") else 0
    assert summary["fp8_weight_amax_reuses"] == reuses, summary
    compare(cpu, cuda, 1e-3)


@pytest.mark.parametrize("recipe,sm,ranks,extra", [
    # telemetry steps with the first block in bf16, nvfp4's FP4 Linears in the others
    ("nvfp4", "100", 1, ("--set", "precision.stats_every=2",
                         "--set", "precision.high_precision_first=1")),
    # the FP8 attention and head over two ranks (their per-tensor scales of each rank's batch)
    ("fp8-delayed", "90", 2, ("--set", "precision.fp8_attention=true",
                              "--set", "precision.fp8_head=true")),
    # mxfp8 under full recompute over two ranks, with telemetry steps
    ("mxfp8", "100", 2, ("--set", "memory.activation_checkpointing=full",
                         "--set", "precision.stats_every=2")),
], ids=["nvfp4-stats-hp", "fp8attn-fp8head-2ranks", "mxfp8-full-stats-2ranks"])
def test_device_feature_combinations_match_cpu(tmp_path, recipe, sm, ranks, extra):
    """Features that each run elsewhere, together, as a user may set them: against the CPU
    step by step, and the telemetry steps' amaxes (every tensor the CPU reports, the device
    reports too) within 1e-3."""
    require_emu()
    cpu, _, _ = train(tmp_path, "cpu", MXTRAIN_BIN, "cpu", recipe, np_=ranks, extra=extra)
    cuda, summary, log = train(tmp_path, "cuda", EMU_BIN, "cuda", recipe, sm=sm, np_=ranks,
                               extra=extra)
    assert f"mxemu sm_{sm}" in log and summary["fp8_shared_operands"] > 0, summary
    compare(cpu, cuda, 1e-3)
    stats = [(c["numerics"], g.get("numerics")) for c, g in zip(cpu, cuda) if "numerics" in c]
    assert len(stats) == ("precision.stats_every=2" in extra)  # step 2 of 3
    for c, g in stats:
        assert g is not None and set(g) >= set(c), (sorted(c), g and sorted(g))
        amaxes = [(name, a) for name, a in c.items() if isinstance(a, dict) and "amax" in a]
        assert len(amaxes) >= 10, sorted(c)  # the Linears' inputs, weights, gradients
        for name, a in amaxes:
            b = g[name]["amax"]
            assert abs(b - a["amax"]) <= 1e-3 * abs(a["amax"]) + 1e-12, (name, a, g[name])


def test_fsdp_checkpoint_from_the_device_resumes_on_as_many_ranks_or_one(tmp_path):
    """Two ranks under FSDP over NCCL, fp8-delayed: each writes its shard of a checkpoint from
    device memory (weights, AdamW's moments and the delayed-scaling amax histories). Resumed
    on two ranks the run continues bit for bit (the emulated device and its NCCL are
    deterministic); resumed on one process (resharded: both shards read into one) its losses
    agree to 1e-6 and its gradient norm to 2e-5 (compare's 20 x: one rank sums the gradients
    in another order)."""
    require_emu()
    extra = ("--set", "checkpoint.every=2")
    full, _, _ = train(tmp_path, "full", EMU_BIN, "cuda", "fp8-delayed", np_=2, extra=extra)
    ckpt = tmp_path / "full" / "checkpoints" / "step_00000002"
    assert (ckpt / "rank_00001-of-00002.safetensors").is_file()
    resume = extra + ("--set", f"checkpoint.resume={ckpt}")
    two, _, _ = train(tmp_path, "two", EMU_BIN, "cuda", "fp8-delayed", np_=2, extra=resume,
                      steps=STEPS - 2)
    assert [(s["loss"], s["grad_norm"]) for s in two] == \
        [(s["loss"], s["grad_norm"]) for s in full[2:]]
    one, _, log = train(tmp_path, "one", EMU_BIN, "cuda", "fp8-delayed", extra=resume,
                        steps=STEPS - 2)
    assert "(saved by 2 processes, 2 shards)" in log, log[-2000:]
    compare(full[2:], one, 1e-6)


@pytest.mark.parametrize("sharding,ranks,streams", [("grad-op", 2, "compute-late"),
                                                    ("none", 2, "comm-late"),
                                                    ("hybrid", 4, "compute-late"),
                                                    ("hybrid", 4, "comm-late")])
def test_every_sharding_over_emulated_nccl_matches_cpu(tmp_path, sharding, ranks, streams):
    """parallel.sharding's other strategies on the device, recipe bf16 (test_cuda_emu.py runs
    `full`): grad-op (blocks gathered in forward and kept to their backward), none (DDP: the
    gradients all-reduced once a step; the blocks' bf16 codes resident) and hybrid over four
    ranks in shard groups of two (the communicator split by ncclCommSplit: reduce-scatter in
    the group, all-reduce of the shard across the groups), against the CPU's same sharding
    over MPI, under both stream schedules."""
    require_emu()
    extra = ("--set", f"parallel.sharding={sharding}")
    if sharding == "hybrid":
        extra += ("--set", "parallel.shard_group=2")
    cpu, _, _ = train(tmp_path, "cpu", MXTRAIN_BIN, "cpu", "bf16", np_=ranks, extra=extra)
    cuda, _, log = train(tmp_path, "cuda", EMU_BIN, "cuda", "bf16", np_=ranks, extra=extra,
                         streams=streams)
    assert f"sharding {sharding} over nccl" in log, log[-2000:]
    compare(cpu, cuda, 1e-4)
