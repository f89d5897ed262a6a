"""The garbage collector of a serving extender, kept off kube-scheduler's hot path.

Thousands of nodes are hundreds of thousands of long-lived objects; a full collection over them stalls every
thread for hundreds of milliseconds. So once the first lists are in, they are collected once and frozen: frozen
objects are never scanned again, and what changes later is young.

Young collections are made rare too. A collection walks every young object still alive, and most of them are
the cluster's own changes (pods, their requests, ledger entries), so the work per pod is about the same however
it is batched: at CPython's default threshold (700) `make loadtest` at 5,000 names logged a young collection
every 60 cycles and a middle one every 600 (up to 17 ms), which landed on one request in a hundred; at 20,000,
three in 4,500 cycles (about 25 ms each, past the p99). Over 12,000 cycles in one process the collector took
205 ms in all instead of 569, its longest pause 48 ms instead of 114 (a full collection). The threshold counts
objects allocated and not yet freed, so garbage cycles wait for at most that many allocations.
"""

from __future__ import annotations

import gc
import time

from extender.cache.cluster_state import ClusterState

YOUNG_THRESHOLD = 20_000
"""Allocations less frees between young collections (CPython's default is 700)."""


def settle_when_synced(state: ClusterState, poll_seconds: float = 0.2) -> None:
    """Wait for the first Node and Pod lists, then freeze what survives a full collection and make young
    collections rare. Meant for a thread of its own, started with the server."""
    while not state.ready:
        time.sleep(poll_seconds)
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
