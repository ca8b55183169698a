"""`membench reservation RUN`: what a finished run measured outside its tables, in the form torchrec's planner
takes (a storage reservation), so the next plan of that model starts from measurement.

    membench reservation results/runs/<run>           # writes <run>/torchrec_reservation.json
    membench plan plan.planner=torchrec plan.reservation_file=results/runs/<run>/torchrec_reservation.json

Per rank (the largest over the run's ranks): the static base (dense parameters, DDP's gradient buckets, the
dense optimizer: torchrec's `model_base_bytes`), the activation term per sample of the per-rank batch
(activations, communication buffers, pipelined batches) and the runtime overhead (allocator overhead,
non-torch memory, the rest). In Python: `MeasuredStorageReservation.from_file(path)` from
bench.planning.torchrec_measured, passed as `storage_reservation=` to torchrec's EmbeddingShardingPlanner
(docs/torchrec-planner.md, "Measured terms"). Exit status: 0 written, 2 not a finished run or bad arguments.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from bench.planning.measured_terms import RESERVATION_FILE, MeasuredTerms, terms_of_run
from bench.results.schema import EXIT_INVALID, EXIT_OK
from bench.results.store import ResultsError

PROG = "membench reservation"


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run directory (summary.json and config.yaml) of status ok")
    parser.add_argument("--out", type=Path, default=None, help=f"the file to write (default <run>/{RESERVATION_FILE})")
    return parser


def describe(terms: MeasuredTerms) -> List[str]:
    batch = terms.batch_size
    return [f"measured on {terms.world_size} {terms.device_type} ranks of {terms.workload} (run {terms.run_id}), "
            f"per-rank batch {batch}:",
            f"  static base       {terms.static_base_bytes:>16,} B  (dense params, grads, optimizer)",
            f"  activation term   {terms.activation_bytes_per_sample:>16,.1f} B per sample "
            f"({terms.activation_bytes:,} B at batch {batch})",
            f"  runtime overhead  {terms.runtime_overhead_bytes:>16,} B  (allocator, non-torch, other)",
            f"  reserved per rank {terms.reserved_bytes(batch):>16,} B  (tables, not reserved: "
            f"{terms.table_bytes:,} B on the highest rank)"]


def main(argv: Optional[List[str]] = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        terms = terms_of_run(args.run)
        path = terms.write(args.out if args.out is not None else args.run / RESERVATION_FILE)
    except ResultsError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return EXIT_INVALID
    except OSError as err:
        print(f"{PROG}: cannot write {args.out} ({err.strerror or err})", file=sys.stderr)
        return EXIT_INVALID
    print("\n".join(describe(terms)))
    print(f"wrote {path}: plan with plan.planner=torchrec plan.reservation_file={path}")
    return EXIT_OK
