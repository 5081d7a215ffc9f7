"""Gradient at initialization, Post-LN against Pre-LN, with the project's own CharTransformer.

    .venv/bin/python benchmarks/init_grads_check.py [--text PATH] [--inits xavier default gpt2]
        [--depths 3 6 12] [--seeds 0 1 2] [--d-model 128] [--heads 4] [--ctx 64] [--batch 32]

For each init, depth and seed: one model per norm position built from the same seed (the
two share every weight; only Pre-LN's final norm is extra, `final_norm` auto), one batch of
random training windows (the first 90% of the text, drawn from the seed), one backward pass
of the mean cross-entropy, no optimizer step. Printed per (init, depth): the L2 norm of the
last block's `ffn.fc_out.weight` gradient for each norm position (mean over seeds), the
Post-LN / Pre-LN ratio of those means with its per-seed range, and each position's
first-block / last-block ratio of the same gradient norm (its profile across layers).
Xiong et al. 2020 (Theorem 1, xavier init) bound that gradient by O(d sqrt(ln d)) in Post-LN
and O(d sqrt(ln d / L)) in Pre-LN, so the ratio should grow with the depth L; this checks
whether our model shows it. Not a test: the numbers README quotes (Model section). CPU,
seconds per depth.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from blockviz.core.config import INITS, ModelConfig
from blockviz.core.vocab import CharVocab
from blockviz.training.data import batch_from, encode_tensor
from blockviz.training.model import CharTransformer

POSITIONS = ("post", "pre")
DEFAULT_TEXT = Path(__file__).resolve().parent.parent.parent / "shared/data/tinyshakespeare.txt"


def fc_out_grad_norms(
    cfg: ModelConfig, inputs: torch.Tensor, targets: torch.Tensor, seed: int
) -> list[float]:
    """The gradient norm of every block's ffn.fc_out.weight after one backward pass."""
    torch.manual_seed(seed)
    model = CharTransformer(cfg)
    _, loss = model(inputs, targets)
    loss.backward()
    return [block.ffn.fc_out.weight.grad.norm().item() for block in model.blocks]


def measure(args: argparse.Namespace, ids: torch.Tensor, vocab_size: int) -> None:
    """Print one row per (init, depth)."""
    n_train = int(0.9 * len(ids))
    print(
        f"d_model {args.d_model}, {args.heads} heads, ctx {args.ctx}, batch {args.batch}, "
        f"seeds {args.seeds}, vocab {vocab_size}, {n_train:,} training characters"
    )
    header = "init     L   post ‖g‖  pre ‖g‖  post/pre (seeds)       first/last post  pre"
    print(header)
    for init in args.inits:
        for depth in args.depths:
            last: dict[str, list[float]] = {p: [] for p in POSITIONS}
            profile: dict[str, list[float]] = {p: [] for p in POSITIONS}
            for seed in args.seeds:
                generator = torch.Generator().manual_seed(seed)
                starts = torch.randint(n_train - args.ctx - 1, (args.batch,), generator=generator)
                inputs, targets = batch_from(ids, starts, args.ctx)  # (B, T), (B, T)
                for position in POSITIONS:
                    cfg = ModelConfig(
                        vocab_size=vocab_size,
                        n_layer=depth,
                        n_head=args.heads,
                        d_model=args.d_model,
                        block_size=args.ctx,
                        norm_position=position,
                        init=init,
                    )
                    norms = fc_out_grad_norms(cfg, inputs, targets, seed)
                    last[position].append(norms[-1])
                    profile[position].append(norms[0] / norms[-1])
            post, pre = statistics.mean(last["post"]), statistics.mean(last["pre"])
            per_seed = [a / b for a, b in zip(last["post"], last["pre"], strict=True)]
            print(
                f"{init:<8} {depth:<3} {post:9.4f} {pre:8.4f} {post / pre:9.2f} "
                f"({min(per_seed):.2f}-{max(per_seed):.2f})"
                f"    {statistics.mean(profile['post']):10.2f} "
                f"{statistics.mean(profile['pre']):5.2f}",
                flush=True,
            )


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
    text = args.text.read_text(encoding="utf-8")
    vocab = CharVocab.from_text(text)
    print(f"text: {args.text}")
    measure(args, encode_tensor(vocab, text), vocab.size)


if __name__ == "__main__":
    main()
