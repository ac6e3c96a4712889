"""Data in several files: data.path as a directory or a glob of shards (llm.c's
fineweb_train_*.bin), read as their concatenation in sorted path order, and data.val_path,
validation data of its own. The reference is the same tokens in one file: training on the
shards must be the same run, bit for bit, as training on their concatenation, and validation
on a file of its own the same as validating on that file appended as the held-out tail."""
import json
import os
import re

import numpy as np

from conftest import read_metrics, set_args

LLMC_MAGIC = 20240520


def write_llmc(path, ids, version=1):
    header = np.zeros(256, np.int32)
    header[:3] = [LLMC_MAGIC, version, len(ids)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(ids, np.uint16 if version == 1 else np.uint32).tobytes())


def ids(n, seed):
    # byte-like text statistics are not needed: any ids below the tiny preset's 256
    rng = np.random.default_rng(seed)
    return (rng.zipf(1.3, n) % 256).astype(np.int64)


BASE = {"model.preset": "tiny", "train.seq_len": 32, "train.micro_batch": 2, "train.steps": 4,
        "run.sample_tokens": 0, "train.eval_every": 0, "train.seed": 3}


def rank_file(out, step):
    return (out / "checkpoints" / f"step_{step:08d}" / "rank_00000-of-00001.safetensors").read_bytes()


def test_shards_train_as_their_concatenation(tmp_path, mxtrain):
    parts = [ids(3000, 1), ids(17, 2), ids(2500, 3)]  # the middle shard shorter than a window
    d = tmp_path / "shards"
    (d / ".cache").mkdir(parents=True)
    # written out of order, named so that they sort into it; hidden files are skipped
    write_llmc(d / "fineweb_train_000002.bin", parts[2], version=2)
    write_llmc(d / "fineweb_train_000000.bin", parts[0])
    write_llmc(d / "fineweb_train_000001.bin", parts[1])
    write_llmc(d / ".fineweb_train_000003.bin", ids(500, 9))
    write_llmc(d / ".cache" / "x.bin", ids(500, 9))
    one = tmp_path / "one.u16"
    one.write_bytes(np.concatenate(parts).astype(np.uint16).tobytes())

    runs = {}
    for name, path in (("one", one), ("dir", d), ("glob", d / "fineweb_train_*.bin")):
        out = tmp_path / name
        r = mxtrain(["train"] + set_args(dict(BASE, **{"data.path": path, "run.out_dir": out})))
        assert r.rc == 0, r
        start = [l for l in r.stderr.splitlines() if l.startswith("mxtrain: ")][0]
        assert ("in 3 files" in start) == (name != "one"), start
        steps, _ = read_metrics(out / "metrics.jsonl")
        runs[name] = ([s["loss"] for s in steps], rank_file(out, 4))
    assert runs["dir"] == runs["one"]
    assert runs["glob"] == runs["one"]
    # and the shards' order matters: it is the sorted one, not the order written
    swapped = tmp_path / "swapped.u16"
    swapped.write_bytes(np.concatenate([parts[2], parts[1], parts[0]]).astype(np.uint16).tobytes())
    r = mxtrain(["train"] + set_args(dict(BASE, **{"data.path": swapped,
                                                   "run.out_dir": tmp_path / "sw"})))
    assert r.rc == 0, r
    assert rank_file(tmp_path / "sw", 4) != runs["one"][1]


