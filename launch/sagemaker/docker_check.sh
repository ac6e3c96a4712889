#!/usr/bin/env bash
# Builds the repository's Dockerfile for real (the CPU variant: MXTRAIN_CUDA=OFF) and runs the
# image the way SageMaker runs a training image, on this machine. docs/sagemaker.md, section 1.
#
#   sudo launch/sagemaker/docker_check.sh          # as root: it may start dockerd and debootstrap
#
# NOT part of CI nor of scripts/test.sh: it needs root, a Docker engine and the Debian package
# mirror, and takes tens of minutes (the image compiles mxtrain with -j$(nproc)) and some GB of
# disk.
#
# What it does:
#  1. Starts dockerd (`--bridge=none --iptables=false`, data root $MXTRAIN_DOCKER_DATA_ROOT,
#     default /var/lib/docker; storage driver overlay2 where the kernel has overlayfs, else vfs,
#     or $MXTRAIN_DOCKER_STORAGE_DRIVER) unless an engine already answers; a dockerd it started
#     is stopped at the end.
#  2. The base image: no registry image can be pulled here (only Debian's and PyPI's package
#     mirrors are reachable), so when $BASE (default mxtrain-local/debian:12) is missing it is
#     made from Debian 12 itself: `debootstrap --variant=minbase bookworm` from the mirror this
#     machine's apt uses ($MXTRAIN_DEBIAN_MIRROR overrides it), apt sources set to bookworm,
#     bookworm-updates and bookworm-security, then `docker import`.
#  3. `docker build --network host --build-arg BASE_IMAGE=$BASE --build-arg MXTRAIN_CUDA=OFF`
#     from a clean copy of the work tree (tracked and untracked-but-not-ignored files: no
#     build/, no virtual environments), tagged $IMAGE (default mxtrain:cpu); the build's time
#     is printed. MXTRAIN_DOCKER_REBUILD=0 reuses an existing $IMAGE instead.
#  4. Runs the image as SageMaker does (`docker run --network none --hostname algo-1
#     -v ROOT:/opt/ml IMAGE train`, ROOT an /opt/ml tree laid out like make_root() in
#     tests/python/test_sagemaker_entrypoint.py) and checks, printing PASS / FAIL for each:
#       - sshd's configuration test, and a root login over ssh with the image's shared key;
#       - a short tiny-preset job: exit 0, checkpoints, the Hugging Face model, metrics;
#       - a bad hyperparameter: exit 2 and output/failure;
#       - a longer job stopped with `docker stop -t 60` (SIGTERM to PID 1): exit 143 and a
#         checkpoint of the stopped step; a second `docker run` resumes there and finishes;
#       - the same with sagemaker.processes_per_host=2 (mpirun inside the container, as root).
#     The containers get OMP_NUM_THREADS=1 / OPENBLAS_NUM_THREADS=1 (small machine).
#  Exits 0 when every check passed, 1 otherwise (2 for bad usage / missing tools). Containers
#  it started are removed; the images and the engine's data stay (docker rmi, or remove the
#  data root, to free the disk). Work files go under $MXTRAIN_DOCKER_WORK
#  (default /tmp/mxtrain-docker-check, emptied at the start).
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
IMAGE=${MXTRAIN_DOCKER_IMAGE:-mxtrain:cpu}
BASE=${MXTRAIN_DOCKER_BASE:-mxtrain-local/debian:12}
WORK=${MXTRAIN_DOCKER_WORK:-/tmp/mxtrain-docker-check}
DATA_ROOT=${MXTRAIN_DOCKER_DATA_ROOT:-/var/lib/docker}
REBUILD=${MXTRAIN_DOCKER_REBUILD:-1}
PREFIX=mxcheck-$$   # container names

fails=0
started_dockerd=""
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
die() { echo "error: $*" >&2; exit 2; }

[ "$(id -u)" = 0 ] || die "run as root (dockerd, debootstrap, docker import)"
command -v docker >/dev/null || die "docker missing (apt-get install docker.io)"
command -v python3 >/dev/null || die "python3 missing (the checks read JSON with it)"

