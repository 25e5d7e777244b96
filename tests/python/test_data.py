"""spikeguard.data: the Python data order is the C++ data order.

The binding (spikeguard._corpus) is checked against two paths that do not go
through it: spikeguard-corpus-dump (a small C++ program over storage/corpus,
built beside the binding) and the C++ reference worker's own telemetry
(step → data_position, tokens per domain). Poisons placed by the
synthesizer must be where it says they are.
"""

import os
import re
import subprocess
import threading

import numpy as np
import pytest

from spikeguard import _corpus
from spikeguard.data import Batch, Corpus, DataOrder, plan_text, shard_bounds

BUILD = os.environ.get("SPIKEGUARD_BUILD_DIR",
                       os.path.join(os.path.dirname(__file__), "..", "..", "build"))
WORKER = os.path.join(BUILD, "worker", "spikeguard-worker")
DUMP = os.path.join(BUILD, "worker", "python", "binding", "spikeguard-corpus-dump")
POISON_LINE = re.compile(r"^poison (\w+) at position (\d+):((?: [A-Za-z0-9_.-]+:\d+)+)$")


def _masks_supported():
    try:
        _corpus.normalize_plan("0-;drop=3:1")
        return True
    except ValueError:
        return False


def synth(out, seed, poisons=(), positions=400):
    cmd = [WORKER, "corpus", "synth", "--out", str(out), "--seed", str(seed),
           "--positions", str(positions)]
    for p in poisons:
        cmd += ["--poison", p]
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    placed = []
    fingerprint = None
    for line in res.stdout.splitlines():
        m = POISON_LINE.match(line)
        if m:
            docs = [(d, int(i)) for d, i in (x.split(":") for x in m.group(3).split())]
            placed.append({"kind": m.group(1), "position": int(m.group(2)), "documents": docs})
        elif line.startswith("fingerprint "):
            fingerprint = line.split()[1]
    return placed, fingerprint


@pytest.fixture(scope="module")
def synth_corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    placed, fingerprint = synth(out, 11, ["highbytes@40", "junk@7"])
    assert len(placed) == 2, "synth printed no 'poison KIND at position P: domain:id ...' lines"
    return str(out), placed, fingerprint


@pytest.fixture(scope="module")
def corpus(synth_corpus):
    return Corpus.open(synth_corpus[0])


def cpp_dump(corpus_dir, plan, steps):
    """spikeguard-corpus-dump's view: {step: (position, docs, [(domain, bytes)])}."""
    res = subprocess.run([DUMP, corpus_dir, plan] + [str(s) for s in steps],
                         check=True, capture_output=True, text=True)
    out, cur = {}, None
    for line in res.stdout.splitlines():
        f = line.split()
        if f[0] == "step":
            cur = int(f[1])
            out[cur] = {"position": int(f[3]), "rows": int(f[5]), "docs": [], "data": []}
        elif f[0] == "docs":
            out[cur]["docs"] = [(d, int(i)) for d, i in (x.split(":") for x in f[1:])]
        elif f[0] == "row":
            out[cur]["data"].append((int(f[1]), bytes.fromhex(f[2])))
    return out


# --- the corpus -------------------------------------------------------------

def test_open_reads_domains_fingerprint_and_defaults(corpus, synth_corpus):
    _, placed, fingerprint = synth_corpus
    assert corpus.domain_names == ["code", "numbers", "prose"]
    assert corpus.fingerprint == fingerprint
    assert corpus.default_manifest == {
        "seed": 11, "global_batch_size": 16, "sequence_length": 64,
        "blend": {"code": 0.25, "numbers": 0.25, "prose": 0.5}, "plan": "0-"}
    assert [(p["kind"], p["position"], [tuple(d) for d in p["documents"]])
            for p in corpus.poisons] == [(p["kind"], p["position"], p["documents"])
                                         for p in sorted(placed, key=lambda p: p["position"])]


def test_defaults_come_from_corpus_meta(corpus):
    order = DataOrder(corpus)
    assert (order.seed, order.global_batch_size, order.sequence_length) == (11, 16, 64)
    assert order.plan == "0-"
    assert order.step_count is None
    assert order.slots_per_domain == {"code": 4, "numbers": 4, "prose": 8}
    assert order.manifest["dataset_fingerprint"] == corpus.fingerprint


# --- agreement with C++ paths that do not use the binding --------------------

PLANS = ["", "0-300,305-", "10-20,0-10,20-"]


