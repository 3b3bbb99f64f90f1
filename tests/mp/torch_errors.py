"""Bad input to kerasdist.torch's collectives at np=2 and np=3: every rank
gets a clear error, and the engine keeps working. Prints "<name> passed"."""

import time

import numpy as np
import torch

import kerasdist.torch as hvd
from _util import log, main


def expect(exc, fn, *needles):
    try:
        fn()
    except exc as e:
        for needle in needles:
            assert needle in str(e), (needle, str(e))
        return str(e)
    raise AssertionError(f"no {exc} raised")


def still_works(tag):
    n = hvd.size()
    out = hvd.allreduce(torch.ones(3), op=hvd.Sum, name=f"after.{tag}")
    assert np.array_equal(out.numpy(), np.full(3, float(n))), out


def check_mismatches_fail_on_every_rank():
    r, n = hvd.rank(), hvd.size()
    last = n - 1
    x = torch.ones(4, dtype=torch.int32 if r == last else torch.float32)
    msg = expect(hvd.HorovodInternalError, lambda: hvd.allreduce(x, name="mix.dtype"),
                 "mix.dtype")
    assert "dtype" in msg.lower() or "type" in msg.lower(), msg
    still_works("dtype")
    expect(hvd.HorovodInternalError,
           lambda: hvd.allreduce(torch.ones(4 + (r == last)), name="mix.shape"), "mix.shape")
    still_works("shape")
    expect(hvd.HorovodInternalError,
           lambda: hvd.allreduce(torch.ones(2), op=hvd.Max if r == last else hvd.Sum,
                                 name="mix.op"), "mix.op")
    still_works("op")
    expect(hvd.HorovodInternalError,
           lambda: hvd.broadcast(torch.ones(2), root_rank=r, name="mix.root"), "mix.root")
    still_works("root")
    expect(hvd.HorovodInternalError,
           lambda: hvd.allgather(torch.ones(2, 3 + (r == last)), name="mix.ag"), "mix.ag")
    still_works("allgather")
    # Bad splits (here on one rank): every rank fails; that one with ValueError.
    splits = [5] * n if r == last else [1] * n
    expect(ValueError if r == last else hvd.HorovodInternalError,
           lambda: hvd.alltoall(torch.ones(n), splits=splits, name="bad.splits"), "bad.splits")
    still_works("splits")
    expect(ValueError, lambda: hvd.alltoall(torch.ones(n), splits=torch.ones(n)), "integers")
    log("check_mismatches_fail_on_every_rank passed")


def check_local_errors_are_clear():
    expect(ValueError, lambda: hvd.allreduce(torch.ones(2, device="meta")),
           "CPU tensors only", "meta")
    expect(TypeError, lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64)),
           "Unsupported dtype", "complex64")
    expect(TypeError, lambda: hvd.allreduce([1.0, 2.0]), "torch.Tensor")
    expect(ValueError, lambda: hvd.allreduce(torch.ones(2), op=17), "Average, Sum")
    expect(ValueError, lambda: hvd.broadcast(torch.ones(2), root_rank=hvd.size()),
           "root_rank")
    expect(ValueError, lambda: hvd.reducescatter(torch.ones(2), op=hvd.Min), "Average or")
    expect(NotImplementedError, lambda: hvd.reducescatter(torch.ones(2), op=hvd.Adasum),
           "Adasum")
    expect(ValueError, lambda: hvd.synchronize(123456), "handle")
    expect(ValueError, lambda: hvd.allgather(torch.tensor(1.0)), "at least one dimension")
    still_works("local")
    log("check_local_errors_are_clear passed")


def check_name_reused_in_flight():
    # The last rank holds its part back (until the others have tried), so
    # the first 'twice' is surely in flight on the others when they reuse
    # the name: the error is this rank's own, and it loses nothing.
    from mpi4py import MPI

    comm, r, last = MPI.COMM_WORLD, hvd.rank(), hvd.size() - 1
    if r != last:
        h1 = hvd.allreduce_async(torch.ones(2), name="twice", op=hvd.Sum)
        reused = expect(ValueError, lambda: hvd.allreduce_async(torch.ones(2), name="twice"),
                        "'twice' is already in flight")
        log("reused:", reused)
        comm.send("tried", dest=last, tag=11)
    else:
        deadline = time.monotonic() + 60  # bounded: a rank that failed never sends
        for q in range(last):
            req = comm.irecv(source=q, tag=11)
            while not req.test()[0]:
                if time.monotonic() > deadline:
                    req.Cancel()
                    raise AssertionError(f"rank {q} never tried the reused name")
                time.sleep(0.01)
        h1 = hvd.allreduce_async(torch.ones(2), name="twice", op=hvd.Sum)
    assert np.array_equal(hvd.synchronize(h1).numpy(), np.full(2, float(hvd.size())))
    still_works("reused")
    log("check_name_reused_in_flight passed")


def run():
    check_local_errors_are_clear()
    check_mismatches_fail_on_every_rank()
    check_name_reused_in_flight()


main(run)
