"""spikeguard.checkpoint: atomic, checksummed torch checkpoints that restore
a run bit for bit (parameters, optimizer, scheduler, RNGs)."""

import hashlib
import os
import random

import numpy as np
import pytest
import torch

from spikeguard import checkpoint as ck
from spikeguard.checkpoint import (CheckpointError, capture_checkpoint, clean_temporaries,
                                   latest_checkpoint, list_checkpoints, load_checkpoint,
                                   read_header, retain, save_checkpoint, verify_checkpoint,
                                   write_checkpoint)


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
    info = save_checkpoint(tmp_path, 3, generation=0, model=model, optimizer=opt,
                           scheduler=sched, data_position=7, data_plan="0-3,5-", extra={"note": [1, 2]})
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


def test_loads_where_torch_load_defaults_to_weights_only(tmp_path, monkeypatch):
    """PyTorch 2.6 and later default torch.load to weights_only=True, which
    refuses the NumPy RNG state and the extra a checkpoint holds: loading
    must not depend on that default."""
    model, opt, sched = make()
    train(model, opt, sched, 2)
    info = save_checkpoint(tmp_path, 2, generation=0, model=model, optimizer=opt,
                           scheduler=sched, data_position=2, extra={"note": (1, "two")})
    want_np = np.random.rand()
    real = torch.load

    def load_weights_only_by_default(f, *args, weights_only=True, **kwargs):
        return real(f, *args, weights_only=weights_only, **kwargs)

    monkeypatch.setattr(torch, "load", load_weights_only_by_default)
    np.random.seed(99)
    state = load_checkpoint(info["path"], model=model, optimizer=opt, scheduler=sched)
    assert state["step"] == 2 and state["extra"] == {"note": (1, "two")}
    assert np.random.rand() == want_np


def test_info_names_and_lists(tmp_path):
    model, opt, _ = make()
    info = save_checkpoint(tmp_path / "ck", 100, generation=3, model=model, optimizer=opt,
                           data_position=105)
    path = str(tmp_path / "ck" / "g000003-step-000000100.pt")
    assert info["path"] == path and info["uri"] == "file://" + path
    assert ck.checkpoint_path(tmp_path / "ck", 100, generation=3) == path
    assert (info["step"], info["generation"], info["data_position"], info["rank"]) == (100, 3, 105, 0)
    assert info["data_plan"] is None
    assert info["bytes"] == os.path.getsize(path)
    header = read_header(path)
    assert header["sha256"] == info["checksum"] and len(info["checksum"]) == 64
    assert header["generation"] == 3
    with open(path, "rb") as f:
        f.seek(header["payload_offset"])
        assert hashlib.sha256(f.read()).hexdigest() == info["checksum"]
    r1 = save_checkpoint(tmp_path / "ck", 100, generation=3, model=model, optimizer=opt,
                         data_position=105, rank=1)
    assert os.path.basename(r1["path"]) == "g000003-step-000000100-rank1.pt"
    listed = list_checkpoints(tmp_path / "ck")
    assert [(e["step"], e["generation"], e["rank"], e["valid"]) for e in listed] == [
        (100, 3, 0, True), (100, 3, 1, True)]
    assert listed[0]["uri"] == info["uri"] and listed[0]["checksum"] == info["checksum"]
    assert latest_checkpoint(tmp_path / "ck")["path"] == path
    assert verify_checkpoint(info["uri"])["step"] == 100
    # No scheduler saved: loading without one works, with one is refused.
    assert load_checkpoint(path, model=model, optimizer=opt)["generation"] == 3
    with pytest.raises(CheckpointError, match="no scheduler state"):
        load_checkpoint(path, model=model, optimizer=opt, scheduler=make()[2])


def _saved(tmp_path, step=1):
    model, opt, sched = make()
    train(model, opt, sched, 1)
    info = save_checkpoint(tmp_path, step, generation=0, model=model, optimizer=opt,
                           scheduler=sched, data_position=step)
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
        load_checkpoint(tmp_path / "g000000-step-000000009.pt", model=model, optimizer=opt)
    with pytest.raises(CheckpointError, match="only a local path or a file:// URI"):
        load_checkpoint("s3://bucket/x.pt", model=model, optimizer=opt)
    bad_header = tmp_path / "g000000-step-000000002.pt"
    bad_header.write_bytes(ck.MAGIC + b"\x05\x00\x00\x00{oops")
    with pytest.raises(CheckpointError, match="corrupt header"):
        read_header(bad_header)
    # Listing reads headers only: the corrupt payload of step 1 shows only on verify.
    assert [e["valid"] for e in list_checkpoints(tmp_path)] == [True, False]
    assert latest_checkpoint(tmp_path) is None


