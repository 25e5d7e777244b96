"""spikeguard.control: the daemon's commands in a (multi-rank) training loop.

The same behaviour towards spikeguardd as the C++ reference worker
(worker/ref/reference_worker.cc: HandleCommand, WaitForGo, Run):

- At every step boundary (or every ``exchange_every``-th, or about every
  ``exchange_interval_s`` seconds; with one rank, where it costs no
  collective, at every boundary, the piggyback's values still going at
  that cadence) rank 0 polls its Client; an all-reduce
  of four numbers tells every rank whether rank 0
  got commands or some rank was rejected, and only then are the commands
  broadcast over the process group (all_gather_object, which also carries
  every rank's rejection state), so every rank acts on the same commands at
  the same step (a periodic look's collective may finish at the next
  boundary, see ``async_looks``). The other ranks drain their own streams and
  ignore those copies. Every rank reports its own CommandResult on its own
  stream; a command id is executed at most once per rank (a re-sent one is
  answered "already executed").
- PAUSE holds before the next step; CONTINUE resumes and drops the horizon;
  STOP ends the loop; SET_HPARAMS changes the fields it sets; REWIND flushes
  the old generation, loads the checkpoint (through the trainer's callback),
  switches the data plan and generation, takes the command's horizon
  (stop_after_step) and its hparams ABSOLUTE over the configured base. A
  rewind that fails is answered ok=false with the error, and the worker
  pauses until the next command.
- REWIND's checkpoint_at_step asks for one checkpoint off the trainer's
  cadence: at that step of the new generation (the state before the step
  runs, i.e. after steps 0..s-1), saved and registered (CheckpointSaved) as
  a cadence checkpoint would be; the daemon starts later probes there.
  ``Controller.checkpoint_due(step)`` says when: the loop asks it after each
  trained step with the step it trains next, and saves when it or its
  cadence says so (once, when both do). It is True once, at that step only.
  Each successful REWIND replaces the request: 0, or a step not after the
  checkpoint it rewound to (that checkpoint exists), clears it. A failed or
  re-sent REWIND leaves it as it was (``Controller.checkpoint_at``: the
  step, -1 when none).
- A horizon: train up to and including stop_after_step, flush, wait for a
  command. The end of the schedule: flush, GenerationEnded once per
  generation, then linger up to linger_s for a command (none: the loop ends).
- Every command's pinned_uris replace the pins retention must keep
  (``Controller.pinned_uris``), and so does the daemon's answer to each
  checkpoint_saved (``Client.take_pins``): the run's pins, its rolling rewind
  target and the checkpoint just saved, so a trainer keeping one checkpoint
  never deletes every rewind target.

The lines a DDP training loop adds (worker/examples/torch_gpt/train.py is
the complete trainer):

    client = Client(addr, run, rank=rank, world_size=world, generation=gen,
                    resume_step=step, total_steps=N, data_order=order.data_order_proto())
    client.start()
    tel = Telemetry(model)                      # spikeguard.torch
    st = {"step": step, "order": order}
    def rewind(uri, plan, command):
        ck = load_checkpoint(uri, model=model, optimizer=opt,
                             checksum=command.checkpoint.checksum)
        st["step"] = ck["step"]
        st["order"] = order.with_plan(plan or ck.get("data_plan") or "")
    ctl = Controller(client, total_steps=N, get_step=lambda: st["step"], rewind=rewind,
                     rank=rank, world_size=world, generation=gen)
    while ctl.step_boundary():
        s = st["step"]; hp = ctl.hparams; hp.begin_step(s)
        lr = base_lr(s) * hp.lr_factor(s)
        hp.apply_to_optimizer(opt, lr, betas=(0.9, 0.999), eps=1e-8)
        tel.before_step()
        ... forward; tel.logits(logits); tel.losses(token_losses, domains); backward ...
        tel.after_backward(hp.clip(base_clip)); tel.before_optimizer_step()
        opt.step(); tel.after_optimizer_step()
        client.report(tel.report(s, batch.position, lr))
        st["step"] += 1
        due = ctl.checkpoint_due(st["step"])    # on every rank: it consumes the request
        if (due or st["step"] % K == 0) and rank == 0:
            info = save_checkpoint(dir, st["step"], generation=ctl.generation, model=model,
                                   optimizer=opt, data_position=..., data_plan=st["order"].plan)
            for gone in retain(dir, keep, pinned_uris=ctl.pinned_uris,
                               generation=ctl.generation):
                client.checkpoint_deleted(gone["step"], gone["uri"])
            client.checkpoint_saved(info["step"], info["uri"], ...)
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Callable, Iterable, List, Optional, Sequence

log = logging.getLogger("spikeguard.control")

# A look's head: rank 0's command count, a rejection, rank 0's flag, the
# rank's pace (seconds per boundary); reduced by maximum over the ranks.
_HEAD = 4

try:
    from spikeguard.v1 import worker_pb2
except ImportError:  # pragma: no cover
    worker_pb2 = None

__all__ = ["HParamState", "Controller", "plan_text", "RejectedError"]


class RejectedError(RuntimeError):
    """The daemon rejected a rank's stream (final)."""


