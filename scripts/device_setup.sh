#!/usr/bin/env bash
# Sourced by the device machine's scripts (recipes_gpu.sh, market_gpu.sh) after they set `start` (epoch
# seconds), OUT, WORK, LOG (their log under $OUT) and INSTALL (0: use the python3 on PATH as it is, a
# smoke test on a dev machine): the environment, the log helpers, the install of the carried wheels
# (.whl/: what the machine's image lacks) and of the project on the image's torch; then the log's first lines.
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
elapsed() { echo $(( $(date +%s) - start )); }
say() { echo "[$(elapsed) s] $*" | tee -a "$LOG"; }

if [ "$INSTALL" = 1 ] && [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}" || { say "wheel install failed"; exit 3; }
fi
# `pip install -e .[trainer]` without a registry: the extra's needs are the image's (torch 2.11, numpy, pyarrow,
# safetensors, fsspec, tqdm) or the wheels above; optuna and psycopg serve hyperopt only.
if [ "$INSTALL" = 1 ] && ! python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$WORK/install.log" 2>&1; then
  say "editable install failed ($(tail -1 "$WORK/install.log")); running from the source tree"
  export PYTHONPATH="$PWD:${PYTHONPATH:-}"
fi
# The log's first lines: that the trainer imports (exit 3 if not), its torch and the host.
python3 -c 'import trainer.runtime.train, gymnasium, torch; print("torch", torch.__version__, "gymnasium",
gymnasium.__version__, "cuda", torch.cuda.is_available())' 2>&1 | tee -a "$LOG" || { say "the trainer does not import"; exit 3; }
say "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(python3 --version)"
say "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep . || echo none)"
