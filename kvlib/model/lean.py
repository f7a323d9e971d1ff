"""The lean model: :class:`LeanLlama`, a :class:`~kvlib.model.llama.TinyLlama` whose decode step
allocates nothing (chapter 1's lean decode step), chosen explicitly by the benchmarks.

A decode step of the book's tiny models does little arithmetic: one token through a few
matrix-vector products. What it costs beyond reading the weights is the fixed price of
every operator PyTorch dispatches (a few microseconds each on a CPU once the weights have
streamed through its caches) and of every ``nn.Module`` call. The readable model's forward pass
(:meth:`TinyLlama.forward <kvlib.model.llama.TinyLlama.forward>`, which follows Llama's structure)
dispatches about twice the operators per decode step of a 2-layer model, many of them allocating;
:func:`lean_forward` computes the same logits with 69, none allocating (torch 2.13, the numba
kernel attending in :class:`~kvlib.cache.fast_contiguous.FastContiguousKVCache`), and
:class:`LeanLlama` uses it whenever no gradient is wanted:

- the q, k and v projections are one matrix product, and so are the MLP's gate and up
  projections: their weights are concatenated once (:class:`FusedWeights`, rebuilt when a
  parameter changes) and the products split into views;
- each RMSNorm is three operators (:func:`normed`), its scale folded into the next weights;
- the residual additions ride in the output projections (``add=`` of
  :func:`~kvlib.kernels.row_product.row_product`);
- every product goes through :func:`~kvlib.kernels.row_product.row_product`: for the few
  rows of a decode step on a CPU, a numba loop that streams each weight matrix once (the
  weights are stored transposed for it, (n_in, n_out) contiguous); PyTorch's product otherwise;
- the query and key heads are rotated together, in three operators
  (:func:`~kvlib.model.rotary.rotate_signed_into`), with angles from one gather;
- every weight is used through functional calls, without ``nn.Module.__call__``;
- every activation is written into :class:`StepBuffers`, made by the first pass of a (batch, seq)
  shape and reused by the next ones, and the logits into the caller's ``out``: a decode step
  allocates nothing. The pass runs on float32 weights, with no cache or one that copies what it
  is handed and attends into a given buffer (``KVCache.reuses_buffers``: the fast contiguous cache
  and the paged caches); :class:`LeanLlama` runs any other case through the modules.

The matrix products sum in another grouping, the norm's scale multiplies the weights instead
of the activations, and fused multiply-adds round once where the modules round twice, so
the logits agree with the reference to float32 rounding (about 1e-6, tested) and the tokens
are the same. The caches are talked to through the same :class:`~kvlib.model.config.KVCache`
protocol, so the paged cache of chapter 3 runs the lean pass too.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from kvlib.kernels.row_product import row_product
from kvlib.model.attention import grouped_attention
from kvlib.model.config import KVCache, ModelConfig
from kvlib.model.llama import TinyLlama
from kvlib.model.rotary import new_token_positions, rotate_signed_into

MAX_BUFFER_SHAPES = 4  # (batch, seq) shapes whose activations a model keeps (FusedWeights.buffers)


@dataclass(frozen=True)
class FusedLayer:
    """One decoder layer's weights as :func:`lean_forward` reads them (matrices transposed for ``mm``).

    The RMSNorm before each projection is split: :func:`normed` divides each row by its length,
    and the norm's scale g times sqrt(d_model) is folded into the projection's columns:
    (x / rms(x) * g) @ W.T = (x / (sqrt(d) rms(x))) @ (W * g * sqrt(d)).T.
    """

    qkv: torch.Tensor  # (d_model, (num_heads + 2 * num_kv_heads) * head_dim): [q | k | v], input norm folded
    o: torch.Tensor  # (num_heads * head_dim, d_model): o_proj.weight transposed
    gate_up: torch.Tensor  # (d_model, 2 * d_ff): [gate | up], post-attention norm folded
    down: torch.Tensor  # (d_ff, d_model): down_proj.weight transposed


def fold_norm(weight: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """weight (out, d) with the scale of the RMSNorm before it folded in, transposed: (d, out)."""
    return transposed(weight * (norm_weight * math.sqrt(weight.shape[1])))


def transposed(weight: torch.Tensor) -> torch.Tensor:
    """weight (out, in) as a contiguous (in, out) matrix: the layout :func:`row_product` streams."""
    return weight.t().contiguous()


def fuse_layer(block) -> FusedLayer:
    """The fused weights of one :class:`~kvlib.model.llama.Block`: new tensors, the model's own unchanged."""
    attn, mlp = block.self_attn, block.mlp
    qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])  # (q+k+v width, d_model)
    gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])  # (2 * d_ff, d_model)
    return FusedLayer(
        qkv=fold_norm(qkv, block.input_layernorm.weight),
        o=transposed(attn.o_proj.weight),
        gate_up=fold_norm(gate_up, block.post_attention_layernorm.weight),
        down=transposed(mlp.down_proj.weight),
    )


