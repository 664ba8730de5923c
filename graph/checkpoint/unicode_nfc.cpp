// Unicode Normalization Form C (UAX #15): what Qwen2's tokenizer.json asks
// of its text before the pre-tokenizer (normalizer "NFC").
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "graph/checkpoint/tokenizer.hpp"
#include "graph/checkpoint/unicode_classes.hpp"

namespace ag::models {

namespace {

struct combining_run {
  char32_t first, last;
  uint8_t ccc;
};
struct decomposition {
  char32_t cp, first, second;
};
struct composition {
  char32_t first, second, composite;
};

#include "graph/checkpoint/unicode_nfc_tables.inc"

// Hangul syllables compose and decompose by arithmetic (Unicode 3.12).
constexpr char32_t s_base = 0xAC00, l_base = 0x1100, v_base = 0x1161, t_base = 0x11A7;
constexpr char32_t l_count = 19, v_count = 21, t_count = 28, n_count = v_count * t_count, s_count = l_count * n_count;

uint8_t combining_class(char32_t c) noexcept {
  if (c < 0x300) return 0;
  const combining_run* end = std::end(combining_runs);
  const combining_run* it = std::upper_bound(std::begin(combining_runs), end, c,
                                             [](char32_t v, const combining_run& r) { return v < r.first; });
  return it != std::begin(combining_runs) && c <= (it - 1)->last ? (it - 1)->ccc : 0;
}

void decompose(char32_t c, std::u32string& out) {
  if (c >= s_base && c < s_base + s_count) {
    const char32_t s = c - s_base;
    out.push_back(l_base + s / n_count);
    out.push_back(v_base + (s % n_count) / t_count);
    if (s % t_count != 0) out.push_back(t_base + s % t_count);
    return;
  }
  const decomposition* end = std::end(decompositions);
  const decomposition* it =
      std::lower_bound(std::begin(decompositions), end, c, [](const decomposition& d, char32_t v) { return d.cp < v; });
  if (it == end || it->cp != c) {
    out.push_back(c);
    return;
  }
  decompose(it->first, out);  // a decomposition's first part may decompose again
  if (it->second != 0) decompose(it->second, out);
}

// The primary composite of (a, b), or 0.
char32_t compose(char32_t a, char32_t b) noexcept {
  if (a >= l_base && a < l_base + l_count && b >= v_base && b < v_base + v_count)
    return s_base + ((a - l_base) * v_count + (b - v_base)) * t_count;
  if (a >= s_base && a < s_base + s_count && (a - s_base) % t_count == 0 && b > t_base && b < t_base + t_count)
    return a + (b - t_base);
  const composition* end = std::end(compositions);
  const composition* it = std::lower_bound(std::begin(compositions), end, std::pair{a, b}, [](const composition& x, std::pair<char32_t, char32_t> v) {
    return x.first != v.first ? x.first < v.first : x.second < v.second;
  });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

}  // namespace

std::string to_nfc(std::string_view utf8) {
  // Below U+00C0 nothing decomposes or combines: ASCII text is its own NFC.
  if (std::all_of(utf8.begin(), utf8.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
    return std::string(utf8);
  auto cps = utf8_decode(utf8);
  if (!cps) return std::string(utf8);  // not UTF-8: the caller's check names the byte
  // 1. The full canonical decomposition.
  std::u32string d;
  d.reserve(cps->size());
  for (char32_t c : *cps) decompose(c, d);
  // 2. Canonical order: each run of non-starters sorted by class, stably.
  for (std::size_t i = 0; i < d.size();) {
    if (combining_class(d[i]) == 0) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < d.size() && combining_class(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + static_cast<std::ptrdiff_t>(i), d.begin() + static_cast<std::ptrdiff_t>(j),
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // 3. Canonical composition: each character joins the last starter when
  // nothing between them blocks it (a character of its class or a starter).
  std::size_t kept = 0, starter = 0;
  bool have_starter = false;
  int last_class = -1;  // the class of the last character kept after the starter (-1: none)
  for (std::size_t i = 0; i < d.size(); ++i) {
    const char32_t c = d[i];
    const int cls = combining_class(c);
    if (have_starter && (last_class == -1 || (last_class != 0 && last_class < cls))) {
      if (const char32_t joined = compose(d[starter], c); joined != 0) {
        d[starter] = joined;
        continue;
      }
    }
    if (cls == 0) {
      starter = kept;
      have_starter = true;
      last_class = -1;
    } else {
      last_class = cls;
    }
    d[kept++] = c;
  }
  d.resize(kept);
  std::string out;
  out.reserve(utf8.size());
  for (char32_t c : d) utf8_append(out, c);
  return out;
}

}  // namespace ag::models
