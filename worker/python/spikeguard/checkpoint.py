"""Atomic, checksummed PyTorch checkpoints for runs under spikeguard.

A checkpoint holds what a rewound run needs to continue exactly where the
original left off: model, optimizer and (optional) LR-scheduler state dicts,
every RNG a trainer typically draws from (torch CPU, torch CUDA when
available, Python's ``random``, NumPy's global RNG), the step (training steps
completed: a resumed run's first step is ``step``) and the data position that
step consumes, plus any picklable ``extra``. It also records the generation
(the run's timeline: every rewind the daemon orders starts a new one) that
saved it, in its header and in its file name, so that two generations that
save the same step write two files: a probe generation never overwrites the
checkpoint of another generation (which the daemon would then refuse, its
checksum having changed). The daemon names the checkpoint to rewind to by
its URI.

    from spikeguard.checkpoint import save_checkpoint, load_checkpoint, retain
    from spikeguard.data import plan_text

    info = save_checkpoint(ckpt_dir, step, generation=client.generation,
                           model=model, optimizer=opt,
                           scheduler=sched, data_position=order.position_for_step(step),
                           data_plan=order.plan)
    client.checkpoint_saved(info["step"], info["uri"], ...)   # register it
    retain(ckpt_dir, keep=3, pinned_uris=pinned,                # this generation's
           generation=client.generation)                        # old ones go
    ...
    state = load_checkpoint(uri, model=model, optimizer=opt, scheduler=sched)
    step = state["step"]
    # REWIND: the command's plan; without one, the plan saved with the
    # checkpoint (as the reference worker does); without that, the default.
    order = order.with_plan(plan_text(command.data_plan) or state["data_plan"] or "")

File ``g000003-step-000000100.pt`` for step 100 of generation 3
(``g000003-step-000000100-rank3.pt`` for rank 3; the numbers are zero-padded
to at least 6 and 9 digits). Files named ``step-000000100.pt`` (and
``step-000000100-rank3.pt``), as earlier versions wrote them without the
generation, are still listed, loaded, resumed from and cleaned up, as
checkpoints of an unknown generation (``generation`` None), older than any
named one:

    b"SGTORCH1"                       8-byte magic
    u32 little-endian header length   then the header, UTF-8 JSON:
        {"format": 1, "step", "generation", "data_position", "data_plan",
         "rank", "payload_bytes", "sha256" (of the payload), "saved_unix"}
                                      ("generation" absent in older files)
    payload                           torch.save() of the state dict

so ``torch.load`` alone does not read it; ``load_checkpoint`` does, after
checking the length and SHA-256 of the payload. Writes are atomic: the
bytes go to a hidden temporary file in the same directory, which is flushed
and fsynced, renamed to its final name, and the directory fsynced. A crash
leaves either no checkpoint or the complete one, plus at most a hidden
``.g*-step-*.tmp-*`` (earlier: ``.step-*.tmp-*``) file, which listings
ignore and ``clean_temporaries`` removes.

Retention (``retain``) acts per generation: it prunes the files of the
generation it is given and never deletes another generation's file (nor a
legacy one), so a short probe generation cannot delete the checkpoints the
run's own generation (or the daemon's rewind target) still needs. The files
of a generation the run has left stay until retention is run for that
generation; the daemon decides which of them it still needs (pins).
"""

from __future__ import annotations

import collections
import copy as copy_module
import hashlib
import io
import json
import os
import random
import re
import struct
import time
from typing import Any, Dict, Iterable, List, Optional

import numpy as np
import torch

from spikeguard.checkpoint_uri import (CheckpointUriError, checkpoint_path_of_uri,
                                       checkpoint_uri_of_path)

__all__ = [
    "CheckpointError",
    "save_checkpoint",
    "capture_checkpoint",
    "write_checkpoint",
    "CapturedCheckpoint",
    "load_checkpoint",
    "verify_checkpoint",
    "read_header",
    "list_checkpoints",
    "latest_checkpoint",
    "retain",
    "clean_temporaries",
    "checkpoint_path",
]