class FusedWeights:
    """The :class:`FusedLayer` of every layer of a model and its output projection, built on first
    use, rebuilt when stale.

    They are stale when a parameter of the model has changed since they were built: written in
    place (its version counter moved: ``load_state_dict``, ``weight.mul_(...)`` under
    ``no_grad``), moved or cast (``model.to``, ``model.half()``: new storage), or replaced by
    another ``Parameter`` in its module. Checking costs a few microseconds per forward pass. Not
    seen: a write through ``weight.data`` (which bypasses the version counter) and a whole
    submodule replaced after the first pass; call :meth:`clear` after either.
    """

    def __init__(self):
        self._slots: list[tuple[dict, str]] = []  # (a module's _parameters, name) of every parameter
        self._key: list[tuple[int, int]] = []  # (data_ptr, version) of each, when built
        self.layers: tuple[FusedLayer, ...] = ()
        self.embed = torch.empty(0)  # (vocab, d_model): embed_tokens.weight itself
        self.lm_head = torch.empty(0)  # (d_model, vocab): lm_head.weight with the final norm folded
        self.offset = torch.empty(0)  # (): sqrt(d_model * norm_eps), float32 on the model's device (normed)
        self.head_dim = 0  # the model's head_dim, read once
        self.qkv_split: tuple[int, int] = (0, 0)  # heads of [q | k] and of v in a qkv projection
        self.qk_split: tuple[int, int] = (0, 0)  # heads of q and of k among the rotated ones
        self.num_builds = 0  # how many times the weights were (re)built
        self._buffers: dict[tuple[int, int], StepBuffers] = {}  # (batch, seq) -> that pass's activations

    def clear(self) -> None:
        """Forget the fused weights: the next :meth:`get` rebuilds them."""
        self._slots, self._key, self.layers = [], [], ()

    def _current_key(self) -> list[tuple[int, int]]:
        params = [table[name] for table, name in self._slots]
        return [(p.data_ptr(), p._version) for p in params]

    def get(self, model) -> FusedWeights:
        """These weights, for ``model`` (a TinyLlama), rebuilt first if stale."""
        if not self._slots or self._current_key() != self._key:
            self._build(model)
        return self

    def _build(self, model) -> None:
        config = model.config
        self._slots = [
            (module._parameters, name)
            for module in model.modules()
            for name, param in module._parameters.items()
            if param is not None
        ]
        with torch.inference_mode(False), torch.no_grad():  # ordinary tensors, usable in any mode
            self.layers = tuple(fuse_layer(block) for block in model.layers)
            self.lm_head = fold_norm(model.lm_head.weight, model.norm.weight)
            self.offset = torch.tensor(
                math.sqrt(config.d_model * config.norm_eps), device=self.lm_head.device
            )
        self.embed = model.embed_tokens.weight
        self.head_dim = config.head_dim
        self.qkv_split = (config.num_heads + config.num_kv_heads, config.num_kv_heads)
        self.qk_split = (config.num_heads, config.num_kv_heads)
        self._key = self._current_key()
        self._buffers = {}
        self.num_builds += 1

    def buffers(self, batch: int, seq: int) -> StepBuffers:
        """The activations of a (float32) pass over (batch, seq) tokens, made on the first such pass and
        written in place by every later one. A few shapes are kept: a decode loop asks for the same
        one at every step."""
        if (batch, seq) not in self._buffers:
            if len(self._buffers) >= MAX_BUFFER_SHAPES:
                self._buffers.clear()
            with torch.inference_mode(False):  # ordinary tensors, writable in any mode
                self._buffers[batch, seq] = StepBuffers.make(self, batch, seq)
        return self._buffers[batch, seq]


