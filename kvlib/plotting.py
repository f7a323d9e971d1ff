"""(from article.py) The source article's cache experiment, redone in NumPy in our own code (chapter 1).

The article {cite}`kvarticle` times two loops over random weights with d_model 256 and
4 layers: one that recomputes the keys and values of every earlier token at each step,
and one that keeps them and appends the new token's. Its loops do the attention
arithmetic only: no softmax, no output projection, no MLP, and each layer reads the
same input instead of the previous layer's output. We keep that setup (so that the
numbers can be set beside the article's), with two differences: our inputs are drawn
once before the clock starts (the article draws fresh random inputs inside its timed
loops), and both loops return the last token's attention output, so that we can check
they compute the same thing.

Both loops are timed the same way (:func:`reproduce`): the same number of rounds, the two
loops taking turns within each round, and the fastest run of each compared, so that a
burst of load from another program cannot favour one of them. :func:`step_profile` times
every step of the cached loop; :func:`cached_working_set` and :func:`cached_step_traffic`
count the bytes one such step touches and moves, which the chapter compares with the
last-level cache to explain how the cached loop's time grows, and :func:`loop_flops`
counts each loop's arithmetic.

(from calculator.py) KV-cache calculator: the sizing of chapter 2 for any catalog model, GPU and KV dtype.

:func:`capacity_report` does the arithmetic (and is what the tests check);
:func:`calculator` wraps it in ipywidgets for readers who run the notebook locally.
:func:`capacity_overview` and :func:`plot_max_batch` are the static table and plot shown
beside the widget, so that readers of the online book see the same numbers.

(from costmodel.py) Counting the work of generation with and without a KV cache (chapter 1).

:func:`forward_flops` counts the floating-point operations of one forward pass of
:class:`~kvlib.model.TinyLlama` (a multiply-add is 2 FLOPs), split into the K/V
projections, the other attention projections (Q and O), the attention itself and the
MLP, plus the output projection of the last position. :func:`step_flops` applies it to
every step of a greedy generation: without a cache, step t runs the model over all t
tokens; with one, over the newest token only, against t stored keys.

A FLOP count predicts a speedup of about n / 2 at n tokens, far more than a small model
shows. :func:`fit_step_time` adds the missing term, a fixed cost per step (launching
the operations and reading every weight once): step time = overhead + FLOPs / rate.
:func:`growth_exponent` fits how total time grows with length on a log-log scale.

:func:`concat_copy_table` asks when the concatenation trap matters for real models: a
decode step reads every weight once and the whole cache, whatever the cache does, and a
cache grown by concatenation also reads and writes the whole cache again. The table gives
the context at which that copy reaches a given share of the bytes the step reads anyway,
exactly, from the catalog's configurations and parameter counts.

(from decode.py) Why fewer KV heads decode faster: one decode step's attention reads the whole cache (chapter 2).

At each generated token, every layer's attention has one query per sequence and must read
the whole K and V cache of that layer once. It does about 4 x num_heads x head_dim floating
point operations per cached token, against 2 x num_kv_heads x head_dim values read, so its
arithmetic intensity (FLOPs per byte) is tiny for MHA and grows with the group size
num_heads / num_kv_heads. Shazeer's argument for MQA (2019) is that the
time is set by the bytes read: time = K/V bytes / memory bandwidth. This module measures
that time for several numbers of KV heads and context lengths and turns it into achieved
GB/s (bytes read / time) and GFLOP/s, to set beside the bandwidth probe of
:func:`kvlib.measure.memory_bandwidth` on a roofline plot.

Sizes come from the hardware (:func:`decode_setup`): at the longest context K and V each
exceed four times the last-level cache (else they are read from cache, faster than
memory), and on a GPU reading them also takes far longer than launching the kernels.
:func:`bound_breakdown` shows what bounds PyTorch's products on this machine when
they do not reach the memory's rate. On the CPU the
experiment runs on one thread, bandwidth probe included: on a shared machine a
multi-threaded kernel waits at each barrier for a descheduled thread, which makes a small
step as slow as a large one; one thread gives every configuration the same conditions.

(from encdec.py) A small encoder-decoder with cross-attention, to see which cache grows (chapter 1).

In an encoder-decoder (the original Transformer {cite}`vaswani2017attention`, T5,
Whisper) every decoder layer has two attentions. Self-attention looks at the tokens
generated so far, so its cache gains one key and one value per layer at every step.
Cross-attention looks at the encoder's output, which is fixed once the input is
encoded, so its keys and values are computed once and never grow. This model reuses
:mod:`kvlib.model`'s blocks: the encoder is a stack of decoder blocks whose attention
sees every position (:class:`FullAttention`), and each decoder block adds a
:class:`CrossAttention` between self-attention and the MLP.

(from levers.py) Putting the levers together: one model, the levers applied one at a time (chapter 5).

The KV cache of a server depends on three things, each with its levers:

- **how much is cached**: how many layers keep a cache (a hybrid such as Jamba keeps
  attention in one layer of eight; the others are Mamba layers with a fixed-size state);
- **how big each entry is**: KV heads (GQA, MQA), latent attention (MLA), bytes per number
  (fp8, int8 and int4 with their scales);
- **where it is placed**: reserved contiguously for the maximum length, or paged in blocks,
  with a shared prefix stored once (prefix caching).

:func:`apply_lever` applies one lever to a :class:`Variant` and records the factor by which
the lever, by its definition, multiplies the bytes of one token; chapter 5 checks that
:mod:`kvlib.sizing` agrees with the product of these factors exactly. :func:`serve` turns a
variant into what a GPU does with it: the KV budget it leaves (:func:`kv_budget`), how many
full-length sequences fit (:func:`max_batch`), and a roofline step-time model of that GPU
(:func:`roofline_step`, chapter 4's one A100 model applied to the variant) for the simulator
of chapter 4 (:func:`kvlib.simulator.simulate`).

(from nocache.py) Chapter 1's measurement: greedy decoding with and without a KV cache, step by step.

:func:`race` runs several :class:`~kvlib.generate.Decoder` modes side by side on the same
prompt. At every step each mode generates its next token and the step is timed with
:func:`~kvlib.measure.time_it`; the modes take turns going first, so a burst of load
from other programs falls on both. One run to N tokens gives the totals for every
shorter length too (the first n steps of a greedy run do not depend on N), the
per-token latency at every position, and a check that every mode chose the same
tokens from logits that agree to rounding error.

Sizes depend on the device (:func:`nocache_setup`); the chapter explains the choice. The
concatenation trap (:func:`concat_trap`) is timed up to a cache larger than four times the
last-level cache (:func:`~kvlib.measure.dram_bytes`), so that its longest point measures
copies from DRAM, as a real model's would be. :func:`~kvlib.measure.time_interleaved` is the one protocol
by which the chapter compares two functions: rounds in which each runs once, in turns.

(from plotting.py) Small matplotlib helpers so that every chapter's figures look alike.

Chapter-specific drawings live here too, one function per figure, each naming its chapter.

(from sizing.py) Exact KV-cache byte counts for real models (chapter 2).

The cache of one attention layer holds, for every cached token, one key and one value
vector per KV head, so the whole cache is

    bytes = 2 x num_attention_layers x num_kv_heads x head_dim x tokens x batch x bytes_per_value

(the formula of the source article of this book). Real models bend it in five ways,
all handled here from a single description, :class:`ModelSpec`:

- **GQA / MQA**: ``num_kv_heads`` below ``num_heads`` (MQA: one).
- **Sliding-window layers** (Mistral, Gemma-2): such a layer never caches more than its
  window, ``min(tokens, window)`` tokens.
- **Hybrid models** (Jamba): only some layers are attention layers; the others keep a
  fixed-size state and no KV cache.
- **MLA** (DeepSeek-V2/V3): each layer caches one latent vector of
  ``kv_lora_rank + qk_rope_head_dim`` values per token, shared by all heads, instead of
  K and V per head.
- **Encoder-decoder models** (Whisper): every decoder layer also caches the cross-attention
  K and V of all encoder positions, computed once per input and not growing with the output.

KV quantization is a :class:`KVDtype`: fp8 stores one byte per value (with one scale per
tensor, which we neglect); int8 and int4 store 8 or 4 bits per value plus, for every
group of ``group_size`` consecutive values of a vector (default 32), one fp16 scale and
one fp16 zero point (asymmetric min-max quantization, as in KIVI-style KV quantizers).

:func:`spec_from_config` builds a description from a Hugging Face ``config.json``;
``kvlib/catalog/*.json`` ships real models (each file quotes its config and its source).
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import torch

from kvlib.cache.article import cached_working_set, llc_crossing
from kvlib.cache.concat_trap import TrapPoint
from kvlib.cache.decode_speed import DecodeMeasurement
from kvlib.cache.generation import EncDecGeneration
from kvlib.cache.nocache_race import Race
from kvlib.sizing.catalog import catalog_entry, catalog_table
from kvlib.sizing.dtypes import KVDtype, kv_dtype
from kvlib.sizing.widget import capacity_report


def draw_step_profile(seconds: np.ndarray, llc: int, d_model: int = 256, num_layers: int = 4):
    """Microseconds of each cached step against the cache length, with the step's working set
    (right axis) and the last-level cache marked where the working set reaches it."""
    from kvlib.plotting import axes

    fig, ax = axes("The article's cached loop, step by step", "tokens in the cache", "microseconds per step")
    tokens = np.arange(1, len(seconds) + 1)
    ax.plot(
        tokens, np.asarray(seconds) * 1e6, lw=0.8, color="C0", label="time of the step (fastest of the runs)"
    )
    right = ax.twinx()
    mib = [cached_working_set(int(t), d_model, num_layers) / 2**20 for t in tokens]
    right.plot(tokens, mib, ls="--", color="C2", label="bytes the step touches (MiB)")
    right.set_ylabel("MiB the step touches")
    crossing = llc_crossing(llc, d_model, num_layers)
    if crossing <= len(seconds):
        ax.axvline(
            crossing, color="grey", ls=":", label=f"working set passes the LLC ({llc / 2**20:.0f} MiB)"
        )
    lines = ax.get_legend_handles_labels()
    extra = right.get_legend_handles_labels()
    ax.legend(lines[0] + extra[0], lines[1] + extra[1], loc="upper left", fontsize=8)
    return fig


def draw_max_batch(
    models=("Llama-2-7B", "Llama-3-8B", "Mistral-7B-v0.1", "Gemma-2-9B", "Falcon-7B"),
    gpu_gib: float = 80.0,
    overhead_gib: float = 4.0,
    kv_dtype: str = "fp16",
):
    """Max batch against context on one GPU (bf16 weights): the static plot beside the calculator."""
    from kvlib.plotting import axes

    fig, ax = axes(
        f"Sequences that fit in {gpu_gib:g} GiB of GPU memory ({kv_dtype} cache, bf16 weights)",
        "context (tokens)",
        "max batch",
        logx=True,
        logy=True,
    )
    for name in models:
        limit = catalog_entry(name).spec.max_context
        contexts = [c for c in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768) if c <= limit]
        batches = [
            capacity_report(name, c, 1, kv_dtype, gpu_gib, "bf16", overhead_gib)["max_batch"]
            for c in contexts
        ]
        ax.plot(contexts, batches, "o-", label=name)
    ax.legend(fontsize=8)
    return fig


def draw_growth(lengths, totals: dict, exponents: dict):
    """Total generation time against length on log-log axes, one line per way, with fitted slopes."""
    from kvlib.plotting import axes

    fig, ax = axes(
        "Total time grows like length^k", "generated tokens", "seconds in total", logx=True, logy=True
    )
    for (name, values), color in zip(totals.items(), ("C3", "C0", "C1")):
        ax.plot(lengths, values, "o-", color=color, label=f"{name}: k = {exponents[name]:.2f}")
    ax.legend()
    return fig


def draw_roofline(measurements: list[DecodeMeasurement], probe_gbps: float, peak_gflops: float):
    """Achieved GFLOP/s against FLOPs per byte, under the memory roof (probe) and the compute roof."""
    from kvlib.plotting import axes

    fig, ax = axes(
        "Decode attention on a roofline",
        "arithmetic intensity (FLOPs per byte of K/V)",
        "achieved GFLOP/s",
        logx=True,
        logy=True,
    )
    xs = [m.intensity for m in measurements]
    grid = torch.logspace(math.log10(min(xs) / 2), math.log10(max(xs) * 2), 50).tolist()
    ax.plot(
        grid,
        [min(probe_gbps * x, peak_gflops) for x in grid],
        "k-",
        lw=1,
        label=f"roof: {probe_gbps:.0f} GB/s probe, {peak_gflops:.0f} GFLOP/s matmul",
    )
    contexts = sorted({m.context for m in measurements})
    for context, marker in zip(contexts, "o^sDv"):
        points = [m for m in measurements if m.context == context]
        ax.scatter(
            [m.intensity for m in points],
            [m.gflops for m in points],
            marker=marker,
            label=f"context {context:,}",
        )
        for m in points:
            ax.annotate(
                f"{m.num_kv_heads}",
                (m.intensity, m.gflops),
                textcoords="offset points",
                xytext=(4, -10),
                fontsize=7,
            )
    ax.legend(fontsize=8, title="point labels: KV heads", title_fontsize=8)
    return fig


def draw_decode_times(measurements: list[DecodeMeasurement]):
    """Time of one decode step's attention against context, one line per number of KV heads."""
    from kvlib.plotting import axes

    fig, ax = axes(
        "One decode step's attention (one layer)", "context (tokens)", "time (ms)", logx=True, logy=True
    )
    for kv in sorted({m.num_kv_heads for m in measurements}, reverse=True):
        points = sorted((m for m in measurements if m.num_kv_heads == kv), key=lambda m: m.context)
        ax.plot(
            [m.context for m in points],
            [m.timing.median_s * 1e3 for m in points],
            "o-",
            label=f"{kv} KV heads",
        )
    ax.legend(fontsize=8)
    return fig


