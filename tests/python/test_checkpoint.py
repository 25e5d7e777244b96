"""spikeguard.checkpoint: atomic, checksummed torch checkpoints that restore
a run bit for bit (parameters, optimizer, scheduler, RNGs)."""

import hashlib
import os
import random

import numpy as np
import pytest
import torch

from spikeguard import checkpoint as ck
from spikeguard.checkpoint import (CheckpointError, clean_temporaries, latest_checkpoint,
                                   list_checkpoints, load_checkpoint, read_header, retain,
                                   save_checkpoint, verify_checkpoint)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.drop = torch.nn.Dropout(0.2)  # consumes the torch RNG every step
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(self.drop(torch.relu(self.norm(self.a(x)))))


def make(seed=0):
    torch.manual_seed(seed)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def train(model, opt, sched, steps):
    """Draws data from all three RNGs, so a replay is exact only if all are restored."""
    losses = []
    for _ in range(steps):
        x = torch.randn(5, 8) + float(np.random.rand()) + random.random()
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def snapshot(model, opt, sched):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
             for i, s in opt.state_dict()["state"].items()},
            sched.state_dict())


def same_state(a, b):
    pa, oa, sa = a
    pb, ob, sb = b
    assert pa.keys() == pb.keys()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k
    assert oa.keys() == ob.keys()
    for i in oa:
        for k in oa[i]:
            va, vb = oa[i][k], ob[i][k]
            assert torch.equal(va, vb) if torch.is_tensor(va) else va == vb, (i, k)
    assert sa == sb


def test_save_load_restores_everything_bit_exact(tmp_path):
    model, opt, sched = make()
    train(model, opt, sched, 3)
    info = save_checkpoint(tmp_path, 3, model=model, optimizer=opt, scheduler=sched,
                           data_position=7, data_plan="0-3,5-", extra={"note": [1, 2]})
    saved = snapshot(model, opt, sched)
    want_rand = torch.rand(4)
    want_py, want_np = random.random(), np.random.rand()
    want_losses = train(model, opt, sched, 4)

    # Mutate everything: more training, other RNG states, another lr.
    train(model, opt, sched, 2)
    torch.manual_seed(99)
    random.seed(99)
    np.random.seed(99)
    for g in opt.param_groups:
        g["lr"] = 123.0

    state = load_checkpoint(info["uri"], model=model, optimizer=opt, scheduler=sched)
    assert state["step"] == 3 and state["data_position"] == 7
    assert state["data_plan"] == "0-3,5-" and state["extra"] == {"note": [1, 2]}
    assert list_checkpoints(tmp_path)[0]["data_plan"] == "0-3,5-"
    same_state(snapshot(model, opt, sched), saved)
    assert torch.equal(torch.rand(4), want_rand)
    assert (random.random(), np.random.rand()) == (want_py, want_np)
    # And the same again, into fresh objects, continuing bit for bit.
    model2, opt2, sched2 = make(seed=5)
    load_checkpoint(info["path"], model=model2, optimizer=opt2, scheduler=sched2)
    torch.rand(4), random.random(), np.random.rand()  # the draws made after the save
    assert train(model2, opt2, sched2, 4) == want_losses


def test_info_names_and_lists(tmp_path):
    model, opt, _ = make()
    info = save_checkpoint(tmp_path / "ck", 100, model=model, optimizer=opt, data_position=105)
    path = str(tmp_path / "ck" / "step-000000100.pt")
    assert info["path"] == path and info["uri"] == "file://" + path
    assert (info["step"], info["data_position"], info["rank"]) == (100, 105, 0)
    assert info["data_plan"] is None
    assert info["bytes"] == os.path.getsize(path)
    header = read_header(path)
    assert header["sha256"] == info["checksum"] and len(info["checksum"]) == 64
    with open(path, "rb") as f:
        f.seek(header["payload_offset"])
        assert hashlib.sha256(f.read()).hexdigest() == info["checksum"]
    r1 = save_checkpoint(tmp_path / "ck", 100, model=model, optimizer=opt, data_position=105, rank=1)
    assert r1["path"].endswith("step-000000100-rank1.pt")
    listed = list_checkpoints(tmp_path / "ck")
    assert [(e["step"], e["rank"], e["valid"]) for e in listed] == [(100, 0, True), (100, 1, True)]
    assert listed[0]["uri"] == info["uri"] and listed[0]["checksum"] == info["checksum"]
    assert latest_checkpoint(tmp_path / "ck")["path"] == path
    assert verify_checkpoint(info["uri"])["step"] == 100
    # No scheduler saved: loading without one works, with one is refused.
    load_checkpoint(path, model=model, optimizer=opt)
    with pytest.raises(CheckpointError, match="no scheduler state"):
        load_checkpoint(path, model=model, optimizer=opt, scheduler=make()[2])


def _saved(tmp_path, step=1):
    model, opt, sched = make()
    train(model, opt, sched, 1)
    info = save_checkpoint(tmp_path, step, model=model, optimizer=opt, scheduler=sched,
                           data_position=step)
    return info, (model, opt, sched)


@pytest.mark.parametrize("keep_bytes,problem", [
    (0, "truncated"), (5, "truncated"), (10, "truncated inside the header"),
    (30, "truncated inside the header"), (-1, "truncated: payload has"),
    (-5000, "truncated: payload has")])
