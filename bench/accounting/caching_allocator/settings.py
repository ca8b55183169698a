"""The allocator settings the model honours, parsed from PYTORCH_(CUDA_)ALLOC_CONF text the way
c10/core/AllocatorConfig.cpp (AcceleratorAllocatorConfig::parseArgs, with ConfigTokenizer) does: the text is
cut into tokens at `,` `:` `[` `]` (spaces dropped), then read as `key:value` pairs separated by commas.
Keys torch knows but the model does not use (backend, release_lock_on_cudamalloc, pinned_*, ...) are skipped
with their value; a key torch does not know is refused as torch refuses it ("Unrecognized key"), so a
misspelled option fails before launch instead of being silently ignored by both."""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple, Union

from bench.accounting.caching_allocator.sizes import MIB, ROUNDUP_INTERVALS, SIZE_MAX, kLargeBuffer, kMinLargeAlloc

# roundup_power2_divisions as given: one int for every size, or (interval, divisions) pairs in order, the
# interval a power-of-two size in MiB (as text) or ">" for every interval after the last one named
DivisionsSpec = Union[int, Tuple[Tuple[str, int], ...]]

# max_split_size_mb and max_non_split_rounding_mb must be >= the large segment size in MiB (20 unless
# large_segment_size_mb is set; c10/core/AllocatorConfig.cpp; the older CUDAAllocatorConfig.cpp asked > 20):
# checked in AllocatorSettings.__post_init__
# large_segment_size_mb must exceed kMinLargeAlloc (10 MiB): the requests it serves are those under 10 MiB
MIN_LARGE_SEGMENT_MB = kMinLargeAlloc // MIB

# every key torch 2.13 accepts: AcceleratorAllocatorConfig::getMutableKeys plus the keys
# CUDAAllocatorConfig::getKeys registers with its parser hook (torch refuses any other one)
TORCH_KEYS = frozenset({
    "large_segment_size_mb", "max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
    "roundup_power2_divisions", "expandable_segments", "pinned_use_background_threads",
    "backend", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register", "release_lock_on_hipmalloc",
    "pinned_use_hip_host_register", "graph_capture_record_stream_reuse", "pinned_reserve_segment_size_mb",
    "pinned_num_register_threads", "per_process_memory_fraction", "pinned_free_catch_all",
    "throw_on_cudamalloc_oom"})


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _tokens(conf: str) -> List[str]:
    """ConfigTokenizer / lexArgs: separators are tokens of their own, other characters but spaces form words."""
    tokens, word = [], []
    for char in conf:
        if char in ",:[]":
            if word:
                tokens.append("".join(word))
                word = []
            tokens.append(char)
        elif char != " ":
            word.append(char)
    if word:
        tokens.append("".join(word))
    return tokens


def _expect(tokens: List[str], index: int, token: str) -> None:
    if index >= len(tokens) or tokens[index] != token:
        raise ValueError(f"Error parsing CachingAllocator settings, expected {token!r} at token {index} of {tokens}")


def _value(tokens: List[str], index: int, key: str) -> str:
    if index >= len(tokens):
        raise ValueError(f"Error, expecting {key} value")
    return tokens[index]


def _parse_divisions(tokens: List[str], index: int) -> Tuple[DivisionsSpec, int]:
    """parseRoundUpPower2Divisions: `N` or `[interval:N,...,>:N]`; returns the spec and the last token read."""
    if _value(tokens, index, "roundup_power2_divisions") != "[":
        return int(tokens[index]), index
    pairs = []
    index += 1
    while index < len(tokens) and tokens[index] != "]":
        interval = tokens[index]
        _expect(tokens, index + 1, ":")
        pairs.append((interval, int(_value(tokens, index + 2, "roundup_power2_divisions"))))
        index += 3
        if index < len(tokens) and tokens[index] != "]":
            _expect(tokens, index, ",")
            index += 1
    if index >= len(tokens):
        raise ValueError("Expected closing bracket ']' in roundup_power2_divisions")
    return tuple(pairs), index


def _skip_value(tokens: List[str], index: int) -> int:
    """ConfigTokenizer::skipKey: past `:` and the value, a bracketed list included; returns its last token."""
    _expect(tokens, index, ":")
    index += 1
    if index < len(tokens) and tokens[index] == "[":
        while index < len(tokens) and tokens[index] != "]":
            index += 1
    return index


