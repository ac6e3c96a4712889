#!/usr/bin/env python3
"""Submit mxtrain training jobs to Amazon SageMaker, one job or a sweep, and gather a sweep's
results into the table `mxtrain sweep` writes.

    submit.py --image URI --role ARN --output-s3 s3://b/out [--spot --checkpoint-s3 s3://b/ck]
              [--training-plan ARN] [--channel train=s3://b/data/] [--set train.steps=1000]
              [--sweep train.lr=1e-3,3e-4 ...] [--dry-run]
    submit.py gather --sweep-name NAME --out DIR

How a job is submitted: with the SageMaker Python SDK 3.x's ModelTrainer (sagemaker-train,
pinned in requirements.txt): Compute (instance type and count, volume, spot, training plan ARN,
no warm pool), StoppingCondition (max run, max wait), CheckpointConfig, InputData channels,
OutputDataConfig, hyperparameters (all strings), tags and metric definitions, then
ModelTrainer.train(wait=False). The image's exec-form ENTRYPOINT is the program, so there is no
source_code: nothing is uploaded and no default bucket is looked up. ModelTrainer names the job
<--job-name>-<YYYYmmddHHMMSS> (printed as "submitted NAME ARN"), checks the role with IAM
unless SAGEMAKER_VALIDATE_ROLE=false, and reads the SDK defaults config
(~/.config/sagemaker/config.yaml); submit.py turns the SDK's telemetry off. --dry-run stops
the CreateTrainingJob call in botocore's before-parameter-build event, before it is signed,
and prints its parameters: nothing is sent, no credentials are needed. boto3 honours
AWS_ENDPOINT_URL (the tests point it at a moto server on 127.0.0.1) and the usual credential
chain.

A sweep (--sweep key=v1,v2, repeatable) is the cartesian product of its axes, first axis
slowest, with the point ids of `mxtrain sweep` (e.g. "lr-0.001_micro_batch-4"); each point is
one job named <sweep name>-<index>-<id>-<time stamp> and tagged mxtrain:sweep / mxtrain:point /
mxtrain:grid. `gather` finds the sweep's jobs by those tags (ListTrainingJobs + ListTags),
reads each job's DescribeTrainingJob (status, failure reason) and the metrics file the
entrypoint leaves in the job's output (s3://<output>/<job>/output/output.tar.gz, member
metrics.jsonl: its last "summary" object), and writes results.csv / results.md / results.json
with the columns of `mxtrain sweep` (the planner's predicted columns are left empty).

Before anything is sent, each job's hyperparameters go through `mxtrain sagemaker check` (the
entrypoint's own reading of them: known keys, values of their types, and the whole config when
no 'config' file is named), so that a typo fails here instead of after the instances are
provisioned. The binary: --mxtrain, else $MXTRAIN_BIN, else the repository's build/mxtrain, else
`mxtrain` on PATH; without one, a warning says the check was skipped (--no-check skips it).

Exit codes: 0 ok, 2 bad input (one line starting `error:`), 3 an AWS call failed.
"""
import argparse
import io
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

DEFAULT_INSTANCE = "ml.p6-b200.48xlarge"
MAX_SECONDS = 28 * 24 * 3600  # SageMaker's limit on MaxRuntimeInSeconds / MaxWaitTimeInSeconds
TAG_SWEEP, TAG_POINT, TAG_GRID = "mxtrain:sweep", "mxtrain:point", "mxtrain:grid"


class BadInput(Exception):
    """Bad flags or values: exit 2."""


class AwsFailure(Exception):
    """An AWS call failed: exit 3."""


# --- the sweep grid, as `mxtrain sweep` expands it (plan/sweep.cpp) -----------------------

def _unquote(v):
    if len(v) >= 2 and v[0] in "\"'" and v[-1] == v[0]:
        return v[1:-1]
    return v


def _sanitize(s):
    out = "".join(c if (c.isascii() and c.isalnum()) or c in ".-" else "_" for c in s)
    return out or "_"


