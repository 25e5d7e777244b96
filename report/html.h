// html.h
// -----------------------------------------------------------------------------
// Escaping for the HTML and SVG the report writes. Everything a report shows
// can come from a user (run names, document bytes, worker messages), so every
// string goes through one of these before it is written:
//
//   out += "<td>" + report::HtmlEscape(run.name()) + "</td>";
//
// HtmlEscape: & < > " ' become entities; bytes that are not valid UTF-8 become
// U+FFFD; NUL and other control characters (except tab and newline) become
// U+FFFD too, so nothing invisible or undecodable reaches the page.
// BytePreview: a readable view of raw document bytes: printable ASCII as is,
// everything else as \xNN (then escaped), cut at `max_bytes`.
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace spikeguard::report {

std::string HtmlEscape(absl::string_view text);

// Printable ASCII kept, newline as "\n", other bytes as "\xNN"; "…" when cut.
// The result is plain text: HtmlEscape it before writing.
std::string BytePreview(absl::string_view bytes, size_t max_bytes = 256);

}  // namespace spikeguard::report
