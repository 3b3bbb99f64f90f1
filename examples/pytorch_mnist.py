"""Trains Horovod's PyTorch MNIST CNN, data-parallel with kerasdist.torch.

Run it on 2 processes, or as a plain single-process script:

    kerasdist-run -np 2 python examples/pytorch_mnist.py
    python examples/pytorch_mnist.py

This is Horovod's `pytorch_mnist.py` with `import kerasdist.torch as hvd`
in place of `import horovod.torch as hvd`; every line that differs from
single-process PyTorch carries a `# kerasdist:` comment. Each rank trains
on its own shard of the training set (`DistributedSampler` with this rank's
number; `torch.distributed` is never initialized), the learning rate is
scaled by the number of ranks, and rank 0's initial weights and optimizer
state are broadcast first, so that every rank holds the same model at the
end: each rank prints a digest of its weights to show it.

The data comes from `examples/data/mnist` (see `mnist_data.py`), so no
download is needed.
"""

import argparse
import hashlib
import time

import numpy as np
import torch
import torch.nn.functional as F

import kerasdist.torch as hvd  # kerasdist: Horovod's torch API
from mnist_data import PIXEL_MEAN, PIXEL_STD, load_mnist


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64,
                        help="Examples per step on each rank (default: 64).")
    parser.add_argument("--test-batch-size", type=int, default=1000,
                        help="Examples per evaluation step (default: 1000).")
    parser.add_argument("--epochs", type=int, default=2, help="Epochs (default: 2).")
    parser.add_argument("--lr", type=float, default=0.01,
                        help="Learning rate of one process (default: 0.01).")
    parser.add_argument("--momentum", type=float, default=0.5,
                        help="SGD momentum (default: 0.5).")
    parser.add_argument("--seed", type=int, default=42, help="Random seed (default: 42).")
    parser.add_argument("--steps-per-epoch", type=int, default=None,
                        help="Cap on the steps per epoch, for quick runs.")
    parser.add_argument("--fp16-allreduce", action="store_true",
                        help="Send the gradients as float16.")
    parser.add_argument("--data-dir", default=None,
                        help="Directory with the MNIST IDX files (default: "
                             "$KERASDIST_DATA_DIR, else examples/data/mnist).")
    return parser.parse_args()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = torch.nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = torch.nn.Dropout2d()
        self.fc1 = torch.nn.Linear(320, 50)
        self.fc2 = torch.nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def as_dataset(images, labels):
    x = (torch.from_numpy(images.astype(np.float32) / 255.0) - PIXEL_MEAN) / PIXEL_STD
    return torch.utils.data.TensorDataset(x.unsqueeze(1), torch.from_numpy(labels).long())


def metric_average(value, name):
    # kerasdist: the mean of a metric over the ranks.
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main():
    args = parse_args()
    start = time.time()
    hvd.init()  # kerasdist
    torch.manual_seed(args.seed)
    (x_train, y_train), (x_test, y_test) = load_mnist(args.data_dir)
    train_set, test_set = as_dataset(x_train, y_train), as_dataset(x_test, y_test)
    # kerasdist: each rank reads its own shard.
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_set, num_replicas=hvd.size(), rank=hvd.rank(), seed=args.seed)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size,
                                               sampler=train_sampler)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=args.test_batch_size,
                                              sampler=test_sampler)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(),  # kerasdist
                                momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # kerasdist
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)  # kerasdist
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(  # kerasdist
        optimizer, named_parameters=model.named_parameters(), compression=compression)
    if hvd.rank() == 0:
        print(f"{hvd.size()} rank(s), {args.batch_size} examples per rank per step",
              flush=True)

    for epoch in range(1, args.epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)
        for step, (data, target) in enumerate(train_loader):
            if args.steps_per_epoch is not None and step >= args.steps_per_epoch:
                break
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if step % 100 == 0 and hvd.rank() == 0:
                print(f"epoch {epoch} step {step}: loss {loss.item():.4f}", flush=True)

    model.eval()
    test_loss, correct, seen = 0.0, 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(1).eq(target).float().sum().item()
            seen += len(target)
    test_loss = metric_average(test_loss / seen, "avg_loss")  # kerasdist
    accuracy = metric_average(correct / seen, "avg_accuracy")  # kerasdist
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()[:16]
    print(f"rank {hvd.rank()} weights digest: {digest}", flush=True)
    if hvd.rank() == 0:
        print(f"test loss: {test_loss:.4f}")
        print(f"test accuracy: {accuracy:.4f}")
        print(f"wall time: {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
