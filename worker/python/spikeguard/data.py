"""The data order of a run, for PyTorch trainers.

A run's data order is a pure function of its manifest: corpus, seed, global
batch size, sequence length, domain blend and data plan. Step ``s`` consumes
data position ``plan[s]`` (a hole in the plan is a skipped window; a mask
drops single samples of a batch), and every position resolves to the same
samples and documents wherever it is computed. This module is a thin layer
over spikeguard's C++ corpus library (``spikeguard._corpus``, a binding of
``storage/corpus``): the very code the daemon uses to name the documents of
a spike window, so what the trainer feeds and what the daemon names agree.
Nothing here re-derives rows; every batch comes from the library's
``DataOrder::Materialize``.

    from spikeguard.data import Corpus, DataOrder

    corpus = Corpus.open("/data/corpus")            # <domain>.bin/.idx + corpus.meta
    order = DataOrder(corpus, plan=plan_text)       # None/"" = the corpus defaults
    for step in range(start, steps):
        batch = order.batch(step)                   # the global batch of `step`
        tokens, domains = order.shard(batch, rank, world_size)   # this rank's rows
        x = torch.from_numpy(tokens[:, :-1]).long()
        y = torch.from_numpy(tokens[:, 1:]).long()
        ...
    # on REWIND: order = order.with_plan(command.plan)

Batches: ``batch.tokens`` is ``uint8 [rows, T + 1]`` (T inputs plus the
next-token target; tokens are bytes), ``batch.domains`` is ``int32 [rows]``
(an index into ``corpus.domain_names``). ``rows`` is the global batch size
unless the plan masks samples of this position, when it is smaller (never
0: the library refuses a mask that drops every sample); ``batch.slots`` says
which sample slot of the global batch each row is.

Sharding for data parallelism is a contiguous split of the batch's rows:
rank ``r`` of ``W`` gets rows ``[r·n // W, (r+1)·n // W)`` of ``n`` rows.
With a masked batch ``n`` may be smaller than ``W`` and some ranks get no
rows; a DDP trainer must still take part in the gradient all-reduce on those
ranks (e.g. a zero loss of the right graph) and should weight each rank's
mean loss by its share of ``rows``.

Errors: a bad corpus directory raises ``FileNotFoundError`` or ``ValueError``
naming the directory and the problem; a bad manifest field or plan raises
``ValueError`` naming the field; a step past the end of a bounded plan raises
``IndexError``.

Any dataset (no spikeguard corpus): ``Plan`` is the daemon's data plan on its
own (step → data position, the position a checkpoint stores, which samples a
mask drops), and ``PlanSampler`` a batch sampler for any index-addressable
dataset (``torch.utils.data.Dataset`` with ``__len__``)::

    from spikeguard.data import Plan, PlanSampler

    plan = Plan(plan_text_or_DataPlan)            # "" / None: "0-" (every position)
    plan.position_for_step(600)                   # 610 with "0-600,610-"
    plan.dropped_slots(300)                       # [0, 1, 5] with ";drop=300:0.1.5"
    sampler = PlanSampler(len(dataset), global_batch_size=16, seed=0,
                          rank=rank, world_size=world, plan=plan, start_step=step)
    loader = DataLoader(dataset, batch_sampler=sampler)   # one step's rows per item

Global batch of position ``p``: sample slot ``j`` (0 ≤ j < global batch size)
is dataset index ``perm_e[(p·B + j) mod N]`` with ``e = (p·B + j) // N`` the
epoch and ``perm_e`` a permutation seeded by ``(seed, e)`` (no shuffle: the
identity). A mask drops slots; the kept slots are split across ranks
contiguously (``shard_bounds``). ``sampler.last`` tells the trainer what it
fed (position, slots, indices, the global kept rows), so the daemon can be
told which documents each *sample* holds (``documents_for``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

import numpy as np

from spikeguard import _corpus

__all__ = ["Batch", "Corpus", "DataOrder", "Plan", "PlanSampler", "SampleBatch", "plan_text",
           "shard_bounds"]

# The C++ Manifest's defaults (storage/corpus/data_order.h), for a corpus
# directory without corpus.meta.
_MANIFEST_DEFAULTS = {"seed": 0, "global_batch_size": 16, "sequence_length": 64}
_DEFAULT_PLAN = "0-"


def _reraise(exc: Exception, prefix: str) -> Exception:
    """The same exception type, its message prefixed with `prefix`."""
    msg = f"{prefix}: {exc}"
    if isinstance(exc, FileNotFoundError):
        return FileNotFoundError(msg)
    if isinstance(exc, IndexError):
        return IndexError(msg)
    if isinstance(exc, ValueError):
        return ValueError(msg)
    if isinstance(exc, OSError):
        return OSError(msg)
    return type(exc)(msg)


def plan_text(plan) -> str:
    """A data plan's normalized text form from its text form or from a
    ``spikeguard.v1.DataPlan`` message (ranges with end -1 = unbounded, and
    sample masks), built by the C++ library as the reference worker builds it.

    "" (or None, or a message without ranges) stays "": a REWIND without a
    plan. The reference worker then keeps the plan saved in the checkpoint
    (the corpus default when there is none); DataOrder takes "" as the
    corpus default, so pass the checkpoint's plan in that case."""
    if plan is None:
        return ""
    if isinstance(plan, str):
        if plan.strip() == "":
            return ""
        try:
            return _corpus.normalize_plan(plan)
        except ValueError as e:
            raise ValueError(f"plan {plan!r}: {e}") from None
    if hasattr(plan, "ranges"):
        ranges = [(int(r.begin), int(r.end)) for r in plan.ranges]
        if not ranges:
            return ""
        masks = [(int(m.position), [int(x) for x in m.slots]) for m in getattr(plan, "masks", ())]
        try:
            return _corpus.plan_from_parts(ranges, masks)
        except ValueError as e:
            raise ValueError(f"plan {ranges} masks {masks}: {e}") from None
    raise ValueError(f"plan must be a data plan's text form or a DataPlan message, got {plan!r}")


