"""Gradient compression for the wire on JAX arrays, with Horovod's interface
(`Compression.none`, `fp16`, `bf16`)."""

import jax.numpy as jnp

from kerasdist.common.compression import (CastCompressor, Compressor,  # noqa: F401
                                          NoneCompressor, standard_compressions)


class _Cast(CastCompressor):
    @staticmethod
    def is_floating(tensor):
        return jnp.issubdtype(tensor.dtype, jnp.floating)

    @staticmethod
    def cast(tensor, dtype):
        return tensor.astype(dtype)


FP16Compressor, BF16Compressor = standard_compressions(_Cast, jnp.float16, jnp.bfloat16)


class Compression:
    """The available compressors: `none`, `fp16` and `bf16`."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
