"""Running mxtrain_emu (tests/cuda_emu) against mxtrain on the CPU for the CUDA trainer's tests
(test_cuda_emu.py, test_cuda_emu_fusions.py, test_cuda_emu_combos.py): the tiny preset a few steps, the metrics read
back, every emulated run under the race check (MXEMU_RACECHECK=1) unless the test says the same
run is race-checked elsewhere (racecheck=False: the A/B tests' runs of a configuration that
test_cuda_emu.py::test_cuda_trainer_matches_cpu runs with the same flags; the race check
neither changes a run's bits nor finds anything new in the same launches, and takes about half
of such a run's time)."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import MXTRAIN_BIN, require_binary

EMU_BIN = str(Path(MXTRAIN_BIN).parent / "mxtrain_emu")
MPIRUN_FLAGS = os.environ.get("MXTRAIN_MPIRUN_FLAGS", "--oversubscribe --bind-to none").split()
STEPS = 3


def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    if not path.exists():
        path.write_text(("The emulated device trains the same model as the host, step by step, "
                         "and the two logs are compared line by line. ") * 60)
    return path


def train(tmp_path, name, binary, device, recipe, sm="90", np_=1, extra=(), steps=STEPS,
          streams="compute-late", env_extra=None, racecheck=True):
    out = tmp_path / name
    args = [binary, "train", "--set", "model.preset=tiny", "--set", f"data.path={corpus(tmp_path)}",
            "--set", f"train.steps={STEPS}", "--set", "train.seq_len=64",
            "--set", f"train.micro_batch={4 // np_}", "--set", "train.warmup_steps=2",
            "--set", "train.lr=3e-3", "--set", "train.seed=1", "--set", "train.grad_clip=1.0",
            "--set", "train.eval_every=0", "--set", "train.log_every=1",
            "--set", "data.val_fraction=0.0", "--set", "run.sample_tokens=0",
            "--set", "checkpoint.resume=none", "--set", f"run.device={device}",
            "--set", f"precision.recipe={recipe}", "--set", f"run.out_dir={out}"] + list(extra)
    if recipe != "fp32":  # the GPU's default under a recipe, set on the CPU twin too
        args += ["--set", "precision.activations=bf16"]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MXEMU_SM=sm,
               MXEMU_STREAMS=streams, MXEMU_RACECHECK="1" if racecheck else "0",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **(env_extra or {}))
    cmd = (["mpirun", "-np", str(np_)] + MPIRUN_FLAGS + args) if np_ > 1 else args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, f"{cmd}\n{p.stderr[-3000:]}"
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    summary = [r for r in records if r.get("summary")][-1]
    records_steps = steps
    steps = [r for r in records if not r.get("summary")]
    assert len(steps) == records_steps
    return steps, summary, p.stderr


def require_emu():
    require_binary()
    if not (os.path.isfile(EMU_BIN) and os.access(EMU_BIN, os.X_OK)):
        pytest.fail(f"{EMU_BIN} not built (CMake builds it with the tests; it needs python3)")


def compare(cpu, cuda, tol):
    for c, g in zip(cpu, cuda):
        rel = abs(g["loss"] - c["loss"]) / abs(c["loss"])
        assert rel <= tol, f"step {c['step']}: loss cpu {c['loss']} cuda {g['loss']} (rel {rel:.2e})"
        rel_norm = abs(g["grad_norm"] - c["grad_norm"]) / abs(c["grad_norm"])
        assert rel_norm <= 20 * tol, (f"step {c['step']}: grad norm cpu {c['grad_norm']} "
                                      f"cuda {g['grad_norm']} (rel {rel_norm:.2e})")


# fp8-block's GEMM takes Linears whose dimensions are multiples of 128 (else the recipe runs
# emulated there, also on a GPU): a model that wide, 256 tokens a micro-batch.
WIDE = ("--set", "model.hidden_size=128", "--set", "model.intermediate_size=256")
FP8 = "on the backend's FP8 GEMMs"
