// tcp_rendezvous.h: sharing a small blob (the NCCL unique id) from rank 0 to every rank over TCP at
// MASTER_ADDR:MASTER_PORT, for torchrun-style launches that have no MPI. Rank 0 listens; the others
// connect (retrying until the timeout) and receive the bytes.
#pragma once

#include <cstdint>
#include <string>

namespace mt {

// Rank 0 sends `blob` to world_size - 1 peers; other ranks return what rank 0 sent. Throws
// std::runtime_error naming the address and what failed when the timeout passes.
std::string tcp_rendezvous_broadcast(const std::string& blob, const std::string& master_addr, int master_port, int64_t rank,
                                     int64_t world_size, int timeout_seconds);

}  // namespace mt