# shellcheck disable=SC2317  # (called by the EXIT trap)
cleanup() {
  local ids
  ids=$(docker ps -aq --filter "name=^$PREFIX-" 2>/dev/null)
  # shellcheck disable=SC2086
  [ -n "$ids" ] && docker rm -f $ids >/dev/null 2>&1
  if [ -n "$started_dockerd" ]; then
    kill "$started_dockerd" 2>/dev/null
    for _ in $(seq 60); do kill -0 "$started_dockerd" 2>/dev/null || break; sleep 1; done
    echo "docker_check: stopped the dockerd it started (pid $started_dockerd)"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rm -rf "$WORK"
mkdir -p "$WORK" || die "cannot create $WORK"

# --- 1. the engine ---------------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  command -v dockerd >/dev/null || die "dockerd missing (apt-get install docker.io)"
  mkdir -p "$DATA_ROOT"
  # overlay2 where the kernel has overlayfs and the data root is not itself on overlayfs
  # (vfs copies every layer in full for every build step and container: many times slower).
  driver=${MXTRAIN_DOCKER_STORAGE_DRIVER:-}
  if [ -z "$driver" ]; then
    driver=vfs
    if grep -qw overlay /proc/filesystems && [ "$(stat -f -c %T "$DATA_ROOT")" != overlayfs ]; then
      driver=overlay2
    fi
  fi
  echo "docker_check: starting dockerd ($driver, data root $DATA_ROOT, log $WORK/dockerd.log)"
  dockerd --storage-driver "$driver" --bridge=none --iptables=false --data-root "$DATA_ROOT" \
    >"$WORK/dockerd.log" 2>&1 &
  started_dockerd=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || die "dockerd did not come up: $(tail -3 "$WORK/dockerd.log")"
fi

# --- 2. the base image -----------------------------------------------------------------------
apt_uri() {  # the first URIs: / deb line of this machine's apt sources whose path ends in $1
  local f
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list; do
    [ -f "$f" ] || continue
    grep -hoE '^(URIs:[[:space:]]*|deb[[:space:]]+(\[[^]]*\][[:space:]]+)?)[a-z]+://[^[:space:]]+' \
      "$f" | grep -oE '[a-z]+://[^[:space:]]+' | grep -E "$1/?\$" | head -1 && return
  done
}
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  mirror=${MXTRAIN_DEBIAN_MIRROR:-$(apt_uri /debian)}
  security=${MXTRAIN_DEBIAN_SECURITY_MIRROR:-$(apt_uri /debian-security)}
  [ -n "$mirror" ] || die "no Debian mirror in this machine's apt sources: set MXTRAIN_DEBIAN_MIRROR"
  security=${security:-${mirror%/debian}/debian-security}
  if ! command -v debootstrap >/dev/null; then
    { apt-get update && apt-get install -y debootstrap; } >"$WORK/apt.log" 2>&1 ||
      die "apt-get install debootstrap failed (log $WORK/apt.log)"
  fi
  rootfs="$WORK/deb12root"
  echo "docker_check: making $BASE: debootstrap --variant=minbase bookworm from $mirror"
  t0=$SECONDS
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$WORK/debootstrap.log" 2>&1 ||
    die "debootstrap failed: $(tail -3 "$WORK/debootstrap.log")"
  rm -f "$rootfs/etc/apt/sources.list"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import -c 'CMD ["/bin/bash"]' - "$BASE" >/dev/null ||
    die "docker import failed"
  rm -rf "$rootfs"
  echo "docker_check: $BASE made in $((SECONDS - t0)) s"
fi

# --- 3. the image ----------------------------------------------------------------------------
if [ "$REBUILD" != 0 ] || ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  ctx="$WORK/context"
  mkdir -p "$ctx"
  (cd "$REPO" && git ls-files -z -co --exclude-standard |
     while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
     tar --null -T - -c) | tar -x -C "$ctx" || die "cannot copy the work tree to $ctx"
  echo "docker_check: docker build -t $IMAGE (log $WORK/build.log)"
  t0=$SECONDS
  if docker build --network host --build-arg BASE_IMAGE="$BASE" --build-arg MXTRAIN_CUDA=OFF \
      -t "$IMAGE" "$ctx" >"$WORK/build.log" 2>&1; then
    pass "docker build ($((SECONDS - t0)) s)"
  else
    fail "docker build ($((SECONDS - t0)) s): $(tail -5 "$WORK/build.log")"
    exit 1
  fi
  rm -rf "$ctx"
fi
echo "docker_check: image $IMAGE, $(docker image inspect -f '{{.Size}}' "$IMAGE") bytes"

# --- 4. the checks ---------------------------------------------------------------------------
if docker run --rm --network none --entrypoint /usr/sbin/sshd "$IMAGE" -t >"$WORK/sshd.log" 2>&1; then
  pass "sshd -t (configuration test)"
else
  fail "sshd -t: $(tail -3 "$WORK/sshd.log")"
fi
if docker run --rm --network none --entrypoint /bin/bash "$IMAGE" -c \
    '/usr/sbin/sshd && ssh -o BatchMode=yes localhost echo ssh-ok' >"$WORK/ssh.log" 2>&1 &&
   grep -qx ssh-ok "$WORK/ssh.log"; then
  pass "ssh root@localhost with the image's key (sshd started in the container)"
else
  fail "ssh into the container's sshd: $(tail -3 "$WORK/ssh.log")"
fi

TINY='"model.preset": "tiny", "train.seq_len": "32", "train.micro_batch": "2",
  "train.eval_every": "0", "run.sample_tokens": "0", "train.warmup_steps": "2"'

make_root() {  # make_root NAME '"extra": "hyperparameters", ...' -> prints the tree's path
  local root="$WORK/$1/opt_ml"
  mkdir -p "$root/input/config" "$root/input/data/train"
  echo "{$TINY, $2}" >"$root/input/config/hyperparameters.json"
  cat >"$root/input/config/resourceconfig.json" <<'EOF'
{"current_host": "algo-1", "current_instance_type": "ml.c5.xlarge",
 "current_group_name": "homogeneousCluster", "hosts": ["algo-1"],
 "network_interface_name": "eth0"}
EOF
  echo '{"train": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated",
  "RecordWrapperType": "None"}}' >"$root/input/config/inputdataconfig.json"
  # the train channel's one file: English text (the repository's own documentation)
  cat "$REPO"/README.md "$REPO"/docs/*.md | head -c 40000 >"$root/input/data/train/corpus.txt"
  echo "$root"
}

sm_run() {  # sm_run ROOT NAME [docker run options...] -- what SageMaker runs
  local root=$1 name=$2
  shift 2
  docker run --name "$PREFIX-$name" --hostname algo-1 --network none -v "$root:/opt/ml" \
    -e OMP_NUM_THREADS=1 -e OPENBLAS_NUM_THREADS=1 "$@" "$IMAGE" train
}

steps_of() {  # steps_of ROOT: the committed checkpoints' steps (those with a manifest), ascending
  find "$1/checkpoints" -mindepth 2 -maxdepth 2 -name manifest.json 2>/dev/null |
    sed -n 's|.*/step_0*\([0-9][0-9]*\)/manifest.json$|\1|p' | sort -n
}

