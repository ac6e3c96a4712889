"""`mxtrain sweep`: a 4-point grid on the tiny preset (results files, order, predicted vs
measured memory), a point the planner says does not fit, resume, failed runs, bad input."""
import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import english_text

TOLERANCE = 0.03  # the brief's bound; on CPU with one process the planner is exact

BASE = """\
[model]
preset = "tiny"
[train]
eval_every = 0
micro_batch = 2
seq_len = 32
[data]
format = "random"
"""

GRID = ["--grid", "train.micro_batch=1,2", "--grid", "memory.activation_checkpointing=none,full"]


def sweep(mxtrain, tmp_path, extra, out="out"):
    base = tmp_path / "base.toml"
    base.write_text(BASE)
    return mxtrain(["sweep", "--config", base, "--steps", 3, "--out", tmp_path / out] + extra,
                   timeout=120)


def load(out):
    with open(out / "results.json") as f:
        res = json.load(f)
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    return res, rows


def test_sweep_grid_resume(mxtrain, tmp_path):
    r = sweep(mxtrain, tmp_path, GRID)
    assert r.rc == 0, r
    out = tmp_path / "out"
    for name in ["results.csv", "results.json", "results.md"]:
        assert (out / name).is_file(), name
    res, rows = load(out)
    assert len(res["points"]) == 4 and len(rows) == 4
    assert res["runs_executed"] == 4 and res["reused"] == 0
    assert all(p["status"] == "ok" for p in res["points"]), res
    tps = [p["tokens_per_s"] for p in res["points"]]
    assert tps == sorted(tps, reverse=True)
    assert [float(row["tokens_per_s"]) for row in rows] == sorted(
        (float(row["tokens_per_s"]) for row in rows), reverse=True)
    seen = set()
    for p in res["points"]:
        seen.add((p["overrides"]["train.micro_batch"],
                  p["overrides"]["memory.activation_checkpointing"]))
        err = abs(p["peak_mem_bytes"] - p["predicted_mem_bytes"]) / p["predicted_mem_bytes"]
        print(f"{p['id']}: measured {p['peak_mem_bytes']} predicted {p['predicted_mem_bytes']} "
              f"error {err:.2e}")
        assert err <= TOLERANCE, p
        assert p["final_loss"] > 0 and p["predicted_tokens_per_s"] > 0
    assert seen == {(b, c) for b in ("1", "2") for c in ("none", "full")}
    md = (out / "results.md").read_text()
    assert md.count("| ok |") == 4 and "predicted MiB" in md
    # Plots when matplotlib is there (Debian's python3-matplotlib); a warning otherwise.
    if os.system("/usr/bin/python3 -c 'import matplotlib' 2>/dev/null") == 0:
        assert (out / "tokens_per_s.png").stat().st_size > 1000
        assert (out / "memory.png").stat().st_size > 1000
    else:
        assert "warning:" in r.stderr

    # Resume: nothing reruns, the run directories are untouched.
    mtimes = {p["id"]: os.stat(os.path.join(p["run_dir"], "metrics.jsonl")).st_mtime_ns
              for p in res["points"]}
    r2 = sweep(mxtrain, tmp_path, GRID)
    assert r2.rc == 0, r2
    res2, rows2 = load(out)
    assert res2["runs_executed"] == 0 and res2["reused"] == 4, res2
    assert len(rows2) == 4
    for p in res2["points"]:
        assert p["reused"] and p["status"] == "ok"
        assert os.stat(os.path.join(p["run_dir"], "metrics.jsonl")).st_mtime_ns == mtimes[p["id"]]

    # A wider grid into the same directory runs only the new points.
    r3 = sweep(mxtrain, tmp_path, ["--grid", "train.micro_batch=1,2,3",
                                   "--grid", "memory.activation_checkpointing=none,full"])
    assert r3.rc == 0, r3
    res3, rows3 = load(out)
    assert res3["runs_executed"] == 2 and res3["reused"] == 4 and len(rows3) == 6, res3