def test_val_path_is_the_held_out_tail_of_its_own(tmp_path, mxtrain):
    train_ids, val_ids = ids(8000, 4), ids(2000, 5)
    t, v, joined = tmp_path / "train.u16", tmp_path / "val.u16", tmp_path / "all.u16"
    t.write_bytes(train_ids.astype(np.uint16).tobytes())
    v.write_bytes(val_ids.astype(np.uint16).tobytes())
    joined.write_bytes(np.concatenate([train_ids, val_ids]).astype(np.uint16).tobytes())
    common = dict(BASE, **{"train.eval_every": 2, "train.eval_batches": 3})
    # 10000 tokens, val_fraction 0.2: the last 2000 are held out, exactly val.u16
    a = mxtrain(["train"] + set_args(dict(common, **{"data.path": joined, "data.val_fraction": 0.2,
                                                     "run.out_dir": tmp_path / "a"})))
    b = mxtrain(["train"] + set_args(dict(common, **{"data.path": t, "data.val_path": v,
                                                     "data.val_fraction": 0.05,  # not used
                                                     "run.out_dir": tmp_path / "b"})))
    assert a.rc == 0 and b.rc == 0, (a, b)
    sa, _ = read_metrics(tmp_path / "a" / "metrics.jsonl")
    sb, _ = read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert [s.get("val_loss") for s in sa] == [s.get("val_loss") for s in sb]
    assert len([s for s in sb if "val_loss" in s]) == 2
    assert [s["loss"] for s in sa] == [s["loss"] for s in sb]
    assert rank_file(tmp_path / "a", 4) == rank_file(tmp_path / "b", 4)
    start = [l for l in b.stderr.splitlines() if l.startswith("mxtrain: ")][0]
    assert f"val {v} (2.0k tokens)" in start, start


def test_data_directories_and_patterns_refuse_what_they_cannot_read(tmp_path, mxtrain):
    d = tmp_path / "d"
    d.mkdir()
    write_llmc(d / "a.bin", ids(3000, 1))

    def err(settings):
        r = mxtrain(["train"] + set_args(dict(BASE, **settings)))
        lines = [l for l in r.stderr.splitlines() if l.startswith("error:")]
        assert r.rc == 2 and len(lines) == 1 and "step 1/" not in r.stderr, r
        return lines[0]

    # what the run writes must not land among the files it reads
    assert "run.metrics" in err({"data.path": d, "run.out_dir": tmp_path / "o",
                                 "run.metrics": d / "metrics.jsonl"})
    assert "checkpoint.dir" in err({"data.path": d, "run.out_dir": d / "run",
                                    "run.metrics": tmp_path / "m.jsonl"})
    assert "run.metrics" in err({"data.path": d / "*.jsonl", "run.out_dir": tmp_path / "o",
                                 "run.metrics": d / "m.jsonl"})
    assert "checkpoint.dir" in err({"data.path": d, "data.val_path": d,
                                    "run.out_dir": tmp_path / "o", "checkpoint.dir": d / "ck"})
    assert not (d / "metrics.jsonl").exists() and not (d / "run").exists()
    # a pattern that matches nothing; shards of two formats
    assert "matches no file" in err({"data.path": d / "*.u32", "run.out_dir": tmp_path / "o"})
    (d / "b.u16").write_bytes(ids(100, 2).astype(np.uint16).tobytes())
    assert "must have one format" in err({"data.path": d, "run.out_dir": tmp_path / "o"})
    # hidden files under a data directory are not data: writing there is fine
    (d / "b.u16").unlink()
    r = mxtrain(["train"] + set_args(dict(BASE, **{"data.path": d, "run.out_dir": tmp_path / "o",
                                                   "run.metrics": d / ".metrics.jsonl"})))
    assert r.rc == 0, r


def test_the_id_check_says_how_far_it_is(tmp_path, mxtrain):
    """Start-up reads every id of a binary data set once (the vocabulary check): for terabytes
    of shards, minutes without a word. A line every 10 s (MXTRAIN_TEST_PROGRESS_S: 0 here, a
    line per piece read) says how far it is, in bytes and files."""
    d = tmp_path / "d"
    d.mkdir()
    sizes = [5000, 6000, 7000]
    for i, n in enumerate(sizes):
        (d / f"s{i}.u16").write_bytes(ids(n, i).astype(np.uint16).tobytes())
    r = mxtrain(["train"] + set_args(dict(BASE, **{"data.path": d, "train.steps": 1,
                                                   "run.out_dir": tmp_path / "o"})),
                env={"MXTRAIN_TEST_PROGRESS_S": "0"})
    assert r.rc == 0, r
    lines = [l for l in r.stderr.splitlines() if l.startswith("data: checking ids: ")]
    assert len(lines) == 3, r.stderr
    for i, line in enumerate(lines):
        assert f"file {i + 1} of 3" in line, line
        assert f"({100 * sum(sizes[:i + 1]) // sum(sizes)}%)" in line, line
    # the default period: nothing for a check this short
    r = mxtrain(["train"] + set_args(dict(BASE, **{"data.path": d, "train.steps": 1,
                                                   "run.out_dir": tmp_path / "p"})))
    assert r.rc == 0 and "checking ids" not in r.stderr, r


