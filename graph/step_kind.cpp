#include "graph/step_kind.hpp"

namespace ag {

const char* to_string(step_kind k) noexcept {
  switch (k) {
    case step_kind::compute: return "compute";
    case step_kind::copy_h2d: return "h2d";
    case step_kind::copy_d2h: return "d2h";
    case step_kind::copy_peer: return "peer";
    case step_kind::collective: return "collective";
  }
  return "unknown";
}

const char* lane_name(step_kind k, int lane) noexcept {
  static const char* const compute[] = {"compute0",  "compute1",  "compute2",  "compute3",  "compute4",  "compute5",
                                        "compute6",  "compute7",  "compute8",  "compute9",  "compute10", "compute11",
                                        "compute12", "compute13", "compute14", "compute15"};
  // A communication queue's copies (job lanes, launch_program::job_lanes).
  static const char* const comm[] = {"comm", "comm1", "comm2", "comm3", "comm4", "comm5", "comm6", "comm7"};
  switch (k) {
    case step_kind::compute: return lane >= 0 && lane < 16 ? compute[lane] : "compute";
    case step_kind::collective: return lane >= 0 && lane < 8 ? comm[lane] : "comm";
    case step_kind::copy_h2d:
    case step_kind::copy_d2h:
    case step_kind::copy_peer: break;
  }
  return to_string(k);
}

}  // namespace ag
