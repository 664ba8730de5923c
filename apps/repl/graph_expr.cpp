#include "apps/repl/graph_expr.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "apps/repl/format.hpp"
#include "apps/repl/memory_budget.hpp"
#include "graph/host_tensor.hpp"

namespace ag::repl {

namespace {

// "col 7", or "line 2 col 7" when the text has several lines. `pos` counts
// from the start of the command line (text starts at `offset`).
std::string where(const std::string& text, std::size_t pos, std::size_t offset) {
  if (text.find('\n') == std::string::npos) return "col " + std::to_string(pos + 1);
  const std::size_t at = pos >= offset ? pos - offset : 0;
  std::size_t line = 1, col = 1;
  for (std::size_t k = 0; k < at && k < text.size(); ++k) {
    if (text[k] == '\n') { ++line; col = 1; } else { ++col; }
  }
  return "line " + std::to_string(line) + " col " + std::to_string(col);
}

bool ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; }

class parser {
 public:
  parser(const std::string& s, std::size_t offset) : s_(s), off_(offset) {}

  expected<std::vector<statement>> program() {
    std::vector<statement> out;
    for (;;) {
      while (i_ < s_.size() && (std::isspace(static_cast<unsigned char>(s_[i_])) || s_[i_] == ';')) ++i_;
      if (i_ >= s_.size()) break;
      statement st;
      if (!stmt(st)) return err_;
      out.push_back(std::move(st));
    }
    if (out.empty()) return fail(i_, "empty graph expression (e.g. 'x=input[8,64] w=weight[64,64] y=matmul(x,w) out y')");
    return out;
  }

 private:
  error fail(std::size_t at, const std::string& msg) {
    if (!err_) err_ = error(errc::invalid_argument, where(s_, at + off_, off_) + ": " + msg);
    return err_;
  }
  std::string found() const {
    if (i_ >= s_.size()) return "end of text";
    return std::string("'") + s_[i_] + "'";
  }
  void spaces() {  // inside a statement: blanks, not ';'
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool peek(char c) {
    spaces();
    return i_ < s_.size() && s_[i_] == c;
  }
  bool ident(std::string& out) {
    spaces();
    if (i_ >= s_.size() || !ident_start(s_[i_])) return false;
    const std::size_t b = i_;
    while (i_ < s_.size() && ident_char(s_[i_])) ++i_;
    out = s_.substr(b, i_ - b);
    return true;
  }
  // True when the text at the cursor is `name =` (a binding or keyword argument).
  bool at_binding() {
    const std::size_t save = i_;
    std::string n;
    bool yes = ident(n) && peek('=');
    i_ = save;
    return yes;
  }

  bool stmt(statement& st) {
    spaces();
    st.pos = i_ + off_;
    std::string name;
    if (!ident(name)) {
      fail(i_, "expected a statement ('name=expr' or 'out name'), found " + found());
      return false;
    }
    if (name == "out" && !peek('=')) {
      for (;;) {
        spaces();
        const std::size_t at = i_;
        std::string o;
        if (!ident(o)) {
          fail(i_, "expected a tensor name after 'out', found " + found());
          return false;
        }
        st.outs.emplace_back(o, at + off_);
        // `out a, b` or `out a b`; stop before the next statement `c=...`.
        while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && ident_start(s_[i_]) && !at_binding()) continue;
        return true;
      }
    }
    st.target = name;
    if (!peek('=')) {
      fail(i_, "expected '=' after '" + name + "', found " + found());
      return false;
    }
    ++i_;
    return expression(st.value);
  }

  bool number(expr& e) {
    const char* b = s_.c_str() + i_;
    char* end = nullptr;
    e.number = std::strtod(b, &end);
    if (end == b || !std::isfinite(e.number)) {
      fail(i_, "expected a number, found " + found());
      return false;
    }
    e.k = expr::kind::number;
    e.text.assign(b, static_cast<std::size_t>(end - b));
    i_ += static_cast<std::size_t>(end - b);
    return true;
  }