def test_resume_over_a_changed_shard_set_warns(tmp_path, mxtrain):
    """The same data path over other data (a shard added to the directory) resumed without a
    word, though the windows and their order had changed. state.json keeps the token count;
    a resume that finds another one says so, and training goes on."""
    d = tmp_path / "d"
    d.mkdir()
    write_llmc(d / "a.bin", ids(3000, 1))
    run = dict(BASE, **{"data.path": d, "run.out_dir": tmp_path / "o", "checkpoint.every": 2})
    r = mxtrain(["train"] + set_args(dict(run, **{"train.steps": 2})))
    assert r.rc == 0, r
    r = mxtrain(["train"] + set_args(dict(run, **{"train.steps": 3})))
    assert r.rc == 0 and "resumed from" in r.stderr and "tokens, the checkpoint" not in r.stderr, r
    write_llmc(d / "b.bin", ids(500, 2))
    r = mxtrain(["train"] + set_args(dict(run, **{"train.steps": 4})))
    assert r.rc == 0, r
    warns = [l for l in r.stderr.splitlines() if "the checkpoint's run read 3000" in l]
    assert len(warns) == 1 and "holds 3500 tokens" in warns[0], r.stderr


def test_resume_over_renamed_shards_of_the_same_size_warns(tmp_path, mxtrain):
    """Two shards of one size swapping names (or one replaced by another of its size) kept the
    path and the token count, so a resume went on without a word over windows in another
    order. state.json keeps the data's fingerprint too; a resume over the same ids in the same
    order (the same files, or copies of them) stays silent."""
    d = tmp_path / "d"
    d.mkdir()
    write_llmc(d / "a.bin", ids(1500, 1))
    write_llmc(d / "b.bin", ids(1500, 2))
    run = dict(BASE, **{"data.path": d, "run.out_dir": tmp_path / "o", "checkpoint.every": 1})
    r = mxtrain(["train"] + set_args(dict(run, **{"train.steps": 1})))
    assert r.rc == 0, r
    state = json.loads((tmp_path / "o" / "checkpoints" / "step_00000001" / "state.json").read_text())
    assert state["data_tokens"] == 3000 and len(state["data_fingerprint"]) == 16, state
    # copies of the same files under the same names: no warning
    for n in ("a.bin", "b.bin"):
        data = (d / n).read_bytes()
        (d / n).unlink()
        (d / n).write_bytes(data)
    r = mxtrain(["train"] + set_args(dict(run, **{"train.steps": 2})))
    assert r.rc == 0 and "resumed from" in r.stderr and "not the same ids" not in r.stderr, r
    (d / "a.bin").rename(d / "c.bin")  # b.bin is now read first
    r = mxtrain(["train"] + set_args(dict(run, **{"train.steps": 3})))
    assert r.rc == 0 and "resumed from" in r.stderr, r
    warns = [l for l in r.stderr.splitlines() if "not the same ids" in l]
    assert len(warns) == 1 and "holds as many tokens as the checkpoint's run read" in warns[0], r.stderr


