// communicator.cpp: the helpers every transport shares, and the group of one's point-to-point batch.
#include "comm/communicator.h"

#include <deque>

namespace mt {

std::vector<int64_t> count_offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> o(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) o[i + 1] = o[i] + counts[i];
  return o;
}

std::unique_ptr<CommRequest> SelfCommunicator::send_recv_batch_async(const std::vector<P2POp>& ops) {
  std::deque<const P2POp*> sends;
  for (const P2POp& op : ops) {
    if (op.peer != 0) throw std::logic_error("send_recv_batch: peer " + std::to_string(op.peer) + " in a group of one");
    if (op.kind == P2POp::Kind::kSend) sends.push_back(&op);
  }
  for (const P2POp& op : ops) {
    if (op.kind != P2POp::Kind::kRecv) continue;
    if (sends.empty() || sends.front()->n != op.n) throw std::logic_error("send_recv_batch: a receive from itself without a send of its size");
    copy(sends.front()->data, op.data, op.n);
    sends.pop_front();
  }
  if (!sends.empty()) throw std::logic_error("send_recv_batch: a send to itself that nothing receives");
  return std::make_unique<DoneRequest>();
}

}  // namespace mt