def parse_axis(spec):
    if "=" not in spec:
        raise BadInput(f"--sweep '{spec}': expected section.key=v1,v2,... (no '=')")
    key, rest = spec.split("=", 1)
    key = key.strip()
    if "." not in key or key.startswith(".") or key.endswith("."):
        raise BadInput(f"--sweep '{spec}': the key must be section.key (e.g. train.lr)")
    if not rest.strip():
        raise BadInput(f"--sweep '{spec}': no values after '='")
    values = [v.strip() for v in rest.split(",")]
    if any(not v for v in values):
        raise BadInput(f"--sweep '{spec}': empty value (values are separated by single commas)")
    if len({_unquote(v) for v in values}) != len(values):
        raise BadInput(f"--sweep '{spec}': a value is given twice")
    return key, values


def expand_grid(axes):
    """[(key, [values])] -> [(id, [(key, value)])], first axis slowest; ids as mxtrain sweep."""
    last = [k.rsplit(".", 1)[-1] for k, _ in axes]
    names = [_sanitize(k if last.count(last[i]) > 1 else last[i]) for i, (k, _) in
             enumerate(axes)]
    points = []
    for combo in itertools.product(*[vals for _, vals in axes]):
        pid = "_".join(f"{names[i]}-{_sanitize(_unquote(v))}" for i, v in enumerate(combo))
        points.append([pid, [(axes[i][0], v) for i, v in enumerate(combo)]])
    seen = set()
    for p in points:
        pid, k = p[0], 2
        while pid in seen:
            pid = f"{p[0]}-{k}"
            k += 1
        seen.add(pid)
        p[0] = pid
    return [tuple(p) for p in points]


# --- flags -> the CreateTrainingJob request -----------------------------------------------

def _s3_uri(flag, value):
    if not re.fullmatch(r"s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?", value or ""):
        raise BadInput(f"{flag} must be an S3 URI s3://bucket/prefix (got '{value}')")
    return value


# ModelTrainer names a job <base_job_name>-<YYYYmmddHHMMSS> and cuts the name at 63
# characters: a base of at most 48 keeps the whole time stamp.
BASE_MAX = 63 - len("-20260101000000")


def _job_name(base, index=None, point_id=None):
    """A valid job base name (BASE_MAX characters at most): a sweep's jobs keep `base-index`
    whole and carry as much of the point id as fits."""
    clean = lambda x: re.sub(r"-+", "-", re.sub(r"[^a-zA-Z0-9-]", "-", x)).strip("-")
    if index is None:
        return clean(base)[:BASE_MAX].rstrip("-")
    tail = f"-{index}"
    name = clean(base)[:BASE_MAX - len(tail)].rstrip("-") + tail
    room = BASE_MAX - len(name) - 1
    pid = clean(point_id or "")[:room].rstrip("-") if room > 0 else ""
    return f"{name}-{pid}" if pid else name


def parse_sets(items):
    out = {}
    for item in items:
        if "=" not in item:
            raise BadInput(f"--set expects section.key=value (got '{item}')")
        k, v = item.split("=", 1)
        k = k.strip()
        if not k or ("." not in k and k != "config"):
            raise BadInput(f"--set '{item}': the key must be section.key (e.g. train.steps)")
        out[k] = v
    return out


def parse_channels(items):
    out = {}
    for item in items:
        if "=" not in item:
            raise BadInput(f"--channel expects name=s3://bucket/prefix (got '{item}')")
        name, uri = item.split("=", 1)
        if not re.fullmatch(r"[A-Za-z0-9\.\-_]{1,64}", name):
            raise BadInput(f"--channel '{item}': bad channel name '{name}'")
        if name in out:
            raise BadInput(f"--channel: channel '{name}' is given twice")
        out[name] = _s3_uri(f"--channel {name}", uri)
    return out


