// run_report.h: `megatrain report DIR...`: one self-contained HTML page (inline SVG, no scripts, no network) with
// the runs' metrics against iterations, several runs overlaid: loss (training, and validation dashed), learning
// rate, grad norm, loss scale, tokens/s/GPU and MFU (where the run logged them). Reads each run's
// metrics.jsonl (the --log-dir file; a DIR may also be the file itself).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace mt {

struct RunMetrics {
  std::string label;                                            // the run's directory name
  std::map<std::string, std::vector<std::pair<double, double>>> series;  // metric -> (iteration, value)
};

// Reads DIR/metrics.jsonl (or the file DIR); DataError naming the file and the line on bad input.
RunMetrics read_run_metrics(const std::string& dir);
// The page for these runs.
std::string render_report(const std::vector<RunMetrics>& runs);

}  // namespace mt
