// Fuzz target: deserialising the runtime's messages (messages/messages.hpp)
// from random bytes with CAF 0.17's binary_deserializer, as a remote peer's
// bytes would arrive: each struct with an inspect() on its own (the first
// byte picks the type), a whole type-erased caf::message of registered types
// (what the middleman reads), and caf::error through msg::from_caf.
// Properties: no crash or sanitizer report; whatever deserialises serialises
// again and deserialises to the same bytes (a round trip is exact).
#include <caf/all.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include <cmath>
#include <exception>
#include <memory>
#include <type_traits>
#include <vector>

#include "fuzz_check.hpp"
#include "messages/caf_error.hpp"
#include "messages/messages.hpp"
#include "messages/registration.hpp"

namespace {

using buffer = std::vector<char>;

/// One actor system for the whole run (deserialising caf::message and actor
/// handles needs one); never destroyed, so process exit waits for nothing.
caf::actor_system& system() {
  static caf::actor_system* sys = [] {
    static caf::actor_system_config cfg;
    ag::msg::register_message_types(cfg);
    cfg.set("scheduler.max-threads", static_cast<size_t>(1));
    return new caf::actor_system(cfg);
  }();
  return *sys;
}

template <class T>
buffer save(T& x) {
  buffer out;
  caf::binary_serializer sink{system(), out};
  const caf::error e = sink(x);
  FUZZ_CHECK(!e, "serialising a deserialised value failed: %s", caf::to_string(e).c_str());
  return out;
}

/// CAF 0.17.6's serialiser never returns on an infinite float or double:
/// detail::pack754 halves the value until it drops below 2, and infinity
/// never does. A type-erased message of CAF's built-in `double` can carry
/// one (unpack754 makes it from the exponent bits), directly or inside a
/// caf::error's context or a nested message, so its round trip is not ours
/// to check. None of the runtime's own messages carries a floating field
/// (messages/messages.hpp), and in-process messages are never serialised.
bool caf_cannot_serialise(const caf::message& m, int depth = 0) {
  if (depth > 64) return true;  // deeper than any real message: not ours either
  for (std::size_t i = 0; i < m.size(); ++i) {
    // A built-in caf::config_value may hold such a double too (or a list or
    // dictionary of them): CAF's type, never in the runtime's messages.
    if (m.match_element<caf::config_value>(i)) return true;
    if (m.match_element<double>(i) && !std::isfinite(m.get_as<double>(i))) return true;
    if (m.match_element<float>(i) && !std::isfinite(m.get_as<float>(i))) return true;
    if (m.match_element<caf::message>(i) && caf_cannot_serialise(m.get_as<caf::message>(i), depth + 1)) return true;
    if (m.match_element<caf::error>(i)) {
      const caf::error& e = m.get_as<caf::error>(i);
      if (e && caf_cannot_serialise(e.context(), depth + 1)) return true;  // no error, no context (null data)
    }
  }
  return false;
}

template <class T>
bool caf_cannot_serialise(const T&) {
  return false;
}

/// Reads `x` from the fuzzer's bytes; false when refused (an error value,
/// which is fine). CAF 0.17.6 throws instead of returning an error when a
/// type-erased built-in caf::config_value names a variant index it does not
/// have (CAF_RAISE_ERROR in its variant inspect; found by this target:
/// corpus/messages/caf-config-value-bad-variant in a caf::message,
/// caf-error-context-config-value in a caf::error's context): reading CAF's
/// own caf::message or caf::error, a throw is CAF refusing its own type. The
/// runtime's messages carry no config_value, and its own types never throw: a
/// throw reading one of them still ends the run.
template <class T>
bool load(T& x, const char* bytes, std::size_t size) {
  caf::binary_deserializer src{system(), bytes, size};
  if constexpr (std::is_same_v<T, caf::message> || std::is_same_v<T, caf::error>) {
    try {
      return !src(x);
    } catch (const std::exception&) {
      return false;
    }
  } else {
    return !src(x);
  }
}

template <class T>
void round_trip(const char* bytes, std::size_t size) {
  T x;
  if (!load(x, bytes, size)) return;
  if (caf_cannot_serialise(x)) return;
  const buffer once = save(x);
  T y;
  caf::binary_deserializer again{system(), once.data(), once.size()};
  const caf::error e = again(y);
  FUZZ_CHECK(!e, "re-reading our own bytes failed: %s", caf::to_string(e).c_str());
  FUZZ_CHECK(save(y) == once, "round trip changed the value");
}

void as_caf_error(const char* bytes, std::size_t size) {
  caf::error x;
  if (!load(x, bytes, size)) return;
  const ag::error e = ag::msg::from_caf(x);
  if (x) ag::fuzz::check_error(e, "from_caf");
  (void)ag::msg::to_caf(e);
  (void)e.to_string();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const char* bytes = reinterpret_cast<const char*>(data) + 1;
  const std::size_t n = size - 1;
  switch (data[0] % 15) {
    case 0: round_trip<ag::error>(bytes, n); break;
    case 1: round_trip<ag::msg::acquire_arena>(bytes, n); break;
    case 2: round_trip<ag::msg::arena_reply>(bytes, n); break;
    case 3: round_trip<ag::msg::release_arena>(bytes, n); break;
    case 4: round_trip<ag::msg::withdraw_arena>(bytes, n); break;
    case 5: round_trip<ag::msg::unload_plan>(bytes, n); break;
    case 6: round_trip<ag::msg::step_done>(bytes, n); break;
    case 7: round_trip<ag::msg::step_failed>(bytes, n); break;
    case 8: round_trip<ag::msg::cancel_ack>(bytes, n); break;
    case 9: round_trip<ag::msg::fail_job>(bytes, n); break;
    case 10: round_trip<ag::msg::device_fault>(bytes, n); break;
    case 11: round_trip<ag::msg::device_down>(bytes, n); break;
    case 12: round_trip<caf::message>(bytes, n); break;
    case 14: round_trip<ag::msg::device_stalled>(bytes, n); break;
    default: as_caf_error(bytes, n); break;
  }
  return 0;
}
