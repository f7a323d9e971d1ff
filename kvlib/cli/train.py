"""``python -m kvlib train``: train chapter 7's model, or uptrain a pooled copy of it (chapter 7).

Two forms, both seeded and both writing a safetensors file with its checksum
(:func:`~kvlib.train.checkpoint.save_model`):

- ``python -m kvlib train --out FILE`` trains :data:`~kvlib.train.trainer.QUALITY_MODEL` from
  its seeded initial weights for ``--steps`` steps (the shipped ``mha.safetensors``);
- ``python -m kvlib train --uptrain FILE --num-kv-heads G --out FILE2`` converts the model in
  ``FILE`` to ``G`` K/V heads (:func:`~kvlib.model.head_pooling.pool_kv_heads`, ``--pool mean``
  as the GQA paper does, or ``keep``) and trains it further for ``--steps`` steps on documents
  it has not seen (another ``--data-seed``) at the peak learning rate's last value.

torch is imported when the command runs, not when its flags are added (so that ``python -m kvlib
--help`` does not load it); ``make weights`` runs the four commands that made the shipped files.
Progress goes to stderr every 100 steps; the summary (steps, seconds, threads, last loss,
checksum) to stdout.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from kvlib import KVLibError

UPTRAIN_FRACTION = 0.05  # the GQA paper uptrains for 5 % of the pre-training steps
UPTRAIN_DATA_SEED = 1  # uptraining's documents are not the pre-training ones


def add_parser(subparsers) -> None:
    """Add ``train`` to the subparsers of ``python -m kvlib``."""
    p = subparsers.add_parser("train", help="train chapter 7's model (or uptrain a pooled copy) into a file")
    p.add_argument("--out", required=True, help="where to write the .safetensors file (and its .sha256)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default 2000, uptraining 5%%)")
    p.add_argument("--batch-size", type=int, default=8, help="documents per step")
    p.add_argument("--data-seed", type=int, default=None, help="seed of the documents (default 0; uptrain 1)")
    p.add_argument("--uptrain", metavar="FILE", help="start from this model, converted to --num-kv-heads")
    p.add_argument("--num-kv-heads", type=int, help="K/V heads of the converted model (with --uptrain)")
    p.add_argument("--pool", choices=("mean", "keep"), default="mean", help="how K/V heads are merged")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    """The handler of ``train``: build or convert the model, train it, save it, print a summary.

    Every flag is checked before the model is built, so that a mistake costs no training time.
    """
    check_train_args(args)
    import torch

    from kvlib.model.head_pooling import pool_kv_heads
    from kvlib.model.llama import TinyLlama
    from kvlib.train.checkpoint import load_model, save_model
    from kvlib.train.trainer import QUALITY_MODEL, TrainConfig, train

    base_steps = TrainConfig.num_steps
    if args.uptrain is None:
        model = TinyLlama(QUALITY_MODEL)
        steps = base_steps if args.steps is None else args.steps
        data_seed, peak = (0 if args.data_seed is None else args.data_seed), TrainConfig.peak_lr
        origin = {"from": "seeded initial weights", "seed": QUALITY_MODEL.seed}
    else:
        model = pool_kv_heads(load_model(Path(args.uptrain)), args.num_kv_heads, args.pool)
        model.requires_grad_(True)
        steps = round(UPTRAIN_FRACTION * base_steps) if args.steps is None else args.steps
        data_seed = UPTRAIN_DATA_SEED if args.data_seed is None else args.data_seed
        peak = TrainConfig.peak_lr * TrainConfig.min_lr_ratio  # where pre-training's schedule ended
        origin = {"from": Path(args.uptrain).name, "pool": args.pool, "num_kv_heads": args.num_kv_heads}
    config = TrainConfig(
        num_steps=steps,
        batch_size=args.batch_size,
        data_seed=data_seed,
        peak_lr=peak,
        warmup_steps=min(TrainConfig.warmup_steps, max(1, steps // 10)),
    )

    def progress(step: int, loss: float) -> None:
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {loss:.4f}", file=sys.stderr, flush=True)

    result = train(model, config, on_step=progress)
    info = {
        **origin,
        "num_steps": steps,
        "batch_size": config.batch_size,
        "data_seed": data_seed,
        "peak_lr": peak,
        "seconds": round(result.seconds, 1),
        "num_threads": result.num_threads,
        "torch": torch.__version__,
        "first_losses": [round(x, 4) for x in result.losses[:5]],
        "last_loss": round(result.losses[-1], 4),
    }
    info["sha256"] = save_model(model, Path(args.out), info)
    print(json.dumps(info, indent=2) if args.json else "\n".join(f"{k}: {v}" for k, v in info.items()))
    return 0


def check_train_args(args) -> None:
    """One-line :class:`~kvlib.KVLibError` naming the flag, for each flag that cannot work.

    ``--steps``, ``--batch-size``: positive; ``--data-seed``: in [0, 2**11) (the seeds of
    :mod:`kvlib.train.trainer`); ``--uptrain`` and ``--num-kv-heads`` together, ``--pool keep``
    only with them; ``--out``: a ``.safetensors`` path that is not a directory, in a folder that
    can be written.
    """
    from kvlib.train.trainer import MAX_BATCH_SIZE, MAX_DATA_SEED, MAX_STEPS

    if (args.uptrain is None) != (args.num_kv_heads is None):
        raise KVLibError("--uptrain and --num-kv-heads go together")
    if args.uptrain is None and args.pool != "mean":
        raise KVLibError("--pool applies to --uptrain only")
    if args.num_kv_heads is not None and args.num_kv_heads < 1:
        raise KVLibError(f"--num-kv-heads must be a positive integer, not {args.num_kv_heads}")
    if args.steps is not None and not 1 <= args.steps <= MAX_STEPS:
        raise KVLibError(f"--steps must be from 1 to 2**20, not {args.steps}")
    if args.batch_size < 1:
        raise KVLibError(f"--batch-size must be a positive integer, not {args.batch_size}")
    if args.batch_size > MAX_BATCH_SIZE:
        raise KVLibError(f"--batch-size must be at most {MAX_BATCH_SIZE} documents, not {args.batch_size}")
    if args.data_seed is not None and not 0 <= args.data_seed < MAX_DATA_SEED:
        raise KVLibError(f"--data-seed must be from 0 to {MAX_DATA_SEED - 1}, not {args.data_seed}")
    out = Path(args.out)
    if out.suffix != ".safetensors" or out.name == ".safetensors":
        raise KVLibError(f"--out must name a .safetensors file, not {args.out!r}")
    if out.is_dir():
        raise KVLibError(f"--out {args.out} is a directory")
    folder = next((p for p in (out.parent, *out.parent.parents) if p.exists()), Path("."))
    if not folder.is_dir() or not os.access(folder, os.W_OK) or not _can_create_in(folder):
        raise KVLibError(f"--out {args.out}: cannot write in {folder}")
    if args.uptrain is not None and not Path(args.uptrain).is_file():
        raise KVLibError(f"--uptrain: no model file at {args.uptrain}")


def _can_create_in(folder: Path) -> bool:
    """Can a file be created in ``folder``? Tried before training, not after it: the permission
    bits alone say yes for /proc or a read-only mount, where writing the model would then fail."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False
