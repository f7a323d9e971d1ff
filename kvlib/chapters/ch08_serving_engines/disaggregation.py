"""Beyond one machine (chapter 8, "Serving as engines do it now"): a model and its cache over several
GPUs, and prefill and decode on different GPUs.

**Spreading one model.** ``--tensor-parallel-size T`` gives each of T GPUs a slice of every
layer: a 1/T share of the weights and of the attention heads, so each caches the K/V of
``num_kv_heads / T`` KV heads (one replicated head when T exceeds the KV heads);
``--pipeline-parallel-size P`` gives each of P stages a run of consecutive layers. The rules
are vLLM's and live in :mod:`kvlib.sizing.parallel` (chapter 2); :func:`gpu_layout` applies
them to one GPU of a catalog model: its weights, its K/V bytes per token and how many
tokens its cache holds. Every GPU of a tensor-parallel group holds its share of *every*
token, so the group's token capacity is one GPU's: tensor parallelism buys capacity by
freeing weight memory, not by splitting tokens.

**Disaggregated prefill and decode** (DistServe, Zhong et al. 2024; Splitwise, Patel et al.
2024; vLLM's experimental disaggregated prefill, its ``--kv-transfer-config``): prefill,
compute-bound, runs on some GPUs; decode, bound by memory bandwidth, on others; each
request's K/V is handed over between the two. :func:`pd_transfer` sets the hand-over's
time against the prefill's. Per prompt token the hand-over moves ``bytes_per_token / T``
bytes over each GPU's link (the T GPUs of a prefill group each send their own heads, in
parallel), while the prefill computes ``2 x parameters / T`` FLOPs on each GPU, so for long
prompts

    transfer / prefill = bytes_per_token x FLOP/s / (2 x parameters x link bytes/s),

whatever the prompt length and T. For a Llama-3-70B (327,680 bytes per token, 70.6e9
parameters) on H100s that is 0.5 % over NVLink and 5 % over a 400 Gb/s network: small, and
it can overlap the prefill layer by layer, as both papers do. :func:`pd_gpu_ratio` sizes
the two pools for a workload: prefill GPU-seconds per request against the requests per
second one decode GPU serves within a TPOT target.

Link speeds are per direction (a hand-over goes one way): NVIDIA's NVLink figures (900 GB/s
per H100, 600 GB/s per A100) count both directions, so we take half; network line rates
(100, 200, 400 Gb/s InfiniBand or RoCE, one NIC per GPU as in NVIDIA's DGX systems) are per
direction already. All peaks are data-sheet figures: real transfers and prefills reach less.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlib import KVLibError
from kvlib.checks import require_int, require_real
from kvlib.gpus import A100_40GB, GPU, MEMORY_FRACTION
from kvlib.serving.roofline import roofline_step
from kvlib.sizing.capacity import weight_bytes
from kvlib.sizing.catalog import catalog_entry
from kvlib.sizing.parallel import kv_heads_per_gpu, per_gpu_bytes
from kvlib.sizing.spec import bytes_per_token
from kvlib.units import GiB

# NVIDIA A100 80GB SXM data sheet: 80 GB HBM2e at 2,039 GB/s, 312 TFLOP/s dense fp16 tensor cores.
A100_80GB = GPU("NVIDIA A100 80GB SXM", 80 * GiB, 2.039e12, 312e12)

# NVIDIA H100 SXM data sheet: 80 GB HBM3 at 3.35 TB/s, 989 TFLOP/s dense fp16 (1,979 with sparsity).
H100_SXM = GPU("NVIDIA H100 SXM", 80 * GiB, 3.35e12, 989e12)

DISAGGREGATION_GPUS = {"A100 40GB": A100_40GB, "A100 80GB": A100_80GB, "H100": H100_SXM}


@dataclass(frozen=True)
class Link:
    """A link between a prefill GPU and a decode GPU, by its speed in one direction."""

    name: str
    bytes_per_s: float  # one direction, per GPU
    source: str  # where the figure comes from


LINKS = {
    "NVLink 4 (H100)": Link("NVLink 4 (H100)", 450e9, "NVIDIA H100 data sheet: 900 GB/s, both directions"),
    "NVLink 3 (A100)": Link("NVLink 3 (A100)", 300e9, "NVIDIA A100 data sheet: 600 GB/s, both directions"),
    "400 Gb/s IB/RoCE": Link("400 Gb/s IB/RoCE", 400e9 / 8, "NDR InfiniBand, 400GbE: per direction"),
    "200 Gb/s IB/RoCE": Link("200 Gb/s IB/RoCE", 200e9 / 8, "HDR InfiniBand, 200GbE: per direction"),
    "100 Gb/s IB/RoCE": Link("100 Gb/s IB/RoCE", 100e9 / 8, "EDR InfiniBand, 100GbE: per direction"),
}

# The sized example: a Llama-3-70B-class model (kvlib/sizing/configs/llama_3_70b.json).
EXAMPLE_MODEL = "Llama-3-70B"


def _gpu(gpu) -> GPU:
    if isinstance(gpu, GPU):
        return gpu
    if gpu not in DISAGGREGATION_GPUS:
        raise KVLibError(f"unknown GPU {gpu!r}; choose from {', '.join(DISAGGREGATION_GPUS)} or pass a GPU")
    return DISAGGREGATION_GPUS[gpu]


def _link(link) -> Link:
    if isinstance(link, Link):
        return link
    if link not in LINKS:
        raise KVLibError(f"unknown link {link!r}; choose from {', '.join(LINKS)} or pass a Link")
    return LINKS[link]


@dataclass(frozen=True)
class GPULayout:
    """One GPU of a model spread over ``tensor_parallel_size x pipeline_parallel_size`` GPUs (fp16)."""

    model: str  # catalog name
    gpu: str  # the GPU's name
    tensor_parallel_size: int  # vLLM's --tensor-parallel-size
    pipeline_parallel_size: int  # vLLM's --pipeline-parallel-size
    kv_heads_per_gpu: int  # KV heads each GPU caches per layer
    weight_bytes_per_gpu: int  # its share of the fp16 weights: all of them / (TP x PP)
    kv_bytes_per_token: int  # K/V bytes one token adds on this GPU (the fullest stage's)
    kv_bytes: int  # memory x memory fraction - weights: its KV budget (<= 0: the weights do not fit)
    kv_tokens: int  # tokens whose K/V fit there, which is also the whole group's token capacity

    @property
    def num_gpus(self) -> int:
        """GPUs the model takes: TP x PP."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