  bool list(std::vector<int64_t>& out) {
    ++i_;  // '['
    for (;;) {
      spaces();
      const std::size_t at = i_;
      const char* b = s_.c_str() + i_;
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(b, &end, 10);
      if (end == b) {
        fail(at, "expected a whole number in '[...]', found " + found());
        return false;
      }
      if (errno == ERANGE) {
        fail(at, "dimension " + std::string(b, static_cast<std::size_t>(end - b)) + " does not fit in 64 bits");
        return false;
      }
      i_ += static_cast<std::size_t>(end - b);
      out.push_back(v);
      if (peek(',')) { ++i_; continue; }
      if (peek(']')) { ++i_; return true; }
      fail(i_, "expected ',' or ']' in a dims list, found " + found());
      return false;
    }
  }

  bool expression(expr& e) {
    spaces();
    e.pos = i_ + off_;
    if (i_ >= s_.size()) {
      fail(i_, "expected an expression, found end of text");
      return false;
    }
    const char c = s_[i_];
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+' || c == '.') return number(e);
    if (c == '[') {
      e.k = expr::kind::list;
      return list(e.list);
    }
    if (!ident(e.text)) {
      fail(i_, "expected an expression, found " + found());
      return false;
    }
    e.k = expr::kind::name;
    // Call suffixes bind tightly: no blanks between name and '[', ':' or '('.
    if (i_ < s_.size() && s_[i_] == '[') {
      e.k = expr::kind::call;
      e.has_dims = true;
      if (!list(e.list)) return false;
    }
    if (i_ < s_.size() && s_[i_] == ':') {
      ++i_;
      e.k = expr::kind::call;
      if (!ident(e.type)) {
        fail(i_, "expected a dtype after ':' (f32, f16, bf16, i32), found " + found());
        return false;
      }
    }
    if (i_ < s_.size() && s_[i_] == '(') {
      const std::size_t open = i_;
      ++i_;
      e.k = expr::kind::call;
      if (peek(')')) { ++i_; return true; }
      for (;;) {
        if (at_binding()) {
          std::string key;
          ident(key);
          spaces();
          ++i_;  // '='
          expr v;
          if (!expression(v)) return false;
          e.kwargs.emplace_back(key, std::move(v));
        } else {
          expr a;
          if (!expression(a)) return false;
          e.args.push_back(std::move(a));
        }
        if (peek(',')) { ++i_; continue; }
        if (peek(')')) { ++i_; return true; }
        if (i_ >= s_.size()) {
          fail(open, "'(' of '" + e.text + "' is never closed");
          return false;
        }
        fail(i_, "expected ',' or ')' in the arguments of '" + e.text + "', found " + found());
        return false;
      }
    }
    return true;
  }

  const std::string& s_;
  std::size_t off_;
  std::size_t i_ = 0;
  error err_;
};

class builder {
 public:
  builder(const std::string& text, uint64_t seed, std::size_t offset, const graph_expr_limits& limits)
      : text_(text), seed_(seed), off_(offset), limits_(limits) {}

  expected<graph> run(const std::vector<statement>& prog) {
    bool any_out = false;
    for (const auto& st : prog) {
      if (st.target.empty()) {
        for (const auto& [name, pos] : st.outs) {
          auto it = env_.find(name);
          if (it == env_.end()) return fail(pos, "'out " + name + "': no tensor named '" + name + "'");
          b_.output(it->second);
          any_out = true;
        }
        continue;
      }
      if (env_.count(st.target)) return fail(st.pos, "'" + st.target + "' is bound twice");
      tensor t;
      if (!eval(st.value, st.target, t)) return err_;
      env_[st.target] = t;
    }
    if (!any_out) return fail(prog.empty() ? 0 : prog.back().pos, "no outputs: end with 'out <name>'");
    auto g = std::move(b_).build();
    if (!g) return error(g.err().code, "graph: " + g.err().message);
    return g;
  }