def validate(args):
    if args.instance_count < 1:
        raise BadInput(f"--instance-count must be at least 1 (got {args.instance_count})")
    if not 1 <= args.volume_size <= 16384:
        raise BadInput(f"--volume-size must be 1..16384 GB (got {args.volume_size})")
    if not 1 <= args.max_run <= MAX_SECONDS:
        raise BadInput(f"--max-run must be 1..{MAX_SECONDS} seconds (got {args.max_run})")
    if args.spot and args.training_plan:
        raise BadInput("--spot and --training-plan cannot be used together (a training plan "
                       "reserves on-demand capacity; Managed Spot Training uses spare capacity)")
    if args.max_wait is not None and not args.spot:
        raise BadInput("--max-wait applies to --spot jobs only")
    if args.spot:
        if args.max_wait is None:
            args.max_wait = args.max_run
        if not args.max_run <= args.max_wait <= MAX_SECONDS:
            raise BadInput(f"--max-wait ({args.max_wait}) must be at least --max-run "
                           f"({args.max_run}) and at most {MAX_SECONDS} seconds")
        if not args.checkpoint_s3:
            raise BadInput("--spot needs --checkpoint-s3: a reclaimed spot job resumes from "
                           "the checkpoints SageMaker syncs there")
    if args.training_plan and not re.fullmatch(r"arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]+:\d{12}:"
                                               r"training-plan/[A-Za-z0-9\-]+",
                                               args.training_plan):
        raise BadInput(f"--training-plan must be a training plan ARN "
                       f"(arn:aws:sagemaker:REGION:ACCOUNT:training-plan/NAME), "
                       f"got '{args.training_plan}'")
    if args.processes_per_host is not None and args.processes_per_host < 1:
        raise BadInput("--processes-per-host must be at least 1")
    if not re.fullmatch(r"arn:aws[a-z\-]*:iam::\d{12}:role/.+", args.role or ""):
        raise BadInput(f"--role must be an IAM role ARN (got '{args.role}')")
    if not args.image:
        raise BadInput("--image (the ECR URI of the image built from the Dockerfile) is required")
    _s3_uri("--output-s3", args.output_s3)
    if args.checkpoint_s3:
        _s3_uri("--checkpoint-s3", args.checkpoint_s3)


# Lines the entrypoint prints (train/trainer.cpp's progress line) that CloudWatch turns into
# the job's metrics (MetricDefinitions; FinalMetricDataList holds their last values).
METRIC_DEFINITIONS = [
    {"Name": "train:loss", "Regex": r"step \d+/\d+ \| loss ([0-9.eE+-]+)"},
    {"Name": "train:val_loss", "Regex": r"\| val ([0-9.eE+-]+)"},
    {"Name": "train:mfu_percent", "Regex": r"\| MFU ([0-9.]+)%"},
]


class _DryRun(Exception):
    """Raised from the botocore hook in place of sending CreateTrainingJob (--dry-run)."""

    def __init__(self, params):
        super().__init__("dry run")
        self.params = params


def _sdk():
    try:
        import boto3
        from sagemaker.core.config.config import load_sagemaker_config
        from sagemaker.core.helper.session_helper import Session
        from sagemaker.core.shapes import MetricDefinition, Tag
        from sagemaker.train import ModelTrainer
        from sagemaker.train.configs import (CheckpointConfig, Compute, InputData,
                                             OutputDataConfig, StoppingCondition)
    except ImportError as e:
        raise BadInput(f"the SageMaker Python SDK is not importable ({e}): pip install -r "
                       f"launch/sagemaker/requirements.txt") from e
    return dict(boto3=boto3, load_sagemaker_config=load_sagemaker_config, Session=Session,
                MetricDefinition=MetricDefinition, Tag=Tag, ModelTrainer=ModelTrainer,
                CheckpointConfig=CheckpointConfig, Compute=Compute, InputData=InputData,
                OutputDataConfig=OutputDataConfig, StoppingCondition=StoppingCondition)


def _first_line(e):
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


