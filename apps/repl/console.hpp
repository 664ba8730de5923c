#pragma once
/// \file console.hpp
/// The REPL's front end: command-line arguments, and reading commands from a
/// terminal (GNU readline: editing, history, completion; job reports printed
/// above the line being typed), a script file or a pipe.
///
/// Threading: everything runs on the calling (main) thread; readline is never
/// called from another thread. SIGINT only sets a flag and writes to a pipe.

namespace ag::repl {

/// main() of `actorgraph`:
///   actorgraph [--script FILE] [--init FILE] [--keep-going] [--devices SPEC] [--no-readline] [-c CMD]...
/// (`--help` lists them). Exit status: 0, 1 if a scripted command failed,
/// 2 for bad arguments.
int console_main(int argc, char** argv);

}  // namespace ag::repl