@pytest.mark.parametrize("plan", PLANS)
def test_batches_and_documents_equal_the_cpp_dump(corpus, synth_corpus, plan):
    steps = [0, 1, 7, 9, 10, 19, 20, 40, 299, 300, 301, 777]
    cpp = cpp_dump(synth_corpus[0], plan, steps)
    order = DataOrder(corpus, plan=plan)
    for step in steps:
        want = cpp[step]
        b = order.batch(step)
        assert b.step == step
        assert b.position == order.position_for_step(step) == want["position"], step
        assert b.rows == want["rows"] == b.tokens.shape[0]
        assert b.tokens.dtype == np.uint8 and b.tokens.shape == (b.rows, 65)
        assert b.domains.dtype == np.int32 and b.domains.shape == (b.rows,)
        assert [(int(d), bytes(r)) for d, r in zip(b.domains, b.tokens)] == want["data"], step
        assert order.documents_at(b.position) == want["docs"], step


def test_masked_plan_equals_the_cpp_dump(corpus, synth_corpus):
    if not _masks_supported():
        pytest.skip("this build's DataPlan has no sample masks")
    plan = "0-300,305-;drop=2:0.5.15;drop=40:1"
    steps = [1, 2, 3, 40, 300]
    cpp = cpp_dump(synth_corpus[0], plan, steps)
    order = DataOrder(corpus, plan=plan)
    for step in steps:
        b = order.batch(step)
        assert (b.position, b.rows) == (cpp[step]["position"], cpp[step]["rows"])
        assert [(int(d), bytes(r)) for d, r in zip(b.domains, b.tokens)] == cpp[step]["data"]


def test_step_positions_and_domain_tokens_equal_the_reference_worker(synth_corpus, tmp_path):
    corpus_dir = synth_corpus[0]
    telemetry = tmp_path / "t.jsonl"
    plan = "0-3,5-9,40-"
    subprocess.run([WORKER, "train", "--corpus", corpus_dir, "--no-daemon", "--telemetry-out",
                    str(telemetry), "--plan", plan, "--stop-after", "11"],
                   check=True, capture_output=True, text=True, timeout=300)
    import json
    reports = [json.loads(line) for line in telemetry.read_text().splitlines()]
    assert len(reports) >= 10
    order = DataOrder(Corpus.open(corpus_dir), plan=plan)
    names = order.corpus.domain_names
    for r in reports:
        step = int(r["step"])
        b = order.batch(step)
        assert b.position == int(r["data_position"]), step
        assert b.tokens_total == int(r["tokens"])
        counts = np.bincount(b.domains, minlength=len(names))
        want = {dl["domain"]: int(dl["tokens"]) for dl in r["domain_losses"]}
        got = {names[d]: int(c) * order.sequence_length for d, c in enumerate(counts) if c}
        assert got == want, step
    # step 7 of "0-3,5-9,40-" is the highbytes poison at position 40
    assert int(reports[7]["data_position"]) == 40


# --- poisons: the synthesizer's placement -----------------------------------

def test_poison_documents_and_bytes_are_where_synth_put_them(corpus, synth_corpus):
    _, placed, _ = synth_corpus
    order = DataOrder(corpus, plan="0-30,35-")
    for p in placed:
        pos = p["position"]
        docs = order.documents_at(pos)
        for d in p["documents"]:
            assert d in docs, (p, docs)
        step = pos if pos < 30 else pos - 5
        assert order.position_for_step(step) == pos
        b = order.batch(step)
        joined = b.tokens.tobytes()
        for d in p["documents"]:
            body = corpus.document_bytes(*d)
            # Each poison document contributes a long run of its bytes to the batch.
            assert body[:32] in joined or body[-32:] in joined, d
    highbytes = next(p for p in placed if p["kind"] == "highbytes")
    b = order.batch(highbytes["position"] - 5)
    assert (b.tokens >= 128).mean() > 0.9
    for d in highbytes["documents"]:
        assert min(corpus.document_bytes(*d)) >= 128
    clean = order.batch(0)
    assert clean.tokens.max() < 128  # the ASCII domains never hold high bytes


# --- plans --------------------------------------------------------------------

def test_plan_hole_skips_positions(corpus):
    full = DataOrder(corpus)
    holed = DataOrder(corpus, plan="0-300,305-")
    assert holed.plan == "0-300,305-"
    assert [holed.position_for_step(s) for s in (0, 299, 300, 301)] == [0, 299, 305, 306]
    for s, p in ((299, 299), (300, 305), (500, 505)):
        a, b = holed.batch(s), full.batch_at(p)
        assert a.position == p and np.array_equal(a.tokens, b.tokens)
        assert np.array_equal(a.domains, b.domains)
        assert holed.documents_at(p) == full.documents_at(p)


