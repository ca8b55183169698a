"""emulate.peers=own_batches: each peer of an emulated rank answers an id exchange from its own batch.

A batch is a pure function of (seed, rank, step) (workloads.data), and one table's draws do not depend on the
others'. So what peer p sends rank R in an id exchange -- the pooling factors and ids of the tables R serves,
for p's samples -- is drawn here for p alone, without p's other tables: the buffers R receives have the
sizes, and hold the ids, of the real job's, whatever the pooling. (The peers' pooled embeddings, gradients
and dense collectives have sizes the plan fixes; the group answers them with R's own data.)

How an exchange is found: the backend tells `PeerBatches.start` of each id exchange rank R starts (which
tables R receives, the tensors it sends, torchrec's splits); the step is the one whose batch gives R's own
share of what it sends (checked, so a mismatch stops the run instead of answering wrongly); the group then
asks `fill` for every all-to-all, which answers the exchange's tensors (known by their storage) and
torchrec's splits exchange (known by its content: R's splits for every destination, one module's or several
fused).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from bench.run.emulated_group import chunks

# how far past the last exchange's step the next one may be (train pipelines start later batches early)
STEP_WINDOW = 4
LENGTHS, VALUES, VALUE_COUNT = "lengths", "values", "value_count"


def _key(tensor: torch.Tensor) -> Tuple[int, int, torch.dtype]:
    return tensor.data_ptr(), tensor.numel(), tensor.dtype


def _host(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy().reshape(-1)


def _write(chunk: torch.Tensor, values: np.ndarray, what: str) -> None:
    if chunk.numel() != values.size:
        raise RuntimeError(f"emulated peers: a peer's {what} has {values.size} elements but the buffer the rank "
                           f"received them in has {chunk.numel()} (emulate.peers=own_data answers without them)")
    if values.size:  # through the buffer's own storage: a temporary would be an allocation no real peer makes
        chunk.copy_(torch.from_numpy(np.ascontiguousarray(values)).view(chunk.shape))


@dataclass
class _Exchange:
    """One id exchange of rank R: per role (lengths, values, value count) each rank's chunk for R."""
    answers: Dict[str, List[np.ndarray]]
    splits: Optional[np.ndarray] = None  # torchrec: R's splits for every destination, one row each
    splits_rows: List[np.ndarray] = field(default_factory=list)  # what each rank's splits row for R is


class PeerBatches:
    """The answers of rank `rank`'s peers, drawn from their own batches (`batches.tables_of`)."""

    def __init__(self, batches, rank: int, world_size: int):
        self._batches, self._rank, self._world = batches, rank, world_size
        self._step = 0  # the earliest step an exchange can still be of
        self._by_tensor: Dict[Tuple[int, int, torch.dtype], Tuple[_Exchange, str]] = {}
        self._awaiting_splits: List[_Exchange] = []
        self._in_order: List[Tuple[_Exchange, str]] = []  # roles known by their content, in the order they come

    def start(self, tables: Sequence[int], own: Dict[str, np.ndarray], sent: Dict[str, torch.Tensor],
              splits: Optional[np.ndarray] = None) -> None:
        """Rank R starts an id exchange of `tables` (those it receives, in the order it receives them): `own`
        maps each role (lengths, values, value_count: one number a destination) to R's own share of it, `sent`
        the roles it knows the tensor of to that tensor (a role without one is answered at the next all-to-all
        that sends R its own share of it); `splits` (torchrec) is R's splits row for every destination:
        lengths, values, then the stride."""
        step, own_draw = self._step_of(tables, own)
        exchange = _Exchange({role: [] for role in own}, splits)
        for peer in range(self._world):
            lengths, values = own_draw if peer == self._rank else self._drawn(peer, step, tables)
            for role in own:
                exchange.answers[role].append(
                    {LENGTHS: lengths, VALUES: values, VALUE_COUNT: np.array([values.size])}[role])
            if splits is not None:
                exchange.splits_rows.append(np.concatenate([[lengths.size, values.size], splits[self._rank, 2:]]))
        for role, share in own.items():
            if not np.array_equal(exchange.answers[role][self._rank], share):
                raise RuntimeError(f"emulated peers: rank {self._rank}'s own {role} in an id exchange of step {step} "
                                   "are not what its batch holds for the tables it receives (an exchange this "
                                   "emulation does not know: run with emulate.peers=own_data)")
            if role in sent and sent[role].numel():
                self._by_tensor[_key(sent[role])] = (exchange, role)
            elif role not in sent:
                self._in_order.append((exchange, role))
        if splits is not None:
            if not np.array_equal(exchange.splits_rows[self._rank], splits[self._rank]):
                raise RuntimeError(f"emulated peers: rank {self._rank}'s own splits {splits[self._rank].tolist()} "
                                   f"are not its batch's {exchange.splits_rows[self._rank].tolist()}")
            self._awaiting_splits.append(exchange)

    def _drawn(self, rank: int, step: int, tables: Sequence[int]) -> Tuple[np.ndarray, np.ndarray]:
        """What `rank`'s batch `step` holds for `tables`: pooling factors and ids, each concatenated."""
        if not tables:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        lengths, values = self._batches.tables_of(rank, step, tables)
        return np.concatenate(lengths), values

    def _step_of(self, tables: Sequence[int], own: Dict[str, np.ndarray]
                 ) -> Tuple[int, Tuple[np.ndarray, np.ndarray]]:
        """The step whose batch gives rank R's own share of the exchange (the earliest one, from the last), and
        what R's batch of that step holds for `tables`."""
        if not tables:
            return self._step, self._drawn(self._rank, self._step, tables)
        for step in range(self._step, self._step + STEP_WINDOW):
            lengths, values = self._drawn(self._rank, step, tables)
            if np.array_equal(lengths, own.get(LENGTHS, lengths)) and np.array_equal(values, own.get(VALUES, values)):
                self._step = step
                return step, (lengths, values)
        raise RuntimeError(f"emulated peers: an id exchange of rank {self._rank} holds none of its batches "
                           f"{self._step}..{self._step + STEP_WINDOW - 1} (run with emulate.peers=own_data)")

    def fill(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: Sequence[int],  # noqa: A002
             input_split_sizes: Sequence[int]) -> bool:
        """Answer one all-to-all if it is part of an exchange started here (True), else leave it (False)."""
        if not input.numel():
            return False
        found = self._by_tensor.pop(_key(input), None)
        if found is not None:
            exchange, role = found
            self._answer(output, output_split_sizes, exchange.answers[role], role)
            return True
        if input.is_floating_point():
            return False
        if self._in_order:
            exchange, role = self._in_order[0]
            if np.array_equal(_host(chunks(input, input_split_sizes, self._world)[self._rank]),
                              exchange.answers[role][self._rank]):
                self._in_order.pop(0)
                self._answer(output, output_split_sizes, exchange.answers[role], role)
                return True
        if self._awaiting_splits and not input_split_sizes:
            return self._answer_splits(output, input)
        return False

    def _answer(self, output: torch.Tensor, split_sizes: Sequence[int], rows: List[np.ndarray], what: str) -> None:
        for peer, chunk in enumerate(chunks(output, split_sizes, self._world)):
            _write(chunk, rows[peer], what)

    def _answer_splits(self, output: torch.Tensor, input: torch.Tensor) -> bool:  # noqa: A002
        """torchrec's splits exchange: R's splits of one exchange, or of several fused into one (a train
        pipeline's), each destination's row the exchanges' rows side by side."""
        sent = _host(input).reshape(self._world, -1)
        columns = 0
        for count, exchange in enumerate(self._awaiting_splits, start=1):
            columns += exchange.splits.shape[1]
            if columns > sent.shape[1]:
                return False
            if columns == sent.shape[1]:
                fused = self._awaiting_splits[:count]
                if not np.array_equal(np.concatenate([e.splits for e in fused], axis=1), sent):
                    return False
                del self._awaiting_splits[:count]
                rows = [np.concatenate([e.splits_rows[peer] for e in fused]) for peer in range(self._world)]
                self._answer(output, [], rows, "splits")
                return True
        return False