def test_resume_over_data_rewritten_between_the_sampled_places_warns(tmp_path, mxtrain):
    """One id changed between the 64 windows the fingerprint samples: the same path, token
    count and fingerprint, so a resume went on without a word. state.json keeps the CRC32C of
    every id (data_crc32c), which the vocabulary check reads anyway."""
    import zlib  # (only to show the edit is real; the CRC itself is mxtrain's)
    n = 200_000
    tokens = ids(n, 5)
    path = tmp_path / "a.bin"
    write_llmc(path, tokens)
    run = dict(BASE, **{"data.path": path, "run.out_dir": tmp_path / "o", "checkpoint.every": 1})
    r = mxtrain(["train"] + set_args(dict(run, **{"train.steps": 1})))
    assert r.rc == 0, r
    state = json.loads((tmp_path / "o" / "checkpoints" / "step_00000001" / "state.json").read_text())
    assert len(state["data_crc32c"]) == 8, state
    sampled = [(((n - 1024) * w) // 63, ((n - 1024) * w) // 63 + 1024) for w in range(64)]
    at = 5000
    assert not any(a <= at < b for a, b in sampled)
    before = path.read_bytes()
    tokens[at] = (tokens[at] + 1) % 256
    write_llmc(path, tokens)
    assert zlib.crc32(before) != zlib.crc32(path.read_bytes())
    r = mxtrain(["train"] + set_args(dict(run, **{"train.steps": 2})))
    assert r.rc == 0 and "resumed from" in r.stderr, r
    warns = [l for l in r.stderr.splitlines() if "not the same ids" in l]
    assert len(warns) == 1, r.stderr


def assert_one_resume_warning(r, says, *also):
    """A resumed run (exit 0) with no warning (says None), or exactly one holding every text."""
    assert r.rc == 0 and "resumed from" in r.stderr, r
    warns = [l for l in r.stderr.splitlines() if l.startswith("warning:")]
    if says is None:
        assert warns == [], r.stderr
    else:
        assert len(warns) == 1 and all(t in warns[0] for t in (says, *also)), r.stderr


def test_resume_with_other_windows_warns(tmp_path, mxtrain):
    """Another train.seq_len, data.val_fraction or data.val_path on resume went on without a
    word: the windows or the split moved, the rest of the epoch took another order, and a
    larger val_fraction validated on windows the first run had trained on (a hunt found the
    windows read after such a resume inside the first run's held-out tail). state.json keeps
    seq_len, the number of training windows and val_path; the same settings stay silent."""
    d = tmp_path / "d"
    d.mkdir()
    write_llmc(d / "a.bin", ids(3000, 1))
    run = dict(BASE, **{"data.path": d, "run.out_dir": tmp_path / "o", "checkpoint.every": 1,
                        "data.val_fraction": 0.2, "train.eval_every": 0})
    r = mxtrain(["train"] + set_args(dict(run, **{"train.steps": 1})))
    assert r.rc == 0, r
    state = json.loads((tmp_path / "o" / "checkpoints" / "step_00000001" / "state.json").read_text())
    T = int(run["train.seq_len"])
    # the split (data/data_split.h): the last val_fraction of the tokens held out, training's
    # windows start every seq_len tokens in the rest
    assert state["seq_len"] == T and state["val_path"] == "" and state["val_fraction"] == 0.2
    assert state["train_windows"] == (int(3000 * 0.8) - 1) // T, state
    step1 = tmp_path / "o" / "checkpoints" / "step_00000001"
    for i, (over, says) in enumerate((({}, None),
                       ({"train.seq_len": T * 2}, f"train.seq_len is {T * 2}, the checkpoint's run used {T}"),
                       ({"data.val_fraction": 0.4}, "validation may be measured on windows"))):
        r = mxtrain(["train"] + set_args(dict(run, **over, **{
            "train.steps": 2, "checkpoint.resume": step1, "run.out_dir": tmp_path / f"r{i}"})))
        assert_one_resume_warning(r, says)


def test_resume_with_another_validation_file_warns(tmp_path, mxtrain, monkeypatch):
    """data.val_path is kept in state.json: another file warns; the same file spelled another
    way (relative, absolute) does not."""
    monkeypatch.chdir(tmp_path)
    for name, seed in (("a.bin", 1), ("v1.bin", 2), ("v2.bin", 3)):
        write_llmc(tmp_path / name, ids(3000, seed))
    run = dict(BASE, **{"data.path": tmp_path / "a.bin", "checkpoint.every": 1,
                        "data.val_path": tmp_path / "v1.bin", "train.eval_every": 0})
    r = mxtrain(["train"] + set_args(dict(run, **{"train.steps": 1, "run.out_dir": tmp_path / "o"})))
    assert r.rc == 0, r
    step1 = tmp_path / "o" / "checkpoints" / "step_00000001"
    for i, (val, says) in enumerate((("v1.bin", None), (tmp_path / "v2.bin", "not comparable"))):
        r = mxtrain(["train"] + set_args(dict(run, **{
            "data.val_path": val, "train.steps": 2, "checkpoint.resume": step1,
            "run.out_dir": tmp_path / f"r{i}"})))
        assert_one_resume_warning(r, says, "v2.bin")


def test_resume_over_a_rewritten_validation_file_warns(tmp_path, mxtrain):
    """data.val_path's file rewritten under its name resumed without a word (state.json kept
    only the path), so validation losses before and after were compared as one series. It now
    keeps val_tokens, val_fingerprint and val_crc32c: one id changed between the sampled
    windows, and a shorter file, each warn once; the file as it was stays silent."""
    write_llmc(tmp_path / "a.bin", ids(3000, 1))
    n = 200_000
    val = ids(n, 2)
    vpath = tmp_path / "v.bin"
    write_llmc(vpath, val)
    run = dict(BASE, **{"data.path": tmp_path / "a.bin", "checkpoint.every": 1,
                        "data.val_path": vpath, "train.eval_every": 0})
    r = mxtrain(["train"] + set_args(dict(run, **{"train.steps": 1, "run.out_dir": tmp_path / "o"})))
    assert r.rc == 0, r
    step1 = tmp_path / "o" / "checkpoints" / "step_00000001"
    state = json.loads((step1 / "state.json").read_text())
    assert state["val_tokens"] == n and len(state["val_fingerprint"]) == 16, state
    assert len(state["val_crc32c"]) == 8, state
    changed = list(val)
    # (the fingerprint's 64 sampled windows of 1024 ids: the change falls between them)
    sampled = [(((n - 1024) * w) // 63, ((n - 1024) * w) // 63 + 1024) for w in range(64)]
    at = 5000
    assert not any(a <= at < b for a, b in sampled)
    changed[at] = (changed[at] + 1) % 256
    for i, (tokens, says) in enumerate(((val, None), (changed, f"as many tokens, {n}, but other ids"),
                                        (val[:n // 2], f"{n // 2} tokens now, {n} then"))):
        write_llmc(vpath, tokens)
        r = mxtrain(["train"] + set_args(dict(run, **{
            "train.steps": 2, "checkpoint.resume": step1, "run.out_dir": tmp_path / f"r{i}"})))
        assert_one_resume_warning(r, says, "not comparable")


def test_what_a_hunt_found_in_data_paths(tmp_path, monkeypatch):
    """Each case was wrong at first: the run's files written over or among the shards (a pattern
    spelled another way than the metrics path, a shard that is a symbolic link, a pattern
    matching the run's own directory), a directory walk that stopped early and trained on part
    of the data with exit 0, three shards refused under `ulimit -n 64`, a typo in a pattern's
    directory reported as "Permission denied", val_path ignored under data.format = random,
    and validation shards trained on."""
    import os
    import resource
    monkeypatch.chdir(tmp_path)  # relative spellings below
    d = tmp_path / "d2"
    d.mkdir()
    for i, n in enumerate((3000, 17, 2500)):
        write_llmc(d / f"{'abc'[i]}.bin", ids(n, i))

    def run(settings, preexec=None):
        import subprocess
        from conftest import MXTRAIN_BIN
        args = [MXTRAIN_BIN, "train"] + [str(a) for a in set_args(dict(BASE, **settings))]
        p = subprocess.run(args, capture_output=True, text=True, errors="replace",
                           env=dict(os.environ, OMP_NUM_THREADS="1"), preexec_fn=preexec,
                           timeout=240)
        return p, [l for l in p.stderr.splitlines() if l.startswith("error:")]

    def refused(settings, says, preexec=None):
        p, errors = run(settings, preexec)
        assert p.returncode == 2 and len(errors) == 1 and says in errors[0], p.stderr
        assert "step 1/" not in p.stderr
        return errors[0]

    sizes = {f.name: f.stat().st_size for f in d.iterdir()}
    out = {"run.out_dir": tmp_path / "o"}
    refused(dict(out, **{"data.path": "d2/*.bin", "run.metrics": d / "c.bin"}), "run.metrics")
    refused(dict(out, **{"data.path": "./d2/*.bin", "run.metrics": "d2/m.bin"}), "run.metrics")
    refused({"data.path": "d2/*", "run.out_dir": d / "run", "run.metrics": tmp_path / "m.jsonl"},
            "where data.path")
    ext = tmp_path / "ext"
    ext.mkdir()
    (ext / "c.bin").write_bytes((d / "c.bin").read_bytes())
    d3 = tmp_path / "d3"
    d3.mkdir()
    (d3 / "c.bin").symlink_to(ext / "c.bin")
    refused(dict(out, **{"data.path": d3, "run.metrics": ext / "c.bin"}), "run.metrics")
    refused(dict(out, **{"data.path": "d3/*.bin", "run.metrics": ext / "c.bin"}), "run.metrics")
    assert {f.name: f.stat().st_size for f in d.iterdir()} == sizes
    assert (ext / "c.bin").stat().st_size == (d / "c.bin").stat().st_size

    # a walk that cannot finish is an error, not part of the data: 40 directories deep under
    # 40 open files
    deep = tmp_path / "deep"
    p_ = deep
    for i in range(40):
        p_ = p_ / f"l{i}"
    p_.mkdir(parents=True)
    write_llmc(deep / "a.bin", ids(3000, 1))
    write_llmc(p_ / "z.bin", ids(2500, 2))
    lim = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))  # noqa: E731
    refused(dict(out, **{"data.path": deep}), "cannot list the directory", preexec=lim)
    # a few shards under a low limit train; so do many text files, which are not kept open
    small = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))  # noqa: E731
    p, _ = run({"data.path": d, "run.out_dir": tmp_path / "os"}, preexec=small)
    assert p.returncode == 0, p.stderr
    t = tmp_path / "texts"
    t.mkdir()
    for i in range(200):
        (t / f"{i:03d}.txt").write_text("some text for the shards. " * 3)
    p, _ = run(dict(out, **{"data.path": t, "run.out_dir": tmp_path / "ot"}), preexec=small)
    assert p.returncode == 0, p.stderr
    # a pattern's missing directory: no match (not "Permission denied")
    refused(dict(out, **{"data.path": "d2/trian/*.bin"}), "matches no file")
    # a link to nothing in a data directory: a missing shard, said so
    (d3 / "gone.bin").symlink_to(tmp_path / "nowhere.bin")
    refused(dict(out, **{"data.path": d3}), "symbolic link to nothing")
    # val_path and random data; validation shards among the training ones
    refused(dict(out, **{"data.format": "random", "data.val_path": d / "a.bin"}), "data.val_path")
    refused(dict(out, **{"data.path": d, "data.val_path": "d2/c*.bin"}),
            "is also read by data.path")
    p, _ = run({"data.path": "d2/[ab].bin", "data.val_path": "d2/c*.bin",
                "run.out_dir": tmp_path / "ov"})
    assert p.returncode == 0, p.stderr
    # too few held-out windows: the advice names what sets them
    p, _ = run({"data.path": "d2/a.bin", "data.val_path": d / "b.bin", "train.eval_every": 2,
                "train.seq_len": 8, "run.out_dir": tmp_path / "ow"})
    warn = [l for l in p.stderr.splitlines() if "count more than once" in l]
    assert p.returncode == 0 and len(warn) == 1 and "data.val_path" in warn[0], p.stderr


def test_the_open_file_limit_counts_training_and_validation_shards(tmp_path):
    """Binary shards stay open. Under a hard limit of 64 files, 30 training shards and 30
    validation shards cannot all be held with room to spare: the error comes before training,
    names the validation shard being opened, and counts every shard held open so far, the
    training ones included (it counted only the validation data's own)."""
    import resource
    import subprocess
    from conftest import MXTRAIN_BIN
    tr, va = tmp_path / "train", tmp_path / "val"
    tr.mkdir()
    va.mkdir()
    for i in range(30):
        write_llmc(tr / f"t{i:02d}.bin", ids(300, i))
        write_llmc(va / f"v{i:02d}.bin", ids(100, 100 + i))
    settings = dict(BASE, **{"data.path": tr, "data.val_path": va, "run.out_dir": tmp_path / "o"})
    args = [MXTRAIN_BIN, "train"] + [str(a) for a in set_args(settings)]
    p = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)),
                       timeout=240)
    errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert p.returncode == 2 and len(errors) == 1 and "step 1/" not in p.stderr, p.stderr
    m = re.search(r"data file '([^']*)': the (\d+) data files kept open so far", errors[0])
    assert m and m.group(1).startswith(str(va)), errors[0]
    assert int(m.group(2)) > 30 and "raise it, or merge the shards" in errors[0], errors[0]
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").rglob("*.safetensors"))
    # the same shards under the default limit train
    p = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                       timeout=240)
    assert p.returncode == 0, p.stderr