def test_truncated_files_are_refused(tmp_path, keep_bytes, problem):
    info, objs = _saved(tmp_path)
    size = os.path.getsize(info["path"])
    with open(info["path"], "r+b") as f:
        f.truncate(keep_bytes if keep_bytes >= 0 else size + keep_bytes)
    with pytest.raises(CheckpointError, match=problem) as e:
        load_checkpoint(info["path"], model=objs[0], optimizer=objs[1], scheduler=objs[2])
    assert info["path"] in str(e.value) and e.value.path == info["path"]
    assert latest_checkpoint(tmp_path) is None


def test_corrupt_foreign_and_missing_files_are_refused(tmp_path):
    info, (model, opt, sched) = _saved(tmp_path)
    data = bytearray(open(info["path"], "rb").read())
    data[-100] ^= 0x01
    open(info["path"], "wb").write(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(info["path"], model=model, optimizer=opt)
    open(info["path"], "ab").write(b"x")
    with pytest.raises(CheckpointError, match="trailing bytes"):
        verify_checkpoint(info["path"])

    plain = tmp_path / "plain.pt"
    torch.save(model.state_dict(), plain)
    with pytest.raises(CheckpointError, match="not a spikeguard checkpoint"):
        load_checkpoint(plain, model=model, optimizer=opt)
    with pytest.raises(CheckpointError, match="missing"):
        load_checkpoint(tmp_path / "step-000000009.pt", model=model, optimizer=opt)
    with pytest.raises(CheckpointError, match="only file://"):
        load_checkpoint("s3://bucket/x.pt", model=model, optimizer=opt)
    bad_header = tmp_path / "step-000000002.pt"
    bad_header.write_bytes(ck.MAGIC + b"\x05\x00\x00\x00{oops")
    with pytest.raises(CheckpointError, match="corrupt header"):
        read_header(bad_header)
    # Listing reads headers only: the corrupt payload of step 1 shows only on verify.
    assert [e["valid"] for e in list_checkpoints(tmp_path)] == [True, False]
    assert latest_checkpoint(tmp_path) is None


def test_checkpoint_for_another_model_is_refused(tmp_path):
    info, _ = _saved(tmp_path)
    other = torch.nn.Linear(3, 3)
    with pytest.raises(CheckpointError, match="model state does not fit"):
        load_checkpoint(info["path"], model=other, optimizer=torch.optim.SGD(other.parameters(), lr=1))


@pytest.mark.parametrize("fail_in", ["write", "fsync", "rename"])
def test_failed_save_leaves_nothing_visible(tmp_path, monkeypatch, fail_in):
    earlier, (model, opt, sched) = _saved(tmp_path, step=1)
    before = sorted(os.listdir(tmp_path))

    class Boom(Exception):
        pass

    def boom(*a, **k):
        raise Boom(fail_in)

    if fail_in == "write":
        # The process "dies" half way through writing the payload.
        real_open = open

        class HalfFile:
            def __init__(self, f):
                self.f = f

            def write(self, b):
                if len(b) > 1000:
                    self.f.write(bytes(b)[:500])
                    raise Boom("write")
                return self.f.write(b)

            def __getattr__(self, name):
                return getattr(self.f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return self.f.__exit__(*exc)

        monkeypatch.setattr(ck, "open", lambda p, m="r", *a, **k: HalfFile(real_open(p, m, *a, **k))
                            if "x" in m else real_open(p, m, *a, **k), raising=False)
    elif fail_in == "fsync":
        monkeypatch.setattr(ck.os, "fsync", boom)
    else:
        monkeypatch.setattr(ck.os, "rename", boom)
    with pytest.raises(Boom):
        save_checkpoint(tmp_path, 2, model=model, optimizer=opt, scheduler=sched, data_position=2)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == before  # no step-2 file, no temporary
    assert [e["step"] for e in list_checkpoints(tmp_path)] == [1]
    assert latest_checkpoint(tmp_path)["path"] == earlier["path"]


def test_killed_save_leaves_only_an_ignored_temporary(tmp_path):
    info, (model, opt, _) = _saved(tmp_path, step=1)
    # What a kill -9 between write and rename leaves behind.
    tmp = tmp_path / ".step-000000002.pt.tmp-4242-deadbeef"
    tmp.write_bytes(open(info["path"], "rb").read()[:777])
    assert [e["step"] for e in list_checkpoints(tmp_path)] == [1]
    assert clean_temporaries(tmp_path) == [str(tmp)]
    assert sorted(os.listdir(tmp_path)) == ["step-000000001.pt"]


def test_retain_keeps_the_newest_and_every_pinned(tmp_path):
    model, opt, _ = make()
    infos = {s: save_checkpoint(tmp_path, s, model=model, optimizer=opt, data_position=s)
             for s in range(0, 60, 10)}
    save_checkpoint(tmp_path, 20, model=model, optimizer=opt, data_position=20, rank=1)
    pinned = [infos[10]["uri"], str(tmp_path / "." / "step-000000030.pt")]
    deleted = retain(tmp_path, 2, pinned_uris=pinned)
    assert [d["step"] for d in deleted] == [0, 20, 20]
    assert {d["uri"] for d in deleted} == {infos[0]["uri"], infos[20]["uri"],
                                           infos[20]["uri"].replace(".pt", "-rank1.pt")}
    assert [e["step"] for e in list_checkpoints(tmp_path)] == [10, 30, 40, 50]
    assert retain(tmp_path, 2, pinned_uris=pinned) == []
    assert [d["step"] for d in retain(tmp_path, 1)] == [10, 30, 40]
    with pytest.raises(ValueError, match="keep"):
        retain(tmp_path, 0)