def test_load_checks_the_checksum_the_checkpoint_was_registered_with(tmp_path):
    # The daemon checks only the file's identity before a rewind; the
    # command's checksum is checked here, as the payload is read.
    info, (model, opt, sched) = _saved(tmp_path)
    assert len(info["checksum"]) == 64
    load_checkpoint(info["uri"], model=model, optimizer=opt, checksum=info["checksum"].upper())
    with pytest.raises(CheckpointError, match="the daemon registered " + "0" * 64):
        load_checkpoint(info["uri"], model=model, optimizer=opt, checksum="0" * 64)


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
        save_checkpoint(tmp_path, 2, generation=0, model=model, optimizer=opt, scheduler=sched,
                        data_position=2)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == before  # no step-2 file, no temporary
    assert [e["step"] for e in list_checkpoints(tmp_path)] == [1]
    assert latest_checkpoint(tmp_path)["path"] == earlier["path"]


def test_killed_save_leaves_only_an_ignored_temporary(tmp_path):
    info, (model, opt, _) = _saved(tmp_path, step=1)
    # What a kill -9 between write and rename leaves behind.
    tmp = tmp_path / ".g000000-step-000000002.pt.tmp-4242-deadbeef"
    tmp.write_bytes(open(info["path"], "rb").read()[:777])
    # An older version's temporary (no generation in its name) goes too.
    legacy_tmp = tmp_path / ".step-000000003.pt.tmp-4243-deadbeef"
    legacy_tmp.write_bytes(open(info["path"], "rb").read()[:777])
    assert [e["step"] for e in list_checkpoints(tmp_path)] == [1]
    assert sorted(clean_temporaries(tmp_path)) == sorted([str(tmp), str(legacy_tmp)])
    assert sorted(os.listdir(tmp_path)) == ["g000000-step-000000001.pt"]


def test_retain_keeps_the_newest_and_every_pinned(tmp_path):
    model, opt, _ = make()
    infos = {s: save_checkpoint(tmp_path, s, generation=0, model=model, optimizer=opt,
                                data_position=s)
             for s in range(0, 60, 10)}
    save_checkpoint(tmp_path, 20, generation=0, model=model, optimizer=opt, data_position=20,
                    rank=1)
    pinned = [infos[10]["uri"], str(tmp_path / "." / "g000000-step-000000030.pt")]
    deleted = retain(tmp_path, 2, pinned_uris=pinned, generation=0)
    assert [d["step"] for d in deleted] == [0, 20, 20]
    assert {d["uri"] for d in deleted} == {infos[0]["uri"], infos[20]["uri"],
                                           infos[20]["uri"].replace(".pt", "-rank1.pt")}
    assert [e["step"] for e in list_checkpoints(tmp_path)] == [10, 30, 40, 50]
    assert retain(tmp_path, 2, pinned_uris=pinned, generation=0) == []
    assert [d["step"] for d in retain(tmp_path, 1, generation=0)] == [10, 30, 40]
    with pytest.raises(ValueError, match="keep"):
        retain(tmp_path, 0, generation=0)


def _bytes(path):
    with open(path, "rb") as f:
        return f.read()


