"""A deterministic work budget for selection, counted in search steps rather than seconds.

Choosing the best GPU set is NP-hard in general (it contains Hamiltonian cycle and densest subgraph), and a
node's annotation is written by whoever can patch the Node. Real boards need a few thousand steps; a hostile
board within the bounds could need billions. Counting steps, not time, gives every replica and every run the
same answer for the same query, and makes the bound testable on a noisy machine.
"""

from __future__ import annotations

# Steps one selection query may take. The slowest bundled board (a DGX-2, 16 GPUs) needs under 5,000 for any
# free set and constraint, and plausible 16-GPU boards with many ties (16 PCIe GPUs in a switch tree, bridge
# pairs) under 28,000. A step is one to two microseconds, so a query that runs out stops within about 0.2 s
# (loadtests/bench_select.py --adversarial prints the figures).
WORK_BUDGET = 100_000


class BudgetExhausted(Exception):
    """The query used up its steps; the caller answers safely instead (topology/select.py says how)."""


class WorkBudget:
    """Steps left for one query; `spend` raises BudgetExhausted once they run out."""

    __slots__ = ("left",)

    def __init__(self, steps: int = WORK_BUDGET) -> None:
        self.left = steps

    def spend(self, steps: int) -> None:
        self.left -= steps
        if self.left < 0:
            raise BudgetExhausted
