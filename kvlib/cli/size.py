"""``python -m kvlib size``: the KV-cache bytes of a catalog model or a ``config.json`` (chapter 2).

Sized by :func:`kvlib.sizing.capacity.size_summary`, per GPU under ``--tensor-parallel-size``
and ``--pipeline-parallel-size`` as vLLM splits it (:mod:`kvlib.sizing.parallel`); a context
beyond the model's maximum is sized with a warning on stderr. Pure arithmetic: nothing here
loads torch.
"""

from __future__ import annotations

import json
import sys

from kvlib.cli.model_flags import MODEL_HELP, VERBOSE_HELP, check_parallel_flags, report_ignored_keys


def add_parser(subparsers) -> None:
    """Add ``size`` to the subparsers of ``python -m kvlib``."""
    size = subparsers.add_parser(
        "size", help="KV-cache bytes of a model: a catalog name or a config.json path"
    )
    size.add_argument("model", help=MODEL_HELP)
    size.add_argument("--context", type=int, required=True, help="tokens per sequence (prompt + generated)")
    size.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    size.add_argument("--kv-dtype", default="fp16", choices=("fp32", "fp16", "bf16", "fp8", "int8", "int4"))
    size.add_argument(
        "--tensor-parallel-size", type=int, default=1, metavar="N", help="GPUs splitting each layer's heads"
    )
    size.add_argument(
        "--pipeline-parallel-size", type=int, default=1, metavar="P", help="GPUs splitting the layers"
    )
    size.add_argument(
        "--encoder-tokens", type=int, metavar="T", help="encoder positions cross-attended (T5, BART, Whisper)"
    )
    size.add_argument(
        "--image-tokens", type=int, metavar="T", help="image tokens cross-attended (Llama-3.2-Vision)"
    )
    size.add_argument("--json", action="store_true", help="print one JSON object")
    size.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    size.set_defaults(func=run)


def run(args) -> int:
    """Size the cache; print the short table (or ``--json``), warning beyond the model's maximum."""
    from kvlib.sizing.capacity import format_summary, size_summary

    check_parallel_flags(args)
    summary = size_summary(
        args.model,
        args.context,
        args.batch,
        args.kv_dtype,
        args.tensor_parallel_size,
        args.pipeline_parallel_size,
        args.encoder_tokens,
        args.image_tokens,
    )
    if summary["exceeds_max_context"]:
        sys.stderr.write(
            f"kvlib: warning: context {summary['context']:,} exceeds {summary['model']}'s maximum of "
            f"{summary['max_context']:,} tokens (sized anyway, as for a RoPE-scaled context)\n"
        )
    if args.verbose:
        report_ignored_keys(args.model)
    print(json.dumps(summary) if args.json else format_summary(summary))
    return 0