def gpu_layout(
    model: str = EXAMPLE_MODEL,
    tensor_parallel_size: int = 8,
    pipeline_parallel_size: int = 1,
    gpu: GPU | str = "H100",
    memory_fraction: float = MEMORY_FRACTION,
) -> GPULayout:
    """Weights, K/V bytes per token and token capacity of one GPU of a catalog model under TP x PP.

    The K/V rules are :mod:`kvlib.sizing.parallel`'s (vLLM's, refused where vLLM refuses); the
    weights are split evenly, an approximation (vLLM splits embeddings and the LM head over TP
    too, but the first and last pipeline stages hold them).
    """
    gpu = _gpu(gpu)
    if not 0 < require_real(memory_fraction, "memory_fraction") <= 1:
        raise KVLibError(f"memory_fraction is a share of the GPU in (0, 1], not {memory_fraction!r}")
    entry = catalog_entry(model)
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    per_token = per_gpu_bytes(entry.spec, 1, 1, "fp16", tp, pp)  # checks the layout as vLLM does
    weights = math.ceil(weight_bytes(entry.num_parameters, "fp16") / (tp * pp))
    kv = int(gpu.memory_bytes * memory_fraction) - weights
    return GPULayout(
        entry.name,
        gpu.name,
        tp,
        pp,
        kv_heads_per_gpu(entry.spec, tp),
        weights,
        per_token,
        kv,
        max(0, kv) // per_token,
    )


def layout_table(
    model: str = EXAMPLE_MODEL,
    gpu: GPU | str = "H100",
    layouts=((1, 1), (2, 1), (4, 1), (8, 1), (2, 4), (1, 8)),
) -> list[dict]:
    """:func:`gpu_layout` for several (TP, PP) layouts, as rows (chapter 8)."""
    rows = []
    for tp, pp in layouts:
        layout = gpu_layout(model, tp, pp, gpu)
        rows.append(
            {
                "--tensor-parallel-size": tp,
                "--pipeline-parallel-size": pp,
                "KV heads per GPU": layout.kv_heads_per_gpu,
                "weights per GPU (GiB)": layout.weight_bytes_per_gpu / GiB,
                "KV bytes per token per GPU": layout.kv_bytes_per_token,
                "KV tokens (whole group)": layout.kv_tokens,
                "fits": layout.kv_tokens > 0,
            }
        )
    return rows


@dataclass(frozen=True)
class Handoff:
    """One request's K/V handed from a prefill group to a decode group, against its prefill."""

    prompt_len: int  # tokens prefilled, whose K/V move
    kv_bytes: int  # prompt_len x bytes per token: the whole request's K/V, all layers
    kv_bytes_per_gpu: int  # what each GPU of the tensor-parallel group sends: its KV heads' share
    transfer_s: float  # kv_bytes_per_gpu / the link's bytes per second (every GPU sends at once)
    prefill_s: float  # the prompt's prefill on the group: the larger of its weight read and its FLOPs, / TP
    link: str  # the link's name
    gpu: str  # the GPUs' name

    @property
    def ratio(self) -> float:
        """``pd_transfer_vs_prefill_ratio``: the hand-over's time over the prefill's."""
        return self.transfer_s / self.prefill_s