def draw_encdec_cache_bytes(run: EncDecGeneration):
    """Bytes held by the self-attention and the cross-attention cache after each generated token."""
    from kvlib.plotting import axes

    fig, ax = axes("Which cache grows", "generated tokens", "KiB held", size=(6.4, 3.2))
    steps = range(1, len(run.self_cache_bytes) + 1)
    ax.plot(steps, [b / 1024 for b in run.self_cache_bytes], color="C0", label="self-attention K/V")
    ax.plot(steps, [b / 1024 for b in run.cross_cache_bytes], color="C2", label="cross-attention K/V")
    ax.set_ylim(bottom=0)
    ax.legend()
    return fig


def draw_chain(rows: list[dict], context: int, max_num_seqs: int | None = None):
    """Chapter 5: the cumulative effect of the levers, each quantity relative to the baseline (log scale),
    with the scheduler's cap on running requests as a dotted line when ``max_num_seqs`` is given."""
    from kvlib.plotting import axes

    fig, ax = axes(
        "Levers applied one after another (relative to the baseline)",
        "",
        "x baseline (log scale)",
        logy=True,
        size=(7.5, 4.4),
    )
    steps = range(len(rows))
    lines = {
        "KV bytes per token, smaller by": [rows[0]["KV bytes/token"] / r["KV bytes/token"] for r in rows],
        "KV per running sequence, smaller by": [
            rows[0]["KV per running sequence (MiB)"] / r["KV per running sequence (MiB)"] for r in rows
        ],
        f"max batch at {context:,} (capacity planning)": [
            r[f"max batch at {context:,}"] / rows[0][f"max batch at {context:,}"] for r in rows
        ],
        "mean running batch (simulated)": [
            r["mean running batch"] / rows[0]["mean running batch"] for r in rows
        ],
        "tokens/s (simulated)": [r["x baseline"] for r in rows],
    }
    for (label, values), marker in zip(lines.items(), "osD^v"):
        ax.plot(steps, values, marker=marker, label=label)
        ax.annotate(
            f"{values[-1]:.3g}x",
            (steps[-1], values[-1]),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=7,
        )
    if max_num_seqs:
        cap = max_num_seqs / rows[0]["mean running batch"]
        ax.axhline(cap, color="tab:red", linestyle=":", linewidth=1)
        ax.annotate(
            f"scheduler's cap: {max_num_seqs} running requests",
            (0, cap),
            xytext=(0, 3),
            textcoords="offset points",
            fontsize=7,
            color="tab:red",
        )
    ax.set_xticks(
        list(steps), [f"{r['step']}. {r['lever']}" for r in rows], rotation=20, ha="right", fontsize=8
    )
    ax.set_xlim(-0.3, len(rows) - 0.4)
    ax.legend(fontsize=7, loc="upper left")
    return fig


