#pragma once
/// \file timeline.hpp
/// Text views of an ag::trace for a terminal: a timeline with one row per
/// (device, lane) and one character per job, so the pipeline bubble shows;
/// and per-device utilisation. Pure functions of the trace.

#include <string>

#include "actors/actorgraph.hpp"

namespace ag::repl {

struct timeline_options {
  int width = 96;        ///< columns of the time area (the row labels come on top)
  bool legend = true;    ///< the line that says which character is which job
};

/// The character drawn for the i-th job of a trace (0-9, a-z, A-Z, cycling).
char job_char(std::size_t i) noexcept;

/// Renders rows "sim0 compute0 |000111222...   |", a time axis with labels
/// in ms / us, and a legend. Rows are ordered by device, then compute lanes,
/// h2d, d2h, peer. A cell shows the job that covers most of it; '.' is idle.
/// An empty trace gives a one-line note.
std::string render_timeline(const trace& t, const timeline_options& options = {});

/// Busy fraction of each device's compute lanes (union of their intervals)
/// and of its copy lanes, over [first start, last end] of the whole trace,
/// one line per device with a bar.
std::string render_utilisation(const trace& t);

/// Busy fraction of the compute lanes of `device` (union of intervals) over
/// the whole trace's span; 0 when the trace is empty.
double compute_utilisation(const trace& t, int device);

}  // namespace ag::repl