 private:
  error fail(std::size_t pos_with_offset, const std::string& msg) {
    if (!err_) err_ = error(errc::invalid_argument, where(text_, pos_with_offset, off_) + ": " + msg);
    return err_;
  }
  bool bad(const expr& e, const std::string& msg) {
    fail(e.pos, msg);
    return false;
  }

  bool eval(const expr& e, const std::string& name, tensor& out) {
    switch (e.k) {
      case expr::kind::name: {
        auto it = env_.find(e.text);
        if (it == env_.end()) {
          if (e.text == "input" || e.text == "weight") return bad(e, leaf_syntax(e));
          const auto& fs = graph_expr_functions();
          if (std::find(fs.begin(), fs.end(), e.text) != fs.end())
            return bad(e, "'" + e.text + "' is a function: call it, e.g. " + e.text + "(x)");
          return bad(e, "unknown name '" + e.text + "'");
        }
        out = it->second;
        return true;
      }
      case expr::kind::number:
        return bad(e, "expected a tensor, found the number " + e.text);
      case expr::kind::list:
        return bad(e, "expected a tensor, found a dims list");
      case expr::kind::call:
        return call(e, name, out);
    }
    return false;
  }

  bool num_arg(const expr& e, std::size_t i, const char* what, double& v) {
    if (i >= e.args.size()) return bad(e, "'" + e.text + "' needs " + what);
    if (e.args[i].k != expr::kind::number) return bad(e.args[i], "'" + e.text + "': " + what + " must be a number");
    v = e.args[i].number;
    return true;
  }
  /// An integer argument (an axis, a bound): refuses fractions and values
  /// outside [lo, hi] before any conversion (a double beyond the integer's
  /// range converts to undefined behaviour).
  bool int_arg(const expr& e, std::size_t i, const char* what, int64_t lo, int64_t hi, int64_t& v) {
    double d = 0;
    if (!num_arg(e, i, what, d)) return false;
    return to_int(e.args[i], std::string("'") + e.text + "': " + what, d, lo, hi, v);
  }
  bool kw_int(const expr& e, const std::string& key, int64_t lo, int64_t hi, int64_t& v) {
    for (const auto& [k, val] : e.kwargs)
      if (k == key) {
        if (val.k != expr::kind::number) return bad(val, "'" + key + "' must be a number");
        return to_int(val, "'" + key + "'", val.number, lo, hi, v);
      }
    return true;
  }
  bool to_int(const expr& at, const std::string& what, double d, int64_t lo, int64_t hi, int64_t& v) {
    if (!(d >= static_cast<double>(lo) && d <= static_cast<double>(hi)) || d != std::floor(d)) {
      char got[32];
      std::snprintf(got, sizeof got, "%.17g", d);
      return bad(at, what + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + got);
    }
    v = static_cast<int64_t>(d);
    return true;
  }
  bool kw_num(const expr& e, const std::string& key, double& v) {
    for (const auto& [k, val] : e.kwargs)
      if (k == key) {
        if (val.k != expr::kind::number) return bad(val, "'" + key + "' must be a number");
        v = val.number;
      }
    return true;
  }
  bool check_kwargs(const expr& e, std::initializer_list<const char*> allowed) {
    for (const auto& [k, val] : e.kwargs) {
      bool ok = false;
      for (const char* a : allowed) ok = ok || k == a;
      if (!ok) {
        std::string list;
        for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        return bad(val, "'" + e.text + "' has no parameter '" + k + "'" +
                             (list.empty() ? std::string() : " (it takes: " + list + ")"));
      }
    }
    return true;
  }
  bool arity(const expr& e, std::size_t lo, std::size_t hi) {
    if (e.args.size() < lo || e.args.size() > hi) {
      const std::string want = lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi);
      return bad(e, "'" + e.text + "' takes " + want + " argument" + (hi == 1 ? "" : "s") + ", got " +
                        std::to_string(e.args.size()));
    }
    return true;
  }
  bool tensors(const expr& e, std::size_t n, std::vector<tensor>& ts) {
    for (std::size_t i = 0; i < n && i < e.args.size(); ++i) {
      tensor t;
      if (!eval(e.args[i], {}, t)) return false;
      ts.push_back(t);
    }
    return true;
  }
  bool dims_of(const expr& e, std::vector<int64_t> v, shape& s) {
    if (v.empty() || v.size() > static_cast<std::size_t>(max_rank))
      return bad(e, "a shape has 1 to " + std::to_string(max_rank) + " dims, got " + std::to_string(v.size()));
    for (auto d : v)
      if (d <= 0) return bad(e, "dims must be positive, got " + std::to_string(d));
    s = shape::from_range(v.begin(), v.end());
    return true;
  }
  // The error for `input(4, 8)` or a bare `input`: leaves take their dims
  // in square brackets, and the message shows the line rewritten so.
  static std::string leaf_syntax(const expr& e) {
    std::string dims;
    bool all_numbers = !e.args.empty() && e.kwargs.empty();
    for (const auto& a : e.args) {
      all_numbers = all_numbers && a.k == expr::kind::number;
      dims += (dims.empty() ? "" : ",") + a.text;
    }
    const std::string typed = e.type.empty() ? "" : ":" + e.type;
    if (all_numbers)
      return "'" + e.text + "' takes its dims in square brackets: " + e.text + "[" + dims + "]" + typed + ", not " + e.text +
             "(...)";
    return "'" + e.text + "' needs its dims in square brackets, e.g. " + e.text + "[8,64] or " + e.text + "[8,64]:f16";
  }