def prefill_seconds(
    model: str, prompt_len: int, gpu: GPU | str = "H100", tensor_parallel_size: int = 1
) -> float:
    """Seconds of one prompt's prefill on a TP group, from :func:`~kvlib.serving.roofline.roofline_step`:
    the larger of one read of the weights and ``2 x parameters x prompt_len`` FLOPs at peak, split
    over the group.

    Attention's own FLOPs (which grow with the prompt's square) are left out: under 3 % of a
    Llama-3-70B's at 2,048 tokens. Peak FLOP/s makes this optimistic, so the transfer's share
    comes out larger than on a real GPU, which reaches perhaps half the peak.
    """
    entry = catalog_entry(model)
    prompt_len = require_int(prompt_len, "prompt_len")
    tp = require_int(tensor_parallel_size, "tensor_parallel_size")
    step = roofline_step(entry.num_parameters, bytes_per_token(entry.spec), gpu=_gpu(gpu), name=entry.name)
    return float(step.predict(1, 0, prompt_len)) / tp


def pd_transfer(
    model: str = EXAMPLE_MODEL,
    prompt_len: int = 2048,
    link: Link | str = "NVLink 4 (H100)",
    gpu: GPU | str = "H100",
    tensor_parallel_size: int = 4,
) -> Handoff:
    """The K/V one request hands from a prefill group of ``tensor_parallel_size`` GPUs to a decode
    group of the same size, each GPU to its counterpart over its own ``link``, against the prefill.

    The bytes are :func:`kvlib.sizing.parallel.per_gpu_bytes` of the prompt on one GPU of the
    group (its KV heads' share: replicated heads are sent by each GPU that holds them).
    """
    entry, link, gpu = catalog_entry(model), _link(link), _gpu(gpu)
    prompt_len = require_int(prompt_len, "prompt_len")
    tp = require_int(tensor_parallel_size, "tensor_parallel_size")
    per_gpu = per_gpu_bytes(entry.spec, prompt_len, 1, "fp16", tp, 1, allow_beyond_max=True)
    return Handoff(
        prompt_len,
        prompt_len * bytes_per_token(entry.spec),
        per_gpu,
        per_gpu / link.bytes_per_s,
        prefill_seconds(model, prompt_len, gpu, tp),
        link.name,
        gpu.name,
    )


# The links each GPU's servers have: its own NVLink generation inside a node, the networks between nodes.
GPU_LINKS = {
    "A100 80GB": ("NVLink 3 (A100)", "200 Gb/s IB/RoCE", "100 Gb/s IB/RoCE"),
    "H100": ("NVLink 4 (H100)", "400 Gb/s IB/RoCE", "200 Gb/s IB/RoCE", "100 Gb/s IB/RoCE"),
}


def transfer_table(
    model: str = EXAMPLE_MODEL,
    prompt_len: int = 2048,
    tensor_parallel_size: int = 4,
    gpus=("A100 80GB", "H100"),
) -> list[dict]:
    """:func:`pd_transfer` for each GPU over its links (:data:`GPU_LINKS`: NVLink within a node,
    networks between nodes)."""
    rows = []
    for gpu in gpus:
        for link in map(_link, GPU_LINKS.get(gpu, tuple(LINKS))):
            handoff = pd_transfer(model, prompt_len, link, gpu, tensor_parallel_size)
            rows.append(
                {
                    "GPU": handoff.gpu,
                    "link": link.name,
                    "link GB/s (one way)": link.bytes_per_s / 1e9,
                    "KV MiB per request": handoff.kv_bytes / 2**20,
                    "KV MiB per GPU": handoff.kv_bytes_per_gpu / 2**20,
                    "transfer (ms)": 1e3 * handoff.transfer_s,
                    "prefill (ms)": 1e3 * handoff.prefill_s,
                    "transfer / prefill": handoff.ratio,
                }
            )
    return rows


@dataclass(frozen=True)
class PDPlan:
    """How many decode GPUs one prefill GPU keeps busy, for a workload's mean lengths and a TPOT target."""

    prefill_gpu_s_per_request: float  # GPU-seconds of one prompt's prefill, prefills batched
    decode_batch: int  # sequences per decode step: the most within the TPOT target, memory, max_num_seqs
    decode_step_s: float  # seconds of that step on the decode group: the time per output token
    decode_requests_per_gpu_s: float  # requests per second one decode GPU finishes
    prefill_requests_per_gpu_s: float  # requests per second one prefill GPU prefills
    decode_limit: str  # what stops the decode batch growing: "TPOT", "memory" or "max_num_seqs"

    @property
    def decode_gpus_per_prefill_gpu(self) -> float:
        """Decode GPUs for each prefill GPU, so that both pools keep up with the same request rate."""
        return self.prefill_requests_per_gpu_s / self.decode_requests_per_gpu_s

    def prefill_share(self, num_gpus: int = 8) -> float:
        """GPUs of ``num_gpus`` that should prefill (a real split rounds to whole TP groups)."""
        return require_int(num_gpus, "num_gpus") / (1 + self.decode_gpus_per_prefill_gpu)


