"""The `pipeline=` axis: membench's plain loop and torchrec's train pipelines, and what each holds in flight
(read from torchrec 1.8.0's `distributed/train_pipeline/train_pipelines.py`). Torch-free: validation and the
estimator read it; bench.run.pipelines runs them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from workloads.validate import ConfigError

PHASES = ("input", "forward", "backward", "optimizer")


@dataclass(frozen=True)
class PipelineKind:
    name: str
    # torchrec.distributed.train_pipeline.train_pipelines class; None: membench's own loop
    torchrec_class: Optional[str]
    # why it cannot run on CPU ranks (None: it can)
    needs_cuda: Optional[str]
    # what it holds beyond the batch being trained (docs/pipelines.md, CLI help, report)
    holds: str
    # per phase: (whole batches, distributed KJTs) held beyond the batch being trained, at the phase's end. A
    # batch is held from when the pipeline fetches it: membench's batches are drawn on the rank's device (on a
    # GPU by the device-side generator), so there is no later host-to-device copy to wait for
    held_by_phase: Dict[str, Tuple[int, int]]
    # TrainPipelineBase lets go of the batch it trains once its forward is done (the others keep it to the step's
    # end): its ids and lengths are not live in backward
    drops_trained_batch_after_forward: bool = False
    # the trained batch's input all-to-all ran before its forward (in the pipeline, not in the model): the received
    # ids, lengths and per-peer splits stay with the pipeline's context while the forward's lookups use their own
    # (measured: exactly that many bytes more at a forward peak, none at a backward one)
    holds_received_through_forward: bool = False
    # the trained batch's input all-to-all started in its own step (TrainPipelineSparseDistLite): its send copy
    # (made when torchrec permutes the features) and what it received live until the sparse arch has its pooled
    # values, as the input dist's awaitables hold them (measured: those bytes more at a forward peak inside the
    # sparse arch, none at one in the dense part after it)
    holds_input_dist_through_sparse_arch: bool = False
    # keyword arguments its constructor gets beyond model, optimizer and device
    options: Tuple[Tuple[str, object], ...] = ()

    def held(self, phase: str) -> Tuple[int, int]:
        return self.held_by_phase.get(phase, (0, 0))


def _per_phase(input_: Tuple[int, int], forward: Tuple[int, int], backward: Tuple[int, int],
               optimizer: Tuple[int, int]) -> Dict[str, Tuple[int, int]]:
    return dict(zip(PHASES, (input_, forward, backward, optimizer)))


_NONE = _per_phase((0, 0), (0, 0), (0, 0), (0, 0))
# sparse_dist, step i: batches i+1 (fetched last step) and i+2 (enqueued before the forward); the
# splits all-to-all of i+1 starts before the forward, its tensors all-to-all right after it
_SPARSE_DIST = _per_phase((2, 0), (2, 0), (2, 1), (2, 1))
_RECORD_STREAM = ("it calls record_stream on its batches, which CPU tensors do not support; run it on "
                  "hardware with CUDA")

PIPELINES: Dict[str, PipelineKind] = {kind.name: kind for kind in (
    PipelineKind("plain", None, None, "nothing: each step makes its batch, then trains it (membench's loop)",
                 _NONE),
    PipelineKind("base", "TrainPipelineBase", None,
                 "the next batch, fetched before this one's forward; it lets go of the trained batch after "
                 "the forward", _per_phase((1, 0), (1, 0), (1, 0), (1, 0)), drops_trained_batch_after_forward=True),
    PipelineKind("sparse_dist", "TrainPipelineSparseDist", None,
                 "the next two batches, and the next batch's distributed KJT (its input all-to-all runs during "
                 "this step)", _SPARSE_DIST, holds_received_through_forward=True),
    PipelineKind("sparse_dist_lite", "TrainPipelineSparseDistLite", None,
                 "the next batch, fetched after backward; its input all-to-all runs in its own step",
                 _per_phase((0, 0), (0, 0), (0, 0), (1, 0)), holds_input_dist_through_sparse_arch=True),
    # modelled as sparse_dist: the lookups it moves to another stream add no batch
    PipelineKind("fused_sparse_dist", "TrainPipelineFusedSparseDist", _RECORD_STREAM,
                 "as sparse_dist, with the next batch's embedding lookup on its own stream", _SPARSE_DIST,
                 holds_received_through_forward=True),
    PipelineKind("semi_sync", "TrainPipelineSemiSync", _RECORD_STREAM,
                 "as sparse_dist, and the next batch's embedding forward (its lookups, a step early; not "
                 "modelled)", _SPARSE_DIST, holds_received_through_forward=True,
                 # semi-synchronous from the first batch (torchrec's default waits 900 batches: a run would measure
                 # plain sparse_dist steps)
                 options=(("start_batch", 0),)),
)}


def pipeline_kind(name: str) -> PipelineKind:
    return PIPELINES[name]


PLAIN = PIPELINES["plain"]


def validate_pipeline(name: str, backend: str, device_type: str) -> None:
    """ConfigError, in one line, for a pipeline this run cannot use."""
    if name not in PIPELINES:
        raise ConfigError("pipeline.name", name, f"one of {', '.join(PIPELINES)}")
    kind = PIPELINES[name]
    if kind.torchrec_class is None:
        return
    if backend != "torchrec":
        raise ConfigError("pipeline.name", name, "torchrec's train pipelines drive a DistributedModelParallel; use "
                                                 "model=torchrec, or pipeline=plain with model=native")
    if kind.needs_cuda and device_type == "cpu":
        raise ConfigError("pipeline.name", name, f"not on CPU ranks: {kind.needs_cuda} (on CPU: plain, "
                          f"{', '.join(n for n, k in PIPELINES.items() if k.torchrec_class and not k.needs_cuda)})")
