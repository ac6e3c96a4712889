#!/usr/bin/env bash
# The prepared GPU check (DESIGN.md, "GPU work"; docs/cuda.md): run on a lent Hopper GPU (an H100
# 80 GB, the device tool's first kind, or an H200; the runs so far were on an H200) through the
# device tool, from the repository root, after bench/gpu/prepare.sh here:
#   run(command="bash bench/gpu/check.sh", carry=[".gpu-prebuilt"], timeout_s=540)
# Everything it writes is under $OUT (check.log, op_check.json/.txt, loss_match.json,
# speed.json, errors.txt, runs_stderr.tgz: seven files, the device tool returns at most eight);
# it prints a short table at the end. The whole script keeps to a budget
# (MXTRAIN_GPU_BUDGET_S, default 460 s: under 8 minutes), and every step has its own time limit
# cut to what is left, so one hang cannot eat the lease.
#
# Steps:
#   1. binaries: the ones prepare.sh built here (sm_90) and carried in .gpu-prebuilt/bundle.tar.xz
#      with their non-CUDA libraries; without them (or MXTRAIN_GPU_BUILD=1) a native build
#      (needs the OpenMPI, OpenBLAS, nlohmann-json, libcurl, OpenSSL dev packages there)
#   2. every CUDA op against the CPU backend + quantizer byte identity (op_check.json), the
#      cuDNN attention against its bf16 CPU twin; says which attention the 1B shape gets
#   3. 50-step loss match of `mxtrain train`, tiny preset, run.device = cuda vs cpu (same seed,
#      same text; under a recipe both with precision.activations = bf16, the GPU's default):
#      max relative loss difference per step; tolerance 1e-4 (fp32), 2e-3 (recipe
#      bf16: CUDA's bf16 GEMM vs the CPU's emulation), 5e-3 (fp8-current, fp8-delayed: FP8
#      tensor-core GEMMs vs the CPU's emulation; a guess until measured), all four with the
#      fp32 attention kernel; then bf16+cudnn: recipe bf16 with cuDNN's bf16 attention (5e-3,
#      a guess) (loss_match.json). After step 4's FP8 rows, with 90 s of the budget left, the
#      trainer's paths no GPU run had reached (MXTRAIN_GPU_FEATURE_RECIPES): fp8-delayed+fp8attn
#      (precision.fp8_attention: cuDNN's fused FP8 SDPA against the CPU twin, 2e-2),
#      fp8-delayed+fp8head (precision.fp8_head: the head's FP8 GEMMs, 5e-3), fp8-block+wide,
#      bf16+ckpt (activation checkpointing full, 2 micro-batches a step), fp32+tf32,
#      fp8-delayed+emulate (MXTRAIN_CUDA_FP8=emulate) and fp8-current+stats+hp (telemetry
#      every 10 steps, the last block in bf16) the same way; then resume on the GPU
#      (MXTRAIN_GPU_RESUME_STEPS, 20: straight against half and a resume, bit for bit expected;
#      then again with run.deterministic = true on cuDNN's attention, row "bf16 resume det")
#      and generation (sampled, one seed) on cuda against cpu (rows "bf16 resume" and "generate"),
#      and the two memory errors (rows "gpu memory", "scratch full": one error line, exit 2)
#   4. tokens/s and MFU, Llama-3.2-1B shape, seq 8192 (head in bf16, precision.high_precision; attention: the
#      default, cuDNN where it loads, the table's last column says which ran): mxtrain with recipe
#      bf16, then PyTorch (fp32 master weights, BF16 autocast, SDPA, torch.compile per block,
#      fused AdamW) on the same shape, then mxtrain under the recipes that run natively on an
#      H200's tensor cores (fp8-delayed, fp8-current, fp8-block; FP8/BF16 ratio in the table;
#      on compute capability 10.x fp8-block runs natively too, its block scales as E8M0 on the
#      MXFP8 GEMM, and its row says so; mxfp8 and nvfp4 only on 10.x, where they run natively:
#      a "skipped" row each elsewhere, an H200 included), and fp8-delayed with the attention in
#      FP8 too ("mx fp8-delayed fp8attn", precision.fp8_attention; its ratio to bf16 is the
#      target's line), and with the head's GEMMs in FP8 as well ("mx fp8-delayed fp8attn-head",
#      precision.fp8_head; its ratio to bf16 a line too) (speed.json). Every mxtrain speed run
#      is profiled (run.profile), and the table lists each one's top ops; PyTorch profiles one
#      more step after its timed ones (torch.profiler, its top 15 kernels), for a side-by-side.
#      Each mxtrain speed row also carries `mxtrain plan`'s prediction for its config on this
#      GPU (row "plan ...": modelled tokens/s, measured / modelled, the modelled step split),
#      the figures to check and recalibrate the planner with (docs/plan.md, Calibration).
#      From 16384 tokens per micro-batch down to the largest that fits; mxtrain tries activation
#      checkpointing none, then full.
#      Then, if the budget has 120 s left, the issue's second shape, seq 4096
#      (MXTRAIN_GPU_SEQ2): mxtrain bf16, PyTorch and mxtrain fp8-delayed (about 85 s on the
#      H200 by the seq-8192 runs' times). Then the diagnostic variants, each if the budget has
#      40 s left: recipe bf16 with untuned GEMMs ("mx bf16 notune",
#      MXTRAIN_CUDA_GEMM_TUNE=0: the heuristic's first algorithm at every shape, against the
#      default's fastest of eight); fp8-delayed with cuBLASLt's
#      fast accumulation on its forward GEMMs ("mx fp8-delayed fastacc",
#      MXTRAIN_CUDA_FP8_FAST_ACCUM=fprop, as Transformer Engine runs them; its ratio to the
#      plain fp8-delayed row a line); fp8-block with every cast's
#      untuned form ("mx fp8-block casts0", MXTRAIN_CUDA_CAST_TUNE=0: the tiled kernels,
#      against the fastest of each cast's forms); fp8-delayed
#      without x^T's FP8 codes kept by the forward ("mx fp8-delayed savext0",
#      MXTRAIN_FP8_SAVE_XT=0: the backward reads h1, h2 and s again, and the activations arena
#      holds their bf16 codes; down's cast no longer makes s from g and u itself);
#      fp8-delayed with SwiGLU fused into neither the down projection's cast nor
#      gate's and up's backward casts ("mx fp8-delayed fuse0", MXTRAIN_FP8_FUSE_SWIGLU=0);
#      fp8-block with SwiGLU fused into neither the down
#      projection's cast nor gate's and up's backward casts ("mx fp8-block fuse0",
#      MXTRAIN_FP8_FUSE_SWIGLU=0); fp8-block without x^T's codes
#      kept by the forward ("mx fp8-block savext0", MXTRAIN_FP8_SAVE_XT=0);
#      last, if it still has 40 s: recipe bf16 with
#      precision.activations = fp32 ("mx bf16/a32"), to measure what the default bf16
#      activations cost or save.
#
# Dry run without a GPU (tests/python/test_gpu_check.py; docs/cuda.md, "Running the GPU check"):
# these variables, each changing nothing when unset, point the script at mxemu's binaries
# (docs/cuda_emu.md) and shrink every step to seconds. They check the script's glue (arguments,
# JSON rows, the table, file names, exit code), not the GPU.
#   MXTRAIN_GPU_BINDIR           a directory with `mxtrain` and `cuda_op_check` (e.g. symlinks to
#                                mxtrain_emu and cuda_emu_op_check), used instead of step 1
#   MXTRAIN_GPU_PYTHON           the Python for every Python step (default python3); it must
#                                have torch for the PyTorch row
#   MXTRAIN_GPU_WORK             the scratch directory (default /tmp): mxgpu-runs, the corpus...
#   MXTRAIN_GPU_THREADS          OMP threads of the op check and the loss match's CPU runs (16)
#   MXTRAIN_GPU_OPCHECK_FILTER   the op check's --filter (comma list of op-name substrings; all)
#   MXTRAIN_GPU_LOSS_RECIPES     the loss match's recipes (fp32 bf16 fp8-current fp8-delayed
#                                bf16+cudnn), MXTRAIN_GPU_LOSS_STEPS its steps (50)
#   MXTRAIN_GPU_FEATURE_RECIPES  the trainer paths' loss-match rows (fp8-delayed+fp8attn
#                                fp8-delayed+fp8head fp8-block+wide bf16+ckpt fp32+tf32
#                                fp8-delayed+emulate
#                                fp8-current+stats+hp; set empty: none)
#   MXTRAIN_GPU_RESUME_STEPS     the resume check's steps (20: 10, a resume, 10 more)
#   MXTRAIN_GPU_SEQ              the speed runs' sequence length (8192), MXTRAIN_GPU_TOKENS the
#                                tokens of the largest micro-batch tried (16384)
#   MXTRAIN_GPU_SEQ2             the second shape's sequence length (4096; 0: none)
#   MXTRAIN_GPU_PRESET           the speed runs' model preset, mxtrain's and PyTorch's (llama3.2-1b)
#   MXTRAIN_GPU_HD_SETS          below compute capability 10, the FP8-attention rows' model sets
#                                (cuDNN's FP8 backward takes head dim 128 only there; default for
#                                llama3.2-1b: 16 heads of 128, KV 4; empty: none, the preset's)
#   MXTRAIN_GPU_SPEED_SETS       extra KEY=VALUE overrides (space-separated) for mxtrain's speed
#                                runs, e.g. "model.hidden_size=128 model.intermediate_size=256"
#   MXTRAIN_GPU_TORCH_ARGS       extra torch_llama.py arguments, e.g. "--device cpu --no-compile"
set -uo pipefail
OUT=${OUT:-/tmp/mxtrain-gpu-out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)  # absolute: the script changes directory below
# The rows are appended: a rerun into the same $OUT must not report the last run's rows too.
rm -f "$OUT"/{check.log,op_check.json,op_check.txt,loss_match.json,speed.json,errors.txt,runs_stderr.tgz}
log="$OUT/check.log"
exec > >(tee -a "$log") 2>&1
cd "$(dirname "$0")/../.."
py=${MXTRAIN_GPU_PYTHON:-python3}
work=${MXTRAIN_GPU_WORK:-/tmp}
threads=${MXTRAIN_GPU_THREADS:-16}
t_start=$(date +%s)
t_end=$(( t_start + ${MXTRAIN_GPU_BUDGET_S:-460} ))
# Seconds a step may take: its own cap, or what is left of the budget less a margin.
cap() { local left=$(( t_end - $(date +%s) - 15 )); (( left < 1 )) && left=1; (( $1 < left )) && echo "$1" || echo "$left"; }
rm -rf "$work/mxgpu-runs"  # a rerun on a warm machine must not read the last run's metrics
echo "== mxtrain GPU check: commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
nvcc --version | tail -1 || true

