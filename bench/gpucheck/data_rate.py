"""The device-side batch generator (workloads.device_data) on the GPU: samples/s at MLPerf DLRM-DCNv2 shapes
(26 tables, 214 ids per sample, batch 4096, Zipf ids), target >= 2,000,000 samples/s."""
from __future__ import annotations

import torch

from bench.gpucheck.log import CheckLog

TARGET_SAMPLES_PER_S = 2_000_000


def device_generator_rate(device: torch.device, batches: int = 20) -> float:
    """The benchmark's measurement (bench.perf.batch_rate) at its MLPerf shape."""
    from bench.perf import batch_rate
    from workloads.spec import build_spec

    spec = build_spec(batch_rate.shapes(quick=False)[1])  # mlperf_dcnv2_like at batch 4096
    return batch_rate.device_generator_rate(spec, device, batches, warmup=3)


def data_rate_probe(device: torch.device, log: CheckLog) -> None:
    name = "device batch generator rate"
    if device.type != "cuda" or not torch.cuda.is_available():
        log.skip(name, "no CUDA device: the device generator's rate is measured on a GPU only")
        return
    try:
        rate = device_generator_rate(device)
    except Exception as err:  # a failing kernel is a FAIL line, not an aborted check
        log.check(name, False, f"{type(err).__name__}: {err}")
        return
    finally:  # leave the allocator's cache as the later checks expect it
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    log.check(name, rate >= TARGET_SAMPLES_PER_S,
              f"{rate:,.0f} samples/s at MLPerf DLRM-DCNv2 shapes (26 tables, 214 ids/sample, batch 4096, Zipf) on "
              f"{torch.cuda.get_device_name(device)}; target >= {TARGET_SAMPLES_PER_S:,}")
