// ranks_agree.h: every rank of a job trains the same configuration with the same build. Ranks launched with
// different flags (another TP, learning rate or seed on one rank) crash in a collective or, worse, train to
// the end; at start-up each rank's resolved configuration is compared with rank 0's and any difference ends
// every rank with the settings named.
#pragma once

#include "comm/communicator.h"
#include "config/config.h"

namespace mt {

// Collective over `world` (a host communicator: MPI or TCP). Throws ConfigError on every rank when a rank's
// configuration or build differs from rank 0's, naming the ranks and the settings.
void check_ranks_agree(const Config& cfg, Communicator& world);

}  // namespace mt
