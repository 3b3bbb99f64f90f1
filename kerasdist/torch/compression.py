"""Gradient compression for the wire, with Horovod's interface
(`Compression.none`, `fp16`, `bf16`)."""

import torch

from kerasdist.common.compression import (CastCompressor, Compressor,  # noqa: F401
                                          NoneCompressor, standard_compressions)


class _Cast(CastCompressor):
    @staticmethod
    def is_floating(tensor):
        return tensor.dtype.is_floating_point

    @staticmethod
    def cast(tensor, dtype):
        return tensor.to(dtype)


FP16Compressor, BF16Compressor = standard_compressions(_Cast, torch.float16, torch.bfloat16)


class Compression:
    """The available compressors: `none`, `fp16` and `bf16`."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
