// logging.h
// -----------------------------------------------------------------------------
// Abseil 20220623 has no absl/log; this is the project's one logging header.
// Lines go to stderr as "I1202 16:24:45.123 file.cc:42] message".
//
//   SG_LOG(INFO) << "listening on " << addr;
//   SG_LOG(ERROR) << status;
//
// The minimum level comes from SPIKEGUARD_LOG_LEVEL (DEBUG, INFO, WARNING,
// ERROR); the default is INFO.
#pragma once

#include <sstream>

namespace spikeguard {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

bool LogEnabled(LogLevel level);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Swallows the stream when the level is disabled.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace spikeguard

#define SG_LOG_LEVEL_DEBUG ::spikeguard::LogLevel::kDebug
#define SG_LOG_LEVEL_INFO ::spikeguard::LogLevel::kInfo
#define SG_LOG_LEVEL_WARNING ::spikeguard::LogLevel::kWarning
#define SG_LOG_LEVEL_ERROR ::spikeguard::LogLevel::kError
#define SG_LOG_LEVEL_FATAL ::spikeguard::LogLevel::kFatal

#define SG_LOG(level)                                          \
  !::spikeguard::LogEnabled(SG_LOG_LEVEL_##level)              \
      ? (void)0                                                \
      : ::spikeguard::LogVoidify() &                           \
            ::spikeguard::LogMessage(SG_LOG_LEVEL_##level, __FILE__, __LINE__).stream()

#define SG_CHECK(cond) \
  (cond) ? (void)0     \
         : ::spikeguard::LogVoidify() & \
               ::spikeguard::LogMessage(SG_LOG_LEVEL_FATAL, __FILE__, __LINE__).stream() \
                   << "Check failed: " #cond " "