def plan_text(data_plan) -> str:
    """A DataPlan proto as its text form "b-e,b-e,b-" (with ";drop=P:S.S"
    masks when it has any; "" without ranges), built by the C++ DataPlan
    through spikeguard.data when the binding is there."""
    if not len(data_plan.ranges):
        return ""
    try:
        from spikeguard.data import plan_text as _native_plan_text
    except ImportError:
        _native_plan_text = None
    if _native_plan_text is not None:
        return _native_plan_text(data_plan)
    if len(getattr(data_plan, "masks", ())):
        raise ValueError("a data plan with sample masks needs spikeguard.data")
    parts = []
    for r in data_plan.ranges:
        parts.append(f"{r.begin}-" if r.end < 0 else f"{r.begin}-{r.end}")
    return ",".join(parts)


@dataclasses.dataclass
class HParamState:
    """The supervisor's overrides over a trainer's configured hyperparameters
    (kernels::HParamOverrides). Saved with checkpoints (to_dict/from_dict)."""

    lr_scale: float = 1.0
    extra_warmup_steps: int = 0
    # The step the extra warmup ramps from; -1 = the next step trained.
    rewarm_start_step: int = -1
    clip_norm: Optional[float] = None
    beta2: Optional[float] = None
    eps: Optional[float] = None

    def apply(self, h) -> None:
        """Sets the fields a worker_pb2.HParams carries."""
        if h.HasField("lr_scale"):
            self.lr_scale = h.lr_scale
        if h.HasField("extra_warmup_steps"):
            self.extra_warmup_steps = h.extra_warmup_steps
            self.rewarm_start_step = h.warmup_start_step if h.HasField("warmup_start_step") else -1
        if h.HasField("clip_norm"):
            self.clip_norm = h.clip_norm
        if h.HasField("beta2"):
            self.beta2 = h.beta2
        if h.HasField("eps"):
            self.eps = h.eps

    def begin_step(self, step: int) -> None:
        """Call once before training `step`: pins an unset warmup start."""
        if self.extra_warmup_steps > 0 and self.rewarm_start_step < 0:
            self.rewarm_start_step = step

    def lr_factor(self, step: int) -> float:
        """lr_scale times the extra warmup's ramp at `step`."""
        f = 1.0
        if self.extra_warmup_steps > 0:
            start = step if self.rewarm_start_step < 0 else self.rewarm_start_step
            if step >= start:
                f = min(1.0, (step - start + 1) / self.extra_warmup_steps)
        return self.lr_scale * f

    def clip(self, base: Optional[float]) -> Optional[float]:
        return self.clip_norm if self.clip_norm is not None else base

    def apply_to_optimizer(self, optimizer, lr: float, *, betas=None, eps=None) -> None:
        """Sets lr, betas (β2 overridden) and eps on every param group;
        betas/eps are the configured base values (None: leave the group's)."""
        for g in optimizer.param_groups:
            g["lr"] = lr
            if "betas" in g:
                b1, b2 = betas if betas is not None else g["betas"]
                g["betas"] = (b1, self.beta2 if self.beta2 is not None else b2)
            if "eps" in g and (eps is not None or self.eps is not None):
                g["eps"] = self.eps if self.eps is not None else eps

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> "HParamState":
        if not d:
            return cls()
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


