"""Quantized KV storage: what the quality chapter "What a smaller cache costs" measures (chapter 7),
and the real bytes behind chapter 2's quantized sizes.

- ``packing``: int4 / int2 codes packed two / four to a byte, unpacked exactly.
- ``minmax``: asymmetric min-max quantization in groups (fp16 scale and zero point per group),
  :class:`QuantizedTensor`; the error bound is half a scale per value.
- ``fp8``: fp8 e4m3 with one fp16 scale per group of a token's vector, :class:`Fp8Tensor`.
- ``formats``: :class:`KVQuantFormat` (none, int8, int4, int2, fp8, KIVI int4/int2) and its bytes
  per token, counted with chapter 2's :class:`kvlib.sizing.dtypes.KVDtype`.
- ``store``: :class:`QuantizedKVStore`, one layer's K and V in a format, with KIVI's residual.

The model's cache built on these is :class:`kvlib.cache.quantized.QuantizedKVCache`, one layer up.
"""
