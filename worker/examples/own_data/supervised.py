#!/usr/bin/python3
"""A DDP training loop on the user's own dataset (common.py): plain.py is the
starting point, supervised.py the same loop under spikeguard (a test counts
the lines it adds)."""
import os
import sys

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from spikeguard.supervise import Supervisor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ByteDocuments, Timer, TinyLM, parse_args, setup  # noqa: E402

args = parse_args()
rank, world, device = setup(args)
dataset = ByteDocuments(args.documents, args.seq_len, args.data_seed, args.garbage)
model = TinyLM(context=args.seq_len).to(device)
ddp = DDP(model) if world > 1 else model
opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
sg = Supervisor(ddp, opt, dataset, global_batch_size=args.batch_size, steps=args.steps,
                seed=args.data_seed, checkpoint_dir=args.checkpoint_dir,
                checkpoint_every=args.checkpoint_every, clip_norm=args.clip)
timer = Timer()
for step, (x, y) in sg.steps():
    timer.step()
    x, y = x.to(device), y.to(device)
    logits = ddp(x)
    loss = sg.cross_entropy(logits, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
timer.done(rank, sg.step)
sg.close()