def test_what_a_second_hunt_found_in_data_paths(tmp_path, monkeypatch):
    """A pattern compared by spelling let a run write into its data through a symbolic link to
    the data directory, or when the working directory's name held [ or *; directories the run
    creates above its files (checkpoint.dir = d/x/ckpt, the default runs/default) were not
    checked, so the next start failed on them; a respelled pattern warned "new data" on
    resume; the progress line stopped at 99% for llm.c shards."""
    import subprocess
    from conftest import MXTRAIN_BIN
    work = tmp_path / "w[1]"
    work.mkdir()
    monkeypatch.chdir(work)
    d = work / "d"
    d.mkdir()
    for i, n in enumerate((3000, 2500)):
        write_llmc(d / f"{'ab'[i]}.bin", ids(n, i))
    (work / "dl").symlink_to(d)

    def run(settings, env=None):
        args = [MXTRAIN_BIN, "train"] + [str(a) for a in set_args(dict(BASE, **settings))]
        p = subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=240,
                           env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))
        return p, [l for l in p.stderr.splitlines() if l.startswith("error:")]

    before = sorted(os.listdir(d))
    for settings in ({"data.path": "d/*", "run.metrics": "dl/metrics.jsonl"},
                     {"data.path": "dl/*.bin", "run.metrics": "d/m.bin"},
                     {"data.path": "d/*", "checkpoint.dir": "dl/ckpt"},
                     {"data.path": "d/*", "run.out_dir": "d/run"},       # [1] in the cwd's name
                     {"data.path": "d/*", "checkpoint.dir": "d/x/ckpt"},  # d/x would be made
                     {"data.path": "d/*", "run.metrics": "d/x/m.jsonl"}):
        p, errors = run(dict({"run.out_dir": tmp_path / "o"}, **settings))
        assert p.returncode == 2 and len(errors) == 1 and "step 1/" not in p.stderr, (settings, p.stderr)
        assert sorted(os.listdir(d)) == before, settings
    # the default out_dir (runs/default) under a pattern over runs/
    (work / "runs").mkdir()
    write_llmc(work / "runs" / "a.bin", ids(3000, 1))
    p, errors = run({"data.path": "runs/*"})
    assert p.returncode == 2 and len(errors) == 1 and "runs/default" in errors[0], p.stderr
    # a respelled pattern is the same data on resume; the progress ends at 100%
    p, _ = run({"data.path": "d/*.bin", "run.out_dir": tmp_path / "r", "train.steps": 2})
    assert p.returncode == 0, p.stderr
    p, _ = run({"data.path": "./d/*.bin", "run.out_dir": tmp_path / "r", "train.steps": 3},
               env={"MXTRAIN_TEST_PROGRESS_S": "0"})
    assert p.returncode == 0 and "resumed from" in p.stderr, p.stderr
    assert "new data" not in p.stderr and "tokens, the checkpoint" not in p.stderr, p.stderr
    progress = [l for l in p.stderr.splitlines() if l.startswith("data: checking ids")]
    assert progress and "(100%), file 2 of 2" in progress[-1], progress
