"""Audit recorded rounds: verify an engine that cannot run here (a GPU kernel, a production server)
from what it logs.

- :mod:`.fields`: the compact fields of a round, from raw rows or logits (numpy; torch on device);
- :mod:`.records`: the record format (Arrow: Parquet or IPC files), written and streamed back;
- :mod:`.counting`: rounds checked and counted batch by batch (counts that merge exactly);
- :mod:`.run`: ``specsample audit``: the tests and the report;
- :mod:`.fleet`: the counting on a Dask cluster, for a fleet's logs;
- :mod:`.recorder`: run a host sampler and record its rounds (for tests and for ``--record``);
- :mod:`.loop_rounds`: the rounds a whole loop reveals through its provenance (``--generate --record``).
"""

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "fields": "compact_fields compact_fields_torch stop_law",
    "records": "RecordError read_batches schema table write_records",
    "run": "audit",
    "counting": "Tally tally",
    "recorder": "RecordSink record_sampler",
    "fleet": "tally_dask",
    "loop_rounds": "LoopRecordError",
})