def test_generations_saving_the_same_step_write_distinct_files(tmp_path):
    """A probe generation that saves a step the run's own generation saved
    too must not replace that checkpoint: the daemon would refuse it at the
    rewind (its checksum changed) and the rewind target would be lost."""
    model, opt, sched = make()
    train(model, opt, sched, 2)
    g3 = save_checkpoint(tmp_path, 350, generation=3, model=model, optimizer=opt,
                         scheduler=sched, data_position=350)
    g3_bytes, g3_state = _bytes(g3["path"]), snapshot(model, opt, sched)
    train(model, opt, sched, 3)  # the probe generation trained differently
    g4 = save_checkpoint(tmp_path, 350, generation=4, model=model, optimizer=opt,
                         scheduler=sched, data_position=350)
    g4r1 = save_checkpoint(tmp_path, 350, generation=4, model=model, optimizer=opt,
                           scheduler=sched, data_position=350, rank=1)
    assert g3["path"] != g4["path"] and g3["uri"] != g4["uri"]
    assert sorted(os.listdir(tmp_path)) == ["g000003-step-000000350.pt",
                                            "g000004-step-000000350-rank1.pt",
                                            "g000004-step-000000350.pt"]
    # Generation 3's file is byte for byte what it saved; its checksum (what
    # the daemon registered) still verifies, and it restores generation 3's state.
    assert _bytes(g3["path"]) == g3_bytes
    assert verify_checkpoint(g3["uri"])["sha256"] == g3["checksum"] != g4["checksum"]
    model2, opt2, sched2 = make(seed=7)
    state = load_checkpoint(g3["uri"], model=model2, optimizer=opt2, scheduler=sched2)
    assert (state["step"], state["generation"]) == (350, 3)
    same_state(snapshot(model2, opt2, sched2), g3_state)
    listed = list_checkpoints(tmp_path)
    assert [(e["generation"], e["step"], e["rank"]) for e in listed] == [
        (3, 350, 0), (4, 350, 0), (4, 350, 1)]
    assert [e["path"] for e in list_checkpoints(tmp_path, generation=3)] == [g3["path"]]
    # Newest: the higher generation (where the run went on), or a given one's.
    assert latest_checkpoint(tmp_path)["path"] == g4["path"]
    assert latest_checkpoint(tmp_path, generation=3)["path"] == g3["path"]
    assert latest_checkpoint(tmp_path, generation=5) is None
    # The same generation saving the step again replaces only its own file.
    again = save_checkpoint(tmp_path, 350, generation=4, model=model, optimizer=opt,
                            scheduler=sched, data_position=350)
    assert again["path"] == g4["path"] and _bytes(g3["path"]) == g3_bytes
    with pytest.raises(TypeError, match="generation"):
        save_checkpoint(tmp_path, 1, model=model, optimizer=opt, data_position=1)
    for bad in (-1, True, "3", None):
        with pytest.raises(ValueError, match="generation"):
            save_checkpoint(tmp_path, 1, generation=bad, model=model, optimizer=opt,
                            data_position=1)


def test_retain_prunes_only_the_given_generation(tmp_path):
    model, opt, _ = make()
    run = {s: save_checkpoint(tmp_path, s, generation=1, model=model, optimizer=opt,
                              data_position=s) for s in (100, 200, 300, 400)}
    # A probe generation rewound to 300 saves 350 and 400 (the same step as gen 1's).
    probe = {s: save_checkpoint(tmp_path, s, generation=2, model=model, optimizer=opt,
                                data_position=s) for s in (350, 400, 450)}
    run_bytes = {s: _bytes(i["path"]) for s, i in run.items()}
    deleted = retain(tmp_path, 1, generation=2)
    # Only the probe's own older checkpoints go; none of generation 1's.
    assert [(d["generation"], d["step"], d["uri"]) for d in deleted] == [
        (2, 350, probe[350]["uri"]), (2, 400, probe[400]["uri"])]
    assert [(e["generation"], e["step"]) for e in list_checkpoints(tmp_path)] == [
        (1, 100), (1, 200), (1, 300), (1, 400), (2, 450)]
    assert {s: _bytes(i["path"]) for s, i in run.items()} == run_bytes
    # Generation 1's own retention counts only its files (and keeps its pins).
    deleted = retain(tmp_path, 2, pinned_uris=[run[100]["uri"]], generation=1)
    assert [(d["generation"], d["step"]) for d in deleted] == [(1, 200)]
    assert [(e["generation"], e["step"]) for e in list_checkpoints(tmp_path)] == [
        (1, 100), (1, 300), (1, 400), (2, 450)]


def _legacy(tmp_path, step, rank=0, seed=0):
    """A checkpoint as an earlier version named it: step-<step>[-rank<r>].pt."""
    model, opt, sched = make(seed)
    train(model, opt, sched, 1)
    info = save_checkpoint(tmp_path / "new", step, generation=0, model=model, optimizer=opt,
                           scheduler=sched, data_position=step, rank=rank)
    path = ck.checkpoint_path(tmp_path, step, rank)  # generation None: the legacy name
    assert os.path.basename(path) == (f"step-{step:09d}.pt" if rank == 0
                                      else f"step-{step:09d}-rank{rank}.pt")
    os.rename(info["path"], path)
    return path, snapshot(model, opt, sched)