class Submitter:
    """ModelTrainer jobs on one SageMaker session. The session's boto3 events see every
    CreateTrainingJob the SDK makes: the request is recorded as sent (the job's name, which
    the SDK makes unique, and its ARN from the response); with dry_run the hook raises instead
    of letting botocore sign and send it, so nothing leaves the machine."""

    def __init__(self, region, dry_run):
        self.sdk = _sdk()
        self.dry_run = dry_run
        self.sent = []  # [(request, response)] of this session's CreateTrainingJob calls
        if dry_run:
            # ModelTrainer checks the role with IAM (SimulatePrincipalPolicy, the trust
            # policy) unless told not to; a dry run makes no AWS call at all.
            os.environ["SAGEMAKER_VALIDATE_ROLE"] = "false"
        boto = self.sdk["boto3"].Session(region_name=region)
        boto.events.register("before-parameter-build.sagemaker.CreateTrainingJob",
                             self._before)
        boto.events.register("after-call.sagemaker.CreateTrainingJob", self._after)
        # The user's SDK defaults (~/.config/sagemaker/config.yaml and the admin config) as the
        # SDK loads them, with its telemetry off: submit.py reports nothing to AWS but the jobs.
        config = self.sdk["load_sagemaker_config"]() or {}
        config.setdefault("SchemaVersion", "1.0")
        modules = config.setdefault("SageMaker", {}).setdefault("PythonSDK", {}).setdefault(
            "Modules", {})
        modules.setdefault("TelemetryOptOut", True)
        try:
            self.session = self.sdk["Session"](boto_session=boto, sagemaker_config=config)
        except Exception as e:  # e.g. NoRegionError, a malformed SDK defaults file
            raise AwsFailure(f"SageMaker session: {_first_line(e)}") from e

    def _before(self, params, **_):
        if self.dry_run:
            raise _DryRun(json.loads(json.dumps(params, default=str)))
        self.sent.append([json.loads(json.dumps(params, default=str)), None])

    def _after(self, parsed, **_):
        if self.sent:
            self.sent[-1][1] = parsed

    def trainer(self, args, job_base, hyperparameters, channels, tags):
        """The ModelTrainer of one job: Compute, StoppingCondition, CheckpointConfig,
        InputData channels, OutputDataConfig, hyperparameters, tags, metric definitions."""
        from pydantic import ValidationError
        k = self.sdk
        try:
            compute = k["Compute"](
                instance_type=args.instance_type, instance_count=args.instance_count,
                volume_size_in_gb=args.volume_size, keep_alive_period_in_seconds=0,
                enable_managed_spot_training=bool(args.spot),
                training_plan_arn=args.training_plan or None)
            stopping = k["StoppingCondition"](
                max_runtime_in_seconds=args.max_run,
                max_wait_time_in_seconds=args.max_wait if args.spot else None)
            trainer = k["ModelTrainer"](
                sagemaker_session=self.session, role=args.role, training_image=args.image,
                base_job_name=job_base, compute=compute, stopping_condition=stopping,
                checkpoint_config=k["CheckpointConfig"](s3_uri=args.checkpoint_s3,
                                                        local_path="/opt/ml/checkpoints")
                if args.checkpoint_s3 else None,
                output_data_config=k["OutputDataConfig"](s3_output_path=args.output_s3),
                input_data_config=[k["InputData"](channel_name=name, data_source=uri)
                                   for name, uri in sorted(channels.items())] or None,
                hyperparameters={str(a): str(b) for a, b in sorted(hyperparameters.items())},
                tags=[k["Tag"](key=t["Key"], value=t["Value"]) for t in tags] or None)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ()))
            raise BadInput(f"the SageMaker SDK rejects the job: {where}: "
                           f"{first.get('msg')}") from e
        except Exception as e:  # the role check's IAM calls (RoleValidationError, botocore)
            raise AwsFailure(f"ModelTrainer: {_first_line(e)}") from e
        return trainer.with_metric_definitions(
            [k["MetricDefinition"](name=m["Name"], regex=m["Regex"]) for m in METRIC_DEFINITIONS])

    def submit(self, trainer):
        """trainer.train() without waiting: (request, response); the response is None for a
        dry run, whose request was stopped before it was signed."""
        try:
            trainer.train(wait=False, logs=False)
        except _DryRun as d:
            return d.params, None
        except BadInput:
            raise
        except Exception as e:  # botocore's ClientError / NoCredentialsError, the SDK's errors
            # (RoleValidationError when the role lacks permissions or trust)
            raise AwsFailure(f"CreateTrainingJob via ModelTrainer: {_first_line(e)}") from e
        if not self.sent or self.sent[-1][1] is None:
            raise AwsFailure("ModelTrainer.train() returned without a CreateTrainingJob call")
        return tuple(self.sent[-1])


