// run_report.cpp: each chart is an SVG of fixed size with "nice" axis ticks (1, 2, 5 x 10^k), one polyline per
// run in a colour of its own (the legend at the top names them), validation loss dashed on the loss chart.
#include "report/run_report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config/errors.h"

namespace mt {
namespace {

const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

struct Chart {
  const char* title;
  std::vector<const char*> metrics;  // the first solid, the second dashed
  bool log_y;
};

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string num(double v) {
  std::ostringstream s;
  if (std::fabs(v) >= 1e4 && std::fabs(v) < 1e15) {
    s << std::fixed;
    s.precision(0);
  } else {
    s.precision(4);
  }
  s << v;
  return s.str();
}

// Ticks covering [lo, hi]: about five at 1, 2 or 5 x 10^k.
std::vector<double> ticks(double lo, double hi) {
  const double span = hi - lo;
  if (!(span > 0)) return {lo};
  const double raw = span / 5, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / mag < 1.5 ? mag : raw / mag < 3.5 ? 2 * mag : raw / mag < 7.5 ? 5 * mag : 10 * mag;
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + 1e-9 * span; v += step) t.push_back(std::fabs(v) < 1e-12 * span ? 0.0 : v);
  return t;
}

std::string chart_svg(const Chart& ch, const std::vector<RunMetrics>& runs) {
  const double W = 460, H = 280, L = 62, R = 12, T = 30, B = 36;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  bool any = false;
  for (const auto& r : runs) {
    for (const char* m : ch.metrics) {
      auto it = r.series.find(m);
      if (it == r.series.end()) continue;
      for (auto [x, y] : it->second) {
        if (!std::isfinite(y) || (ch.log_y && y <= 0)) continue;
        const double yy = ch.log_y ? std::log10(y) : y;
        x0 = std::min(x0, x);
        x1 = std::max(x1, x);
        y0 = std::min(y0, yy);
        y1 = std::max(y1, yy);
        any = true;
      }
    }
  }
  std::ostringstream s;
  s << "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H
    << "\"><rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>"
    << "<text x=\"" << W / 2 << "\" y=\"18\" text-anchor=\"middle\" font-size=\"14\" font-family=\"sans-serif\">" << esc(ch.title)
    << (ch.log_y ? " (log scale)" : "") << "</text>";
  if (!any) {
    s << "<text x=\"" << W / 2 << "\" y=\"" << H / 2 << "\" text-anchor=\"middle\" font-size=\"12\" fill=\"#888\" font-family=\"sans-serif\">"
      << "not logged by these runs</text></svg>";
    return s.str();
  }
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) {  // a constant: a little room around it (a tenth of a decade on a log scale)
    const double room = ch.log_y ? 0.1 : std::max(1e-6, std::fabs(y1) * 0.05);
    y1 += room;
    y0 -= room;
  }
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad;
  y1 += pad;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return T + (y1 - y) / (y1 - y0) * (H - T - B); };
  s << "<g font-size=\"10\" font-family=\"sans-serif\" fill=\"#444\">";
  // Log scale: ticks at round values (1, 2, 5 x 10^k over several decades; else round values of the range).
  std::vector<double> yt;
  if (!ch.log_y) {
    yt = ticks(y0, y1);
  } else if (y1 - y0 > 2) {
    for (double e = std::ceil(y0); e <= y1; e += std::max(1.0, std::floor((y1 - y0) / 5))) yt.push_back(e);
  } else {
    for (double v : ticks(std::pow(10.0, y0), std::pow(10.0, y1))) {
      if (v > 0) yt.push_back(std::log10(v));
    }
  }
  for (double t : yt) {
    s << "<line x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << py(t) << "\" y2=\"" << py(t) << "\" stroke=\"#eee\"/>"
      << "<text x=\"" << L - 4 << "\" y=\"" << py(t) + 3 << "\" text-anchor=\"end\">" << num(ch.log_y ? std::pow(10.0, t) : t) << "</text>";
  }
  for (double t : ticks(x0, x1)) {
    s << "<line x1=\"" << px(t) << "\" x2=\"" << px(t) << "\" y1=\"" << T << "\" y2=\"" << H - B << "\" stroke=\"#eee\"/>"
      << "<text x=\"" << px(t) << "\" y=\"" << H - B + 14 << "\" text-anchor=\"middle\">" << num(t) << "</text>";
  }
  s << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 6 << "\" text-anchor=\"middle\">iteration</text></g>"
    << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\"" << H - T - B << "\" fill=\"none\" stroke=\"#999\"/>";
  for (size_t k = 0; k < runs.size(); ++k) {
    for (size_t m = 0; m < ch.metrics.size(); ++m) {
      auto it = runs[k].series.find(ch.metrics[m]);
      if (it == runs[k].series.end()) continue;
      std::ostringstream pts;
      size_t n = 0;
      for (auto [x, y] : it->second) {
        if (!std::isfinite(y) || (ch.log_y && y <= 0)) continue;
        pts << (n++ ? " " : "") << px(x) << "," << py(ch.log_y ? std::log10(y) : y);
      }
      if (n == 0) continue;
      const char* color = kColors[k % (sizeof(kColors) / sizeof(kColors[0]))];
      s << "<polyline class=\"series\" data-run=\"" << esc(runs[k].label) << "\" data-metric=\"" << ch.metrics[m] << "\" fill=\"none\" stroke=\""
        << color << "\" stroke-width=\"2\"" << (m > 0 ? " stroke-dasharray=\"6 4\"" : "") << " points=\"" << pts.str() << "\"/>";
      if (n == 1) s << "<circle cx=\"" << pts.str().substr(0, pts.str().find(',')) << "\" cy=\"" << pts.str().substr(pts.str().find(',') + 1)
                    << "\" r=\"3\" fill=\"" << color << "\"/>";
    }
  }
  s << "</svg>";
  return s.str();
}

}  // namespace

