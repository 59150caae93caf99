#pragma once
// A throwaway Prometheus server for tests: generated config, temp storage, a free port on 127.0.0.1,
// scraping the given local ports. Queries go through the HTTP API (/api/v1/query). Debian's
// `prometheus` package provides the binary (scripts/install-deps.sh); tests skip when it is absent.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "metrics/child_process.h"
#include "metrics/dashboard_util.h"
#include "metrics/http_client.h"

namespace trainer::testing {

inline std::string find_executable(const std::string& name) {
  for (const char* dir : {"/usr/bin/", "/usr/local/bin/"})
    if (::access((dir + name).c_str(), X_OK) == 0) return dir + name;
  return "";
}

class PrometheusServer {
 public:
  // scrape_interval: a Prometheus duration ("1s", "250ms"); the scrape timeout and the rules' evaluation
  // interval are the same. rule_files: absolute paths of rule files to load.
  PrometheusServer(const std::string& binary, const std::vector<int>& target_ports,
                   const std::string& scrape_interval = "1s",
                   const std::vector<std::string>& rule_files = {}) {
    namespace fs = std::filesystem;
    dir_ = fs::temp_directory_path() / ("trainer_prom_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(reinterpret_cast<std::uintptr_t>(this)));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data");
    port_ = free_port();
    {
      std::ofstream cfg(dir_ / "prometheus.yml");
      cfg << "global:\n  scrape_interval: " << scrape_interval << "\n  scrape_timeout: " << scrape_interval
          << "\n  evaluation_interval: " << scrape_interval << "\n";
      if (!rule_files.empty()) {
        cfg << "rule_files:\n";
        for (const std::string& f : rule_files) cfg << "  - '" << f << "'\n";
      }
      cfg << "scrape_configs:\n  - job_name: trainer\n    static_configs:\n      - targets: [";
      for (std::size_t i = 0; i < target_ports.size(); ++i)
        cfg << (i ? ", " : "") << "'127.0.0.1:" << target_ports[i] << "'";
      cfg << "]\n";
    }
    process_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{binary, "--config.file=" + (dir_ / "prometheus.yml").string(),
                                 "--storage.tsdb.path=" + (dir_ / "data").string(),
                                 "--web.listen-address=127.0.0.1:" + std::to_string(port_),
                                 "--log.level=warn"},
        (dir_ / "prometheus.log").string());
  }
  ~PrometheusServer() {
    process_.reset();  // ends the server before its storage goes
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  PrometheusServer(const PrometheusServer&) = delete;
  PrometheusServer& operator=(const PrometheusServer&) = delete;

  bool started() const { return process_->started(); }
  bool running() const { return process_->running(); }
  int port() const { return port_; }
  std::string log() const {
    try {
      return read_text((dir_ / "prometheus.log").string());
    } catch (...) {
      return "";
    }
  }
  // GET /api/v1/query, evaluated now or at `time` (Unix seconds, as Prometheus returns them); the parsed
  // JSON, or null when there was no HTTP answer.
  nlohmann::json query(const std::string& expr, const std::string& time = "") const {
    std::string path = "/api/v1/query?query=" + url_encode(expr);
    if (!time.empty()) path += "&time=" + time;
    return get(path);
  }
  // GET an API path ("/api/v1/rules"); the parsed JSON, or null when there was no HTTP answer.
  nlohmann::json get(const std::string& path) const {
    const auto r = http_get(port_, path);
    if (r.status == 0) return nullptr;
    try {
      return nlohmann::json::parse(r.body);
    } catch (...) {
      return nlohmann::json{{"status", "unparsable"}, {"body", r.body}};
    }
  }

 private:
  std::filesystem::path dir_;
  int port_ = 0;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace trainer::testing
