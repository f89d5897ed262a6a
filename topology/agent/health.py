"""GPU health from NVML, polled each round: which GPUs must not be given to a pod, and why.

NVIDIA's device plugin marks a GPU unhealthy on a critical XID event (it ignores the application XIDs 13,
31, 43, 45, 68 and 109), or when it cannot get the GPU's handle by UUID. The kubelet then leaves that GPU
out of GetAllocatableResources, and `devices.observe` already reports such GPUs. This module adds what
NVML can be asked directly, without an event subscription, once per round:

- the GPU is lost or gone: its handle or a query fails with GPU_IS_LOST, NOT_FOUND, RESET_REQUIRED, ...;
- uncorrectable ECC errors since the last reset (volatile counter > 0): the XIDs 48/63/64/94/95 family;
  the GPU needs a reset before it can be trusted;
- row remapping failed (Ampere and later): the memory cannot be repaired any more.

A check a GPU cannot answer (no ECC on the board, no row remapping before Ampere, no permission) is
skipped. An error that means NVML itself is gone (driver unloaded, library mismatch) raises
`NvmlUnavailable`: the reporter exits and the DaemonSet restarts it.
"""

from __future__ import annotations

import contextlib
from types import ModuleType

from topology.discover import NvmlUnavailable, _import_pynvml
from topology.model import Topology


class NvmlHealth:
    """Holds NVML initialised between `open()` and `close()` (NVML counts inits, so discovery may run too)."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nvml = nvml
        self._open = False

    def open(self) -> NvmlHealth:
        if self._nvml is None:
            self._nvml = _import_pynvml()
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            raise NvmlUnavailable(f"NVML is not available: {error}") from None
        self._open = True
        return self

    def close(self) -> None:
        if self._open and self._nvml is not None:
            self._open = False
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()

    def __enter__(self) -> NvmlHealth:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check(self, topology: Topology) -> dict[str, str]:
        """GPU id (UUID, or GPU<index>) -> why it is unhealthy, for every unhealthy GPU."""
        assert self._open and self._nvml is not None, "open() first"
        reasons: dict[str, str] = {}
        for gpu in topology.gpus:
            gpu_id = gpu.uuid or f"GPU{gpu.index}"
            reason = self._check(gpu.uuid, gpu.index)
            if reason is not None:
                reasons[gpu_id] = reason
        return reasons

    def _check(self, uuid: str | None, index: int) -> str | None:
        nvml = self._nvml
        assert nvml is not None
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else nvml.nvmlDeviceGetHandleByIndex(index)
            errors = self._optional(nvml.nvmlDeviceGetTotalEccErrors, handle,
                                    nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)
            if errors:
                return f"{errors} uncorrectable ECC error(s) since its last reset"
            remapped = self._optional(nvml.nvmlDeviceGetRemappedRows, handle)
            if remapped is not None and remapped[3]:
                return "row remapping failed: its memory cannot be repaired"
        except nvml.NVMLError as error:
            if error.value in _nvml_gone(nvml):
                raise NvmlUnavailable(f"NVML query failed: {error}") from None
            return f"NVML cannot reach it: {error}"
        return None

    def _optional(self, query, *args):  # type: ignore[no-untyped-def]
        nvml = self._nvml
        assert nvml is not None
        try:
            return query(*args)
        except nvml.NVMLError as error:
            if error.value in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                               nvml.NVML_ERROR_NO_PERMISSION):
                return None
            raise


def _nvml_gone(nvml: ModuleType) -> frozenset[int]:
    """Errors that are about NVML itself, not one GPU."""
    return frozenset({nvml.NVML_ERROR_UNINITIALIZED, nvml.NVML_ERROR_DRIVER_NOT_LOADED,
                      nvml.NVML_ERROR_LIBRARY_NOT_FOUND, nvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH})
