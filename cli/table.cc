#include "cli/table.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace spikeguard::cli {

Table::Table(std::vector<std::string> headers)
    : headers_(std::move(headers)), right_(headers_.size(), false) {}

void Table::AlignRight(size_t column) {
  if (column < right_.size()) right_[column] = true;
}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(std::max(cells.size(), headers_.size()));
  rows_.push_back(std::move(cells));
}

std::string Table::Render() const {
  size_t columns = headers_.size();
  for (const auto& row : rows_) columns = std::max(columns, row.size());
  std::vector<size_t> width(columns, 0);
  for (size_t c = 0; c < headers_.size(); ++c) width[c] = headers_[c].size();
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  auto render_line = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t c = 0; c < columns; ++c) {
      const std::string empty;
      const std::string& cell = c < cells.size() ? cells[c] : empty;
      const size_t pad = width[c] - cell.size();
      if (c > 0) line += "  ";
      if (c < right_.size() && right_[c]) {
        line.append(pad, ' ');
        line += cell;
      } else {
        line += cell;
        line.append(pad, ' ');
      }
    }
    line.erase(line.find_last_not_of(' ') + 1);
    out += line;
    out += '\n';
  };
  render_line(headers_);
  for (const auto& row : rows_) render_line(row);
  return out;
}

void KeyValueBlock::Add(std::string key, std::string value) {
  items_.emplace_back(std::move(key), std::move(value));
}

std::string KeyValueBlock::Render() const {
  size_t width = 0;
  for (const auto& [key, value] : items_) width = std::max(width, key.size());
  std::string out;
  for (const auto& [key, value] : items_) {
    out += key;
    out += ':';
    out.append(width - key.size() + 2, ' ');
    out += value;
    out += '\n';
  }
  return out;
}

std::string FormatDouble(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return absl::StrFormat("%.6g", value);
}

std::string FormatUnixMillis(int64_t unix_ms) {
  if (unix_ms == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

std::string FormatBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (std::fabs(value) >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return absl::StrFormat("%d B", bytes);
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string FormatBool(bool value) { return value ? "yes" : "no"; }

}  // namespace spikeguard::cli
