#include "base/logging.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace spikeguard {
namespace {

LogLevel MinLevel() {
  static const LogLevel level = [] {
    const char* env = std::getenv("SPIKEGUARD_LOG_LEVEL");
    if (env == nullptr) return LogLevel::kInfo;
    if (std::strcmp(env, "DEBUG") == 0) return LogLevel::kDebug;
    if (std::strcmp(env, "WARNING") == 0) return LogLevel::kWarning;
    if (std::strcmp(env, "ERROR") == 0) return LogLevel::kError;
    return LogLevel::kInfo;
  }();
  return level;
}

const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

bool LogEnabled(LogLevel level) { return level >= MinLevel(); }

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  static constexpr char kLetters[] = "DIWEF";
  stream_ << kLetters[static_cast<int>(level)]
          << absl::FormatTime("%m%d %H:%M:%E3S", absl::Now(), absl::LocalTimeZone()) << ' '
          << Basename(file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  static std::mutex mu;
  {
    std::lock_guard<std::mutex> lock(mu);
    std::fputs(stream_.str().c_str(), stderr);
    std::fflush(stderr);
  }
  if (level_ == LogLevel::kFatal) std::abort();
}

}  // namespace spikeguard