RunMetrics read_run_metrics(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path file = fs::is_directory(dir) ? fs::path(dir) / "metrics.jsonl" : fs::path(dir);
  std::ifstream in(file);
  if (!in) throw DataError("cannot read " + file.string() + ": give a run's --log-dir (holding metrics.jsonl) or the file itself");
  RunMetrics r;
  const fs::path label_from = fs::is_directory(dir) ? fs::path(dir) : file.parent_path();
  r.label = fs::weakly_canonical(label_from).filename().string();
  if (r.label.empty()) r.label = dir;
  std::string line;
  int64_t n = 0, used = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      throw DataError(file.string() + " line " + std::to_string(n) + " is not a JSON object: is it a megatrain metrics.jsonl?");
    }
    if (!j.is_object() || !j.contains("iteration") || !j["iteration"].is_number()) {
      throw DataError(file.string() + " line " + std::to_string(n) + " has no \"iteration\": is it a megatrain metrics.jsonl?");
    }
    const double it = j["iteration"].get<double>();
    for (const auto& [k, v] : j.items()) {
      if (k == "mfu" && v.is_number()) r.series["mfu_percent"].emplace_back(it, 100.0 * v.get<double>());
      else if (k != "iteration" && v.is_number()) r.series[k].emplace_back(it, v.get<double>());
    }
    ++used;
  }
  if (used == 0) throw DataError(file.string() + " holds no metrics yet (the first log line writes them)");
  return r;
}

std::string render_report(const std::vector<RunMetrics>& runs) {
  const std::vector<Chart> charts = {
      {"lm loss (validation dashed)", {"lm_loss", "validation_lm_loss"}, false},
      {"learning rate", {"learning_rate"}, false},
      {"grad norm", {"grad_norm"}, true},
      {"loss scale", {"loss_scale"}, true},
      {"tokens/s/GPU", {"tokens_per_s_per_gpu"}, false},
      {"MFU (%)", {"mfu_percent"}, false},
  };
  std::ostringstream s;
  s << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>megatrain report</title><style>"
       "body{font-family:sans-serif;margin:16px;background:#fafafa}.grid{display:grid;grid-template-columns:repeat(auto-fill,470px);gap:10px}"
       ".legend span{display:inline-block;margin-right:18px}.sw{display:inline-block;width:22px;height:4px;margin-right:6px;vertical-align:middle}"
       "</style></head><body>\n<h2>megatrain report</h2>\n<div class=\"legend\">";
  for (size_t k = 0; k < runs.size(); ++k) {
    s << "<span><i class=\"sw\" style=\"background:" << kColors[k % (sizeof(kColors) / sizeof(kColors[0]))] << "\"></i>" << esc(runs[k].label)
      << "</span>";
  }
  s << "</div>\n<div class=\"grid\">\n";
  for (const Chart& c : charts) s << chart_svg(c, runs) << "\n";
  s << "</div>\n</body></html>\n";
  return s.str();
}

}  // namespace mt
