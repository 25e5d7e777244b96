// torch_checkpoint.h
// -----------------------------------------------------------------------------
// The head of a spikeguard PyTorch checkpoint, the file
// worker/python/spikeguard/checkpoint.py writes (docs/ARCHITECTURE.md,
// "Determinism and checkpoints"), read by its layout:
//
//   "SGTORCH1"                        8-byte magic
//   u32 little-endian header length   then the header, UTF-8 JSON padded
//                                     with spaces: {"format": 1, "step",
//                                     "data_position", "payload_bytes",
//                                     "sha256" (of the payload), ...}
//   payload                           torch.save() of the state dict
//
// The daemon reads only this head to learn the checksum a file carries and
// where its payload lies; the Python loader checks the payload.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace spikeguard::storage {

// Magic and header length: the bytes before the JSON header.
inline constexpr size_t kTorchCheckpointPrefixSize = 12;
// The longest header a reader accepts (as the Python reader).
inline constexpr uint32_t kTorchCheckpointMaxHeader = 1u << 20;
inline constexpr int kTorchCheckpointFormat = 1;

// Whether `head` (at least the file's first 8 bytes) starts with the magic.
bool HasTorchCheckpointMagic(absl::string_view head);

// The header's length, given the file's first kTorchCheckpointPrefixSize
// bytes (magic checked). DATA_LOSS naming `source` when they are short, not
// this format, or claim more than kTorchCheckpointMaxHeader.
absl::StatusOr<uint32_t> TorchCheckpointHeaderLength(absl::string_view prefix,
                                                     absl::string_view source);

struct TorchCheckpointHeader {
  int64_t step = 0;
  int64_t data_position = 0;
  int64_t payload_bytes = 0;
  std::string sha256;           // 64 lowercase hex digits
  int64_t payload_offset = 0;   // prefix + header length
};

// Parses the header of `header_length` bytes (the JSON after the prefix),
// as the Python reader does: an object with "format" 1 and the keys above
// ("sha256" 64 hex digits). DATA_LOSS naming `source` otherwise.
absl::StatusOr<TorchCheckpointHeader> ParseTorchCheckpointHeader(absl::string_view json,
                                                                 absl::string_view source);

}  // namespace spikeguard::storage
