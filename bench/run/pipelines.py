"""Training loops (`pipeline=`): membench's plain loop, or one of torchrec's train pipelines driving the model.

A pipeline holds batches beyond the one it trains: fetched ahead (and on CUDA copied to the device), and for
the sparse-dist family the next batch's input all-to-all started a step early. Those are the breakdown's
`inputs_in_flight`. What each pipeline holds, per phase, is written down in workloads.pipelines.PIPELINES,
and the estimator models the same counts.

The pipeline's `progress()` runs a whole step; the phases the plain loop marks with `recorder.phase` are marked
here from inside it: the model's forward pre-hook starts `forward` (and settles the batch it trains), its
forward hook starts `backward`, the optimizer's `step` starts `optimizer`.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterator, List

import torch

from bench.run.config import SETUP_STEPS
from bench.run.memory.recorder import MemoryRecorder, in_flight_category, unique_storage_bytes
from workloads.pipelines import PipelineKind


def batch_tensors(batch) -> List[torch.Tensor]:
    """The tensors of a torchrec `datasets.utils.Batch` (none computed on the way: offsets only when made)."""
    sparse = batch.sparse_features
    found = [batch.dense_features, batch.labels, sparse.values(), sparse.lengths_or_none(),
             sparse.offsets_or_none(), sparse.weights_or_none()]
    return [tensor for tensor in found if tensor is not None]


class PhaseCursor:
    """The open `recorder.phase` of a step whose phases begin inside a call membench does not drive."""

    def __init__(self, recorder: MemoryRecorder):
        self.recorder = recorder
        self._open = None

    def enter(self, step: int, name: str) -> None:
        self.close()
        scope = self.recorder.phase(step, name)
        scope.__enter__()
        self._open = scope

    def close(self) -> None:
        scope, self._open = self._open, None
        if scope is not None:
            scope.__exit__(None, None, None)


class PhasedOptimizer:
    """The optimizer handed to the pipeline: its `step` starts the optimizer phase and charges what it makes to
    `category`, as the plain loop does."""

    def __init__(self, optimizer, category: str, on_step: Callable[[], None], recorder: MemoryRecorder):
        self.optimizer, self.category, self.on_step, self.recorder = optimizer, category, on_step, recorder

    @property
    def param_groups(self):  # read by TrainPipelineSemiSync
        return self.optimizer.param_groups

    def zero_grad(self, *args, **kwargs) -> None:
        self.optimizer.zero_grad(*args, **kwargs)

    def step(self, closure=None):
        self.on_step()
        with self.recorder.category(self.category):
            return self.optimizer.step(closure)


class PipelinedTraining:
    """Trains `total_steps` steps through torchrec's pipeline `kind` (the torchrec backend's model)."""

    def __init__(self, kind: PipelineKind, backend, batches, recorder: MemoryRecorder, log: Callable[[str], None]):
        self.kind, self.backend, self.batches, self.recorder, self.log = kind, backend, batches, recorder, log
        self.cursor = PhaseCursor(recorder)
        self.step = 0
        # step -> the tensors of that batch while it is held ahead of its turn (for a GPU's probe)
        self._held: Dict[int, List[torch.Tensor]] = {}
        if hasattr(recorder, "in_flight_probe"):
            recorder.in_flight_probe = lambda: unique_storage_bytes(
                t for tensors in self._held.values() for t in tensors if t.device == backend.device)

    def _stream(self) -> Iterator:
        """Batches in step order, each made and held as in flight until its forward starts."""
        step = 0
        while True:
            with self.recorder.category(in_flight_category(step, "made"), pinned=True):
                batch = self.backend.prepare(self.batches.batch(step))
            tensors = batch_tensors(batch)
            self.recorder.hold_in_flight(step, tensors)
            self._held[step] = tensors
            yield batch
            step += 1

    def _pipeline(self):
        from torchrec.distributed.train_pipeline import train_pipelines

        cls = getattr(train_pipelines, self.kind.torchrec_class)
        # only the dense optimizer: the embedding one is fused into backward (fbgemm), as in the plain loop
        category, dense_optimizer = self.backend.optimizers[0]
        optimizer = PhasedOptimizer(dense_optimizer, category, lambda: self.cursor.enter(self.step, "optimizer"),
                                    self.recorder)
        pipeline = cls(model=self.backend.model, optimizer=optimizer, device=self.backend.device,
                       **dict(self.kind.options))
        for name in ("start_sparse_data_dist", "wait_sparse_data_dist"):
            if hasattr(pipeline, name):
                setattr(pipeline, name, self._dist_in_flight(getattr(pipeline, name)))
        return pipeline

    def _dist_in_flight(self, dist: Callable) -> Callable:
        """A batch's input all-to-all, run ahead of its forward: in flight until then (its context's index is
        its step: the pipeline numbers contexts as it enqueues batches, from 0)."""
        def run(*args):
            context = args[-1]
            with self.recorder.category(in_flight_category(context.index, "dist"), pinned=True):
                return dist(*args)
        return run

    def _forward_starts(self, module, args) -> None:
        self.cursor.enter(self.step, "forward")
        self._held.pop(self.step, None)
        self.recorder.settle_in_flight(self.step)

    def _forward_ends(self, module, args, output) -> None:
        self.cursor.enter(self.step, "backward")

    def run(self, total_steps: int) -> None:
        model = self.backend.model
        hooks = [model.register_forward_pre_hook(self._forward_starts),
                 model.register_forward_hook(self._forward_ends)]
        pipeline = self._pipeline()
        stream = self._stream()
        try:
            for step in range(total_steps):
                self.step = step
                self.cursor.enter(step, "input")
                pipeline.progress(stream)
                after_step(self.backend, self.recorder, step, self.log)
                self.cursor.close()
                self.log(f"step {step + 1}/{total_steps} done")
        finally:
            for hook in hooks:
                hook.remove()


def after_step(backend, recorder: MemoryRecorder, step: int, log: Callable[[str], None]) -> None:
    """The end of a step's optimizer phase, in either loop."""
    if step < SETUP_STEPS:
        # what the setup steps build gets its owner: grads, optimizer state and lazily built modules
        # (step 1), DDP's rebuilt gradient buckets (steps 2-3; else they would count as activations)
        recorder.attribute(backend.ownership())
    if step == 0:
        backend.after_first_step(recorder, log)
