"""Horovod's `horovod.torch.elastic` on MPI: recovery is a restart of the
whole job (`kerasdist-run --max-restarts N`) from the last commit.

Example:

```python
state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

@hvd.elastic.run
def train(state):
    for state.epoch in range(state.epoch, EPOCHS):
        for state.batch in range(state.batch, BATCHES):
            ...
            if state.batch % 100 == 0:
                state.commit()
        state.batch = 0

train(state)
```
"""

from kerasdist.common.elastic import ObjectState, State, restart_count, run  # noqa: F401
from kerasdist.common.exceptions import (HorovodInternalError,  # noqa: F401
                                         HostsUpdatedInterrupt)
from kerasdist.torch.elastic.sampler import ElasticSampler  # noqa: F401
from kerasdist.torch.elastic.state import TorchState  # noqa: F401

__all__ = ["ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State",
           "TorchState", "restart_count", "run"]
