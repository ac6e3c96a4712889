"""Checkpoints straight to S3, against a real moto server on 127.0.0.1 with SigV4 checking on.

The server runs in a child process (tests/python/moto_helper.py, under a Python that has moto
and boto3); boto3 there is the independent client that lists, downloads and checks what
mxtrain wrote. Covered: save, list, verify (quick and --full), retention (keep), multipart
objects larger than the part size, resume (train.resume = auto finds the S3 copy) bit for bit
against an uninterrupted local run, export-hf from an S3 URI, a wrong secret key (clear error,
secret never printed), and a fault-injecting proxy between mxtrain and moto that drops
connections, delays, and answers 500 / 503 to a share of requests: every checkpoint still
commits and verifies, and a resume through the proxy still works."""
import http.client
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from conftest import MXTRAIN_BIN, english_text, read_metrics, require_binary, set_args
from test_checkpoint_resume import crc32c_ref

HERE = Path(__file__).resolve().parent
PART = 5 << 20  # S3's minimum part size: the rank files below are several parts long


def find_moto_python():
    cands = [os.environ.get("MXTRAIN_TEST_PYTHON"), shutil.which("python3"), "/usr/bin/python3",
             sys.executable]
    for py in [c for c in cands if c]:
        r = subprocess.run([py, "-c", "import moto, boto3, requests"], capture_output=True)
        if r.returncode == 0:
            return py
    return None


