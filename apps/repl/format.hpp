#pragma once
/// \file format.hpp
/// Small text helpers for the REPL's output: printf-style formatting into a
/// std::string, durations, byte sizes and plurals. Pure functions.

#include <cstdint>
#include <string>

namespace ag::repl {

/// printf into a std::string (any length).
std::string fmt(const char* format, ...) __attribute__((format(printf, 1, 2)));

/// "12.3 ms" for nanoseconds.
std::string ms_text(int64_t ns);
/// "1.5 s", "3 min", "2.1 h": a duration people read at a glance.
std::string seconds_text(double s);
/// "256 B", "64.0 KiB", "9.60 MiB", "1.21 GiB", "3.50 TiB", "16.00 EiB".
std::string bytes_text(double bytes);
/// "1 job", "3 jobs": `n` and the word, with an 's' unless n == 1.
std::string count_text(long long n, const char* word);

}  // namespace ag::repl
