"""Byte units: the one definition every module uses. "GiB" is 1024**3 bytes, "TB" 10**12 bytes."""
KIB = 1024
MIB = 1024**2
GIB = 1024**3
TB = 10**12
# a capacity no allocation reaches: where memory is predicted or modelled, not refused
UNBOUNDED_BYTES = 1 << 62
