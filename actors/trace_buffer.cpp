#include "actors/trace_buffer.hpp"

#include <iterator>
#include <utility>

namespace ag::actors {

void trace_buffer::push(std::vector<trace_record>&& recs) {
  std::lock_guard<std::mutex> lk(m_);
  for (auto& r : recs) recs_.push_back(std::move(r));
  while (static_cast<int64_t>(recs_.size()) > capacity_) {
    recs_.pop_front();
    ++dropped_;
  }
}

std::vector<trace_record> trace_buffer::take(uint64_t* dropped) {
  std::lock_guard<std::mutex> lk(m_);
  std::vector<trace_record> out(std::make_move_iterator(recs_.begin()), std::make_move_iterator(recs_.end()));
  recs_.clear();
  if (dropped) *dropped = dropped_;
  dropped_ = 0;
  return out;
}

}  // namespace ag::actors