def test_with_plan_keeps_the_manifest(corpus):
    order = DataOrder(corpus, seed=3, global_batch_size=8, sequence_length=32)
    other = order.with_plan("0-10, 20-")
    assert other.plan == "0-10,20-"
    assert (other.seed, other.global_batch_size, other.sequence_length, other.blend) == \
        (3, 8, 32, order.blend)
    assert np.array_equal(other.batch(10).tokens, order.batch(20).tokens)
    assert other.with_plan("").plan == "0-"


def test_bounded_plan_ends(corpus):
    order = DataOrder(corpus, plan="5-8")
    assert order.step_count == 3
    assert [b.position for b in order.iter_batches()] == [5, 6, 7]
    with pytest.raises(IndexError, match="past the end"):
        order.position_for_step(3)


def test_masks_drop_rows(corpus):
    if not _masks_supported():
        pytest.skip("this build's DataPlan has no sample masks")
    full = DataOrder(corpus).batch_at(12)
    masked = DataOrder(corpus, plan="0-;drop=12:0.3.15").batch_at(12)
    keep = [j for j in range(16) if j not in (0, 3, 15)]
    assert masked.rows == 13 and masked.global_rows == 16
    assert masked.tokens_total == 13 * 64
    assert masked.slots.tolist() == keep
    assert np.array_equal(masked.tokens, full.tokens[keep])
    assert np.array_equal(masked.domains, full.domains[keep])


# --- sharding -------------------------------------------------------------------

def test_shards_concatenate_back_to_the_batch(corpus):
    order = DataOrder(corpus)
    batches = [order.batch(3)]
    if _masks_supported():
        batches.append(DataOrder(corpus, plan="0-;drop=3:" + ".".join(map(str, range(13)))).batch(3))
        assert batches[-1].rows == 3
    for b in batches:
        for world in (1, 2, 3, 4, 5, 7, 16):
            parts = [order.shard(b, r, world) for r in range(world)]
            assert np.array_equal(np.concatenate([t for t, _ in parts]), b.tokens)
            assert np.array_equal(np.concatenate([d for _, d in parts]), b.domains)
            sizes = [len(t) for t, _ in parts]
            assert max(sizes) - min(sizes) <= 1
            assert [len(d) for _, d in parts] == sizes
            if b.rows < world:
                assert 0 in sizes
            again = order.shard(b, world - 1, world)
            assert np.array_equal(again[0], parts[-1][0])


def test_shard_bounds_are_checked():
    assert shard_bounds(16, 0, 4) == (0, 4) and shard_bounds(16, 3, 4) == (12, 16)
    assert shard_bounds(3, 0, 4) == (0, 0) and shard_bounds(3, 3, 4) == (2, 3)
    for rank, world in ((4, 4), (-1, 4), (0, 0), (0, True)):
        with pytest.raises(ValueError):
            shard_bounds(16, rank, world)


# --- determinism and threads ---------------------------------------------------------

def test_same_manifest_same_batches_other_seed_other_batches(synth_corpus):
    a = DataOrder(Corpus.open(synth_corpus[0]))
    b = DataOrder(Corpus.open(synth_corpus[0]))
    c = DataOrder(Corpus.open(synth_corpus[0]), seed=12)
    for s in (0, 5, 123):
        assert np.array_equal(a.batch(s).tokens, b.batch(s).tokens)
    assert not np.array_equal(a.batch(5).tokens, c.batch(5).tokens)


def test_epoch_wrap_and_threads_agree(corpus):
    order = DataOrder(corpus)
    steps = list(range(0, 4000, 97))  # past the first epoch (400 positions)
    serial = {s: order.batch(s).tokens for s in steps}
    results = {}

    def work(chunk):
        for s in chunk:
            results[s] = order.batch(s).tokens

    threads = [threading.Thread(target=work, args=(steps[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(results[s], serial[s]) for s in steps)
    epochs = {sp["epoch"] for sample in order.resolve(3000) for sp in sample["spans"]}
    assert max(epochs) >= 1


# --- errors -------------------------------------------------------------------------

def test_bad_corpus_dirs_name_the_dir_and_problem(tmp_path, synth_corpus):
    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing)) + ".*does not exist"):
        Corpus.open(missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=re.escape(str(empty)) + ".*no <domain>.idx"):
        Corpus.open(empty)
    half = tmp_path / "half"
    half.mkdir()
    src = synth_corpus[0]
    (half / "code.idx").write_bytes(open(os.path.join(src, "code.idx"), "rb").read())
    with pytest.raises(OSError, match=re.escape(str(half))):
        Corpus.open(half)
    bad_meta = tmp_path / "badmeta"
    bad_meta.mkdir()
    for f in ("code.idx", "code.bin"):
        (bad_meta / f).write_bytes(open(os.path.join(src, f), "rb").read())
    (bad_meta / "corpus.meta").write_text("format 1\nseed banana\n")
    with pytest.raises(ValueError, match=re.escape(str(bad_meta)) + ".*bad seed"):
        Corpus.open(bad_meta)
    # No corpus.meta at all: the C++ Manifest defaults.
    (bad_meta / "corpus.meta").unlink()
    c = Corpus.open(bad_meta)
    assert not c.has_metadata and c.default_manifest["global_batch_size"] == 16
    assert DataOrder(c).batch(0).rows == 16


