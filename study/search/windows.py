"""How the training windows reach the trials of a sweep.

- in memory (the default): each one-process trial holds the windows it was handed (``tune.with_parameters``) and
  shuffles them as ``study.train`` does;
- data-parallel trials (``workers_per_trial > 1``): a materialized Ray Dataset, one shard per worker;
- streamed (``dataset: {stream: true}``): a lazy Ray Dataset over the prepared Parquet, read again every epoch, so
  no process holds the training windows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from study.search.trial import keep_trainable, quiet_ray_data

# A streaming study (``dataset: {stream: true}``): the training windows a trial keeps for its probes, and the rows of
# the local shuffle buffer its batches are drawn from (the windows arrive in file order, user by user).
STREAM_SAMPLE_ROWS = 1024
STREAM_SHUFFLE_ROWS = 50_000
# Ray Data (2.60) runs no task while the cluster has less than one whole CPU free (a streamed read stalls with 0.5
# CPU free as with none), so a streaming study leaves one CPU to its reads
STREAM_SPARE_CPUS = 1.0
STREAM_TASK_CPUS = 0.25  # a read or filter task's share of the spare CPU: a few trials' reads run side by side


def training_windows(path: Path, stream: bool) -> Any:
    """The training windows a sweep hands to its trials: a pyarrow table read now, or (``stream``) the path of the
    Parquet file or folder that the trials read themselves, epoch by epoch."""
    import pyarrow.parquet as pq

    if stream:
        return str(path / "sequences.parquet")
    return pq.read_table(path / "sequences.parquet", columns=["user", "train"])


def streamed_dataset(parquet: str) -> Any:
    """The training windows as a lazy Ray Dataset over the prepared Parquet: each epoch of each trial reads them
    again, block by block, so no process holds them all.

    Its tasks run on the CPU a streaming study leaves free (``STREAM_SPARE_CPUS``), a quarter CPU each. The file
    must be readable where the trials run (on a cluster, the data cache on shared storage).
    """
    import ray.data

    quiet_ray_data()
    windows = ray.data.read_parquet(parquet, num_cpus=STREAM_TASK_CPUS).select_columns(["user", "train"])
    return windows.map_batches(keep_trainable, batch_format="numpy", num_cpus=STREAM_TASK_CPUS)


def materialized_dataset(table: Any) -> Any:
    """The training windows as a materialized Ray Dataset (materialized now, before trials hold every CPU).

    The driver reads the file and puts the table into the object store (``from_arrow``) rather than
    ``read_parquet``, whose read tasks may be scheduled on another node, where the driver's prepared-data folder
    does not exist; trials then fetch the blocks from the object store wherever they run.
    """
    import ray.data

    quiet_ray_data()
    return ray.data.from_arrow(table).map_batches(keep_trainable, batch_format="numpy").materialize()
