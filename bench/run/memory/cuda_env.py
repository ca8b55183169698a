"""What a CUDA run runs with beyond its config: the CUDA, NCCL and driver versions, read in the launching
process without creating a CUDA context there."""
from __future__ import annotations

from typing import Any, Dict


def cuda_versions(nvml: Any = None) -> Dict[str, str]:
    """CUDA (torch's build), NCCL and NVIDIA driver versions; a part that cannot be read is left out."""
    import torch

    versions: Dict[str, str] = {}
    if torch.version.cuda:
        versions["cuda"] = str(torch.version.cuda)
    try:
        nccl = torch.cuda.nccl.version()
        versions["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception:  # a build without NCCL
        pass
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
        try:
            driver = nvml.nvmlSystemGetDriverVersion()
            versions["nvidia_driver"] = driver.decode() if isinstance(driver, bytes) else str(driver)
        finally:
            nvml.nvmlShutdown()
    except Exception:  # no driver library here
        pass
    return versions
