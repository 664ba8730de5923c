// Self-check of the ThreadSanitizer setup (scripts/tsan.sh): two CAF actors
// increment a plain int without synchronisation, while both run at once on
// two scheduler threads (a relaxed-atomic rendezvous, which orders nothing).
// With CAF built with -fsanitize=thread, TSan must report this race; a setup
// that reports nothing here cannot see races inside actors.
#include <caf/all.hpp>

#include <atomic>

// The planted race. Volatile, so that each increment is a load and a store
// of its own while the other actor does the same: with a plain int the
// compiler folded the loop into one read-modify-write per actor, and TSan
// missed the race in 8 of 40 runs (0 of 120 since).
volatile int shared_counter = 0;
std::atomic<int> running{0};    // rendezvous only: relaxed, so no happens-before

caf::behavior bump(caf::event_based_actor*) {
  return {[](int n) {
    running.fetch_add(1, std::memory_order_relaxed);
    while (running.load(std::memory_order_relaxed) < 2) {
    }
    for (int i = 0; i < n; ++i) shared_counter = shared_counter + 1;
  }};
}

struct config : caf::actor_system_config {
  config() { set("scheduler.max-threads", static_cast<size_t>(4)); }
};

void caf_main(caf::actor_system& sys, const config&) {
  auto a = sys.spawn(bump);
  auto b = sys.spawn(bump);
  caf::anon_send(a, 100000);
  caf::anon_send(b, 100000);
}

CAF_MAIN()