def sagemaker_client(region):
    import boto3
    return boto3.client("sagemaker", region_name=region)


def s3_client(region):
    import boto3
    return boto3.client("s3", region_name=region)


def _aws(call, what):
    try:
        return call()
    except Exception as e:  # botocore's ClientError, EndpointConnectionError, NoCredentials...
        raise AwsFailure(f"{what}: {e}") from e


class Parser(argparse.ArgumentParser):
    """argparse, with its usage errors as one `error:` line (exit 2) like every mxtrain tool."""

    def error(self, message):
        raise BadInput(f"{self.prog}: {message}")


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _mxtrain_binary(flag):
    if flag:
        if not (os.path.isfile(flag) and os.access(flag, os.X_OK)):
            raise BadInput(f"--mxtrain {flag}: not an executable file")
        return flag
    for cand in (os.environ.get("MXTRAIN_BIN"), os.path.join(REPO, "build", "mxtrain")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return shutil.which("mxtrain")


def check_hyperparameters(binary, jobs):
    """`mxtrain sagemaker check` on each job's hyperparameters (as SageMaker will write them:
    all strings); the first refusal is a BadInput naming the job."""
    with tempfile.TemporaryDirectory(prefix="mxtrain-submit-") as tmp:
        path = os.path.join(tmp, "hyperparameters.json")
        for name, hp, _ in jobs:
            with open(path, "w") as f:
                json.dump({str(a): str(b) for a, b in sorted(hp.items())}, f)
            try:
                r = subprocess.run([binary, "sagemaker", "check", "--hyperparameters", path],
                                   capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise BadInput(f"cannot run {binary} sagemaker check: {e}") from e
            if r.returncode != 0:
                lines = [l for l in r.stderr.splitlines() if l.startswith("error:")]
                why = lines[0][len("error:"):].strip() if lines else \
                    f"exit {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1]}"
                raise BadInput(f"job {name}: {why} (checked by {binary} sagemaker check; "
                               f"--no-check skips it)")


# CreateTrainingJob's limits on HyperParameters (the API reference: at most 100 entries, keys
# up to 256 characters, values up to 2500). botocore does not check the maxima before sending,
# so a longer value failed at AWS (exit 3) instead of here (exit 2).
MAX_HYPERPARAMETERS, MAX_HP_KEY, MAX_HP_VALUE = 100, 256, 2500


def check_job_shape(args, channels, jobs):
    """What fails in every job of this shape, whatever the config file says: the API's limits
    on hyperparameters, a config file in a channel the job does not have, and several hosts
    without S3 checkpoints (each host's /opt/ml/checkpoints is its own; the ranks refuse a
    checkpoint directory that is not one shared directory)."""
    if args.config and not os.path.isabs(args.config):
        path = os.path.normpath(args.config)  # ("./train/c.toml" is train/c.toml)
        if "/" not in path:
            raise BadInput(f"--config {args.config}: name the file as CHANNEL/FILE.toml (under "
                           f"the job's input/data, where each channel is a directory)")
        channel = path.split("/", 1)[0]
        if channel not in channels:
            raise BadInput(f"--config {args.config}: names a file in channel '{channel}', but no "
                           f"--channel {channel}=s3://... is given (CHANNEL/FILE.toml under "
                           f"the job's input/data)")
    for name, hp, _ in jobs:
        if len(hp) > MAX_HYPERPARAMETERS:
            raise BadInput(f"job {name}: {len(hp)} hyperparameters, more than the "
                           f"{MAX_HYPERPARAMETERS} SageMaker takes")
        for k, v in hp.items():
            if len(k) > MAX_HP_KEY or len(str(v)) > MAX_HP_VALUE:
                raise BadInput(f"job {name}: hyperparameter {k[:80]}'s "
                               f"{'key' if len(k) > MAX_HP_KEY else 'value'} is "
                               f"{max(len(k), len(str(v)))} characters, more than the "
                               f"{MAX_HP_KEY if len(k) > MAX_HP_KEY else MAX_HP_VALUE} "
                               f"SageMaker takes")
        if args.instance_count > 1 and "checkpoint.s3_uri" not in hp:
            why = (f"--instance-count {args.instance_count}: every host has its own "
                   f"/opt/ml/checkpoints, and the ranks need one checkpoint directory they all "
                   f"see: set --set checkpoint.s3_uri=s3://BUCKET/PREFIX")
            if "config" not in hp:
                raise BadInput(f"job {name}: {why}")
            print(f"warning: job {name}: {why} (unless the config file {hp['config']} sets it)",
                  file=sys.stderr, flush=True)


def submit(argv):
    p = Parser(prog="submit.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--job-name", help="job name (default mxtrain-<UTC time>); a sweep's prefix")
    p.add_argument("--region", default=os.environ.get("AWS_REGION") or
                   os.environ.get("AWS_DEFAULT_REGION"), help="AWS region")
    p.add_argument("--role", help="IAM role ARN SageMaker runs the job as")
    p.add_argument("--image", help="training image URI (ECR), built from the Dockerfile")
    p.add_argument("--instance-type", default=DEFAULT_INSTANCE)
    p.add_argument("--instance-count", type=int, default=1)
    p.add_argument("--volume-size", type=int, default=500, help="EBS volume per instance, GB")
    p.add_argument("--max-run", type=int, default=24 * 3600, help="MaxRuntimeInSeconds")
    p.add_argument("--spot", action="store_true", help="Managed Spot Training")
    p.add_argument("--max-wait", type=int, help="MaxWaitTimeInSeconds (spot; >= --max-run; "
                   "default --max-run)")
    p.add_argument("--training-plan", help="SageMaker training plan ARN (not with --spot)")
    p.add_argument("--checkpoint-s3", help="S3 URI synced with /opt/ml/checkpoints")
    p.add_argument("--output-s3", help="S3 URI for the model and output (S3OutputPath)")
    p.add_argument("--channel", action="append", default=[], metavar="NAME=S3URI",
                   help="input channel (repeatable): train=s3://bucket/data/")
    p.add_argument("--config", help="hyperparameter 'config': CHANNEL/FILE.toml under the "
                   "job's input/data")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="hyperparameter = mxtrain config override (repeatable)")
    p.add_argument("--processes-per-host", type=int,
                   help="MPI processes per instance (sagemaker.processes_per_host)")
    p.add_argument("--sweep", action="append", default=[], metavar="SECTION.KEY=V1,V2",
                   help="one job per point of the grid (repeatable axes)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the CreateTrainingJob request(s) as JSON, send nothing")
    p.add_argument("--mxtrain", help="mxtrain binary that checks the hyperparameters first "
                   "(default $MXTRAIN_BIN, build/mxtrain, or mxtrain on PATH)")
    p.add_argument("--no-check", action="store_true",
                   help="do not check the hyperparameters with mxtrain before submitting")
    args = p.parse_args(argv)
    validate(args)
    if not args.region and not args.dry_run:
        raise BadInput("--region (or AWS_REGION) is required")

    hyper = parse_sets(args.set)
    if args.config:
        hyper["config"] = args.config
    if args.processes_per_host is not None:
        hyper["sagemaker.processes_per_host"] = str(args.processes_per_host)
    channels = parse_channels(args.channel)
    base = args.job_name or "mxtrain"
    if not re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,%d}" % (BASE_MAX - 1), base):
        raise BadInput(f"--job-name '{base}': letters, digits and hyphens, at most {BASE_MAX} "
                       f"(the SDK appends -YYYYmmddHHMMSS)")

    jobs = []  # (base job name, hyperparameters, tags)
    if args.sweep:
        axes = [parse_axis(x) for x in args.sweep]
        keys = [k for k, _ in axes]
        if len(set(keys)) != len(keys):
            raise BadInput("--sweep: a key is given twice")
        grid_tag = json.dumps(keys, separators=(",", ":"))
        if len(grid_tag) > 256:
            raise BadInput("--sweep: too many or too long keys (the grid tag holds 256 chars)")
        for i, (pid, overrides) in enumerate(expand_grid(axes)):
            hp = dict(hyper)
            hp.update({k: _unquote(v) for k, v in overrides})
            tags = [{"Key": TAG_SWEEP, "Value": base}, {"Key": TAG_POINT, "Value": pid[:256]},
                    {"Key": TAG_GRID, "Value": grid_tag}]
            jobs.append((_job_name(base, i, pid), hp, tags))
    else:
        jobs.append((_job_name(base), hyper, []))

    check_job_shape(args, channels, jobs)
    if not args.no_check:
        binary = _mxtrain_binary(args.mxtrain)
        if binary:
            check_hyperparameters(binary, jobs)
        else:
            print("warning: hyperparameters not checked: no mxtrain binary (build it with "
                  "scripts/setup.sh, or pass --mxtrain PATH)", file=sys.stderr, flush=True)

    # A dry run needs no region (nothing is sent); the SDK's session wants one.
    sub = Submitter(args.region or "us-east-1", args.dry_run)
    trainers = [sub.trainer(args, name, hp, channels, tags) for name, hp, tags in jobs]
    if args.dry_run:
        out = [sub.submit(t)[0] for t in trainers]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2, sort_keys=True))
        return 0
    for t in trainers:
        req, resp = sub.submit(t)
        print(f"submitted {req['TrainingJobName']} {resp['TrainingJobArn']}", flush=True)
    return 0