def draw_step_latency(result: Race, long_cache: Race | None = None, pass_lengths=(), pass_s=()):
    """Seconds per generated token against its position: no cache (steps, then timed passes) and cache."""
    from kvlib.plotting import axes

    fig, ax = axes(
        "Time of each generation step", "position of the generated token", "seconds per step", logy=True
    )
    steps = np.arange(1, result.num_new + 1)
    ax.plot(steps, result.step_s["none"], lw=0.8, color="C3", label="no cache (every step)")
    if len(pass_lengths):
        ax.plot(pass_lengths, pass_s, "o", ms=4, color="C3", label="no cache (timed passes)")
    cached = long_cache.step_s["cache"] if long_cache is not None else result.step_s["cache"]
    ax.plot(np.arange(1, len(cached) + 1), cached, lw=0.8, color="C0", label="preallocated cache")
    ax.legend()
    return fig


def draw_concat_trap(points: list[TrapPoint], decode_step_s: float | None = None):
    """Cache work per decode step against cache length, both ways (log-log), beside a whole decode step."""
    from kvlib.plotting import axes

    fig, ax = axes(
        "Growing the cache by concatenation",
        "tokens in the cache",
        "seconds per step (cache work)",
        logx=True,
        logy=True,
    )
    lengths = [p.length for p in points]
    ax.plot(
        lengths,
        [p.preallocated.median_s for p in points],
        "o-",
        color="C0",
        label="preallocated, written in place",
    )
    ax.plot(lengths, [p.concat.median_s for p in points], "o-", color="C1", label="grown by torch.cat")
    if decode_step_s is not None:
        ax.axhline(decode_step_s, color="grey", ls=":", label="a whole cached decode step (short cache)")
    ax.legend()
    return fig


