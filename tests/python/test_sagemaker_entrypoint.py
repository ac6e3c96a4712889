"""`mxtrain sagemaker train`, the container's entrypoint, over a temporary /opt/ml tree
(MXTRAIN_SM_ROOT): SageMaker's input files in, checkpoints / Hugging Face model / metrics /
failure reason out; stopped with SIGTERM (a spot reclaim) and started again, it resumes."""
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

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
    # found by a hunt: "\u0000" cut paths (checkpoint.dir was probed as "ck", the first save
    # failed after the training) and messages; hex was read as a number; a 100 kB value made
    # a 100 kB failure file (SageMaker keeps about 1 KiB of it)
    ({"checkpoint.dir": "ck\u0000/x"}, "NUL character"),
    ({"train.steps": "3\u0000junk"}, "NUL character"),
    ({"train.steps": "0x10"}, "train.steps=0x10: expected an integer"),
    ({"train.steps": "x" * 100000}, "... (100000 bytes)"),
    # decimal digits only, as a --set integer (" 2" and "+2" were taken, "2 " refused)
    ({"sagemaker.processes_per_host": "+2"}, "sagemaker.processes_per_host"),
    ({"sagemaker.processes_per_host": " 2"}, "sagemaker.processes_per_host"),
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


def test_a_tuning_job_s_objective_metric_is_ignored(tmp_path):
    """SageMaker's hyperparameter tuning adds `_tuning_objective_metric` to every training job
    it starts; refused as "not section.key", it failed every tuning job at once."""
    root = make_root(tmp_path, dict(TINY, **{"train.steps": "1",
                                             "_tuning_objective_metric": "train:loss"}))
    r = run_entrypoint(root, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "ignoring hyperparameter _tuning_objective_metric" in r.stderr, r.stderr


def test_checkpoints_in_the_model_directory_are_refused_before_training(tmp_path):
    """checkpoint.dir = the model directory trained the whole run, then the export refused the
    directory (a checkpoint root); a restarted job failed the same way each time."""
    for i, where in enumerate(("model", "model/ck")):
        root = make_root(tmp_path / str(i), dict(TINY, **{"train.steps": "2"}))
        hp = json.loads((root / "input" / "config" / "hyperparameters.json").read_text())
        hp["checkpoint.dir"] = str(root / where)
        (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(hp))
        r = run_entrypoint(root, timeout=120)
        assert r.returncode == 2, r.stderr
        err = [l for l in r.stderr.splitlines() if l.startswith("error:")]
        assert len(err) == 1 and "the model directory" in err[0], r.stderr
        assert not (root / "output" / "data" / "metrics.jsonl").exists()
        assert (root / "output" / "failure").read_text().strip() == err[0]


@pytest.mark.parametrize("key,value", [("checkpoint.dir", "rel/x"), ("run.out_dir", "rel/x"),
                                       ("run.metrics", "rel/x"), ("run.out_dir", "")])
def test_relative_output_paths_are_refused_before_training(tmp_path, key, value):
    """A relative checkpoint.dir (run.out_dir, run.metrics) was written under the container's
    working directory (/opt/mxtrain), which the job does not keep: a restarted job had nothing
    to resume. An empty run.out_dir is runs/<name>, relative too. Refused by the job and by
    `sagemaker check`, with or without a config file."""
    root = make_root(tmp_path, dict(TINY, **{"train.steps": "2", key: value}))
    work = tmp_path / "work"
    work.mkdir()
    require_binary()
    r = subprocess.run([MXTRAIN_BIN, "sagemaker", "train"], env=sm_env(root), cwd=work,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    err = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(err) == 1 and key in err[0] and "relative" in err[0], r.stderr
    assert (root / "output" / "failure").read_text().strip() == err[0]
    assert list(work.iterdir()) == [] and not (root / "checkpoints").exists()
    for extra in ({}, {"config": "train/c.toml"}):
        hp = tmp_path / "hp.json"
        hp.write_text(json.dumps(dict(extra, **{key: value})))
        c = subprocess.run([MXTRAIN_BIN, "sagemaker", "check", "--hyperparameters", hp],
                           capture_output=True, text=True, timeout=60)
        assert c.returncode == 2 and key in c.stderr, (extra, c.stderr)
        hp.write_text(json.dumps(dict(extra, **{key: "/opt/ml/x"})))  # the control
        c = subprocess.run([MXTRAIN_BIN, "sagemaker", "check", "--hyperparameters", hp],
                           capture_output=True, text=True, timeout=60)
        assert c.returncode == 0, (extra, c.stderr)


def test_a_relative_resume_path_is_in_a_channel(tmp_path):
    """checkpoint.resume naming a step by a relative path is read under input/data, as
    init.from and data.path are (it was read from the container's working directory)."""
    first = make_root(tmp_path / "a", dict(TINY, **{"train.steps": "2", "checkpoint.every": "1"}))
    r = run_entrypoint(first, timeout=120)
    assert r.returncode == 0, r.stderr
    root = make_root(tmp_path / "b", dict(TINY, **{"train.steps": "3",
                                                   "checkpoint.resume": "ck/step_00000002"}),
                     channels=("train", "ck"))
    shutil.copytree(first / "checkpoints" / "step_00000002",
                    root / "input" / "data" / "ck" / "step_00000002")
    r = run_entrypoint(root, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"resumed from {root / 'input' / 'data' / 'ck' / 'step_00000002'}" in r.stderr, r.stderr
    steps, _ = read_metrics(root / "output" / "data" / "metrics.jsonl")
    assert [s["step"] for s in steps] == [3]
    # The job restarted (a spot reclaim) with the same hyperparameters and 2 more steps: it goes
    # on from its own step 3, not back to the channel's step 2 (that roll-back was refused at
    # every restart: "newer than the step this run resumes from").
    hp = json.loads((root / "input" / "config" / "hyperparameters.json").read_text())
    hp["train.steps"] = "5"
    (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(hp))
    r = run_entrypoint(root, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"resumed from {root / 'checkpoints' / 'step_00000003'}" in r.stderr, r.stderr
    assert "holds this job's checkpoints" in r.stderr, r.stderr
    steps, _ = read_metrics(root / "output" / "data" / "metrics.jsonl")
    assert [s["step"] for s in steps] == [3, 4, 5]

    # Only a newer own step takes over: own checkpoints older than the named step (an earlier
    # job's step 1 in the same location) leave the named step 2 in charge ...
    older = make_root(tmp_path / "c", dict(TINY, **{"train.steps": "3",
                                                    "checkpoint.resume": "ck/step_00000002"}),
                      channels=("train", "ck"))
    shutil.copytree(first / "checkpoints" / "step_00000002",
                    older / "input" / "data" / "ck" / "step_00000002")
    shutil.copytree(first / "checkpoints" / "step_00000001",
                    older / "checkpoints" / "step_00000001")
    r = run_entrypoint(older, timeout=120)
    assert r.returncode == 0 and "holds this job's checkpoints" not in r.stderr, r.stderr
    assert f"resumed from {older / 'input' / 'data' / 'ck' / 'step_00000002'}" in r.stderr
    # ... and a step of the job's own location named on purpose (a roll-back past newer own
    # steps) is the trainer's to refuse, as outside SageMaker
    back = make_root(tmp_path / "d", dict(TINY, **{"train.steps": "3"}))
    for n in (1, 2):
        shutil.copytree(first / "checkpoints" / f"step_{n:08d}",
                        back / "checkpoints" / f"step_{n:08d}")
    hp = json.loads((back / "input" / "config" / "hyperparameters.json").read_text())
    hp["checkpoint.resume"] = str(back / "checkpoints" / "step_00000001")
    (back / "input" / "config" / "hyperparameters.json").write_text(json.dumps(hp))
    r = run_entrypoint(back, timeout=120)
    assert r.returncode == 2 and "newer than the step this run resumes from" in r.stderr, r.stderr


def test_a_stop_during_the_final_export_still_exports(tmp_path):
    """The stop handlers stay installed after the training, and the export's checkpoint load
    took a SIGTERM for a start-up stop: 'internal error', exit 1, no model, where a job that
    finished before the stop keeps its model (docs/sagemaker.md). The export now runs to its
    end. MXTRAIN_TEST_SLOW_LOAD_MS / _PROGRESS_S slow the load and show it, so the signal lands
    in it."""
    root = make_root(tmp_path, dict(TINY, **{"train.steps": "2"}))
    require_binary()
    p = subprocess.Popen([MXTRAIN_BIN, "sagemaker", "train"],
                         env=dict(sm_env(root), MXTRAIN_TEST_SLOW_LOAD_MS="200",
                                  MXTRAIN_TEST_PROGRESS_S="0"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err, sent = "", False
    try:
        for line in p.stderr:
            err += line
            if "checkpoint: loading" in line and not sent:
                p.send_signal(signal.SIGTERM)
                sent = True
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert sent, err[-3000:]
    assert p.returncode == 0, err[-3000:]
    assert (root / "model" / "model.safetensors").exists(), err[-3000:]
    assert not (root / "output" / "failure").exists()


def test_the_check_reads_fixed_set_values_as_the_job_does(tmp_path):
    """With a config file named, `sagemaker check` compared the raw text of a fixed-set value:
    "'tiny'" (quoted, which the job reads as tiny) was refused as an unknown preset."""
    require_binary()
    for value, rc in (("'tiny'", 0), ('"tiny"', 0), ("huge", 2)):
        hp = tmp_path / "hp.json"
        hp.write_text(json.dumps({"config": "train/c.toml", "model.preset": value}))
        r = subprocess.run([MXTRAIN_BIN, "sagemaker", "check", "--hyperparameters", hp],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == rc, (value, r.stderr)


def test_a_worker_host_refuses_a_bad_config_at_once(tmp_path):
    """A worker host waited up to 30 minutes for the MPI job of a master that had refused the
    config, and wrote no failure file: it reads the same hyperparameters and refuses them too."""
    root = make_root(tmp_path, dict(TINY, **{"train.stepz": "4"}))
    (root / "input" / "config" / "resourceconfig.json").write_text(json.dumps(
        {"current_host": "algo-2", "hosts": ["algo-1", "algo-2"], "network_interface_name": "eth0"}))
    require_binary()
    r = subprocess.run([MXTRAIN_BIN, "sagemaker", "train"], capture_output=True, text=True,
                       env=dict(sm_env(root), MXTRAIN_SSHD="none"), timeout=60)
    assert r.returncode == 2, r.stderr
    err = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(err) == 1 and "train.stepz" in err[0], r.stderr
    assert (root / "output" / "failure").read_text().strip() == err[0]
    assert "waits for the master" not in r.stderr


def test_channels_with_several_files_are_shards_and_validation_is_its_own(tmp_path):
    """A train channel with several files was an error asking for data.path: now its files are
    the data, as shards in sorted order (the same run as their concatenation in one file), and
    a `validation` channel is data.val_path."""
    root = make_root(tmp_path, dict(TINY, **{"train.steps": "2", "train.eval_every": "1"}),
                     channels=("train", "validation"))
    train = root / "input" / "data" / "train"
    (train / "corpus.txt").unlink()
    text = english_text(20000)
    (train / "part_1.txt").write_text(text[:12000])
    (train / "part_2.txt").write_text(text[12000:])
    (root / "input" / "data" / "validation" / "val.txt").write_text(english_text(3000)[::-1])
    r = run_entrypoint(root)
    assert r.returncode == 0, r.stderr
    state = json.loads((root / "checkpoints" / "step_00000002" / "state.json").read_text())
    assert state["data_path"] == str(train)
    start = [l for l in r.stderr.splitlines() if l.startswith("mxtrain: ")][0]
    assert "in 2 files" in start and "val " + str(root / "input/data/validation/val.txt") in start
    steps, _ = read_metrics(root / "output" / "data" / "metrics.jsonl")
    # the reference: the same settings on one file holding both parts, validation on val.txt
    one = tmp_path / "one.txt"
    one.write_text(text)
    ref = subprocess.run([MXTRAIN_BIN, "train", "--set", "model.preset=tiny", "--set",
                          f"data.path={one}", "--set", f"data.val_path={root}/input/data/validation/val.txt",
                          "--set", f"run.out_dir={tmp_path / 'ref'}"] +
                         [a for k, v in dict(TINY, **{"train.steps": "2", "train.eval_every": "1"}).items()
                          if "." in k for a in ("--set", f"{k}={v}")],
                         capture_output=True, text=True, env=sm_env(root), timeout=300)
    assert ref.returncode == 0, ref.stderr
    ref_steps, _ = read_metrics(tmp_path / "ref" / "metrics.jsonl")
    assert [(s["loss"], s["val_loss"]) for s in steps] == \
        [(s["loss"], s["val_loss"]) for s in ref_steps]
    # ...and a relative data.path names a file under input/data
    (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(dict(
        TINY, **{"train.steps": "2", "data.path": "train/part_2.txt",
                 "checkpoint.resume": "none"})))
    r = run_entrypoint(root)
    assert r.returncode == 0, r.stderr
    state = json.loads((root / "checkpoints" / "step_00000002" / "state.json").read_text())
    assert state["data_path"] == str(train / "part_2.txt")


def test_a_sharded_training_channel_is_refused(tmp_path):
    """ShardedByS3Key gives each host other files, while every rank reads the same data and
    takes its own windows: it failed only once mpirun ran, naming the config or the data."""
    root = make_root(tmp_path, TINY)
    idc = root / "input" / "config" / "inputdataconfig.json"
    cfg = json.loads(idc.read_text())
    cfg["train"]["S3DistributionType"] = "ShardedByS3Key"
    idc.write_text(json.dumps(cfg))
    r = run_entrypoint(root, timeout=60)
    err = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert r.returncode == 2 and len(err) == 1 and "ShardedByS3Key" in err[0], r.stderr
    assert (root / "output" / "failure").read_text().strip() == err[0]


def test_a_missing_mpirun_is_said_once(tmp_path):
    """mpirun not on PATH: exit 127 with "cannot start mpirun" on stderr and "mpirun exited
    with code 127" in the failure file. Now one error, exit 2, the same in both."""
    root = make_root(tmp_path, dict(TINY, **{"sagemaker.processes_per_host": "2"}))
    require_binary()
    r = subprocess.run([MXTRAIN_BIN, "sagemaker", "train"],
                       env=dict(sm_env(root), PATH=str(tmp_path / "empty")),
                       capture_output=True, text=True, timeout=60)
    err = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert r.returncode == 2 and len(err) == 1 and "cannot start mpirun" in err[0], r.stderr
    assert (root / "output" / "failure").read_text().strip() == err[0]


def test_malformed_input_config_is_bad_input(tmp_path):
    root = make_root(tmp_path, TINY)
    (root / "input" / "config" / "hyperparameters.json").write_text("{not json")
    r = run_entrypoint(root, timeout=60)
    assert r.returncode == 2 and "hyperparameters.json" in r.stderr, r.stderr
    assert "hyperparameters.json" in (root / "output" / "failure").read_text()



def set_hyperparameters(root, hp):
    (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(hp))


def assert_model_is_step(root, step):
    cfg, tensors = hf_io.read_hf_dir(str(root / "model"))
    saved = hf_io.read_checkpoint_weights(str(root / "checkpoints" / f"step_{step:08d}"))
    assert set(saved) == set(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(value, saved[name], err_msg=name)
    return cfg


def test_the_model_is_this_runs_final_checkpoint(tmp_path):
    """model/ is this job's model: the step it ended at (train.steps), not the folder's newest
    step. A resubmission with resume = none and another shape exported the older job's step 6
    (exit 0); a resume that skipped a corrupt step 6 trained to 5 and then failed exporting the
    corrupt step (exit 2, failure file)."""
    root = make_root(tmp_path, dict(TINY, **{"train.steps": "6", "checkpoint.every": "3"}))
    r = run_entrypoint(root)
    assert r.returncode == 0, r.stderr
    assert committed_steps(root / "checkpoints") == [3, 6]

    # another shape, from scratch, into the same checkpoint folder
    set_hyperparameters(root, dict(TINY, **{"train.steps": "4", "checkpoint.resume": "none",
                                            "model.hidden_size": "32",
                                            "model.num_attention_heads": "2",
                                            "model.num_key_value_heads": "1"}))
    r = run_entrypoint(root)
    assert r.returncode == 0, r.stderr
    cfg = assert_model_is_step(root, 4)
    assert cfg["hidden_size"] == 32

    # step 6 corrupt: resume skips it (from step 3), trains to 5, exports step 5
    shutil.rmtree(root / "checkpoints" / "step_00000004")
    rank = next((root / "checkpoints" / "step_00000006").glob("rank_*"))
    data = bytearray(rank.read_bytes())
    data[-3] ^= 0xFF
    rank.write_bytes(bytes(data))
    set_hyperparameters(root, dict(TINY, **{"train.steps": "5"}))
    r = run_entrypoint(root)
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stderr and "step_00000003" in r.stderr, r.stderr
    assert_model_is_step(root, 5)
    assert not (root / "output" / "failure").exists()


def test_a_config_files_metrics_path_does_not_apply(tmp_path):
    """A TOML file's paths are not the job's (docs/sagemaker.md): run.metrics from it took the
    metrics out of output/data, which SageMaker uploads."""
    elsewhere = tmp_path / "elsewhere" / "m.jsonl"
    toml = f'[run]\nmetrics = "{elsewhere}"\n'
    root = make_root(tmp_path, dict(TINY, **{"config": "config/run.toml", "train.steps": "2"}),
                     channels=("train", "config"), config_toml=toml)
    r = run_entrypoint(root)
    assert r.returncode == 0, r.stderr
    steps, _ = read_metrics(root / "output" / "data" / "metrics.jsonl")
    assert [s["step"] for s in steps] == [1, 2]
    assert not elsewhere.exists()


def test_the_failure_file_is_one_line_and_only_this_runs(tmp_path):
    """A value holding a newline made a two-line error (stderr and the failure file SageMaker
    shows); a failure file from an earlier run in the same root stayed after a success."""
    root = make_root(tmp_path, dict(TINY, **{"train.steps": "3\n4"}))
    r = run_entrypoint(root, timeout=60)
    assert r.returncode == 2, r.stderr
    failure = (root / "output" / "failure").read_text()
    assert failure.count("\n") == 1 and failure.startswith("error:"), failure
    assert "3\\n4" in failure, failure
    set_hyperparameters(root, dict(TINY, **{"train.steps": "2"}))
    r = run_entrypoint(root)
    assert r.returncode == 0, r.stderr
    assert not (root / "output" / "failure").exists()

def test_two_processes_through_mpirun_stop_and_resume(tmp_path):
    """sagemaker.processes_per_host = 2: the entrypoint launches mpirun (2 ranks, FSDP) and
    passes SageMaker's SIGTERM on; the ranks checkpoint the same step, the job exits 143, and
    a restart resumes there on 2 ranks and exports the model."""
    # Enough steps that SIGTERM (forwarded through mpirun) lands long before the end: tiny
    # steps take milliseconds and asynchronous checkpoints no longer slow them down. 400 was
    # not enough on an idle machine: the run reached its last step before the signal did.
    total = 1500
    hp = dict(TINY, **{"train.steps": str(total), "checkpoint.every": "25",
                       "checkpoint.keep": "3", "sagemaker.processes_per_host": "2"})
    root = make_root(tmp_path, hp)
    ckpts = root / "checkpoints"
    require_binary()
    # Each rank's stop checkpoint takes 3 s more, as a large model's would: the ranks must be
    # given that time (a SIGTERM passed to mpirun as it is kills them one second later).
    p = subprocess.Popen([MXTRAIN_BIN, "sagemaker", "train"],
                         env=dict(sm_env(root), MXTRAIN_TEST_SLOW_STOP_MS="3000"),
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
    assert 25 <= stopped_at < total, (stopped_at, err)
    # the checkpoint is the one both ranks wrote at the step where they stopped
    assert f"stopped by signal 15 at step {stopped_at}; checkpoint " in err, err[-4000:]
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


def test_a_hung_rank_ends_the_job_and_names_the_hang(tmp_path):
    """train.hang_timeout_s under the entrypoint's mpirun: rank 1 stopped (SIGSTOP, a peer that
    hangs without dying) leaves rank 0 waiting in a collective until its watchdog ends the job:
    exit 4, and the failure file (SageMaker's FailureReason) holds rank 0's line, not only
    `mpirun exited with code 4`."""
    # (no checkpoints: training is seen going by its metrics)
    hp = dict(TINY, **{"train.steps": "1000000", "checkpoint.every": "0",
                       "train.hang_timeout_s": "4", "sagemaker.processes_per_host": "2"})
    root = make_root(tmp_path, hp)
    require_binary()
    p = subprocess.Popen([MXTRAIN_BIN, "sagemaker", "train"], env=sm_env(root),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def rank1():
        for d in os.listdir("/proc"):
            try:
                env = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
            except (OSError, ValueError):
                continue
            if (b"OMPI_COMM_WORLD_RANK=1" in env and
                    f"MXTRAIN_SM_ROOT={root}".encode() in env):
                return int(d)
        return None

    try:
        deadline = time.monotonic() + 240
        metrics = root / "output" / "data" / "metrics.jsonl"
        while ((not metrics.exists() or metrics.read_text().count('"step"') < 3) and
               p.poll() is None and time.monotonic() < deadline):
            time.sleep(0.02)
        assert p.poll() is None, "the run ended early: " + p.stderr.read()
        pid = rank1()
        assert pid, "no rank 1 found"
        os.kill(pid, signal.SIGSTOP)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 4, err[-3000:]
    failure = (root / "output" / "failure").read_text()
    assert failure.startswith("error: rank 0: no progress for "), failure
    assert "train.hang_timeout_s" in failure and failure.count("\n") == 1, failure


def test_a_stop_at_the_start_of_a_two_process_job_is_not_lost(tmp_path):
    """A SIGTERM once mpirun is up but before its ranks run: the one SIGUSR1 relayed reached no
    rank, and the job trained to its end (then exited 143, without its model). The stop is now
    relayed again (after 1 s, 2 s, ...) and ranks take it from their first instructions: they
    stop at a step boundary with a checkpoint. mpirun is "up" once it catches SIGUSR1 (its
    /proc status), so the signal neither kills it nor reaches a rank."""
    total = 3000
    hp = dict(TINY, **{"train.steps": str(total), "checkpoint.every": "50",
                       "sagemaker.processes_per_host": "2"})
    root = make_root(tmp_path, hp)
    require_binary()
    p = subprocess.Popen([MXTRAIN_BIN, "sagemaker", "train"], env=sm_env(root),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def mpirun_catches_usr1():
        for d in os.listdir("/proc"):
            try:
                stat = open(f"/proc/{d}/stat").read()
                if stat[stat.rfind(")") + 2:].split()[1] != str(p.pid):
                    continue
                caught = next(l for l in open(f"/proc/{d}/status") if l.startswith("SigCgt:"))
            except (OSError, ValueError, StopIteration):
                continue
            return bool(int(caught.split()[1], 16) & (1 << (signal.SIGUSR1 - 1)))
        return False
    try:
        deadline = time.monotonic() + 60
        while not mpirun_catches_usr1() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, err[-3000:]
    # at a step boundary, before the first step, or during start-up: taken, whichever it was
    assert "stopped by signal 15 " in err, err[-3000:]
    assert not (root / "checkpoints" / f"step_{total:08d}").exists(), err[-3000:]
    assert not (root / "model" / "model.safetensors").exists()


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


@pytest.mark.parametrize("role", ["master", "worker"])
def test_a_waiting_host_ends_at_sigterm(tmp_path, role):
    """A master waiting for its workers' ssh, or a worker waiting for the MPI job (sshd not
    started here: MXTRAIN_SSHD=none), has no step boundary to stop at: SIGTERM ends it at once.
    A change that installed the trainer's stop handler in every SageMaker process left both
    running until SageMaker's SIGKILL."""
    root = make_root(tmp_path, dict(TINY, **{"train.steps": "2"}))
    (root / "input" / "config" / "resourceconfig.json").write_text(json.dumps(
        {"current_host": "algo-1" if role == "master" else "algo-2",
         "hosts": ["algo-1", "algo-2"], "network_interface_name": "eth0"}))
    require_binary()
    p = subprocess.Popen([MXTRAIN_BIN, "sagemaker", "train"],
                         env=dict(sm_env(root), MXTRAIN_SSHD="none"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2)
        assert p.poll() is None, p.communicate()[1]
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode in (-signal.SIGTERM, 143), (p.returncode, err)


def test_a_worker_whose_rank_failed_exits_2_with_its_line(tmp_path):
    """A worker host ended 0 when a rank on it failed, so the job's FailureReason was only the
    master's "mpirun exited with code 2". The MPI daemon is played by a copy of `sleep` named
    orted (the worker watches for that process name); the failing rank by the line it would
    leave in the failure file."""
    import shutil
    root = make_root(tmp_path, dict(TINY, **{"train.steps": "2"}))
    (root / "input" / "config" / "resourceconfig.json").write_text(json.dumps(
        {"current_host": "algo-2", "hosts": ["algo-1", "algo-2"], "network_interface_name": "eth0"}))
    orted = tmp_path / "orted"
    shutil.copy("/bin/sleep", orted)
    require_binary()
    w = subprocess.Popen([MXTRAIN_BIN, "sagemaker", "train"], env=dict(sm_env(root), MXTRAIN_SSHD="none"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    daemon = None
    try:
        time.sleep(1.5)  # the worker has cleared output/failure and waits for the daemon
        daemon = subprocess.Popen([str(orted), "60"])
        time.sleep(3)  # seen running
        (root / "output").mkdir(exist_ok=True)
        (root / "output" / "failure").write_text("error: rank 1: data.path is missing\n")
        daemon.kill()
        daemon.wait()
        _, err = w.communicate(timeout=30)
    finally:
        for p in (w, daemon):
            if p is not None and p.poll() is None:
                p.kill()
    assert "the MPI job runs on algo-2" in err, err
    assert w.returncode == 2, err
    assert "a rank on algo-2 failed: error: rank 1: data.path is missing" in err, err


def test_the_failure_file_is_cut_on_a_character_boundary(tmp_path):
    """A bad value of 3000 two-byte characters: the failure file (what SageMaker shows) is at
    most 1000 bytes, valid UTF-8, and says how long the message was; stderr's line at most
    4000 bytes and some."""
    root = make_root(tmp_path, dict(TINY, **{"model.preset": "\u00e9" * 3000}))
    r = run_entrypoint(root, timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    raw = (root / "output" / "failure").read_bytes()
    assert len(raw) <= 1000 and raw.endswith(b"bytes)\n"), raw[-100:]
    raw.decode("utf-8")  # raises if a character was cut
    err = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(err) == 1 and len(err[0].encode()) <= len("error: ") + 4000, len(err[0])


# --- two hosts on this one machine -------------------------------------------------------------
# SageMaker gives every host its own /opt/ml and the names algo-1, algo-2. Here: two trees under
# tmp_path, each seen at one path (tmp_path/opt_ml, as every real host sees its own at /opt/ml:
# the ranks compare their config sources, platform paths included) through a bind mount in a
# mount namespace of the host's processes (`unshare --mount`); the names in a private /etc/hosts
# (bind-mounted in the master's namespace) on two loopback addresses, a fake `ssh`
# (OMPI_MCA_plm_rsh_agent) that runs Open MPI's remote command here with a bare environment and
# the named host's /opt/ml, as a login on that host would, and a fake `sshd` (MXTRAIN_SSHD) that
# listens on port 22 of algo-2's address, as the master checks.

FAKE_SSH = """#!/bin/sh
# ssh [options] HOST COMMAND: what Open MPI's rsh launcher runs; here HOST is this machine
# with its own /opt/ml and its own /tmp (TMPDIR: Open MPI's session directories, which two
# real hosts never share), and only the variables mpirun passes on (-x) reach the ranks.
echo "$@" >> "{log}"
while [ $# -gt 0 ]; do case "$1" in -[bcDEeFIiJLlmOopQRSWw]) shift 2;; -*) shift;; *) break;; esac; done
host=$1; shift
exec unshare --mount sh -c 'mount --bind "$0" "$1" && shift && exec "$@"' \
  "{hosts_dir}/$host/opt_ml" "{common}" \
  env -i PATH="$PATH" HOME="$HOME" MXTRAIN_SM_ROOT="{common}" \
  TMPDIR="{hosts_dir}/$host/tmp" /bin/sh -c "$*"
"""

FAKE_SSHD = """#!{python}
# sshd as the entrypoint starts it: returns once listening on port 22 (of this host's address),
# serves until the entrypoint that started it has exited.
import os, socket
import time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
for attempt in range(100):  # the previous job's fake sshd lets go within half a second
    try:
        s.bind(("{ip}", 22))
        break
    except OSError:
        if attempt == 99:
            raise
        time.sleep(0.1)
s.listen(16)
owner = os.getppid()
if os.fork():
    os._exit(0)
os.setsid()
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
s.settimeout(0.5)
while True:
    try:
        s.accept()[0].close()
    except OSError:
        pass
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        break
"""


def _can_unshare_mounts():
    r = subprocess.run(["unshare", "--mount", "sh", "-c", "mount --bind /etc/hosts /etc/hosts"],
                       capture_output=True)
    return r.returncode == 0


def _two_host_setup(tmp_path, hp):
    import random
    import sys
    hosts_dir = tmp_path / "hosts"
    roots = {}
    for host in ("algo-1", "algo-2"):
        roots[host] = make_root(hosts_dir / host, hp)
        (hosts_dir / host / "tmp").mkdir()
        (roots[host] / "input" / "config" / "resourceconfig.json").write_text(json.dumps(
            {"current_host": host, "current_instance_type": "ml.c5.xlarge",
             "current_group_name": "homogeneousCluster", "hosts": ["algo-2", "algo-1"],
             "network_interface_name": "lo"}))
    rnd = random.Random()
    net = f"127.{rnd.randint(1, 250)}.{rnd.randint(1, 250)}"
    ips = {"algo-1": f"{net}.11", "algo-2": f"{net}.12"}  # not 127.0.0.1: not "this host"
    etc_hosts = tmp_path / "etc_hosts"
    etc_hosts.write_text(open("/etc/hosts").read() + "".join(
        f"{ip} {h}\n" for h, ip in ips.items()))
    common = tmp_path / "opt_ml"  # where each host's processes see their own tree
    common.mkdir()
    ssh = tmp_path / "fake_ssh"
    ssh.write_text(FAKE_SSH.format(log=tmp_path / "ssh.log", hosts_dir=hosts_dir, common=common))
    sshd = tmp_path / "fake_sshd"
    sshd.write_text(FAKE_SSHD.format(python=sys.executable, ip=ips["algo-2"]))
    for f in (ssh, sshd):
        f.chmod(0o755)
    return roots, etc_hosts, ssh, sshd


def _start_two_hosts(roots, etc_hosts, ssh, sshd, base_env):
    """Starts algo-2 (the worker), then algo-1 (the master, in its own mount namespace; `exec`
    makes the Popen's process mxtrain itself, so a signal reaches it as SageMaker's would)."""
    tmp = {h: str(root.parent / "tmp") for h, root in roots.items()}  # each host's own /tmp
    common = str(etc_hosts.parent / "opt_ml")
    worker = subprocess.Popen(
        ["unshare", "--mount", "sh", "-c", 'mount --bind "$0" "$1" && shift && exec "$@"',
         str(roots["algo-2"]), common, MXTRAIN_BIN, "sagemaker", "train"],
        env=dict(base_env, MXTRAIN_SM_ROOT=common, MXTRAIN_SSHD=str(sshd),
                 TMPDIR=tmp["algo-2"]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    master = subprocess.Popen(
        ["unshare", "--mount", "sh", "-c",
         'mount --bind "$0" /etc/hosts && mount --bind "$1" "$2" && shift 2 && exec "$@"',
         str(etc_hosts), str(roots["algo-1"]), common, MXTRAIN_BIN, "sagemaker", "train"],
        env=dict(base_env, MXTRAIN_SM_ROOT=common,
                 OMPI_MCA_plm_rsh_agent=str(ssh), TMPDIR=tmp["algo-1"]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return master, worker


def _kill_leftovers(tag):
    """SIGKILLs every process whose command line or environment names `tag` (this test's
    tmp_path): mpirun, the daemonized orteds (not in any process group of ours) and the ranks.
    Left running, they would hold the pipes of our Popen objects open, and reading those to
    the end would never return."""
    tag = str(tag).encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if tag in cmdline or tag in environ:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


def _finish_two_hosts(master, worker, tag):
    """(master rc, master stderr, worker rc, worker stderr); the worker must end by itself
    once the MPI daemon the master started on it is gone. A job that does not end in time
    fails the test (everything it started is killed) instead of hanging it."""
    try:
        _, merr = master.communicate(timeout=400)
        _, werr = worker.communicate(timeout=60)
    finally:
        if master.poll() is None or worker.poll() is None:
            _kill_leftovers(tag)
            for p in (master, worker):
                p.kill()
                try:
                    p.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
    # Whole logs kept beside the test's files (an assertion shows only their tails).
    n = len(list(Path(tag).glob("master_stderr_*.log")))
    Path(tag, f"master_stderr_{n}.log").write_text(merr or "")
    Path(tag, f"worker_stderr_{n}.log").write_text(werr or "")
    return master.returncode, merr, worker.returncode, werr


def _s3_steps(moto, prefix):
    keys = moto.keys(prefix + "/")
    return sorted(int(k[len(prefix) + 6:len(prefix) + 14]) for k in keys
                  if k.endswith("/manifest.json")), keys


@pytest.mark.skipif(os.environ.get("MXTRAIN_TWO_HOST_TEST") != "1", reason=(
    "MXTRAIN_TWO_HOST_TEST=1 runs it. Its second job's launch hung in 3 of about 17 runs on a "
    "loaded machine (stop 14): one of the two orteds vanished before making its Open MPI "
    "session directory, while both fake hosts shared /tmp/ompi.<host>.<uid> (two real hosts "
    "never do). Each fake host now has its own TMPDIR; 28 of 28 runs passed since, under "
    "load. Off in CI until more runs confirm that this was the cause."))
def test_two_hosts_train_checkpoint_to_s3_stop_and_resume(tmp_path):
    """hosts algo-1 and algo-2, one rank each: algo-1 runs mpirun over ssh to both, algo-2
    serves sshd and waits; FSDP over the two, checkpoints straight to S3 (moto), the model
    exported on algo-1, algo-2 done when the job is. Then a longer run of the same job is
    stopped with SIGTERM (a spot reclaim) and started again on both hosts: it resumes from S3."""
    require_binary()
    if not _can_unshare_mounts():
        pytest.skip("no mount namespaces here (unshare --mount): the private /etc/hosts that "
                    "names algo-1 / algo-2 cannot be set up")
    from test_checkpoint_s3 import Moto, s3_env
    moto = Moto()
    try:
        prefix = f"two-hosts-{os.getpid()}"
        hp = dict(TINY, **{"train.steps": "6", "checkpoint.every": "3", "checkpoint.keep": "3",
                           "checkpoint.s3_uri": f"s3://{moto.bucket}/{prefix}",
                           "sagemaker.processes_per_host": "1"})
        roots, etc_hosts, ssh, sshd = _two_host_setup(tmp_path, hp)
        env = s3_env(moto)
        rc, merr, wrc, werr = _finish_two_hosts(
            *_start_two_hosts(roots, etc_hosts, ssh, sshd, env), tmp_path)
        assert rc == 0, merr[-4000:]
        assert wrc == 0, werr
        assert "sagemaker: algo-2 waits for the master algo-1" in werr
        assert "the MPI job runs on algo-2" in werr and "has ended" in werr
        # mpirun reached both hosts through ssh (neither name is this machine's)
        calls = (tmp_path / "ssh.log").read_text().splitlines()
        hosts_reached = [next(w for w in c.split() if not w.startswith("-")) for c in calls]
        assert sorted(hosts_reached) == ["algo-1", "algo-2"], calls
        assert all(" orted " in c for c in calls), calls
        assert "--host algo-1:1,algo-2:1 -np 2" in merr
        _, summary = read_metrics(roots["algo-1"] / "output" / "data" / "metrics.jsonl")
        assert summary["steps"] == 6 and summary["world_size"] == 2
        # the rank on algo-2 read algo-2's /opt/ml (its output folder is made there)
        assert (roots["algo-2"] / "output" / "data").is_dir()
        assert not (roots["algo-2"] / "model" / "model.safetensors").exists()
        assert not (roots["algo-2"] / "output" / "failure").exists()
        steps, keys = _s3_steps(moto, prefix)
        assert steps == [3, 6], sorted(keys)
        for step in steps:
            d = f"{prefix}/step_{step:08d}/"
            assert len([k for k in keys if k.startswith(d + "rank_")]) == 2, sorted(keys)
        _same_weights(moto, keys, prefix, 6, roots["algo-1"] / "model", tmp_path / "dl6")

        # The same job again with more steps, stopped with SIGTERM once it has checkpointed:
        # the master passes it to mpirun, both ranks checkpoint the same step to S3.
        total = 400
        hp.update({"train.steps": str(total), "checkpoint.every": "25"})
        for root in roots.values():
            (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(hp))
            shutil.rmtree(root / "model", ignore_errors=True)
        master, worker = _start_two_hosts(roots, etc_hosts, ssh, sshd,
                                          dict(env, MXTRAIN_TEST_SLOW_STOP_MS="3000"))
        deadline = time.monotonic() + 240
        while (_s3_steps(moto, prefix)[0][-1] <= 6 and master.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.2)
        assert master.poll() is None, "the run ended before its first checkpoint"
        master.send_signal(signal.SIGTERM)
        rc, merr, wrc, werr = _finish_two_hosts(master, worker, tmp_path)
        assert rc == 143, merr[-4000:]
        assert wrc == 0, werr
        steps, keys = _s3_steps(moto, prefix)
        stopped_at = steps[-1]
        assert 25 <= stopped_at < total, (stopped_at, merr[-4000:])
        assert f"stopped by signal 15 at step {stopped_at}; checkpoint s3://" in merr, \
            merr[-4000:]
        assert len([k for k in keys
                    if k.startswith(f"{prefix}/step_{stopped_at:08d}/rank_")]) == 2
        assert not (roots["algo-1"] / "model" / "model.safetensors").exists()
        assert not (roots["algo-1"] / "output" / "failure").exists()

        rc, merr, wrc, werr = _finish_two_hosts(
            *_start_two_hosts(roots, etc_hosts, ssh, sshd, env), tmp_path)
        assert rc == 0, merr[-4000:]
        assert wrc == 0, werr
        assert (f"resumed from s3://{moto.bucket}/{prefix}/step_{stopped_at:08d} at step "
                f"{stopped_at}") in merr, merr[-4000:]
        lines = [json.loads(l) for l in
                 (roots["algo-1"] / "output" / "data" / "metrics.jsonl").read_text().splitlines()]
        assert [o["step"] for o in lines if not o.get("summary")] == \
            list(range(1, 7)) + list(range(7, stopped_at + 1)) + \
            list(range(stopped_at + 1, total + 1))
        steps, keys = _s3_steps(moto, prefix)
        assert steps[-1] == total
        _same_weights(moto, keys, prefix, total, roots["algo-1"] / "model",
                      tmp_path / f"dl{total}")
    finally:
        _kill_leftovers(tmp_path)
        moto.stop()


def _same_weights(moto, keys, prefix, step, model_dir, local):
    """The exported model holds the weights of checkpoint `step`, read back with boto3."""
    local.mkdir()
    d = f"{prefix}/step_{step:08d}/"
    for k in keys:
        if k.startswith(d):
            moto.call(op="download", key=k, path=str(local / k[len(d):]))
    saved = hf_io.read_checkpoint_weights(str(local))
    _, tensors = hf_io.read_hf_dir(str(model_dir))
    assert set(saved) == set(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(value, saved[name], err_msg=name)


@pytest.mark.parametrize("hp,needle", [
    ({"train.steps": "x"}, "hyperparameters train.steps=x: expected an integer"),
    ({"train.lr": "1e400"}, "hyperparameters train.lr=1e400: expected a finite number"),
    ({"model.rms_norm_eps": "1e39"}, "model.rms_norm_eps"),
])
def test_a_bad_hyperparameter_value_is_named_as_a_hyperparameter(tmp_path, hp, needle):
    """A hyperparameter's bad value was reported as `--set train.steps=x: ...`, a flag the job
    never had (the unknown-key error already said "from hyperparameters"). The entrypoint and
    `mxtrain sagemaker check` name the hyperparameter."""
    root = make_root(tmp_path, dict(TINY, **hp))
    r = run_entrypoint(root, timeout=120)
    err = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert r.returncode == 2 and len(err) == 1 and needle in err[0], r.stderr
    assert "--set" not in err[0]
    hp_file = tmp_path / "hp.json"
    hp_file.write_text(json.dumps(dict(TINY, **hp)))
    c = subprocess.run([MXTRAIN_BIN, "sagemaker", "check", "--hyperparameters", hp_file],
                       capture_output=True, text=True, timeout=60)
    err = [l for l in c.stderr.splitlines() if l.startswith("error:")]
    assert c.returncode == 2 and len(err) == 1 and needle in err[0], c.stderr
    assert "--set" not in err[0]
