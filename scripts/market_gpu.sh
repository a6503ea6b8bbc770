#!/usr/bin/env bash
# The market on one GPU (issue 15, "the learned policy beats random, and beats a hand-written policy
# that follows the signals, by a stated margin on 3 seeds"): examples/market-gpu.yaml (the torch market
# on the GPU, zerocopy, K = 10) on SEEDS (default 1,2,3), the three trainings sharing the GPU, within
# BUDGET_SECONDS (default 300) of wall time. A short calibration (every seed, CALIBRATION_STEPS updates,
# at the same load) measures updates/s first; when the recipe's run.steps would not fit in the time
# left, the runs get the number of updates that fits, as -o run.steps=N, which the table states.
# Each run's summary scores the heuristic and a random policy on the final evaluation's episodes (the
# same markets), so each seed's margin is paired: the table gives it with twice its standard error over
# those episodes. Verdict: every seed's trained mean is above the heuristic's by at least MARGIN
# (default 1.0 per 200-step episode) and above the random policy's.
# Under $OUT (at most 8 files): market.log, table.md, sweep.json, runs.tar.gz (each seed's train.log,
# config, progress, summary; the calibration). The table is printed last.
# Usage, from the repo root with the wheels of .whl/ carried (pydantic, gymnasium, typer, ...):
#   scripts/market_gpu.sh
#   INSTALL=0 DEVICE=cpu CALIBRATION_STEPS=20 ROUND=10 BUDGET_SECONDS=150 EXTRA="replay.capacity=4000 ..." scripts/market_gpu.sh
set -uo pipefail
start=$(date +%s)
BUDGET_SECONDS="${BUDGET_SECONDS:-300}"
SEEDS="${SEEDS:-1,2,3}"
MARGIN="${MARGIN:-1.0}"
CONFIG="${CONFIG:-examples/market-gpu.yaml}"
CALIBRATION_STEPS="${CALIBRATION_STEPS:-400}"
MARGIN_SECONDS="${MARGIN_SECONDS:-30}"  # periodic and final evaluations, the table (setup is measured)
ROUND="${ROUND:-1000}"                  # budgets are rounded down to this many updates
INSTALL="${INSTALL:-1}"                 # 0: use the python3 on PATH as it is (a smoke test on a dev machine)
DEVICE="${DEVICE:-}"                    # e.g. cpu for a smoke test (the config says cuda)
STEPS="${STEPS:-}"                      # run.steps instead of the calibrated budget (a smoke test)
EXTRA="${EXTRA:-}"                      # more overrides, "key=value key=value" (a smoke test's small sizes)
FALLBACK_PLAN="${FALLBACK_PLAN:-eager}" # the plan to calibrate and train with when the config's fails ("" for none)
OUT="${OUT:-/tmp/foxhunt-out}"; mkdir -p "$OUT"
WORK="${WORK:-/tmp/foxhunt-market}"; rm -rf "$WORK"; mkdir -p "$WORK"; touch "$WORK/install.log"
LOG="$OUT/market.log"
# shellcheck source=scripts/device_setup.sh
source "$(dirname "$0")/device_setup.sh"  # env, elapsed, say, the install, the import check and host lines
jobs=$(( $(tr -cd , <<<"$SEEDS" | wc -c) + 1 ))
extra=(); [ -n "$DEVICE" ] && extra=(-o "run.device=$DEVICE")
for o in $EXTRA; do extra+=(-o "$o"); done