def _parse_bool(text: str, key: str) -> bool:
    if text not in ("True", "False"):
        raise ValueError(f"Expected a single True/False argument for {key}")
    return text == "True"


def _division_table(spec: DivisionsSpec) -> Tuple[int, ...]:
    """The 16-entry table parseRoundUpPower2Divisions fills in. A list sets every interval before its first
    named one to that one's divisions; `>` sets every interval after the last one named (from last + 1, as
    c10/core/AllocatorConfig.cpp does; the older c10/cuda/CUDAAllocatorConfig.cpp started at the last one)."""
    if isinstance(spec, int):
        return (spec,) * ROUNDUP_INTERVALS
    table = [0] * ROUNDUP_INTERVALS
    first_value, last_index = True, 0
    for interval, divisions in spec:
        if interval == ">":
            for index in range(last_index + 1, ROUNDUP_INTERVALS):
                table[index] = divisions
            continue
        index = min(max(int(interval).bit_length() - 1, 0), ROUNDUP_INTERVALS - 1)
        if first_value:
            table[:index] = [divisions] * index
            first_value = False
        table[index] = divisions
        last_index = index
    return tuple(table)


def _normalise_divisions(spec) -> Optional[DivisionsSpec]:
    if spec is None or isinstance(spec, int):
        return spec
    items = spec.items() if isinstance(spec, Mapping) else spec
    return tuple((str(interval), int(divisions)) for interval, divisions in items)


def _check_divisions(spec: DivisionsSpec) -> None:
    """The TORCH_CHECKs of parseRoundUpPower2Divisions."""
    if isinstance(spec, int):
        if not _is_power_of_two(spec):
            raise ValueError("For roundups, the divisions has to be power of 2")
        return
    for interval, divisions in spec:
        if divisions != 0 and not _is_power_of_two(divisions):
            raise ValueError("For roundups, the divisions has to be power of 2 or 0 to disable roundup")
        if interval != ">" and not _is_power_of_two(int(interval)):
            raise ValueError("For roundups, the intervals have to be power of 2")


