// Metrics as JSON Lines: one object per logged step, a last object with "summary": true.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>

namespace mx {

class MetricsWriter {
 public:
  // append = true when resuming, so the earlier steps' lines stay; a fresh run keeps an
  // earlier run's file as PATH.1 (or the next free .N) and says so.
  MetricsWriter(const std::string& path, bool append);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const nlohmann::json& record);  // one line, flushed
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace mx
