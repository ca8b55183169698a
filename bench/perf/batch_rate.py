"""How fast does the synthetic input stream produce batches, compared with what a training step eats?

Run as ``python -m bench.perf.batch_rate [--batches N] [--steps N] [--quick] [--json FILE]``. Shapes: ``tiny``;
MLPerf DLRM-DCNv2's model (26 tables, 214 ids per sample, batch 4096) with 10k rows per table; and the same with
the preset's real Criteo 1TB cardinalities (up to 40M rows; the step is not timed there). For each shape it
prints, on this machine's CPU:

(a) ``workloads.data.SyntheticBatches`` samples/s (Zipf ids, and uniform ids for comparison), median
    over ``--batches`` batches after a warm-up batch;
(b) ``torchrec.datasets.random.RandomRecDataset`` samples/s for the same keys / batch size / hash sizes
    / ids per feature, generating every batch afresh (``num_generated_batches=-1``; by default it
    pre-generates 10 batches and cycles through them, which would time nothing);
(c) one single-process training step that consumes a batch: batch -> KeyedJaggedTensor, torchrec
    DLRM (``DLRM``, or ``DLRM_DCN`` for ``arch=dlrm_dcn``) over an ``EmbeddingBagCollection`` on CPU,
    forward + BCE loss + backward + ``torch.optim.SGD`` step; median over ``--steps`` steps after a
    warm-up step;
(d) ``workloads.device_data.DeviceSyntheticBatches`` samples/s (Zipf ids) on ``--device`` (default: cuda
    when available, else cpu; synchronized before each clock read);

then the ratios generator / step (> 1: the generator keeps up with training on one core) and
generator / RandomRecDataset. ``--json FILE`` also writes the rows (keys ``shape``, ``ours_zipf_per_s``,
``ours_uniform_per_s``, ``randomrec_per_s``, ``step_per_s``, ``device_zipf_per_s``, ``device``, and the
shape's sizes; null where not measured).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
from pathlib import Path
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List

import torch

from bench.perf.table import print_table
from workloads.config import IdsConfig, PoolingConfig, WorkloadConfig
from workloads.data import Batch, SyntheticBatches
from workloads.spec import WorkloadSpec
from workloads.spec import build_spec

MLPERF_PRESET = Path(__file__).resolve().parents[2] / "conf" / "workload" / "mlperf_dcnv2.yaml"


def _mlperf_preset() -> dict:
    """The MLPerf DLRM-DCNv2 preset's row counts and multi-hot sizes (Criteo 1TB), from its config file."""
    from omegaconf import OmegaConf

    preset = OmegaConf.to_container(OmegaConf.load(MLPERF_PRESET))
    return {"rows_list": [int(r) for r in preset["rows_list"]],
            "per_table_mean": [float(m) for m in preset["pooling"]["per_table_mean"]]}


def shapes(quick: bool) -> List[WorkloadConfig]:
    """tiny; MLPerf DLRM-DCNv2's model at 10k rows per table (small enough to train a step on CPU); and its
    real cardinalities (up to 40M rows: generators only, the step is skipped -- its tables are ~104 GB)."""
    preset = _mlperf_preset()
    tiny = WorkloadConfig()  # 8 tables x 10k rows, dim 64, fixed pooling 4, batch 512
    mlperf = WorkloadConfig(
        name="mlperf_dcnv2_like",
        num_tables=26,
        rows=10_000,
        embedding_dim=128,
        num_dense_features=13,
        batch_size=512 if quick else 4096,
        pooling=PoolingConfig(distribution="fixed", per_table_mean=preset["per_table_mean"]),
        arch="dlrm_dcn",
        dense_arch=[512, 256, 128],
        over_arch=[1024, 1024, 512, 256, 1],
        dcn_num_layers=3,
        dcn_low_rank_dim=512,
    )
    criteo = WorkloadConfig(**{**mlperf.__dict__, "name": "mlperf_dcnv2_criteo_rows", "rows_list": preset["rows_list"]})
    return [tiny, mlperf, criteo]


