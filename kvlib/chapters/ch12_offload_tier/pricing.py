"""The offload tier and swapping priced for a GPU (chapter 12): modelled, the same on every machine.

Both price copies over the link between GPU and host against the book's step model (OPT-13B on the
paper's A100, :func:`kvlib.serving.roofline.roofline_step_model`):

- a returning conversation's TTFT: recompute its history and message in one prefill, or copy the
  history's blocks in from the CPU tier (one gathered copy per layer for K and one for V) and
  prefill the message only (:func:`tier_ttft`), over each link of :data:`HOST_LINKS`;
- a preempted request's swap counted in copy calls (:class:`~kvlib.serving.swap.BlockCopyModel`):
  one call per block, per layer, for K and for V, as vLLM's first swap issued them, or one call per
  layer; the break-even with recomputation for both (:func:`swap_break_even`) and the block size
  below which per-block swapping loses at every length (:func:`per_block_break_even_block_size`).

The links, one direction each, from their specifications and data sheets: PCIe 4.0 x16, 16 GT/s a
lane, 128b/130b, 31.5 GB/s (PCI-SIG; the A100's); PCIe 5.0 x16, 32 GT/s a lane, 63.0 GB/s (PCI-SIG;
the H100 PCIe's); NVLink-C2C, 900 GB/s both directions, 450 GB/s each (NVIDIA GH200 data sheet).
Copies achieve :data:`ACHIEVED_FRACTION` of each, the fraction chapter 8 takes for PCIe 4.0 (25 GB/s).
The disk tier reads at :data:`NVME_READ_BYTES_PER_S` and then crosses the link. The GPU stays the
A100 for every link, so that only the link changes (a GH200's GPU computes faster, which shortens
the recomputation). Loads are not overlapped with the prefill here (LMCache can overlap them layer by
layer): a bound on the tier's TTFT from above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlib import KVLibError
from kvlib.chapters.ch08_serving_engines.swap_analysis import (
    A100_LINK_BYTES_PER_S,
    COPY_CALL_S,
    PCIE4_X16_BYTES_PER_S,
    BreakEven,
)
from kvlib.checks import require_int, require_real
from kvlib.serving.roofline import roofline_step_model
from kvlib.serving.step_time import StepTimeModel
from kvlib.serving.swap import BlockCopyModel
from kvlib.sizing.catalog import catalog_entry
from kvlib.sizing.spec import bytes_per_token

PCIE5_X16_BYTES_PER_S = 32e9 * 16 * 128 / 130 / 8  # 63.0 GB/s each way: 32 GT/s x 16 lanes, 128b/130b

NVLINK_C2C_BYTES_PER_S = 900e9 / 2  # GH200's CPU-GPU link: 900 GB/s both directions (NVIDIA data sheet)

ACHIEVED_FRACTION = A100_LINK_BYTES_PER_S / PCIE4_X16_BYTES_PER_S  # chapter 8's 25 of 31.5 GB/s: 79%

NVME_READ_BYTES_PER_S = 7.45e9  # a PCIe 4.0 NVMe SSD's sequential read (Samsung 990 PRO data sheet)

HOST_LINKS = {  # peak bytes per second, one direction
    "PCIe 4.0 x16": PCIE4_X16_BYTES_PER_S,
    "PCIe 5.0 x16": PCIE5_X16_BYTES_PER_S,
    "NVLink-C2C": NVLINK_C2C_BYTES_PER_S,
}

MODEL = "OPT-13B"  # the book's GPU model (chapters 4 and 8)

HISTORY_TOKENS = 1920  # the returning conversation priced: its history ...
MESSAGE_TOKENS = 128  # ... and its new message: 2,048 tokens, OPT-13B's context

PRICED_BLOCK_SIZE = 16


def copy_model(
    bandwidth: float, per_block: bool = False, block_size: int = PRICED_BLOCK_SIZE, model: str = MODEL
) -> BlockCopyModel:
    """Copies of ``model``'s fp16 K/V at ``bandwidth`` bytes/s, :data:`COPY_CALL_S` a call."""
    spec = catalog_entry(model).spec
    return BlockCopyModel(
        bytes_per_token(spec), spec.num_layers, block_size, bandwidth, COPY_CALL_S, per_block
    )


@dataclass(frozen=True)
class TierTTFT:
    """A returning conversation's first token, priced (seconds)."""

    link: str
    bandwidth: float  # bytes/s achieved
    recompute_s: float  # one prefill of history and message
    load_s: float  # the history's blocks copied in
    prefill_s: float  # the message prefilled over the loaded history

    @property
    def tier_s(self) -> float:
        """TTFT with the tier: the load, then the message's prefill (not overlapped)."""
        return self.load_s + self.prefill_s

    @property
    def ratio(self) -> float:
        """TTFT with the tier over TTFT without."""
        return self.tier_s / self.recompute_s