  // After a builder call: its first error, with this expression's column.
  bool built(const expr& e, tensor t, tensor& out) {
    if (!b_.status().ok() || !t.valid())
      return bad(e, b_.status().ok() ? "'" + e.text + "' failed" : b_.status().to_string());
    out = t;
    return true;
  }

  bool call(const expr& e, const std::string& name, tensor& out) {
    const std::string& f = e.text;
    dtype type = dtype::f32;
    if (!e.type.empty() && !parse_dtype(e.type.c_str(), type))
      return bad(e, "unknown dtype '" + e.type + "' (f32, f16, bf16, i32)");
    if (f == "input" || f == "weight") {
      if (!e.has_dims) return bad(e, leaf_syntax(e));
      if (!e.args.empty() || !e.kwargs.empty()) return bad(e, "'" + f + "' takes no arguments: " + f + "[d0,d1,...] or " + f + "[d0,...]:f16");
      shape s;
      if (!dims_of(e, e.list, s)) return false;
      const auto bytes = checked_bytes(s, type);
      if (!bytes) return bad(e, "'" + f + "' of " + overflow_text(s, type));
      const std::string n = name.empty() ? f + std::to_string(++leaves_) : name;
      if (f == "input") return built(e, b_.input(n, type, s), out);
      weight_bytes_ += static_cast<double>(*bytes);
      if (weight_bytes_ > limits_.max_weight_bytes)
        return bad(e, "weight '" + n + "' " + s.to_string() + " " + to_string(type) + " takes " +
                          bytes_text(static_cast<double>(*bytes)) + ": the graph's weights would take " +
                          bytes_text(weight_bytes_) + ", more than this host can build (" +
                          bytes_text(limits_.max_weight_bytes) + ")");
      const uint64_t seed = seed_ * 1000003ull + static_cast<uint64_t>(++leaves_);
      host_tensor data;
      if (type == dtype::i32) {
        data = host_tensor::random_ints(s, seed, 16);
      } else {
        const double fan_in = static_cast<double>(s.rank() >= 2 ? s[-2] : s[0]);
        data = host_tensor::random_normal(type, s, seed, static_cast<float>(1.0 / std::sqrt(fan_in)));
      }
      return built(e, b_.weight(n, std::move(data)), out);
    }
    if (e.has_dims || !e.type.empty()) return bad(e, "only 'input' and 'weight' take [dims] or :type");
    std::vector<tensor> ts;
    auto unary = [&](auto fn) {
      if (!arity(e, 1, 1) || !check_kwargs(e, {}) || !tensors(e, 1, ts)) return false;
      return built(e, fn(ts[0]), out);
    };
    auto binary = [&](auto fn) {
      if (!arity(e, 2, 2) || !check_kwargs(e, {}) || !tensors(e, 2, ts)) return false;
      return built(e, fn(ts[0], ts[1]), out);
    };
    if (f == "add") return binary([&](tensor a, tensor b) { return b_.add(a, b, name); });
    if (f == "mul") return binary([&](tensor a, tensor b) { return b_.mul(a, b, name); });
    if (f == "gelu") return unary([&](tensor x) { return b_.gelu(x, gelu_mode::tanh, name); });
    if (f == "silu") return unary([&](tensor x) { return b_.silu(x, name); });
    if (f == "argmax") return unary([&](tensor x) { return b_.argmax(x, name); });
    if (f == "contiguous") return unary([&](tensor x) { return b_.contiguous(x, name); });
    if (f == "matmul") {
      double ta = 0, tb = 0;
      if (!arity(e, 2, 2) || !check_kwargs(e, {"ta", "tb"}) || !kw_num(e, "ta", ta) || !kw_num(e, "tb", tb) ||
          !tensors(e, 2, ts))
        return false;
      return built(e, b_.matmul(ts[0], ts[1], ta != 0, tb != 0, name), out);
    }
    if (f == "scale") {
      double s = 1;
      if (!arity(e, 2, 2) || !check_kwargs(e, {}) || !num_arg(e, 1, "a factor", s) || !tensors(e, 1, ts)) return false;
      return built(e, b_.scale(ts[0], static_cast<float>(s), name), out);
    }
    if (f == "softmax") {
      double causal = 0, sc = 1;
      if (!arity(e, 1, 1) || !check_kwargs(e, {"causal", "scale"}) || !kw_num(e, "causal", causal) ||
          !kw_num(e, "scale", sc) || !tensors(e, 1, ts))
        return false;
      return built(e, b_.softmax(ts[0], causal != 0, static_cast<float>(sc), name), out);
    }
    if (f == "rms_norm" || f == "layer_norm") {
      double eps = f == "rms_norm" ? 1e-6 : 1e-5;
      if (!arity(e, 1, f == "rms_norm" ? 2 : 3) || !check_kwargs(e, {"eps"}) || !kw_num(e, "eps", eps) ||
          !tensors(e, e.args.size(), ts))
        return false;
      ts.resize(3);
      if (f == "rms_norm") return built(e, b_.rms_norm(ts[0], ts[1], static_cast<float>(eps), name), out);
      return built(e, b_.layer_norm(ts[0], ts[1], ts[2], static_cast<float>(eps), name), out);
    }
    if (f == "get_rows") return binary([&](tensor a, tensor b) { return b_.get_rows(a, b, name); });
    if (f == "rope") {
      double theta = 10000;
      if (!arity(e, 2, 2) || !check_kwargs(e, {"theta"}) || !kw_num(e, "theta", theta) || !tensors(e, 2, ts))
        return false;
      return built(e, b_.rope(ts[0], ts[1], static_cast<float>(theta), rope_mode::neox, name), out);
    }
    if (f == "reshape" || f == "permute") {
      if (!arity(e, 2, 2) || !check_kwargs(e, {})) return false;
      if (e.args[1].k != expr::kind::list) return bad(e.args[1], "'" + f + "' needs a list like [2,32] as its 2nd argument");
      if (!tensors(e, 1, ts)) return false;
      if (f == "reshape") {
        shape s;
        if (!dims_of(e.args[1], e.args[1].list, s)) return false;
        return built(e, b_.reshape(ts[0], s, name), out);
      }
      std::array<int, max_rank> p{0, 1, 2, 3};
      if (e.args[1].list.size() > static_cast<std::size_t>(max_rank)) return bad(e.args[1], "too many axes");
      for (std::size_t k = 0; k < e.args[1].list.size(); ++k) {
        const int64_t a = e.args[1].list[k];
        if (a < -max_rank || a >= max_rank) return bad(e.args[1], "axis " + std::to_string(a) + " is out of range");
        p[k] = static_cast<int>(a);
      }
      return built(e, b_.permute(ts[0], p, name), out);
    }
    if (f == "transpose") {
      int64_t a0 = 0, a1 = 0;
      if (!arity(e, 3, 3) || !check_kwargs(e, {}) || !int_arg(e, 1, "two axes", -max_rank, max_rank, a0) ||
          !int_arg(e, 2, "two axes", -max_rank, max_rank, a1) || !tensors(e, 1, ts))
        return false;
      return built(e, b_.transpose(ts[0], static_cast<int>(a0), static_cast<int>(a1), name), out);
    }
    if (f == "slice") {
      int64_t ax = 0, lo = 0, hi = 0;
      constexpr int64_t bound = int64_t{1} << 62;  // exactly representable; shapes are far smaller
      if (!arity(e, 4, 4) || !check_kwargs(e, {}) || !int_arg(e, 1, "an axis", -max_rank, max_rank, ax) ||
          !int_arg(e, 2, "a begin", -bound, bound, lo) || !int_arg(e, 3, "an end", -bound, bound, hi) ||
          !tensors(e, 1, ts))
        return false;
      return built(e, b_.slice(ts[0], static_cast<int>(ax), lo, hi, name), out);
    }
    if (f == "concat") {
      int64_t ax = 0;
      if (e.args.size() < 2) return bad(e, "'concat' takes at least 2 tensors, got " + std::to_string(e.args.size()));
      if (!check_kwargs(e, {"axis"}) || !kw_int(e, "axis", -max_rank, max_rank, ax) || !tensors(e, e.args.size(), ts))
        return false;
      return built(e, b_.concat(ts, static_cast<int>(ax), name), out);
    }
    if (f == "copy") {
      if (!arity(e, 2, 2) || !check_kwargs(e, {})) return false;
      dtype to;
      if (e.args[1].k != expr::kind::name || !parse_dtype(e.args[1].text.c_str(), to))
        return bad(e.args[1], "'copy' needs a dtype (f32, f16, bf16, i32) as its 2nd argument");
      if (!tensors(e, 1, ts)) return false;
      return built(e, b_.copy(ts[0], to, name), out);
    }
    return bad(e, "unknown function '" + f + "'");
  }

