#include "common/timeline.h"

#include "transport/transport.h"

namespace kerasdist {

namespace {

std::string JsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

bool Timeline::Open(const std::string& path, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (!file) return false;
  rank_ = rank;
  origin_us_ = NowMicros();
  std::fprintf(file, "[\n");
  const char* rows[] = {"", "negotiation", "fusion copies", "collective"};
  for (int row = 1; row <= 3; ++row) {
    std::fprintf(file,
                 "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                 "\"args\":{\"name\":\"%s\"}},\n",
                 rank_, row, rows[row]);
  }
  std::fprintf(file,
               "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,"
               "\"args\":{\"name\":\"rank %d\"}}",
               rank_, rank_);
  file_.store(file);
  return true;
}

void Timeline::Event(const std::string& name, int row, int64_t start_us,
                     int64_t end_us, const std::string& value, const char* key) {
  std::lock_guard<std::mutex> lock(mu_);
  std::FILE* file = file_.load();
  if (!file) return;
  std::fprintf(file,
               ",\n{\"name\":\"%s\",\"cat\":\"kerasdist\",\"ph\":\"X\",\"pid\":%d,"
               "\"tid\":%d,\"ts\":%lld,\"dur\":%lld,\"args\":{\"%s\":\"%s\"}}",
               JsonEscape(name).c_str(), rank_, row,
               static_cast<long long>(start_us - origin_us_),
               static_cast<long long>(end_us - start_us), JsonEscape(key).c_str(),
               JsonEscape(value).c_str());
}

void Timeline::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  std::FILE* file = file_.exchange(nullptr);
  if (!file) return;
  std::fprintf(file, "\n]\n");
  std::fclose(file);
}

}  // namespace kerasdist
