#include "train/metrics.h"

#include <filesystem>

#include "core/error.h"

namespace mx {

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  std::error_code ec;
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!file_) throw StorageError(str("cannot open metrics file ", path));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    throw StorageError(str("cannot write metrics file ", path_));
}

}  // namespace mx