@dataclass(frozen=True)
class AllocatorSettings:
    """The PYTORCH_CUDA_ALLOC_CONF options that change what the caching allocator does (None: torch's
    default). `per_process_memory_fraction` (a newer torch's option, like
    torch.cuda.set_per_process_memory_fraction) caps reserved memory at that fraction of the model's capacity
    and is what arms `garbage_collection_threshold` (the source collects only under an allowed maximum)."""
    expandable_segments: bool = False
    max_split_size_mb: Optional[int] = None
    garbage_collection_threshold: Optional[float] = None  # in (0, 1)
    roundup_power2_divisions: Optional[DivisionsSpec] = None
    max_non_split_rounding_mb: Optional[int] = None
    per_process_memory_fraction: Optional[float] = None  # in [0, 1]
    large_segment_size_mb: Optional[int] = None  # > 10; the segment of a 1-10 MiB request (20 MiB default)

    def __post_init__(self) -> None:
        # normalised so a dict or list given here hashes and compares like the parsed form
        object.__setattr__(self, "roundup_power2_divisions", _normalise_divisions(self.roundup_power2_divisions))
        segment_mb = self.large_segment_size_mb
        if segment_mb is not None and segment_mb <= MIN_LARGE_SEGMENT_MB:
            raise ValueError(f"CachingAllocator option large_segment_size_mb must be > {MIN_LARGE_SEGMENT_MB} MB")
        min_split_mb = self.large_segment_size // MIB
        for name in ("max_split_size_mb", "max_non_split_rounding_mb"):
            value = getattr(self, name)
            if value is not None and value < min_split_mb:
                raise ValueError(f"CachingAllocator option {name} too small, must be >= {min_split_mb}")
        threshold = self.garbage_collection_threshold
        if threshold is not None and not 0.0 < threshold < 1.0:
            raise ValueError("garbage_collect_threshold is invalid, set it in (0.0, 1.0)")
        fraction = self.per_process_memory_fraction
        if fraction is not None and not 0.0 <= fraction <= 1.0:
            raise ValueError("per_process_memory_fraction is invalid, set it in [0.0, 1.0]")
        if self.roundup_power2_divisions is not None:
            _check_divisions(self.roundup_power2_divisions)

    @classmethod
    def parse(cls, conf: Optional[str]) -> "AllocatorSettings":
        """The settings of PYTORCH_CUDA_ALLOC_CONF text ("expandable_segments:True,max_split_size_mb:128")."""
        tokens, fields, index = _tokens(conf or ""), {}, 0
        while index < len(tokens):
            key = tokens[index]
            if key == "roundup_power2_divisions":
                _expect(tokens, index + 1, ":")
                fields[key], index = _parse_divisions(tokens, index + 2)
            elif key in _FIELD_PARSERS:
                _expect(tokens, index + 1, ":")
                index += 2
                fields[key] = _FIELD_PARSERS[key](_value(tokens, index, key), key)
            elif key in TORCH_KEYS:
                index = _skip_value(tokens, index + 1)
                if key in _CHECKED_BOOLEANS:  # values torch parses with toBool, checked though not modelled
                    _parse_bool(tokens[index], key)
            else:
                raise ValueError(_unrecognized(key))
            if index + 1 < len(tokens):
                _expect(tokens, index + 1, ",")
                index += 1
            index += 1
        return cls(**fields)

    @property
    def max_split_size(self) -> int:
        """Bytes: blocks this large are "oversize", never split (SIZE_MAX when unset)."""
        if self.max_split_size_mb is None:
            return SIZE_MAX
        return min(self.max_split_size_mb, SIZE_MAX // MIB) * MIB

    @property
    def large_segment_size(self) -> int:
        """Bytes of the segment a request between 1 and 10 MiB gets (get_allocation_size; kLargeBuffer
        unless large_segment_size_mb is set). Expandable segments keep kLargeBuffer pages whatever it is."""
        if self.large_segment_size_mb is None:
            return kLargeBuffer
        return min(self.large_segment_size_mb, SIZE_MAX // MIB) * MIB

    @property
    def max_non_split_rounding_size(self) -> int:
        """Bytes an oversize cached block may exceed a request by and still serve it (the large segment
        size unless set: parseArgs resets it to large_segment_size after reading that key)."""
        if self.max_non_split_rounding_mb is None:
            return self.large_segment_size
        return min(self.max_non_split_rounding_mb, SIZE_MAX // MIB) * MIB

    @property
    def division_table(self) -> Tuple[int, ...]:
        """Divisions for each of the 16 power-of-two size intervals from 1 MiB up (sizes below 1 MiB use the
        first); () when roundup_power2_divisions is unset."""
        spec = self.roundup_power2_divisions
        return () if spec is None else _division_table(spec)

    def allowed_bytes(self, capacity_bytes: int) -> Optional[int]:
        """torch's allowed_memory_maximum under per_process_memory_fraction: set only below 1.0 (as the newer
        setMemoryFraction does), None when the fraction is unset."""
        fraction = self.per_process_memory_fraction
        if fraction is None or fraction >= 1.0:
            return None
        return int(fraction * capacity_bytes)


def _unrecognized(key: str) -> str:
    close = difflib.get_close_matches(key, sorted(TORCH_KEYS), n=1)
    hint = f"did you mean '{close[0]}'?" if close else "torch 2.13 refuses it too"
    return f"Unrecognized key '{key}' in Accelerator allocator config: {hint}"


def _int_option(text: str, key: str) -> int:
    return int(text)  # stoi / toSizeT; the range checks run in __post_init__


def _float_option(text: str, key: str) -> float:
    value = float(text)
    if math.isnan(value):
        raise ValueError(f"{key} is not a number")
    return value


# throw_on_cudamalloc_oom makes torch throw before a cudaMalloc that would fail: the model's statistics are
# those of the failing cudaMalloc path either way, so it is checked (True/False) and not modelled
_CHECKED_BOOLEANS = frozenset({"throw_on_cudamalloc_oom", "pinned_use_background_threads"})

_FIELD_PARSERS = {
    "max_split_size_mb": _int_option,
    "max_non_split_rounding_mb": _int_option,
    "large_segment_size_mb": _int_option,
    "garbage_collection_threshold": _float_option,
    "per_process_memory_fraction": _float_option,
    "expandable_segments": _parse_bool,
}


def division_table_of(settings: AllocatorSettings) -> Sequence[int]:
    """The table round_size reads; () when no rounding beyond 512 bytes is configured (the fast path)."""
    table = settings.division_table
    return table if any(divisions > 1 for divisions in table) else ()
