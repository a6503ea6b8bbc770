#!/usr/bin/env bash
# The one script for the H200 machine (issue 15, "Recipes that learn on any seed"): seed sweeps of the
# recipes on its 16 CPU cores (run.device=cpu, one torch thread per process), 15 trainings at once:
#   cartpole          examples/cartpole.yaml as committed                         threshold 475
#   cartpole-proposed the same with 4 envs per update, target EMA tau 0.005 and
#                     a replay that keeps every transition (docs/results.md)     threshold 475
#   acrobot           examples/acrobot.yaml                                       threshold -100
# each on seeds 4,5,6,7,8, through `python -m trainer sweep`, all within BUDGET_SECONDS (default 480)
# of wall time. A short calibration (every seed of every recipe, 400 updates, at the same load) measures
# updates/s; a recipe whose full run.steps would not fit gets the number of updates that fits, as
# -o run.steps=N, which the tables and recipes.log state. Under $OUT: recipes.log, tables.md (the three
# tables), <recipe>.json, runs.tar.gz (every seed's train.log, config, progress and summary; the
# calibration). The tables are printed last.
# Usage, from the repo root with the wheels of .whl/ carried (pydantic, gymnasium, typer, ...):
#   scripts/recipes_gpu.sh            BUDGET_SECONDS=300 SEEDS=4,5 scripts/recipes_gpu.sh
set -uo pipefail
start=$(date +%s)
BUDGET_SECONDS="${BUDGET_SECONDS:-480}"
SEEDS="${SEEDS:-4,5,6,7,8}"
CALIBRATION_STEPS="${CALIBRATION_STEPS:-400}"
MARGIN_SECONDS="${MARGIN_SECONDS:-60}"  # process start, periodic and final evaluations, writing the tables
ROUND="${ROUND:-1000}"                  # budgets are rounded down to this many updates
INSTALL="${INSTALL:-1}"                 # 0: use the python3 on PATH as it is (a smoke test on a dev machine)
OUT="${OUT:-/tmp/foxhunt-out}"; mkdir -p "$OUT"
WORK="${WORK:-/tmp/foxhunt-recipes}"; rm -rf "$WORK"; mkdir -p "$WORK"; touch "$WORK/install.log"
LOG="$OUT/recipes.log"
# shellcheck source=scripts/device_setup.sh
source "$(dirname "$0")/device_setup.sh"  # env, elapsed, say, the install
python3 -c 'import trainer.train, gymnasium, torch; print("torch", torch.__version__, "gymnasium", gymnasium.__version__)' \
  2>&1 | tee -a "$OUT/recipes.log" || { say "the trainer does not import"; exit 3; }
say "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(python3 --version)"

recipes=(cartpole cartpole-proposed acrobot)
declare -A config=([cartpole]=examples/cartpole.yaml [cartpole-proposed]=examples/cartpole.yaml
                   [acrobot]=examples/acrobot.yaml)
declare -A extra=([cartpole]="" [cartpole-proposed]="data.num_envs=4 optim.target_tau=0.005 replay.capacity=125000"
                  [acrobot]="")
declare -A threshold=([cartpole]=475 [cartpole-proposed]=475 [acrobot]=-100)
overrides() { for o in ${extra[$1]}; do printf -- '-o %s ' "$o"; done; }

# ---- calibration: every seed of every recipe at once (the sweeps' load), CALIBRATION_STEPS updates each ----
say "calibration: ${#recipes[@]} recipes x seeds $SEEDS, $CALIBRATION_STEPS updates each, evaluation off"
mkdir -p "$WORK/calibration"
for r in "${recipes[@]}"; do
  # shellcheck disable=SC2046
  python3 -m trainer sweep --config "${config[$r]}" --seeds "$SEEDS" --jobs 16 --out "$WORK/calibration/$r" \
    $(overrides "$r") -o run.steps="$CALIBRATION_STEPS" -o run.log_every=$(( CALIBRATION_STEPS / 2 )) \
    -o run.checkpoint_every="$CALIBRATION_STEPS" -o run.eval_every=0 -o run.eval_episodes=0 --poll 30 \
    >"$WORK/calibration/$r.out" 2>&1 &
done
wait
left=$(( BUDGET_SECONDS - $(elapsed) - MARGIN_SECONDS ))
say "calibration done; $left s left for training"

# Updates that fit: 0.9 x the slowest seed's updates/s x the time left, rounded down to ROUND, at most the config's.
declare -A steps
for r in "${recipes[@]}"; do
  steps[$r]=$(python3 - "$WORK/calibration/$r" "${config[$r]}" "$left" "$ROUND" 2>>"$OUT/recipes.log" <<'EOF'
import glob, json, sys
from trainer.config import load_config
folder, config, left, step = sys.argv[1], load_config(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
# step_ms: the mean update (collection included) over the second half of the calibration (its last log window)
ms = [json.load(open(path)).get("step_ms") for path in glob.glob(f"{folder}/seed-*/summary.json")]
rates = [1000.0 / m for m in ms if m]
fit = int(0.9 * min(rates) * left) // step * step if rates else 0
print(min(config.run.steps, fit))
print(f"{folder}: updates/s per seed {[round(r, 1) for r in rates]}, fits {fit}, config {config.run.steps}", file=sys.stderr)
EOF
)
  say "$r: ${steps[$r]} updates per seed (config ${config[$r]}, extra overrides: ${extra[$r]:-none})"
done

# ---- the sweeps, in parallel; a sweep still running at the deadline is stopped (its rows marked failed) ----
for r in "${recipes[@]}"; do
  if [ "${steps[$r]:-0}" -lt "$ROUND" ]; then say "$r: no budget fits (calibration failed?), skipped"; continue; fi
  # shellcheck disable=SC2046
  timeout -s TERM $(( left + MARGIN_SECONDS - 20 )) python3 -m trainer sweep --config "${config[$r]}" --seeds "$SEEDS" \
    --jobs 16 --out "$WORK/$r" --threshold "${threshold[$r]}" --poll 30 $(overrides "$r") -o run.steps="${steps[$r]}" \
    >"$WORK/$r.md" 2>"$WORK/$r.err" &
done
wait
say "sweeps done"

# ---- outputs: at most 8 files under $OUT ----
: >"$OUT/tables.md"
for r in "${recipes[@]}"; do
  cat "$WORK/$r.err" >>"$OUT/recipes.log" 2>/dev/null
  [ -f "$WORK/$r/sweep.json" ] && cp "$WORK/$r/sweep.json" "$OUT/$r.json"
  { echo "## $r"; echo; cat "$WORK/$r/sweep.md" 2>/dev/null || echo "(no table: see recipes.log)"; echo; } >>"$OUT/tables.md"
done
(cd "$WORK" && tar czf "$OUT/runs.tar.gz" --exclude=checkpoints \
  calibration install.log $(for r in "${recipes[@]}"; do [ -f "$r.err" ] && echo "$r.err"; done) $(for r in "${recipes[@]}"; do [ -d "$r" ] && echo "$r"; done))
say "total wall time $(elapsed) s"
cat "$OUT/tables.md"
