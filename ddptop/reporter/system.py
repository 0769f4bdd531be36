"""Per-rank system pressure: CPU, memory, /dev/shm and (when there is one) the GPU.

NVML is optional in every sense: no library, no driver, or no GPU all end in one
caught ``pynvml.NVMLError`` (or ImportError) and null GPU fields from then on.
The rank's GPU is matched by UUID when torch can tell it, else by local rank through
CUDA_VISIBLE_DEVICES. The reporter never initialises CUDA itself.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any

import psutil

from ddptop.protocol import GpuInfo

log = logging.getLogger(__name__)

SHM_PATH = "/dev/shm"


class SystemSampler:
    """Samples this process and host; owns the NVML handle for the rank's GPU."""

    def __init__(self) -> None:
        self._proc = psutil.Process()
        self._proc.cpu_percent(None)  # prime: the first call always returns 0.0
        self._nvml: Any = None
        self._nvml_failed = False
        self._handle: Any = None
        self._static: GpuInfo | None = None
        self.device_hint: int | str | None = None  # set when DDP tells us the device
        self._mem_total: int | None = None

    def process(self) -> dict[str, Any]:
        """CPU %, RSS and threads of this rank; load, cores and free memory of the host."""
        with self._proc.oneshot():
            cpu = self._proc.cpu_percent(None)
            rss = self._proc.memory_info().rss
            threads = self._proc.num_threads()
        try:
            load = [round(x, 2) for x in os.getloadavg()]
        except OSError:
            load = []
        memory = psutil.virtual_memory()
        self._mem_total = self._mem_total or int(memory.total)
        return {
            "cpu_percent": cpu,
            "rss_bytes": int(rss),
            "threads": int(threads),
            "load_avg": load,
            "cpu_count": os.cpu_count(),
            "mem_available_bytes": int(memory.available),
            "mem_total_bytes": self._mem_total,
        }

    @staticmethod
    def shm() -> tuple[int | None, int | None]:
        """Used and total bytes of /dev/shm (None where there is none)."""
        try:
            usage = shutil.disk_usage(SHM_PATH)
        except OSError:
            return None, None
        return int(usage.used), int(usage.total)

    def gpu(self) -> GpuInfo | None:
        """The rank's GPU, or None without NVML / a GPU (decided once)."""
        if self._nvml_failed:
            return None
        try:
            if self._handle is None:
                self._open()
            return self._sample()
        except Exception as exc:  # pynvml.NVMLError and friends: no GPU here
            log.debug("NVML unavailable: %s", exc)
            self._nvml_failed = True
            return None

    def _open(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        index, handle = _match_device(pynvml, self.device_hint)
        self._handle = handle
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        p2p: dict[str, str] = {}
        for peer in range(pynvml.nvmlDeviceGetCount()):
            if peer == index:
                continue
            try:
                status = pynvml.nvmlDeviceGetP2PStatus(
                    handle, pynvml.nvmlDeviceGetHandleByIndex(peer), pynvml.NVML_P2P_CAPS_INDEX_READ
                )
                p2p[str(peer)] = _P2P_WORDS.get(int(status), f"status {status}")
            except Exception as exc:
                p2p[str(peer)] = f"error: {exc}"
        self._static = GpuInfo(
            index=index,
            uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
            name=_text(pynvml.nvmlDeviceGetName(handle)),
            compute_capability=f"{major}.{minor}",
            driver=_text(pynvml.nvmlSystemGetDriverVersion()),
            p2p=p2p,
        )

    def _sample(self) -> GpuInfo:
        nv, h, base = self._nvml, self._handle, self._static
        assert base is not None
        util = nv.nvmlDeviceGetUtilizationRates(h)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        try:
            power: float | None = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        except Exception:
            power = None
        return GpuInfo(
            index=base.index, uuid=base.uuid, name=base.name,
            compute_capability=base.compute_capability, driver=base.driver, p2p=base.p2p,
            util_percent=float(util.gpu), mem_used_bytes=int(mem.used),
            mem_total_bytes=int(mem.total),
            temperature_c=float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            power_w=power,
        )

    def driver_version(self) -> str | None:
        """NVIDIA driver version, if NVML answered."""
        return self._static.driver if self._static else None


# NVML_P2P_STATUS_* values, as words a person can read in the P2P matrix.
_P2P_WORDS = {0: "OK", 1: "chipset not supported", 2: "GPU not supported",
              3: "IOH topology not supported", 4: "disabled by regkey", 5: "not supported",
              6: "unknown"}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _match_device(nv: Any, hint: int | str | None) -> tuple[int, Any]:
    """Find the NVML handle of this rank's device: by UUID, else by visible index."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    logical = hint if isinstance(hint, int) else int(os.environ.get("LOCAL_RANK", "0") or 0)
    target: str | int = logical
    if isinstance(hint, str) and hint:
        target = hint  # a UUID from torch
    elif visible and logical < len(visible):
        target = visible[logical]
        if target.isdigit():
            target = int(target)
    if isinstance(target, str):
        uuid = target if target.startswith(("GPU-", "MIG-")) else f"GPU-{target}"
        handle = nv.nvmlDeviceGetHandleByUUID(uuid)
        return int(nv.nvmlDeviceGetIndex(handle)), handle
    return target, nv.nvmlDeviceGetHandleByIndex(target)