MAGIC = b"SGTORCH1"
FORMAT = 1
_HEADER_LEN = struct.Struct("<I")
_MAX_HEADER = 1 << 20
# g<generation>-step-<step>[-rank<rank>].pt; the generation part is absent
# in the legacy names (generation unknown).
_NAME = re.compile(r"^(?:g(\d{6,})-)?step-(\d{9,})(?:-rank(\d+))?\.pt$")
_TEMP = re.compile(r"^\.(?:g\d+-)?step-\d+.*\.tmp-")


class CheckpointError(Exception):
    """A checkpoint that cannot be used: missing, truncated, corrupt, not a
    spikeguard checkpoint, or not loadable into the given objects. The
    message names the file; ``path`` holds it."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"checkpoint {path}: {problem}")
        self.path = path
        self.problem = problem


def _path_of(path_or_uri) -> str:
    """The file a checkpoint URI or path names, by the rule the daemon and the
    C++ worker read URIs with (spikeguard.checkpoint_uri), so a URI the daemon
    confined names the same file here. A path object (os.PathLike) is a
    local path. A relative path (which the daemon never sends: it refuses
    them) is taken from the current directory, for paths given on a command
    line."""
    if isinstance(path_or_uri, os.PathLike):
        return os.path.abspath(os.fspath(path_or_uri))
    s = path_or_uri
    b = os.fsencode(s)
    if b and not b.startswith(b"/") and b"://" not in b and b":" not in b:
        return os.path.abspath(s)
    try:
        return checkpoint_path_of_uri(s)
    except CheckpointUriError as e:
        raise CheckpointError(os.fsdecode(s), str(e)) from None


def _uri_of(path: str) -> str:
    return checkpoint_uri_of_path(os.path.abspath(path))


def _check_generation(generation) -> None:
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise ValueError(f"generation must be an int >= 0, got {generation!r}")


def checkpoint_path(directory, step: int, rank: int = 0,
                    generation: Optional[int] = None) -> str:
    """Where save_checkpoint puts the checkpoint of `step` (and `rank`) saved
    by `generation`. generation None: the legacy name earlier versions
    wrote (no generation), which save_checkpoint no longer writes."""
    name = f"step-{int(step):09d}"
    if generation is not None:
        _check_generation(generation)
        name = f"g{int(generation):06d}-{name}"
    if rank != 0:
        name += f"-rank{int(rank)}"
    return os.path.join(os.path.abspath(os.fspath(directory)), name + ".pt")


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rng_state() -> Dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = [s.cpu() for s in state["cuda"]]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:  # another machine shape: restore what maps
            for i, s in enumerate(cuda[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(s, i)


def save_checkpoint(directory, step: int, *, generation: int, model, optimizer,
                    scheduler=None, data_position: int, extra: Optional[dict] = None,
                    rank: int = 0, data_plan: Optional[str] = None) -> dict:
    """Writes the checkpoint of `step`, saved by `generation` (the generation
    the trainer runs: its Client's ``generation``, the REWIND command's
    new_generation), atomically; returns dict(path, uri, step, generation,
    data_position, bytes, checksum, rank). The file name holds the
    generation, so no other generation's checkpoint is ever replaced; the
    same generation saving the same step again replaces its own file.
    `model` may be a DDP
    wrapper (its .module's state is saved, so a plain model loads it).
    `data_plan` (the DataOrder's plan text) is kept as the reference worker
    keeps it: a REWIND whose command carries no plan resumes under the plan
    the checkpoint was saved with (load_checkpoint returns it).

    The same as ``write_checkpoint(directory, capture_checkpoint(...,
    copy=False))``; a trainer that writes in the background captures with a
    copy and writes on another thread."""
    return write_checkpoint(directory, capture_checkpoint(
        step, generation=generation, model=model, optimizer=optimizer, scheduler=scheduler,
        data_position=data_position, extra=extra, rank=rank, data_plan=data_plan, copy=False))


class CapturedCheckpoint:
    """A checkpoint's state as of one step (``capture_checkpoint``), ready
    for ``write_checkpoint``."""

    def __init__(self, step, generation, data_position, rank, data_plan, state, event=None):
        self.step = step
        self.generation = generation
        self.data_position = data_position
        self.rank = rank
        self.data_plan = data_plan
        self.state = state
        # A CUDA event the copies to host memory complete at.
        self._event = event

    def wait_copied(self) -> None:
        if self._event is not None:
            self._event.synchronize()
            self._event = None


def capture_checkpoint(step: int, *, generation: int, model, optimizer, scheduler=None,
                       data_position: int, extra: Optional[dict] = None, rank: int = 0,
                       data_plan: Optional[str] = None, copy: bool = True,
                       buffers: Optional[dict] = None) -> CapturedCheckpoint:
    """What ``save_checkpoint`` saves, as of now (arguments as there).

    copy=True: the tensors are copied (CUDA tensors into pinned host memory,
    asynchronously), so training may go on while ``write_checkpoint`` runs on
    another thread. `buffers`: a dict kept by the caller from one capture to
    the next, whose tensors the copies reuse (no new allocation per
    checkpoint); the previous capture's write must be done before the next
    capture. copy=False: the state refers to the live tensors (write it
    before they change)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if isinstance(data_position, bool) or not isinstance(data_position, int):
        raise ValueError(f"data_position must be an int, got {data_position!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an int >= 0, got {rank!r}")
    _check_generation(generation)
    if data_plan is not None and not isinstance(data_plan, str):
        raise ValueError(f"data_plan must be a plan's text form, got {data_plan!r}")
    state = {
        "spikeguard_checkpoint": FORMAT,
        "step": step,
        "data_position": data_position,
        "data_plan": data_plan,
        "model": _unwrap(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": _rng_state(),
        "extra": extra,
    }
    event = None
    if copy:
        pool = buffers if buffers is not None else {}
        cuda = []
        state = _copied(state, pool, (), {}, cuda)
        if cuda:
            event = torch.cuda.Event()
            event.record()
    return CapturedCheckpoint(step, generation, data_position, rank, data_plan, state, event)


def _copied(obj, pool: dict, key: tuple, memo: dict, cuda: list):
    """`obj` with every tensor copied into `pool`'s buffer for its place
    (CUDA tensors into pinned host memory; tensors sharing memory stay
    shared) and the rest deep-copied."""
    if torch.is_tensor(obj):
        t = obj.detach()
        ident = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
        if ident in memo:
            return memo[ident]
        buf = pool.get(key)
        if (buf is None or buf.shape != t.shape or buf.dtype != t.dtype
                or (t.is_cuda and not buf.is_pinned())):
            buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
            pool[key] = buf
        buf.copy_(t, non_blocking=t.is_cuda)
        if t.is_cuda:
            cuda.append(t)
        memo[ident] = buf
        return buf
    if isinstance(obj, dict):
        out = type(obj)() if type(obj) in (dict, collections.OrderedDict) else {}
        for k, v in obj.items():
            out[k] = _copied(v, pool, key + (k,), memo, cuda)
        meta = getattr(obj, "_metadata", None)
        if meta is not None:  # a module's state_dict: the versions load_state_dict reads
            out._metadata = copy_module.deepcopy(meta)
        return out
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        items = [_copied(v, pool, key + (i,), memo, cuda) for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    return copy_module.deepcopy(obj)


class _HashingWriter:
    """A file's writer that hashes (sha256) and counts what goes through.
    A write that fails is kept in ``error`` and the rest is dropped: an
    exception raised into torch.save's C++ writer would make it throw again
    from its destructor, which aborts the process."""

    def __init__(self, f):
        self.f = f
        self.sha = hashlib.sha256()
        self.n = 0
        self.error: Optional[BaseException] = None

    def write(self, data) -> int:
        if self.error is None:
            try:
                self.sha.update(data)
                self.n += self.f.write(data)
            except BaseException as e:  # noqa: BLE001 - raised again after torch.save
                self.error = e
        return len(data) if not isinstance(data, memoryview) else data.nbytes

    def flush(self) -> None:
        if self.error is None:
            try:
                self.f.flush()
            except BaseException as e:  # noqa: BLE001
                self.error = e


def write_checkpoint(directory, captured: CapturedCheckpoint) -> dict:
    """Writes a captured checkpoint atomically (see ``save_checkpoint``);
    returns its info. Safe on another thread than the training loop's."""
    directory = os.path.abspath(os.fspath(directory))
    os.makedirs(directory, exist_ok=True)
    captured.wait_copied()
    c = captured
    step, generation, rank = c.step, c.generation, c.rank

    def header_of(payload_bytes: int, checksum: str) -> bytes:
        return json.dumps({
            "format": FORMAT, "step": step, "generation": generation,
            "data_position": c.data_position, "rank": rank, "data_plan": c.data_plan,
            "payload_bytes": payload_bytes, "sha256": checksum, "saved_unix": time.time(),
        }, sort_keys=True).encode()

    # The payload streams to the file through the hash; the header before
    # it has a reserved length (the longest it can be, padded with spaces,
    # which JSON ignores) and is written last.
    reserved = len(header_of(10 ** 18, "0" * 64)) + 16
    final = checkpoint_path(directory, step, rank, generation)
    tmp = os.path.join(directory, f".{os.path.basename(final)}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        with open(tmp, "xb") as f:
            f.write(MAGIC)
            f.write(_HEADER_LEN.pack(reserved))
            f.write(b" " * reserved)
            w = _HashingWriter(f)
            torch.save(c.state, w)
            if w.error is not None:
                raise w.error
            checksum = w.sha.hexdigest()
            payload_bytes = w.n
            header = header_of(payload_bytes, checksum)
            if len(header) > reserved:  # cannot happen: the reservation is the longest
                raise RuntimeError(f"checkpoint header of {len(header)} bytes > {reserved}")
            f.seek(len(MAGIC) + _HEADER_LEN.size)
            f.write(header.ljust(reserved))
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(directory)
    return {
        "path": final,
        "uri": _uri_of(final),
        "step": step,
        "generation": generation,
        "data_position": c.data_position,
        "data_plan": c.data_plan,
        "bytes": len(MAGIC) + _HEADER_LEN.size + reserved + payload_bytes,
        "checksum": checksum,
        "rank": rank,
    }


def _unwrap(model):
    return getattr(model, "module", model) if isinstance(
        model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)) else model


def _read_header(f, path: str) -> dict:
    magic = f.read(len(MAGIC))
    if len(magic) < len(MAGIC) or magic != MAGIC:
        if len(magic) < len(MAGIC) and MAGIC.startswith(magic):
            raise CheckpointError(path, f"truncated ({len(magic)} bytes, no complete header)")
        raise CheckpointError(path, "not a spikeguard checkpoint (bad magic)")
    raw = f.read(_HEADER_LEN.size)
    if len(raw) < _HEADER_LEN.size:
        raise CheckpointError(path, "truncated inside the header")
    (n,) = _HEADER_LEN.unpack(raw)
    if n > _MAX_HEADER:
        raise CheckpointError(path, f"corrupt header (claims {n} bytes)")
    body = f.read(n)
    if len(body) < n:
        raise CheckpointError(path, "truncated inside the header")
    try:
        header = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(path, f"corrupt header ({e})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(path, f"unsupported checkpoint format {header.get('format') if isinstance(header, dict) else header!r} (this build reads {FORMAT})")
    for key in ("step", "data_position", "payload_bytes", "sha256"):
        if key not in header:
            raise CheckpointError(path, f"corrupt header (no {key})")
    header["payload_offset"] = len(MAGIC) + _HEADER_LEN.size + n
    return header


def read_header(path_or_uri) -> dict:
    """The header of a checkpoint (step, generation (absent in older files),
    data_position, rank, payload_bytes, sha256, ...) without reading or verifying the payload."""
    path = _path_of(path_or_uri)
    try:
        with open(path, "rb") as f:
            return _read_header(f, path)
    except FileNotFoundError:
        raise CheckpointError(path, "missing (no such file)") from None
    except IsADirectoryError:
        raise CheckpointError(path, "is a directory, not a checkpoint file") from None
    except OSError as e:
        raise CheckpointError(path, f"cannot read: {e.strerror or e}") from None


def _read_verified(path: str, checksum: Optional[str] = None):
    try:
        with open(path, "rb") as f:
            header = _read_header(f, path)
            payload = f.read(header["payload_bytes"] + 1)
    except FileNotFoundError:
        raise CheckpointError(path, "missing (no such file)") from None
    except IsADirectoryError:
        raise CheckpointError(path, "is a directory, not a checkpoint file") from None
    except OSError as e:
        raise CheckpointError(path, f"cannot read: {e.strerror or e}") from None
    want = header["payload_bytes"]
    if len(payload) < want:
        raise CheckpointError(path, f"truncated: payload has {len(payload)} of {want} bytes")
    if len(payload) > want:
        raise CheckpointError(path, f"corrupt: trailing bytes after the {want}-byte payload")
    got = hashlib.sha256(payload).hexdigest()
    if got != header["sha256"]:
        raise CheckpointError(path, f"checksum mismatch: payload sha256 {got}, header says {header['sha256']}")
    if checksum and checksum.lower() != got:
        raise CheckpointError(path, f"checksum mismatch: payload sha256 {got}, the daemon registered {checksum}")
    return header, payload


def verify_checkpoint(path_or_uri) -> dict:
    """Reads the whole file and checks its checksum; returns its header or
    raises CheckpointError."""
    header, _ = _read_verified(_path_of(path_or_uri))
    return header


def load_checkpoint(path_or_uri, *, model, optimizer, scheduler=None, map_location="cpu",
                    checksum: Optional[str] = None) -> dict:
    """Verifies the checkpoint and restores model, optimizer, scheduler and
    every RNG from it; returns dict(step, generation (None for an older
    file that did not record it), data_position, data_plan, extra, path,
    rank). Any path or file:// URI loads, whatever the file's name.

    `checksum`: the sha256 the checkpoint was registered with (a REWIND
    command's ``checkpoint.checksum``); the payload must hash to it. The
    daemon checks before a rewind that the file is the one registered (its
    identity) without reading it; the content is checked here, as it is read."""
    path = _path_of(path_or_uri)
    header, payload = _read_verified(path, checksum)
    try:
        # The full unpickler: the state holds RNG states (NumPy arrays) and
        # the trainer's `extra`, which PyTorch 2.6's default
        # (weights_only=True) refuses. The payload is the trainer's own,
        # and its SHA-256 was checked above.
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=False)
    except Exception as e:  # noqa: BLE001 - torch raises many types here
        raise CheckpointError(path, f"payload does not unpickle: {type(e).__name__}: {e}") from None
    if not isinstance(state, dict) or state.get("spikeguard_checkpoint") != FORMAT:
        raise CheckpointError(path, "payload is not a spikeguard checkpoint state")
    if state["step"] != header["step"] or state["data_position"] != header["data_position"]:
        raise CheckpointError(path, "header and payload disagree on step/data_position")
    if scheduler is not None and state["scheduler"] is None:
        raise CheckpointError(path, "holds no scheduler state, but a scheduler was given")
    try:
        _unwrap(model).load_state_dict(state["model"])
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(path, f"model state does not fit the model: {e}") from None
    try:
        optimizer.load_state_dict(state["optimizer"])
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(path, f"optimizer state does not fit the optimizer: {e}") from None
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])
    _set_rng_state(state["rng"])
    return {
        "step": state["step"],
        "generation": header.get("generation"),
        "data_position": state["data_position"],
        "data_plan": state.get("data_plan"),
        "extra": state["extra"],
        "path": path,
        "rank": header.get("rank", 0),
    }


def _order(entry: dict):
    """Newest last: a higher generation is newer (a rewind starts a new
    generation from an older step; the generation left behind is not where
    the run continues), then the step, then the rank. Legacy files (no
    generation) are older than any named one, as earlier versions wrote them."""
    g = entry["generation"]
    return (-1 if g is None else g, entry["step"], entry["rank"])


def list_checkpoints(directory, rank: Optional[int] = None,
                     generation: Optional[int] = None) -> List[dict]:
    """Checkpoints in `directory`, oldest first by (generation, step, rank),
    legacy files (generation None) first: dict(step, generation, rank, path,
    uri, bytes, data_position, checksum, valid, error). `rank` / `generation`
    given: only that rank's / generation's files (generation None: every
    generation's and the legacy ones). Reads only headers (``valid`` False
    with ``error`` when a header is unreadable or disagrees with the name);
    use verify_checkpoint for the payload. Hidden temporaries are ignored."""
    directory = os.path.abspath(os.fspath(directory))
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        m = _NAME.match(name)
        if not m:
            continue
        g = int(m.group(1)) if m.group(1) is not None else None
        r = int(m.group(3) or 0)
        if rank is not None and r != rank:
            continue
        if generation is not None and g != generation:
            continue
        path = os.path.join(directory, name)
        entry = {"step": int(m.group(2)), "generation": g, "rank": r, "path": path,
                 "uri": _uri_of(path), "bytes": None, "data_position": None, "data_plan": None,
                 "checksum": None, "valid": True, "error": None}
        try:
            entry["bytes"] = os.path.getsize(path)
            h = read_header(path)
            entry["data_position"] = h["data_position"]
            entry["data_plan"] = h.get("data_plan")
            entry["checksum"] = h["sha256"]
            if h["step"] != entry["step"]:
                raise CheckpointError(path, f"header says step {h['step']}")
            if g is not None and h.get("generation") is not None and h["generation"] != g:
                raise CheckpointError(path, f"header says generation {h['generation']}")
        except (CheckpointError, OSError) as e:
            entry["valid"] = False
            entry["error"] = str(e)
        out.append(entry)
    out.sort(key=_order)
    return out


def latest_checkpoint(directory, rank: int = 0,
                      generation: Optional[int] = None) -> Optional[dict]:
    """The newest checkpoint of `rank` whose payload verifies, or None: of
    `generation` when given, else of the highest generation that has one
    (legacy files last)."""
    for entry in reversed(list_checkpoints(directory, rank=rank, generation=generation)):
        try:
            verify_checkpoint(entry["path"])
        except CheckpointError:
            continue
        return entry
    return None


def retain(directory, keep: int, pinned_uris: Iterable[str] = (), *,
           generation: Optional[int]) -> List[dict]:
    """Deletes all but the newest `keep` checkpoint steps of `generation`
    (every rank's file of a step goes together), never a pinned one (a URI
    or path); returns dict(step, generation, uri) for each file deleted,
    oldest first. As in the C++ CheckpointDir::Retain, what stays of the
    generation is every pinned checkpoint plus the newest `keep` unpinned
    ones. Retention is per generation: another generation's files are never
    deleted nor counted, so pass the generation that is saving (generation
    None prunes only the legacy files without a generation in their name).
    Files whose header does not read are left alone and not counted."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an int >= 1, got {keep!r}")
    if generation is not None:
        _check_generation(generation)
    pinned = set()
    for u in pinned_uris:
        try:
            pinned.add(os.path.realpath(_path_of(u)))
        except CheckpointError:
            continue  # refused by the rule, as the C++ worker ignores it: names no file here
    # A file whose header does not read is neither counted nor deleted.
    entries = [e for e in list_checkpoints(directory, generation=generation)
               if e["valid"] and e["generation"] == generation]
    pinned_steps = {e["step"] for e in entries if os.path.realpath(e["path"]) in pinned}
    steps = sorted({e["step"] for e in entries} - pinned_steps, reverse=True)
    doomed = set(steps[keep:])
    deleted = []
    for e in entries:
        if e["step"] not in doomed or os.path.realpath(e["path"]) in pinned:
            continue
        try:
            os.unlink(e["path"])
        except FileNotFoundError:
            continue
        deleted.append({"step": e["step"], "generation": e["generation"], "uri": e["uri"]})
    if deleted:
        _fsync_dir(os.path.abspath(os.fspath(directory)))
    return deleted


def clean_temporaries(directory) -> List[str]:
    """Removes the hidden temporary files interrupted saves left behind; call
    at start-up, before any rank saves. Returns the paths removed."""
    directory = os.path.abspath(os.fspath(directory))
    removed = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        if _TEMP.match(name):
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(os.path.join(directory, name))
            except FileNotFoundError:
                pass
    return removed
