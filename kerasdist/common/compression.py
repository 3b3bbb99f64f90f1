"""Horovod's compressor interface, without any framework: each binding's
`Compression` (and the Keras layer's) builds on these."""


class Compressor:
    """Casts a tensor for communication and back. Subclasses override
    `compress` and `decompress`."""

    @staticmethod
    def compress(tensor):
        """Returns `(compressed_tensor, context)`."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Returns the tensor restored with the context from `compress`."""
        return tensor


class NoneCompressor(Compressor):
    """Sends tensors as they are."""


class CastCompressor(Compressor):
    """Sends floating-point tensors as `wire_dtype` and casts them back.

    A binding subclasses it with its framework's `is_floating(tensor)`,
    `dtype(tensor)` and `cast(tensor, dtype)`, and sets `wire_dtype`.
    """

    wire_dtype = None

    @staticmethod
    def is_floating(tensor):
        raise NotImplementedError

    @staticmethod
    def cast(tensor, dtype):
        raise NotImplementedError

    @classmethod
    def compress(cls, tensor):
        if cls.is_floating(tensor) and tensor.dtype != cls.wire_dtype:
            return cls.cast(tensor, cls.wire_dtype), tensor.dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor if ctx is None else cls.cast(tensor, ctx)


def standard_compressions(cast_base, float16, bfloat16):
    """A binding's `(FP16Compressor, BF16Compressor)` on its `cast_base`,
    named as classes of the binding's module."""

    class FP16Compressor(cast_base):
        """Sends floating-point tensors as float16 and casts them back."""

        wire_dtype = float16

    class BF16Compressor(cast_base):
        """Sends floating-point tensors as bfloat16 and casts them back."""

        wire_dtype = bfloat16

    for cls in (FP16Compressor, BF16Compressor):
        cls.__module__ = cast_base.__module__
        cls.__qualname__ = cls.__name__
    return FP16Compressor, BF16Compressor
