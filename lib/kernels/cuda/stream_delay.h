// stream_delay.h: a kernel that only waits, for fault-injection in tests: queued on a communicator's
// stream it makes the collectives behind it late, so a missing cross-stream wait shows up as wrong
// results instead of passing by luck (MEGATRAIN_TEST_GATHER_DELAY_US, the overlapped parameter gather).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mt::cuda {

// Occupies one thread of `stream` for about `microseconds`.
void stream_delay(int64_t microseconds, cudaStream_t stream);

}  // namespace mt::cuda
