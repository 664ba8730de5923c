#pragma once
/// \file args.hpp
/// Splitting a REPL command line into a command name, positional words and
/// key=value parameters, and reading typed values out of them with errors that
/// say which parameter was wrong and why. Pure functions; no I/O, no threads.

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "graph/error.hpp"

namespace ag::repl {

/// A word of a command line and its 0-based column.
struct word {
  std::string text;
  std::size_t pos = 0;
};

/// A command line split at whitespace. `key=value` words go to `named`,
/// other words to `positional`. `rest` is the raw text after the command
/// name (for commands such as `graph` that parse their own syntax).
struct command_line {
  word name;
  std::vector<word> positional;
  struct param {
    word key;
    word value;
  };
  std::vector<param> named;
  std::string rest;
  std::size_t rest_pos = 0;
  bool empty() const noexcept { return name.text.empty(); }
};

/// Splits `line`. Text after an unquoted '#' is a comment. Double quotes
/// group words with spaces ("my file.json"). Errors: an unterminated quote,
/// an empty key ("=5") or an empty value ("n="). With `name_only` (commands
/// with a syntax of their own, such as `graph x = input[4]`) only the name
/// and `rest` are filled, and nothing after the name is an error.
expected<command_line> split_command(const std::string& line, bool name_only = false);

/// Parses a whole decimal integer (optionally with a k/M/G suffix: 2k = 2000)
/// in [lo, hi]. `what` names the parameter in the error.
expected<int64_t> parse_int(const std::string& text, const std::string& what,
                            int64_t lo, int64_t hi);
/// Parses a finite number with an optional SI suffix (k M G T P: 60T = 60e12)
/// or time suffix (s ms us ns: 5us = 5e-6), in [lo, hi].
expected<double> parse_number(const std::string& text, const std::string& what,
                              double lo, double hi);
/// Parses on/off words: 1 0 true false on off yes no.
expected<bool> parse_bool(const std::string& text, const std::string& what);

/// Typed access to the named parameters of one command; remembers which keys
/// were read so `finish()` can reject unknown or repeated ones.
class params {
 public:
  explicit params(const command_line& c);
  /// The raw value of `key`, if given.
  std::optional<std::string> raw(const std::string& key);
  expected<std::optional<int64_t>> get_int(const std::string& key, int64_t lo, int64_t hi);
  expected<std::optional<double>> get_number(const std::string& key, double lo, double hi);
  expected<std::optional<bool>> get_bool(const std::string& key);
  /// Error for a key that no get_*/raw call asked for (names the allowed
  /// keys), for a key given twice, or for a positional word beyond the first
  /// `max_words` ("col 9: unexpected 'x'"); ok otherwise.
  error finish(std::size_t max_words = SIZE_MAX) const;

 private:
  const command_line& c_;
  std::set<std::string> asked_;
};

/// Shorthand for errc::invalid_argument errors.
inline error bad_arg(std::string msg) { return error(errc::invalid_argument, std::move(msg)); }

}  // namespace ag::repl