# --- gather --------------------------------------------------------------------------------

def _read_summary(s3, output_path, job):
    """The entrypoint's last metrics summary from <output>/<job>/output/output.tar.gz."""
    m = re.fullmatch(r"s3://([^/]+)/?(.*)", output_path)
    if not m:
        return None
    bucket, prefix = m.group(1), m.group(2).strip("/")
    key = "/".join(x for x in (prefix, job, "output", "output.tar.gz") if x)
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except Exception:
        return None
    try:
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
            member = next((x for x in tar.getmembers()
                           if os.path.basename(x.name) == "metrics.jsonl"), None)
            if member is None:
                return None
            text = tar.extractfile(member).read().decode()
    except (tarfile.TarError, OSError, UnicodeDecodeError):
        return None
    summary = None
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("summary"):
            summary = obj
    return summary


def _num(v):
    if v is None:
        return ""
    if float(v) == int(v) and abs(v) < 1e15:
        return "%.0f" % v
    return "%.6g" % v


def _csv(s):
    s = str(s)
    if any(c in s for c in ",\"\n"):
        return '"' + s.replace('"', '""') + '"'
    return s


def _rate(v):
    if v >= 1e6:
        return "%.2fM" % (v / 1e6)
    if v >= 1e3:
        return "%.2fk" % (v / 1e3)
    return "%.3g" % v