class Moto:
    def __init__(self):
        py = find_moto_python()
        if py is None:
            pytest.fail("no Python with moto and boto3 (pip install 'moto[server]' boto3, or set "
                        "MXTRAIN_TEST_PYTHON)")
        self.p = subprocess.Popen([py, str(HERE / "moto_helper.py")], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        first = self.p.stdout.readline()
        assert first, "moto helper died"
        self.info = json.loads(first)
        if "skip" in self.info:
            pytest.fail(self.info["skip"])
        self.endpoint = self.info["endpoint"]
        self.bucket = self.info["bucket"]

    def call(self, **cmd):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        out = json.loads(self.p.stdout.readline())
        assert "error" not in out, out
        return out

    def keys(self, prefix):
        # moto 5.2's signature check rejects an encoded '/' in a query (boto3's requests too):
        # list without the trailing '/' and filter here.
        objs = self.call(op="keys", prefix=prefix.rstrip("/"))["objects"]
        return {o["key"]: o for o in objs if o["key"].startswith(prefix)}

    def stop(self):
        self.p.stdin.close()
        try:
            self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()


@pytest.fixture(scope="module")
def moto():
    require_binary()
    m = Moto()
    yield m
    m.stop()


def s3_env(moto, endpoint=None, secret=None):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("AWS_"):
            del env[k]
    env.update({"AWS_ACCESS_KEY_ID": moto.info["key"],
                "AWS_SECRET_ACCESS_KEY": secret or moto.info["secret"],
                "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint or moto.endpoint,
                "MXTRAIN_S3_PART_SIZE": str(PART), "OMP_NUM_THREADS": "1",
                "OPENBLAS_NUM_THREADS": "1",
                # No instance metadata service here: fail fast instead of waiting on it.
                "AWS_EC2_METADATA_DISABLED": "true"})
    return env


def run(args, env, timeout=600):
    p = subprocess.run([MXTRAIN_BIN] + [str(a) for a in args], capture_output=True, text=True,
                       env=env, timeout=timeout)
    return p


@pytest.fixture(scope="module")
def common(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("s3ck")
    corpus = tmp / "english.txt"
    corpus.write_text(english_text(6000))
    # About 1.7M parameters: 20 MB of master weights + moments in one rank file, so the
    # upload is a multipart upload of 4 parts of 5 MiB.
    return tmp, {
        "model.preset": "tiny", "model.hidden_size": 256, "model.intermediate_size": 768,
        "model.num_attention_heads": 4, "model.num_key_value_heads": 2, "model.head_dim": 64,
        "train.micro_batch": 2, "train.seq_len": 32, "train.lr": 1e-3, "train.min_lr": 1e-3,
        "train.warmup_steps": 2, "train.seed": 5, "train.log_every": 1, "train.eval_every": 0,
        "data.path": corpus, "data.format": "text", "run.sample_tokens": 0,
    }


def test_save_list_retention_multipart_resume_export(moto, common, tmp_path):
    tmp, base = common
    env = s3_env(moto)
    uri = f"s3://{moto.bucket}/run1"
    # 12 steps with a checkpoint every 4 and keep = 2, straight to S3.
    r = run(["train"] + set_args(dict(base, **{
        "train.steps": 12, "checkpoint.every": 4, "checkpoint.keep": 2,
        "checkpoint.s3_uri": uri, "checkpoint.resume": "none",
        "run.out_dir": tmp_path / "a"})), env)
    assert r.returncode == 0, r.stderr
    keys = moto.keys("run1/")
    manifests = sorted(k for k in keys if k.endswith("/manifest.json"))
    assert manifests == ["run1/step_00000008/manifest.json", "run1/step_00000012/manifest.json"]
    assert not any(k.startswith("run1/step_00000004/") for k in keys), keys  # retention
    assert not (tmp_path / "a" / "checkpoints").exists()  # nothing local
    assert moto.call(op="uploads")["count"] == 0  # no multipart upload left open
    rank = keys["run1/step_00000012/rank_00000-of-00001.safetensors"]
    parts = -(-rank["size"] // PART)
    assert parts >= 3 and rank["etag"].endswith(f"-{parts}"), rank  # multipart, in 5 MiB parts
    # The manifest's sizes and CRC32Cs match the objects, computed here independently.
    moto.call(op="download", key="run1/step_00000012/manifest.json", path=str(tmp_path / "m.json"))
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["step"] == 12 and m["format_version"] == 2
    for f in m["files"]:
        got = moto.call(op="download", key=f"run1/step_00000012/{f['name']}",
                        path=str(tmp_path / f["name"]))
        data = (tmp_path / f["name"]).read_bytes()
        assert got["size"] == f["size"] == len(data)
        assert int(f["crc32c"], 16) == crc32c_ref(data), f["name"]
        assert f["etag"] == keys[f"run1/step_00000012/{f['name']}"]["etag"]

    ls = run(["ckpt", "ls", uri, "--verify"], env)
    assert ls.returncode == 0 and ls.stdout.count(" yes ") == 2, ls.stdout + ls.stderr
    assert "s3://mx-ckpt/run1/step_00000012" in ls.stdout
    v = run(["ckpt", "verify", uri + "/step_00000012", "--full"], env)
    assert v.returncode == 0 and "OK" in v.stdout, v.stderr

    # Resume from S3 (the local directory is empty) to step 16, against an uninterrupted run.
    r = run(["train"] + set_args(dict(base, **{
        "train.steps": 16, "checkpoint.every": 4, "checkpoint.keep": 2,
        "checkpoint.s3_uri": uri, "checkpoint.resume": "auto",
        "run.out_dir": tmp_path / "b", "run.metrics": tmp_path / "b.jsonl"})), env)
    assert r.returncode == 0, r.stderr
    assert "resumed from s3://mx-ckpt/run1/step_00000012" in r.stderr, r.stderr
    steps, _ = read_metrics(tmp_path / "b.jsonl")
    assert steps[0]["step"] == 13
    ref = run(["train"] + set_args(dict(base, **{
        "train.steps": 16, "checkpoint.resume": "none", "run.out_dir": tmp_path / "ref"})), env)
    assert ref.returncode == 0, ref.stderr
    e1 = run(["ckpt", "export-hf", uri, tmp_path / "hf_s3"], env)
    assert e1.returncode == 0, e1.stderr
    e2 = run(["ckpt", "export-hf", tmp_path / "ref" / "checkpoints", tmp_path / "hf_ref"], env)
    assert e2.returncode == 0, e2.stderr
    assert (tmp_path / "hf_s3" / "model.safetensors").read_bytes() == \
        (tmp_path / "hf_ref" / "model.safetensors").read_bytes()


def test_wrong_secret_key_is_a_clear_error(moto, common, tmp_path):
    tmp, base = common
    secret = "WRONGsecretWRONGsecretWRONGsecret0000000"
    env = s3_env(moto, secret=secret)
    r = run(["train"] + set_args(dict(base, **{
        "train.steps": 2, "checkpoint.s3_uri": f"s3://{moto.bucket}/wrong",
        "checkpoint.resume": "none", "run.out_dir": tmp_path / "w"})), env)
    assert r.returncode == 2, r.stderr
    errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and "SignatureDoesNotMatch" in errors[0], r.stderr
    assert secret not in r.stderr + r.stdout
    r = run(["ckpt", "ls", f"s3://{moto.bucket}/run1"], env)
    assert r.returncode == 2 and "SignatureDoesNotMatch" in r.stderr, r.stderr


class ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def request_body(self):
        n = int(self.headers.get("Content-Length", 0) or 0)
        return self.rfile.read(n) if n else b""


def forward(handler, upstream, body, rewrite=lambda data: data, drop=()):
    """Sends the request `handler` holds to `upstream` unchanged (same Host header, so its
    signature stays valid) and answers with upstream's answer, its body through `rewrite`,
    without the headers named in `drop` (lowercase). Returns upstream's status."""
    conn = http.client.HTTPConnection(upstream, timeout=60)
    conn.request(handler.command, handler.path, body=body, headers=dict(handler.headers))
    resp = conn.getresponse()
    data = rewrite(resp.read())
    handler.send_response(resp.status)
    length = str(len(data))
    for k, v in resp.getheaders():
        if k.lower() in drop:
            continue
        if k.lower() == "content-length" and handler.command == "HEAD":
            length = v  # a HEAD answer has no body but the object's length
        elif k.lower() not in ("content-length", "transfer-encoding", "connection", "server",
                               "date"):
            handler.send_header(k, v)
    if "content-length" not in drop:
        handler.send_header("Content-Length", length)
    handler.end_headers()
    if handler.command != "HEAD":
        try:
            handler.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading (an answer longer than it takes)
    conn.close()
    return resp.status


class FaultyProxy:
    """HTTP proxy to moto that fails a share of requests: drops the connection without an
    answer, answers 500 or 503, or delays before forwarding. Requests are forwarded unchanged
    (same Host header), so their signatures stay valid."""

    def __init__(self, upstream, seed, p_drop=0.08, p_500=0.08, p_503=0.08, p_delay=0.1):
        self.upstream = upstream.replace("http://", "")
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.counts = {"forwarded": 0, "dropped": 0, "500": 0, "503": 0, "delayed": 0,
                       "upstream_errors": 0}
        self.log = []  # (method, path, injected or upstream status), for a failure's message
        proxy = self

        class Handler(ProxyHandler):
            def handle_one(self):
                body = self.request_body()
                with proxy.lock:
                    x = proxy.rng.random()
                # Listings and the first requests of a run are failed like any other.
                with proxy.lock:
                    proxy.log.append((self.command, self.path[:80],
                                      "drop" if x < p_drop else "500" if x < p_drop + p_500
                                      else "503" if x < p_drop + p_500 + p_503 else "fwd"))
                if x < p_drop:
                    proxy.count("dropped")
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if x < p_drop + p_500 or x < p_drop + p_500 + p_503:
                    code = 500 if x < p_drop + p_500 else 503
                    proxy.count(str(code))
                    msg = (f"<Error><Code>{'InternalError' if code == 500 else 'SlowDown'}</Code>"
                           f"<Message>injected</Message></Error>").encode()
                    self.send_response(code)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(msg)
                    return
                if x < p_drop + p_500 + p_503 + p_delay:
                    proxy.count("delayed")
                    time.sleep(0.5)
                proxy.count("forwarded")
                status = forward(self, proxy.upstream, body)
                if status >= 500:
                    proxy.count("upstream_errors")
                with proxy.lock:
                    proxy.log.append((self.command, self.path[:80], status))

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_one

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def count(self, what):
        with self.lock:
            self.counts[what] += 1

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def test_fault_injection_every_checkpoint_commits(moto, common, tmp_path):
    tmp, base = common
    seed = int(os.environ.get("MXTRAIN_FAULT_SEED", random.randrange(1 << 30)))
    proxy = FaultyProxy(moto.endpoint, seed)
    try:
        env = s3_env(moto, endpoint=proxy.url)
        # About a quarter of all requests fail here, far more than S3 ever does: more tries per
        # request than the default 8, so a run of bad luck is not mistaken for a bug (1 run in
        # ~20 saw one request fail 8 times in a row).
        env["MXTRAIN_S3_MAX_ATTEMPTS"] = "16"
        uri = f"s3://{moto.bucket}/faulty"
        r = run(["train"] + set_args(dict(base, **{
            "train.steps": 8, "checkpoint.every": 2, "checkpoint.s3_uri": uri,
            "checkpoint.resume": "none", "run.out_dir": tmp_path / "f"})), env)
        assert r.returncode == 0, (seed, proxy.counts, r.stderr)
        # Seen directly (not through the proxy): every checkpoint committed.
        keys = moto.keys("faulty/")
        manifests = sorted(k for k in keys if k.endswith("/manifest.json"))
        assert manifests == [f"faulty/step_{s:08d}/manifest.json" for s in (2, 4, 6, 8)], keys
        # ... and verifies, every byte, read through the faulty proxy.
        v = run(["ckpt", "verify", uri, "--full"], env)
        assert v.returncode == 0 and v.stdout.count("OK") == 4, (seed, v.stdout, v.stderr,
                                                                 proxy.counts, proxy.log[-30:])
        # A resume through the proxy reads the newest one and goes on.
        r = run(["train"] + set_args(dict(base, **{
            "train.steps": 10, "checkpoint.every": 2, "checkpoint.s3_uri": uri,
            "checkpoint.resume": "auto", "run.out_dir": tmp_path / "g"})), env)
        assert r.returncode == 0 and "resumed from s3://mx-ckpt/faulty/step_00000008" in r.stderr, \
            (seed, r.stderr)
        failed = proxy.counts["dropped"] + proxy.counts["500"] + proxy.counts["503"]
        print(f"fault seed {seed}: {proxy.counts}")
        assert failed >= 5, (seed, proxy.counts)  # the faults really happened
    finally:
        proxy.stop()


def test_unreachable_store_is_a_storage_failure_for_every_ckpt_command():
    """Nothing listens on 127.0.0.1:9: every ckpt command on S3 ends with exit 3 (a storage
    failure, not a verdict on a checkpoint) and one error line; `ckpt ls` prints no row for a
    step it could not read (it printed one with -1 ranks and exited 0)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "x" * 40,
                "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
                "AWS_EC2_METADATA_DISABLED": "true", "MXTRAIN_S3_MAX_ATTEMPTS": "2",
                "OMP_NUM_THREADS": "1"})
    for args in (["ckpt", "ls", "s3://bkt/step_00000001"],
                 ["ckpt", "ls", "--verify", "s3://bkt/step_00000001"],
                 ["ckpt", "verify", "s3://bkt/step_00000001"],
                 ["ckpt", "verify", "--full", "s3://bkt/step_00000001"],
                 ["ckpt", "verify", "s3://bkt/run1"], ["ckpt", "ls", "s3://bkt/run1"]):
        r = run(args, env, timeout=120)
        errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
        assert r.returncode == 3 and len(errors) == 1, (args, r.returncode, r.stderr)
        assert "s3://bkt" not in r.stdout, (args, r.stdout)


def test_an_answer_that_is_not_a_listing_is_a_storage_failure(tmp_path):
    """An endpoint that answers 200 with a web page (a captive portal, a misrouted proxy): the
    listing was read as empty, so `ckpt verify ROOT` said "no committed checkpoints" (exit 2)
    and `train` with resume = auto started afresh over the run that is there. Now exit 3 before
    anything is trained or written."""
    page = b"<html><body>Welcome to hotel wifi</body></html>"

    class Portal(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _answer(self):
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(page)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Portal)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update({"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "x" * 40,
                    "AWS_REGION": "us-east-1",
                    "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.server_address[1]}",
                    "AWS_EC2_METADATA_DISABLED": "true", "MXTRAIN_S3_MAX_ATTEMPTS": "2",
                    "OMP_NUM_THREADS": "1"})
        corpus = tmp_path / "c.txt"
        corpus.write_text(english_text(2000))
        for args in (["ckpt", "verify", "s3://bkt/run1"], ["ckpt", "ls", "s3://bkt/run1"],
                     ["train", "--set", "model.preset=tiny", "--set", f"data.path={corpus}",
                      "--set", "train.steps=2", "--set", "train.seq_len=16",
                      "--set", "run.sample_tokens=0", "--set", "checkpoint.s3_uri=s3://bkt/run1",
                      "--set", f"run.out_dir={tmp_path / 'r'}"]):
            r = run(args, env, timeout=120)
            errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
            assert r.returncode == 3 and len(errors) == 1, (args, r.returncode, r.stderr)
            # (train's first request is its writer claim, whose PUT answer has no ETag)
            assert "ListBucketResult" in errors[0] or (
                args[0] == "train" and ".mxtrain.writer" in errors[0]
                and "no ETag" in errors[0]), (args, r.stderr)
            assert "step 1/" not in r.stderr, r.stderr  # nothing trained
    finally:
        server.shutdown()


def one_upload_a_page(uploads, query, bucket):
    """A ListMultipartUploadsResult as S3 pages it at max-uploads = 1: of `uploads` ((key, id),
    in S3's order), the one after the request's (key-marker, upload-id-marker), with
    IsTruncated and the Next markers."""
    marker = (query.get("key-marker", [""])[0], query.get("upload-id-marker", [""])[0])
    i = uploads.index(marker) + 1 if marker[0] else 0
    truncated = i + 1 < len(uploads)
    nxt = (f"<NextKeyMarker>{uploads[i][0]}</NextKeyMarker>"
           f"<NextUploadIdMarker>{uploads[i][1]}</NextUploadIdMarker>") if truncated else ""
    page = "".join(f"<Upload><Key>{k}</Key><UploadId>{u}</UploadId></Upload>"
                   for k, u in uploads[i:i + 1])
    return ('<?xml version="1.0" encoding="UTF-8"?><ListMultipartUploadsResult xmlns='
            f'"http://s3.amazonaws.com/doc/2006-03-01/"><Bucket>{bucket}</Bucket>'
            f"<KeyMarker>{marker[0]}</KeyMarker><UploadIdMarker>{marker[1]}</UploadIdMarker>"
            f"{nxt}<MaxUploads>1</MaxUploads><IsTruncated>{str(truncated).lower()}"
            f"</IsTruncated>{page}</ListMultipartUploadsResult>").encode()


class RewritingProxy:
    """A proxy to moto that logs every request and lets a test change answers: `mode` "size"
    puts a non-number into every listing's <Size>; "range" answers each ranged GET of a rank
    file with the same number of bytes from 4 bytes further on (a truthful Content-Range);
    "deny-uploads" answers ListMultipartUploads with 403 AccessDenied (a role without
    s3:ListBucketMultipartUploads); "page-uploads" pages that listing one upload at a time;
    "loop-list" answers every ListObjectsV2 as truncated with the same continuation token;
    "html-get" answers a GET of a manifest with a 200 HTML page (no ETag); "fake-put" answers
    a PUT of a manifest with an empty 200 and stores nothing; "cut-list" cuts every listing
    after its first </Contents> (a 200 with a matching Content-Length); "head-no-length" and
    "head-no-etag" drop that header from HEAD answers; "loop-keys" answers every listing with
    the same key, truncated, with a new continuation token each time; "big-get" answers a GET
    of a manifest with its headers and 200 MB of body; "delete-500-once" answers the first
    DELETE of a manifest with 500; "deny-delete" answers every DELETE with 403 AccessDenied
    (a role without s3:DeleteObject, or Object Lock)."""

    def __init__(self, moto, tmp_path):
        self.mode = None
        self.log = []
        self.deletes_failed = 0
        upstream = moto.endpoint.replace("http://", "")
        proxy = self

        class Handler(ProxyHandler):
            def handle_one(self):
                body = self.request_body()
                proxy.log.append((self.command, self.path.split("?")[0]))
                rng = self.headers.get("Range")
                if proxy.mode == "range" and rng and "rank_" in self.path:
                    key = self.path.split("?")[0].split("/", 2)[2]  # /bucket/key (path style)
                    whole = tmp_path / "whole.bin"
                    moto.call(op="download", key=key, path=str(whole))
                    data = whole.read_bytes()
                    a, b = (int(x) for x in rng.split("=")[1].split("-"))
                    part = data[a + 4:b + 5]
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {a + 4}-{b + 4}/{len(data)}")
                    self.send_header("Content-Length", str(len(part)))
                    self.end_headers()
                    self.wfile.write(part)
                    return
                query = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
                fake = None
                if proxy.mode == "loop-list" and self.command == "GET" and "list-type" in query:
                    fake = (b"<?xml version='1.0' encoding='UTF-8'?><ListBucketResult>"
                            b"<IsTruncated>true</IsTruncated><NextContinuationToken>same"
                            b"</NextContinuationToken></ListBucketResult>", "application/xml")
                manifest = self.path.split("?")[0].endswith("/manifest.json")
                if proxy.mode == "loop-keys" and self.command == "GET" and "list-type" in query:
                    token = f"t{len(proxy.log)}".encode()
                    fake = (b"<?xml version='1.0' encoding='UTF-8'?><ListBucketResult>"
                            b"<Contents><Key>lost/step_00000002/manifest.json</Key><Size>1</Size>"
                            b"</Contents><IsTruncated>true</IsTruncated><NextContinuationToken>"
                            + token + b"</NextContinuationToken></ListBucketResult>",
                            "application/xml")
                deny = None
                if proxy.mode == "deny-delete" and self.command == "DELETE":
                    deny = (403, b"AccessDenied", b"Access Denied")
                if (proxy.mode == "delete-500-once" and self.command == "DELETE" and manifest
                        and proxy.deletes_failed == 0):
                    proxy.deletes_failed += 1
                    deny = (500, b"InternalError", b"injected")
                if deny is not None:
                    doc = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>" + deny[1] +
                           b"</Code><Message>" + deny[2] + b"</Message></Error>")
                    self.send_response(deny[0])
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(doc)))
                    self.end_headers()
                    self.wfile.write(doc)
                    return
                if proxy.mode == "head-no-length" and self.command == "HEAD":
                    forward(self, upstream, body, drop=("content-length",))
                    return
                if proxy.mode == "head-no-etag" and self.command == "HEAD":
                    forward(self, upstream, body, drop=("etag",))
                    return
                if proxy.mode == "big-get" and self.command == "GET" and manifest:
                    forward(self, upstream, body, rewrite=lambda data: b" " * (200 << 20))
                    return
                if proxy.mode == "html-get" and self.command == "GET" and manifest:
                    fake = (b"<html><body>Sign in to continue</body></html>", "text/html")
                if proxy.mode == "fake-put" and self.command == "PUT" and manifest:
                    fake = (b"", "text/plain")
                if fake is not None:
                    self.send_response(200)
                    self.send_header("Content-Type", fake[1])
                    self.send_header("Content-Length", str(len(fake[0])))
                    self.end_headers()
                    self.wfile.write(fake[0])
                    return
                if proxy.mode == "deny-uploads" and self.command == "GET" and "uploads" in query:
                    deny = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied"
                            b"</Code><Message>Access Denied</Message></Error>")
                    self.send_response(403)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(deny)))
                    self.end_headers()
                    self.wfile.write(deny)
                    return
                def uploads_page(data=b""):
                    # The first page is moto's answer (its signature check passes) cut to one
                    # upload; moto 5.2 rejects a query with an encoded '/' (a key-marker), so
                    # later pages are made here from its listing.
                    ids = [tuple(x) for x in moto.call(op="uploads")["ids"]
                           if x[0].startswith(query.get("prefix", [""])[0])]
                    return one_upload_a_page(ids, query, moto.bucket)
                paging = (proxy.mode == "page-uploads" and self.command == "GET"
                          and "uploads" in query)
                if paging and "key-marker" in query:
                    page = uploads_page()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(page)))
                    self.end_headers()
                    self.wfile.write(page)
                    return
                def rewrite(data):
                    if (proxy.mode == "cut-list" and b"<ListBucketResult" in data
                            and b"</Contents>" in data):
                        return data[:data.index(b"</Contents>") + len(b"</Contents>")]
                    if proxy.mode == "size" and b"<ListBucketResult" in data:
                        return re.sub(rb"<Size>\d+</Size>", b"<Size>abc</Size>", data)
                    if paging and b"<ListMultipartUploadsResult" in data:
                        return uploads_page()
                    return data
                forward(self, upstream, body, rewrite)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_one

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def test_answers_that_lie_and_replaced_steps(moto, tmp_path):
    """Found by a hunt with a rewriting proxy: a listing whose <Size> is not a number ended
    `ckpt ls` with an internal error (std::stoull, exit 1); a ranged GET answered with the
    right number of bytes from elsewhere in the object was taken, and export-hf wrote wrong
    weights with exit 0; a run replacing a committed step overwrote its files while its
    manifest still stood (a kill then left a "committed" step failing its ETag checks). Now:
    exit 3 naming what was wrong, and the step is uncommitted (its manifest deleted) before its
    first file is written."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(english_text(3000))
    base = {"model.preset": "tiny", "train.seq_len": 16, "train.micro_batch": 2,
            "train.steps": 2, "train.eval_every": 0, "run.sample_tokens": 0,
            "data.path": corpus, "checkpoint.s3_uri": f"s3://{moto.bucket}/liar"}
    proxy = RewritingProxy(moto, tmp_path)
    try:
        env = s3_env(moto, endpoint=proxy.url)
        env["MXTRAIN_S3_MAX_ATTEMPTS"] = "2"
        r = run(["train"] + set_args(dict(base, **{"run.out_dir": tmp_path / "a"})), env)
        assert r.returncode == 0, r.stderr
        step = f"s3://{moto.bucket}/liar/step_00000002"

        # the same step written again (resume = none): the manifest goes before any file
        proxy.log.clear()
        r = run(["train"] + set_args(dict(base, **{"run.out_dir": tmp_path / "b",
                                                   "checkpoint.resume": "none"})), env)
        assert r.returncode == 0, r.stderr
        ops = [(m, p) for m, p in proxy.log if "step_00000002/" in p]
        first_write = next(i for i, (m, p) in enumerate(ops) if m in ("PUT", "POST"))
        delete = [i for i, (m, p) in enumerate(ops)
                  if m == "DELETE" and p.endswith("step_00000002/manifest.json")]
        assert delete and delete[0] < first_write, ops
        assert run(["ckpt", "verify", step], env).returncode == 0

        # a listing that never ends, a portal's page for a manifest, a manifest PUT that
        # stored nothing (the run said "done" with exit 0 and no step_00000003 existed)
        for mode, args, needle in (("size", ["ckpt", "ls", f"s3://{moto.bucket}/liar"], "<Size>"),
                                   ("range", ["ckpt", "export-hf", step, tmp_path / "out"],
                                    "Content-Range"),
                                   ("loop-list", ["ckpt", "ls", f"s3://{moto.bucket}/liar"],
                                    "continuation token it had given before"),
                                   ("html-get", ["ckpt", "verify", step], "carries no ETag"),
                                   ("fake-put", ["train"] + set_args(dict(base, **{
                                       "run.out_dir": tmp_path / "c", "train.steps": 3,
                                       "checkpoint.async": False})), "carries no ETag")):
            proxy.mode = mode
            r = run(args, env, timeout=120)
            errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
            assert r.returncode == 3 and len(errors) == 1, (mode, r.returncode, r.stderr)
            assert needle in errors[0], (mode, errors)
        assert not (tmp_path / "out" / "model.safetensors").exists()
        proxy.mode = None
        r = run(["ckpt", "ls", f"s3://{moto.bucket}/liar"], env, timeout=120)
        assert r.returncode == 0 and "step_00000002" in r.stdout, r.stderr
        assert "step_00000003" not in r.stdout, r.stdout
    finally:
        proxy.stop()


def errors_of(r):
    return [l for l in r.stderr.splitlines() if l.startswith("error:")]


def run_measured(args, env, timeout=120):
    """run(), with the child's peak resident memory in bytes (wait4's ru_maxrss)."""
    with open(os.devnull, "rb") as stdin:
        p = subprocess.Popen([MXTRAIN_BIN] + [str(a) for a in args], stdin=stdin,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    timer = threading.Timer(timeout, p.kill)
    timer.start()
    out, err = [], []
    readers = [threading.Thread(target=lambda f, acc: acc.append(f.read()), args=(f, acc))
               for f, acc in ((p.stdout, out), (p.stderr, err))]
    for t in readers:
        t.start()
    _, status, usage = os.wait4(p.pid, 0)
    for t in readers:
        t.join()
    timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    return subprocess.CompletedProcess(args, p.returncode, out[0], err[0]), usage.ru_maxrss * 1024


def test_answers_that_would_lose_committed_steps(moto, tmp_path):
    """Found by a hunt with a rewriting proxy, each of which cost a run its committed steps:
    a listing cut after some </Contents> (still a 200 with a matching Content-Length) was read
    as a short listing, and the run's start-up deleted a committed step's files as
    uncommitted; a HEAD without Content-Length (or ETag) read as size 0 made resume = auto skip
    a good step "which does not verify" and start afresh (and ckpt verify exit 2); a listing
    that kept handing out new tokens for the same keys never ended; a manifest GET answered
    with 200 MB was buffered whole. Now each is a storage failure (exit 3) and nothing in the
    bucket changes."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(english_text(3000))
    base = {"model.preset": "tiny", "train.seq_len": 16, "train.micro_batch": 2,
            "train.eval_every": 0, "run.sample_tokens": 0, "data.path": corpus,
            "checkpoint.s3_uri": f"s3://{moto.bucket}/lost", "checkpoint.every": 2}
    proxy = RewritingProxy(moto, tmp_path)
    try:
        env = s3_env(moto, endpoint=proxy.url)
        env["MXTRAIN_S3_MAX_ATTEMPTS"] = "2"
        r = run(["train"] + set_args(dict(base, **{"run.out_dir": tmp_path / "a",
                                                   "train.steps": 4,
                                                   "checkpoint.resume": "none"})), env)
        assert r.returncode == 0, r.stderr
        def steps_keys():  # (the writer claim a run's start writes is no step's)
            return {k: v for k, v in moto.keys("lost/").items() if "/step_" in k}
        before = steps_keys()
        assert "lost/step_00000004/manifest.json" in before, before
        root, step = f"s3://{moto.bucket}/lost", f"s3://{moto.bucket}/lost/step_00000004"
        resume = ["train"] + set_args(dict(base, **{"run.out_dir": tmp_path / "b",
                                                    "train.steps": 6}))
        for mode, runs, needle in (
                ("cut-list", [resume, ["ckpt", "ls", root], ["ckpt", "verify", root]],
                 f"ListObjectsV2 {root} failed: the answer is not a complete ListBucketResult"),
                ("head-no-length", [resume, ["ckpt", "verify", step]], "no Content-Length"),
                ("head-no-etag", [resume, ["ckpt", "verify", step]], "no ETag"),
                ("loop-keys", [["ckpt", "ls", root]], "again: the keys do not advance")):
            proxy.mode = mode
            for args in runs:
                proxy.log.clear()
                r = run(args, env, timeout=120)
                assert r.returncode == 3 and len(errors_of(r)) == 1, (mode, args, r.stderr)
                assert needle in errors_of(r)[0], (mode, args, errors_of(r))
                assert "step 1/" not in r.stdout + r.stderr, (mode, r.stderr)  # nothing trained
                assert not [m for m, p in proxy.log if m in ("DELETE", "PUT", "POST")
                            and not p.endswith("/.mxtrain.writer")], proxy.log
                assert len(proxy.log) < 20, (mode, len(proxy.log))  # no endless listing
            proxy.mode = None
            assert steps_keys() == before, mode

        # a manifest GET answered with 200 MB: refused after the manifest's size, never held
        # (measured above the binary's own footprint: a build with the CUDA backend maps its
        # libraries, some 200 MB, before it reads anything)
        _, base = run_measured(["ckpt", "verify", "--help"], env)
        proxy.mode = "big-get"
        r, peak = run_measured(["ckpt", "verify", step], env)
        assert r.returncode == 3 and len(errors_of(r)) == 1, r.stderr
        assert "longer than the" in errors_of(r)[0], errors_of(r)
        assert peak - base < 100 << 20, (peak, base)  # (before: the whole body, 200 MB and more)
        proxy.mode = None
        assert run(["ckpt", "verify", root], env).returncode == 0
    finally:
        proxy.stop()


def test_replacing_a_step_and_a_role_that_may_not_delete(moto, tmp_path):
    """S3 checkpoints with DELETE failing. A new step is written without any DELETE (a DELETE of
    its manifest before every step's first file stopped a role without s3:DeleteObject at its
    first checkpoint, exit 2). checkpoint.keep's DELETE refused (403: Object Lock, a policy
    denying deletes) leaves the step with a warning and the run goes on (it ended the run, exit
    2). Replacing a committed step whose manifest DELETE failed once: the retry deletes it
    before writing (it skipped the DELETE and overwrote the committed step's files while its
    manifest still stood)."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(english_text(3000))
    base = {"model.preset": "tiny", "train.seq_len": 16, "train.micro_batch": 2,
            "train.eval_every": 0, "run.sample_tokens": 0, "data.path": corpus,
            "checkpoint.s3_uri": f"s3://{moto.bucket}/nodel", "checkpoint.every": 2,
            "checkpoint.resume": "none"}
    proxy = RewritingProxy(moto, tmp_path)
    try:
        env = s3_env(moto, endpoint=proxy.url)
        env["MXTRAIN_S3_MAX_ATTEMPTS"] = "1"
        proxy.mode = "deny-delete"
        r = run(["train"] + set_args(dict(base, **{"run.out_dir": tmp_path / "a",
                                                   "train.steps": 4, "checkpoint.keep": 1})), env)
        assert r.returncode == 0, r.stderr
        warnings = [l for l in r.stderr.splitlines() if "checkpoint.keep" in l]
        assert len(warnings) == 1 and "AccessDenied" in warnings[0], r.stderr
        assert warnings[0].startswith("warning:") and "step_00000002" in warnings[0], warnings
        deletes = [p for m, p in proxy.log if m == "DELETE"]
        assert deletes == [f"/{moto.bucket}/nodel/step_00000002/manifest.json"], deletes
        keys = moto.keys("nodel/")
        assert {k for k in keys if k.endswith("manifest.json")} == {
            "nodel/step_00000002/manifest.json", "nodel/step_00000004/manifest.json"}, keys

        # the same steps written again, the first manifest DELETE failing once (500)
        proxy.mode = "delete-500-once"
        proxy.log.clear()
        r = run(["train"] + set_args(dict(base, **{"run.out_dir": tmp_path / "b",
                                                   "train.steps": 2, "train.seed": 9})), env)
        assert r.returncode == 0, r.stderr
        assert proxy.deletes_failed == 1 and "retrying" in r.stderr, r.stderr
        ops = [(m, p) for m, p in proxy.log if "/nodel/step_00000002/" in p]
        first_write = next(i for i, (m, p) in enumerate(ops) if m in ("PUT", "POST"))
        deletes = [i for i, (m, p) in enumerate(ops[:first_write])
                   if m == "DELETE" and p.endswith("/manifest.json")]
        assert len(deletes) == 2, ops  # the failed one, and the retry's
        assert run(["ckpt", "verify", f"s3://{moto.bucket}/nodel/step_00000002", "--full"],
                   env).returncode == 0

        # An interrupted checkpoint's files (no manifest) under a role that may not delete:
        # the start-of-run clean-up ended every restart (exit 3), so the run could not resume.
        # Now a warning; the run resumes from step 2 and its own step 4 writes over them.
        junk = tmp_path / "junk.bin"
        junk.write_bytes(b"half a shard")
        for name in ("rank_00000-of-00001.safetensors", "rank_00003-of-00004.safetensors"):
            moto.call(op="put", key=f"nodel/step_00000004/{name}", path=str(junk))
        moto.call(op="delete", key="nodel/step_00000004/manifest.json")
        proxy.mode = "deny-delete"
        proxy.log.clear()
        r = run(["train"] + set_args(dict(base, **{"run.out_dir": tmp_path / "c",
                                                   "train.steps": 4, "train.seed": 9,
                                                   "checkpoint.resume": "auto"})), env)
        assert r.returncode == 0, r.stderr
        warned = [l for l in r.stderr.splitlines() if "interrupted checkpoint" in l]
        assert len(warned) == 1 and warned[0].startswith("warning:") and \
            "step_00000004" in warned[0] and "AccessDenied" in warned[0], r.stderr
        assert "resum" in r.stderr and "step 2" in r.stderr, r.stderr
        assert run(["ckpt", "verify", f"s3://{moto.bucket}/nodel/step_00000004", "--full"],
                   env).returncode == 0
        # the other world size's leftover stays beside the new step, which never names it
        assert "nodel/step_00000004/rank_00003-of-00004.safetensors" in moto.keys("nodel/")
        moto.call(op="download", key="nodel/step_00000004/manifest.json",
                  path=str(tmp_path / "m4.json"))
        assert "rank_00003-of-00004" not in (tmp_path / "m4.json").read_text()
        r = run(["train"] + set_args(dict(base, **{"run.out_dir": tmp_path / "d",
                                                   "train.steps": 6, "train.seed": 9,
                                                   "checkpoint.resume": "auto"})), env)
        assert r.returncode == 0 and "step 4" in r.stderr, r.stderr
    finally:
        proxy.stop()


def test_unusable_answers_of_the_credential_endpoints(tmp_path):
    """An Expiration that is not a time ended the run with exit 2 (an internal check); an
    instance-metadata role listing holding a credentials document was quoted in the error,
    secret and all. Both are the AWS side's failures: exit 3, the body never shown. And a
    negative MXTRAIN_S3_PART_SIZE was reported as 18446744073709551615."""
    secret = "TOPSECRETVALUE123456"
    doc = json.dumps({"AccessKeyId": "AKIAEXAMPLE", "SecretAccessKey": secret,
                      "Token": "tok" + secret, "Expiration": "tomorrow " + secret})

    class Endpoint(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _answer(self):
            # the container endpoint's /creds and the instance metadata's role listing answer
            # a credentials document; the role's credentials themselves fail
            ok = self.command == "PUT" or self.path in (
                "/creds", "/latest/meta-data/iam/security-credentials/")
            body = b"TOKEN-1" if self.command == "PUT" else doc.encode() if ok else b"no"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        clean.update({"AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
                      "MXTRAIN_S3_MAX_ATTEMPTS": "1", "OMP_NUM_THREADS": "1"})
        for extra, needle in (({"AWS_CONTAINER_CREDENTIALS_FULL_URI": url + "/creds"},
                               "Expiration"),
                              ({"AWS_EC2_METADATA_SERVICE_ENDPOINT": url}, "not an IAM role name")):
            r = run(["ckpt", "ls", "s3://bkt/run1"], dict(clean, **extra), timeout=120)
            assert r.returncode == 3 and len(errors_of(r)) == 1, (extra, r.returncode, r.stderr)
            assert needle in errors_of(r)[0], (extra, r.stderr)
            assert secret not in r.stderr + r.stdout, r.stderr
    finally:
        server.shutdown()
    env = dict(clean, AWS_ACCESS_KEY_ID="AKIDEXAMPLE", AWS_SECRET_ACCESS_KEY="x" * 40,
               MXTRAIN_S3_PART_SIZE="-1")
    r = run(["ckpt", "ls", "s3://bkt/run1"], env, timeout=60)
    assert r.returncode == 2 and "MXTRAIN_S3_PART_SIZE='-1'" in r.stderr, r.stderr
    assert "18446744073709551615" not in r.stderr, r.stderr


def test_a_named_step_in_a_missing_bucket_says_so(moto, tmp_path):
    """A HEAD's 404 has no body: a step named in a bucket that does not exist read as "not
    committed". Now S3's NoSuchBucket (exit 2), while a missing step in a real bucket is still
    "not committed"."""
    env = s3_env(moto)
    step = "s3://no-such-bucket-mx/p/step_00000002"
    for args in (["ckpt", "verify", step], ["ckpt", "export-hf", step, tmp_path / "out"],
                 ["generate", "--model", step, "--prompt", "hi"]):
        r = run(args, env, timeout=120)
        errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
        assert r.returncode == 2 and len(errors) == 1, (args, r.returncode, r.stderr)
        assert "NoSuchBucket" in errors[0], (args, errors)
    r = run(["ckpt", "verify", f"s3://{moto.bucket}/nothing/step_00000002"], env, timeout=120)
    assert r.returncode == 2 and "not committed" in r.stderr, r.stderr


def test_uploads_a_stopped_run_left_open_are_aborted(moto, tmp_path):
    """A writer killed in the middle of a multipart upload leaves the upload open, its parts
    stored (and billed) until someone aborts it. A run's start, when nothing else writes its
    prefix, aborts every open upload of a step file there (through every page of the listing)
    and no other: not another prefix's, not one that merely starts with the same letters, not a
    non-step key. A role that may not list uploads gets a warning and the run goes on."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(english_text(3000))
    base = {"model.preset": "tiny", "train.seq_len": 16, "train.micro_batch": 2,
            "train.steps": 1, "train.eval_every": 0, "run.sample_tokens": 0,
            "data.path": corpus, "checkpoint.s3_uri": f"s3://{moto.bucket}/dead",
            "checkpoint.resume": "none"}
    dead = ["dead/step_00000003/rank_00000.safetensors", "dead/step_00000003/rank_00001.safetensors",
            "dead/step_00000001/model.safetensors"]
    kept = ["deadbeef/step_00000003/rank_00000.safetensors", "dead/notes/step_00000003",
            "other/step_00000003/rank_00000.safetensors"]
    before = set(moto.call(op="uploads")["keys"])
    for k in dead + kept:
        moto.call(op="start_upload", key=k)
    proxy = RewritingProxy(moto, tmp_path)
    try:
        env = s3_env(moto, endpoint=proxy.url)
        env["MXTRAIN_S3_MAX_ATTEMPTS"] = "2"
        proxy.mode = "deny-uploads"
        r = run(["train"] + set_args(dict(base, **{"run.out_dir": tmp_path / "a"})), env)
        assert r.returncode == 0, r.stderr
        warnings = [l for l in r.stderr.splitlines() if "could not abort" in l]
        assert len(warnings) == 1 and "AccessDenied" in warnings[0], r.stderr
        assert warnings[0].startswith("warning:"), warnings
        assert set(moto.call(op="uploads")["keys"]) == before | set(dead + kept)

        proxy.mode = "page-uploads"
        proxy.log.clear()
        r = run(["train"] + set_args(dict(base, **{"run.out_dir": tmp_path / "b"})), env)
        assert r.returncode == 0, r.stderr
        assert "aborted 3 multipart uploads" in r.stderr, r.stderr
        assert set(moto.call(op="uploads")["keys"]) == before | set(kept)
        # every page was asked for: one listing per upload under the prefix "dead"
        listings = [p for m, p in proxy.log if m == "GET" and p == f"/{moto.bucket}"]
        assert len(listings) >= 4, proxy.log
    finally:
        proxy.stop()
        moto.call(op="abort_uploads", keys=kept)
    assert run(["ckpt", "verify", f"s3://{moto.bucket}/dead/step_00000001"],
               s3_env(moto)).returncode == 0


def test_a_second_run_on_the_prefix_takes_over_and_the_first_stops(moto, tmp_path):
    """Two runs on one checkpoint.s3_uri replaced and deleted each other's steps unnoticed (the
    local lock covers directories only). A run names itself in <prefix>/.mxtrain.writer before
    it picks a step to resume from; the first run, still writing there, stops at its next
    checkpoint, exit 3, naming the second (not "missing after upload": the second's start
    removed its uncommitted files as a dead writer's), and the second's steps stay whole."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(english_text(3000))
    base = {"model.preset": "tiny", "train.seq_len": 16, "train.micro_batch": 2,
            "train.eval_every": 0, "run.sample_tokens": 0, "data.path": corpus,
            "train.log_every": 1000, "checkpoint.s3_uri": f"s3://{moto.bucket}/two",
            "checkpoint.every": 2, "checkpoint.keep": 2}
    env = s3_env(moto)

    def writer():
        moto.call(op="download", key="two/.mxtrain.writer", path=str(tmp_path / "w.json"))
        return json.loads((tmp_path / "w.json").read_text())

    first = subprocess.Popen([MXTRAIN_BIN, "train"] + [str(a) for a in set_args(dict(
        base, **{"train.steps": 1000000, "checkpoint.resume": "none",
                 "run.out_dir": tmp_path / "a"}))], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not any(
                k.endswith("/manifest.json") for k in moto.keys("two/")):
            time.sleep(0.1)
        claim = writer()
        assert set(claim) == {"run", "host", "pid", "started"} and len(claim["run"]) == 32
        assert (claim["host"], claim["pid"]) == (socket.gethostname(), first.pid), claim
        second = subprocess.Popen([MXTRAIN_BIN, "train"] + [str(a) for a in set_args(dict(
            base, **{"train.steps": 4, "checkpoint.resume": "none", "checkpoint.keep": 0,
                     "run.out_dir": tmp_path / "b"}))], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _, err2 = second.communicate(timeout=120)
        _, err1 = first.communicate(timeout=120)
    finally:
        for p in (first,):
            if p.poll() is None:
                p.kill()
    assert second.returncode == 0, err2
    assert first.returncode == 3, err1
    errs = [l for l in err1.splitlines() if l.startswith("error:")]
    assert len(errs) == 1 and "taken over" in errs[0] and f"pid {second.pid}" in errs[0], err1
    assert writer()["pid"] == second.pid  # the second's claim, untouched
    # every step left verifies (the second's, and those the first committed before it started)
    ls = run(["ckpt", "ls", f"s3://{moto.bucket}/two", "--verify"], env)
    assert ls.returncode == 0 and " no " not in ls.stdout, ls.stdout
    assert "step_00000004" in ls.stdout, ls.stdout


def test_a_run_that_writes_nothing_takes_no_prefix(moto, tmp_path):
    """The same command again after its run finished ("already complete", a retried job)
    writes nothing, so it does not name itself the prefix's writer: it took the prefix from the
    run writing there, which then stopped at its next checkpoint."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(english_text(3000))
    args = ["train"] + set_args({
        "model.preset": "tiny", "train.seq_len": 16, "train.micro_batch": 2, "train.steps": 2,
        "train.eval_every": 0, "run.sample_tokens": 0, "data.path": corpus,
        "checkpoint.s3_uri": f"s3://{moto.bucket}/done", "run.out_dir": tmp_path / "a"})
    env = s3_env(moto)
    r = run(args, env)
    assert r.returncode == 0, r.stderr
    other = {"run": "e" * 32, "host": "other-host", "pid": 4242,
             "started": "2026-12-03T00:00:00Z"}
    (tmp_path / "o.json").write_text(json.dumps(other))
    moto.call(op="put", key="done/.mxtrain.writer", path=str(tmp_path / "o.json"))
    r = run(args, env)
    assert r.returncode == 0 and "already complete" in r.stderr, r.stderr
    moto.call(op="download", key="done/.mxtrain.writer", path=str(tmp_path / "w.json"))
    assert json.loads((tmp_path / "w.json").read_text()) == other

    # From S3 alone (another out_dir): the run is found complete, or a step past train.steps
    # refused, from the manifest and state, before any tensor is read (both downloaded the
    # whole checkpoint first)
    proxy = RewritingProxy(moto, tmp_path)
    try:
        penv = s3_env(moto, endpoint=proxy.url)
        for steps, rc, says in ((2, 0, "already complete"), (1, 2, "past train.steps")):
            proxy.log.clear()
            r = run([a if a != "train.steps=2" else f"train.steps={steps}" for a in args[:-2]] +
                    ["--set", f"run.out_dir={tmp_path / 'b'}"], penv)
            assert r.returncode == rc and says in r.stderr, r.stderr
            gets = [p for m, p in proxy.log if m == "GET" and "/step_00000002/" in p]
            # (the shard's header alone: its 8-byte length, then the header, for the model check)
            assert gets and len([p for p in gets if "rank_" in p]) <= 2, (steps, proxy.log)
    finally:
        proxy.stop()
