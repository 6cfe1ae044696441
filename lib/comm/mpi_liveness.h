// mpi_liveness.h: naming the rank that stopped. Every rank runs a small responder thread on its own duplicate of
// the world communicator (MPI_THREAD_MULTIPLE only) that answers a question with what the rank's training thread
// is waiting in; a rank whose collective timed out asks all the others before aborting, so its message can
// name the ranks that did not answer (stopped with SIGSTOP, frozen as a whole, or gone) and where the answering
// ones wait.
#pragma once

#include <functional>
#include <string>

namespace mt {

// Collective over the world (every rank, once, after MPI is initialised). Without MPI_THREAD_MULTIPLE: nothing.
void start_liveness_responder(std::function<std::string()> describe_self);
// Asks every other rank and waits up to `seconds` for the answers: one sentence naming who did not answer and
// what the others are doing. Empty when no responder runs.
std::string ask_other_ranks(double seconds);
// Stops the responder (before MPI_Finalize).
void stop_liveness_responder();

}  // namespace mt
