"""The PyTorch benchmark's models and its model-level worker (one rank).

Run by benchmarks/torch_ddp.py, never directly:
    python _torch_models.py <config> <model> <steps> <batch> <json>
config: kd (kerasdist.torch.DistributedOptimizer, under mpiexec), ddp
(DistributedDataParallel over gloo, under mpiexec) or plain (one process,
no communication). Writes the samples/s of the timed steps to <json>.
"""

import json
import os
import sys
import time

import torch
import torch.nn.functional as F


class MnistCNN(torch.nn.Module):
    """Horovod's Keras MNIST CNN in PyTorch (1.2 M parameters): two 3x3
    convolutions (32, 64), max-pooling, dropout, dense 128, dense 10; the
    model of benchmarks/keras_synthetic.py's "mnist"."""

    input_shape, classes = (1, 28, 28), 10

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3)
        self.conv2 = torch.nn.Conv2d(32, 64, 3)
        self.fc1 = torch.nn.Linear(64 * 12 * 12, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.dropout(x, 0.25, self.training)
        x = F.dropout(F.relu(self.fc1(x.flatten(1))), 0.5, self.training)
        return self.fc2(x)


class ManySmallMLP(torch.nn.Module):
    """32 blocks of Linear(64, 64) + LayerNorm: 128 small tensors."""

    input_shape, classes = (64,), 10

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64))
            for _ in range(32))
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x):
        for block in self.blocks:
            x = x + torch.relu(block(x))
        return self.head(x)


class _Block(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(cout)
        self.c2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(cout)
        self.skip = (torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                         torch.nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else torch.nn.Identity())

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + self.skip(x))


class SmallResNet(torch.nn.Module):
    """A ResNet-18-shaped network for 32x32 images, 16-128 channels."""

    input_shape, classes = (3, 32, 32), 10

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, 1, 1, bias=False),
                                        torch.nn.BatchNorm2d(16), torch.nn.ReLU())
        layers, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2), (128, 2)):
            layers += [_Block(cin, cout, stride), _Block(cout, cout, 1)]
            cin = cout
        self.layers = torch.nn.Sequential(*layers)
        self.head = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


MODELS = {"mnist": MnistCNN, "mlp": ManySmallMLP, "resnet": SmallResNet}


def main():
    config, model_name, steps, batch, out = sys.argv[1:6]
    steps, batch = int(steps), int(batch)
    rank, size = 0, 1
    if config == "kd":
        import kerasdist.torch as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    elif config == "ddp":
        import torch.distributed as dist
        rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
        dist.init_process_group("gloo", init_method=os.environ["BENCH_GLOO_ADDR"],
                                rank=rank, world_size=size)
        torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    else:
        torch.set_num_threads(int(os.environ.get("BENCH_THREADS", str(os.cpu_count()))))
    torch.manual_seed(0)
    cls = MODELS[model_name]
    model = cls()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if config == "kd":
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    elif config == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, *cls.input_shape, generator=g)
    y = torch.randint(0, cls.classes, (batch,), generator=g)
    warmup = max(5, steps // 5)
    for i in range(warmup + steps):
        if i == warmup:
            if config == "kd":
                hvd.barrier()
            elif config == "ddp":
                dist.barrier()
            start = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    elapsed = time.perf_counter() - start
    if config == "kd":
        hvd.barrier()
    elif config == "ddp":
        dist.barrier()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"samples_per_s": steps * batch * size / elapsed,
                       "step_ms": 1000 * elapsed / steps}, f)
    if config == "ddp":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