@dataclass(frozen=True)
class StepBuffers:
    """Every activation of a lean pass over (batch, seq) tokens, so that a decode step allocates nothing.

    Rows are the pass's batch * seq tokens. Only the logits leave the pass (into a tensor the
    caller gives, or a new one), so the next pass of the same shape may overwrite all of these.
    """

    x: torch.Tensor  # (rows, d_model): the residual stream
    h: torch.Tensor  # (rows, d_model): x normed (:func:`normed`), a projection's input
    norm: torch.Tensor  # (rows, 1): each row's sqrt(|x|^2 + offset^2)
    qkv: torch.Tensor  # (rows, (heads + 2 * kv_heads) * head_dim): the fused projection
    angles: torch.Tensor  # (rows, 2 * head_dim): [cos | signed sin] at each token's position
    rotated: torch.Tensor  # (batch, heads + kv_heads, seq, head_dim): q and k rotated
    rolled: torch.Tensor  # (batch, heads + kv_heads, seq, head_dim): q and k, halves swapped
    attn: torch.Tensor  # (batch, heads, seq, head_dim): what the cache may write the attention into
    gate_up: torch.Tensor  # (rows, 2 * d_ff): the MLP's fused gate and up projections
    act: torch.Tensor  # (rows, d_ff): silu(gate) * up

    @staticmethod
    def make(fused: FusedWeights, batch: int, seq: int) -> StepBuffers:
        """Uninitialised buffers for a pass of ``fused``'s model over (batch, seq) tokens."""
        rows, device = batch * seq, fused.lm_head.device
        d_model, qkv_width = fused.layers[0].qkv.shape
        rotated_heads = sum(fused.qk_split)
        new = functools.partial(torch.empty, device=device)
        return StepBuffers(
            x=new(rows, d_model),
            h=new(rows, d_model),
            norm=new(rows, 1),
            qkv=new(rows, qkv_width),
            angles=new(rows, 2 * fused.head_dim),
            rotated=new(batch, rotated_heads, seq, fused.head_dim),
            rolled=new(batch, rotated_heads, seq, fused.head_dim),
            attn=new(batch, fused.qk_split[0], seq, fused.head_dim),
            gate_up=new(rows, fused.layers[0].gate_up.shape[1]),
            act=new(rows, fused.layers[0].down.shape[0]),
        )


def normed(x: torch.Tensor, offset: torch.Tensor, buf: StepBuffers) -> torch.Tensor:
    """x (rows, dim) over sqrt(|x|^2 + offset^2), written into ``buf.h``: RMSNorm short of its scale.

    With offset = sqrt(dim * eps) this is x / (sqrt(dim) * rms(x)): the scale and sqrt(dim) are
    folded into the next weights (:func:`fuse_layer`). Three operators (a norm, ``hypot``, a
    division), where ``x.pow(2).mean()``, ``+ eps``, ``rsqrt`` and two products take six.
    """
    norm, out = buf.norm, buf.h
    if x.shape[0] < norm.shape[0]:  # a last_only prefill norms `batch` of its batch * seq rows
        norm, out = norm[: x.shape[0]], out[: x.shape[0]]
    torch.linalg.vector_norm(x, dim=-1, keepdim=True, out=norm)
    return torch.div(x, torch.hypot(norm, offset, out=norm), out=out)  # (rows, dim)


def lean_attention(x, w: FusedLayer, fused: FusedWeights, cos, sin, layer: int, cache, batch: int, buf):
    """x (batch * seq, d_model) plus its attention output, in place: (batch * seq, d_model).

    cos, sin: (batch, 1, seq, head_dim), the signed sin of :meth:`RotaryTable.lookup_signed`;
    ``cache`` a :class:`~kvlib.model.config.KVCache` that copies what it is handed and takes
    ``out=`` (``reuses_buffers``), or None (the tokens are the whole sequence); ``buf`` the pass's
    :class:`StepBuffers`.
    """
    seq = x.shape[0] // batch
    qkv = row_product(normed(x, fused.offset, buf), w.qkv, out=buf.qkv)
    if seq == 1:  # (batch, heads + 2 * kv_heads, 1, head_dim) is the same memory: no transpose to dispatch
        qkv = qkv.view(batch, -1, 1, fused.head_dim)
    else:
        qkv = qkv.view(batch, seq, -1, fused.head_dim).transpose(1, 2)
    qk, v = qkv.split_with_sizes(fused.qkv_split, dim=1)  # (batch, heads + kv_heads | kv_heads, seq, hd)
    rotated = rotate_signed_into(qk, cos, sin, buf.rotated, buf.rolled)
    q, k = rotated.split_with_sizes(fused.qk_split, dim=1)  # rotated at once
    # q: (batch, heads, seq, head_dim); k, v: (batch, kv_heads, seq, head_dim)
    out = grouped_attention(q, k, v) if cache is None else cache.attend(layer, q, k, v, out=buf.attn)
    # heads side by side: (batch * seq, heads * head_dim); one new token per sequence is already so
    out = out.reshape(batch, -1) if seq == 1 else out.transpose(1, 2).reshape(x.shape[0], -1)
    return row_product(out, w.o, add=x, out=x)  # x + o_proj(out)