def results_tables(rows, keys, title):
    """rows: dicts with id, values {key: v}, status, measured, tokens_per_s, peak_mem_bytes,
    final_loss, mfu, wall_s. Returns (csv, markdown) in the columns of `mxtrain sweep`."""
    head = ["id"] + keys + ["status", "tokens_per_s", "predicted_tokens_per_s",
                            "peak_mem_bytes", "predicted_mem_bytes", "mem_error",
                            "capacity_bytes", "final_loss", "mfu", "predicted_mfu", "wall_s",
                            "reused"]
    lines = [",".join(_csv(h) for h in head)]
    for r in rows:
        m = (lambda v: _num(v)) if r["measured"] else (lambda v: "")
        f = [r["id"]] + [_unquote(r["values"].get(k, "")) for k in keys]
        f += [r["status"], m(r["tokens_per_s"]), "", m(r["peak_mem_bytes"]), "", "", "",
              m(r["final_loss"]), m(r["mfu"]), "", "%.2f" % r["wall_s"], "false"]
        lines.append(",".join(_csv(x) for x in f))
    md = [f"# {title}", "",
          "Sorted by measured tokens/s (failed and skipped points last). Memory is per "
          "process, MiB; error = (measured - predicted) / predicted.", ""]
    md.append("|" + "".join(f" {k} |" for k in keys) + " tokens/s | predicted tokens/s | "
              "measured peak MiB | predicted MiB | mem error | final loss | MFU | status |")
    md.append("|" + "---|" * (len(keys) + 8))
    for r in rows:
        ok = r["measured"]
        cells = [_unquote(r["values"].get(k, "")) for k in keys]
        cells += [_rate(r["tokens_per_s"]) if ok else "-", "-",
                  "%.1f" % (r["peak_mem_bytes"] / 1048576.0) if ok else "-", "-", "-",
                  "%.4f" % r["final_loss"] if ok else "-",
                  "%.1f%%" % (100.0 * r["mfu"]) if ok else "-", r["status"]]
        md.append("|" + "".join(f" {c} |" for c in cells))
    return "\n".join(lines) + "\n", "\n".join(md) + "\n"