@matplotlib.ticker.FuncFormatter
def _plain(value, _pos=None) -> str:
    """Log-axis ticks as plain numbers (0.5, 16, 1,000), not powers of ten."""
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def axes(title: str, xlabel: str, ylabel: str, *, logx: bool = False, logy: bool = False, size=(6.4, 3.8)):
    """A new figure with one labelled axes (grid on, log scales as asked); returns (fig, ax)."""
    fig, ax = plt.subplots(figsize=size, layout="constrained")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(_plain)
    if logy:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_plain)
    ax.grid(True, which="both", alpha=0.3)
    return fig, ax


_SEQ_COLORS = ("#4c72b0", "#55a868", "#c44e52", "#8172b2", "#937860", "#64b5cd")

_SHARED = "#dd8452"


def _draw_block(ax, x: float, y: float, filled: int, block_size: int, color: str, label: str, hatch=None):
    """One block as ``block_size`` cells, the first ``filled`` coloured; its label above."""
    for i in range(block_size):
        face = color if i < filled else "white"
        ax.add_patch(
            plt.Rectangle(
                (x + i / block_size, y),
                1 / block_size,
                0.6,
                facecolor=face,
                edgecolor="black",
                linewidth=0.6,
                hatch=hatch if i < filled else None,
            )
        )
    ax.text(x + 0.5, y + 0.68, label, ha="center", va="bottom", fontsize=7)


