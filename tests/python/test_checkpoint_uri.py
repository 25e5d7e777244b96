"""spikeguard.checkpoint_uri reads checkpoint URIs as the daemon and the C++
worker do (storage/checkpoint/checkpoint_uri.h): the cases of
tests/testdata/checkpoint_uris.tsv, which the C++ unit test
(tests/storage/checkpoint/checkpoint_uri_test.cc) checks against the C++
reading too. And spikeguard.checkpoint opens what that reading names.

Before, the package read a file:// URI with urllib: the host was ignored
(file://evil.host/x was /x), '?', '#' and ';' cut the path short, %2F
became a separator, and os.path.abspath folded '..' segments the daemon
refuses (and the kernel would resolve after symbolic links)."""

import os
from pathlib import Path

import pytest

from spikeguard.checkpoint_uri import (MAX_CHECKPOINT_URI, CheckpointUriError,
                                       checkpoint_path_of_uri, checkpoint_uri_of_path)

CASES = Path(__file__).resolve().parents[1] / "testdata" / "checkpoint_uris.tsv"


def _unescape(field: str) -> bytes:
    return field.encode("ascii").decode("unicode_escape").encode("latin-1")


def _cases(kind):
    out = []
    for number, line in enumerate(CASES.read_text().splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        k, given, expected = line.split("\t")
        if k == kind:
            out.append(pytest.param(_unescape(given), _unescape(expected), id=f"line{number}"))
    return out


def test_the_table_has_every_kind_of_case():
    assert len(_cases("path")) >= 15 and len(_cases("refuse")) >= 25 and len(_cases("uri")) >= 5


@pytest.mark.parametrize("uri,path", _cases("path"))
def test_accepted_uris_name_the_path(uri, path):
    assert os.fsencode(checkpoint_path_of_uri(uri)) == path
    # A str URI reads the same as its bytes.
    assert os.fsencode(checkpoint_path_of_uri(os.fsdecode(uri))) == path


@pytest.mark.parametrize("uri,words", _cases("refuse"))
def test_refused_uris_say_why(uri, words):
    with pytest.raises(CheckpointUriError) as e:
        checkpoint_path_of_uri(uri)
    assert words.decode() in str(e.value)


@pytest.mark.parametrize("path,uri", _cases("uri"))
def test_uris_of_paths_round_trip(path, uri):
    assert checkpoint_uri_of_path(path) == uri.decode()
    assert os.fsencode(checkpoint_path_of_uri(uri)) == path


def test_an_over_long_uri_is_refused():
    checkpoint_path_of_uri("/" + "a" * (MAX_CHECKPOINT_URI - 1))
    with pytest.raises(CheckpointUriError, match="longer than 4096 bytes"):
        checkpoint_path_of_uri("/" + "a" * MAX_CHECKPOINT_URI)


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("uri,words", _cases("refuse"))
def test_the_checkpoint_module_refuses_what_the_rule_refuses(uri, words):
    from spikeguard import checkpoint as ck
    if uri and not uri.startswith(b"/") and b":" not in uri:
        pytest.skip("a relative path: taken from the current directory (a command line's)")
    with pytest.raises(ck.CheckpointError) as e:
        ck._path_of(os.fsdecode(uri))
    assert words.decode() in str(e.value)


def test_the_checkpoint_module_loads_the_file_the_rule_names(tmp_path):
    from spikeguard.checkpoint import load_checkpoint, save_checkpoint
    d = tmp_path / "a;b?c#d %"
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    info = save_checkpoint(d, 3, generation=0, model=model, optimizer=opt, data_position=3)
    assert info["uri"] == checkpoint_uri_of_path(info["path"])
    assert "%3B" in info["uri"] and "%3F" in info["uri"] and "%23" in info["uri"]
    assert load_checkpoint(info["uri"], model=model, optimizer=opt)["path"] == info["path"]
    localhost = info["uri"].replace("file://", "file://localhost", 1)
    assert load_checkpoint(localhost, model=model, optimizer=opt)["step"] == 3
    # The host is not ignored, and ';' no longer cuts the path.
    with pytest.raises(Exception, match="is not this machine"):
        load_checkpoint(info["uri"].replace("file://", "file://evil.host", 1),
                        model=model, optimizer=opt)
    with pytest.raises(Exception, match="'\\?', '#' and ';'"):
        load_checkpoint("file://" + info["path"], model=model, optimizer=opt)
    # A relative path given on a command line still loads.
    os.chdir(tmp_path)
    rel = os.path.relpath(info["path"])
    assert load_checkpoint(rel, model=model, optimizer=opt)["step"] == 3
    assert load_checkpoint(Path(rel), model=model, optimizer=opt)["step"] == 3
