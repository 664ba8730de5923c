// Fuzz target: REPL command lines (apps/repl/args.hpp): splitting a line into
// words and key=value parameters, and the typed parsers every command uses.
// Properties: no crash, failures are errors with messages, accepted numbers
// lie in the range asked for and are finite.
#include <cmath>
#include <string>

#include "apps/repl/args.hpp"
#include "fuzz_check.hpp"

namespace {

void check_int(const ag::expected<int64_t>& v, int64_t lo, int64_t hi) {
  if (!v) return ag::fuzz::check_error(v.err(), "parse_int");
  FUZZ_CHECK(*v >= lo && *v <= hi, "parse_int gave %lld outside [%lld, %lld]", static_cast<long long>(*v),
             static_cast<long long>(lo), static_cast<long long>(hi));
}

void check_number(const ag::expected<double>& v, double lo, double hi) {
  if (!v) return ag::fuzz::check_error(v.err(), "parse_number");
  FUZZ_CHECK(std::isfinite(*v) && *v >= lo && *v <= hi, "parse_number gave %g outside [%g, %g]", *v, lo, hi);
}

void words(const std::string& w) {
  check_int(ag::repl::parse_int(w, "n", 1, 1 << 20), 1, 1 << 20);
  check_int(ag::repl::parse_int(w, "seed", INT64_MIN, INT64_MAX), INT64_MIN, INT64_MAX);
  check_number(ag::repl::parse_number(w, "t", 0, 1e18), 0, 1e18);
  check_number(ag::repl::parse_number(w, "x", -1e300, 1e300), -1e300, 1e300);
  if (auto b = ag::repl::parse_bool(w, "b"); !b) ag::fuzz::check_error(b.err(), "parse_bool");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string line(reinterpret_cast<const char*>(data), size);
  auto c = ag::repl::split_command(line);
  if (!c) {
    ag::fuzz::check_error(c.err(), "split_command");
    return 0;
  }
  FUZZ_CHECK(c->rest_pos <= line.size() + 1, "rest_pos %zu past the line (%zu)", c->rest_pos, line.size());
  words(c->name.text);
  for (const auto& w : c->positional) words(w.text);
  ag::repl::params p(*c);
  for (const auto& kv : c->named) {
    FUZZ_CHECK(!kv.key.text.empty(), "empty key accepted");
    words(kv.value.text);
    // each typed getter on the same key, as the commands do
    if (auto v = p.get_int(kv.key.text, -1000, 1000); v && *v)
      FUZZ_CHECK(**v >= -1000 && **v <= 1000, "get_int out of range");
    if (auto v = p.get_number(kv.key.text, 0, 1); v && *v)
      FUZZ_CHECK(**v >= 0 && **v <= 1, "get_number out of range");
    (void)p.get_bool(kv.key.text);
    (void)p.raw(kv.key.text);
  }
  (void)p.finish();
  return 0;
}