def test_sweep_skips_predicted_oom_and_records_failures(mxtrain, tmp_path):
    # 64b does not fit this machine; format u16 reads a file that does not exist (the config
    # is valid, the run fails), random ignores data.path.
    r = sweep(mxtrain, tmp_path, ["--grid", "model.preset=tiny,64b",
                                  "--grid", "data.format=random,u16",
                                  "--set", "data.path=/nonexistent/tokens.u16"])
    assert r.rc == 0, r
    res, rows = load(tmp_path / "out")
    assert len(res["points"]) == 4
    by = {(p["overrides"]["model.preset"], p["overrides"]["data.format"]): p
          for p in res["points"]}
    for fmt in ("random", "u16"):
        big = by[("64b", fmt)]
        assert big["status"].startswith("skipped: predicted OOM (needs "), big
        assert " > " in big["status"] and big["tokens_per_s"] is None
        assert big["predicted_mem_bytes"] > big["capacity_bytes"]
    assert by[("tiny", "random")]["status"] == "ok", by[("tiny", "random")]
    failed = by[("tiny", "u16")]
    assert failed["status"].startswith("failed: "), failed
    assert "/nonexistent/tokens.u16" in failed["status"], failed
    assert "skipped: predicted OOM" in r.stderr
    assert res["skipped"] == 2 and res["failed"] == 1 and res["runs_executed"] == 2
    # Measured first, then failed, then skipped.
    assert [p["status"].split(":")[0] for p in res["points"]] == ["ok", "failed", "skipped",
                                                                  "skipped"]


def test_sweep_np_fits_the_processes_against_the_whole_machine(mxtrain, tmp_path):
    """`plan --gpu cpu --gpus N` gives each process its share of MemAvailable; the sweep, which
    fits N x a process's total against the machine, then divided by N twice and skipped points
    that fit. The skip rule and the recorded capacity are the machine's again."""
    r = sweep(mxtrain, tmp_path, ["--np", "2", "--grid", "model.preset=tiny,64b"])
    assert r.rc == 0, r
    res, _ = load(tmp_path / "out")
    machine = json.loads(mxtrain(["plan", "--gpu", "cpu", "--gpus", 1, "--json", "--set",
                                  "model.preset=tiny"]).stdout)["memory"]["capacity_bytes"]
    for p in res["points"]:
        assert abs(p["capacity_bytes"] - machine) < 0.1 * machine, (p, machine)
        skipped = p["status"].startswith("skipped: predicted OOM")
        assert skipped == (2 * p["predicted_mem_bytes"] > p["capacity_bytes"]), p
    assert [p["status"].split(":")[0] for p in res["points"]] == ["ok", "skipped"]


@pytest.mark.parametrize("extra,needle", [
    (["--grid", "train.micro_batch"], "--grid"),
    (["--grid", "micro_batch=1,2"], "section.key"),
    (["--grid", "train.micro_batch=1,,2"], "empty value"),
    (["--grid", "train.micro_batch=1,2", "--grid", "train.micro_batch=3"], "twice"),
    (["--grid", "train.bogus_key=1,2"], "bogus_key"),
    (["--grid", "train.micro_batch=1,x"], "micro_batch"),
    (["--grid", "train.steps=1,2"], "train.steps"),
    (["--grid", "train.micro_batch=1", "--np", "0"], "--np"),
    (["--grid", "train.micro_batch=1", "--gpu", "h100"], "--gpu"),
    (["--grid", "train.lr=1e-3", "--set", "train.lr=2e-3"], "twice"),
    # one integer, three spellings: the same point would train three times
    (["--grid", "train.micro_batch=2,02,+2"], "'2' and '02' are the same value (2)"),
    (["--grid", "train.lr=0.1,1e-1"], "'0.1' and '1e-1' are the same value"),
    (["--grid", "memory.activation_checkpointing=full", "--grid", "data.shuffle=true,1"],
     "'true' and '1' are the same value"),
    # every point checkpoints into its own run directory, never into another run's steps
    (["--grid", "train.micro_batch=1", "--set", "checkpoint.dir=/tmp/elsewhere"],
     "--set checkpoint.dir: the sweep sets this key itself"),
    (["--grid", "checkpoint.dir=/tmp/a,/tmp/b"], "--grid checkpoint.dir: the sweep sets"),
    (["--grid", "train.micro_batch=1", "--set", "checkpoint.s3_uri=s3://bucket/real-run"],
     "--set checkpoint.s3_uri: the sweep sets this key itself"),
    (["--grid", "checkpoint.s3_uri=s3://b/x,s3://b/y"], "--grid checkpoint.s3_uri"),
])
def test_sweep_bad_input(mxtrain, tmp_path, extra, needle):
    r = sweep(mxtrain, tmp_path, extra)
    assert r.rc == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), r
    assert needle in lines[0], r
    assert not (tmp_path / "out" / "runs").exists()


