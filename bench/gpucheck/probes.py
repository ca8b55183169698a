"""The real CUDA and NVML APIs membench relies on, asked directly on a GPU: do they answer as the fakes the
CPU tests use say they do (keys, struct fields, index mapping, allocator backend)?"""
from __future__ import annotations

import os

import torch

from bench.gpucheck.log import CheckLog
from bench.accounting.allocator_config import allocator_config
from bench.run.memory.cuda_stats import MEMORY_STATS_KEYS as STATS_KEYS
from bench.run.memory.nvml import nvml_device_index
from workloads.units import MIB


def _uuid(text) -> str:
    return str(text).lower().removeprefix("gpu-")


def _allocator_probes(device: torch.device, log: CheckLog) -> None:
    block = torch.empty(64 * MIB, dtype=torch.uint8, device=device)
    stats = torch.cuda.memory_stats(device)
    missing = [key for key in STATS_KEYS.values() if key not in stats]
    log.check("memory_stats keys", not missing, f"missing {missing}" if missing else f"{len(STATS_KEYS)} keys read")
    del block
    torch.cuda.reset_peak_memory_stats(device)
    stats = torch.cuda.memory_stats(device)
    log.check("peak reset", stats["allocated_bytes.all.peak"] == stats["allocated_bytes.all.current"],
              f"peak {stats['allocated_bytes.all.peak']} B == current {stats['allocated_bytes.all.current']} B")
    backend, config = torch.cuda.get_allocator_backend(), allocator_config()
    log.check("allocator backend", backend == config["backend"],
              f"torch {backend}, PYTORCH_(CUDA_)ALLOC_CONF says {config['backend']} ({config['raw'] or 'unset'})")


def _nvml_probes(log: CheckLog) -> None:
    import pynvml

    pynvml.nvmlInit()
    try:
        for index in range(torch.cuda.device_count()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_device_index(index))
            nvml_uuid, torch_uuid = pynvml.nvmlDeviceGetUUID(handle), torch.cuda.get_device_properties(index).uuid
            log.check(f"NVML index of cuda:{index}", _uuid(nvml_uuid) == _uuid(torch_uuid),
                      f"NVML {nvml_device_index(index)} {nvml_uuid} vs torch {torch_uuid} "
                      f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
        handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_device_index(0))
        try:
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            log.check("NVML v2 memory", memory.total > 0, f"used {memory.used / MIB:.0f} MiB, driver reserved "
                                                          f"{memory.reserved / MIB:.0f} MiB")
        except pynvml.NVMLError as err:
            log.skip("NVML v2 memory", f"{err}: the v1 struct is used (its `used` includes driver-reserved memory)")
        mine = [p for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == os.getpid()]
        if mine and mine[0].usedGpuMemory is not None:
            log.check("NVML per-process memory", mine[0].usedGpuMemory > 0,
                      f"this process {mine[0].usedGpuMemory / MIB:.0f} MiB")
        else:
            log.skip("NVML per-process memory", "this process is not in NVML's list (PID namespace?): the device's "
                                                "used memory stands in")
    finally:
        pynvml.nvmlShutdown()


def api_probes(device: torch.device, log: CheckLog) -> None:
    from bench.gpucheck.data_rate import data_rate_probe

    _allocator_probes(device, log)
    data_rate_probe(device, log)
    try:
        _nvml_probes(log)
    except Exception as err:  # no NVML library or driver call: the recorder's NVML columns stay empty
        log.check("NVML", False, f"{type(err).__name__}: {err}")
