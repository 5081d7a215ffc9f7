"""Gradient at initialization, Post-LN against Pre-LN, with the project's own CharTransformer.

    .venv/bin/python benchmarks/init_grads_check.py [--text PATH] [--inits xavier default gpt2]
        [--depths 3 6 12] [--seeds 0 1 2] [--d-model 128] [--heads 4] [--ctx 64] [--batch 32]

The measurement is `blockviz.training.init_grads` (the same code as `python -m blockviz
init-grads` and the dashboard's "Gradients at init" page): for each init, depth and seed,
one model per norm position built from the same seed (the two share every weight; only
Pre-LN's final norm is extra, `final_norm` auto), one training batch of the text (its first
90%, drawn by `CharDataModule` with the seed), one backward pass of the mean cross-entropy,
no optimizer step. Printed per (init, depth): the L2 norm of the last block's
`ffn.fc_out.weight` gradient for each norm position (mean over seeds), the Post-LN / Pre-LN
ratio of those means with its per-seed range, each position's per-block values, then each
position's first-block / last-block ratio (its profile across layers).
Xiong et al. 2020 (Theorem 1, xavier init) bound that gradient by O(d sqrt(ln d)) in Post-LN
and O(d sqrt(ln d / L)) in Pre-LN, so the ratio should grow with the depth L; this checks
whether our model shows it. Not a test: the numbers README quotes (Model section). CPU,
seconds per depth.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from blockviz.core import config as cfg
from blockviz.core import init_grads as core_init_grads
from blockviz.core.config_model import INITS
from blockviz.training import init_grads

DEFAULT_TEXT = Path(__file__).resolve().parent.parent.parent / "shared/data/tinyshakespeare.txt"


def profiles(result: dict) -> list[str]:
    """Each (init, depth)'s first-block / last-block ratio per norm position (seed means)."""
    means = core_init_grads.layer_means(result["rows"])
    lines = ["init     L   first/last post  pre"]
    for row in result["summary"]:
        post, pre = (means[(row["init"], row["depth"], p)] for p in ("post", "pre"))
        lines.append(
            f"{row['init']:<8} {row['depth']:<3} {post[0] / post[-1]:15.2f} {pre[0] / pre[-1]:5.2f}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    parser.add_argument("--inits", nargs="+", default=["xavier"], choices=INITS)
    parser.add_argument("--depths", nargs="+", type=int, default=[3, 6, 12])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ctx", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    run_config = cfg.replace(
        cfg.RunConfig(),
        dataset=str(args.text),
        val_fraction=0.1,
        d_model=args.d_model,
        n_head=args.heads,
        block_size=args.ctx,
        batch_size=args.batch,
        final_norm=None,
    ).validate()
    print(f"text: {args.text}")
    result = init_grads.run(run_config, args.depths, args.inits, args.seeds)
    print(core_init_grads.table(result))
    print("\n".join(profiles(result)))
    print(f"{result['seconds']:.1f} s")


if __name__ == "__main__":
    main()
