"""What a CUDA run runs with: the caching allocator's configuration and the CUDA, NCCL and driver versions.

Read in the launching process (the ranks inherit its environment) without creating a CUDA context there.
The allocator settings change reserved memory and fragmentation, so a result is only comparable with
another made under the same ones; `backend:cudaMallocAsync` hands allocation to the driver, whose pool
the caching allocator's statistics (all membench's CUDA numbers) do not see, so such a run is refused.
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, Mapping, Optional

# torch reads PYTORCH_ALLOC_CONF, and the older PYTORCH_CUDA_ALLOC_CONF
ALLOC_CONF_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
ASYNC_BACKEND = "cudaMallocAsync"
# one option: key:value, where a value may be a bracketed list with commas (roundup_power2_divisions)
_OPTION = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(\[[^\]]*\]|[^,]*)\s*(?:,|$)")


def parse_allocator_config(text: str) -> Dict[str, Any]:
    """The settings of an allocator config string ("expandable_segments:True,max_split_size_mb:128,..."),
    with torch's defaults for those not given."""
    options = {key: value.strip() for key, value in _OPTION.findall(text or "") if key}
    return {
        "backend": options.get("backend", "native"),
        "expandable_segments": options.get("expandable_segments", "False").lower() == "true",
        "max_split_size_mb": int(options["max_split_size_mb"]) if "max_split_size_mb" in options else None,
        "garbage_collection_threshold": (float(options["garbage_collection_threshold"])
                                         if "garbage_collection_threshold" in options else None),
        "roundup_power2_divisions": options.get("roundup_power2_divisions"),
        "options": options,
    }


def allocator_config(environ: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """The allocator configuration the ranks will run with, and the variable it came from (None: defaults)."""
    environ = os.environ if environ is None else environ
    source = next((name for name in ALLOC_CONF_VARIABLES if environ.get(name)), None)
    return {**parse_allocator_config(environ.get(source, "") if source else ""), "source": source,
            "raw": environ.get(source, "") if source else ""}


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
