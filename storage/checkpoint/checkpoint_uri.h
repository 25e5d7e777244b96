// checkpoint_uri.h
// -----------------------------------------------------------------------------
// The one reading of a checkpoint URI. The daemon's confinement check, the
// reference worker (loading a rewind's checkpoint, comparing retention pins,
// naming the files it saved and deleted) and anything else that turns a
// checkpoint URI into a file go through CheckpointPathOfUri, so a URI the
// daemon confined names the same file for whoever opens it. The Python
// package reads URIs by the same rule (spikeguard.checkpoint_uri); both are
// tested against the cases of tests/testdata/checkpoint_uris.tsv: change
// the rule there and in both.
//
// Accepted:
//   /ABS/PATH                   a plain absolute path, taken literally
//   file:///ABS/PATH            %XX escapes decoded, once
//   file://localhost/ABS/PATH   the same path as file:///ABS/PATH
// Refused, with an error naming the URI and what is wrong:
//   another scheme (s3://, http://, ...), a host other than "localhost",
//   a relative path, a bad %-escape, NUL (literal or %00), longer than
//   4096 bytes;
//   an encoded separator (%2F): no file name holds a '/', so it only hides
//   one from a reader that does not decode;
//   '?', '#' or ';' in a file:// URI: a reader that splits off a query, a
//   fragment or parameters (Python's urlparse) would open another file
//   (encode them as %3F, %23 and %3B);
//   a "." or ".." segment, literal or encoded: a reader that normalizes the
//   text (Python's os.path.abspath) and the kernel, which follows symbolic
//   links before "..", disagree about where it leads.
//
// CheckpointUriOfPath is the inverse for absolute paths: the bytes outside
// [A-Za-z0-9-._~/] are %-encoded (as Python's urllib.parse.quote does), so
// CheckpointPathOfUri(CheckpointUriOfPath(p)) == p.
#pragma once

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace spikeguard::storage {

inline constexpr size_t kMaxCheckpointUri = 4096;

absl::StatusOr<std::string> CheckpointPathOfUri(absl::string_view uri);

std::string CheckpointUriOfPath(absl::string_view absolute_path);

}  // namespace spikeguard::storage