# cuBLASLt / NCCL / cudart / cuDNN from the Python wheels, when the toolkit's own are not on the
# path. libcudnn is never carried (hundreds of MB): the attention opens it at run time (dlopen),
# from the nvidia-cudnn-cu13 wheel's lib directory here.
py_libs=$("$py" - <<'PY' 2>/dev/null
import importlib, os
dirs = []
for m in ("nvidia.cublas", "nvidia.nccl", "nvidia.cu13", "nvidia.cuda_runtime", "nvidia.cudnn"):
    try:
        p = importlib.import_module(m)
        for base in list(getattr(p, "__path__", [])):
            for sub in ("lib", "lib64"):
                d = os.path.join(base, sub)
                if os.path.isdir(d): dirs.append(d)
    except Exception:
        pass
print(":".join(dirs))
PY
)
# Only the mxtrain programs get this path: the carried libstdc++ etc. must not reach python3.
mx_ld="/usr/local/cuda/lib64:${py_libs}:${LD_LIBRARY_PATH:-}"

# ---- 1. binaries -------------------------------------------------------------------------------
t0=$(date +%s)
bindir=""
if [ -n "${MXTRAIN_GPU_BINDIR:-}" ]; then
  for b in mxtrain cuda_op_check; do
    [ -x "$MXTRAIN_GPU_BINDIR/$b" ] ||
      { echo "error: MXTRAIN_GPU_BINDIR=$MXTRAIN_GPU_BINDIR has no executable $b"; exit 2; }
  done
  bindir=$(cd "$MXTRAIN_GPU_BINDIR" && pwd)
  echo "binaries from MXTRAIN_GPU_BINDIR=$bindir"
