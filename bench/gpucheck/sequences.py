"""The hand-derived allocator sequences (bench/accounting/caching_allocator/sequences.py) on the GPU: each
run through torch.cuda's caching allocator in a child process of its own (a fresh allocator: nothing else
has reserved memory, and settings torch reads once apply), its statistics compared exactly with the
hand-derived ones. Simulated, the model runs them (the same check the test suite makes).

    python -m bench.gpucheck.sequences --json OUT.json   # the child: every sequence, statistics as JSON"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, Optional

from bench.accounting.caching_allocator.sequences import SEQUENCES, AllocatorSequence, run_on_model, run_ops
from bench.gpucheck.log import CheckLog, one_line
from bench.gpucheck.verdicts import sequence_matches

CHILD_TIMEOUT_S = 120
# a kernel of about 0.1-0.3 s on any current GPU, to keep a stream busy while the next malloc looks
BUSY_CYCLES = 500_000_000
# what parseArgs does not reset by itself, set before each sequence so that none inherits another's
BASE_CONF = "expandable_segments:False"


def set_allocator_settings(conf: str) -> None:
    """Sole caller of torch.cuda.memory._set_allocator_settings (private): parseArgs on a live allocator."""
    import torch

    torch.cuda.memory._set_allocator_settings(conf)


def sleep_on_current_stream(cycles: int) -> None:
    """Sole caller of torch.cuda._sleep (private): a kernel that spins for `cycles` clock cycles."""
    import torch

    torch.cuda._sleep(cycles)


class TorchCudaAllocator:
    """torch.cuda's caching allocator on device 0 behind the model's method names, for run_ops: each
    allocation a uint8 tensor held by key, streams made on first use (0: the current stream)."""

    def __init__(self):
        import torch

        self.torch = torch
        self.tensors: Dict = {}
        self.streams = {0: torch.cuda.current_stream(0)}

    def _stream(self, index: int):
        return self.streams.setdefault(index, self.torch.cuda.Stream(0))

    def malloc(self, nbytes: int, key, stream: int = 0) -> None:
        with self.torch.cuda.stream(self._stream(stream)):
            self.tensors[key] = self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda:0")

    def free(self, key) -> None:
        del self.tensors[key]

    def record_stream(self, key, stream: int) -> None:
        self.tensors[key].record_stream(self._stream(stream))

    def stream_busy(self, stream: int) -> None:
        with self.torch.cuda.stream(self._stream(stream)):
            sleep_on_current_stream(BUSY_CYCLES)

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def empty_cache(self) -> None:
        self.torch.cuda.empty_cache()


def run_on_cuda(sequence: AllocatorSequence) -> Dict[str, int]:
    """The sequence through torch.cuda, from an emptied allocator with zeroed statistics."""
    import torch

    set_allocator_settings(",".join(part for part in (BASE_CONF, sequence.conf) if part))
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = 1.0 if sequence.allowed_mib is None else (sequence.allowed_mib << 20) / total
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(0)
    torch.cuda.reset_accumulated_memory_stats(0)
    allocator = TorchCudaAllocator()
    try:
        run_ops(allocator, sequence.ops, torch.OutOfMemoryError)
        stats = torch.cuda.memory_stats(0)
        return {key: int(stats.get(key, 0)) for key in sequence.expected}
    finally:
        allocator.tensors.clear()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0, 0)


def run_all_on_cuda() -> Dict[str, dict]:
    """Every sequence: {"stats": ...} or {"error": one line} (torch refusing a setting it does not know)."""
    outcome = {}
    for sequence in SEQUENCES:
        try:
            outcome[sequence.name] = {"stats": run_on_cuda(sequence)}
        except Exception as err:  # noqa: BLE001 (one sequence's error is its line; the others run)
            outcome[sequence.name] = {"error": one_line(err)}
    return outcome


def cuda_outcomes(out_dir: Path) -> Dict[str, dict]:
    """The child process's outcomes (a fresh CUDA allocator), kept as out_dir/allocator_sequences.json."""
    path = out_dir / "allocator_sequences.json"
    subprocess.run([sys.executable, "-m", "bench.gpucheck.sequences", "--json", str(path)], check=True,
                   timeout=CHILD_TIMEOUT_S, stdout=subprocess.DEVNULL)
    return json.loads(path.read_text())


def model_outcomes() -> Dict[str, dict]:
    return {sequence.name: {"stats": run_on_model(sequence)} for sequence in SEQUENCES}


def allocator_sequences(simulated: bool, out_dir: Path, log: CheckLog,
                        outcomes: Optional[Callable[[], Dict[str, dict]]] = None) -> None:
    """One line per sequence: the real (or, simulated, the modelled) statistics against the hand-derived."""
    source = "model" if simulated else "torch.cuda"
    results = (outcomes or (model_outcomes if simulated else lambda: cuda_outcomes(out_dir)))()
    for sequence in SEQUENCES:
        name = f"allocator sequence: {sequence.name}"
        outcome = results.get(sequence.name, {"error": "not run"})
        if "error" not in outcome:
            log.verdict(name, sequence_matches(sequence.expected, outcome["stats"], source))
        elif "Unrecognized key" in outcome["error"]:  # an older torch without the setting it needs
            log.skip(name, outcome["error"])
        else:
            log.check(name, False, outcome["error"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    args.json.write_text(json.dumps(run_all_on_cuda(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
