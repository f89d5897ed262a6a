"""The Kubernetes scheduler extender (filter, prioritize, preempt, bind) built on `topology`.

Its packages, each importing only those before it (tests/extender/test_layout.py holds them to it):
`api` (the protocol's wire types and what a pod asks for), `kube` (the Kubernetes client), `cache` (the
cluster as the watches show it, and the ledger of reservations), `groups` (whole-group plans), `verbs` (the
policy of each verb), `server` (HTTP), then `kubectl` and `demo` beside each other; `cli` wires them.
ARCHITECTURE.md draws the flow.
"""