elif [ "${MXTRAIN_GPU_BUILD:-0}" != 1 ] && [ -f .gpu-prebuilt/bundle.tar.xz ]; then
  # tar -J needs the xz program, which a bare image may lack: Python's tarfile as the fallback
  rm -rf "$work/mxgpu" && mkdir -p "$work/mxgpu" &&
    { tar -C "$work/mxgpu" -xJf .gpu-prebuilt/bundle.tar.xz 2>/dev/null ||
      "$py" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
        .gpu-prebuilt/bundle.tar.xz "$work/mxgpu"; } &&
    bindir="$work/mxgpu/prebuilt" && mx_ld="$bindir/lib:$mx_ld"
  echo "prebuilt binaries from .gpu-prebuilt (commit $(cat "$work/mxgpu/prebuilt/COMMIT" 2>/dev/null))"
fi
if [ -z "$bindir" ]; then
  if timeout "$(cap 60)" cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release \
       -DCMAKE_CUDA_ARCHITECTURES=90 -DMXTRAIN_TESTS=OFF > "$work/mxgpu-configure.log" 2>&1 &&
     timeout "$(cap 240)" cmake --build build-gpu --target cuda_op_check mxtrain mxcuda_plugin -j16 \
       > "$work/mxgpu-build.log" 2>&1; then
    bindir=build-gpu
  else
    echo "native build failed (tails of configure.log / build.log):"
    tail -5 "$work/mxgpu-configure.log"; tail -20 "$work/mxgpu-build.log" 2>/dev/null
  fi
fi
echo "binaries: $(( $(date +%s) - t0 )) s"
# prepare.sh's hashes of the sources the bundle was built from (SOURCES.sha256 beside the
# binaries), against this tree's: a bundle not rebuilt after a change is said at once.
if [ -f "$bindir/SOURCES.sha256" ]; then
  stale=$(sha256sum -c "$bindir/SOURCES.sha256" 2>/dev/null | grep -v ': OK$' | cut -d: -f1 || true)
  if [ -n "$stale" ]; then
    echo "WARNING: the binaries were built from other sources than this tree's ($(echo "$stale" |
      wc -l) files differ or are missing, e.g. $(echo "$stale" | head -3 | tr '\n' ' ')): their rows test those; run bench/gpu/prepare.sh again"
  fi
fi
if [ -z "$bindir" ]; then
  echo "RESULT: no binaries (neither carried nor built); see the tails above"
  exit 3
fi
# (mxtrain loads its CUDA backend, libmxcuda.so beside it, at the first run.device = cuda; the
# emulated build links its own)
libs=$(LD_LIBRARY_PATH="$mx_ld" ldd "$bindir/mxtrain" "$bindir/cuda_op_check" \
  $([ -e "$bindir/libmxcuda.so" ] && echo "$bindir/libmxcuda.so") 2>&1 || true)
# A library the loader cannot find ends every mxtrain run and the op check at once: stop here,
# with the device time left for a rerun, rather than spend it on rows that all fail.
missing=$(echo "$libs" | grep "not found" | awk '{print $1}' | sort -u | tr '\n' ' ')
if [ -n "$missing" ]; then
  echo "RESULT: the binaries cannot load: ${missing}not found (LD_LIBRARY_PATH=$mx_ld):" \
    "the bundle's lib/ has all but cuBLAS, NCCL and cudart, which come from the toolkit or" \
    "$py's nvidia-* wheels; nothing else run"
  exit 3
fi
# Which CUDA libraries the binaries resolve (the toolkit's or the wheels'), and the reference's
# versions: what a failure below would first be checked against.
echo "$libs" | awk '/(cublasLt|nccl|cudart)[^ ]* => \//{print "  " $1 " => " $3}' | sort -u
"$py" -c "import torch; print('  torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())" 2>/dev/null ||
  echo "  torch: not importable by $py"
# libcudnn is not a link dependency (dlopen'ed by the attention): say here whether it is there.
cudnn_so=""
for d in ${mx_ld//:/ }; do [ -e "$d/libcudnn.so.9" ] && { cudnn_so="$d/libcudnn.so.9"; break; }; done
[ -z "$cudnn_so" ] && cudnn_so=$(ldconfig -p 2>/dev/null | awk '/libcudnn\.so\.9 /{print $NF; exit}')
if [ -n "$cudnn_so" ]; then echo "cudnn: $cudnn_so"
else echo "cudnn: libcudnn.so.9 NOT FOUND on the library path: attention runs the fp32 kernel," \
  "the op check's attention_cudnn_* cases fail with the loader's message"; fi

# ---- 2. op check -------------------------------------------------------------------------------
t0=$(date +%s)
opcheck_rc=0
opcheck_args=(--json "$OUT/op_check.json")
[ -n "${MXTRAIN_GPU_OPCHECK_FILTER:-}" ] && opcheck_args+=(--filter "$MXTRAIN_GPU_OPCHECK_FILTER")
# (at the limit SIGTERM: the op check skips the cases left, writes the JSON of those that ran,
# marked "stopped", and exits 124; -k: a case stuck on the GPU is killed 10 s later)
LD_LIBRARY_PATH="$mx_ld" OMP_NUM_THREADS=$threads timeout -k 10 "$(cap 100)" "$bindir/cuda_op_check" \
  "${opcheck_args[@]}" > "$OUT/op_check.txt" 2>&1 || opcheck_rc=$?
echo "op check: exit $opcheck_rc, $(( $(date +%s) - t0 )) s"
grep -c '^PASS' "$OUT/op_check.txt" | sed 's/^/  PASS cases: /'
grep -c '^FAIL' "$OUT/op_check.txt" | sed 's/^/  FAIL cases: /'
# Short table: per op, cases passed / total and the worst err/tol (the header first, then the
# ops sorted).
printf "  %-28s %9s %10s\n" op pass/all "worst e/t"
awk '/^(PASS|FAIL)/{op=$2; n[op]++; if($1=="PASS")p[op]++;
       for(i=1;i<=NF;i++) if($i ~ /^err\/tol=/){split($i,a,"="); if(a[2]+0>w[op]) w[op]=a[2]+0}}
     END{for(o in n) printf "  %-28s %4d/%-4d %10.3g\n",o,p[o],n[o],w[o]}' \
  "$OUT/op_check.txt" | sort
