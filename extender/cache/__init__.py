"""The cluster as the extender sees it: node views and keys fed by the watches, and the ledger, the one owner of
every GPU reservation, reconciled with what the node agents report and with the GPUs DRA publishes and allocates
(`dra_inventory`). Imports `api` and `topology`; it knows groups only through the small protocol the ledger calls
(`ledger.SlotClaims`)."""
