// bench_util.h: small helpers the daemon benchmarks share.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace spikeguard::bench {

// Bytes of a file; 0 when it is absent.
inline int64_t FileBytes(const std::string& path) {
  std::error_code ec;
  const auto n = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<int64_t>(n);
}

// A SQLite catalog with its WAL and shared-memory files.
inline int64_t CatalogBytes(const std::string& db) {
  return FileBytes(db) + FileBytes(db + "-wal") + FileBytes(db + "-shm");
}

// The p-quantile (0..1) of `v` (nearest rank); 0 when empty.
inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace spikeguard::bench
