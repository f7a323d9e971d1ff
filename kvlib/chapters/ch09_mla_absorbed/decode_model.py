"""Chapter 9's modelled numbers: bytes one decode step reads per cached token, the FLOPs it spends on
them, where that puts MLA's two decode forms on the A100's roofline, and the cache per GPU under
tensor parallelism and data-parallel attention.

Sizes come from chapter 2's formulas (:mod:`kvlib.sizing`: DeepSeek-V3's 576 latent values per
token and layer), per-GPU sizes from :mod:`kvlib.sizing.parallel`, the GPU from its data sheet
(:mod:`kvlib.gpus`) and the memory time from :func:`kvlib.serving.roofline.roofline_step`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib.chapters.ch02_cache_size.decode_roofline import ridge_point
from kvlib.checks import require_int
from kvlib.gpus import A100_40GB, GPU
from kvlib.model.mla import MLAConfig
from kvlib.serving.roofline import roofline_step
from kvlib.sizing.catalog import catalog_entry
from kvlib.sizing.parallel import per_gpu_bytes
from kvlib.sizing.spec import ModelSpec, bytes_per_token, token_layer_bytes

# DeepSeek-V3's per-head dimensions that the cache size does not show (its config.json)
DSV3_QK_NOPE_HEAD_DIM, DSV3_V_HEAD_DIM = 128, 128
DTYPE_BYTES = 2  # fp16/bf16 cache


@dataclass(frozen=True)
class MLAShape:
    """What the decode cost of one MLA layer depends on."""

    name: str
    num_layers: int
    num_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int

    def spec(self) -> ModelSpec:
        """The shape as chapter 2's ModelSpec (an MLA model: one latent per token and layer)."""
        return ModelSpec(
            self.name,
            self.num_layers,
            self.num_heads,
            self.num_heads,
            self.qk_nope_head_dim + self.qk_rope_head_dim,
            kv_lora_rank=self.kv_lora_rank,
            qk_rope_head_dim=self.qk_rope_head_dim,
        )


def deepseek_v3_shape() -> MLAShape:
    """DeepSeek-V3 from the catalog, with its per-head nope and value dimensions."""
    spec = catalog_entry("DeepSeek-V3").spec
    return MLAShape(
        spec.name,
        spec.num_layers,
        spec.num_heads,
        spec.kv_lora_rank,
        spec.qk_rope_head_dim,
        DSV3_QK_NOPE_HEAD_DIM,
        DSV3_V_HEAD_DIM,
    )


def small_shape(config: MLAConfig) -> MLAShape:
    """The chapter's small model as an MLAShape."""
    c = config
    return MLAShape(
        "TinyMLA",
        c.num_layers,
        c.num_heads,
        c.kv_lora_rank,
        c.qk_rope_head_dim,
        c.qk_nope_head_dim,
        c.v_head_dim,
    )


@dataclass(frozen=True)
class DecodeForm:
    """One decode form's cost per cached token and layer, for one query token."""

    shape: str
    form: str  # "absorbed" (MQA over the latent) or "expanded" (per-head K/V cached, MHA)
    values_read: int  # cached values read per token and layer
    bytes_read: int  # those values' bytes
    flops: int  # multiply-adds x 2 spent on them: scores and the weighted sum, all heads

    @property
    def intensity(self) -> float:
        """FLOPs per byte read: where the form sits on a roofline."""
        return self.flops / self.bytes_read


def decode_forms(shape: MLAShape) -> tuple[DecodeForm, DecodeForm]:
    """Absorbed: every head scores the same latent + rope key (rank + rope values) and sums the latent
    (rank values), 2 x heads x (2 x rank + rope) FLOPs. Expanded: per-head keys (nope + rope) and
    values (v) cached, each read once, 2 x heads x (nope + rope + v) FLOPs: one FLOP per byte in fp16."""
    h, r, rope = shape.num_heads, shape.kv_lora_rank, shape.qk_rope_head_dim
    absorbed_bytes = token_layer_bytes(shape.spec(), "fp16")  # chapter 2's (rank + rope) x 2 bytes
    expanded_values = h * (shape.qk_nope_head_dim + rope + shape.v_head_dim)
    return (
        DecodeForm(shape.name, "absorbed", r + rope, absorbed_bytes, 2 * h * (2 * r + rope)),
        DecodeForm(
            shape.name, "expanded", expanded_values, expanded_values * DTYPE_BYTES, 2 * expanded_values
        ),
    )


def gpu_ridge(gpu: GPU = A100_40GB) -> float:
    """FLOPs per byte where the GPU's compute roof meets its memory roof (chapter 2's ridge_point of
    its data sheet: fp16 peak over bandwidth)."""
    return ridge_point(gpu.fp16_flops / 1e9, gpu.bandwidth / 1e9)


def roofline_row(form: DecodeForm, num_layers: int, gpu: GPU = A100_40GB) -> dict:
    """A form on the roofline: its intensity, the bound it hits, attention time per cached token
    (all layers): the memory time from roofline_step, the compute time from the peak."""
    memory_s = roofline_step(1, form.bytes_read * num_layers, gpu=gpu).per_context_s
    compute_s = form.flops * num_layers / gpu.fp16_flops
    ridge = gpu_ridge(gpu)
    return {
        "shape": form.shape,
        "form": form.form,
        "values read / token / layer": form.values_read,
        "bytes read / token": form.bytes_read * num_layers,
        "FLOPs / token": form.flops * num_layers,
        "FLOPs / byte": form.intensity,
        "bound": "compute" if form.intensity > ridge else "memory",
        "ns / cached token": 1e9 * max(memory_s, compute_s),
    }


def roofline_table(shapes: list[MLAShape], gpu: GPU = A100_40GB) -> list[dict]:
    """Both forms of every shape on ``gpu``'s roofline."""
    return [roofline_row(form, s.num_layers, gpu) for s in shapes for form in decode_forms(s)]


def parallel_table(context: int = 8_192, batch: int = 64, num_gpus: int = 8) -> list[dict]:
    """KV-cache bytes per GPU of a batch on ``num_gpus`` GPUs: DeepSeek-V3 under TP (the latent
    replicated: no saving) and under data-parallel attention (the batch split), Llama-3-70B under TP
    (its KV heads split) for contrast."""
    require_int(num_gpus, "num_gpus", low=1)
    require_int(batch, "batch", low=num_gpus)
    dsv3, llama = catalog_entry("DeepSeek-V3").spec, catalog_entry("Llama-3-70B").spec
    rows = [
        ("DeepSeek-V3", "one GPU", per_gpu_bytes(dsv3, context, batch)),
        ("DeepSeek-V3", f"TP {num_gpus}", per_gpu_bytes(dsv3, context, batch, tensor_parallel_size=num_gpus)),
        ("DeepSeek-V3", f"DP attention {num_gpus}", per_gpu_bytes(dsv3, context, -(-batch // num_gpus))),
        ("Llama-3-70B", "one GPU", per_gpu_bytes(llama, context, batch)),
        (
            "Llama-3-70B",
            f"TP {num_gpus}",
            per_gpu_bytes(llama, context, batch, tensor_parallel_size=num_gpus),
        ),
    ]
    return [{"model": m, "layout": lay, "KV GiB per GPU": b / 2**30, "bytes": b} for m, lay, b in rows]


def dsv3_bytes_per_token() -> int:
    """DeepSeek-V3's fp16 latent bytes per token over all layers (chapter 2's formula)."""
    return bytes_per_token(catalog_entry("DeepSeek-V3").spec)
