"""Batch normalization with statistics over every rank's batch."""

import torch
import torch.nn.functional as F

from kerasdist.common.context import context
from kerasdist.common.process_sets import global_process_set
from kerasdist.torch import collectives
from kerasdist.torch.mpi_ops import Sum


class SyncBatchNorm(torch.nn.SyncBatchNorm):
    """Batch normalization whose training statistics (mean and variance per
    channel) are those of the global batch, all ranks' samples together, as
    Horovod's `SyncBatchNorm`.

    It takes the arguments of `torch.nn.BatchNorm2d` (inputs of 2 or more
    dimensions, channels second). In training it runs two small allreduces
    per call (the sum and count, then the squared deviations), which are
    differentiable, so the gradients are those of the global batch too. In
    evaluation, or on one rank, it is plain batch normalization.

    Args:
        num_features: The number of channels.
        eps: Added to the variance. Defaults to 1e-5.
        momentum: Of the running statistics; `None` for a cumulative
            average. Defaults to 0.1.
        affine: Learn a scale and a shift. Defaults to True.
        track_running_stats: Keep running statistics. Defaults to True.
        process_set: The `ProcessSet` whose ranks share the statistics.
            Defaults to `global_process_set`.
        device, dtype: Of the parameters. Default to `None`.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set, device=None,
                 dtype=None):
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine,
                         track_running_stats=track_running_stats, device=device, dtype=dtype)
        self.process_set = process_set

    def _momentum(self):
        if not (self.training and self.track_running_stats):
            return 0.0
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    def forward(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects an input of 2 or more dimensions. "
                             f"Received: shape={tuple(input.shape)}")
        sync = self.training and context.initialized and context.size > 1
        if not sync:
            use_running = not self.training or self.track_running_stats
            return F.batch_norm(
                input, self.running_mean if use_running else None,
                self.running_var if use_running else None, self.weight, self.bias,
                self.training or self.running_mean is None, self._momentum(), self.eps)
        momentum = self._momentum()
        dims = [0] + list(range(2, input.dim()))
        shape = [1, -1] + [1] * (input.dim() - 2)
        count_local = input.numel() // input.shape[1]
        x = input.float() if input.dtype in (torch.float16, torch.bfloat16) else input
        sums = torch.cat([x.sum(dims), x.new_tensor([float(count_local)])])
        sums = collectives.allreduce(sums, op=Sum, process_set=self.process_set)
        count = sums[-1]
        mean = sums[:-1] / count
        dev = x - mean.view(shape)
        var = collectives.allreduce((dev * dev).sum(dims), op=Sum,
                                    process_set=self.process_set) / count
        out = dev * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats:
            with torch.no_grad():
                n = float(count)
                unbiased = var * (n / max(n - 1.0, 1.0))
                self.running_mean.mul_(1 - momentum).add_(mean.detach() * momentum)
                self.running_var.mul_(1 - momentum).add_(unbiased.detach() * momentum)
        return out.to(input.dtype)
