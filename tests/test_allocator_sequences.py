"""The caching allocator model against hand-derived statistics (bench/accounting/caching_allocator/
sequences.py, the same sequences gpu_check runs through torch.cuda), streams and record_stream, and the
allocator configuration details torch 2.13 has: large_segment_size_mb, unknown keys refused, which of
PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF wins."""
from __future__ import annotations

import pytest

from bench.accounting.allocator_config import allocator_config, allocator_conf_text
from bench.accounting.caching_allocator import AllocatorSettings, CachingAllocatorModel
from bench.accounting.caching_allocator.sequences import SEQUENCES, run_on_model
from bench.gpucheck.log import CheckLog
from bench.gpucheck.sequences import allocator_sequences, model_outcomes

MIB = 1 << 20


@pytest.mark.parametrize("sequence", SEQUENCES, ids=[sequence.name for sequence in SEQUENCES])
def test_the_model_gives_the_hand_derived_statistics(sequence):
    assert run_on_model(sequence) == dict(sequence.expected)


class NeverSplits(CachingAllocatorModel):
    def _should_split(self, block, size):
        return False


class OneStream(CachingAllocatorModel):
    """The model before streams: every request on one pool, record_stream ignored."""

    def malloc(self, nbytes, key, stream=0):
        return super().malloc(nbytes, key, 0)

    def record_stream(self, key, stream):
        pass


def verdicts(outcomes) -> dict:
    log = CheckLog()
    allocator_sequences(True, None, log, outcomes=outcomes)
    return {check.name.split(": ", 1)[1]: check.verdict for check in log.checks}


def test_the_gpu_check_of_the_sequences_fails_on_a_planted_fault():
    assert set(verdicts(model_outcomes).values()) == {"PASS"}
    never_splits = verdicts(lambda: {s.name: {"stats": run_on_model(s, NeverSplits)} for s in SEQUENCES})
    for name in ("small pool split", "large pool 20 MiB segment and 2 MiB rounding", "roundup_power2_divisions",
                 "empty_cache keeps split segments", "large_segment_size_mb"):
        assert never_splits[name] == "FAIL", name
    one_stream = verdicts(lambda: {s.name: {"stats": run_on_model(s, OneStream)} for s in SEQUENCES})
    assert {name for name, verdict in one_stream.items() if verdict == "FAIL"} == {
        "record_stream defers the free", "per-stream pools"}
    errors = verdicts(lambda: {"small pool split": {"error": "RuntimeError: CUDA error"},
                               "large_segment_size_mb": {"error": "RuntimeError: Unrecognized key "
                                                                  "'large_segment_size_mb'"}})
    assert errors["small pool split"] == errors["per-stream pools"] == "FAIL"  # raised / not run
    assert errors["large_segment_size_mb"] == "SKIP"  # an older torch without the option


def test_record_stream_blocks_wait_for_their_event_and_show_as_pending():
    model = CachingAllocatorModel(1 << 30)
    model.malloc(12 * MIB, "a")
    model.record_stream("a", 1)  # the side stream is idle: its event completes at once
    model.free("a")
    model.malloc(12 * MIB, "b")
    assert model.memory_stats()["reserved_bytes.all.current"] == 12 * MIB
    model.stream_busy(2)
    model.record_stream("b", 2)
    model.record_stream("b", 0)  # its own stream: no use recorded
    model.free("b")
    states = [block["state"] for segment in model.snapshot()["segments"] for block in segment["blocks"]]
    assert states == ["active_pending_free"]
    stats = model.memory_stats()
    assert (stats["allocated_bytes.all.current"], stats["active_bytes.all.current"]) == (0, 12 * MIB)
    model.empty_cache()  # synchronize_and_free_events, then release: nothing is left
    assert model.memory_stats()["reserved_bytes.all.current"] == 0


def test_large_segment_size_mb_is_read_as_torch_reads_it():
    settings = AllocatorSettings.parse("max_split_size_mb:40,large_segment_size_mb:32")
    assert (settings.large_segment_size, settings.max_non_split_rounding_size) == (32 * MIB, 32 * MIB)
    assert AllocatorSettings().large_segment_size == 20 * MIB
    with pytest.raises(ValueError, match="large_segment_size_mb must be > 10 MB"):
        AllocatorSettings.parse("large_segment_size_mb:10")
    with pytest.raises(ValueError, match="max_split_size_mb too small, must be >= 32"):
        AllocatorSettings.parse("max_split_size_mb:24,large_segment_size_mb:32")  # read first, wherever it is
    assert AllocatorSettings.parse("max_split_size_mb:24").max_split_size == 24 * MIB


def test_unknown_allocator_keys_are_refused_and_known_ones_checked():
    with pytest.raises(ValueError, match="Unrecognized key 'max_split_size_MB'.*did you mean 'max_split_size_mb'"):
        AllocatorSettings.parse("max_split_size_MB:128")
    with pytest.raises(ValueError, match="Unrecognized key 'colour'"):
        AllocatorSettings.parse("colour:blue")
    with pytest.raises(ValueError, match="True/False"):
        AllocatorSettings.parse("throw_on_cudamalloc_oom:yes")
    assert AllocatorSettings.parse("throw_on_cudamalloc_oom:True,backend:native,"
                                   "pinned_num_register_threads:8") == AllocatorSettings()


def test_pytorch_cuda_alloc_conf_wins_over_pytorch_alloc_conf():
    both = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:64", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert allocator_conf_text(None, both) == "expandable_segments:True"
    assert allocator_config(both)["source"] == "PYTORCH_CUDA_ALLOC_CONF"
    # set to the empty string still counts as set (torch's get_env has a value), so the other is not read
    assert allocator_conf_text(None, {**both, "PYTORCH_CUDA_ALLOC_CONF": ""}) == ""
    assert allocator_conf_text(None, {"PYTORCH_ALLOC_CONF": "max_split_size_mb:64"}) == "max_split_size_mb:64"


def test_an_unknown_allocator_key_is_refused_before_launch(monkeypatch):
    from test_gpu_path import cuda_config

    from bench.run.launchspec import resolve_launch, validate_run
    from workloads.validate import ConfigError

    cfg = cuda_config()
    launch = resolve_launch(cfg, 2, 80 << 30)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segment:True")
    with pytest.raises(ConfigError, match="did you mean 'expandable_segments'"):
        validate_run(cfg, launch)


class NoProcessEvents(CachingAllocatorModel):
    """A model whose deferred frees wait for empty_cache (process_events never runs in malloc)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events.completed = lambda: []


def test_a_model_that_never_processes_events_fails_the_record_stream_sequence():
    (sequence,) = [s for s in SEQUENCES if s.name == "record_stream defers the free"]
    stats = run_on_model(sequence, NoProcessEvents)
    assert stats["reserved_bytes.all.peak"] == 44 * MIB != sequence.expected["reserved_bytes.all.peak"]


def test_the_torch_side_of_the_sequences_answers_every_operation_the_model_does():
    """gpu_check runs the same run_ops over torch.cuda (not runnable here): its adapter must have each method
    run_ops calls, with the model's parameters."""
    import inspect

    from bench.gpucheck.sequences import TorchCudaAllocator

    for name in ("malloc", "free", "record_stream", "stream_busy", "empty_cache"):
        torch_side = list(inspect.signature(getattr(TorchCudaAllocator, name)).parameters)
        model_side = list(inspect.signature(getattr(CachingAllocatorModel, name)).parameters)
        assert torch_side[1:] == model_side[1:], name
    assert callable(TorchCudaAllocator.synchronize)
