"""spikeguard.supervise: a PyTorch training loop under spikeguard in a few lines.

``Supervisor`` wraps what a loop needs from spikeguard: the data order of the
daemon's plan for any index-addressable dataset (``spikeguard.data``'s
PlanSampler), per-step telemetry (``spikeguard.torch.Telemetry``), the
daemon's commands (``spikeguard.control.Controller``: rewinds, horizons,
hyperparameter overrides, pause/stop), checkpoints (save on a cadence and
when the daemon asks, retention with the daemon's pins, registration) and
resuming. A plain DDP loop changes like this
(worker/examples/own_data/plain.py → supervised.py)::

    from spikeguard.supervise import Supervisor
    sg = Supervisor(ddp, opt, dataset, global_batch_size=B, steps=N, seed=0)
    for step, (x, y) in sg.steps():               # replaces the epoch/loader loops
        logits = ddp(x)
        loss = sg.cross_entropy(logits, y)        # or sg.loss(per-token losses), below
        opt.zero_grad(); loss.backward(); opt.step()
    sg.close()

What it does around the user's lines:

- ``steps()`` yields ``(step, batch)`` for the steps the daemon lets run:
  the batch is ``DataLoader(dataset, batch_sampler=sg.sampler)``'s item
  (``make_loader`` builds another loader over the same sampler); after a
  rewind the loader is re-created at the checkpoint's step and plan.
- ``cross_entropy(logits, targets, domains=None)`` is
  ``loss(F.cross_entropy(..., reduction="none"))`` with the output
  log-sum-exp read from the loss's log-probabilities (no second pass over
  the logits, see ``spikeguard.torch.Telemetry.cross_entropy``).
- ``loss(token_losses, domains=None)`` records the per-token losses
  (``[rows, ...]``, reduction="none") and returns the objective whose DDP
  average is the global batch's mean (also with masked or empty shards).
- ``opt.step`` is wrapped: gradient statistics and clipping (``clip_norm``;
  the daemon's override wins), the daemon's lr scale / extra warmup / β2 /
  ε applied for this step only (the user's own lr schedule stays the base),
  update statistics (update-to-weight ratio and parameter norm per layer:
  measured every ``update_every`` steps, at the steps that are multiples of
  it and at the first step after a start or a rewind; the reports between
  repeat the last measurement, see ``spikeguard.torch.Telemetry``).
- The model's output (a tensor, or the first of a tuple) is taken as the
  logits for the log-sum-exp statistics (by a forward hook, until the loop
  uses ``cross_entropy``, which takes them over); ``logits=False`` turns
  that off.

Settings come from arguments or, where an argument is None, from the
environment the daemon's launcher sets: SPIKEGUARD_ADDR, SPIKEGUARD_RUN,
SPIKEGUARD_GENERATION (the launcher always sets these), and from the launch
profile: SPIKEGUARD_RESUME (a checkpoint path/URI, or "newest"),
SPIKEGUARD_PLAN (a data plan's text), SPIKEGUARD_CHECKPOINT_DIR. Without an
address and a run there is no daemon: the loop runs its schedule (still
under the plan, with checkpoints when a directory is set).

Each step's documents are reported with their sample slot (by default the
dataset index is the document id, in domain "data"; ``document_of(index)``
names others), so the daemon can bisect a culprit batch down to its
documents on any dataset.

Cost per step: no collective and no host transfer of its own. Each step's
statistics stay on the device; about once per ``exchange_interval_s`` (1 s)
of training one all-gather carries both the look for commands (four
numbers) and the pending steps' statistics, which then reach the host in
one transfer and go to the client (one rank: no all-gather; commands are
polled at every step, the statistics still go at the looks). The looks' distance in steps follows
the pace every rank measured (Controller's ``exchange_interval_s``): at
least 2 and at most ``exchange_every`` (20) steps apart, the same steps on
every rank; None looks every ``exchange_every`` steps. The all-gather
starts at its boundary and is finished at the next one, so no rank waits
for it (Controller's ``async_looks``): reports are up to one look's
distance late, and the daemon's commands take effect as late, on every
rank at the same step (at once while a probe's horizon is set); before a
rewind the steps trained since the last look are reported, in the
generation that trained them. Before a checkpoint is saved the pending
reports are sent first (one more all-gather), so the daemon gets a
checkpoint after the reports of the steps before it; the checkpoint itself is written,
retained and registered on a thread (``background_checkpoints``) at the
lowest CPU priority (``checkpoint_nice``, 19 by default; None keeps the
trainer's), so where training keeps every core busy the writes take the
time the ranks spend waiting on each other rather than theirs. The
client's threads keep the trainer's priority unless ``client_nice`` is
given: unlike the writer, which hashes and writes without the interpreter
lock, they hold it for nearly all their work, and a low-priority thread
descheduled while holding it stalls the training thread. The update
statistics are measured every ``update_every`` steps.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

from spikeguard import checkpoint as sgckpt
from spikeguard._priority import lower_thread_priority
from spikeguard.control import Controller, HParamState
from spikeguard.data import Plan, PlanSampler

log = logging.getLogger("spikeguard.supervise")

# Seconds Supervisor.close() leaves the CPU to the process group's threads
# (see there).
_COLLECTIVE_DRAIN_S = 0.1

__all__ = ["Supervisor"]


def _env(value, name, default=None):
    if value is not None:
        return value
    v = os.environ.get(name, "")
    return v if v != "" else default


def _no_rows(data):
    """`data` (a collated batch) with zero rows, keeping its structure."""
    if torch.is_tensor(data):
        return data[:0]
    if isinstance(data, (list, tuple)):
        return type(data)(_no_rows(x) for x in data)
    if isinstance(data, dict):
        return {k: _no_rows(v) for k, v in data.items()}
    return data


class _BackgroundWriter:
    """Runs one job at a time on a thread (rank 0's checkpoint writes and
    registrations, in order); wait() finishes the running one and raises
    what it raised. ``nice``: the thread's CPU priority (Linux: a thread has
    its own nice value), lowered so that where every core is busy training
    the writes take the time the training threads leave idle rather than
    theirs; None leaves it. ``cpu_s``: the CPU seconds the jobs took."""

    def __init__(self, nice: Optional[int] = None):
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self.nice = nice
        self.cpu_s = 0.0

    def submit(self, job: Callable[[], None]) -> None:
        self.wait()

        def run():
            c0 = time.thread_time()
            try:
                if self.nice is not None:
                    lower_thread_priority(self.nice)
                job()
            except BaseException as e:  # noqa: BLE001 - raised again by wait()
                log.error("spikeguard: checkpoint written in the background failed: %s", e)
                self._error = e
            finally:
                self.cpu_s += time.thread_time() - c0

        self._thread = threading.Thread(target=run, name="spikeguard-checkpoint", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        t, self._thread = self._thread, None
        if t is not None:
            t.join()
        if self._error is not None:
            e, self._error = self._error, None
            raise e


class Supervisor:
    """One rank's training loop under spikeguard (see the module doc).

    model: the module the loop calls (a DDP wrapper is fine).
    optimizer: its optimizer (``step`` is wrapped).
    dataset: index-addressable (``__len__``, ``__getitem__``); the sampler
        draws global batches of ``global_batch_size`` samples from it.
    steps: the schedule's length.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, dataset, *,
                 global_batch_size: int, steps: int, seed: int = 0, shuffle: bool = True,
                 checkpoint_dir: Optional[str] = None, checkpoint_every: int = 50,
                 keep_checkpoints: int = 3, clip_norm: Optional[float] = None,
                 addr: Optional[str] = None, run: Optional[str] = None,
                 generation: Optional[int] = None, resume: Optional[str] = None,
                 plan: Optional[str] = None, telemetry: bool = True, logits: bool = True,
                 domain_names=None, document_of: Optional[Callable] = None,
                 document_domain: str = "data", exchange_every: int = 20,
                 exchange_interval_s: Optional[float] = 1.0,
                 update_every: int = 10, background_checkpoints: bool = True,
                 checkpoint_nice: Optional[int] = 19, client_nice: Optional[int] = None,
                 linger_s: float = 0.0, config_fingerprint: str = "",
                 make_loader: Optional[Callable] = None, client=None):
        from spikeguard.torch import Telemetry, _unwrap

        self.model = model
        self.module = _unwrap(model)
        self.optimizer = optimizer
        self.dataset = dataset
        self.total_steps = int(steps)
        self.clip_norm = clip_norm
        self.document_of = document_of
        self.document_domain = document_domain
        self.make_loader = make_loader
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if distributed else 0
        self.world_size = dist.get_world_size() if distributed else 1
        self.local_rank = int(os.environ.get("LOCAL_RANK", str(self.rank)))
        self.device = next(self.module.parameters()).device
        self.checkpoint_dir = _env(checkpoint_dir, "SPIKEGUARD_CHECKPOINT_DIR", "")
        self.checkpoint_every = int(checkpoint_every)
        self.keep_checkpoints = int(keep_checkpoints)
        self.generation = int(_env(generation, "SPIKEGUARD_GENERATION", 0))
        self.step = 0
        self.hparams = HParamState()
        self.sampler = PlanSampler(dataset, global_batch_size, rank=self.rank,
                                   world_size=self.world_size, seed=seed, shuffle=shuffle,
                                   plan=_env(plan, "SPIKEGUARD_PLAN", ""))
        self.telemetry = (Telemetry(model, domain_names=domain_names, update_every=update_every)
                          if telemetry else None)
        self._lr = 0.0
        # Seconds spent in spikeguard per component (see timings()).
        self._seconds = {"commands": 0.0, "telemetry_forward": 0.0, "telemetry_optimizer": 0.0,
                         "report": 0.0, "checkpoints": 0.0}
        self._steps_done = 0
        # SPIKEGUARD_TELEMETRY_JSONL: each step's StepReport as a JSON line (rank-suffixed).
        path = os.environ.get("SPIKEGUARD_TELEMETRY_JSONL", "")
        self._jsonl = open(f"{path}.rank{self.rank}", "a") if path else None
        self._restart = True
        self._batch = None
        self._hooks = []
        # Whether the training steps' logits are recorded (log-sum-exp).
        self._record_logits = bool(telemetry) and bool(logits)
        # True once the loop computes its loss with cross_entropy(), which
        # then records the output log-sum-exp instead of the forward hook.
        self._lse_from_loss = False
        self.background_checkpoints = bool(background_checkpoints)
        self._writer = _BackgroundWriter(nice=checkpoint_nice)
        self._checkpoint_buffers: dict = {}
        if self._record_logits:
            self._hooks.append(self.module.register_forward_hook(self._logits_hook))
        self._wrap_optimizer()
        if self.checkpoint_dir and self.rank == 0:
            os.makedirs(self.checkpoint_dir, exist_ok=True)
            sgckpt.clean_temporaries(self.checkpoint_dir)

        resume = _env(resume, "SPIKEGUARD_RESUME", "")
        if resume == "newest":
            newest = (sgckpt.latest_checkpoint(self.checkpoint_dir, rank=0)
                      if self.checkpoint_dir else None)
            if newest is not None:
                self._load(newest["path"], _env(plan, "SPIKEGUARD_PLAN", ""))
        elif resume:
            self._load(resume, _env(plan, "SPIKEGUARD_PLAN", ""))

        addr = _env(addr, "SPIKEGUARD_ADDR")
        run = _env(run, "SPIKEGUARD_RUN")
        self.client = client
        if self.client is None and addr and run:
            from spikeguard import Client
            self.client = Client(addr, run, rank=self.rank, world_size=self.world_size,
                                 generation=self.generation, device_id=self.local_rank,
                                 config_fingerprint=config_fingerprint, resume_step=self.step,
                                 total_steps=self.total_steps, nice=client_nice)
            self.client.start()
        self.controller = Controller(
            self.client, total_steps=self.total_steps, get_step=lambda: self.step,
            rewind=self._rewind, rank=self.rank, world_size=self.world_size,
            generation=self.generation, linger_s=float(_env(None, "SPIKEGUARD_LINGER_S", linger_s)),
            exchange_every=exchange_every, exchange_interval_s=exchange_interval_s,
            on_hparams=self._set_hparams)
        self.controller.hparams = self.hparams
        self.controller.settle = self.wait_checkpoints
        self.exchange_every = max(1, int(exchange_every))
        self._pending = []
        self._taken = []
        if self.telemetry is not None:
            self.controller.piggyback = self
        log.info("rank %d/%d: steps %d..%d, generation %d, plan %s", self.rank, self.world_size,
                 self.step, self.total_steps, self.generation, self.sampler.plan.text)

    # ---- the loop --------------------------------------------------------------
    def steps(self):
        """(step, batch) for each step to train; ends at the schedule's end,
        on STOP, or when lingering for a command finds none."""
        it = None
        clock = time.perf_counter
        try:
            while True:
                t, reported = clock(), self._seconds["report"]
                go = self.controller.step_boundary()
                # The reports resolved during the look count as report time.
                self._seconds["commands"] += clock() - t - (self._seconds["report"] - reported)
                if not go:
                    self._flush_reports()
                    break
                self.generation = self.controller.generation
                if self._restart or it is None:
                    self.sampler.set_step(self.step)
                    it = iter(self._loader())
                    self._restart = False
                self._batch = self.sampler.batch_for_step(self.step)
                if self.telemetry is not None:
                    self.telemetry.before_step()
                data = next(it)
                if not self._batch.slots:
                    data = _no_rows(data)  # the sampler's placeholder row, dropped
                yield self.step, data
                self._end_step()
        except GeneratorExit:  # the loop left early (on every rank)
            self._flush_reports()
            raise
        finally:
            self.wait_checkpoints()
            if self.client is not None:
                self.client.flush(timeout=60.0)

    def _loader(self):
        if self.make_loader is not None:
            return self.make_loader(self.sampler)
        return torch.utils.data.DataLoader(self.dataset, batch_sampler=self.sampler)

    def loss(self, token_losses: torch.Tensor, domains: Optional[torch.Tensor] = None):
        """The objective to backpropagate from this rank's per-token losses
        (reduction="none"; [rows, T] or flattened): their sum × world size /
        the global batch's tokens, so DDP's average is the global mean (also
        when a mask leaves this rank fewer rows, or none)."""
        b = self._batch
        local_rows = len(b.slots) if b is not None else max(1, token_losses.size(0))
        per_row = token_losses.numel() // local_rows if local_rows else 0
        rows = b.rows if b is not None else local_rows
        if self.telemetry is not None:
            t = time.perf_counter()
            shaped = token_losses.reshape(local_rows, per_row) if local_rows else token_losses
            self.telemetry.losses(shaped, domains)
            self._seconds["telemetry_forward"] += time.perf_counter() - t
        return token_losses.sum() * (self.world_size / max(1, rows * per_row))

    def cross_entropy(self, logits: torch.Tensor, targets: torch.Tensor,
                      domains: Optional[torch.Tensor] = None, *, ignore_index: int = -100):
        """``loss(F.cross_entropy(logits, targets, reduction="none"))`` for
        logits [rows, T, V] (or [rows, V]) and targets [rows, T] (or
        [rows]): the same losses and gradients, and the output log-sum-exp
        taken from the loss's own log-probabilities instead of a second
        pass over the logits (``Telemetry.cross_entropy``)."""
        V = logits.size(-1)
        x, y = logits.reshape(-1, V), targets.reshape(-1)
        # What the forward hook would record (a training step's logits).
        record = self._record_logits and self.module.training and self._batch is not None
        if record and self._lse_from_loss:
            # Telemetry.cross_entropy's operations, timed without the loss.
            logp = torch.nn.functional.log_softmax(x, dim=-1)
            ce = torch.nn.functional.nll_loss(logp, y, reduction="none",
                                              ignore_index=ignore_index)
            t = time.perf_counter()
            self.telemetry.log_probs(x, y, logp, ignore_index=ignore_index)
            self._seconds["telemetry_forward"] += time.perf_counter() - t
        else:
            # Without the logits' statistics (telemetry or logits off, or
            # not training), or the first time, when the forward hook has
            # recorded these logits already (from the next forward on it
            # leaves them here).
            ce = torch.nn.functional.cross_entropy(x, y, reduction="none",
                                                   ignore_index=ignore_index)
            if record and not self._lse_from_loss:
                self._lse_from_loss = True
                # From now on the hook would only return: removed, so the
                # model's call takes the module's path without hooks.
                for h in self._hooks:
                    h.remove()
                self._hooks = []
        return self.loss(ce.view(targets.shape), domains)

    def _end_step(self) -> None:
        b = self._batch
        t = time.perf_counter()
        if self.telemetry is not None:
            # Staged on the device; reported at the next look for commands
            # (or before a checkpoint), several steps in one transfer.
            docs = self.sampler.documents_for(b, self.document_of, self.document_domain)
            self._pending.append(self.telemetry.stage(self.step, b.position, self._lr,
                                                      documents=docs))
        self.step += 1
        self._steps_done += 1
        due = self.controller.checkpoint_due(self.step)  # every rank: it consumes the request
        save = bool(self.checkpoint_dir) and (due or (self.checkpoint_every > 0
                                                      and self.step % self.checkpoint_every == 0))
        if self._pending and (save or (self.client is None
                                       and len(self._pending) >= self.exchange_every)):
            # The same decision on every rank: the reports before the
            # checkpoint's registration (without a daemon: every few steps).
            self._flush_reports()
        t2 = time.perf_counter()
        self._seconds["report"] += t2 - t
        if save:
            self.save()
        self._seconds["checkpoints"] += time.perf_counter() - t2

    # ---- staged reports ------------------------------------------------------------
    def take(self):
        """For the Controller (piggyback): the pending steps' values to
        reduce; the steps are reported by the next ``put``."""
        if not self._pending:
            return None
        self._taken, self._pending = self._pending, []
        return self.telemetry.reduced_of(self._taken)

    def put(self, rows) -> None:
        """For the Controller: every rank's values ([world, n]) of the steps
        the last ``take`` took; reports them."""
        t = time.perf_counter()
        pending, self._taken = self._taken, []
        reports = self.telemetry.resolve(pending, gathered=rows)
        if self._jsonl is not None:
            from spikeguard.torch import report_json
            for report in reports:
                self._jsonl.write(json.dumps(report_json(report, self.telemetry.attention_kind))
                                  + "\n")
        if self.client is not None:
            self.client.report_many(reports)  # sent at once: the steps are already late
            self.client.set_current_step(reports[-1].step)
        self._seconds["report"] += time.perf_counter() - t

    def _flush_reports(self) -> None:
        """Reports every pending step now (a collective with several ranks:
        every rank calls it at the same point)."""
        self.controller.finish_look()  # a look in flight reports its steps first
        self.controller.deliver_piggyback()

    def timings(self) -> dict:
        """Milliseconds per trained step spent in spikeguard, per component:
        commands (step boundaries), telemetry_activations (the layers'
        forward hooks: activation norms), telemetry_forward (logit and loss
        statistics), telemetry_optimizer (gradient/update statistics and
        clipping), report (staging each step's statistics, and for the
        pending steps the reduction, the host transfer, the StepReports and
        their hand-over to the client), checkpoints (on the training thread:
        copying the state, and waiting for the previous checkpoint's write;
        with background_checkpoints=False the write, retention and
        registration too). Time on other threads is not counted in these;
        checkpoint_writer_cpu is the CPU time of the background checkpoint
        writer's thread (serializing, hashing, writing, retention and
        registration), per trained step. The client's connection thread is
        not counted."""
        n = max(1, self._steps_done)
        seconds = dict(self._seconds,
                       telemetry_activations=(self.telemetry.hook_seconds
                                              if self.telemetry is not None else 0.0),
                       checkpoint_writer_cpu=self._writer.cpu_s)
        return {k: 1000.0 * v / n for k, v in seconds.items()}

    # ---- the optimizer -----------------------------------------------------------
    def _wrap_optimizer(self) -> None:
        opt = self.optimizer
        inner = opt.step

        def step(*args, **kwargs):
            hp, s, tel = self.hparams, self.step, self.telemetry
            t0 = time.perf_counter()
            hp.begin_step(s)
            clip = hp.clip(self.clip_norm)
            if tel is not None:
                tel.after_backward(clip, sync=False)
            elif clip:
                torch.nn.utils.clip_grad_norm_(self.module.parameters(), clip)
            factor = hp.lr_factor(s)
            # The daemon's overrides hold for this step only (restored below).
            override = factor != 1.0 or hp.beta2 is not None or hp.eps is not None
            saved = [(g.get("lr"), g.get("betas"), g.get("eps"))
                     for g in opt.param_groups] if override else []
            for g in opt.param_groups if override else ():
                g["lr"] = g["lr"] * factor
                if hp.beta2 is not None and "betas" in g:
                    g["betas"] = (g["betas"][0], hp.beta2)
                if hp.eps is not None and "eps" in g:
                    g["eps"] = hp.eps
            self._lr = float(opt.param_groups[0]["lr"]) if opt.param_groups else 0.0
            try:
                if tel is not None:
                    tel.before_optimizer_step(s)
                t1 = time.perf_counter()
                out = inner(*args, **kwargs)
                t2 = time.perf_counter()
                if tel is not None:
                    tel.after_optimizer_step()
                self._seconds["telemetry_optimizer"] += (t1 - t0) + (time.perf_counter() - t2)
            finally:
                for g, (lr, betas, eps) in zip(opt.param_groups, saved):
                    g["lr"] = lr
                    if betas is not None:
                        g["betas"] = betas
                    if eps is not None:
                        g["eps"] = eps
            return out

        opt.step = step

    def _logits_hook(self, _module, _inputs, output):
        out = output[0] if isinstance(output, (tuple, list)) else output
        if self._batch is not None and torch.is_tensor(out) and out.dim() >= 2 \
                and self.module.training and not self._lse_from_loss:
            t = time.perf_counter()
            self.telemetry.logits(out)
            self._seconds["telemetry_forward"] += time.perf_counter() - t

    # ---- checkpoints and rewinds ---------------------------------------------------
    def _set_hparams(self, hp: HParamState) -> None:
        self.hparams = hp

    def _load(self, path: str, plan_override: str = "", checksum: str = "") -> None:
        self.wait_checkpoints()
        state = sgckpt.load_checkpoint(path, model=self.module, optimizer=self.optimizer,
                                       map_location=self.device, checksum=checksum or None)
        extra = state.get("extra") or {}
        plan = plan_override or state.get("data_plan") or extra.get("plan", "")
        self.sampler.set_plan(plan)
        self.step = int(state["step"])
        self.sampler.set_step(self.step)
        self.hparams = HParamState.from_dict(extra.get("hparams"))
        if self.telemetry is not None:
            self.telemetry.forget_updates()
        if hasattr(self, "controller"):
            self.controller.hparams = self.hparams
        self._restart = True
        log.info("rank %d: loaded checkpoint %s (step %d, plan %s)", self.rank, path, self.step,
                 self.sampler.plan.text)

    def _rewind(self, uri: str, plan: str, command=None) -> None:
        self._load(uri, plan, command.checkpoint.checksum if command is not None else "")
        if command is not None:
            self.generation = int(command.new_generation)

    def save(self) -> None:
        """Rank 0 saves the checkpoint of self.step (steps 0..step-1 done),
        applies retention (never a pinned checkpoint) and registers both.

        With background_checkpoints (the default) only the state is copied
        here (into host buffers kept from one checkpoint to the next); the
        file (serialized, hashed, fsynced), the retention and the
        registration follow on a thread while training goes on, one
        checkpoint at a time and in order. ``wait_checkpoints()`` waits for
        them; the Supervisor does before the next checkpoint, before a
        command runs, before the client is flushed (a horizon, the end of
        the schedule, the loop's end) and before loading a checkpoint."""
        if self.rank != 0 or not self.checkpoint_dir:
            return
        self.wait_checkpoints()
        plan: Plan = self.sampler.plan
        position = plan.checkpoint_position(self.step)
        extra = {"generation": self.generation, "plan": plan.text,
                 "hparams": self.hparams.to_dict(), "sampler": self.sampler.state_dict()}
        background = self.background_checkpoints
        captured = sgckpt.capture_checkpoint(
            self.step, generation=self.generation, model=self.module, optimizer=self.optimizer,
            data_position=position, extra=extra, data_plan=plan.text, copy=background,
            buffers=self._checkpoint_buffers)
        directory, generation, keep = self.checkpoint_dir, self.generation, self.keep_checkpoints

        def finish():
            info = sgckpt.write_checkpoint(directory, captured)
            deleted = sgckpt.retain(directory, keep, pinned_uris=self.controller.pinned_uris,
                                    generation=generation)
            client = self.client
            if client is not None:
                for gone in deleted:
                    client.checkpoint_deleted(gone["step"], gone["uri"])
                client.checkpoint_saved(info["step"], info["uri"], data_position=position,
                                        size_bytes=info["bytes"], checksum=info["checksum"],
                                        complete=True)

        if background:
            self._writer.submit(finish)
        else:
            finish()

    def wait_checkpoints(self) -> None:
        """Returns once the checkpoints saved so far are written, retained
        and registered (raises what a background write raised)."""
        self._writer.wait()

    def close(self) -> None:
        self.wait_checkpoints()
        out = os.environ.get("SPIKEGUARD_TIMINGS_OUT", "")
        if out:  # for benchmarks: this rank's timings() as JSON
            with open(f"{out}.rank{self.rank}.json", "w") as f:
                json.dump({"steps": self._steps_done, "ms_per_step": self.timings()}, f)
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self.telemetry is not None:
            self.telemetry.close()
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.world_size > 1 and dist.is_available() and dist.is_initialized():
            # A gloo worker thread drops its hold on a finished collective's
            # tensors only once it runs again. When the tensor was made in
            # Python, that release takes the GIL; if the interpreter is
            # already exiting by then, the process aborts ("terminate called
            # without an active exception") after the training succeeded.
            # Two ranks pinned to one core each met it in 12 of 79 runs; a
            # moment off the CPU here lets those threads finish (0 of 25).
            time.sleep(_COLLECTIVE_DRAIN_S)
