// report_cmd.cpp: `megatrain report DIR... [--output FILE]`: the runs' metrics as one HTML page.
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "report/run_report.h"

namespace mt {

int run_report(int argc, char** argv) {
  CLI::App app{"megatrain report: one self-contained HTML page of the runs' metrics (loss, learning rate, grad norm, loss scale, "
               "tokens/s/GPU, MFU against iterations), several runs overlaid", "megatrain report"};
  std::vector<std::string> dirs;
  std::string output = "megatrain-report.html";
  app.add_option("runs", dirs, "Run directories (their --log-dir, holding metrics.jsonl) or metrics.jsonl files")->required();
  app.add_option("--output,-o", output, "The HTML file to write");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    std::vector<RunMetrics> runs;
    for (const auto& d : dirs) runs.push_back(read_run_metrics(d));
    const std::string html = render_report(runs);
    std::ofstream out(output);
    out << html;
    out.flush();
    if (!out) {
      std::cerr << "megatrain: error: cannot write " << output << "\n";
      return 1;
    }
    std::cout << "wrote " << output << " (" << runs.size() << " run" << (runs.size() == 1 ? "" : "s") << ")\n";
  } catch (const std::exception& e) {
    std::cerr << "megatrain: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace mt
