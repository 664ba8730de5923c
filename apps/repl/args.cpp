#include "apps/repl/args.hpp"

#include <cctype>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>

namespace ag::repl {

expected<command_line> split_command(const std::string& line, bool name_only) {
  command_line c;
  std::vector<word> words;
  std::size_t i = 0;
  const std::size_t n = line.size();
  while (i < n) {
    while (i < n && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    if (i >= n || line[i] == '#') break;
    word w;
    w.pos = i;
    while (i < n && !std::isspace(static_cast<unsigned char>(line[i]))) {
      if (line[i] == '"') {
        const std::size_t open = i++;
        while (i < n && line[i] != '"') w.text += line[i++];
        if (i >= n) return bad_arg("col " + std::to_string(open + 1) + ": unterminated quote");
        ++i;
      } else {
        w.text += line[i++];
      }
    }
    words.push_back(std::move(w));
    if (name_only) break;
  }
  if (words.empty()) return c;
  c.name = words.front();
  const auto sp = line.find_first_of(" \t", c.name.pos);
  c.rest_pos = sp == std::string::npos ? line.size() : sp;
  c.rest = line.substr(c.rest_pos);
  if (const auto hash = c.rest.find('#'); hash != std::string::npos) c.rest.resize(hash);
  for (std::size_t k = 1; k < words.size(); ++k) {
    const word& w = words[k];
    const auto eq = w.text.find('=');
    if (eq == std::string::npos) {
      c.positional.push_back(w);
      continue;
    }
    if (eq == 0) return bad_arg("col " + std::to_string(w.pos + 1) + ": '" + w.text + "' has no name before '='");
    if (eq + 1 == w.text.size())
      return bad_arg("col " + std::to_string(w.pos + 1) + ": '" + w.text + "' has no value after '='");
    c.named.push_back({word{w.text.substr(0, eq), w.pos}, word{w.text.substr(eq + 1), w.pos + eq + 1}});
  }
  return c;
}

namespace {

// Splits "12.5ms" into 12.5 and "ms"; false when no number starts the text.
bool split_suffix(const std::string& text, double& value, std::string& suffix) {
  if (text.empty()) return false;
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  value = std::strtod(begin, &end);
  if (end == begin || errno == ERANGE) return false;
  // strtod accepts "inf", "nan" and hex: refuse them, they are never meant here.
  for (const char* p = begin; p != end; ++p)
    if (std::isalpha(static_cast<unsigned char>(*p)) && *p != 'e' && *p != 'E') return false;
  suffix.assign(end);
  return true;
}

std::string range_text(double lo, double hi) {
  auto fmt = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  return "[" + fmt(lo) + ", " + fmt(hi) + "]";
}

}  // namespace

expected<int64_t> parse_int(const std::string& text, const std::string& what, int64_t lo, int64_t hi) {
  const auto out_of_range = [&] {
    return bad_arg(what + ": " + text + " is out of range " + range_text(static_cast<double>(lo), static_cast<double>(hi)));
  };
  // Plain digits are read exactly: through a double, 9223372036854775807
  // becomes 2^63, which no int64_t holds.
  int64_t exact = 0;
  const char* first = text.data();
  const char* last = first + text.size();
  if (const auto [end, ec] = std::from_chars(first, last, exact); end == last && ec != std::errc::invalid_argument) {
    if (ec == std::errc::result_out_of_range || exact < lo || exact > hi) return out_of_range();
    return exact;
  }
  double v = 0;
  std::string suffix;
  bool ok = split_suffix(text, v, suffix);
  if (ok) {
    if (suffix == "k") v *= 1e3;
    else if (suffix == "M") v *= 1e6;
    else if (suffix == "G") v *= 1e9;
    else if (!suffix.empty()) ok = false;
  }
  if (!ok || !std::isfinite(v)) return bad_arg(what + ": '" + text + "' is not a number");
  if (v != std::floor(v)) return bad_arg(what + ": '" + text + "' is not a whole number");
  // [-2^63, 2^63) holds every double an int64_t can take; the bounds are
  // compared as integers (a double rounds INT64_MAX up to 2^63).
  constexpr double two_to_63 = 9223372036854775808.0;
  if (v < -two_to_63 || v >= two_to_63) return out_of_range();
  const auto n = static_cast<int64_t>(v);
  if (n < lo || n > hi) return out_of_range();
  return n;
}

expected<double> parse_number(const std::string& text, const std::string& what, double lo, double hi) {
  static const std::map<std::string, double> suffixes = {
      {"", 1},     {"k", 1e3},  {"K", 1e3},  {"M", 1e6},   {"G", 1e9},  {"T", 1e12},
      {"P", 1e15}, {"s", 1},    {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}};
  double v = 0;
  std::string suffix;
  if (!split_suffix(text, v, suffix)) return bad_arg(what + ": '" + text + "' is not a number");
  const auto it = suffixes.find(suffix);
  if (it == suffixes.end())
    return bad_arg(what + ": unknown suffix '" + suffix + "' in '" + text + "' (use k M G T P or s ms us ns)");
  v *= it->second;
  if (!std::isfinite(v)) return bad_arg(what + ": '" + text + "' is not a finite number");
  if (v < lo || v > hi) return bad_arg(what + ": " + text + " is out of range " + range_text(lo, hi));
  return v;
}

expected<bool> parse_bool(const std::string& text, const std::string& what) {
  if (text == "1" || text == "true" || text == "on" || text == "yes") return true;
  if (text == "0" || text == "false" || text == "off" || text == "no") return false;
  return bad_arg(what + ": '" + text + "' is not on/off");
}

params::params(const command_line& c) : c_(c) {}

std::optional<std::string> params::raw(const std::string& key) {
  asked_.insert(key);
  for (const auto& p : c_.named)
    if (p.key.text == key) return p.value.text;
  return std::nullopt;
}

namespace {

// The raw value of `key` through `parse`, if given.
template <class T, class Parse>
expected<std::optional<T>> typed(const std::optional<std::string>& raw, Parse parse) {
  if (!raw) return std::optional<T>{};
  auto v = parse(*raw);
  if (!v) return v.err();
  return std::optional<T>{*v};
}

}  // namespace

expected<std::optional<int64_t>> params::get_int(const std::string& key, int64_t lo, int64_t hi) {
  return typed<int64_t>(raw(key), [&](const std::string& t) { return parse_int(t, key, lo, hi); });
}

expected<std::optional<double>> params::get_number(const std::string& key, double lo, double hi) {
  return typed<double>(raw(key), [&](const std::string& t) { return parse_number(t, key, lo, hi); });
}

expected<std::optional<bool>> params::get_bool(const std::string& key) {
  return typed<bool>(raw(key), [&](const std::string& t) { return parse_bool(t, key); });
}

error params::finish(std::size_t max_words) const {
  if (c_.positional.size() > max_words) {
    const word& w = c_.positional[max_words];
    return bad_arg("col " + std::to_string(w.pos + 1) + ": unexpected '" + w.text + "'");
  }
  std::set<std::string> seen;
  for (const auto& p : c_.named) {
    if (!asked_.count(p.key.text)) {
      std::string allowed;
      for (const auto& k : asked_) allowed += (allowed.empty() ? "" : ", ") + k;
      return bad_arg("unknown parameter '" + p.key.text + "'" +
                     (allowed.empty() ? std::string(" (this command takes none)") : " (expected one of: " + allowed + ")"));
    }
    if (!seen.insert(p.key.text).second) return bad_arg("parameter '" + p.key.text + "' given twice");
  }
  return {};
}

}  // namespace ag::repl