def test_legacy_names_still_list_resume_and_retain(tmp_path):
    old10, _ = _legacy(tmp_path, 10)
    old20, state20 = _legacy(tmp_path, 20, seed=1)
    old20r1, _ = _legacy(tmp_path, 20, rank=1)
    listed = list_checkpoints(tmp_path)
    assert [(e["generation"], e["step"], e["rank"], e["valid"]) for e in listed] == [
        (None, 10, 0, True), (None, 20, 0, True), (None, 20, 1, True)]
    # Resuming: the newest legacy file, by path and by its listed URI.
    newest = latest_checkpoint(tmp_path)
    assert newest["path"] == old20 and newest["generation"] is None
    model, opt, sched = make(seed=9)
    state = load_checkpoint(newest["uri"], model=model, optimizer=opt, scheduler=sched)
    assert state["step"] == 20
    same_state(snapshot(model, opt, sched), state20)
    assert load_checkpoint(old10, model=model, optimizer=opt, scheduler=sched)["step"] == 10

    # A new generation's save next to them: newer than any legacy file, and
    # its retention never deletes the legacy (generation-unknown) files.
    m, o, _ = make()
    g0 = save_checkpoint(tmp_path, 5, generation=0, model=m, optimizer=o, data_position=5)
    assert latest_checkpoint(tmp_path)["path"] == g0["path"]
    assert latest_checkpoint(tmp_path, rank=1)["path"] == old20r1
    assert retain(tmp_path, 1, generation=0) == []
    save_checkpoint(tmp_path, 6, generation=0, model=m, optimizer=o, data_position=6)
    assert [d["uri"] for d in retain(tmp_path, 1, generation=0)] == [g0["uri"]]
    assert os.path.exists(old10) and os.path.exists(old20) and os.path.exists(old20r1)
    # Pruning the legacy files is asked for explicitly (generation None).
    deleted = retain(tmp_path, 1, generation=None)
    assert [(d["generation"], d["step"]) for d in deleted] == [(None, 10)]
    assert sorted(os.listdir(tmp_path)) == ["g000000-step-000000006.pt", "new",
                                            "step-000000020-rank1.pt", "step-000000020.pt"]


def test_a_captured_checkpoint_holds_the_state_of_its_step_while_training_goes_on(tmp_path):
    """capture_checkpoint(copy=True) copies the state (into the caller's
    buffers, reused by the next capture); write_checkpoint writes it later,
    whatever the training did in between, with the checksum of what it
    wrote."""
    model, opt, sched = make(seed=7)
    train(model, opt, sched, 2)
    want = snapshot(model, opt, sched)
    buffers = {}
    captured = capture_checkpoint(2, generation=1, model=model, optimizer=opt, scheduler=sched,
                                  data_position=2, extra={"plan": "0-"}, buffers=buffers)
    copies = {id(t) for t in buffers.values()}
    assert copies and all(t.data_ptr() != p.data_ptr() for t in buffers.values()
                          for p in model.parameters())
    train(model, opt, sched, 3)  # training goes on before the write
    info = write_checkpoint(tmp_path, captured)
    assert info["bytes"] == os.path.getsize(info["path"])
    assert verify_checkpoint(info["uri"])["sha256"] == info["checksum"]
    model2, opt2, sched2 = make(seed=8)
    got = load_checkpoint(info["path"], model=model2, optimizer=opt2, scheduler=sched2)
    assert got["step"] == 2 and got["generation"] == 1 and got["extra"] == {"plan": "0-"}
    same_state(snapshot(model2, opt2, sched2), want)
    # The next capture reuses the buffers: no new tensors.
    capture_checkpoint(5, generation=1, model=model, optimizer=opt, scheduler=sched,
                       data_position=5, buffers=buffers)
    assert {id(t) for t in buffers.values()} == copies


def test_a_captured_checkpoint_keeps_tied_weights_tied(tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    torch.manual_seed(0)
    m = Tied()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    info = write_checkpoint(tmp_path, capture_checkpoint(0, generation=0, model=m, optimizer=opt,
                                                         data_position=0))
    state = torch.load(read_payload(info["path"]))
    assert state["model"]["embed.weight"].data_ptr() == state["model"]["head.weight"].data_ptr()


def read_payload(path):
    import io
    header = read_header(path)
    with open(path, "rb") as f:
        f.seek(header["payload_offset"])
        return io.BytesIO(f.read())
