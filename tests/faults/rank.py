"""One rank of a fault-injection case (driven by tests/faults/harness.py).

    rank.py <point> <KILL|STOP> <0|last> <case dir>

Every rank writes `pid.<rank>` (its pid and its parent's) into the case
dir first. The victim rank reaches <point>, writes `fault` (the
`time.monotonic()` of the fault, which is system-wide on Linux, so the
harness can compare it with its own clock) and sends itself SIGKILL or
SIGSTOP. The other ranks (survivors) run the same point; whatever they
raise is written to `result.<rank>` with its message, and they exit with
code 3. A survivor that gets through writes an "ok" result and exits 0.

Points (the victim's side; survivors do the collective that needs it):
- before_init: the victim dies before `init()`, before MPI_Init even (it
  only imported kerasdist), while the others are inside `init()`.
- in_init: MPI is up everywhere; the others are inside `init()` (the
  engine's setup exchange) when the victim, which never called `init()`,
  dies.
- negotiation: after `init()`; the others wait in an allreduce the victim
  never submits.
- mid_ring: inside a loop of 64 MiB allreduces, a quarter of the shortest
  allreduce so far into one of them (a watcher thread faults only while
  the main thread is inside a call that has run that long: never between
  two rings, whatever the load does to their length).
- coordinator_blocked (np=3, victim last): rank 0 and the victim exchange
  64 MiB alltoalls in a loop that leaves rank 1 out (its splits are 0),
  so rank 1 finishes each one at once and waits in the next one's
  negotiation while rank 0's engine is busy moving the bytes; the victim
  freezes inside one alltoall, as for mid_ring. Rank 0 is then blocked on
  the victim and sends rank 1 nothing: rank 1 must still name the victim,
  not rank 0.
- mid_fit: at batch 20 of `fit` (tiny Keras model, DistributedOptimizer),
  the others inside their step's gradient allreduces.
- mid_backward: inside step 20's backward pass of a PyTorch model with
  `kerasdist.torch.DistributedOptimizer`, some of its gradients' allreduces
  already enqueued; the others wait in `optimizer.step()`.
- shutdown: the others call `shutdown()` once the victim is down (its
  process stopped or gone), so it acknowledges none of theirs. Dying 2 ms
  into its own `shutdown()` left that to chance: the victim's engine thread
  acknowledges the others' shutdown as soon as it arrives, so the others
  usually completed theirs and then waited in MPI_Finalize (the next point).
- after_shutdown: every rank's `shutdown()` returned (each acknowledged
  the others'); then the victim dies, while the others exit.

Whether the survivors of a SIGSTOP really were inside the ring (and not
negotiating the next collective) shows in their errors; the harness checks
it (harness.landed) and runs the case again if the fault missed.

Only the Keras point imports Keras and only mid_backward PyTorch;
TensorFlow loads with `init()`.
"""

import contextlib
import json
import os
import signal
import sys
import threading
import time

POINT, SIG, VICTIM_SPEC, DIR = sys.argv[1:5]
RANK = int(os.environ["PMI_RANK"])
SIZE = int(os.environ["PMI_SIZE"])
VICTIM = 0 if VICTIM_SPEC == "0" else SIZE - 1
SIGNAL = {"KILL": signal.SIGKILL, "STOP": signal.SIGSTOP}[SIG]
SURVIVORS = [r for r in range(SIZE) if r != VICTIM]
BIG = 16 << 20  # float32 elements: 64 MiB


