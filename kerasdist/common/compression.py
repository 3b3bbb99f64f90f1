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
