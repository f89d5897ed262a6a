"""The extender protocol as kube-scheduler speaks it, and what a pod or a PodGroup asks for: wire types, their
bounds, the OpenAPI document, the DRA objects it reads (`dra`) and the C passes over node names (`_names`).
Imports only `topology`."""
