"""The CUDA caching allocator's configuration a run uses: PYTORCH_(CUDA_)ALLOC_CONF, with the run's
`allocator.*` settings over it. The allocator settings change reserved memory and fragmentation, so a result
is only comparable with another made under the same ones; `backend:cudaMallocAsync` hands allocation to the
driver, whose pool the caching allocator's statistics (all membench's CUDA numbers) do not see."""
from __future__ import annotations

import os
import re
from typing import Any, Dict, Mapping, Optional, Tuple

# the variables torch 2.13's CUDA allocator reads, first set one wins: CUDAAllocatorConfig::instance (and
# AcceleratorAllocatorConfig::instance) take the older PYTORCH_CUDA_ALLOC_CONF over PYTORCH_ALLOC_CONF, and a
# variable set to the empty string counts as set (c10::utils::get_env has a value)
ALLOC_CONF_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
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


# the run's allocator.* settings, by their PYTORCH_CUDA_ALLOC_CONF option names
ALLOCATOR_OPTIONS = ("expandable_segments", "max_split_size_mb", "garbage_collection_threshold",
                     "roundup_power2_divisions", "large_segment_size_mb")


def _environment_conf(environ: Mapping[str, str]) -> Tuple[Optional[str], str]:
    source = next((name for name in ALLOC_CONF_VARIABLES if name in environ), None)
    return source, (environ.get(source, "") if source else "")


def allocator_conf_text(settings: Any = None, environ: Optional[Mapping[str, str]] = None) -> str:
    """The allocator configuration the ranks run with, as PYTORCH_CUDA_ALLOC_CONF text: the environment's
    options, with the run's `allocator.*` settings (those not null) over them."""
    environ = os.environ if environ is None else environ
    options = {key: value.strip() for key, value in _OPTION.findall(_environment_conf(environ)[1]) if key}
    for name in ALLOCATOR_OPTIONS:
        value = getattr(settings, name, None) if settings is not None else None
        if value is not None:
            options[name] = str(value) if not isinstance(value, bool) else ("True" if value else "False")
    return ",".join(f"{key}:{value}" for key, value in options.items())


def allocator_config(environ: Optional[Mapping[str, str]] = None, settings: Any = None) -> Dict[str, Any]:
    """The allocator configuration the ranks will run with, and where it came from (None: torch's defaults)."""
    environ = os.environ if environ is None else environ
    source, _ = _environment_conf(environ)
    if settings is not None and any(getattr(settings, name, None) is not None for name in ALLOCATOR_OPTIONS):
        source = f"{source} + allocator.*" if source else "allocator.*"
    text = allocator_conf_text(settings, environ)
    return {**parse_allocator_config(text), "source": source, "raw": text}


def allocator_settings_for(allocator_section: Any, device_type: str, environ: Optional[Mapping[str, str]] = None):
    """The settings of the (real or modelled) CUDA caching allocator a run of `device_type` has; None where
    memory is not a caching allocator's (CPU)."""
    from bench.accounting.caching_allocator import AllocatorSettings
    from bench.results.schema import has_cuda_allocator

    if not has_cuda_allocator(device_type):
        return None
    return AllocatorSettings.parse(allocator_conf_text(allocator_section, environ))
