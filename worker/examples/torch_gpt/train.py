#!/usr/bin/python3
"""Train the small GPT of model.py with DistributedDataParallel (gloo, CPU)
under spikeguard, on a corpus in spikeguard's format (spikeguard-worker
corpus synth ...), behaving towards spikeguardd like the C++ reference
worker (Hello with data order and total steps, per-step reports, checkpoint
registration and retention with pins, horizons, GenerationEnded, commands;
a REWIND's checkpoint_at_step adds one checkpoint off the cadence, at that
step of the new generation).

    RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
      /usr/bin/python3 worker/examples/torch_gpt/train.py --corpus C \\
      --checkpoint-dir CK --addr 127.0.0.1:7070 --run demo --steps 600 \\
      --checkpoint-every 50 --keep-checkpoints 4 --lr 1e-3 --warmup 100
    # (and RANK=1 ... for the second rank). No RANK/WORLD_SIZE: one process.

Exit codes: 0 done, 1 failure, 2 usage, 3 rejected by spikeguardd.
PYTHONPATH must hold the assembled package (build/python).
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import GPT, GPTConfig, token_losses  # noqa: E402

from spikeguard import checkpoint as sgckpt  # noqa: E402
from spikeguard.control import Controller, HParamState, RejectedError  # noqa: E402
from spikeguard.data import Corpus, DataOrder  # noqa: E402
from spikeguard.torch import Telemetry, loss_hash, report_json  # noqa: E402
from spikeguard.v1 import telemetry_pb2  # noqa: E402

log = logging.getLogger("torch_gpt")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", required=True)
    p.add_argument("--checkpoint-dir", default="")
    p.add_argument("--addr", default="127.0.0.1:7070")
    p.add_argument("--run", default="")
    p.add_argument("--no-daemon", action="store_true")
    p.add_argument("--telemetry-jsonl", "--telemetry-out", dest="telemetry_jsonl", default="")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--keep-checkpoints", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=100, help="linear warmup steps")
    p.add_argument("--schedule", choices=["constant", "cosine"], default="constant")
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--clip-norm", type=float, default=0.0, help="0 = no clipping")
    p.add_argument("--lr-scale", type=float, default=None, help="base lr scale (a relaunched fix)")
    p.add_argument("--extra-warmup-steps", type=int, default=0,
                   help="base hparams: a further linear warmup (as a fix's), from --warmup-start-step")
    p.add_argument("--warmup-start-step", type=int, default=-1,
                   help="the step the extra warmup ramps from; -1 = the first step trained")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--qk-norm", action="store_true")
    p.add_argument("--z-loss", type=float, default=0.0)
    p.add_argument("--model-seed", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=0, help="global rows; 0 = the corpus manifest")
    p.add_argument("--seq-len", type=int, default=0, help="0 = the corpus manifest")
    p.add_argument("--data-seed", type=int, default=None)
    p.add_argument("--generation", type=int, default=0)
    p.add_argument("--resume", default="",
                   help="PATH/URI of a checkpoint, or 'newest' (of the highest generation "
                        "in --checkpoint-dir; legacy step-*.pt files count as the oldest)")
    p.add_argument("--plan", default="", help="data plan text, e.g. 0-300,305-")
    p.add_argument("--stop-after", type=int, default=-1, help="horizon: last step to train")
    p.add_argument("--linger-s", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--report-documents", action="store_true",
                   help="report each step's documents with its telemetry (what a trainer on a "
                        "dataset not in spikeguard's format does, so the daemon can name them)")
    p.add_argument("--telemetry", choices=["on", "off"], default="on",
                   help="off: no spikeguard.torch statistics (benchmark baseline)")
    p.add_argument("--token", default=None)
    p.add_argument("--connect-timeout-s", type=float, default=60.0)
    args = p.parse_args(argv)
    if not args.no_daemon and not args.run:
        p.error("--run is needed (or --no-daemon)")
    if args.steps < 0 or args.checkpoint_every < 0 or args.keep_checkpoints < 1:
        p.error("--steps/--checkpoint-every must be >= 0, --keep-checkpoints >= 1")
    if args.lr_scale is not None and not args.lr_scale > 0:
        p.error("--lr-scale: not a positive number")
    return args


def dist_env():
    """(rank, world_size, local_rank) from the launcher's environment."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    return rank, world, local