def draw_block_tables(snapshots, size=None):
    """Chapter 3: block tables (left: each sequence's logical blocks) pointing into the pool (right).

    ``snapshots``: a list of (title, :class:`kvlib.paged.BlockSnapshot`), drawn side by side.
    Filled cells are token slots in use; blocks shared by several sequences (ref_cnt > 1)
    are orange and hatched; each physical block is labelled with its id and ref_cnt.
    """
    fig, axs = plt.subplots(
        1, len(snapshots), figsize=size or (4.6 * len(snapshots), 3.8), layout="constrained"
    )
    for ax, (title, snap) in zip([axs] if len(snapshots) == 1 else axs, snapshots):
        _draw_one_snapshot(ax, snap)
        ax.set_title(title, fontsize=9)
    return fig


def _draw_one_snapshot(ax, snap):
    bs, seqs = snap.block_size, sorted(snap.block_tables)
    width = max((len(snap.block_tables[s]) for s in seqs), default=1)
    pool_x, pool_gap = width * 1.3 + 1.6, 0.85
    row_gap = max(1.2, (snap.num_blocks - 1) * pool_gap / max(len(seqs) - 1, 1))
    stored, owner = {}, {}
    for row, seq in enumerate(seqs):
        y, color = -row * row_gap, _SEQ_COLORS[row % len(_SEQ_COLORS)]
        ax.text(
            -0.2,
            y + 0.3,
            f"seq {seq}\n{snap.num_tokens[seq]} tokens",
            ha="right",
            va="center",
            fontsize=8,
            color=color,
        )
        for i, block in enumerate(snap.block_tables[seq]):
            filled = min(bs, snap.num_tokens[seq] - i * bs)
            stored[block], owner[block] = max(stored.get(block, 0), filled), row
            shared = snap.ref_cnt.get(block, 0) > 1
            _draw_block(
                ax,
                i * 1.3,
                y,
                filled,
                bs,
                _SHARED if shared else color,
                f"→ {block}",
                "//" if shared else None,
            )
            ax.annotate(
                "",
                xy=(pool_x - 0.05, -block * pool_gap + 0.3),
                xytext=(i * 1.3 + 1, y + 0.3),
                arrowprops=dict(arrowstyle="->", color=color, lw=0.7, alpha=0.6),
            )
    for block in range(snap.num_blocks):
        ref = snap.ref_cnt.get(block, 0)
        color = _SHARED if ref > 1 else _SEQ_COLORS[owner[block] % len(_SEQ_COLORS)] if ref else "white"
        _draw_block(
            ax, pool_x, -block * pool_gap, stored.get(block, 0), bs, color, "", "//" if ref > 1 else None
        )
        ax.text(
            pool_x + 1.1,
            -block * pool_gap + 0.3,
            f"{block}  (ref {ref})" if ref else f"{block}  free",
            va="center",
            fontsize=7,
        )
    ax.text(width * 0.65, 1.1, "block tables", ha="center", fontsize=8, style="italic")
    ax.text(pool_x + 0.5, 1.1, "physical blocks", ha="center", fontsize=8, style="italic")
    ax.set_xlim(-1.6, pool_x + 2.6)
    ax.set_ylim(min(-(len(seqs) - 1) * row_gap, -(snap.num_blocks - 1) * pool_gap) - 0.3, 1.4)
    ax.axis("off")