class Corpus:
    """A directory of Megatron indexed datasets, one ``<domain>.bin/.idx`` per
    domain, plus the ``corpus.meta`` the spikeguard corpus tools write."""

    def __init__(self, native, directory: str, metadata: Optional[dict]):
        self._native = native
        self._dir = directory
        self._meta = metadata

    @classmethod
    def open(cls, corpus_dir) -> "Corpus":
        directory = os.fspath(corpus_dir)
        if not os.path.isdir(directory):
            what = "is not a directory" if os.path.exists(directory) else "does not exist"
            raise FileNotFoundError(f"corpus {directory}: {what}")
        try:
            native = _corpus.Corpus.open(directory)
        except (ValueError, OSError, IndexError) as e:
            raise _reraise(e, f"corpus {directory}") from None
        meta = None
        if os.path.exists(os.path.join(directory, _corpus.METADATA_FILE)):
            try:
                meta = _corpus.read_metadata(directory)
            except (ValueError, OSError) as e:
                raise _reraise(e, f"corpus {directory}") from None
        return cls(native, directory, meta)

    @property
    def dir(self) -> str:
        return self._dir

    @property
    def domain_names(self) -> List[str]:
        return list(self._native.domain_names)

    @property
    def fingerprint(self) -> str:
        """XXH64 over every domain's name, .idx and .bin (16 hex digits)."""
        return self._native.fingerprint

    @property
    def has_metadata(self) -> bool:
        return self._meta is not None

    @property
    def metadata(self) -> Optional[dict]:
        """corpus.meta as a dict (fingerprint, default_manifest, domains,
        poisons), or None when the directory has none."""
        return None if self._meta is None else dict(self._meta)

    @property
    def default_manifest(self) -> dict:
        """seed, global_batch_size, sequence_length, blend (domain → weight;
        empty = equal weights) and plan from corpus.meta; the C++ defaults
        (seed 0, 16 × 64, equal blend, plan "0-") without one."""
        if self._meta is None:
            return dict(_MANIFEST_DEFAULTS, blend={}, plan=_DEFAULT_PLAN)
        m = self._meta["default_manifest"]
        return {
            "seed": int(m["seed"]),
            "global_batch_size": int(m["global_batch_size"]),
            "sequence_length": int(m["sequence_length"]),
            "blend": dict(m["blend"]),
            "plan": m["plan"],
        }

    @property
    def poisons(self) -> List[dict]:
        """Poisons the synthesizer placed (kind, position, documents, echoes)."""
        return [] if self._meta is None else list(self._meta["poisons"])

    def num_documents(self, domain: str) -> int:
        return self._native.num_documents(self._native.domain_index(domain))

    def num_tokens(self, domain: str) -> int:
        return self._native.num_tokens(self._native.domain_index(domain))

    def document_bytes(self, domain: str, document: int) -> bytes:
        """The tokens of one document as bytes (uint8 corpora)."""
        return self._native.document_bytes(domain, int(document))

    def __repr__(self) -> str:
        return f"Corpus({self._dir!r}, domains={self.domain_names}, fingerprint={self.fingerprint})"


