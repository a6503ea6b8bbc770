#!/usr/bin/env bash
# The one script for the H200 machine (issue 15, "Recipes that learn on any seed"): seed sweeps of the
# recipes, all at once, on its 16 CPU cores and its GPU, one torch thread per process. RECIPES picks them
# (default: cartpole-gpu acrobot lunarlander-gpu):
#   cartpole          examples/cartpole.yaml as committed (CPU)                  seeds $SEEDS   threshold 475
#   cartpole-gpu      the same with run.device=cuda run.plan=$GPU_PLAN           seeds $SEEDS   threshold 475
#   acrobot           examples/acrobot.yaml as committed (CPU)                   seeds $SEEDS   threshold -100
#   acrobot-gpu       the same on the GPU                                        seeds $SEEDS   threshold -100
#   lunarlander-gpu   examples/lunarlander.yaml on the GPU (needs Box2D)         seeds 1,2,3    threshold 200
# each through `python -m trainer sweep`, all within BUDGET_SECONDS (default 540) of wall time. Every run
# gets run.max_seconds: the time left after SETUP_SECONDS (process start, warm-up, capture and
# compilation) and FINISH_SECONDS (final evaluation, tables). A run still short of run.steps then stops
# and finishes as at the end (best policy, final evaluation); its table row says "time limit" and the
# updates it made, so a shortened run is never mistaken for the recipe's budget.
# Under $OUT: recipes.log, tables.md (one table per recipe), <recipe>.json, runs.tar.gz (every seed's
# train.log, config, progress and summary). The tables are printed last.
# Usage, from the repo root with the wheels of .whl/ carried (pydantic, gymnasium, typer, Box2D, ...):
#   scripts/recipes_gpu.sh            RECIPES="cartpole acrobot" BUDGET_SECONDS=300 SEEDS=4,5 scripts/recipes_gpu.sh
set -uo pipefail
start=$(date +%s)
BUDGET_SECONDS="${BUDGET_SECONDS:-540}"
SEEDS="${SEEDS:-4,5,6,7,8}"
RECIPES="${RECIPES:-cartpole-gpu acrobot lunarlander-gpu}"
GPU_PLAN="${GPU_PLAN:-fused}"           # the fastest plan of the train rows (docs/benchmarks/train/)
SETUP_SECONDS="${SETUP_SECONDS:-150}"   # process start, warm-up to learning_starts, capture and compilation
FINISH_SECONDS="${FINISH_SECONDS:-45}"  # the final evaluation, the tables
INSTALL="${INSTALL:-1}"                 # 0: use the python3 on PATH as it is (a smoke test on a dev machine)
OUT="${OUT:-/tmp/foxhunt-out}"; mkdir -p "$OUT"
WORK="${WORK:-/tmp/foxhunt-recipes}"; rm -rf "$WORK"; mkdir -p "$WORK"; touch "$WORK/install.log"
LOG="$OUT/recipes.log"
# shellcheck source=scripts/device_setup.sh
source "$(dirname "$0")/device_setup.sh"  # env, elapsed, say, the install, the import check and host lines

gpu="run.device=cuda run.plan=$GPU_PLAN"
declare -A config=([cartpole]=examples/cartpole.yaml [cartpole-gpu]=examples/cartpole.yaml
                   [acrobot]=examples/acrobot.yaml [acrobot-gpu]=examples/acrobot.yaml
                   [lunarlander-gpu]=examples/lunarlander.yaml)
declare -A extra=([cartpole]="" [cartpole-gpu]="$gpu" [acrobot]="" [acrobot-gpu]="$gpu" [lunarlander-gpu]="$gpu")
declare -A seeds=([lunarlander-gpu]=1,2,3)
declare -A threshold=([cartpole]=475 [cartpole-gpu]=475 [acrobot]=-100 [acrobot-gpu]=-100 [lunarlander-gpu]=200)
overrides() { for o in ${extra[$1]}; do printf -- '-o %s ' "$o"; done; }

seconds=$(( BUDGET_SECONDS - $(elapsed) - SETUP_SECONDS - FINISH_SECONDS ))
say "recipes: $RECIPES; each training loop capped at $seconds s (run.max_seconds)"
for r in $RECIPES; do
  [ -n "${config[$r]:-}" ] || { say "unknown recipe $r"; continue; }
  say "$r: ${config[$r]} seeds ${seeds[$r]:-$SEEDS}, overrides: ${extra[$r]:-none}"
  # shellcheck disable=SC2046
  timeout -s TERM $(( BUDGET_SECONDS - $(elapsed) - 10 )) python3 -m trainer sweep --config "${config[$r]}" \
    --seeds "${seeds[$r]:-$SEEDS}" --jobs 16 --out "$WORK/$r" --threshold "${threshold[$r]}" --poll 30 \
    $(overrides "$r") -o run.max_seconds="$seconds" >"$WORK/$r.md" 2>"$WORK/$r.err" &
done
wait
say "sweeps done"

# ---- outputs: at most 8 files under $OUT ----
: >"$OUT/tables.md"
for r in $RECIPES; do
  cat "$WORK/$r.err" >>"$LOG" 2>/dev/null
  [ -f "$WORK/$r/sweep.json" ] && cp "$WORK/$r/sweep.json" "$OUT/$r.json"
  { echo "## $r"; echo; cat "$WORK/$r/sweep.md" 2>/dev/null || echo "(no table: see recipes.log)"; echo; } >>"$OUT/tables.md"
done
# shellcheck disable=SC2046
(cd "$WORK" && tar czf "$OUT/runs.tar.gz" --exclude=checkpoints install.log \
  $(for r in $RECIPES; do [ -f "$r.err" ] && echo "$r.err"; [ -d "$r" ] && echo "$r"; done))
say "total wall time $(elapsed) s"
cat "$OUT/tables.md"
