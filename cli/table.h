// table.h
// -----------------------------------------------------------------------------
// Plain-text tables and value formatting for spikectl's human output.
//
// Columns are separated by two spaces and padded to their widest cell;
// numeric columns are right-aligned so digits line up. No trailing spaces.
//
//   Table t({"STEP", "LOSS"});
//   t.AlignRight(0);
//   t.AlignRight(1);
//   t.AddRow({"100", FormatDouble(2.5)});
//   out << t.Render();
//   //  STEP  LOSS
//   //   100   2.5
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spikeguard::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> headers);

  void AlignRight(size_t column);
  // Rows shorter than the header are padded with empty cells.
  void AddRow(std::vector<std::string> cells);
  size_t rows() const { return rows_.size(); }

  // Header line plus one line per row, each ending in '\n'.
  std::string Render() const;

 private:
  std::vector<std::string> headers_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

// Key/value block ("key:  value" lines, keys padded to one width), for
// single objects such as a run or the daemon's status.
class KeyValueBlock {
 public:
  void Add(std::string key, std::string value);
  std::string Render() const;

 private:
  std::vector<std::pair<std::string, std::string>> items_;
};

// "%.6g"; NaN and infinities as nan, inf, -inf (never "NaN" or "1.#INF").
std::string FormatDouble(double value);
// UTC "2024-05-01 12:00:00"; 0 (unset) as "-".
std::string FormatUnixMillis(int64_t unix_ms);
// 1536 -> "1.5 KiB".
std::string FormatBytes(int64_t bytes);
std::string FormatBool(bool value);

}  // namespace spikeguard::cli