def _kind_name(kind: int) -> str:
    try:
        return worker_pb2.Command.Kind.Name(kind)
    except (ValueError, AttributeError):
        return str(kind)


class Controller:
    """Commands at step boundaries for one rank of a run (see the module doc).

    client: the rank's spikeguard.Client (None: no daemon; only the horizon
        and the schedule apply).
    total_steps: the schedule's length (steps [0, total_steps)).
    get_step: the next step the trainer will train.
    rewind: rewind(uri, plan_text, command) loads the checkpoint (model,
        optimizer, scheduler, RNG, step) and switches to the plan ("" = the
        default); raises on failure.
    on_hparams: called with the HParamState after SET_HPARAMS or REWIND.
    base_hparams: the configured base REWIND's hparams are absolute over.
    exchange_every: with several ranks, the boundaries between two looks
        for commands (1: every step). Each look is one all-reduce of four
        numbers; the commands themselves travel (all_gather_object) only
        when rank 0 has some. A command then takes effect up to
        exchange_every - 1 steps later, on every rank at the same step.
        While a horizon is set every boundary looks, so a probe's commands
        are not late.
    exchange_interval_s: with several ranks, look about this often in time
        instead: each look carries every rank's pace (seconds per boundary
        since its last look), and the next look comes after
        ceil(exchange_interval_s / the slowest pace) boundaries, at least
        ``min_exchange_every`` and at most exchange_every (the first look
        after min_exchange_every). Every rank computes the same distance
        from the same gathered numbers, so they still look at the same
        boundaries. Fast steps then pay for one look per interval, and slow
        ones get their commands (and the trainer its reports) a couple of
        steps late instead of exchange_every steps late. None: the fixed
        cadence.
    async_looks: with exchange_every > 1 and several ranks, a periodic look
        starts its collective at its boundary and finishes it at the next
        one (``finish_look``), so no rank waits for it; its commands then
        take effect one step later (up to exchange_every steps after they
        came), still on every rank at the same step. Looks while paused,
        under a horizon or at the end of the schedule finish at once.
    """

    def __init__(self, client, *, total_steps: int, get_step: Callable[[], int],
                 rewind: Optional[Callable] = None, rank: int = 0, world_size: int = 1,
                 group=None, generation: int = 0, stop_after_step: int = -1,
                 linger_s: float = 0.0, poll_interval_s: float = 0.2,
                 base_hparams: Optional[HParamState] = None,
                 on_hparams: Optional[Callable[[HParamState], None]] = None,
                 flush_timeout_s: float = 60.0, exchange_every: int = 1,
                 exchange_interval_s: Optional[float] = None, min_exchange_every: int = 2,
                 async_looks: bool = True):
        self.client = client
        self.total_steps = int(total_steps)
        self.get_step = get_step
        self._rewind = rewind
        self.rank = rank
        self.world_size = world_size
        self.group = group
        self.generation = int(generation)
        self.stop_after = int(stop_after_step) if stop_after_step is not None and stop_after_step >= 0 else -1
        self.linger_s = float(linger_s)
        self.poll_interval_s = float(poll_interval_s)
        self.base_hparams = dataclasses.replace(base_hparams) if base_hparams else HParamState()
        self.hparams = dataclasses.replace(self.base_hparams)
        self.on_hparams = on_hparams
        self.flush_timeout_s = flush_timeout_s
        # With several ranks: look for commands at every exchange_every-th
        # boundary only (they wait in the client meanwhile); at the others
        # no collective runs. Counted in boundaries, the same on every rank.
        self.exchange_every = max(1, int(exchange_every))
        self._boundaries = 0
        # The adaptive cadence (exchange_interval_s): the boundary of the
        # next periodic look, and where and when this rank's last look began
        # (its pace is measured from there).
        self.exchange_interval_s = (float(exchange_interval_s)
                                    if exchange_interval_s is not None else None)
        self.min_exchange_every = max(1, min(int(min_exchange_every), self.exchange_every))
        self._next_look = self.min_exchange_every
        self._look_boundary = 0
        self._look_clock = time.perf_counter()
        self.paused = False
        self.stopped = False
        self.ended_generation: Optional[int] = None
        self._pinned_uris: List[str] = []
        # How long retention waits for the daemon's answer to the last
        # checkpoint notice (pinned_uris).
        self.answer_wait_s = 10.0
        self._answers_missing = False
        # The step REWIND's checkpoint_at_step asked a checkpoint at (-1: none).
        self.checkpoint_at = -1
        self.executed: set = set()
        self.results: list = []  # (id, ok, message, step) as sent, for tests and logs
        # Values the trainer has every rank exchange at each look for
        # commands, before any command runs: an object with take() -> a 1-D
        # tensor (the same length on every rank) or None, and put(rows), rows
        # being every rank's tensors as [world, n] in rank order.
        self.piggyback = None
        # Periodic looks (exchange_every > 1, several ranks, no horizon)
        # start their collective at a boundary and finish it at the next
        # one, so no rank waits for it: their commands run one boundary
        # later. The look in flight, and the commands it brought.
        self.async_looks = bool(async_looks)
        self._inflight = None
        self._ready: list = []
        # Called before a command runs and before the client is flushed (a
        # horizon, the end of the schedule): the trainer finishes what it
        # does in the background (a checkpoint's write and registration), so
        # the daemon hears of it first.
        self.settle: Optional[Callable[[], None]] = None

    # ---- the exchange -------------------------------------------------------
    def _distributed(self) -> bool:
        if self.world_size <= 1:
            return False
        import torch.distributed as dist
        return dist.is_available() and dist.is_initialized()

    def _exchange(self, timeout: float, flag: bool = False, deliver: bool = True):
        """One round: rank 0's commands (and its `flag`) as every rank sees them."""
        self.finish_look()
        return self._end_exchange(self._begin_exchange(timeout, flag, deliver=deliver))

    def _begin_exchange(self, timeout: float, flag: bool = False, async_op: bool = False,
                        deliver: bool = True):
        """Polls, and starts the round's collective (async_op: without
        waiting for it; ``_end_exchange`` waits). deliver=False, with one
        rank only: the piggyback's pending values stay pending unless
        commands came (the look of a boundary between two periodic ones)."""
        mine: list = []
        rejection = None
        if self.client is not None:
            if self.rank == 0:
                c = self.client.poll_command(timeout=timeout)
                while c is not None:
                    mine.append(c.SerializeToString())
                    c = self.client.poll_command(timeout=0.0)
            else:
                # Rank 0's copy is the one acted on; ours are dropped.
                while self.client.poll_command(timeout=0.0) is not None:
                    pass
                if timeout > 0 and not self._distributed():
                    time.sleep(timeout)
            rej = getattr(self.client, "rejection", None)
            if rej is not None:
                rejection = str(getattr(rej, "message", "") or rej)
        x = {"mine": mine, "rejection": rejection, "flag": bool(flag), "work": None,
             "boundary": self._boundaries}
        if not self._distributed():
            if self.piggyback is not None and (deliver or mine or rejection is not None
                                               or flag):
                self._plan_next_look(self._boundaries, self._measure_pace())
                extra = self.piggyback.take()
                if extra is not None and extra.numel():
                    self.piggyback.put(extra.unsqueeze(0))
            return x
        import torch
        import torch.distributed as dist
        # A three-number all-reduce says whether there is anything to
        # exchange (rank 0's commands, a rejection, rank 0's flag); the
        # objects themselves travel only when there is.
        dev = self._collective_device()
        numbers = [len(mine), int(rejection is not None), int(bool(flag)), self._measure_pace()]
        extra = self.piggyback.take() if self.piggyback is not None else None
        if extra is not None and extra.numel():
            # The trainer's pending values ride along: one all_gather
            # of [head, values] instead of two collectives.
            vec = torch.cat([torch.tensor(numbers, dtype=torch.float64, device=dev),
                             extra.to(dev, torch.float64)])
            rows = [torch.empty_like(vec) for _ in range(self.world_size)]
            x["work"] = dist.all_gather(rows, vec, group=self.group, async_op=async_op)
            x["rows"] = rows
        else:
            head = torch.tensor(numbers, dtype=torch.float64, device=dev)
            x["work"] = dist.all_reduce(head, op=dist.ReduceOp.MAX, group=self.group,
                                        async_op=async_op)
            x["head"] = head
        x["distributed"] = True
        return x

    def _end_exchange(self, x):
        """The round's (commands, flag) on every rank, once its collective
        is done (raises RejectedError when some rank was rejected)."""
        mine, rejection, flag = x["mine"], x["rejection"], x["flag"]
        if x.get("distributed"):
            import torch
            import torch.distributed as dist
            if x["work"] is not None:
                x["work"].wait()
            if "rows" in x:
                allv = torch.stack(x["rows"])
                self.piggyback.put(allv[:, _HEAD:])
                n_commands, any_rejected, flag_set, pace = allv[:, :_HEAD].amax(0).tolist()
            else:
                n_commands, any_rejected, flag_set, pace = x["head"].tolist()
            n_commands, any_rejected, flag_set = int(n_commands), int(any_rejected), int(flag_set)
            self._plan_next_look(x["boundary"], pace)
            if n_commands == 0 and any_rejected == 0:
                commands, flag = [], bool(flag_set)
            else:
                payload = [None] * self.world_size
                dist.all_gather_object(payload, (mine, rejection, flag), group=self.group)
                commands, _, flag = payload[0]
                for r, (_, rej, _) in enumerate(payload):
                    if rej is not None:
                        raise RejectedError(f"rejected by spikeguardd (rank {r}): {rej}")
        else:
            commands = mine
            if rejection is not None:
                raise RejectedError(f"rejected by spikeguardd: {rejection}")
        out = []
        for blob in commands:
            c = worker_pb2.Command()
            c.ParseFromString(blob)
            out.append(c)
        return out, flag

    def deliver_piggyback(self) -> None:
        """Hands the piggyback's pending values over now, gathered from
        every rank (a collective with several ranks: every rank calls it at
        the same point; none runs when nothing is pending)."""
        vec = self.piggyback.take() if self.piggyback is not None else None
        if vec is None or not vec.numel():
            return
        if not self._distributed():
            self.piggyback.put(vec.unsqueeze(0))
            return
        import torch
        import torch.distributed as dist
        vec = vec.to(self._collective_device(), torch.float64)
        rows = [torch.empty_like(vec) for _ in range(self.world_size)]
        dist.all_gather(rows, vec, group=self.group)
        self.piggyback.put(torch.stack(rows))

    def _measure_pace(self) -> float:
        """This rank's seconds per boundary since its last look (0: no
        boundary passed, e.g. while paused: the cadence stays); this look
        is the next one's start."""
        now, passed = time.perf_counter(), self._boundaries - self._look_boundary
        pace = (now - self._look_clock) / passed if passed > 0 else 0.0
        self._look_boundary, self._look_clock = self._boundaries, now
        return pace

    def _plan_next_look(self, boundary: int, pace: float) -> None:
        """The boundary of the next periodic look under exchange_interval_s,
        from the look that began at `boundary` and the slowest rank's pace
        (the same numbers on every rank)."""
        if self.exchange_interval_s is None or not pace > 0 or not math.isfinite(pace):
            return
        gap = math.ceil(self.exchange_interval_s / pace) if self.exchange_interval_s > 0 else 1
        self._next_look = boundary + max(self.min_exchange_every, min(self.exchange_every, gap))

    def _look_due(self) -> bool:
        """Whether this boundary's periodic look is due (several ranks: the
        collective; one rank: the pending values' delivery)."""
        if self.exchange_interval_s is None:
            return self._boundaries % self.exchange_every == 0
        return self._boundaries >= self._next_look

    def finish_look(self) -> None:
        """Completes a look for commands started at the last boundary
        without waiting for its collective (see ``async_looks``): the
        piggybacked values are delivered now, its commands run at the next
        boundary. A collective on every rank, at the same point; the
        trainer calls it before a collective of its own between two
        boundaries."""
        x, self._inflight = self._inflight, None
        if x is not None:
            commands, _ = self._end_exchange(x)
            self._ready.extend(commands)

    def _collective_device(self):
        """Where the process group's tensors live: the current CUDA device
        under NCCL (torch.cuda.set_device(LOCAL_RANK) first), else the CPU."""
        import torch
        import torch.distributed as dist
        if dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _all_ok(self, ok: bool) -> bool:
        if not self._distributed():
            return ok
        import torch.distributed as dist
        payload = [None] * self.world_size
        dist.all_gather_object(payload, ok, group=self.group)
        return all(payload)

    # ---- commands --------------------------------------------------------------
    def _result(self, command_id: str, ok: bool, message: str) -> None:
        step = int(self.get_step())
        self.results.append((command_id, ok, message, step))
        if self.client is not None:
            self.client.command_result(command_id, ok, message, step=step)

    @property
    def pinned_uris(self) -> List[str]:
        """The checkpoints retention must keep: the last command's pins, or
        the daemon's newer answer to a checkpoint notice (the run's rolling
        rewind target and the checkpoint just saved among them). It first
        waits (up to ``answer_wait_s``) for the daemon to answer every
        checkpoint notice sent, so retention never deletes a checkpoint the
        daemon is about to pin."""
        wait = getattr(self.client, "await_checkpoint_answers", None)
        # A daemon that did not answer once is not waited for again until it
        # answers.
        if wait is not None and not self._answers_missing and not wait(self.answer_wait_s):
            self._answers_missing = True
            log.warning("spikeguard: no answer from spikeguardd to a checkpoint notice within "
                         "%.0f s; retention uses the pins it last sent", self.answer_wait_s)
        take = getattr(self.client, "take_pins", None)
        if take is not None:
            pins = take()
            if pins is not None:
                self._answers_missing = False
                self._pinned_uris = list(pins)
        return list(self._pinned_uris)

    @pinned_uris.setter
    def pinned_uris(self, uris) -> None:
        self._pinned_uris = list(uris)

    def handle(self, command) -> None:
        """Executes one command (at most once per id) and answers it."""
        if self.settle is not None:
            self.settle()
        cid = command.id
        if cid and cid in self.executed:
            self._result(cid, True, "already executed")
            return
        self.pinned_uris = list(command.pinned_uris)
        kind = command.kind
        log.info("rank %d: executing command %s (%s) at step %d", self.rank, cid,
                 _kind_name(kind), self.get_step())
        K = worker_pb2.Command
        ok, message = True, "ok"
        if kind == K.PAUSE:
            self.paused = True
        elif kind == K.CONTINUE:
            self.paused = False
            self.stop_after = -1
        elif kind == K.STOP:
            self.stopped = True
        elif kind == K.SET_HPARAMS:
            self.hparams.apply(command.hparams)
            if self.on_hparams:
                self.on_hparams(self.hparams)
        elif kind == K.REWIND:
            ok, message = self._do_rewind(command)
        else:
            ok, message = False, f"unknown command kind {int(kind)}"
        if cid:
            self.executed.add(cid)
            self._result(cid, ok, message)
        if not ok:
            log.error("rank %d: command %s failed: %s", self.rank, cid, message)

    def _do_rewind(self, command):
        # The steps trained since the last look belong to the old
        # generation: delivered in it, not after the rewind in the new one
        # (where their steps, past the rewind's, would come first).
        self.finish_look()
        self.deliver_piggyback()
        if self.client is not None:
            try:
                self.client.flush(timeout=30.0)  # the old generation's reports first
            except Exception as e:  # a flush that times out is not the rewind's failure
                log.warning("flush before rewind: %s", e)
        uri = command.checkpoint.uri
        error = None
        try:
            plan = plan_text(command.data_plan)
            if self._rewind is None:
                raise RuntimeError("this trainer cannot rewind")
            self._rewind(uri, plan, command)
        except Exception as e:  # noqa: BLE001 - any failure is reported, not raised
            error = f"rewind to {uri} failed: {e}"
        if not self._all_ok(error is None):
            if error is None:
                error = f"rewind to {uri} failed on another rank"
        if error is not None:
            # Going on in the old generation would train where nobody expects
            # it: hold until the daemon says what next.
            self.paused = True
            return False, error
        self.generation = int(command.new_generation)
        if self.client is not None:
            self.client.set_generation(self.generation)
        self.stop_after = command.stop_after_step if command.stop_after_step > 0 else -1
        # A checkpoint the daemon asked for off the cadence (where a probe
        # window starts): due once this generation gets there. Stubs older
        # than the field cannot carry it.
        at = int(getattr(command, "checkpoint_at_step", 0))
        self.checkpoint_at = at if at > self.get_step() else -1
        self.paused = False
        self.hparams = dataclasses.replace(self.base_hparams)
        self.hparams.apply(command.hparams)
        if self.on_hparams:
            self.on_hparams(self.hparams)
        return True, "ok"

    # ---- the loop ------------------------------------------------------------
    def checkpoint_due(self, step: Optional[int] = None) -> bool:
        """True when the checkpoint of `step` (default: get_step(), the next
        step to train) is the one the last REWIND asked for with
        checkpoint_at_step: save and register it, besides the cadence. True
        once: the request is consumed, so ask once per step, on every rank
        (the ranks stay in step; only the saving rank acts on it)."""
        if self.checkpoint_at < 0:
            return False
        if step is None:
            step = self.get_step()
        if int(step) != self.checkpoint_at:
            return False
        self.checkpoint_at = -1
        return True

    def _past_horizon(self) -> bool:
        return self.stop_after >= 0 and self.get_step() > self.stop_after

    def _flush(self) -> None:
        if self.settle is not None:
            self.settle()
        if self.client is not None:
            self.client.flush(timeout=self.flush_timeout_s)

    def step_boundary(self) -> bool:
        """Between steps: runs the commands that came, waits while paused or
        past the horizon, handles the end of the schedule. True: train the
        step get_step() now; False: the loop ends (STOP, no daemon and done,
        or no command while lingering)."""
        while True:
            if self.client is None:  # the same on every rank: no exchange needed
                return not (self.stopped or self._past_horizon()
                            or self.get_step() >= self.total_steps)
            self._boundaries += 1
            # The look started at the last boundary: its commands run now.
            self.finish_look()
            ready, self._ready = self._ready, []
            for c in ready:
                self.handle(c)
            due = (self.exchange_every <= 1 or self._look_due() or self.stop_after >= 0
                   or self.get_step() >= self.total_steps)
            distributed = self._distributed()
            if (due and distributed and self.async_looks and self.exchange_every > 1
                    and self.stop_after < 0 and not self.paused and not self.stopped
                    and self.get_step() < self.total_steps):
                self._inflight = self._begin_exchange(0.0, async_op=True)
            elif due or not distributed:  # one rank polls at every boundary
                commands, _ = self._exchange(0.0, deliver=due)
                for c in commands:
                    self.handle(c)
            if not self.stopped and self._past_horizon():
                self._flush()
            while not self.stopped and (self.paused or self._past_horizon()):
                commands, _ = self._exchange(self.poll_interval_s)
                for c in commands:
                    self.handle(c)
            if self.stopped:
                return False
            step = self.get_step()
            if step < self.total_steps:
                return True
            # The end of the schedule: deliver, say so once, linger.
            self._flush()
            if self.ended_generation != self.generation:
                reason = f"end of training schedule (steps={self.total_steps})"
                if self.stop_after >= step:
                    reason += f" before the horizon at step {self.stop_after}"
                log.info("rank %d: generation %d ended at step %d: %s", self.rank,
                         self.generation, step - 1, reason)
                self.client.generation_ended(self.generation, step - 1, reason)
                self.ended_generation = self.generation
                self._flush()
            deadline = time.monotonic() + self.linger_s
            handled = False
            while not handled:
                left = deadline - time.monotonic()
                expired = self.rank == 0 and left <= 0
                # Rank 0 waits for a command no longer than the linger time
                # left (none: it only takes what already came), so a loop
                # with linger_s=0 ends without a poll interval's wait.
                wait = min(self.poll_interval_s, max(0.0, left)) if self.rank == 0 \
                    else self.poll_interval_s
                commands, expired = self._exchange(wait, flag=expired)
                for c in commands:
                    self.handle(c)
                    handled = True
                if handled:
                    break
                if expired:
                    return False
            # A command came: go round again (a rewind moved the step back,
            # a stop ends, a pause waits).
