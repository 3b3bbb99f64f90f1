"""Gradient compression for the wire, with Horovod's interface
(`Compression.none`, `fp16`, `bf16`)."""

import tensorflow as tf

from kerasdist.common.compression import (CastCompressor, Compressor,  # noqa: F401
                                          NoneCompressor, standard_compressions)


class _Cast(CastCompressor):
    @staticmethod
    def is_floating(tensor):
        return tensor.dtype.is_floating

    @staticmethod
    def cast(tensor, dtype):
        return tf.cast(tensor, dtype)


FP16Compressor, BF16Compressor = standard_compressions(_Cast, tf.float16, tf.bfloat16)


class Compression:
    """The available compressors: `none`, `fp16` and `bf16`."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
