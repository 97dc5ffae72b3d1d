"""Datasets over the pipeline's Arrow outputs and the downstream tasks' TSVs; batching lives here, not in models."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa


def list_column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) of a list column, zero-copy from a memory-mapped IPC file when it has one chunk.

    `.values` of a sliced ListArray is the whole chunk, so offsets are taken as they are, not rebased."""
    column = table.column(name)
    array = column.chunk(0) if column.num_chunks == 1 else pa.concat_arrays(column.chunks)
    return array.offsets.to_numpy(), array.values.to_numpy()



def read_arrow(path: str | Path) -> pa.Table:
    """Memory-mapped read of an Arrow IPC file (zero-copy: uncompressed files only)."""
    return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
