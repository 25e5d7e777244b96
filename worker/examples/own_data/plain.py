#!/usr/bin/python3
"""A DDP training loop on the user's own dataset (common.py): plain.py is the
starting point, supervised.py the same loop under spikeguard (a test counts
the lines it adds)."""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ByteDocuments, Timer, TinyLM, parse_args, setup  # noqa: E402

args = parse_args()
rank, world, device = setup(args)
dataset = ByteDocuments(args.documents, args.seq_len, args.data_seed, args.garbage)
model = TinyLM(context=args.seq_len).to(device)
ddp = DDP(model) if world > 1 else model
opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
sampler = DistributedSampler(dataset, world, rank, seed=args.data_seed) if world > 1 else None
loader = DataLoader(dataset, batch_size=args.batch_size // world, sampler=sampler, drop_last=True)
timer = Timer()
step, epoch = 0, 0
while step < args.steps:
    if sampler is not None:
        sampler.set_epoch(epoch)
    epoch += 1
    for x, y in loader:
        if step >= args.steps:
            break
        timer.step()
        x, y = x.to(device), y.to(device)
        logits = ddp(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        step += 1
        if rank == 0 and args.checkpoint_dir and step % args.checkpoint_every == 0:
            torch.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()},
                       os.path.join(args.checkpoint_dir, f"step{step}.pt"))
timer.done(rank, step)