def native_observer(answers: PeerBatches, world_size: int, rank: int):
    """workloads.native's on_exchange, answered by `answers`."""
    def on_exchange(tables, own_ids, value_count, lengths):
        lengths_sent, split_sizes = lengths
        own = {LENGTHS: _host(chunks(lengths_sent, split_sizes, world_size)[rank]),
               VALUES: np.concatenate([_host(ids) for ids in own_ids]) if own_ids else np.zeros(0, np.int64),
               VALUE_COUNT: _host(value_count)[rank:rank + 1]}
        answers.start(tables, own, {LENGTHS: lengths_sent, VALUE_COUNT: value_count})
    return on_exchange


def torchrec_observer(answers: PeerBatches, table_of: Dict[str, int], world_size: int, rank: int):
    """What answers each KeyedJaggedTensor torchrec splits for an all-to-all of the world group."""
    def on_exchange(kjt, key_splits: Sequence[int], splits: List[List[int]]) -> None:
        if len(key_splits) != world_size:
            return
        if kjt.variable_stride_per_key() or kjt.weights_or_none() is not None:
            raise RuntimeError("emulated peers: an id exchange of variable batch sizes or weighted ids, which "
                               "emulate.peers=own_batches does not answer (use emulate.peers=own_data)")
        first = sum(key_splits[:rank])
        tables = [table_of[key] for key in kjt.keys()[first:first + key_splits[rank]]]
        sent = {LENGTHS: kjt.lengths(), VALUES: kjt.values()}
        own = {role: _host(chunks(sent[role], sizes, world_size)[rank])
               for role, sizes in zip((LENGTHS, VALUES), splits)}
        rows = np.array([*splits, [kjt.stride()] * world_size], dtype=np.int64).T  # a destination's row each
        answers.start(tables, own, sent, rows)
    return on_exchange


def answer_peers(cfg, launch, backend, batches) -> None:
    """emulate.peers=own_batches (or auto on the host): the emulated group's id exchanges answered from the
    peers' own batches, for the backend the rank trains."""
    from bench.run.emulated_group import world_group
    from bench.run.emulation import OWN_BATCHES, peers_answer

    if launch.emulated_rank is None or peers_answer(cfg, launch.device_type) != OWN_BATCHES:
        return
    rank, world_size = launch.emulated_rank, launch.world_size
    answers = PeerBatches(batches, rank, world_size)
    world_group().peer_answers = answers
    if backend.name == "native":
        backend.model.on_exchange = native_observer(answers, world_size, rank)
    else:
        from bench.run.torchrec_modules import observe_kjt_splits

        table_of = {key: index for index, key in enumerate(batches.keys)}
        observe_kjt_splits(torchrec_observer(answers, table_of, world_size, rank))
