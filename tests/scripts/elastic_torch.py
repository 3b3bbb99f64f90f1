"""kerasdist.torch.elastic across a job restart (kerasdist-run --max-restarts 1).

3 epochs of 5 batches of 4 per rank at np=2, from an `ElasticSampler`. On
the first attempt (unless KD_NO_CRASH), rank 1 SIGKILLs itself before batch
3 of epoch 1; the restarted job continues from the last commit (after each
batch). Rank 0 logs each batch with the attempt; every rank writes a digest
of its final weights (`weights.<rank>`, or `weights.ref.<rank>` without the
crash)."""

import hashlib
import json
import os
import signal
import sys

import torch

import kerasdist.torch as hvd

EPOCHS, STEPS, BATCH = 3, 5, 4
OUT = sys.argv[1]
ATTEMPT = int(os.environ.get("KERASDIST_RESTART", "0") or 0)
NO_CRASH = bool(os.environ.get("KD_NO_CRASH"))


def main():
    hvd.init()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    x = torch.rand(STEPS * BATCH * hvd.size(), 3, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]])
    dataset = torch.utils.data.TensorDataset(x, y)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, batch=0,
                                   checkpoint_dir=os.path.join(OUT, "elastic"))

    @hvd.elastic.run
    def train(state):
        for epoch in range(state.epoch, EPOCHS):
            state.epoch = epoch
            loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH,
                                                 sampler=state.sampler)
            for xb, yb in loader:
                if (not NO_CRASH and ATTEMPT == 0 and hvd.rank() == 1
                        and (epoch, state.batch) == (1, 3)):
                    os.kill(os.getpid(), signal.SIGKILL)
                if hvd.rank() == 0:
                    with open(os.path.join(OUT, "batches.log"), "a") as f:
                        f.write(json.dumps([ATTEMPT, epoch, state.batch]) + "\n")
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(xb), yb).backward()
                opt.step()
                state.batch += 1
                state.sampler.record_batch(state.batch, BATCH)
                state.commit()
            state.batch = 0
            state.sampler.set_epoch(epoch + 1)
            state.commit()

    train(state)
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()
    name = f"weights.ref.{hvd.rank()}" if NO_CRASH else f"weights.{hvd.rank()}"
    with open(os.path.join(OUT, name), "w") as f:
        f.write(digest)


main()
