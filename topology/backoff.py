"""Jittered exponential backoff with a cap: how the reporter and the extender's watches wait after a failure, so
neither ever spins."""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    """Delays initial, 2x initial, 4x initial ... up to `maximum`, each scaled by a random factor in
    [1 - jitter, 1 + jitter].

    The jitter matters for a DaemonSet: when the API server comes back, a thousand reporters that failed
    together would otherwise retry together. `rand` is injectable for tests; `reset()` after a success.
    """

    def __init__(self, initial: float = 1.0, maximum: float = 30.0, jitter: float = 0.5,
                 rand: Callable[[], float] = random.random) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(f"backoff needs 0 < initial <= maximum, got {initial} and {maximum}")
        if not 0 <= jitter < 1:
            raise ValueError(f"backoff jitter must be in [0, 1), got {jitter}")
        self.initial, self.maximum, self.jitter, self._rand = initial, maximum, jitter, rand
        self.failures = 0

    def next(self) -> float:
        """The delay before the next attempt; every call counts one more failure."""
        base = min(self.maximum, self.initial * 2.0 ** min(self.failures, 64))
        self.failures += 1
        return base * (1.0 + self.jitter * (2.0 * self._rand() - 1.0))

    def reset(self) -> None:
        self.failures = 0
