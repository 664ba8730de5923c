// Self-check of the ThreadSanitizer setup (scripts/tsan.sh): the same two
// actors as planted_race.cpp with an atomic counter and 2,000 messages
// between them. With an instrumented CAF, TSan reports nothing; with Debian's
// uninstrumented CAF it reports dozens of false races from CAF's internals.
#include <caf/all.hpp>

#include <atomic>

std::atomic<int> shared_counter{0};

caf::behavior bump(caf::event_based_actor*) {
  return {[](int n) {
    for (int i = 0; i < n; ++i) ++shared_counter;
  }};
}

void caf_main(caf::actor_system& sys) {
  auto a = sys.spawn(bump);
  auto b = sys.spawn(bump);
  for (int k = 0; k < 1000; ++k) {
    caf::anon_send(a, 10);
    caf::anon_send(b, 10);
  }
}

CAF_MAIN()
