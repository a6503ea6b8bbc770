"""Plot the 2000-step loss curves of eager float32 and fused TF32 written by the equivalence test.

Usage: python scripts/plot_loss_curves.py LOSS_CURVES_JSON OUT_PNG [PRECISION]  (PRECISION: TF32 or bf16)
(`FOXHUNT_CURVES_OUT=… pytest -m gpu … -k loss_curves` writes the JSON; scripts/gpu_check.sh does both.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

WINDOW = 50


def main(source: str, target: str, precision: str = "TF32") -> None:
    curves = json.loads(Path(source).read_text())  # {"eager"|"fused": {loss name: [value per step]}}
    names = list(curves["eager"])
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3))
    lines = (("eager", "-", "eager (float32)"), ("fused", "--", f"fused ({precision}, Inductor)"))
    for ax, name in zip(np.atleast_1d(axes), names, strict=True):
        for plan, style, label in lines:
            means = np.array(curves[plan][name]).reshape(-1, WINDOW).mean(1)
            ax.plot(np.arange(len(means)) * WINDOW + WINDOW / 2, means, style, label=label)
        ax.set_title(name)
        ax.set_xlabel("step")
    np.atleast_1d(axes)[0].set_ylabel(f"loss (mean of {WINDOW} steps)")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.suptitle(f"same batches and draws: eager float32 vs fused {precision}", fontsize=9)
    fig.tight_layout()
    fig.savefig(target, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:4])
