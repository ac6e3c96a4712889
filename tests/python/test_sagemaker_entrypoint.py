"""`mxtrain sagemaker train`, the container's entrypoint, over a temporary /opt/ml tree
(MXTRAIN_SM_ROOT): SageMaker's input files in, checkpoints / Hugging Face model / metrics /
failure reason out; stopped with SIGTERM (a spot reclaim) and started again, it resumes."""
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import MXTRAIN_BIN, english_text, hf_io, read_metrics, require_binary

# The tiny preset on short windows: a few steps take seconds on this machine.
TINY = {"model.preset": "tiny", "train.seq_len": "32", "train.micro_batch": "2",
        "train.eval_every": "0", "run.sample_tokens": "0", "train.warmup_steps": "2"}


def make_root(tmp_path, hyperparameters, channels=("train",), config_toml=None):
    """A SageMaker /opt/ml tree as the platform lays it out for a one-host job."""
    root = tmp_path / "opt_ml"
    cfg = root / "input" / "config"
    cfg.mkdir(parents=True)
    (cfg / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    (cfg / "resourceconfig.json").write_text(json.dumps(
        {"current_host": "algo-1", "current_instance_type": "ml.c5.xlarge",
         "current_group_name": "homogeneousCluster", "hosts": ["algo-1"],
         "network_interface_name": "eth0"}))
    idc = {}
    for ch in channels:
        idc[ch] = {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated",
                   "RecordWrapperType": "None"}
        (root / "input" / "data" / ch).mkdir(parents=True)
    (cfg / "inputdataconfig.json").write_text(json.dumps(idc))
    if "train" in channels:
        (root / "input" / "data" / "train" / "corpus.txt").write_text(english_text(20000))
    if config_toml is not None:
        (root / "input" / "data" / "config" / "run.toml").write_text(config_toml)
    return root


def sm_env(root):
    return dict(os.environ, MXTRAIN_SM_ROOT=str(root), OMP_NUM_THREADS="1",
                OPENBLAS_NUM_THREADS="1")


def run_entrypoint(root, timeout=300):
    require_binary()
    return subprocess.run([MXTRAIN_BIN, "sagemaker", "train"], env=sm_env(root),
                          capture_output=True, text=True, timeout=timeout)


def committed_steps(ckpt_root):
    if not ckpt_root.is_dir():
        return []
    return sorted(int(d.name[len("step_"):]) for d in ckpt_root.iterdir()
                  if d.name.startswith("step_") and (d / "manifest.json").exists())


def test_trains_checkpoints_and_exports_the_model(tmp_path):
    # The TOML file in the `config` channel sets the shape and 100 steps; the hyperparameters
    # (as SageMaker gives them: strings) override the step count.
    toml = "[model]\npreset = \"tiny\"\n[train]\nsteps = 100\nseq_len = 32\nmicro_batch = 2\n"
    hp = dict(TINY, **{"config": "config/run.toml", "train.steps": "6",
                       "checkpoint.every": "3"})
    root = make_root(tmp_path, hp, channels=("train", "config"), config_toml=toml)
    r = run_entrypoint(root)
    assert r.returncode == 0, r.stderr

    # checkpoints under <root>/checkpoints, at the steps asked for
    assert committed_steps(root / "checkpoints") == [3, 6], r.stderr
    # metrics under <root>/output/data; the data was the train channel's one file
    steps, summary = read_metrics(root / "output" / "data" / "metrics.jsonl")
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert summary["steps"] == 6
    state = json.loads((root / "checkpoints" / "step_00000006" / "state.json").read_text())
    assert state["data_path"] == str(root / "input" / "data" / "train" / "corpus.txt")

    # the Hugging Face model: the tiny shape, and the weights of the last checkpoint
    cfg, tensors = hf_io.read_hf_dir(str(root / "model"))
    assert cfg["model_type"] == "llama"
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (64, 2, 256)
    assert tensors["model.embed_tokens.weight"].shape == (256, 64)
    assert tensors["model.layers.1.mlp.down_proj.weight"].shape == (64, 160)
    saved = hf_io.read_checkpoint_weights(str(root / "checkpoints" / "step_00000006"))
    assert set(saved) == set(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(value, saved[name], err_msg=name)
    assert not (root / "output" / "failure").exists()


def test_sigterm_then_restart_resumes_from_the_checkpoints(tmp_path):
    # Long enough that the run is still going when the first checkpoint appears: each step
    # takes milliseconds, the whole run some seconds (the restart runs the rest).
    total = 300
    hp = dict(TINY, **{"train.steps": str(total), "checkpoint.every": "10",
                       "checkpoint.keep": "2"})
    root = make_root(tmp_path, hp)
    ckpts = root / "checkpoints"
    require_binary()
    p = subprocess.Popen([MXTRAIN_BIN, "sagemaker", "train"], env=sm_env(root),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not committed_steps(ckpts) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert p.poll() is None, "the run ended before its first checkpoint: " + p.stderr.read()
        assert committed_steps(ckpts), "no checkpoint within 240 s"
        p.send_signal(signal.SIGTERM)  # what SageMaker sends on a spot reclaim / StopTrainingJob
        _, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, err
    stopped_at = committed_steps(ckpts)[-1]
    assert 10 <= stopped_at < total, (stopped_at, err)
    assert f"stopped by signal 15 at step {stopped_at}" in err
    assert not (root / "model" / "model.safetensors").exists()  # no model from a stopped job
    assert not (root / "output" / "failure").exists()  # a stop is not a failure

    # The restarted job (same /opt/ml/checkpoints, as SageMaker restores them) resumes there.
    r = run_entrypoint(root)
    assert r.returncode == 0, r.stderr
    assert (f"resumed from {ckpts / f'step_{stopped_at:08d}'} at step {stopped_at}"
            in r.stderr), r.stderr
    lines = [json.loads(l) for l in
             (root / "output" / "data" / "metrics.jsonl").read_text().splitlines()]
    summaries = [i for i, o in enumerate(lines) if o.get("summary")]
    assert len(summaries) == 2, summaries
    first_run = [o["step"] for o in lines[:summaries[0]]]
    second_run = [o["step"] for o in lines[summaries[0] + 1:summaries[1]]]
    assert first_run == list(range(1, stopped_at + 1))
    assert second_run == list(range(stopped_at + 1, total + 1))
    assert lines[summaries[0]]["stopped_by_signal"] == 15
    assert lines[-1]["steps"] == total
    assert committed_steps(ckpts)[-1] == total
    cfg, tensors = hf_io.read_hf_dir(str(root / "model"))
    saved = hf_io.read_checkpoint_weights(str(ckpts / f"step_{total:08d}"))
    for name, value in tensors.items():
        np.testing.assert_array_equal(value, saved[name], err_msg=name)


@pytest.mark.parametrize("hp,needle", [
    ({"train.steps": "many"}, "train.steps"),
    ({"train.stepz": "3"}, "train.stepz"),
    ({"steps": "3"}, "'steps'"),
    ({"config": "config/missing.toml"}, "config/missing.toml"),
    ({"sagemaker.processes_per_host": "0"}, "sagemaker.processes_per_host"),
])
def test_bad_hyperparameter_writes_the_failure_reason(tmp_path, hp, needle):
    root = make_root(tmp_path, dict(TINY, **hp))
    r = run_entrypoint(root, timeout=120)
    assert r.returncode == 2, r.stderr
    err = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(err) == 1 and needle in err[0], r.stderr
    failure = (root / "output" / "failure").read_text()
    assert failure.strip() == err[0]
    assert not (root / "checkpoints").exists() or not any((root / "checkpoints").iterdir())
    assert not (root / "model" / "model.safetensors").exists()


def test_train_channel_with_several_files_needs_data_path(tmp_path):
    root = make_root(tmp_path, dict(TINY, **{"train.steps": "2"}))
    (root / "input" / "data" / "train" / "more.txt").write_text(english_text(5000))
    r = run_entrypoint(root, timeout=120)
    assert r.returncode == 2 and "holds 2 files" in r.stderr, r.stderr
    assert "data.path" in (root / "output" / "failure").read_text()
    # ...and a relative data.path names a file under input/data
    (root / "output" / "failure").unlink()
    (root / "input" / "config" / "hyperparameters.json").write_text(
        json.dumps(dict(TINY, **{"train.steps": "2", "data.path": "train/more.txt"})))
    r = run_entrypoint(root)
    assert r.returncode == 0, r.stderr
    state = json.loads((root / "checkpoints" / "step_00000002" / "state.json").read_text())
    assert state["data_path"] == str(root / "input" / "data" / "train" / "more.txt")


def test_malformed_input_config_is_bad_input(tmp_path):
    root = make_root(tmp_path, TINY)
    (root / "input" / "config" / "hyperparameters.json").write_text("{not json")
    r = run_entrypoint(root, timeout=60)
    assert r.returncode == 2 and "hyperparameters.json" in r.stderr, r.stderr
    assert "hyperparameters.json" in (root / "output" / "failure").read_text()


def test_two_processes_through_mpirun_stop_and_resume(tmp_path):
    """sagemaker.processes_per_host = 2: the entrypoint launches mpirun (2 ranks, FSDP) and
    passes SageMaker's SIGTERM on; the ranks checkpoint the same step, the job exits 143, and
    a restart resumes there on 2 ranks and exports the model."""
    # Enough steps that SIGTERM (forwarded through mpirun) lands long before the end: tiny
    # steps take milliseconds and asynchronous checkpoints no longer slow them down.
    total = 1500
    hp = dict(TINY, **{"train.steps": str(total), "checkpoint.every": "10",
                       "checkpoint.keep": "3", "sagemaker.processes_per_host": "2"})
    root = make_root(tmp_path, hp)
    ckpts = root / "checkpoints"
    require_binary()
    p = subprocess.Popen([MXTRAIN_BIN, "sagemaker", "train"], env=sm_env(root),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not committed_steps(ckpts) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert p.poll() is None, "the run ended before its first checkpoint: " + p.stderr.read()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, err
    assert "sagemaker: mpirun --host localhost:2 -np 2" in err
    stopped_at = committed_steps(ckpts)[-1]
    assert 10 <= stopped_at < total, (stopped_at, err)
    state = json.loads((ckpts / f"step_{stopped_at:08d}" / "state.json").read_text())
    assert state["world_size"] == 2
    assert not (root / "model" / "model.safetensors").exists()

    r = run_entrypoint(root)
    assert r.returncode == 0, r.stderr
    assert f"at step {stopped_at}" in r.stderr and "resumed from" in r.stderr, r.stderr
    _, summary = read_metrics(root / "output" / "data" / "metrics.jsonl")
    assert summary["steps"] == total and summary["world_size"] == 2
    cfg, tensors = hf_io.read_hf_dir(str(root / "model"))
    saved = hf_io.read_checkpoint_weights(str(ckpts / f"step_{total:08d}"))
    for name, value in tensors.items():
        np.testing.assert_array_equal(value, saved[name], err_msg=name)


def test_a_worker_host_serves_ssh_instead_of_training(tmp_path):
    """Not the first of the sorted hosts: the entrypoint starts sshd for the master's mpirun
    (MXTRAIN_SSHD names it; here one that fails) and trains nothing itself."""
    root = make_root(tmp_path, dict(TINY, **{"train.steps": "2"}))
    (root / "input" / "config" / "resourceconfig.json").write_text(json.dumps(
        {"current_host": "algo-2", "hosts": ["algo-2", "algo-1"],
         "network_interface_name": "eth0"}))
    require_binary()
    r = subprocess.run([MXTRAIN_BIN, "sagemaker", "train"], capture_output=True, text=True,
                       env=dict(sm_env(root), MXTRAIN_SSHD="/bin/false"), timeout=60)
    assert r.returncode == 2, r.stderr
    assert "waits for the master algo-1" in r.stderr
    assert "/bin/false" in (root / "output" / "failure").read_text()
    assert not (root / "checkpoints").exists() and not (root / "output" / "data").exists()