def write(name, data):
    tmp = os.path.join(DIR, f".{name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, os.path.join(DIR, name))


def wait_for(names, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(os.path.join(DIR, n)) for n in names):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {RANK}: {names} did not appear")
        time.sleep(0.01)


def log(text):
    sys.stdout.write(f"[rank {RANK}] {text}\n")
    sys.stdout.flush()


def fault(**info):
    """Writes the fault record, then kills or stops this process."""
    write("fault", {"t": time.monotonic(), "rank": RANK, "pid": os.getpid(),
                    "point": POINT, "signal": SIG, **info})
    os.kill(os.getpid(), SIGNAL)
    time.sleep(3600)  # A stopped victim never gets here: it is killed.


class FaultInside:
    """Faults from a watcher thread `fraction` of the shortest call so far
    into a call, and only while the main thread is still inside that call.

    Wrap each collective of a loop in `with calls:`. A call that ends sooner
    shortens the wait, so a loop that speeds up is still hit in a call.
    """

    def __init__(self, fraction, shortest, **info):
        self.fraction, self.shortest, self.info = fraction, shortest, info
        self.started = None  # monotonic start of the call in progress
        self.calls = 0
        threading.Thread(target=self._watch, daemon=True).start()

    def __enter__(self):
        self.started = time.monotonic()

    def __exit__(self, *exc):
        self.shortest = min(self.shortest, time.monotonic() - self.started)
        self.started = None
        self.calls += 1

    def _watch(self):
        while True:
            started = self.started
            if started is not None:
                into = time.monotonic() - started
                if into >= self.fraction * self.shortest and self.started == started:
                    fault(into_call_s=round(into, 4), call=self.calls,
                          shortest_s=round(self.shortest, 4), **self.info)
            time.sleep(0.002)


def survivors_marked(prefix):
    return [f"{prefix}.{r}" for r in SURVIVORS]


# --- the points ------------------------------------------------------------
# Each takes `victim` (bool) and either faults (victim) or returns (survivor:
# the harness expects it to raise).

def before_init(victim):
    if victim:
        wait_for(survivors_marked("init"))
        time.sleep(1.0)  # The others are inside init() (MPI_Init) by now.
        fault(mpi_initialized="mpi4py" in sys.modules)
    import tensorflow  # noqa: F401  (outside the fault window)

    import kerasdist as kd
    write(f"init.{RANK}", {})
    kd.init()
    kd.allreduce(tensorflow.ones([8]), name="after.init")


def in_init(victim):
    import kerasdist as kd
    import kerasdist.common.basics  # noqa: F401  (TensorFlow, MPI_Init everywhere)
    if victim:
        wait_for(survivors_marked("init"))
        time.sleep(0.5)  # The others wait in init()'s setup exchange.
        fault(mpi_initialized=True)
    write(f"init.{RANK}", {})
    kd.init()
    import tensorflow as tf
    kd.allreduce(tf.ones([8]), name="after.init")


def negotiation(victim):
    import kerasdist as kd
    kd.init()
    import tensorflow as tf
    kd.allreduce(tf.ones([8]), name="warm")
    if victim:
        wait_for(survivors_marked("waiting"))
        time.sleep(0.3)
        fault()
    write(f"waiting.{RANK}", {})
    kd.allreduce(tf.ones([8]), name="never.submitted.by.victim")


def mid_ring(victim):
    import kerasdist as kd
    kd.init()
    import tensorflow as tf
    x = tf.ones([BIG])
    took = []
    for _ in range(2):  # the first one also sets up buffers
        start = time.monotonic()
        out = kd.allreduce(x, op=kd.Sum, name="big")
        took.append(time.monotonic() - start)
    assert float(out[0]) == SIZE and float(out[-1]) == SIZE, out[:4]
    # The survivors loop until their allreduce fails; the victim faults a
    # quarter into one of its allreduces (FaultInside).
    calls = FaultInside(0.25, min(took), warm_allreduce_s=round(min(took), 4)) \
        if victim else contextlib.nullcontext()
    for _ in range(200):
        with calls:
            kd.allreduce(x, op=kd.Sum, name="big")
    if victim:
        time.sleep(3600)


def coordinator_blocked(victim):
    import kerasdist as kd
    kd.init()
    import tensorflow as tf
    assert SIZE == 3 and VICTIM == 2, "coordinator_blocked runs at np=3, victim last"
    rows = BIG // 2 if RANK != 1 else 0  # 32 MiB to each of ranks 0 and 2
    splits = [rows, 0, rows] if RANK != 1 else [0, 0, 0]
    x = tf.fill([2 * rows], float(RANK))
    took = []
    for _ in range(2):
        start = time.monotonic()
        out, _ = kd.alltoall(x, splits=splits, name="a2a")
        took.append(time.monotonic() - start)
    if RANK != 1:
        assert out.shape[0] == 2 * rows and float(out[0]) == 0 and float(out[-1]) == 2, out
    calls = FaultInside(0.25, min(took), warm_alltoall_s=round(min(took), 4)) \
        if victim else contextlib.nullcontext()
    for _ in range(200):
        with calls:
            kd.alltoall(x, splits=splits, name="a2a")
    if victim:
        time.sleep(3600)


def mid_fit(victim):
    import kerasdist as kd
    kd.init()
    import keras
    import numpy as np

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, "relu"),
                              keras.layers.Dense(1)])
    model.compile(kd.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse")
    x = np.random.RandomState(RANK).rand(64, 8).astype("float32")
    y = x.sum(1, keepdims=True)

    class Fault(keras.callbacks.Callback):
        steps = 0

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1  # `batch` restarts every epoch (16 batches).
            if victim and self.steps == 20:
                fault(step=self.steps)

    model.fit(x, y, batch_size=4, epochs=1000, verbose=0, callbacks=[Fault()])


def mid_backward(victim):
    """PyTorch: the victim faults inside step 20's backward pass, from a
    gradient hook, after the later layers' allreduces have started; the
    others wait in `optimizer.step()` for the gradients' allreduces."""
    import torch

    import kerasdist.torch as hvd
    hvd.init()
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    steps = [0]
    if victim:  # the first layer's gradient is among the last to be ready
        model[0].weight.register_post_accumulate_grad_hook(
            lambda p: fault(step=steps[0]) if steps[0] == 20 else None)
    x = torch.rand(64, 8, generator=torch.Generator().manual_seed(RANK))
    y = x.sum(1, keepdim=True)
    for steps[0] in range(1000):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def mid_jit(victim):
    """JAX: a jitted train step reduces its gradients with one grouped
    allreduce (an XLA FFI custom call); the victim faults before its step
    20, while the others wait inside that step's custom call."""
    import jax
    import jax.numpy as jnp

    import kerasdist.jax as kd
    kd.init()
    params = {"w": jnp.ones((8, 16)) * 0.1, "v": jnp.ones((16, 1)) * 0.1}
    x = jax.random.uniform(jax.random.PRNGKey(RANK), (64, 8))
    y = x.sum(1, keepdims=True)

    @jax.jit
    def step(params):
        loss = lambda p: jnp.mean((jnp.tanh(x @ p["w"]) @ p["v"] - y) ** 2)  # noqa: E731
        grads = jax.grad(loss)(params)
        names = sorted(grads)
        reduced = kd.grouped_allreduce([grads[k] for k in names], name="jit.grads")
        return {k: params[k] - 0.01 * g for k, g in zip(names, reduced)}

    for i in range(1000):
        if victim and i == 20:
            fault(step=i)
        params = jax.block_until_ready(step(params))


def victim_down():
    """Waits (bounded) until the victim has faulted and is stopped or gone."""
    wait_for(["fault", f"pid.{VICTIM}"])
    with open(os.path.join(DIR, f"pid.{VICTIM}")) as f:
        pid = json.load(f)["pid"]
    deadline = time.monotonic() + 30
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state in ("T", "Z", "X"):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {RANK}: the victim is still in state {state}")
        time.sleep(0.01)


def shutdown(victim):
    import kerasdist as kd
    kd.init()
    import tensorflow as tf
    kd.allreduce(tf.ones([8]), name="warm")
    if victim:
        fault()
    # Only once the victim is down: its engine thread acknowledges a
    # shutdown() for it as long as it runs, even while its Python sleeps.
    victim_down()
    kd.shutdown()


def after_shutdown(victim):
    import kerasdist as kd
    kd.init()
    import tensorflow as tf
    kd.allreduce(tf.ones([8]), name="warm")
    kd.shutdown()  # Every rank's, acknowledged by every rank.
    if victim:
        fault()


POINTS = {f.__name__: f for f in (before_init, in_init, negotiation, mid_ring,
                                  coordinator_blocked, mid_fit, mid_backward, mid_jit, shutdown,
                                  after_shutdown)}


def main():
    write(f"pid.{RANK}", {"pid": os.getpid(), "ppid": os.getppid()})
    victim = RANK == VICTIM
    try:
        POINTS[POINT](victim)
    except Exception as e:  # noqa: BLE001  (a survivor's expected failure)
        if victim:
            raise
        message = getattr(e, "message", None) or str(e)
        write(f"result.{RANK}", {"t": time.monotonic(), "ok": False,
                                  "error": type(e).__name__, "message": message})
        log(f"survivor failed: {type(e).__name__}: {message}")
        sys.exit(3)
    write(f"result.{RANK}", {"t": time.monotonic(), "ok": True, "message": ""})
    log("survivor finished without an error")


main()
