"""kerasdist.data.tfds_split across ranks, on a tiny TFDS dataset built
offline in TMP_DIR. Usage: data_tfds.py TMP_DIR (data_shards.py also runs
check_tfds, to save an mpiexec launch).

`tfds.testing.mock_data` returns the same examples whatever the split, so
it cannot show that the parts are disjoint; a real (tiny) prepared dataset
can, and needs no download.
"""

import os
import sys

import numpy as np

import kerasdist as kd
from _util import log, main
from kerasdist import data

NUM_EXAMPLES = 11  # a remainder at 2 and at 3 ranks


def _builder_class(tfds):
    class KerasdistTinyIds(tfds.core.GeneratorBasedBuilder):
        """Examples {"id": i} for i in range(NUM_EXAMPLES)."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict(
                    {"id": tfds.features.Scalar(dtype=np.int64)}),
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for i in range(NUM_EXAMPLES):
                yield i, {"id": i}

    return KerasdistTinyIds


def check_tfds(size, r, tmp_root):
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        log("tfds: skipped (tensorflow-datasets is not installed)")
        return
    tfds.disable_progress_bar()
    builder_cls = _builder_class(tfds)
    path = None
    if r == 0:
        path = os.path.join(tmp_root, "tfds")
        builder_cls(data_dir=path).download_and_prepare()
    path = kd.broadcast_object(path, root_rank=0, name="tfds.path")
    kd.barrier(name="tfds.ready")
    builder = builder_cls(data_dir=path)
    for drop in (True, False):
        split = data.tfds_split("train", drop_remainder=drop)
        ids = [int(e["id"]) for e in builder.as_dataset(split=split)]
        parts = kd.allgather_object(ids, name=f"tfds.ids.{drop}")
        union = sum(parts, [])
        assert len(union) == len(set(union)), ("not disjoint", parts)
        sizes = [len(p) for p in parts]
        if drop:
            assert sizes == [NUM_EXAMPLES // size] * size, parts
        else:
            assert sorted(union) == list(range(NUM_EXAMPLES)), parts
            assert max(sizes) - min(sizes) <= 1, parts
        log(f"tfds: drop_remainder={drop} part sizes {sizes}")
    # Equal parts give equal step counts; the check passes on every rank.
    ds = builder.as_dataset(split=data.tfds_split("train")).batch(2)
    data.check_equal_steps(sum(1 for _ in ds), name="tfds_steps")
    log("tfds: ok")


if __name__ == "__main__":
    main(lambda: check_tfds(kd.size(), kd.rank(), sys.argv[1]))