@pytest.mark.parametrize("plan", ["abc", "5-3", "0-,5-", "-1-4", "1-2-3"])
def test_bad_plans_are_refused(corpus, plan):
    with pytest.raises(ValueError, match="plan"):
        DataOrder(corpus, plan=plan)


@pytest.mark.parametrize("kwargs,field", [
    ({"global_batch_size": 0}, "global_batch_size"),
    ({"global_batch_size": 2.5}, "global_batch_size"),
    ({"sequence_length": -1}, "sequence_length"),
    ({"seed": -1}, "seed"),
    ({"seed": "7"}, "seed"),
    ({"blend": {"nope": 1.0}}, "blend"),
    ({"blend": {"code": -1.0}}, "blend"),
    ({"blend": {"code": 1.0, "prose": 1000.0}}, "slot"),
    ({"plan": 5}, "plan"),
])
def test_bad_fields_are_refused(corpus, kwargs, field):
    with pytest.raises(ValueError, match=field):
        DataOrder(corpus, **kwargs)


def test_bad_steps_and_positions(corpus):
    order = DataOrder(corpus)
    with pytest.raises(ValueError, match="step"):
        order.position_for_step(-1)
    with pytest.raises(ValueError, match="position"):
        order.batch_at(-3)
    with pytest.raises(ValueError, match="step"):
        order.batch(1.5)
    with pytest.raises(ValueError, match="corpus"):
        DataOrder("/tmp")


def test_data_order_proto(corpus):
    try:
        from spikeguard.v1 import worker_pb2  # noqa: F401
    except ImportError:
        pytest.skip("generated stubs (spikeguard.v1) not built")
    msg = DataOrder(corpus, seed=5).data_order_proto()
    assert msg.dataset_fingerprint == corpus.fingerprint
    assert (msg.seed, msg.global_batch_size, msg.sequence_length) == (5, 16, 64)
    assert dict(msg.blend) == {"code": 0.25, "numbers": 0.25, "prose": 0.5}


def test_batch_type(corpus):
    b = DataOrder(corpus).batch(0)
    assert isinstance(b, Batch)
    assert (b.rows, b.global_rows, b.tokens_total) == (16, 16, 16 * 64)
    assert b.slots.tolist() == list(range(16))


class _Range:
    def __init__(self, begin, end):
        self.begin, self.end = begin, end


class _Mask:
    def __init__(self, position, slots):
        self.position, self.slots = position, slots


class _Plan:
    def __init__(self, ranges, masks=()):
        self.ranges, self.masks = ranges, list(masks)


def test_plan_text_from_text_and_messages(corpus):
    assert plan_text(None) == "" and plan_text("  ") == ""
    assert plan_text(" 0-300 , 305- ") == "0-300,305-"
    assert plan_text(_Plan([])) == ""  # a REWIND without a plan
    assert plan_text(_Plan([_Range(0, 300), _Range(305, -1)])) == "0-300,305-"
    assert plan_text(_Plan([_Range(0, 10), _Range(10, 20)])) == "0-20"  # merged
    with pytest.raises(ValueError, match="plan"):
        plan_text(_Plan([_Range(5, 3)]))
    with pytest.raises(ValueError, match="plan"):
        plan_text(_Plan([_Range(0, -1), _Range(5, 9)]))
    order = DataOrder(corpus).with_plan(_Plan([_Range(0, 300), _Range(305, -1)]))
    assert order.plan == "0-300,305-" and order.position_for_step(300) == 305
    if _masks_supported():
        msg = _Plan([_Range(0, -1)], [_Mask(40, [3, 1])])
        assert plan_text(msg) == _corpus.normalize_plan("0-;drop=40:1.3")
        assert DataOrder(corpus, plan=msg).batch(40).rows == 14
    try:
        from spikeguard.v1 import worker_pb2
    except ImportError:
        return
    msg = worker_pb2.DataPlan()
    msg.ranges.add(begin=0, end=300)
    msg.ranges.add(begin=305, end=-1)
    assert plan_text(msg) == "0-300,305-"
    assert plan_text(worker_pb2.DataPlan()) == ""
