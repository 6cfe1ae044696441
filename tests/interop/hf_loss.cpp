// hf_loss.cpp: megatrain's loss (mean cross entropy, evaluation mode) of a checkpoint on the token rows of a
// file (each line: S + 1 token ids; inputs the first S, labels the last S), on one rank as export loads it:
// the number tests/interop/hf_reference.py must reproduce from the exported HuggingFace files.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "interop/hf_export.h"

int main(int argc, char** argv) {
  const bool mtp = argc == 4 && std::string(argv[3]) == "--mtp";
  if (argc != 3 && !mtp) {
    std::fprintf(stderr, "usage: hf_loss CHECKPOINT_DIR TOKENS_FILE [--mtp]\n");
    return 2;
  }
  try {
    mt::SingleRankModel m = mt::load_single_rank(argv[1], std::nullopt);
    std::ifstream in(argv[2]);
    std::vector<std::vector<int32_t>> rows;
    for (std::string line; std::getline(in, line);) {
      std::istringstream ss(line);
      std::vector<int32_t> r;
      for (int32_t t; ss >> t;) r.push_back(t);
      if (!r.empty()) rows.push_back(std::move(r));
    }
    if (rows.empty()) throw std::runtime_error("no token rows in " + std::string(argv[2]));
    mt::Microbatch mb;
    mb.B = static_cast<int64_t>(rows.size());
    mb.S = static_cast<int64_t>(rows[0].size()) - 1;
    for (const auto& r : rows) {
      if (static_cast<int64_t>(r.size()) != mb.S + 1) throw std::runtime_error("token rows of different lengths");
      for (int64_t s = 0; s < mb.S; ++s) {
        mb.tokens.push_back(r[static_cast<size_t>(s)]);
        mb.labels.push_back(r[static_cast<size_t>(s + 1)]);
        mb.positions.push_back(static_cast<int32_t>(s));
        mb.loss_mask.push_back(1.0f);
      }
    }
    m.model->set_mtp_in_evaluation(mtp);
    const float loss = m.model->forward(mb, 0, false);
    if (!mtp) {
      std::printf("%.9g\n", static_cast<double>(loss));
    } else {  // (--mtp: each multi-token prediction module's mean loss)
      const std::vector<double> losses = m.model->take_mtp_losses();
      if (losses.empty()) throw std::runtime_error("the model has no multi-token prediction modules");
      for (size_t k = 0; k < losses.size(); ++k) std::printf("%s%.9g", k ? " " : "", losses[k]);
      std::printf("\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_loss: %s\n", e.what());
    return 1;
  }
  return 0;
}