  const std::string& text_;
  graph_builder b_;
  std::map<std::string, tensor> env_;
  uint64_t seed_;
  std::size_t off_;
  graph_expr_limits limits_;
  double weight_bytes_ = 0;
  int leaves_ = 0;
  error err_;
};

}  // namespace

expected<std::vector<statement>> parse_graph_expr(const std::string& text, std::size_t offset) {
  return parser(text, offset).program();
}

expected<graph> build_graph_expr(const std::vector<statement>& prog, const std::string& text, uint64_t seed,
                                 std::size_t offset, const graph_expr_limits& limits) {
  return builder(text, seed, offset, limits).run(prog);
}

expected<graph> graph_from_expr(const std::string& text, uint64_t seed, std::size_t offset, const graph_expr_limits& limits) {
  auto prog = parse_graph_expr(text, offset);
  if (!prog) return prog.err();
  return build_graph_expr(*prog, text, seed, offset, limits);
}

const std::vector<std::string>& graph_expr_functions() {
  static const std::vector<std::string> f = {
      "input",   "weight",    "matmul",  "add",        "mul",       "scale",   "gelu",
      "silu",    "softmax",   "rms_norm", "layer_norm", "get_rows", "rope",    "reshape",
      "transpose", "permute", "slice",   "concat",     "copy",      "contiguous", "argmax"};
  return f;
}

}  // namespace ag::repl