def draw_memory_waste(schemes: dict[str, tuple[float, float]], unit: str = "MiB"):
    """Chapter 3: stacked bars of memory holding tokens vs reserved but empty, one bar per scheme.

    ``schemes``: name -> (used, wasted) in ``unit``.
    """
    fig, ax = axes("KV memory: holding tokens vs reserved but empty", "", unit, size=(5.6, 3.6))
    names = list(schemes)
    used = [schemes[n][0] for n in names]
    wasted = [schemes[n][1] for n in names]
    ax.bar(names, used, color="#4c72b0", label="holds real tokens")
    ax.bar(names, wasted, bottom=used, color="#c44e52", alpha=0.75, label="reserved, empty")
    for i, (u, w) in enumerate(zip(used, wasted)):
        ax.text(i, u + w, f"{100 * w / (u + w):.1f}% wasted", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, max(u + w for u, w in zip(used, wasted)) * 1.15)
    ax.legend(loc="upper right", fontsize=8)
    return fig


def draw_kernel_overhead(rows, paper_range=(1.20, 1.26)):
    """Chapter 3: paged / contiguous decode-attention time against block size, one line per length,
    with the vLLM paper's kernel overhead range shaded. ``rows``: dicts with length, block_size, ratio."""
    fig, ax = axes(
        "Paged attention kernel: time relative to contiguous",
        "block size (tokens)",
        "paged / contiguous time",
        logx=True,
        size=(8.4, 3.8),
    )
    for length in sorted({r["length"] for r in rows}):
        points = sorted((r["block_size"], r["ratio"]) for r in rows if r["length"] == length)
        ax.plot(*zip(*points), marker="o", label=f"{length} tokens")
    ax.axhspan(*paper_range, color="#dd8452", alpha=0.3, label="vLLM kernel vs FasterTransformer (paper)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    sizes = sorted({r["block_size"] for r in rows})
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_ylim(0, None)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


_POLICY_COLORS = {"max": "#c44e52", "pow2": "#dd8452", "oracle": "#8172b2", "paged": "#4c72b0"}

_CATEGORY_COLORS = {
    "tokens": "#4c72b0",
    "reserved": "#8da0cb",
    "internal": "#dd8452",
    "external": "#c44e52",
    "free": "#e0e0e0",
}


def draw_length_histograms(samples: dict, targets: dict):
    """Chapter 4: prompt and output lengths of each trace (log-spaced bins), the paper's means as dashed lines.

    ``samples``: trace name -> (prompt lengths, output lengths); ``targets``: name -> (mean prompt, mean output).
    """
    import numpy as np

    fig, axs = plt.subplots(
        len(samples), 2, figsize=(8.4, 2.6 * len(samples)), layout="constrained", squeeze=False
    )
    for row, (name, lengths) in enumerate(samples.items()):
        for col, (values, target, what) in enumerate(zip(lengths, targets[name], ("prompt", "output"))):
            ax = axs[row, col]
            ax.hist(values, bins=np.geomspace(1, 2048, 40), color="#4c72b0", alpha=0.8)
            ax.axvline(target, color="black", linestyle="--", label=f"paper's mean {target:.2f}")
            ax.axvline(np.mean(values), color="#dd8452", label=f"sample mean {np.mean(values):.1f}")
            ax.set_xscale("log")
            ax.set_title(f"{name}: {what} tokens", fontsize=9)
            ax.set_xlabel("tokens (log scale)", fontsize=8)
            ax.set_ylabel("requests", fontsize=8)
            ax.legend(fontsize=7)
            ax.grid(True, alpha=0.3)
    return fig


def draw_memory_breakdown(rows: list[dict], paper: dict):
    """Chapter 4: where the KV budget goes under each policy (stacked %), the paper's token share as a marker.

    ``rows``: dicts with "policy" and "<category> (%)" for tokens, reserved, internal, external, free.
    """
    fig, ax = axes("KV budget while requests wait", "", "share of the budget (%)", size=(6.8, 3.8))
    names = [r["policy"] for r in rows]
    bottom = [0.0] * len(rows)
    labels = {
        "tokens": "holds tokens",
        "reserved": "reserved for future tokens",
        "internal": "internal fragmentation",
        "external": "external fragmentation",
        "free": "free",
    }
    for category, color in _CATEGORY_COLORS.items():
        values = [r[f"{category} (%)"] for r in rows]
        ax.bar(
            names,
            values,
            bottom=bottom,
            color=color,
            label=labels[category],
            edgecolor="white",
            linewidth=0.5,
        )
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.scatter(
        names,
        [100 * paper[n] for n in names],
        marker="D",
        color="black",
        zorder=3,
        label="paper: holds tokens",
    )
    for i, r in enumerate(rows):
        ax.text(
            i,
            r["tokens (%)"] / 2,
            f"{r['tokens (%)']:.1f}%",
            ha="center",
            va="center",
            color="white",
            fontsize=8,
        )
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def draw_latency_curves(rows: list[dict]):
    """Chapter 4: normalised latency (s per output token) against request rate, one panel per trace."""
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    fig, axs = plt.subplots(
        1, len(traces), figsize=(4.4 * len(traces), 3.6), layout="constrained", squeeze=False
    )
    for ax, trace in zip(axs[0], traces):
        for policy, color in _POLICY_COLORS.items():
            points = sorted(
                (r["rate"], r["s per token"]) for r in rows if r["trace"] == trace and r["policy"] == policy
            )
            if points:
                ax.plot(*zip(*points), marker="o", markersize=3, color=color, label=policy)
        ax.set_yscale("log")
        ax.set_title(trace, fontsize=9)
        ax.set_xlabel("request rate (requests/s)")
        ax.set_ylabel("normalised latency (s / token)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def draw_regime_curve(rows: list[dict], marks: dict, paper: dict):
    """Chapter 4: throughput of paged over each reservation policy against the fixed share of a decode step.

    ``rows``: dicts with "fixed share" and "paged / <policy>"; ``marks``: label -> (share, {policy: ratio});
    ``paper``: policy -> (low, high) range of the paper's ratio, drawn as bands.
    """
    fig, ax = axes(
        "How much of the bigger batch becomes throughput",
        "fixed share of a decode step",
        "throughput: paged / policy",
        size=(7.4, 4.0),
    )
    shares = [r["fixed share"] for r in rows]
    for policy in ("max", "pow2", "oracle"):
        color = _POLICY_COLORS[policy]
        ax.plot(shares, [r[f"paged / {policy}"] for r in rows], color=color, label=f"paged / {policy}")
        if policy in paper:
            ax.axhspan(
                *paper[policy], color=color, alpha=0.12, label=f"paper: vLLM / Orca-{policy.capitalize()}"
            )
    for (label, (share, values)), marker in zip(marks.items(), ("o", "s", "^")):
        for policy in ("max", "pow2", "oracle"):
            ax.scatter(
                [share],
                [values[policy]],
                marker=marker,
                color=_POLICY_COLORS[policy],
                edgecolor="black",
                zorder=3,
            )
        ax.scatter([], [], marker=marker, color="white", edgecolor="black", label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlim(0, 1.02)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def draw_catalog(dtype: str | KVDtype = "fp16"):
    """Cache of one sequence at each catalog model's maximum context (log scale), coloured by kind."""
    from matplotlib.patches import Patch

    from kvlib.plotting import axes

    rows = catalog_table(dtype)[::-1]
    fig, ax = axes(
        f"KV cache of one sequence at the model's maximum context ({kv_dtype(dtype).name})",
        "GiB (log scale)",
        "",
        logx=True,
        size=(7.5, 4.6),
    )
    colours = {"MHA": "tab:red", "GQA": "tab:blue", "MQA": "tab:green", "MLA": "tab:purple"}
    ax.barh(
        [r["model"] for r in rows],
        [r["cache at max context (GiB)"] for r in rows],
        color=[colours[r["kind"]] for r in rows],
    )
    for i, r in enumerate(rows):
        ax.annotate(
            f" {r['cache at max context (GiB)']:g} GiB @ {r['max context']:,}",
            (r["cache at max context (GiB)"], i),
            va="center",
            fontsize=7,
        )
    ax.set_xlim(right=ax.get_xlim()[1] * 20)
    handles = [Patch(color=c, label=k) for k, c in colours.items()]
    ax.legend(handles=handles, fontsize=8, loc="lower right")
    return fig
