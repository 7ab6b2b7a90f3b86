"""A fleet's logs: the audit's counting on a Dask cluster (``specsample audit --dask ADDRESS``).

Work units are the record files and Parquet row groups (:func:`~.records.work_units`); each is
tallied on a worker (:func:`~.counting._tally_part`) and the tallies are merged here. The counts
are integers (the acceptance sums in fixed point), so the result equals a serial audit's bit for
bit whatever the cluster, the units or the order they finish in. Dask is an optional extra:
``pip install -e ".[dask]"``.
"""

from __future__ import annotations

from .counting import _merge, _tally_part
from .records import work_units


def client_for(where, workers: int = 2):
    """A ``distributed.Client``: ``where`` is one already, a scheduler address (``tcp://host:8786``),
    or ``"local"`` (a local cluster of ``workers`` processes, one thread each, closed with the client)."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ValueError("--dask needs Dask's distributed scheduler: pip install -e \".[dask]\"") from None
    if isinstance(where, Client):
        return where
    if where == "local":
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
        client._specsample_cluster = cluster  # closed with the client by tally_dask
        return client
    return Client(where)


def tally_dask(paths, where="local", *, seed: int = 0, batch_size: int = 65_536, workers: int = 2) -> dict:
    """``{(rule, k): Tally}`` of the record files under ``paths``, counted on a Dask cluster.

    Paths must be readable by the workers (a shared file system, or object storage pyarrow reads).
    """
    client = client_for(where, workers)
    own = not hasattr(where, "gather")
    try:
        n = max(1, len(client.scheduler_info().get("workers", {})) or workers)
        # a Dask worker's threads are its cluster's to share: no reader thread of ours beside them
        units = [(path, groups, seed, batch_size, False) for path, groups in work_units(paths, 2 * n)]
        return _merge(client.gather(client.map(_tally_part, units, pure=False)))
    finally:
        if own:
            cluster = getattr(client, "_specsample_cluster", None)
            client.close()
            if cluster is not None:
                cluster.close()
