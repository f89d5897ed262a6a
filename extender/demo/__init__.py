"""`make demo`: an in-memory cluster of real platforms (`cluster`) driven over HTTP as kube-scheduler drives the
extender (`scheduler`), beside count-only placement (`count_only`): mixed pods, shared GPUs, whole groups; and
DRA objects shaped as NVIDIA's driver and kube-scheduler write them (`dra_objects`).
Imports every package but `kubectl`."""
