"""Versions of what produced a result, for summaries and baselines."""
from __future__ import annotations

import platform
from importlib import metadata
from typing import Dict

PACKAGES = ("torch", "torchrec", "fbgemm-gpu", "fbgemm-gpu-cpu", "membench")


def environment_versions() -> Dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return versions