@dataclasses.dataclass(frozen=True)
class Batch:
    """The global batch of one data position (all ranks' rows)."""

    position: int
    tokens: np.ndarray  # uint8 [rows, T + 1]
    domains: np.ndarray  # int32 [rows], index into Corpus.domain_names
    rows: int  # global_rows less the samples the plan's mask drops
    global_rows: int  # the manifest's global batch size
    tokens_total: int  # rows × T: tokens the model is trained on (targets)
    slots: np.ndarray  # int32 [rows]: the sample slot of the global batch each row fills
    step: Optional[int] = None  # the step it was made for, when made by step


def shard_bounds(rows: int, rank: int, world_size: int) -> Tuple[int, int]:
    """Rows [begin, end) of `rows` that rank `rank` of `world_size` takes."""
    if not isinstance(world_size, (int, np.integer)) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if not isinstance(rank, (int, np.integer)) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    return rank * rows // world_size, (rank + 1) * rows // world_size


def _int_field(name: str, value, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not minimum <= int(value) <= maximum:
        raise ValueError(f"{name} must be in [{minimum}, {maximum}], got {value}")
    return int(value)


def _blend_field(blend) -> Dict[str, float]:
    if not isinstance(blend, Mapping):
        raise ValueError(f"blend must be a mapping of domain name to weight, got {blend!r}")
    out = {}
    for k, v in blend.items():
        if not isinstance(k, str):
            raise ValueError(f"blend: domain name {k!r} is not a string")
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ValueError(f"blend: weight of {k!r} is not a number: {v!r}")
        out[k] = float(v)
    return out


class DataOrder:
    """step → data position → batch → documents, as the daemon resolves it.

    Arguments left None take the corpus's default manifest (corpus.meta);
    ``plan`` is a DataPlan's text form ("0-300,305-", possibly with mask
    suffixes such as ";drop=300:0.5") or a ``spikeguard.v1.DataPlan``
    message (see plan_text); "", None or a message without ranges mean the
    corpus's default plan. Thread-safe; materializing releases the GIL.
    """

    def __init__(self, corpus: Corpus, seed=None, global_batch_size=None, sequence_length=None,
                 blend=None, plan: Optional[str] = ""):
        if not isinstance(corpus, Corpus):
            raise ValueError(f"corpus must be a spikeguard.data.Corpus, got {type(corpus).__name__}")
        d = corpus.default_manifest
        self._corpus = corpus
        self._seed = _int_field("seed", d["seed"] if seed is None else seed, 0, 2**64 - 1)
        self._global_batch_size = _int_field(
            "global_batch_size", d["global_batch_size"] if global_batch_size is None else global_batch_size,
            1, 2**31 - 1)
        self._sequence_length = _int_field(
            "sequence_length", d["sequence_length"] if sequence_length is None else sequence_length,
            1, 2**31 - 2)
        self._blend = _blend_field(d["blend"] if blend is None else blend)
        plan = plan_text(plan) or d["plan"]
        try:
            self._native = _corpus.DataOrder(
                corpus._native, corpus.fingerprint, self._seed, self._global_batch_size,
                self._sequence_length, self._blend, plan)
        except (ValueError, OSError, IndexError) as e:
            raise _reraise(e, f"data order for corpus {corpus.dir}") from None

    # --- the manifest ------------------------------------------------------
    @property
    def corpus(self) -> Corpus:
        return self._corpus

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def global_batch_size(self) -> int:
        return self._global_batch_size

    @property
    def sequence_length(self) -> int:
        return self._sequence_length

    @property
    def blend(self) -> Dict[str, float]:
        return dict(self._blend)

    @property
    def plan(self) -> str:
        """The plan's normalized text form (DataPlan::ToString)."""
        return self._native.plan

    @property
    def step_count(self) -> Optional[int]:
        """Steps the plan feeds; None when unbounded."""
        n = self._native.step_count
        return None if n < 0 else n

    @property
    def manifest(self) -> dict:
        """dataset_fingerprint, seed, global_batch_size, sequence_length, blend, plan."""
        return dict(self._native.manifest)

    @property
    def slots_per_domain(self) -> Dict[str, int]:
        return dict(zip(self._corpus.domain_names, self._native.slots_per_domain))

    def with_plan(self, plan) -> "DataOrder":
        """The same order under another plan (on REWIND): text or a DataPlan
        message; "" = the corpus default (see plan_text)."""
        return DataOrder(self._corpus, seed=self._seed, global_batch_size=self._global_batch_size,
                         sequence_length=self._sequence_length, blend=self._blend, plan=plan)

    # --- resolving -----------------------------------------------------------
    def position_for_step(self, step: int) -> int:
        """The data position step `step` consumes; IndexError past a bounded plan."""
        return self._native.position_for_step(_int_field("step", step, 0, 2**63 - 1))

    def batch_at(self, position: int) -> Batch:
        """The global batch of data position `position` (after the plan's mask)."""
        position = _int_field("position", position, 0, 2**63 - 1)
        pos, rows, sample_tokens, tokens, domains, slots = self._native.materialize(position)
        return Batch(position=pos, tokens=tokens, domains=domains, rows=rows,
                     global_rows=self._global_batch_size,
                     tokens_total=rows * (sample_tokens - 1), slots=slots)

    def batch(self, step: int) -> Batch:
        """The global batch step `step` consumes."""
        return dataclasses.replace(self.batch_at(self.position_for_step(step)), step=int(step))

    def shard(self, batch: Batch, rank: int, world_size: int) -> Tuple[np.ndarray, np.ndarray]:
        """This rank's rows of `batch`: (tokens [r, T + 1], domains [r]); see
        shard_bounds. Views into the batch's arrays; r may be 0."""
        begin, end = shard_bounds(batch.rows, rank, world_size)
        return batch.tokens[begin:end], batch.domains[begin:end]

    def documents_at(self, position: int) -> List[Tuple[str, int]]:
        """The distinct (domain, document) pairs that contribute tokens to the
        samples of batch `position`, sorted (DataOrder::DocumentsAt)."""
        return [(d, int(doc)) for d, doc in
                self._native.documents_at(_int_field("position", position, 0, 2**63 - 1))]

    def resolve(self, position: int) -> List[dict]:
        """Where every sample slot of batch `position` comes from: per slot,
        dict(domain, domain_sample, spans=[dict(domain, document, offset,
        length, epoch)]) (DataOrder::Resolve; masks not applied)."""
        names = self._corpus.domain_names
        out = []
        for d, k, spans in self._native.resolve(_int_field("position", position, 0, 2**63 - 1)):
            out.append({
                "domain": names[d], "domain_sample": k,
                "spans": [{"domain": names[sd], "document": doc, "offset": off, "length": n,
                           "epoch": ep} for sd, doc, off, n, ep in spans],
            })
        return out

    def iter_batches(self, start_step: int = 0, end_step: Optional[int] = None) -> Iterator[Batch]:
        """Batches of steps [start_step, end_step), stopping early at the end
        of a bounded plan."""
        step = start_step
        while end_step is None or step < end_step:
            try:
                b = self.batch(step)
            except IndexError:
                if self.step_count is not None and step >= self.step_count:
                    return
                raise
            yield b
            step += 1

    # --- for the daemon ------------------------------------------------------
    def data_order_proto(self):
        """This order as a spikeguard.v1.DataOrder message (for Hello). The plan
        is not part of it; the daemon sends plans with its commands."""
        try:
            from spikeguard.v1 import worker_pb2
        except ImportError as e:
            raise ImportError(f"spikeguard.v1.worker_pb2 (generated stubs) is not available: {e}") from e
        msg = worker_pb2.DataOrder()
        msg.dataset_fingerprint = self._corpus.fingerprint
        msg.seed = self._seed
        msg.global_batch_size = self._global_batch_size
        msg.sequence_length = self._sequence_length
        for k, v in self._blend.items():
            msg.blend[k] = v
        return msg

    def __repr__(self) -> str:
        return (f"DataOrder(corpus={self._corpus.dir!r}, seed={self._seed}, "
                f"global_batch_size={self._global_batch_size}, "
                f"sequence_length={self._sequence_length}, blend={self._blend}, plan={self.plan!r})")



# --- any dataset ------------------------------------------------------------------


class Plan:
    """A data plan without a corpus: which data position each step consumes,
    which sample slots a mask drops. ``plan``: the text form ("0-600,610-",
    ";drop=300:0.1.5" masks), a ``spikeguard.v1.DataPlan`` message, another
    Plan, or ""/None for "0-" (every position once, in order). Normalized by
    the same C++ DataPlan the daemon uses (``text`` is its ToString)."""

    def __init__(self, plan=None):
        if isinstance(plan, Plan):
            plan = plan.text
        text = plan_text(plan) or _DEFAULT_PLAN
        self._text = text
        ranges_part, _, masks_part = text.partition(";")
        self._ranges: List[Tuple[int, int]] = []
        for item in ranges_part.split(","):
            if not item:
                continue
            b, _, e = item.partition("-")
            self._ranges.append((int(b), int(e) if e else -1))
        self._masks: Dict[int, List[int]] = {}
        for part in masks_part.split(";") if masks_part else ():
            key, _, value = part.partition("=")
            if key != "drop":
                raise ValueError(f"plan {text!r}: unknown part {part!r}")
            pos, _, slots = value.partition(":")
            self._masks[int(pos)] = sorted(int(x) for x in slots.split(".") if x)

    @property
    def text(self) -> str:
        return self._text

    @property
    def ranges(self) -> List[Tuple[int, int]]:
        """[(begin, end)], end exclusive, -1 = unbounded."""
        return list(self._ranges)

    @property
    def masks(self) -> Dict[int, List[int]]:
        """position → the sample slots dropped there."""
        return {k: list(v) for k, v in self._masks.items()}

    @property
    def step_count(self) -> Optional[int]:
        """Steps the plan feeds; None when unbounded."""
        n = 0
        for b, e in self._ranges:
            if e < 0:
                return None
            n += e - b
        return n

    def position_for_step(self, step: int) -> int:
        """The data position step `step` consumes; IndexError past a bounded plan."""
        step = _int_field("step", step, 0, 2**63 - 1)
        left = step
        for b, e in self._ranges:
            if e < 0 or left < e - b:
                return b + left
            left -= e - b
        raise IndexError(f"step {step} is past the end of plan {self._text!r} "
                         f"({self.step_count} steps)")

    def first_step_for_position(self, position: int) -> Optional[int]:
        """The first step that consumes `position` (None: no step does)."""
        step = 0
        for b, e in self._ranges:
            if position >= b and (e < 0 or position < e):
                return step + position - b
            if e < 0:
                return None
            step += e - b
        return None

    def checkpoint_position(self, step: int) -> int:
        """The data position a checkpoint taken before `step` (after steps
        0..step-1) stores: the one `step` consumes, -1 past the plan's end."""
        try:
            return self.position_for_step(step)
        except IndexError:
            return -1

    def dropped_slots(self, position: int) -> List[int]:
        """The sample slots of batch `position` the plan's mask drops ([] none)."""
        return list(self._masks.get(int(position), ()))

    def kept_slots(self, position: int, global_batch_size: int) -> List[int]:
        """The sample slots of batch `position` that are fed, in order."""
        dropped = set(self._masks.get(int(position), ()))
        return [j for j in range(int(global_batch_size)) if j not in dropped]

    def __eq__(self, other) -> bool:
        return isinstance(other, Plan) and other._text == self._text

    def __repr__(self) -> str:
        return f"Plan({self._text!r})"


@dataclasses.dataclass(frozen=True)
class SampleBatch:
    """What a PlanSampler fed this rank for one step."""

    step: int
    position: int
    slots: List[int]      # this rank's sample slots of the global batch
    indices: List[int]    # the dataset indices of those slots
    rows: int             # the global batch's fed rows (all ranks, after the mask)
    global_rows: int      # the global batch size


class PlanSampler:
    """A batch sampler (``DataLoader(ds, batch_sampler=...)``) feeding steps
    ``start_step, start_step + 1, ...`` of `plan` from a dataset of
    `num_samples` index-addressable samples: per step, this rank's dataset
    indices of the step's global batch (see the module doc). Iterating ends
    at `total_steps` (None: the plan's end, or never) — a loop normally
    stops by step count. ``state_dict()``/``load_state_dict()`` carry the next
    step and the plan; ``set_plan`` (REWIND) and ``set_step`` restart it.

    A re-created iterator starts at the sampler's current step; the step
    advances as batches are handed out, so a DataLoader with workers that
    prefetches must be re-created after set_step/set_plan (the high-level
    ``spikeguard.torch.Supervisor`` does)."""

    def __init__(self, num_samples, global_batch_size: int, *, rank: int = 0, world_size: int = 1,
                 plan=None, seed: int = 0, shuffle: bool = True, start_step: int = 0,
                 total_steps: Optional[int] = None):
        if hasattr(num_samples, "__len__"):
            num_samples = len(num_samples)
        self.num_samples = _int_field("num_samples", num_samples, 1, 2**62)
        self.global_batch_size = _int_field("global_batch_size", global_batch_size, 1, 2**31 - 1)
        shard_bounds(self.global_batch_size, rank, world_size)  # validates rank, world_size
        self.rank, self.world_size = int(rank), int(world_size)
        self.seed = _int_field("seed", seed, 0, 2**63 - 1)
        self.shuffle = bool(shuffle)
        self.plan = Plan(plan)
        self.step = _int_field("start_step", start_step, 0, 2**63 - 1)
        self.total_steps = None if total_steps is None else int(total_steps)
        self.last: Optional[SampleBatch] = None
        self._perm_epoch = -1
        self._perm = None
        self._memo = None

    # --- resolving ------------------------------------------------------------
    def _permutation(self, epoch: int):
        if epoch != self._perm_epoch:
            import torch
            if self.shuffle:
                g = torch.Generator()
                g.manual_seed((self.seed * 1000003 + epoch) % (2**63))
                self._perm = torch.randperm(self.num_samples, generator=g).tolist()
            else:
                self._perm = None
            self._perm_epoch = epoch
        return self._perm

    def index_of(self, position: int, slot: int) -> int:
        """The dataset index of sample `slot` of batch `position`."""
        k = int(position) * self.global_batch_size + int(slot)
        perm = self._permutation(k // self.num_samples)
        i = k % self.num_samples
        return perm[i] if perm is not None else i

    def global_indices(self, position: int) -> List[Tuple[int, int]]:
        """(slot, dataset index) of every fed sample of batch `position`."""
        return [(j, self.index_of(position, j))
                for j in self.plan.kept_slots(position, self.global_batch_size)]

    def batch_for_step(self, step: int) -> SampleBatch:
        # The last answer is kept: a loop asks for the step the loader is
        # about to feed, and the loader's iteration asks again.
        memo = self._memo
        if memo is not None and memo[0] == step and memo[1] is self.plan:
            return memo[2]
        position = self.plan.position_for_step(step)
        kept = self.global_indices(position)
        b, e = shard_bounds(len(kept), self.rank, self.world_size)
        mine = kept[b:e]
        batch = SampleBatch(step=int(step), position=position, slots=[j for j, _ in mine],
                            indices=[i for _, i in mine], rows=len(kept),
                            global_rows=self.global_batch_size)
        self._memo = (step, self.plan, batch)
        return batch

    # --- iterating --------------------------------------------------------------
    def _end(self) -> Optional[int]:
        ends = [x for x in (self.total_steps, self.plan.step_count) if x is not None]
        return min(ends) if ends else None

    def __iter__(self):
        while True:
            end = self._end()
            if end is not None and self.step >= end:
                return
            batch = self.batch_for_step(self.step)
            self.last = batch
            self.step += 1
            if batch.indices:
                yield batch.indices
            else:
                # A mask can leave this rank no row; a collate cannot make
                # an empty batch, so one placeholder row (the position's
                # first fed sample) comes instead: ``last.slots`` is empty,
                # and the trainer must feed zero rows (Supervisor does).
                yield [self.index_of(batch.position,
                                     self.plan.kept_slots(batch.position,
                                                          self.global_batch_size)[0])]

    def __len__(self) -> int:
        end = self._end()
        if end is None:
            raise TypeError("an unbounded PlanSampler has no length")
        return max(0, end - self.step)

    def set_step(self, step: int) -> None:
        self.step = _int_field("step", step, 0, 2**63 - 1)

    def set_plan(self, plan) -> None:
        self.plan = Plan(plan)

    def state_dict(self) -> dict:
        return {"step": self.step, "plan": self.plan.text, "seed": self.seed,
                "global_batch_size": self.global_batch_size, "num_samples": self.num_samples}

    def load_state_dict(self, state: dict) -> None:
        for k in ("seed", "global_batch_size", "num_samples"):
            if k in state and int(state[k]) != getattr(self, k):
                raise ValueError(f"sampler state: {k} {state[k]} is not this sampler's "
                                 f"{getattr(self, k)}")
        self.step = int(state["step"])
        self.plan = Plan(state.get("plan", ""))

    # --- for the daemon -----------------------------------------------------
    def documents_for(self, batch: Optional[SampleBatch] = None, document_of=None,
                      domain: str = "data") -> List[Tuple[str, int, int]]:
        """(domain, document id, sample slot) of every document this rank's
        part of `batch` (default: the last one handed out) holds, for
        StepReport.documents. document_of(index) → a document id, a (domain,
        id) pair or a list of those (default: the index is the document, in
        `domain`)."""
        batch = batch or self.last
        if batch is None:
            return []
        out = []
        for slot, index in zip(batch.slots, batch.indices):
            docs = index if document_of is None else document_of(index)
            if not isinstance(docs, list):
                docs = [docs]
            for d in docs:
                if isinstance(d, tuple):
                    out.append((str(d[0]), int(d[1]), slot))
                else:
                    out.append((domain, int(d), slot))
        return out