# ---- calibration: every seed at once (the training's load), CALIBRATION_STEPS updates each ----
# Sets `steps`: 0.85 x the slowest seed's updates/s x (the time left - its setup), rounded down to ROUND, at most the config's.
calibrate() {
  rm -rf "$WORK/calibration"
  say "calibration: seeds $SEEDS, $CALIBRATION_STEPS updates each, evaluation off ${extra[*]}"
  timeout -s TERM $(( BUDGET_SECONDS / 3 )) python3 -m trainer sweep --config "$CONFIG" --seeds "$SEEDS" --jobs "$jobs" --out "$WORK/calibration" "${extra[@]}" \
    -o run.steps="$CALIBRATION_STEPS" -o run.log_every=$(( CALIBRATION_STEPS / 2 )) \
    -o run.checkpoint_every="$CALIBRATION_STEPS" -o run.eval_every=0 -o run.eval_episodes=0 --poll 15 \
    >>"$WORK/calibration.out" 2>&1 || tail -4 "$WORK/calibration.out" | tee -a "$OUT/market.log"
  left=$(( BUDGET_SECONDS - $(elapsed) - MARGIN_SECONDS ))
  read -r steps seconds < <(python3 - "$WORK/calibration" "$CONFIG" "$left" "$ROUND" 2>>"$OUT/market.log" <<'EOF'
import json, sys
from contracts.config import load_config
folder, config, left, step = sys.argv[1], load_config(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
try:
    rows = [row for row in json.load(open(f"{folder}/sweep.json"))["rows"] if row["status"] == "ok"]
except (OSError, ValueError, KeyError):
    rows = []
# per seed: step_ms, the mean update (collection included) over the calibration's second half (its last log
# window), and its setup: process start, warm-up to learning_starts and capture (wall time - training time)
ms = [json.load(open(f"{folder}/seed-{row['seed']}/summary.json")).get("step_ms") for row in rows]
rates = [1000.0 / m for m in ms if m]
setup = max((row["wall_seconds"] - (row["train_seconds"] or 0.0) for row in rows), default=0.0)
fit = int(0.85 * min(rates) * (left - setup)) // step * step if rates else 0
print(max(0, min(config.run.steps, fit)), max(1, int(left - setup)))
print(f"calibration: updates/s per seed {[round(r, 1) for r in rates]}, setup {setup:.0f} s, fits {fit}, config {config.run.steps}", file=sys.stderr)
EOF
)
  say "calibration done; $left s left: ${steps:-0} updates per seed, the training loop capped at ${seconds:-?} s (run.max_seconds)"
}
if [ -n "$STEPS" ]; then
  steps=$STEPS seconds=$(( BUDGET_SECONDS - MARGIN_SECONDS - $(elapsed) ))
  say "run.steps=$steps as given (no calibration), the training loop capped at $seconds s (run.max_seconds)"
else
  calibrate
  if [ "${steps:-0}" -lt 1 ] && [ -n "$FALLBACK_PLAN" ]; then
    say "the config's plan did not calibrate: again with run.plan=$FALLBACK_PLAN"
    extra+=(-o "run.plan=$FALLBACK_PLAN")
    calibrate
  fi
fi

# ---- the seeds, in parallel, stopped at the deadline (a stopped seed is a failed row) ----
if [ "${steps:-0}" -lt 1 ]; then
  say "no budget fits (calibration failed? see runs.tar.gz)"
else
  timeout -s TERM $(( BUDGET_SECONDS - $(elapsed) > 30 ? BUDGET_SECONDS - $(elapsed) - 10 : 20 )) python3 -m trainer sweep --config "$CONFIG" --seeds "$SEEDS" \
    --jobs "$jobs" --out "$WORK/market" --poll 30 "${extra[@]}" -o run.steps="$steps" -o run.max_seconds="$seconds" \
    >"$WORK/sweep.md" 2>"$WORK/sweep.err"
  say "sweep exited $?"
fi

# ---- the table: each seed's trained mean against the baselines on the same episodes ----
python3 - "$WORK/market" "$MARGIN" "$CONFIG" "${steps:-0} ${extra[*]}, a training loop of at most ${seconds:-?} s (-o run.max_seconds)" "$SEEDS" >"$OUT/table.md" 2>>"$OUT/market.log" <<'EOF'
import json, math, os, sys
folder, margin, config, steps, seeds = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
rows, passed = [], True
for seed in seeds.split(","):
    path = f"{folder}/seed-{seed}/summary.json"
    if not os.path.exists(path):
        rows.append(f"| {seed} | no summary: stopped or failed (market.log, runs.tar.gz) | | | | | | |"); passed = False; continue
    s = json.load(open(path))
    trained, base = s.get("eval_returns") or [], s.get("baseline_returns") or {}
    if not trained or "heuristic" not in base:
        rows.append(f"| {seed} | no final evaluation | | | | | | |"); passed = False; continue
    diff = [t - h for t, h in zip(trained, base["heuristic"])]
    mean = sum(diff) / len(diff)
    se = math.sqrt(sum((d - mean) ** 2 for d in diff) / (len(diff) - 1) / len(diff)) if len(diff) > 1 else float("nan")
    means = s["baseline_means"]
    ok = mean >= margin and s["eval_return_mean"] > means["random"]
    passed &= ok
    best = "" if s.get("best_eval_step") is None else f" (policy of step {s['best_eval_step']:,})"
    rows.append(
        f"| {seed} | {s['eval_return_mean']:.2f}{best} | {means['heuristic']:.2f} | {means['random']:.2f} "
        f"| {mean:+.2f} ± {2 * se:.2f}{' ✓' if ok else ' ✗'} | {s['step']:,}{' (time limit)' if s.get('stopped_by_time_limit') else ''} "
        f"| {s['wall_seconds']:.0f} s | {s['step'] / s['wall_seconds']:.0f} |"
    )
count = len(rows)
print(f"`{config}` with -o run.steps={steps}, {count} seeds; mean return over each run's final evaluation episodes "
      f"(the heuristic and random policy play the same markets); margin = trained - heuristic, paired per episode, "
      f"± 2 standard errors; wall time and updates/s of the training loop (collection and periodic evaluation included).\n")
print("| seed | trained | heuristic | random | margin | updates | wall time | updates/s |")
print("|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
print(f"\nVerdict: {'passed' if passed and count else 'not passed'}: every seed above the heuristic by >= {margin:g} "
      f"and above random ({count} seeds).")
EOF

# ---- outputs: at most 8 files under $OUT ----
cat "$WORK/sweep.err" >>"$OUT/market.log" 2>/dev/null
[ -f "$WORK/market/sweep.json" ] && cp "$WORK/market/sweep.json" "$OUT/sweep.json"
(cd "$WORK" && tar czf "$OUT/runs.tar.gz" --exclude=checkpoints install.log \
  $(for f in calibration calibration.out market sweep.md sweep.err; do [ -e "$f" ] && echo "$f"; done))
say "total wall time $(elapsed) s"
cat "$OUT/table.md"
