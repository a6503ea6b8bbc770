#!/usr/bin/env bash
# The one script sent to the H200: GPU tests, then the benchmark; logs, JSON and PNG under $OUT.
# Usage: scripts/gpu_check.sh [STAGES] [extra bench options...]; STAGES: comma list of
# train,tests,curves,bench,profile or all (train: real CartPole training with every plan, tests/trainer/test_train.py)
# Needs the carried wheels in .whl/ (pydantic, gymnasium: not in the machine's image).
set -uo pipefail
stage="${1:-all}"; shift || true
[ "$stage" = all ] && stage=train,tests,curves,bench,profile
has() { [[ ",$stage," == *",$1,"* ]]; }
OUT="${OUT:-/tmp/foxhunt-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}" || { echo "wheel install failed"; exit 3; }
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/device.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)' \
  | tee -a "$OUT/device.txt"

if has train; then
  # every plan trains CartPole from an empty replay; graph = eager bit for bit over 2000 real updates
  timeout "${TRAIN_TIMEOUT:-300}" python3 -m pytest -m gpu -p no:cacheprovider -q -s -rA --timeout 280 \
    tests/trainer/test_train.py 2>&1 | grep -v vectorized_gather | tee "$OUT/gpu_train_tests.log" \
    | grep -E "passed|failed|PASS|FAIL|updates/s|drift|Error|assert" | tail -40
fi
if has tests; then
  # curves too: the slow 2000-step TF32 loss-curve test, in the same process (shares compiled kernels)
  marks="gpu and not slow"; has curves && marks="gpu"
  FOXHUNT_CURVES_OUT="$OUT/loss_curves.json" timeout "${TEST_TIMEOUT:-330}" python3 -m pytest -m "$marks" \
    -p no:cacheprovider -q -s -rA --timeout 300 tests/trainer/plans/test_equivalence.py 2>&1 \
    | grep -v vectorized_gather | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|PASS|FAIL|relative|gap|Error" | tail -40
  [ -f "$OUT/loss_curves.json" ] && python3 scripts/plot_loss_curves.py "$OUT/loss_curves.json" "$OUT/loss_curves.png"
fi
if has bench; then
  timeout "${BENCH_TIMEOUT:-420}" python3 -m trainer bench --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | tail -30
fi
if has profile; then
  # kernels per step and the costliest kernels of the fastest plan (scripts/profile_step.py)
  timeout "${PROFILE_TIMEOUT:-200}" python3 scripts/profile_step.py --config core --variant zerocopy --variant zerocopy+triton --top 25 2>&1 \
    | grep -v "Warn\|check(" | tee "$OUT/profile_zerocopy_core.txt" | tail -30
fi