class Trainer:
    def __init__(self, args, client_factory=None):
        self.args = args
        self.rank, self.world, self.local_rank = dist_env()
        torch.set_num_threads(max(1, args.threads))
        torch.use_deterministic_algorithms(True)
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("gloo", rank=self.rank, world_size=self.world,
                                    timeout=datetime.timedelta(minutes=60))
        self.corpus = Corpus.open(args.corpus)
        self.base_order = DataOrder(self.corpus, seed=args.data_seed,
                                    global_batch_size=args.batch_size or None,
                                    sequence_length=args.seq_len or None, plan="")
        if self.base_order.sequence_length > args.context:
            raise ValueError(f"seq_len: {self.base_order.sequence_length} is longer than the "
                             f"model's context {args.context}")
        self.cfg = GPTConfig(layers=args.layers, heads=args.heads, width=args.width,
                             context=args.context, qk_norm=args.qk_norm, z_loss=args.z_loss,
                             seed=args.model_seed)
        self.model = GPT(self.cfg)
        if self.world > 1:
            self.ddp = torch.nn.parallel.DistributedDataParallel(self.model, broadcast_buffers=False)
        else:
            self.ddp = self.model
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr,
                                           betas=(args.beta1, args.beta2), eps=args.eps,
                                           weight_decay=args.weight_decay)
        self.base_hparams = HParamState(lr_scale=args.lr_scale if args.lr_scale else 1.0,
                                        extra_warmup_steps=args.extra_warmup_steps,
                                        rewarm_start_step=args.warmup_start_step)
        self.hparams = HParamState(**self.base_hparams.to_dict())
        self.order = self.base_order
        self.step = 0
        self.generation = args.generation
        self.telemetry = (Telemetry(self.model, domain_names=self.corpus.domain_names)
                          if args.telemetry == "on" else None)
        self.jsonl = open(args.telemetry_jsonl, "a") if args.telemetry_jsonl else None
        if args.checkpoint_dir and self.rank == 0:
            os.makedirs(args.checkpoint_dir, exist_ok=True)
            sgckpt.clean_temporaries(args.checkpoint_dir)

        # Where to start (as the C++ worker: newest valid, a path, or scratch).
        if args.resume == "newest":
            if not args.checkpoint_dir:
                raise ValueError("resume: 'newest' needs a checkpoint dir")
            newest = sgckpt.latest_checkpoint(args.checkpoint_dir, rank=0)
            if newest is not None:
                self.load(newest["path"], args.plan)
            elif args.plan:
                self.order = self.base_order.with_plan(args.plan)
        elif args.resume:
            self.load(args.resume, args.plan)
        elif args.plan:
            self.order = self.base_order.with_plan(args.plan)

        # As the reference worker: the flags win over the checkpoint's.
        if args.lr_scale:
            self.hparams.lr_scale = args.lr_scale
        if args.extra_warmup_steps:
            self.hparams.extra_warmup_steps = args.extra_warmup_steps
            self.hparams.rewarm_start_step = args.warmup_start_step
        self.client = None
        if not args.no_daemon:
            if client_factory is None:
                from spikeguard import Client
                client_factory = Client
            self.client = client_factory(
                args.addr, args.run, rank=self.rank, world_size=self.world,
                generation=self.generation, token=args.token,
                device_id=self.local_rank, config_fingerprint=self.cfg.fingerprint(),
                resume_step=self.step, data_order=self.base_order.data_order_proto(),
                total_steps=args.steps)
            self.client.start(timeout=args.connect_timeout_s)
        self.controller = Controller(
            self.client, total_steps=args.steps, get_step=lambda: self.step,
            rewind=self.rewind, rank=self.rank, world_size=self.world,
            generation=self.generation, stop_after_step=args.stop_after, linger_s=args.linger_s,
            base_hparams=self.base_hparams, on_hparams=self._set_hparams)
        self.controller.hparams = self.hparams

    # ---- state -----------------------------------------------------------------
    def _set_hparams(self, hp: HParamState) -> None:
        self.hparams = hp

    def load(self, path: str, plan_override: str = "", checksum: str = "") -> None:
        state = sgckpt.load_checkpoint(path, model=self.model, optimizer=self.optimizer,
                                       checksum=checksum or None)
        extra = state.get("extra") or {}
        fp = extra.get("config_fingerprint")
        if fp and fp != self.cfg.fingerprint():
            raise ValueError(f"checkpoint {path} is of model {fp}, not {self.cfg.fingerprint()}")
        plan = plan_override or state.get("data_plan") or extra.get("plan", "")
        self.order = self.base_order.with_plan(plan)
        self.step = int(state["step"])
        self.hparams = HParamState.from_dict(extra.get("hparams"))
        if hasattr(self, "controller"):
            self.controller.hparams = self.hparams
        log.info("rank %d: loaded checkpoint %s (step %d, plan %s)", self.rank, path, self.step,
                 self.order.plan)

    def rewind(self, uri: str, plan: str, command=None) -> None:
        """REWIND's callback: load the checkpoint and switch the plan; the
        controller then sets generation, horizon and hparams. The payload must
        hash to the checksum the command carries."""
        self.load(uri, plan, command.checkpoint.checksum if command is not None else "")
        if command is not None:
            self.generation = int(command.new_generation)

    def save(self) -> None:
        """Rank 0 writes the checkpoint of self.step (steps 0..step-1 done) of
        this generation, applies this generation's retention (never a pinned
        URI, never another generation's file), registers both with the daemon."""
        if self.rank != 0 or not self.args.checkpoint_dir:
            return
        try:
            position = self.order.position_for_step(self.step)
        except (IndexError, ValueError):
            position = -1
        extra = {"generation": self.generation, "plan": self.order.plan,
                 "hparams": self.hparams.to_dict(), "config_fingerprint": self.cfg.fingerprint()}
        # The file is this generation's own (g<generation>-step-<step>.pt):
        # a rewound generation saving a step another generation saved too
        # writes a second file, and retention prunes only this generation's.
        info = sgckpt.save_checkpoint(self.args.checkpoint_dir, self.step,
                                      generation=self.generation, model=self.model,
                                      optimizer=self.optimizer, data_position=position, extra=extra,
                                      data_plan=self.order.plan)
        deleted = sgckpt.retain(self.args.checkpoint_dir, self.args.keep_checkpoints,
                                pinned_uris=self.controller.pinned_uris,
                                generation=self.generation)
        if self.client is not None:
            for gone in deleted:
                self.client.checkpoint_deleted(gone["step"], gone["uri"])
            self.client.checkpoint_saved(info["step"], info["uri"], data_position=position,
                                         size_bytes=info["bytes"], checksum=info["checksum"],
                                         complete=True)

    # ---- one step ----------------------------------------------------------------
    def base_lr(self, step: int) -> float:
        a = self.args
        if step < a.warmup:
            f = (step + 1) / a.warmup
        elif a.schedule == "cosine":
            span = max(1, a.steps - a.warmup)
            progress = min(1.0, max(0.0, (step - a.warmup) / span))
            f = a.min_lr_ratio + (1 - a.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        else:
            f = 1.0
        return a.lr * f

    def train_step(self):
        a, tel, step = self.args, self.telemetry, self.step
        self.hparams.begin_step(step)
        lr = self.base_lr(step) * self.hparams.lr_factor(step)
        self.hparams.apply_to_optimizer(self.optimizer, lr, betas=(a.beta1, a.beta2), eps=a.eps)
        clip = self.hparams.clip(a.clip_norm if a.clip_norm > 0 else None)
        t0 = time.perf_counter()
        if tel:
            tel.before_step()
        batch = self.order.batch(step)
        toks, doms = self.order.shard(batch, self.rank, self.world)
        x = torch.from_numpy(np.ascontiguousarray(toks, dtype=np.int64))
        inp, tgt = x[:, :-1], x[:, 1:]
        logits = self.ddp(inp)
        ce, objective = token_losses(logits, tgt, self.cfg.z_loss)
        if tel:
            tel.logits(logits)
            tel.losses(ce, torch.from_numpy(np.ascontiguousarray(doms, dtype=np.int64)))
        # DDP averages over ranks: each rank's sum × world / all tokens makes
        # that average the full batch's mean (also when a shard has no rows).
        loss = objective.sum() * (self.world / max(1, batch.tokens_total))
        self.optimizer.zero_grad(set_to_none=False)
        loss.backward()
        if tel:
            grad_norm = tel.after_backward(clip)
        else:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), clip if clip else float("inf")))
        if math.isfinite(grad_norm):
            if tel:
                tel.before_optimizer_step()
            self.optimizer.step()
            if tel:
                tel.after_optimizer_step()
        report = None
        if tel:
            docs = self.order.documents_at(batch.position) if a.report_documents else None
            report = tel.report(step, batch.position, lr, documents=docs)
        elif self.client is not None or self.jsonl is not None:
            # Without spikeguard.torch: the global loss and its hash only.
            s = ce.detach().double().sum().reshape(1)
            if self.world > 1:
                parts = [torch.empty_like(s) for _ in range(self.world)]
                dist.all_gather(parts, s)
                s = torch.cat(parts).sum()
            global_loss = float(s) / max(1, batch.tokens_total)
            report = telemetry_pb2.StepReport(
                step=step, data_position=batch.position, loss=global_loss,
                loss_hash=loss_hash(global_loss), grad_norm=grad_norm, lr=lr, loss_scale=1.0,
                tokens=int(ce.numel()), step_time_s=time.perf_counter() - t0,
                unix_ms=int(time.time() * 1000))
        self.step += 1
        return report

    def emit(self, report) -> None:
        if report is None:
            return
        if self.jsonl is not None:
            d = report_json(report, self.telemetry.attention_kind if self.telemetry else None)
            d["rank"] = self.rank
            d["generation"] = self.generation
            self.jsonl.write(json.dumps(d) + "\n")
        if self.client is not None:
            self.client.report(report)
            self.client.set_current_step(report.step)

    # ---- the loop ----------------------------------------------------------------
    def run(self) -> None:
        every = self.args.checkpoint_every if self.args.checkpoint_dir else 0
        while self.controller.step_boundary():
            self.generation = self.controller.generation
            report = self.train_step()
            self.emit(report)
            # The cadence, or the checkpoint a REWIND asked for at this step
            # (checkpoint_at_step: where the daemon starts later probes);
            # asked on every rank, as it consumes the request.
            asked = self.controller.checkpoint_due(self.step)
            if asked or (every > 0 and self.step % every == 0):
                self.save()
        if self.jsonl is not None:
            self.jsonl.flush()
        if self.client is not None:
            self.client.flush(timeout=60.0)

    def close(self) -> None:
        if self.jsonl is not None:
            self.jsonl.close()
            self.jsonl = None
        if self.telemetry is not None:
            self.telemetry.close()
        if self.client is not None:
            self.client.close()
            self.client = None


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        args = parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    trainer = None
    code = 0
    try:
        trainer = Trainer(args)
        log.info("rank %d/%d: training %s from step %d to %d, generation %d, plan %s",
                 trainer.rank, trainer.world, trainer.cfg.fingerprint(), trainer.step, args.steps,
                 trainer.generation, trainer.order.plan)
        trainer.run()
        print(f"done: rank {trainer.rank}, step {trainer.step}", flush=True)
    except RejectedError as e:
        log.error("%s", e)
        code = 3
    except Exception as e:  # noqa: BLE001
        if type(e).__name__ == "Rejected":
            log.error("%s", e)
            code = 3
        else:
            log.exception("training failed")
            code = 1
    finally:
        if trainer is not None:
            trainer.close()
        if dist.is_initialized() and code == 0:
            # Every rank leaves together: a gloo pair torn down while its
            # peer still talks aborts the peer.
            try:
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=120))
                dist.destroy_process_group()
            except RuntimeError as e:
                log.warning("leaving the process group: %s", e)
    return code


if __name__ == "__main__":
    sys.exit(main())