def trains_a_step(cfg: WorkloadConfig) -> bool:
    """Whether the benchmark times a CPU training step at this shape (not at real MLPerf cardinalities)."""
    return not cfg.rows_list


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch on one intra-op thread while the block runs (a generator measured on one core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def median_seconds(fn: Callable[[int], object], n: int, warmup: int = 1) -> float:
    for i in range(warmup):
        fn(-1 - i)
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _our_stream(spec: WorkloadSpec, ids: str) -> Callable[[int], object]:
    cfg = spec.config
    cfg2 = WorkloadConfig(**{**cfg.__dict__, "ids": IdsConfig(distribution=ids, zipf_alpha=cfg.ids.zipf_alpha)})
    gen = SyntheticBatches(build_spec(cfg2), rank=0, world_size=1)
    return lambda i: gen.batch(abs(i))


def _random_rec_stream(spec: WorkloadSpec) -> Callable[[int], object]:
    from torchrec.datasets.random import RandomRecDataset

    ids_per = [max(0, int(round(t.pooling_mean))) for t in spec.tables]
    ds = RandomRecDataset(
        keys=[t.feature_name for t in spec.tables],
        batch_size=spec.config.batch_size,
        hash_sizes=[t.physical_rows for t in spec.tables],
        ids_per_features=ids_per,
        min_ids_per_features=ids_per,  # fixed pooling, like ours
        num_dense=spec.config.num_dense_features,
        manual_seed=0,
        num_generated_batches=-1,  # generate each batch on the fly
    )
    it = iter(ds)
    return lambda i: next(it)


def generator_rates(spec: WorkloadSpec, batches: int) -> Dict[str, float]:
    """Samples/s of our Zipf and uniform streams and of RandomRecDataset, each on one core (torch at one thread),
    timed in turn batch by batch, so that a slower or busier moment of the machine falls on all three alike:
    the ratios are side by side. Median over `batches` after one warm-up each."""
    streams = {"zipf": _our_stream(spec, "zipf"), "uniform": _our_stream(spec, "uniform"),
               "randomrec": _random_rec_stream(spec)}
    with one_torch_thread():
        for make in streams.values():
            make(-1)
        times: Dict[str, List[float]] = {name: [] for name in streams}
        for i in range(batches):
            for name, make in streams.items():
                t0 = time.perf_counter()
                make(i)
                times[name].append(time.perf_counter() - t0)
    return {name: spec.config.batch_size / statistics.median(values) for name, values in times.items()}


def device_generator_rate(spec: WorkloadSpec, device, batches: int, warmup: int = 1) -> float:
    """Samples/s of workloads.device_data's generator on `device` (a GPU's batches are waited for; on CPU one
    core, like the other generators)."""
    from workloads.device_data import DeviceSyntheticBatches

    dev = torch.device(device)
    gen = DeviceSyntheticBatches(spec, rank=0, world_size=1, device=dev)

    def draw(i: int) -> None:
        gen.batch(abs(i))
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    with one_torch_thread() if dev.type == "cpu" else nullcontext():
        return spec.config.batch_size / median_seconds(draw, batches, warmup)


def to_kjt(batch: Batch):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    return KeyedJaggedTensor(keys=batch.keys, values=batch.values, lengths=batch.lengths)


def build_model(spec: WorkloadSpec) -> torch.nn.Module:
    from torchrec.models.dlrm import DLRM, DLRM_DCN
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    cfg = spec.config
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=t.name, embedding_dim=t.embedding_dim, num_embeddings=t.physical_rows, feature_names=[t.feature_name]
            )
            for t in spec.tables
        ],
        device=torch.device("cpu"),
    )
    dim = spec.tables[0].embedding_dim
    dense_arch = list(cfg.dense_arch[:-1]) + [dim]  # the dense arch must end in the embedding dim
    if cfg.arch == "dlrm_dcn":
        return DLRM_DCN(
            embedding_bag_collection=ebc,
            dense_in_features=cfg.num_dense_features,
            dense_arch_layer_sizes=dense_arch,
            over_arch_layer_sizes=list(cfg.over_arch),
            dcn_num_layers=cfg.dcn_num_layers,
            dcn_low_rank_dim=cfg.dcn_low_rank_dim,
        )
    return DLRM(
        embedding_bag_collection=ebc,
        dense_in_features=cfg.num_dense_features,
        dense_arch_layer_sizes=dense_arch,
        over_arch_layer_sizes=list(cfg.over_arch),
    )


def step_seconds(spec: WorkloadSpec, steps: int) -> float:
    torch.manual_seed(0)
    model = build_model(spec)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    gen = SyntheticBatches(spec, rank=0, world_size=1)
    batches = {i: gen.batch(abs(i)) for i in range(-1, steps)}  # generation kept out of the timing

    def step(i: int) -> None:
        b = batches[i]
        kjt = to_kjt(b)
        opt.zero_grad(set_to_none=True)
        logits = model(dense_features=b.dense_features, sparse_features=kjt).squeeze(-1)
        loss = loss_fn(logits, b.labels)
        loss.backward()
        opt.step()

    return median_seconds(step, steps)


