#pragma once
/// \file flags.hpp
/// The one command-line flag parser of the actorgraph programs (the REPL,
/// actorgraph-bench, actorgraph-e2e-bench, actorgraph-plan-demo,
/// actorgraph-cuda-bench): CLI11 (Debian's libcli11-dev, header-only), with
/// one set of rules for all of them:
///   - `--name value` and `--name=value` both work; numbers are checked
///     (`--runs=abc` is an error, not 0);
///   - `-h` / `--help` prints every flag with its default and exits 0;
///   - an unknown flag, a missing or bad value, or a stray word prints
///     "<program>: <what is wrong>" and a pointer to --help on standard
///     error and exits 2.
/// CLI11 reports errors by throwing; parse_flags catches them, so no
/// exception leaves it.

#include <CLI/CLI.hpp>

#include <iostream>
#include <optional>
#include <string>

namespace ag::apps {

/// Exit status for bad command-line flags, shared by every program.
inline constexpr int bad_flags_status = 2;

/// A CLI11 app for the program `name` whose --help shows `description` and
/// every default value.
class flags : public CLI::App {
 public:
  flags(const std::string& name, const std::string& description) : CLI::App(description, name) {
    option_defaults()->always_capture_default();
    get_formatter()->column_width(34);
  }
};

/// Parses argv into the options registered on `app`. nullopt: go on; else
/// main() returns the value (0 after --help, bad_flags_status after an error).
inline std::optional<int> parse_flags(CLI::App& app, int argc, const char* const* argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << app.get_name() << ": " << e.what() << "\n"
              << "Run '" << app.get_name() << " --help' for the flags.\n";
    return bad_flags_status;
  }
  return std::nullopt;
}

/// A flag that takes `on` or `off` (anything else is a bad value), into
/// `value`, whose initial value is the default --help shows.
inline CLI::Option* add_on_off(CLI::App& app, const std::string& name, std::string& value, const std::string& help) {
  return app.add_option(name, value, help)->check(CLI::IsMember({"on", "off"}));
}

/// True when `flag` (e.g. "--layers") was given on the command line.
inline bool given(const CLI::App& app, const std::string& flag) { return app.count(flag) > 0; }

}  // namespace ag::apps