def tier_ttft(
    link: str,
    history_tokens: int = HISTORY_TOKENS,
    message_tokens: int = MESSAGE_TOKENS,
    step_model: StepTimeModel | None = None,
    from_disk: bool = False,
) -> TierTTFT:
    """:class:`TierTTFT` over one link of :data:`HOST_LINKS` (``from_disk``: at the NVMe speed if slower)."""
    if link not in HOST_LINKS:
        raise KVLibError(f"link must be one of {', '.join(HOST_LINKS)}, not {link!r}")
    history = require_int(history_tokens, "history_tokens", 0)
    message = require_int(message_tokens, "message_tokens")
    step_model = roofline_step_model(MODEL) if step_model is None else step_model
    bandwidth = ACHIEVED_FRACTION * HOST_LINKS[link]
    if from_disk:
        bandwidth = min(bandwidth, NVME_READ_BYTES_PER_S)
    return TierTTFT(
        link + (" from NVMe" if from_disk else ""),
        bandwidth,
        recompute_s=float(step_model.predict(0, 0, history + message)),
        load_s=copy_model(bandwidth).transfer_s(history),
        prefill_s=float(step_model.predict(0, history, message)),
    )


def tie_bandwidth(history_tokens: int = HISTORY_TOKENS, message_tokens: int = MESSAGE_TOKENS) -> float:
    """Link bytes/s at which loading the history costs what recomputing it saves (the tier pays above it)."""
    ttft = tier_ttft("PCIe 4.0 x16", history_tokens, message_tokens)
    saved = ttft.recompute_s - ttft.prefill_s - copy_model(1.0).fixed_s
    if saved <= 0:
        return math.inf
    return require_real(copy_model(1.0).bytes_per_token * history_tokens / saved, "the tie bandwidth")


def swap_break_even(block_size: int, per_block: bool, bandwidth: float = A100_LINK_BYTES_PER_S) -> BreakEven:
    """Chapter 8's two lines (recompute, swap out and back in) with the swap's copies counted in calls."""
    step_model = roofline_step_model(MODEL)
    copies = copy_model(bandwidth, per_block, block_size)
    return BreakEven(
        recompute_fixed_s=step_model.per_seq_s,
        recompute_per_token_s=step_model.per_prefill_s,
        swap_fixed_s=2 * copies.fixed_s,
        swap_per_token_s=2 * copies.per_token_s,
        tie_bandwidth=2 * copies.bytes_per_token / step_model.per_prefill_s,
    )


def per_block_break_even_block_size(bandwidth: float = A100_LINK_BYTES_PER_S) -> float:
    """The block size at which per-block swapping's slope equals recomputation's: below it, swapping
    loses at every length. ``2 x (bytes / bandwidth + 2 x layers x call / B) = per_prefill_s``."""
    step_model, copies = roofline_step_model(MODEL), copy_model(bandwidth, True, 1)
    room = step_model.per_prefill_s - 2 * copies.bytes_per_token / copies.bandwidth
    return math.inf if room <= 0 else 4 * copies.num_layers * copies.per_call_s / room


def verdict(line: BreakEven) -> str:
    """Which way resumes a request cheaper, and from which length: "swap above 43 tokens", "recompute above
    3 tokens", or "swap at every length" (lines that cross at no positive length)."""
    crossing, long = line.crossing_tokens, line.cheaper_for_long
    if not 0 < crossing < math.inf:
        return f"{long} at every length"
    tokens = math.ceil(crossing)
    return f"{long} above {tokens} token" + ("" if tokens == 1 else "s")


def swap_rows(block_sizes=(1, 4, 16, 32, 64, 128, 256)) -> list[dict]:
    """Per block size: which of swapping and recomputation wins, with per-block and with per-layer
    copies, and each one's effective bandwidth on a 2,048-token request (rows for a table)."""
    rows = []
    for size in block_sizes:
        row = {"block_size": size}
        for label, per_block in (("per block", True), ("per layer", False)):
            row[f"{label}: cheaper"] = verdict(swap_break_even(size, per_block))
            copies = copy_model(A100_LINK_BYTES_PER_S, per_block, size)
            row[f"{label}: GB/s achieved"] = copies.effective_bandwidth(2048) / 1e9
        rows.append(row)
    return rows


def ttft_curves(lengths=tuple(range(0, 1921, 64)), message_tokens: int = MESSAGE_TOKENS) -> dict:
    """TTFT against the history's length: recomputation, each link's CPU tier, and the disk tier read
    over PCIe 5.0 (label -> (lengths, seconds)), for :func:`kvlib.plotting.offload.draw_tier_ttft`."""
    lengths = list(lengths)
    curves = {
        "recompute": (lengths, [tier_ttft(ANY_HOST_LINK, n, message_tokens).recompute_s for n in lengths])
    }
    for link in HOST_LINKS:
        curves[f"CPU tier over {link}"] = (
            lengths,
            [tier_ttft(link, n, message_tokens).tier_s for n in lengths],
        )
    disk = [tier_ttft("PCIe 5.0 x16", n, message_tokens, from_disk=True).tier_s for n in lengths]
    curves["disk tier (NVMe) over PCIe 5.0 x16"] = (lengths, disk)
    return curves


ANY_HOST_LINK = next(iter(HOST_LINKS))  # any link: recomputation does not use it
