"""`kerasdist.Compression`: wire compression for any Keras backend.

`Compression.none`, `fp16` and `bf16` work on the tensors of whichever
framework they are given: each call hands the tensor to the compressor of
the binding that owns its type (kerasdist/tensorflow/compression.py,
kerasdist/torch/compression.py, kerasdist/jax/compression.py), importing nothing that is not in use.
"""

import importlib

from kerasdist.common.compression import Compressor, NoneCompressor  # noqa: F401

_BINDINGS = {"torch": "kerasdist.torch.compression", "jax": "kerasdist.jax.compression",
             "jaxlib": "kerasdist.jax.compression"}
_DEFAULT = "kerasdist.tensorflow.compression"


def _binding_compression(tensor):
    framework = type(tensor).__module__.split(".", 1)[0]
    return importlib.import_module(_BINDINGS.get(framework, _DEFAULT)).Compression



class _BindingCompressor(Compressor):
    kind = None  # the attribute of the binding's `Compression`

    @classmethod
    def compress(cls, tensor):
        return getattr(_binding_compression(tensor), cls.kind).compress(tensor)

    @classmethod
    def decompress(cls, tensor, ctx):
        return getattr(_binding_compression(tensor), cls.kind).decompress(tensor, ctx)


class FP16Compressor(_BindingCompressor):
    """Sends floating-point tensors as float16 and casts them back."""

    kind = "fp16"


class BF16Compressor(_BindingCompressor):
    """Sends floating-point tensors as bfloat16 and casts them back."""

    kind = "bf16"


class Compression:
    """The available compressors: `none`, `fp16` and `bf16`."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