def _processes_mentioning(text):
    """PIDs of live processes whose command line contains text."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def _wait_for_a_trained_step(p, out, seconds):
    """Waits until the sweep's (first) run has logged a step; returns its run directory."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        logs = list(out.glob("runs/*/stderr.log"))
        if logs and "step " in logs[0].read_text():
            return logs[0].parent
        assert p.poll() is None, p.communicate()
        time.sleep(0.2)
    raise AssertionError("the run never logged a step")


def test_sigterm_reaches_the_run_in_progress(tmp_path):
    """SIGTERM to the sweep (a SageMaker stop, a `kill`) goes on to the run in progress, which
    stops at a step boundary with a checkpoint; the sweep then stops as after a Ctrl-C (exit 2,
    rerun to resume). The default action killed the sweep alone and left the run training on."""
    from conftest import MXTRAIN_BIN, require_binary
    require_binary()
    base = tmp_path / "base.toml"
    base.write_text(BASE)
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    p = subprocess.Popen([MXTRAIN_BIN, "sweep", "--config", str(base), "--steps", "1000000",
                          "--out", str(out), "--grid", "train.micro_batch=1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        run_dir = _wait_for_a_trained_step(p, out, 90)
        assert _processes_mentioning(str(run_dir)), "the run is not running"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 2 and "interrupted" in err, (p.returncode, err)
    assert not _processes_mentioning(str(run_dir)), "the run is still training"
    assert list((run_dir).glob("**/step_*/manifest.json")), "the run left no checkpoint"


def test_sweep_out_that_is_a_file_is_bad_input(mxtrain, tmp_path):
    (tmp_path / "out").write_text("keep")
    r = sweep(mxtrain, tmp_path, ["--grid", "train.micro_batch=1"])
    assert r.rc == 2 and r.stderr.strip().startswith("error:") and "not a directory" in r.stderr, r
    assert (tmp_path / "out").read_text() == "keep"


def test_widened_grid_does_not_reuse_another_values_result(mxtrain, tmp_path):
    """d/c.txt and d_c.txt clean up to the same run id: after a sweep over d_c.txt, a wider
    one handed that id (and its result) to d/c.txt, which was reported without ever training
    on its own data. Two different files, so their losses differ; each point's run must have
    read its own file (state.json's data_path)."""
    (tmp_path / "d").mkdir()
    text = english_text(60000)
    (tmp_path / "d" / "c.txt").write_text(text[:30000])
    (tmp_path / "d_c.txt").write_text(text[30000:])
    base = tmp_path / "base.toml"
    base.write_text(BASE.replace('format = "random"', 'format = "text"'))
    args = ["sweep", "--config", base, "--steps", 2, "--out", tmp_path / "out",
            "--set", "checkpoint.every=2"]
    a, b = tmp_path / "d" / "c.txt", tmp_path / "d_c.txt"  # ids: ..._d_c.txt, both
    r = mxtrain(args + ["--grid", f"data.path={b}"], timeout=120)
    assert r.rc == 0, r
    r = mxtrain(args + ["--grid", f"data.path={a},{b}"], timeout=120)
    assert r.rc == 0, r
    res, _ = load(tmp_path / "out")
    assert len(res["points"]) == 2
    for p in res["points"]:
        assert p["status"] == "ok", p
        (state,) = [json.loads(s.read_text()) for s in
                    Path(p["run_dir"]).glob("**/step_*/state.json")] or [None]
        assert state is not None and state["data_path"] == p["overrides"]["data.path"], (p, state)


def test_ctrl_c_stops_a_sweep_under_mpirun(tmp_path):
    """Ctrl-C (SIGINT to the sweep's process group) under --np 2: mpirun exits 1 when its ranks
    stop, so the sweep took the run for a failure and went on to the next point, exit 0. It
    must stop as it does with one process: exit 2, "interrupted", no later point started."""
    from conftest import MXTRAIN_BIN, require_binary
    require_binary()
    base = tmp_path / "base.toml"
    base.write_text(BASE)
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.Popen([MXTRAIN_BIN, "sweep", "--config", str(base), "--steps", "1000000",
                          "--np", "2", "--out", str(out), "--grid", "train.micro_batch=1,2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        _wait_for_a_trained_step(p, out, 120)
        os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        _, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 2 and "interrupted" in err, (p.returncode, err)
    assert len(list(out.glob("runs/*"))) == 1, "the sweep started the next point"


def _tree(d):
    """{relative path: bytes} of every file under d."""
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*")) if f.is_file()}


def test_base_config_checkpoint_dir_is_not_written(mxtrain, tmp_path):
    """A base config whose checkpoint.dir holds another run's steps: the sweep's runs (resume =
    none) wrote their own steps there, over the real run's, and checkpoint.keep would prune
    them. Each point checkpoints into its own runs/<id>/checkpoints; the directory is left as
    it was, byte for byte."""
    real = tmp_path / "real_run_checkpoints"
    for step in (1, 2):
        d = real / f"step_{step:08d}"
        d.mkdir(parents=True)
        (d / "manifest.json").write_text('{"step": %d, "the": "real run"}' % step)
    before = _tree(real)
    base = tmp_path / "base.toml"
    base.write_text(BASE + f'[checkpoint]\ndir = "{real}"\nkeep = 1\n')
    r = mxtrain(["sweep", "--config", base, "--steps", 2, "--out", tmp_path / "out",
                 "--grid", "train.micro_batch=1,2"], timeout=120)
    assert r.rc == 0, r
    assert _tree(real) == before
    res, _ = load(tmp_path / "out")
    assert [p["status"] for p in res["points"]] == ["ok", "ok"], res
    for p in res["points"]:
        steps = sorted(x.name for x in (Path(p["run_dir"]) / "checkpoints").glob("step_*"))
        assert steps == ["step_00000002"], (p, steps)


def test_long_values_get_short_unique_ids(mxtrain, tmp_path):
    """Two data.path values under a 240-byte directory name: the ids (directory names) passed
    NAME_MAX, so the second point's run directory could not be made ("File name too long",
    exit 1, no results) after the first had trained. Long ids are cut with a hash of the
    values: every point runs on its own file, and a rerun finds the same ids."""
    long_dir = tmp_path / ("d" * 240)
    long_dir.mkdir()
    text = english_text(40000)
    a, b = long_dir / "a.txt", long_dir / "b.txt"  # ids equal up to the last few bytes
    a.write_text(text[:20000])
    b.write_text(text[20000:])
    base = tmp_path / "base.toml"
    base.write_text(BASE.replace('format = "random"', 'format = "text"'))
    args = ["sweep", "--config", base, "--steps", 1, "--out", tmp_path / "out",
            "--grid", f"data.path={a},{b}"]
    r = mxtrain(args, timeout=120)
    assert r.rc == 0, r
    res, _ = load(tmp_path / "out")
    ids = [Path(p["run_dir"]).name for p in res["points"]]
    assert len(set(ids)) == 2 and all(len(i.encode()) <= 255 for i in ids), ids
    for p in res["points"]:
        assert p["status"] == "ok", p
        (state,) = [json.loads(s.read_text()) for s in
                    Path(p["run_dir"]).glob("**/step_*/state.json")] or [None]
        assert state is not None and state["data_path"] == p["overrides"]["data.path"], (p, state)
    r = mxtrain(args, timeout=120)
    assert r.rc == 0, r
    res2, _ = load(tmp_path / "out")
    assert res2["reused"] == 2 and res2["runs_executed"] == 0, res2
    assert sorted(Path(p["run_dir"]).name for p in res2["points"]) == sorted(ids)


def test_out_longer_than_the_filesystem_allows_is_bad_input(mxtrain, tmp_path):
    r = sweep(mxtrain, tmp_path, ["--grid", "train.micro_batch=1"], out="o" * 256)
    assert r.rc == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "255 bytes" in lines[0], r


def test_a_huge_grid_is_refused_before_it_is_expanded(tmp_path):
    """10^7 points under a 2 GiB address-space limit: every point was made (ids, overrides)
    before any was checked, so the sweep ran out of memory. The product is checked first."""
    import resource
    from conftest import MXTRAIN_BIN, require_binary
    require_binary()
    ten = ",".join(map(str, range(1, 11)))
    keys = ["train.seed", "train.warmup_steps", "train.eval_batches", "train.log_every",
            "precision.stats_every", "run.threads", "train.eval_every"]
    grid = sum((["--grid", f"{k}={ten}"] for k in keys), [])

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    p = subprocess.run([MXTRAIN_BIN, "sweep", "--steps", "1", "--out", str(tmp_path / "out")] +
                       grid, capture_output=True, text=True, timeout=60, preexec_fn=limit,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr[-500:])
    assert lines[0].startswith("error: --grid: 10 x 10 x 10 x 10 x 10 x 10 x 10 values make "
                               "more than 10000 points"), lines
    assert not (tmp_path / "out").exists()