metrics_check() {  # metrics_check ROOT EXPECTED_SUMMARY_STEPS [WORLD_SIZE]: summary line agrees
  python3 - "$1/output/data/metrics.jsonl" "$2" "${3:-1}" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
summary = [o for o in lines if o.get("summary")][-1]
assert summary["steps"] == int(sys.argv[2]), summary
assert summary.get("world_size", 1) == int(sys.argv[3]), summary
EOF
}

model_check() {  # model_check ROOT: config.json + a safetensors file with the tiny shapes
  python3 - "$1/model" <<'EOF'
import json, struct, sys
d = sys.argv[1]
cfg = json.load(open(d + "/config.json"))
assert cfg["model_type"] == "llama" and cfg["hidden_size"] == 64, cfg
with open(d + "/model.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
assert header["model.embed_tokens.weight"]["shape"] == [256, 64], header["model.embed_tokens.weight"]
EOF
}

# 4a. a short job
root=$(make_root short '"train.steps": "6", "checkpoint.every": "3"')
t0=$SECONDS
sm_run "$root" short >"$WORK/short.log" 2>&1
rc=$?
steps=$(steps_of "$root" | tr '\n' ' ')
if [ "$rc" = 0 ] && [ "$steps" = "3 6 " ] && metrics_check "$root" 6 2>>"$WORK/short.log" &&
   model_check "$root" 2>>"$WORK/short.log" && [ ! -e "$root/output/failure" ]; then
  pass "train, 6 steps ($((SECONDS - t0)) s): exit 0, checkpoints at 3 6, HF model, metrics"
else
  fail "train, 6 steps: exit $rc, checkpoints [$steps] (log $WORK/short.log): $(tail -3 "$WORK/short.log")"
fi

# 4b. bad input
root=$(make_root bad '"train.stepz": "6"')
sm_run "$root" bad >"$WORK/bad.log" 2>&1
rc=$?
if [ "$rc" = 2 ] && grep -q '^error:' "$root/output/failure" 2>/dev/null; then
  pass "bad hyperparameter: exit 2, output/failure: $(head -c 100 "$root/output/failure")"
else
  fail "bad hyperparameter: exit $rc (log $WORK/bad.log)"
fi

# 4c/4d. stop with docker stop (SIGTERM to PID 1) after the first checkpoint, then resume
stop_and_resume() {  # stop_and_resume NAME TOTAL_STEPS EVERY PROCESSES
  local name=$1 total=$2 every=$3 procs=$4 root rc first stopped t0 dt log=$WORK/$1
  root=$(make_root "$name" "\"train.steps\": \"$total\", \"checkpoint.every\": \"$every\",
    \"checkpoint.keep\": \"3\", \"sagemaker.processes_per_host\": \"$procs\"")
  sm_run "$root" "$name" -d >/dev/null || { fail "$name: docker run -d"; return; }
  for _ in $(seq 2400); do
    first=$(steps_of "$root" | head -1)
    [ -n "$first" ] && break
    [ "$(docker inspect -f '{{.State.Running}}' "$PREFIX-$name")" = true ] || break
    sleep 0.1
  done
  if [ -z "$first" ] || [ "$(docker inspect -f '{{.State.Running}}' "$PREFIX-$name")" != true ]; then
    docker logs "$PREFIX-$name" >"$log.1.log" 2>&1
    fail "$name: no checkpoint while running (log $log.1.log)"
    return
  fi
  t0=$SECONDS
  docker stop -t 60 "$PREFIX-$name" >/dev/null
  dt=$((SECONDS - t0))
  rc=$(docker wait "$PREFIX-$name")
  docker logs "$PREFIX-$name" >"$log.1.log" 2>&1
  docker rm "$PREFIX-$name" >/dev/null
  stopped=$(steps_of "$root" | tail -1)
  if [ "$rc" = 143 ] && [ -n "$stopped" ] && [ "$stopped" -lt "$total" ] &&
     grep -q "stopped by signal 15 at step $stopped; checkpoint " "$log.1.log" &&
     [ ! -e "$root/model/model.safetensors" ] && [ ! -e "$root/output/failure" ]; then
    pass "$name: docker stop -t 60 -> exit 143 in ${dt} s, checkpoint of the stopped step $stopped"
  else
    fail "$name: docker stop -> exit $rc, last checkpoint ${stopped:-none} (log $log.1.log): $(tail -3 "$log.1.log")"
    return
  fi
  if [ "$procs" -gt 1 ]; then
    if grep -q "sagemaker: mpirun --host localhost:$procs -np $procs" "$log.1.log" &&
       python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["world_size"] == int(sys.argv[2])' \
         "$(printf '%s/checkpoints/step_%08d/state.json' "$root" "$stopped")" "$procs"; then
      pass "$name: mpirun ran $procs ranks; the stop checkpoint has world_size $procs"
    else
      fail "$name: no mpirun with $procs ranks (log $log.1.log)"
    fi
  fi
  t0=$SECONDS
  sm_run "$root" "$name-resume" >"$log.2.log" 2>&1
  rc=$?
  docker rm "$PREFIX-$name-resume" >/dev/null 2>&1
  if [ "$rc" = 0 ] &&
     grep -q "resumed from $(printf '/opt/ml/checkpoints/step_%08d' "$stopped") at step $stopped" "$log.2.log" &&
     metrics_check "$root" "$total" "$procs" 2>>"$log.2.log" && model_check "$root" 2>>"$log.2.log"; then
    pass "$name: the second docker run resumed at step $stopped and finished $total steps ($((SECONDS - t0)) s), HF model"
  else
    fail "$name: resume: exit $rc (log $log.2.log): $(tail -3 "$log.2.log")"
  fi
}
stop_and_resume stop-1proc 2000 20 1
stop_and_resume stop-2proc 1500 25 2

if [ "$fails" = 0 ]; then
  echo "docker_check: all checks passed"
  exit 0
fi
echo "docker_check: $fails check(s) failed"
exit 1