def lean_mlp(x: torch.Tensor, w: FusedLayer, offset: torch.Tensor, buf: StepBuffers) -> torch.Tensor:
    """x (batch * seq, d_model) plus its SwiGLU MLP's output, in place: (batch * seq, d_model)."""
    gate_up = row_product(normed(x, offset, buf), w.gate_up, out=buf.gate_up)
    gate, up = gate_up.chunk(2, dim=-1)  # (batch * seq, d_ff) each
    act = torch.mul(F.silu(gate, inplace=True), up, out=buf.act)  # contiguous, for the product
    return row_product(act, w.down, add=x, out=x)  # x + down(silu(gate) * up)


def runs_lean(model, cache: KVCache | None) -> bool:
    """Whether :func:`lean_forward` can run ``model`` with ``cache``: float32 weights, and no cache or
    one that copies the k, v it is handed (``reuses_buffers``), for they are views of buffers."""
    return model.lm_head.weight.dtype == torch.float32 and (
        cache is None or getattr(cache, "reuses_buffers", False)
    )


def lean_forward(
    model, tokens: torch.Tensor, cache: KVCache | None, last_only: bool, out: torch.Tensor | None = None
) -> torch.Tensor:
    """What ``model.reference_forward(tokens, cache, last_only)`` returns, by the lean pass.

    ``model`` is a :class:`LeanLlama` (:func:`runs_lean` with ``cache``); tokens (batch, seq) ->
    logits (batch, seq, vocab), or (batch, 1, vocab) with ``last_only``, written into ``out`` of
    that shape if given. Every other activation lives in the model's :class:`StepBuffers` for this
    shape, so that a decode step into ``out`` allocates nothing.
    """
    fused = model.fused.get(model)
    batch, seq = tokens.shape
    buf = fused.buffers(batch, seq)
    positions = new_token_positions(tokens, cache, model.config)  # (batch, seq)
    cos, sin = model.rotary.lookup_signed(positions, buf.angles)  # (batch, 1, seq, head_dim)
    x = torch.index_select(fused.embed, 0, tokens.reshape(-1), out=buf.x)  # (batch * seq, d_model)
    for layer, w in enumerate(fused.layers):
        x = lean_attention(x, w, fused, cos, sin, layer, cache, batch, buf)
        x = lean_mlp(x, w, fused.offset, buf)  # (batch * seq, d_model)
    if last_only and seq > 1:
        x = x.view(batch, seq, -1)[:, -1]  # (batch, d_model)
    logits_out = None if out is None else out.view(x.shape[0], -1)
    logits = row_product(normed(x, fused.offset, buf), fused.lm_head, out=logits_out)
    return logits.view(batch, -1, logits.shape[-1])  # (batch, seq or 1, vocab)


class LeanLlama(TinyLlama):
    """:class:`~kvlib.model.llama.TinyLlama` whose forward pass is :func:`lean_forward` whenever no
    gradient is wanted: the same weights and state dict, the same greedy tokens (tested).

    ``LeanLlama(config)`` draws the weights ``TinyLlama(config)`` draws; ``LeanLlama.sharing(model)``
    runs another model's weights (not copies) by the lean pass.
    """

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.fused = FusedWeights()  # the lean pass's concatenated projections, outside the state dict

    @classmethod
    def sharing(cls, model: TinyLlama) -> LeanLlama:
        """A lean model over ``model``'s modules (its weights, not copies); its fused weights are its own."""
        lean = super().sharing(model)
        lean.fused = FusedWeights()
        return lean

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache | None = None,
        last_only: bool = False,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`TinyLlama.forward <kvlib.model.llama.TinyLlama.forward>`'s logits, written into ``out``
        (a tensor of their shape and dtype) if given.

        Under ``torch.inference_mode`` or ``no_grad`` (or with frozen weights) by the lean pass, into
        whose buffers a decode step into ``out`` allocates nothing, where it runs (:func:`runs_lean`:
        float32, and no cache or one that copies what it is handed); otherwise, and when gradients may
        be wanted, through the modules (:meth:`reference_forward`).
        """
        if (torch.is_grad_enabled() and self.lm_head.weight.requires_grad) or not runs_lean(self, cache):
            logits = self.reference_forward(tokens, cache, last_only)
            return logits if out is None else out.copy_(logits)
        return lean_forward(self, tokens, cache, last_only, out)

    def reference_forward(
        self, tokens: torch.Tensor, cache: KVCache | None = None, last_only: bool = False
    ) -> torch.Tensor:
        """The readable pass through the modules (:meth:`TinyLlama.forward
        <kvlib.model.llama.TinyLlama.forward>`), which the lean pass's logits equal to float32 rounding."""
        return super().forward(tokens, cache, last_only)