def pd_gpu_ratio(
    model: str = EXAMPLE_MODEL,
    mean_prompt_len: float = 161.31,
    mean_output_len: float = 337.99,
    tpot_s: float = 0.05,
    gpu: GPU | str = "H100",
    decode_tensor_parallel_size: int = 4,
    max_num_seqs: int = 256,
    prefill_tokens_per_pass: int = 2048,
) -> PDPlan:
    """The prefill-to-decode split a disaggregated deployment needs (ShareGPT-like means by default).

    Prefill: vLLM packs prompts into passes of up to ``prefill_tokens_per_pass`` tokens
    (``--max-num-batched-tokens``), so each prompt token costs its share of a full pass (compute-
    bound: ``2 x parameters`` FLOPs a token); a GPU-second buys the same whatever the TP size.
    Decode: a step on the group reads the weights once, each sequence's context
    (``prompt + output / 2`` tokens on average) and computes each sequence's token
    (:func:`~kvlib.serving.roofline.roofline_step`, split over the group); the batch is the
    largest whose step meets ``tpot_s`` and whose contexts fit in the group's KV tokens, at most
    ``max_num_seqs``. A request occupies a decode slot for ``mean_output_len`` steps, so one
    group finishes ``batch / step / output`` requests per second. TTFT targets (queueing in
    front of the prefill pool) would ask for more prefill GPUs than this steady state.
    """
    entry, gpu = catalog_entry(model), _gpu(gpu)
    prompt = require_real(mean_prompt_len, "mean_prompt_len", positive=True)
    output = require_real(mean_output_len, "mean_output_len", positive=True)
    tpot_s = require_real(tpot_s, "tpot_s", positive=True)
    per_pass = require_int(prefill_tokens_per_pass, "prefill_tokens_per_pass")
    max_num_seqs, tp = require_int(max_num_seqs, "max_num_seqs"), decode_tensor_parallel_size
    layout = gpu_layout(model, tp, 1, gpu)  # checks the TP size as vLLM does
    step = roofline_step(entry.num_parameters, bytes_per_token(entry.spec), gpu=gpu, name=entry.name)
    prefill_gpu_s = prompt * float(step.predict(1, 0, per_pass)) / per_pass  # a prompt's share of full passes
    context = prompt + output / 2

    def step_s(batch: int) -> float:
        return float(step.predict(batch, batch * context, 0)) / tp

    if step_s(1) > tpot_s:
        raise KVLibError(
            f"{model} on {tp} x {gpu.name}: one sequence's step ({step_s(1):.4f} s) misses tpot_s"
        )
    limits = {
        "TPOT": step.largest_batch_within(tpot_s * tp, context),
        "memory": int(layout.kv_tokens // context),
        "max_num_seqs": max_num_seqs,
    }
    limit = min(limits, key=limits.get)
    if limits[limit] < 1:
        raise KVLibError(
            f"{model} on {tp} x {gpu.name}: no sequence of {context:.0f} tokens fits in the cache"
        )
    batch = limits[limit]
    return PDPlan(
        prefill_gpu_s,
        batch,
        step_s(batch),
        batch / step_s(batch) / output / tp,
        1 / prefill_gpu_s,
        limit,
    )


def bench() -> dict:
    """Disaggregation's benchmarks for ``python -m kvlib bench`` (chapter 8): a Llama-3-70B on
    8 H100s of one node, prefill on TP 4, decode on TP 4, a 2,048-token prompt handed over NVLink."""
    nvlink = pd_transfer()
    network = pd_transfer(link="400 Gb/s IB/RoCE")
    a100 = pd_transfer(link="NVLink 3 (A100)", gpu="A100 80GB")
    plan = pd_gpu_ratio()
    return {
        "pd_transfer_vs_prefill_ratio": round(nvlink.ratio, 5),
        "pd_transfer_vs_prefill_ratio_400g": round(network.ratio, 5),
        "pd_transfer_vs_prefill_ratio_a100_nvlink": round(a100.ratio, 5),
        "pd_decode_gpus_per_prefill_gpu": round(plan.decode_gpus_per_prefill_gpu, 2),
        "pd_kv_tokens_tp8_h100": gpu_layout().kv_tokens,
    }
