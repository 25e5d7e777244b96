"""The one reading of a checkpoint URI, as storage/checkpoint/checkpoint_uri.h
reads it in C++: the daemon confines the file a URI names, the workers open
it, and a URI the daemon confined must name the same file for all of them.

Accepted:
    /ABS/PATH                   a plain absolute path, taken literally
    file:///ABS/PATH            %XX escapes decoded, once
    file://localhost/ABS/PATH   the same path as file:///ABS/PATH
Refused (CheckpointUriError, naming the URI and what is wrong): another
scheme (s3://, http://, ...), a host other than "localhost", a relative path,
a bad %-escape, NUL (literal or %00), more than 4096 bytes; an encoded
separator (%2F); '?', '#' or ';' in a file:// URI (urllib.parse would split
them off as a query, a fragment or parameters: encode them as %3F, %23,
%3B); a "." or ".." segment, literal or encoded (os.path.abspath and the
kernel, which follows symbolic links before "..", disagree about where it
leads).

URIs are read as bytes (a str is encoded as the OS encodes file names,
os.fsencode), so a %-escape that is not UTF-8 names the same bytes the
daemon's path holds. tests/testdata/checkpoint_uris.tsv holds the cases both
implementations are tested against (tests/storage/checkpoint and
tests/python/test_checkpoint_uri.py).
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Union

__all__ = ["CheckpointUriError", "MAX_CHECKPOINT_URI", "checkpoint_path_of_uri",
           "checkpoint_uri_of_path"]

MAX_CHECKPOINT_URI = 4096
_HEX = b"0123456789abcdefABCDEF"


class CheckpointUriError(ValueError):
    """A checkpoint URI refused by the shared rule; the message names it and why."""


def _quoted(text: bytes) -> str:
    head = text[:256]
    out = "".join(chr(c) if 0x20 <= c < 0x7F and c not in b"'\"\\" else f"\\x{c:02x}"
                  for c in head)
    return "'" + out + ("...'" if len(text) > len(head) else "'")


def _bad(uri: bytes, why: str) -> CheckpointUriError:
    return CheckpointUriError(f"uri {_quoted(uri)}: {why}")


def checkpoint_path_of_uri(uri: Union[str, bytes]) -> str:
    """The absolute path `uri` names (a str, os.fsdecode of its bytes), or
    CheckpointUriError."""
    b = os.fsencode(uri)
    if not b:
        raise CheckpointUriError("uri: empty")
    if len(b) > MAX_CHECKPOINT_URI:
        raise CheckpointUriError(f"uri: longer than {MAX_CHECKPOINT_URI} bytes")
    if b"\0" in b:
        raise _bad(b, "contains NUL")
    if b.startswith(b"file://"):
        rest = b[7:]
        slash = rest.find(b"/")
        host = rest if slash < 0 else rest[:slash]
        if host and host.lower() != b"localhost":
            raise _bad(b, f"host {_quoted(host)} is not this machine: a file:// URI names a local "
                          "path (file:///PATH or file://localhost/PATH)")
        if slash < 0:
            raise _bad(b, "a file:// URI must name a local absolute path (file:///PATH)")
        rest = rest[slash:]
        if any(c in rest for c in b"?#;"):
            raise _bad(b, "'?', '#' and ';' (a query, fragment or parameters) are not part of a "
                          "checkpoint URI; encode them in a file name as %3F, %23 and %3B")
        path = bytearray()
        i = 0
        while i < len(rest):
            c = rest[i]
            if c != ord("%"):
                path.append(c)
                i += 1
                continue
            if i + 2 >= len(rest) or rest[i + 1] not in _HEX or rest[i + 2] not in _HEX:
                raise _bad(b, f"bad %-escape at byte {7 + slash + i}")
            value = int(rest[i + 1:i + 3], 16)
            if value == 0:
                raise _bad(b, "contains NUL (%00)")
            if value == ord("/"):
                raise _bad(b, "an encoded '/' (%2F) is not a file name's byte")
            path.append(value)
            i += 3
        path = bytes(path)
    elif b"://" in b or (b[:1] != b"/" and b":" in b):
        raise _bad(b, "only a local path or a file:// URI names a checkpoint")
    else:
        path = b
    if not path.startswith(b"/"):
        raise _bad(b, "a relative path; give an absolute path in the run's checkpoint root")
    for segment in path.split(b"/"):
        if segment in (b".", b".."):
            raise _bad(b, f"a '{segment.decode()}' segment: name the checkpoint by its path "
                          "without '.' or '..'")
    return os.fsdecode(path)


def checkpoint_uri_of_path(absolute_path: Union[str, bytes, os.PathLike]) -> str:
    """The file:// URI of an absolute path: the bytes outside [A-Za-z0-9-._~/]
    %-encoded, so checkpoint_path_of_uri(checkpoint_uri_of_path(p)) == p."""
    b = os.fsencode(absolute_path)
    if not b.startswith(b"/"):
        raise ValueError(f"not an absolute path: {_quoted(b)}")
    return "file://" + urllib.parse.quote(b, safe="/")