grep '^FAIL' "$OUT/op_check.txt" | head -20
grep '^attention path' "$OUT/op_check.txt" | sed 's/^/  /'
tail -3 "$OUT/op_check.txt"

# ---- 3. loss match -----------------------------------------------------------------------------
t0=$(date +%s)
corpus="$work/mxgpu-corpus.txt"
cat docs/*.md README.md bench/*.md > "$corpus"
recipes=${MXTRAIN_GPU_LOSS_RECIPES:-fp32 bf16 fp8-current fp8-delayed bf16+cudnn}
loss_match() {  # loss_match CAP RECIPE...: mxtrain_runs.py loss-match within CAP seconds
  local limit=$1 rc=0
  shift
  MXTRAIN_LD_LIBRARY_PATH="$mx_ld" timeout -k 10 "$limit" "$py" bench/gpu/mxtrain_runs.py \
    loss-match --bin "$bindir/mxtrain" --corpus "$corpus" --work "$work/mxgpu-runs" \
    --threads "$threads" --limit 25 --recipes "$@" --steps "${MXTRAIN_GPU_LOSS_STEPS:-50}" \
    --json "$OUT/loss_match.json" > /dev/null 2>> "$OUT/errors.txt" || rc=$?
  missing_rows "$rc" loss-match "$@"
  return $rc
}
# A recipe (or check) that mxtrain_runs.py did not reach (its time limit, a crash) gets a row
# saying so, so the table shows it instead of leaving it out.
missing_rows() {  # missing_rows RC WHAT NAME...
  "$py" - "$OUT/loss_match.json" "$@" <<'PY'
import json, sys
path, rc, what, asked = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
done = set()
try:
    for line in open(path):
        try:
            done.add(json.loads(line)["recipe"])
        except (ValueError, KeyError):
            pass
except FileNotFoundError:
    pass
why = f"no result: mxtrain_runs.py {what} exit {rc}" + (" (time limit)" if rc in ("124", "137") else "")
with open(path, "a") as f:
    for r in asked:
        if r not in done:
            f.write(json.dumps({"check": what.replace("-", "_"), "recipe": r, "ok": False,
                                "error": why}) + "\n")
PY
}
loss_rc=0
# (word-split on purpose: a list of recipe names)
# shellcheck disable=SC2086
loss_match "$(cap 90)" $recipes || loss_rc=$?
echo "loss match: exit $loss_rc, $(( $(date +%s) - t0 )) s"

# ---- 4. speed, seq 8192: mxtrain bf16, PyTorch, then mxtrain under the FP8 recipes --------
t0=$(date +%s)
seq=${MXTRAIN_GPU_SEQ:-8192}
preset=${MXTRAIN_GPU_PRESET:-llama3.2-1b}
speed_sets=()
for kv in ${MXTRAIN_GPU_SPEED_SETS:-}; do speed_sets+=(--set "$kv"); done
# Compute capability: 9.x runs fp8-block on cuBLASLt's 1x128 / 128x128 scale modes, 10.x on the
# MXFP8 GEMM (E8M0 scales converted from the power-of-two block scales), and only 10.x runs
# mxfp8 and nvfp4 natively.
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
set_batches() {  # the micro-batches tried at $seq: the largest of MXTRAIN_GPU_TOKENS, halving
  local b=$(( ${MXTRAIN_GPU_TOKENS:-16384} / seq ))
  batches=""
  while (( b >= 1 )); do batches="$batches $b"; b=$(( b / 2 )); done
}
set_batches
# Every mxtrain speed run is profiled (run.profile: one CUDA event as each op finishes
# queueing, resolved while the GPU works), so the one GPU session also says where the time goes.
# Order: what the issue's targets compare comes first (mxtrain bf16, PyTorch, then fp8-delayed,
# fp8-current, fp8-block), so a budget cut short loses the least. fp8-delayed leads the FP8
# runs: Transformer Engine's default recipe, and the one with the least quantization traffic
# here (its amax comes from the cast; docs/cuda.md).
lines() { cat "$1" 2>/dev/null | wc -l; }
# no_row IMPL RECIPE RC ERR_LINES [ACTIVATIONS]: the speed.json row of a run that died before
# writing its own (a crash, bad arguments, its time limit), so the table shows it did not run
# instead of leaving it out: its exit code and the last line it wrote to errors.txt (after line
# ERR_LINES).
no_row() {  # no_row IMPL RECIPE RC ERRORS_BEFORE [ACTIVATIONS [VARIANT]]
  local why="exit $3"
  (( $3 == 124 || $3 == 137 )) && why="$why (time limit)"
  "$py" -c 'import json, sys
impl, recipe, seq, act, variant, why = sys.argv[1:]
row = dict(impl=impl, **({"recipe": recipe} if recipe else {}), seq=int(seq), error=why)
if act:
    row["activations"] = act
if variant:
    row["variant"] = variant
print(json.dumps(row))' "$1" "$2" "$seq" "${5:-}" "${6:-}" \
    "$why: $(tail -n +$(( $4 + 1 )) "$OUT/errors.txt" 2>/dev/null | tail -1)" >> "$OUT/speed.json"
}
mx_speed() {  # mx_speed RECIPE [ARGS...]: one profiled mxtrain speed run
  local budget recipe=$1 rc=0 rows errs act="" variant="" a
  shift
  [ "${1:-}" = --activations ] && act=${2:-}
  local -a args=("$@")
  for (( a = 0; a < ${#args[@]}; a++ )); do
    [ "${args[a]}" = --variant ] && variant=${args[a + 1]:-}
  done
  budget=$(cap 50)
  rows=$(lines "$OUT/speed.json"); errs=$(lines "$OUT/errors.txt")
  MXTRAIN_LD_LIBRARY_PATH="$mx_ld" timeout -s KILL "$(( budget + 20 ))" \
    "$py" bench/gpu/mxtrain_runs.py speed --bin "$bindir/mxtrain" --seq "$seq" \
    --recipe "$recipe" --batches $batches --steps 3 --skip 1 --budget "$budget" \
    --limit "$budget" --work "$work/mxgpu-runs" --json "$OUT/speed.json" --profile \
    --preset "$preset" ${speed_sets[@]+"${speed_sets[@]}"} "$@" \
    > /dev/null 2>> "$OUT/errors.txt" || rc=$?
  (( $(lines "$OUT/speed.json") == rows )) &&
    no_row mxtrain "$recipe" "$rc" "$errs" "$act" "$variant"
  return 0
}
export MXTRAIN_CUDA_GEMM_TUNE_LOG=1 MXTRAIN_CUDA_CAST_TUNE_LOG=1
mx_speed bf16
echo "mxtrain bf16 speed: $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
# PyTorch builds its model on the GPU and compiles one block (tens of seconds cold); its
# progress lines (stderr) go to errors.txt, so a run cut short still says how far it got.
torch_speed() {  # one PyTorch speed run at $seq (no row of its own: a row saying why)
  local torch_rc=0 errs rows
  errs=$(lines "$OUT/errors.txt"); rows=$(lines "$OUT/speed.json")
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 timeout -k 10 "$(cap 150)" "$py" bench/gpu/torch_llama.py --seq "$seq" \
    --batches $batches --steps 5 --warmup 2 --json "$OUT/speed.json" --preset "$preset" \
    --profile ${MXTRAIN_GPU_TORCH_ARGS:-} > /dev/null 2>> "$OUT/errors.txt" || torch_rc=$?
  (( torch_rc != 0 )) && echo "torch seq $seq: exit $torch_rc (see errors.txt)"
  # (no torch, a crash, its time limit: a row saying so)
  (( $(lines "$OUT/speed.json") == rows )) && no_row torch "" "$torch_rc" "$errs"
  return 0
}
torch_speed
echo "torch speed: $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
for recipe in fp8-delayed fp8-current fp8-block; do
  mx_speed "$recipe"
done
# fp8-delayed with the attention in FP8 too (precision.fp8_attention: cuDNN's fused FP8 SDPA;
# row "mx fp8-delayed fp8attn"): the 1.3x target's lever (docs/cuda.md), never run on a GPU.
# Below compute capability 10 cuDNN's FP8 backward takes head dim 128 only, which the 1B
# preset's 64 is not (its attention would run on the fp32 kernel): there these rows run the
# 1B widths as 16 heads of 128, KV 4 (MXTRAIN_GPU_HD_SETS; the same GEMMs and attention
# FLOPs), as variants "fp8attn-hd" and "fp8attn-head-hd" beside a bf16 row of that shape
# ("mx bf16 hd"), their ratio lines against it.
hd_sets=()
hd=""
if [[ "$cc" != 1[0-9].* && ( -n "${MXTRAIN_GPU_HD_SETS+x}" || "$preset" == llama3.2-1b ) ]]; then
  for s in ${MXTRAIN_GPU_HD_SETS-model.num_attention_heads=16 model.num_key_value_heads=4 model.head_dim=128}; do
    hd_sets+=(--set "$s")
  done
  (( ${#hd_sets[@]} > 0 )) && hd="-hd"
fi
if [ -n "$hd" ]; then
  mx_speed bf16 --variant hd "${hd_sets[@]}"
fi
mx_speed fp8-delayed --variant "fp8attn$hd" --set precision.fp8_attention=true \
  ${hd_sets[@]+"${hd_sets[@]}"}
# and the head's GEMMs in FP8 as well (precision.fp8_head; row "mx fp8-delayed fp8attn-head"):
# the head is a fifth of the 1B shape's GEMM FLOPs; its data gradient in bf16 (the default
# precision.fp8_head_dgrad, which the convergence study favours); never run on a GPU.
mx_speed fp8-delayed --variant "fp8attn-head$hd" --set precision.fp8_attention=true \
  --set precision.fp8_head=true ${hd_sets[@]+"${hd_sets[@]}"}
# mxfp8 and nvfp4 run natively only on compute capability 10.x (cuBLASLt's VEC32_UE8M0 and
# VEC16_UE4M3 scale modes; an H200 is 9.0, where they would only time the emulation):
# elsewhere a "skipped" row each, no run.
for recipe in mxfp8 nvfp4; do
  if [[ "$cc" == 10.* ]]; then
    mx_speed "$recipe"
  else
    echo "{\"impl\": \"mxtrain\", \"recipe\": \"$recipe\", \"seq\": $seq, \"error\": \"skipped: runs natively on sm_100 only (this GPU: compute capability ${cc:-unknown})\"}" \
      >> "$OUT/speed.json"
  fi
done
echo "mxtrain FP8 speed: $(( $(date +%s) - t0 )) s"
# ---- 5. the trainer's paths no GPU run had reached, if the budget has 90 s left ---------------
# The loss match again (tiny preset, cuda vs cpu) for fp8-block on the GPU's block-scaled GEMM
# (fp8-block+wide: widths of 128, which that GEMM needs),
# recipe bf16 with activation checkpointing and gradient accumulation (bf16+ckpt), fp32 on tf32
# tensor cores (fp32+tf32), the FP8 recipe's emulation on the GPU (fp8-delayed+emulate), and
# numerics telemetry with the last block in high precision (fp8-current+stats+hp)
# (MXTRAIN_GPU_FEATURE_RECIPES, set empty for none; rows in loss_match.json); then resume and generation on the GPU
# (mxtrain_runs.py resume: recipe bf16, MXTRAIN_GPU_RESUME_STEPS = 20 steps straight against
# 10 + a resume to 20, then the same with run.deterministic = true on the default attention and
# GEMM settings, bit for bit or FAIL, then sampled generation, one seed, on cuda against cpu; rows
# "bf16 resume", "bf16 resume det" and "generate"; then a scratch arena larger than the GPU and one too small for an op, rows "gpu
# memory" and "scratch full"). After the speed rows, which the targets need first.
features=${MXTRAIN_GPU_FEATURE_RECIPES-fp8-delayed+fp8attn fp8-delayed+fp8head fp8-block+wide bf16+ckpt fp32+tf32 fp8-delayed+emulate fp8-current+stats+hp}
if (( $(cap 140) >= 90 )); then
  t0=$(date +%s)
  feat_rc=0
  # shellcheck disable=SC2086
  [ -n "$features" ] && { loss_match "$(cap 70)" $features || feat_rc=$?; }
  res_rc=0
  # (ten mxtrain processes: six trainings, two generations, two refused starts)
  MXTRAIN_LD_LIBRARY_PATH="$mx_ld" timeout -k 10 "$(cap 80)" "$py" bench/gpu/mxtrain_runs.py \
    resume --bin "$bindir/mxtrain" --corpus "$corpus" --work "$work/mxgpu-runs" \
    --threads "$threads" --limit 25 --steps "${MXTRAIN_GPU_RESUME_STEPS:-20}" \
    --json "$OUT/loss_match.json" > /dev/null 2>> "$OUT/errors.txt" || res_rc=$?
  missing_rows "$res_rc" resume "bf16 resume" "bf16 resume det" generate "gpu memory" "scratch full"
  echo "features: loss match exit $feat_rc, resume exit $res_rc, $(( $(date +%s) - t0 )) s"
fi
# A speed row of a variant, if the budget has 40 s left: what it is (its line's words), one
# VAR=VALUE setting for its run (- for none), then mx_speed's arguments.
variant_row() {
  local what=$1
  [ "$2" = - ] || local -x "$2"
  shift 2
  if (( $(cap 50) >= 40 )); then
    local t0
    t0=$(date +%s)
    mx_speed "$@"
    echo "$what: $(( $(date +%s) - t0 )) s"
  fi
}
# The issue's second shape, seq 4096 (MXTRAIN_GPU_SEQ2; 0: none), if the budget has 120 s left
# (before the variant rows below: the issue asks for this shape, they are for diagnosis):
# mxtrain bf16, PyTorch and mxtrain fp8-delayed, the same micro-batch rule (16384 tokens and
# down). Their rows carry seq 4096; the table's ratios are per seq.
seq2=${MXTRAIN_GPU_SEQ2:-4096}
# (none where MXTRAIN_GPU_TOKENS holds no whole sequence of it)
if (( seq2 > 0 && seq2 != seq && ${MXTRAIN_GPU_TOKENS:-16384} / seq2 >= 1 )) &&
   (( $(cap 200) >= 120 )); then
  t0=$(date +%s)
  seq1=$seq
  seq=$seq2
  set_batches
  mx_speed bf16
  torch_speed
  mx_speed fp8-delayed
  echo "seq $seq: mxtrain bf16, PyTorch, fp8-delayed: $(( $(date +%s) - t0 )) s"
  seq=$seq1
  set_batches
fi
# GEMM tuning (MXTRAIN_CUDA_GEMM_TUNE; docs/cuda.md, "GEMM tuning"): recipe bf16 with the
# heuristic's first algorithm at every shape instead of the fastest of its first eight (row
# "mx bf16 notune"). Every speed run logs its tuned shapes (MXTRAIN_CUDA_GEMM_TUNE_LOG: a
# "cuda gemm tune: ..." line each, in runs_stderr.tgz).
variant_row "mxtrain bf16, untuned GEMMs" MXTRAIN_CUDA_GEMM_TUNE=0 bf16 --variant notune
# FP8 fast accumulation (MXTRAIN_CUDA_FP8_FAST_ACCUM=fprop; docs/cuda.md, "FP8 fast
# accumulation"): fp8-delayed with cuBLASLt's fast accumulation on its forward GEMMs, as
# Transformer Engine runs them (row "mx fp8-delayed fastacc"), if the budget has 40 s left:
# what it gains against the plain fp8-delayed row (the op check's fp8_gemm_fast_accum cases
# say what it costs in accuracy).
variant_row "mxtrain fp8-delayed, fast accumulation on the forward GEMMs" \
  MXTRAIN_CUDA_FP8_FAST_ACCUM=fprop fp8-delayed --variant fastacc
# Cast tuning (MXTRAIN_CUDA_CAST_TUNE; docs/cuda.md, "Cast tuning"): fp8-block with every
# cast's untuned form (the tiled kernels; row "mx fp8-block casts0") instead of the fastest, if
# the budget has 40 s left. Every speed run logs its tuned casts (MXTRAIN_CUDA_CAST_TUNE_LOG: a
# "cuda cast tune: ..." line each, each form's time and GB/s; summed up in the table).
variant_row "mxtrain fp8-block, untuned casts" MXTRAIN_CUDA_CAST_TUNE=0 fp8-block --variant casts0
# x^T's FP8 codes kept by the forward for the weight gradients (docs/cuda.md): fp8-delayed with
# them off (MXTRAIN_FP8_SAVE_XT=0; row "mx fp8-delayed savext0"), if the budget has 40 s left:
# what they save in time (the table's ratio) and in memory (the rows' peak). Down's input made
# from SwiGLU's operands by its cast needs the kept codes, so the row runs without that too.
variant_row "mxtrain fp8-delayed, x^T codes not kept" \
  MXTRAIN_FP8_SAVE_XT=0 fp8-delayed --variant savext0
# SwiGLU fused into the down projection's cast and into gate's and up's backward casts
# (docs/cuda.md): fp8-delayed with both off (MXTRAIN_FP8_FUSE_SWIGLU=0; row
# "mx fp8-delayed fuse0"), if the budget has 40 s left: what they save (the table's ratio).
variant_row "mxtrain fp8-delayed, SwiGLU not fused" \
  MXTRAIN_FP8_FUSE_SWIGLU=0 fp8-delayed --variant fuse0
# The block-scaled forms of SwiGLU's fusions (down's input from g and u, gate's and up's
# backward operands from SwiGLU's; docs/cuda.md): fp8-block, the block-scaled recipe a Hopper
# GPU runs, with them off (MXTRAIN_FP8_FUSE_SWIGLU=0; row "mx fp8-block fuse0"), if the budget
# has 40 s left: what they save (the table's ratio).
variant_row "mxtrain fp8-block, SwiGLU not fused" \
  MXTRAIN_FP8_FUSE_SWIGLU=0 fp8-block --variant fuse0
# fp8-block's x^T codes (128x1, with their block scales) kept by the forward for the weight
# gradients (docs/cuda.md): with them off (MXTRAIN_FP8_SAVE_XT=0; row "mx fp8-block
# savext0", which also leaves down's input unfused), if the budget has 40 s left.
variant_row "mxtrain fp8-block, x^T codes not kept" \
  MXTRAIN_FP8_SAVE_XT=0 fp8-block --variant savext0
# What bf16 activations (the default under a recipe) cost or save in speed: recipe bf16 with
# precision.activations = fp32, if the budget has room left (it runs last for that reason).
variant_row "mxtrain bf16, fp32 activations" - bf16 --activations fp32

# ---- table -------------------------------------------------------------------------------------
"$py" - "$OUT" "${cc:-unknown}" "$work/mxgpu-runs" "$seq" <<'PY'
import json, re, sys, pathlib
out = pathlib.Path(sys.argv[1])
cc = sys.argv[2]
runs = pathlib.Path(sys.argv[3])
main_seq = int(sys.argv[4])  # the first shape's (the tuning lines are its bf16 run's)
def rows(name):
    p = out / name
    return [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []
for r in rows("loss_match.json"):
    if r.get("check") == "resume" and "max_rel" in r:
        print(f"resume {r['recipe']:15s}: steps {r['resumed_at'] + 1}-{r['steps']} after a resume "
              f"at {r['resumed_at']}, max rel diff {r['max_rel']:.2e} (tolerance "
              f"{r['tolerance_rel']:.0e}), attention {r.get('attention')}, "
              f"{'bit-exact' if r['bit_exact'] else 'NOT bit-exact'}"
              f" -> {'PASS' if r['ok'] else 'FAIL'}")
    elif r.get("check") == "generate" and "same_prefix" in r:
        print(f"generate cuda vs cpu   : sampled, {len(r['ids_cpu'])} ids on cpu, "
              f"{len(r['ids_cuda'])} on cuda, the first {r['same_prefix']} the same -> "
              f"{'PASS' if r['ok'] else 'FAIL'}")
    elif r.get("check") == "memory":
        print(f"memory {r['recipe']:16s}: MXTRAIN_CUDA_SCRATCH_MB={r['scratch_mb']}, exit "
              f"{r['rc']}: {r['error_line']} -> {'PASS' if r['ok'] else 'FAIL'}")
    elif r.get("check") in ("resume", "generate"):
        print(f"{r['check']} {r['recipe']:15s}: FAILED TO RUN {r.get('error')}")
    elif "max_rel" in r:
        print(f"loss match {r['recipe']:11s}: max rel diff {r['max_rel']:.2e} at step "
              f"{r['worst_step']} (tolerance {r['tolerance_rel']:.0e}) -> "
              f"{'PASS' if r['ok'] else 'FAIL'}; last loss cpu {r['loss_last_cpu']:.5f} "
              f"cuda {r['loss_last_cuda']:.5f}; attention {r.get('attention')}" +
              ("" if "native_linears" not in r else
               "; Linears " + ("native" if r["native_linears"] else "emulated")))
    else:
        print(f"loss match {r['recipe']:11s}: FAILED TO RUN {r.get('error')}")
speed = rows("speed.json")
print(f"{'impl':14s} {'seq':>5s} {'batch':>5s} {'ckpt':>5s} {'tok/s':>10s} {'MFU':>6s} attention")
def impl_of(r):  # a speed row's name in the table: "torch", or "mx RECIPE[/a32][ VARIANT]"
    impl = r["impl"] if r["impl"] != "mxtrain" else f"mx {r.get('recipe', 'bf16')}"
    if r.get("activations") == "fp32":
        impl += "/a32"
    if r.get("variant"):
        impl += " " + r["variant"]
    return impl
by = {}
for r in speed:
    if "tokens_per_s" not in r:
        why = r.get("error") or (r.get("tried") or [{}])[-1]
        label = (r["impl"] + " " + r.get("recipe", "") +
                 ("/a32" if r.get("activations") == "fp32" else "") +
                 (" " + r["variant"] if r.get("variant") else ""))
        print(f"{label:14s} {r['seq']:5d}  did not run: {why}")
        continue
    ck = r.get("checkpointing", False)
    ck = ck if isinstance(ck, str) else ("full" if ck else "none")
    impl = impl_of(r)
    native = {True: " (tensor cores)", False: " (EMULATED)"}.get(r.get("fp8_tensor_cores"), "")
    if r.get("fp8_native_linears"):  # the shape keeps some of a block's Linears emulated
        native = f" (tensor cores for {r['fp8_native_linears']} Linears, the others EMULATED)"
    if r.get("recipe") == "fp8-block" and r.get("fp8_tensor_cores"):
        native = (" (tensor cores: MXFP8 GEMM, E8M0 scales)" if cc.startswith("10.")
                  else " (tensor cores: VEC128/BLK128x128 GEMM)")
    if r.get("fp8_shared_operands") is not None:  # FP8 operands taken from a shared input
        native += f" shared {r['fp8_shared_operands']}"
    attn = r.get("attention", "torch sdpa" if r["impl"] == "torch" else None)
    print(f"{impl:14s} {r['seq']:5d} {r['micro_batch']:5d} {ck:>5s} "
          f"{r['tokens_per_s']:10.0f} {100 * r['mfu']:5.1f}% {attn}{native}")
    by[(impl, r["seq"])] = r["tokens_per_s"]
for r in speed:  # mxtrain plan's prediction for each run's config (docs/plan.md, Calibration)
    pl = r.get("plan")
    if not pl or "tokens_per_s" not in r:
        continue
    impl = impl_of(r)
    if "error" in pl:
        print(f"plan {impl:20s} seq {r['seq']}: {pl['error']}")
        continue
    print(f"plan {impl:20s} seq {r['seq']} ({pl['gpu']}): modelled {pl['tokens_per_s']:9.0f} "
          f"tok/s, measured/modelled {r['tokens_per_s'] / pl['tokens_per_s']:.3f}; step "
          f"{pl['step_s']:.4f} s = GEMM {pl['gemm_s']:.4f} + attention {pl['attention_s']:.4f} "
          f"+ memory-bound {pl['memory_bound_s']:.4f} + optimizer {pl['optimizer_s']:.4f}")
for r in speed:  # where each profiled run's step time went: its top ops
    prof = r.get("op_profile")
    if not prof:
        continue
    who = "torch" if r["impl"] == "torch" else f"mx {r.get('recipe')}"
    print(f"profile {who} seq {r['seq']} x {r['micro_batch']} (steps "
          f"{prof['first_step']}-{prof['last_step']}, {prof['seconds']:.3f} s):")
    for o in prof["ops"][:8 if r["impl"] != "torch" else 15]:
        rate = f" {o['gflops'] / 1e3:7.1f} TFLOP/s" if o["gflops"] > 0 else ""
        print(f"  {o['op'][:40]:40s} {o['calls']:6d} calls {100 * o['share']:5.1f}%{rate}")
# GEMM tuning in the bf16 speed run (MXTRAIN_CUDA_GEMM_TUNE_LOG's lines): each tuned shape's
# kept candidate against the heuristic's first, the largest saving first.
tune = []
for f in sorted(runs.glob(f"speed_bf16__{main_seq}_*_none/stderr.txt")):
    for line in f.read_text(errors="replace").splitlines():
        m = re.search(r"cuda gemm tune: (\S+) ([\d.e+-]+) GFLOP: candidate (\d+) of (\d+) "
                      r"\((\d+) timed\), ([\d.e+-]+) ms \(first ([\d.e+-]+) ms\)", line)
        if m:
            tune.append((float(m[7]) - float(m[6]), m[1], float(m[2]), int(m[3]), int(m[4]),
                         float(m[6]), float(m[7])))
if tune:
    print(f"gemm tune (mx bf16): {len(tune)} shapes timed, "
          f"{sum(t[3] != 0 for t in tune)} took another than the heuristic's first")
    for saved, op, gf, cand, n, ms, first in sorted(tune, reverse=True)[:8]:
        print(f"  {op:9s} {gf:8.1f} GFLOP: candidate {cand} of {n}, {ms:.3f} ms "
              f"(first {first:.3f} ms, {gf / ms:.0f} TFLOP/s)")
# Cast tuning in the FP8 speed runs (MXTRAIN_CUDA_CAST_TUNE_LOG's lines): each tuned cast's
# forms, their times and bandwidths, the one kept.
for recipe in ("fp8-delayed", "fp8-block"):
    casts = []
    for f in sorted(runs.glob(f"speed_{recipe}__{main_seq}_*_none/stderr.txt")):
        for line in f.read_text(errors="replace").splitlines():
            m = re.search(r"cuda cast tune: (\S+ \S+ \S+) #\d+: kept (\S+) \((.*)\)$", line)
            if m:
                casts.append(m.groups())
    if casts:
        print(f"cast tune (mx {recipe}): {len(casts)} shapes timed")
        for shape, kept, forms in casts[:12]:
            print(f"  {shape}: kept {kept} ({forms})")
# The ratio lines, per seq: (the numerator's row, the denominator's row, what the line says,
# its tail), each printed where both rows ran.
RATIOS = [
    ("mx bf16", "torch", "mxtrain bf16 / torch", ""),
    ("mx bf16", "mx bf16 notune", "mxtrain bf16, tuned / untuned GEMMs", ""),
    ("mx fp8-delayed fastacc", "mx fp8-delayed",
     "mxtrain fp8-delayed, fast accumulation on the forward GEMMs / off", ""),
    ("mx fp8-delayed fp8attn", "mx bf16", "mxtrain fp8-delayed + FP8 attention / bf16",
     " (target >= 1.3)"),
    ("mx fp8-delayed fp8attn-head", "mx bf16",
     "mxtrain fp8-delayed + FP8 attention + FP8 head / bf16", ""),
    ("mx fp8-delayed fp8attn-hd", "mx bf16 hd",
     "mxtrain fp8-delayed + FP8 attention / bf16, MXTRAIN_GPU_HD_SETS's heads", " (target >= 1.3)"),
    ("mx fp8-delayed fp8attn-head-hd", "mx bf16 hd",
     "mxtrain fp8-delayed + FP8 attention + FP8 head / bf16, MXTRAIN_GPU_HD_SETS's heads", ""),
    ("mx bf16 hd", "mx bf16", "mxtrain bf16, MXTRAIN_GPU_HD_SETS's heads / the preset's", ""),
    ("mx fp8-block", "mx fp8-block casts0", "mxtrain fp8-block, tuned / untuned casts", ""),
    ("mx fp8-delayed", "mx fp8-delayed savext0",
     "mxtrain fp8-delayed, x^T codes kept / not kept", ""),
    ("mx fp8-delayed", "mx fp8-delayed fuse0", "mxtrain fp8-delayed, SwiGLU fused / not fused",
     ""),
    ("mx fp8-block", "mx fp8-block fuse0", "mxtrain fp8-block, SwiGLU fused / not fused", ""),
    ("mx fp8-block", "mx fp8-block savext0", "mxtrain fp8-block, x^T codes kept / not kept",
     ""),
    ("mx bf16", "mx bf16/a32", "mxtrain bf16, bf16 / fp32 activations", ""),
] + [(f"mx {fp8}", "mx bf16", f"mxtrain {fp8} / bf16", " (target >= 1.3)")
     for fp8 in ("fp8-current", "fp8-delayed", "fp8-block", "mxfp8", "nvfp4")]
for seq in sorted({s for _, s in by}):  # the seqs that ran (8192 on the GPU)
    for num, den, what, tail in RATIOS:
        if (num, seq) in by and (den, seq) in by:
            print(f"seq {seq}: {what} = {by[(num, seq)] / by[(den, seq)]:.3f}{tail}")
PY
# Every run's full stderr (the cuDNN path lines, the profile tables, any error before the last
# line), which the JSON rows keep only the last line of, and its metrics.jsonl. Not the loss
# match's end-of-run checkpoints: ten tiny-preset ones are ~16 MB, ~13 MB compressed, and the
# device tool returns no file over 16 MiB.
tar -czf "$OUT/runs_stderr.tgz" --exclude=checkpoints -C "$work" mxgpu-runs 2>/dev/null || true
echo "total: $(( $(date +%s) - t_start )) s"
# The op check's own time limit (timeout's 124, or 137 when killed) must not read as the whole
# command timing out (the device tool reports 124 / 137 that way).
(( opcheck_rc == 124 || opcheck_rc == 137 )) && opcheck_rc=4
exit $opcheck_rc
