#!/usr/bin/env bash
# The checks and figures that need a CUDA GPU, in one go. CI has no GPU, so run this by hand on one:
#
#     bash .ci/gpu_checks.sh ML100K_DIR [--pmixer PATH] [--beauty PATH/Beauty.txt] [--out DIR]
#         [--part tests|speed|all] [--short]
#
# tests: the Triton kernels compiled (outputs and gradients against the torch references), every zoo model
#        training under fp32/bf16/fp16 on CUDA, and the kernel micro-benchmark;
# speed: the SASRec epoch (ours, plain, pmixer's when given, bf16, compiled) and the time to quality, LISA
#        against SASRec over the window length, profiles of one ELASTIC and one LISA step, and the training step
#        of SASRec and RecGRELA with and without padding (on Beauty when given, whose windows are mostly padding;
#        else on ml-100k), and ELASTIC's ml-100k epoch eager and as CUDA graphs (compile_mode: reduce-overhead), all
#        on the GPU.
# --short fits into seven and a half minutes at most, for a short GPU lease: the kernel and device tests (CUDA
# cases) run as one pytest, the speed step skips time-to-quality and torch.compile, the steps that compile more
# Triton kernels (RecGRELA's padding row, LISA over N, the LISA profile: over a minute of ptxas each on an H200)
# are left out, and each step is cut off after a few minutes (a cut-off step counts as failed, its log says how
# far it got).
# Each step's output is kept in OUT/<step>.log (default gpu-checks/); a failing step does not stop the others,
# and the exit status counts the failed steps.
set -u
usage="usage: bash .ci/gpu_checks.sh ML100K_DIR [--pmixer PATH] [--beauty PATH] [--out DIR]"
usage+=" [--part tests|speed|all] [--short]"
ml100k=${1:?$usage}
shift
pmixer="" beauty="" out="gpu-checks" part="all" short=""
while [ $# -gt 0 ]; do
  case $1 in
    --pmixer) pmixer=$2; shift 2 ;;
    --beauty) beauty=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --part) part=$2; shift 2 ;;
    --short) short=1; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || { echo "error: no CUDA GPU visible to torch" >&2; exit 2; }
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # pytest-xdist's workers import the checkout, installed or not
failed=0
step() {  # step NAME COMMAND...: run, keep the log, count a failure; LIMIT=seconds cuts it off (exit 124)
  local name=$1; shift
  echo "== $name: $*"
  local started=$SECONDS
  local limit=()
  [ -n "${LIMIT:-}" ] && limit=(timeout --signal=INT --kill-after=15 "$LIMIT")
  "${limit[@]}" "$@" > "$out/$name.log" 2>&1
  local status=$?
  tail -n "${TAIL:-25}" "$out/$name.log"
  echo "== $name: exit $status after $((SECONDS - started)) s"
  [ $status -eq 0 ] || failed=$((failed + 1))
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "$part" != speed ]; then
  # every kernel test shape compiles its kernels (~8 s a test on an H100): spread them over the cores
  parallel=()
  python -c "import xdist" 2>/dev/null && parallel=(-n "$(nproc)")
  if [ -n "$short" ]; then
    # the zoo's CPU cases run in CI; here they only take cores from the kernels' compilation
    LIMIT=180 step kernel-and-device-tests python -m pytest tests/kernels tests/models/test_devices.py -q \
      -k "not cpu-fp32" -p no:cacheprovider "${parallel[@]}"
    LIMIT=90 step kernel-bench python -m benchmarks.kernels --lengths 256 1024 4096
  else
    step kernel-tests python -m pytest tests/kernels -q -p no:cacheprovider "${parallel[@]}"
    step device-tests python -m pytest tests/models/test_devices.py -q -p no:cacheprovider
    step kernel-bench python -m benchmarks.kernels
  fi
fi
if [ "$part" != tests ]; then
  pmixer_args=()
  [ -n "$pmixer" ] && pmixer_args=(--pmixer "$pmixer")
  padding_data=(--dataset ml-100k --source "$ml100k")
  [ -n "$beauty" ] && padding_data=(--dataset beauty --source "$beauty")
  if [ -n "$short" ]; then
    LIMIT=50 TAIL=8 step padding-sasrec python -m benchmarks.padding "${padding_data[@]}" --model sasrec --device cuda
    LIMIT=75 step speed python -m benchmarks.speed --device cuda --source "$ml100k" --rounds 3 "${pmixer_args[@]}"
    LIMIT=40 TAIL=40 step profile-elastic python -m benchmarks.step_profile elastic --device cuda
  else
    step speed python -m benchmarks.speed --device cuda --source "$ml100k" --rounds 5 --compile --time-to-quality \
      --ttq-budget 240 "${pmixer_args[@]}"
    step lisa-speed python -m benchmarks.lisa_speed --device cuda --lengths 64 128 256 512 1024 2048 4096 --repeats 10
    # where a step's time goes on the GPU: kernels launched against the time they keep it busy
    TAIL=40 step profile-elastic python -m benchmarks.step_profile elastic --device cuda
    TAIL=40 step profile-lisa python -m benchmarks.step_profile lisa --device cuda --length 256 --items 3700
    TAIL=8 step padding-sasrec python -m benchmarks.padding "${padding_data[@]}" --model sasrec --device cuda
    TAIL=8 step padding-recgrela python -m benchmarks.padding "${padding_data[@]}" --model recgrela --set causal=true \
      --device cuda
    # CUDA graphs replay the one objective that runs under them (study/train/step.py); the row's epoch_time_s is
    # the median epoch, compilation aside
    elastic=(python -m study.train --model elastic --source "$ml100k" --set objective=last --set prefixes_per_user=0
             --set max_epochs=3 --set seed=1 --no-progress)
    TAIL=1 step elastic-epoch-eager "${elastic[@]}"
    TAIL=1 step elastic-epoch-cuda-graphs "${elastic[@]}" --set compile=true --set compile_mode=reduce-overhead
  fi
fi
echo "failed steps: $failed"
exit $failed