def gather(argv):
    p = Parser(prog="submit.py gather",
                                description="collect a sweep's jobs into results.csv/md/json")
    p.add_argument("--sweep-name", required=True, help="the sweep's --job-name")
    p.add_argument("--out", required=True, help="directory for results.csv, .md, .json")
    p.add_argument("--region", default=os.environ.get("AWS_REGION") or
                   os.environ.get("AWS_DEFAULT_REGION"))
    args = p.parse_args(argv)
    if not args.region:
        raise BadInput("--region (or AWS_REGION) is required")
    sm, s3 = sagemaker_client(args.region), s3_client(args.region)
    names, token = [], None
    while True:
        kw = {"NameContains": args.sweep_name, "MaxResults": 100}
        if token:
            kw["NextToken"] = token
        page = _aws(lambda: sm.list_training_jobs(**kw), "ListTrainingJobs")
        names += [j["TrainingJobName"] for j in page.get("TrainingJobSummaries", [])]
        token = page.get("NextToken")
        if not token:
            break
    rows, keys = [], None
    for name in sorted(set(names)):
        desc = _aws(lambda: sm.describe_training_job(TrainingJobName=name),
                    f"DescribeTrainingJob {name}")
        tags = {t["Key"]: t["Value"] for t in _aws(
            lambda: sm.list_tags(ResourceArn=desc["TrainingJobArn"]), f"ListTags {name}"
        ).get("Tags", [])}
        if tags.get(TAG_SWEEP) != args.sweep_name:
            continue
        job_keys = json.loads(tags.get(TAG_GRID, "[]"))
        keys = keys or job_keys
        hp = desc.get("HyperParameters", {})
        status = desc.get("TrainingJobStatus", "Unknown")
        summary = None
        if status == "Completed":
            summary = _read_summary(s3, desc["OutputDataConfig"]["S3OutputPath"], name)
        measured = summary is not None and not summary.get("stopped_by_signal")
        if status == "Failed":
            text = "failed: " + desc.get("FailureReason", "unknown reason").splitlines()[0]
        elif status == "Completed":
            text = "ok" if measured else "completed: no metrics in the job's output"
        else:
            text = status.lower()
        wall = desc.get("TrainingTimeInSeconds")
        if wall is None and summary:
            wall = summary.get("wall_seconds", 0.0)
        rows.append({
            "id": tags.get(TAG_POINT, name), "job": name,
            "values": {k: hp.get(k, "") for k in job_keys}, "status": text,
            "measured": measured,
            "tokens_per_s": float(summary.get("tokens_per_s", 0)) if measured else 0.0,
            "peak_mem_bytes": float(summary.get("peak_mem_bytes", 0)) if measured else 0.0,
            "final_loss": float(summary.get("final_loss", 0)) if measured else 0.0,
            "mfu": float(summary.get("mfu", 0)) if measured else 0.0,
            "wall_s": float(wall or 0.0)})
    if not rows:
        raise BadInput(f"no training jobs of sweep '{args.sweep_name}' (tag {TAG_SWEEP})")
    rank = lambda r: 0 if r["measured"] else (1 if r["status"].startswith("failed") else 2)
    rows.sort(key=lambda r: (rank(r), -r["tokens_per_s"] if r["measured"] else 0, r["id"]))
    csv_text, md = results_tables(rows, keys or [],
                                  f"mxtrain sweep on SageMaker: {args.sweep_name}, "
                                  f"{len(rows)} jobs")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.csv"), "w") as f:
        f.write(csv_text)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"sweep": args.sweep_name, "points": rows}, f, indent=2)
    print(md)
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] == "gather":
            return gather(argv[1:])
        return submit(argv)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except AwsFailure as e:
        print(f"error: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
