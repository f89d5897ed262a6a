"""The pure core: GPU/link model, topology parsers, bandwidth model, exact GPU-set selection and codec.

Nothing here imports Kubernetes, FastAPI or the extender; NVML is reached only through `topology.discover`.
"""
