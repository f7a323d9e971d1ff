"""The models whose caches the book studies (chapters 1-3, 7 and 9).

- ``config``: :class:`ModelConfig` (the shape of a model) and :class:`KVCache`, the protocol
  every cache implements for the model.
- ``attention``: decode and prefill attention for MHA, GQA and MQA in three forms (grouped
  einsum, repeat-K/V, PyTorch's SDPA).
- ``rotary``: rotary position embeddings.
- ``seeding``: :func:`seeded_weights`, the one seeded initialisation every model is built in.
- ``llama``: :class:`TinyLlama`, a Llama-style decoder small enough for a CPU: the readable model.
- ``lean``: :class:`~kvlib.model.lean.LeanLlama`, the same model with a decode step tuned for
  speed (fused q/k/v and gate/up products, norms folded into the weights, buffers reused: about
  half the operators, none allocating), which the benchmarks choose explicitly.
- ``head_pooling``: :func:`~kvlib.model.head_pooling.pool_kv_heads`, a model converted to fewer K/V
  heads (GQA/MQA by mean-pooling or keeping one head per group; chapter 7).
- ``mla``: a small DeepSeek-style multi-head latent attention decoder, decoded expanded (per-head
  K/V from the cached latent) and absorbed (MQA over the latent) (chapter 9).
- ``encdec``: an encoder-decoder, whose cross-attention K/V do not grow (chapter 1).
- ``hf``: the bridge to Hugging Face ``transformers`` (weights both ways, logits compared).

The model knows only the :class:`KVCache` protocol; the caches themselves live in
:mod:`kvlib.cache` and :mod:`kvlib.paged`, one layer up.
"""