@dataclass
class Row:
    shape: str
    tables: int
    batch: int
    ids_per_sample: float
    ours_zipf: float
    ours_uniform: float
    random_rec: float
    step_ms: float
    device_zipf: float = float("nan")
    device: str = "cpu"

    @property
    def step_rate(self) -> float:
        return self.batch / (self.step_ms / 1000)


def _or_dash(x: float, text: str) -> str:
    """`text`, or "-" where `x` was not measured (NaN)."""
    return "-" if math.isnan(x) else text


def fmt_rate(x: float) -> str:
    return _or_dash(x, f"{x / 1e3:,.0f}k" if x >= 1e4 else f"{x:,.0f}")


def _json_number(x: float, digits: int):
    return None if math.isnan(x) else round(x, digits)


def json_rows(rows: List[Row]) -> List[dict]:
    """The rows as ``--json`` writes them: rates in samples per second, null where not measured."""
    return [{"shape": r.shape, "tables": r.tables, "batch": r.batch, "ids_per_sample": r.ids_per_sample,
             "ours_zipf_per_s": round(r.ours_zipf, 1), "ours_uniform_per_s": round(r.ours_uniform, 1),
             "randomrec_per_s": round(r.random_rec, 1), "step_per_s": _json_number(r.step_rate, 1),
             "step_ms": _json_number(r.step_ms, 3), "device_zipf_per_s": _json_number(r.device_zipf, 1),
             "device": r.device}
            for r in rows]


def render(rows: List[Row], header: str) -> None:
    cols = [
        "shape", "tables", "batch", "ids/sample", "ours zipf /s", "ours uniform /s", "RandomRec /s",
        "step ms", "step /s", "ours/step", "ours/RandomRec", "uniform/RandomRec", "device zipf /s",
    ]
    data = [
        [
            r.shape, str(r.tables), str(r.batch), f"{r.ids_per_sample:g}", fmt_rate(r.ours_zipf),
            fmt_rate(r.ours_uniform), fmt_rate(r.random_rec), _or_dash(r.step_ms, f"{r.step_ms:,.1f}"),
            fmt_rate(r.step_rate), _or_dash(r.step_ms, f"{r.ours_zipf / r.step_rate:,.1f}x"),
            f"{r.ours_zipf / r.random_rec:,.2f}x",
            f"{r.ours_uniform / r.random_rec:,.2f}x", f"{fmt_rate(r.device_zipf)} ({r.device})",
        ]
        for r in rows
    ]
    print_table(header, cols, data, left={"shape"})


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=40, help="timed batches per generator (after 1 warm-up)")
    p.add_argument("--steps", type=int, default=3, help="timed training steps per shape (after 1 warm-up)")
    p.add_argument("--quick", action="store_true", help="small batches and few repeats (smoke run)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where DeviceSyntheticBatches draws (default: cuda when available, else cpu)")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the rows to FILE as JSON")
    args = p.parse_args(argv)
    # torchrec's KeyedJaggedTensor trips torch.fx's one-time "is_fx_tracing" deprecation warning
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    batches, steps = (min(args.batches, 3), min(args.steps, 2)) if args.quick else (args.batches, args.steps)
    if batches < 1 or steps < 1:
        p.error("--batches and --steps must be >= 1")

    t_start = time.perf_counter()
    rows = []
    for cfg in shapes(args.quick):
        spec = build_spec(cfg)
        rates = generator_rates(spec, batches)
        rows.append(
            Row(
                shape=cfg.name,
                tables=len(spec.tables),
                batch=cfg.batch_size,
                ids_per_sample=sum(round(t.pooling_mean) for t in spec.tables),
                ours_zipf=rates["zipf"],
                ours_uniform=rates["uniform"],
                random_rec=rates["randomrec"],
                step_ms=step_seconds(spec, steps) * 1000 if trains_a_step(cfg) else float("nan"),
                device_zipf=device_generator_rate(spec, args.device, batches),
                device=args.device,
            )
        )
    header = (
        f"samples/s on CPU (torch {torch.__version__}, {torch.get_num_threads()} intra-op threads for the step; "
        f"generators on one thread, timed in turn batch by batch), median of {batches} batches / {steps} steps "
        f"after warm-up"
    )
    render(rows, header)
    print(
        "ours/step > 1: one generator core produces batches faster than one training step consumes them.\n"
        "ours/RandomRec: our Zipf stream vs RandomRecDataset's uniform torch.randint ids (which also builds the\n"
        "KeyedJaggedTensor); uniform/RandomRec compares like for like.\n"
        "device zipf: workloads.device_data.DeviceSyntheticBatches (torch ops on the device named in brackets).\n"
        f"total {time.perf_counter() - t_start:.1f} s"
    )
    if args.json is not None:
        args.json.write_text(json.dumps({"header": header, "rows": json_rows(rows)}, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
