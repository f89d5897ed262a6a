"""Whole groups: how many members a PodGroup says a group has, the layouts one domain can give it, and the
plans in force, whose open slots the ledger holds. Imports `cache`, `api` and `topology`."""
