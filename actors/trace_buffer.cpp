#include "actors/trace_buffer.hpp"

#include <iterator>
#include <utility>

namespace ag::actors {

void trace_buffer::push(std::vector<trace_record>&& recs) {
  std::lock_guard<std::mutex> lk(m_);
  if (recs_.empty()) {
    recs_ = std::move(recs);
  } else {
    recs_.insert(recs_.end(), std::make_move_iterator(recs.begin()), std::make_move_iterator(recs.end()));
  }
}

std::vector<trace_record> trace_buffer::take() {
  std::lock_guard<std::mutex> lk(m_);
  return std::exchange(recs_, {});
}

}  // namespace ag::actors
