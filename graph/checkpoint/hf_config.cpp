#include "graph/checkpoint/hf_config.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ag::models {

namespace {

using json = nlohmann::json;

// Reads keys of one JSON object with type checks; the first error names the key.
class key_reader {
 public:
  /// `prefix` goes before every key an error names (an object inside
  /// another: "rope_parameters.").
  key_reader(const json& j, std::string origin, std::string prefix = {})
      : j_(j), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

  const error& status() const noexcept { return err_; }
  const std::string& origin() const noexcept { return origin_; }
  error fail(const std::string& key, const std::string& what) {
    if (!err_) err_ = error{errc::invalid_argument, origin_ + ": '" + prefix_ + key + "': " + what};
    return err_;
  }
  /// Takes an inner object's first error as this one's (unless it has one).
  void adopt(const error& e) {
    if (!err_ && e) err_ = e;
  }
  // The value of `key`, or null when absent or JSON null.
  const json* get(const std::string& key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const std::string& key) const { return get(key) != nullptr; }
  /// Present, even as JSON null.
  bool has_key(const std::string& key) const { return j_.contains(key); }

  int64_t integer(const std::string& key, int64_t fallback, int64_t lo = 1,
                  int64_t hi = std::numeric_limits<int32_t>::max()) {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_number_integer()) {
      fail(key, "expected an integer, got " + v->dump());
      return fallback;
    }
    const auto n = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi) ? hi + 1
                                                                                            : v->get<int64_t>();
    if (n < lo || n > hi) {
      fail(key, v->dump() + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
      return fallback;
    }
    return n;
  }
  double number(const std::string& key, double fallback) {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_number()) {
      fail(key, "expected a number, got " + v->dump());
      return fallback;
    }
    const double d = v->get<double>();
    if (!(d > 0) || !std::isfinite(d)) {
      fail(key, v->dump() + " must be a finite number > 0");
      return fallback;
    }
    return d;
  }
  bool boolean(const std::string& key, bool fallback) {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_boolean()) {
      fail(key, "expected true or false, got " + v->dump());
      return fallback;
    }
    return v->get<bool>();
  }
  std::string string(const std::string& key, std::string fallback) {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_string()) {
      fail(key, "expected a string, got " + v->dump());
      return fallback;
    }
    return v->get<std::string>();
  }
  // Fails when `key` is present and true: a feature the builder lacks.
  void must_be_false(const std::string& key, const std::string& why) {
    if (boolean(key, false)) fail(key, "true is not supported: " + why);
  }

 private:
  const json& j_;
  std::string origin_, prefix_;
  error err_;
};

constexpr int32_t max_token_id = std::numeric_limits<int32_t>::max();

void read_token_ids(key_reader& r, hf_config& out) {
  if (r.has("bos_token_id")) out.bos_token_id = static_cast<int32_t>(r.integer("bos_token_id", 0, 0, max_token_id));
  if (const json* eos = r.get("eos_token_id")) {
    if (eos->is_array()) {
      for (const json& e : *eos) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > max_token_id) {
          r.fail("eos_token_id", "list entry " + e.dump() + " is not a token id");
          return;
        }
        out.eos_token_ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
      }
    } else {
      out.eos_token_ids.push_back(static_cast<int32_t>(r.integer("eos_token_id", 0, 0, max_token_id)));
    }
  }
}

void read_dtype(key_reader& r, hf_config& out) {
  // transformers 5 writes "dtype", 4.x "torch_dtype"; "auto" means unspecified.
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (!r.has(key)) continue;
    std::string s = r.string(key, "");
    if (s.rfind("torch.", 0) == 0) s = s.substr(6);
    if (s == "float32" || s == "float") out.dtype = ag::dtype::f32;
    else if (s == "float16" || s == "half") out.dtype = ag::dtype::f16;
    else if (s == "bfloat16") out.dtype = ag::dtype::bf16;
    else if (s == "auto" || s.empty()) continue;
    else r.fail(key, "\"" + s + "\" is not a dtype actorgraph stores (float32, float16, bfloat16)");
    return;
  }
}

void read_gpt2(key_reader& r, hf_config& out) {
  transformer_config& m = out.model;
  m.variant = model_variant::gpt2;
  m.vocab = r.integer("vocab_size", 50257);
  out.max_positions = r.has("n_positions") ? r.integer("n_positions", 1024) : r.integer("n_ctx", 1024);
  m.max_positions = out.max_positions;
  m.d_model = r.integer("n_embd", 768);
  m.n_layers = static_cast<int>(r.integer("n_layer", 12));
  m.n_heads = static_cast<int>(r.integer("n_head", 12));
  m.d_ff = r.integer("n_inner", 4 * m.d_model);
  m.eps = static_cast<float>(r.number("layer_norm_epsilon", 1e-5));
  const std::string act = r.string("activation_function", "gelu_new");
  if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast") m.activation = gelu_mode::tanh;
  else if (act == "gelu") m.activation = gelu_mode::erf;
  else r.fail("activation_function", "\"" + act + "\" is not implemented (gelu_new, gelu_pytorch_tanh, gelu_fast, gelu)");
  m.head = r.boolean("tie_word_embeddings", true) ? head_tying::tied : head_tying::separate;
  if (!r.boolean("scale_attn_weights", true))
    r.fail("scale_attn_weights", "false is not supported: attention always scales by 1/sqrt(head_dim)");
  r.must_be_false("scale_attn_by_inverse_layer_idx", "attention scales by 1/sqrt(head_dim) only");
  r.must_be_false("add_cross_attention", "the model is decoder-only");
  if (m.n_heads > 0 && m.d_model % m.n_heads != 0)
    r.fail("n_embd", std::to_string(m.d_model) + " is not divisible by 'n_head' " + std::to_string(m.n_heads));
}

// Defaults of transformers' LlamaConfig, MistralConfig and Qwen2Config for
// the keys a config.json may leave out.
struct llama_family_defaults {
  int64_t vocab, hidden, ff, layers, heads, kv_heads;  // kv_heads 0: = heads
  int64_t max_positions;
};
llama_family_defaults defaults_of(const std::string& model_type) {
  if (model_type == "mistral") return {32000, 4096, 14336, 32, 32, 8, 4096 * 32};
  if (model_type == "qwen2" || model_type == "qwen3") return {151936, 4096, 22016, 32, 32, 0, 32768};
  return {32000, 4096, 11008, 32, 32, 0, 2048};
}

// Sliding-window attention (Mistral's, Qwen2's): the window every layer
// takes, into transformer_config::sliding_window; a window on some layers
// but not others is refused, naming the key that says so.
void read_sliding_window(key_reader& r, hf_config& out) {
  int64_t& window = out.model.sliding_window;
  window = 0;
  if (out.model_type == "mistral") {
    // MistralConfig's default window is 4096; an explicit null turns it off.
    if (!r.has_key("sliding_window")) window = 4096;
    else window = r.integer("sliding_window", 0);
    return;
  }
  if (out.model_type != "qwen2" && out.model_type != "qwen3") return;
  // Qwen2Config (Qwen3Config alike): a window only with use_sliding_window (and a
  // sliding_window), on the layers layer_types names "sliding_attention"
  // (transformers 5 writes the list; without it, layers from
  // max_window_layers on).
  if (!r.boolean("use_sliding_window", false) || !r.has("sliding_window")) return;
  const int64_t w = r.integer("sliding_window", 0);
  const std::string why = "a sliding window on some layers and not on others is not implemented (all or none)";
  if (const json* types = r.get("layer_types")) {
    if (!types->is_array()) {
      r.fail("layer_types", "expected a list, got " + types->dump());
      return;
    }
    if (static_cast<int64_t>(types->size()) != out.model.n_layers) {
      r.fail("layer_types", std::to_string(types->size()) + " entries for " + std::to_string(out.model.n_layers) + " layers");
      return;
    }
    std::size_t sliding = 0;
    for (const json& t : *types) {
      const std::string type = t.is_string() ? t.get<std::string>() : "";
      if (type != "full_attention" && type != "sliding_attention") {
        r.fail("layer_types", "entry " + t.dump() + ": \"full_attention\" or \"sliding_attention\" only");
        return;
      }
      sliding += type == "sliding_attention";
    }
    if (sliding > 0 && sliding < types->size()) r.fail("layer_types", std::to_string(sliding) + " of " + std::to_string(types->size()) + " entries \"sliding_attention\": " + why);
    else if (sliding > 0) window = w;
    return;
  }
  const int64_t from = r.integer("max_window_layers", 28, 0);
  if (from > 0 && from < out.model.n_layers)
    r.fail("use_sliding_window", "true, with 'sliding_window' from layer 'max_window_layers' " + std::to_string(from) +
                                     " of " + std::to_string(out.model.n_layers) + ": " + why);
  else if (from == 0) window = w;
}

// LLaMA's architecture and its relatives that differ in defaults, biases
// and window: Mistral (a sliding window), Qwen2 (q/k/v biases), Qwen3 (q/k norms).
void read_llama(key_reader& r, hf_config& out) {
  transformer_config& m = out.model;
  const llama_family_defaults def = defaults_of(out.model_type);
  m.variant = model_variant::llama;
  m.vocab = r.integer("vocab_size", def.vocab);
  m.d_model = r.integer("hidden_size", def.hidden);
  m.d_ff = r.integer("intermediate_size", def.ff);
  m.n_layers = static_cast<int>(r.integer("num_hidden_layers", def.layers));
  m.n_heads = static_cast<int>(r.integer("num_attention_heads", def.heads));
  m.n_kv_heads = static_cast<int>(r.integer("num_key_value_heads", def.kv_heads > 0 ? def.kv_heads : m.n_heads));
  out.max_positions = r.integer("max_position_embeddings", def.max_positions);
  m.eps = static_cast<float>(r.number("rms_norm_eps", 1e-6));
  m.head = r.boolean("tie_word_embeddings", false) ? head_tying::tied : head_tying::separate;
  const std::string act = r.string("hidden_act", "silu");
  if (act != "silu" && act != "swish") r.fail("hidden_act", "\"" + act + "\" is not implemented (silu)");
  if (out.model_type == "qwen2") {
    m.attn_bias = attention_bias::qkv;  // Qwen2Attention: q, k, v with bias, o without; no key says so
  } else if (out.model_type == "llama" || out.model_type == "qwen3") {
    // LlamaAttention and Qwen3Attention: attention_bias puts a bias on q, k, v and o.
    m.attn_bias = r.boolean("attention_bias", false) ? attention_bias::qkv_o : attention_bias::none;
    r.must_be_false("mlp_bias", "the MLP projections have no bias");
  } else {
    r.must_be_false("attention_bias", "the q/k/v/o projections have no bias");
    r.must_be_false("mlp_bias", "the MLP projections have no bias");
  }
  // Qwen3Attention: an RMSNorm over each head's q and k before RoPE.
  m.qk_norm = out.model_type == "qwen3";
  // head_dim (null or absent: hidden_size / heads, as LlamaConfig takes it;
  // Qwen3Config's default is 128) may differ from hidden_size / heads
  // (Mistral NeMo: 5120 / 32 heads of 128).
  if (r.has("head_dim") || out.model_type == "qwen3") {
    const int64_t dh = r.integer("head_dim", 128);
    if (dh < 2 || dh % 2 != 0) r.fail("head_dim", r.get("head_dim")->dump() + " is not an even width >= 2 (RoPE rotates pairs)");
    else if (m.n_heads <= 0 || dh * m.n_heads != m.d_model) m.explicit_head_dim = dh;
  }
  if (m.explicit_head_dim == 0 && m.n_heads > 0 && m.d_model % m.n_heads != 0)
    r.fail("hidden_size", std::to_string(m.d_model) + " is not divisible by 'num_attention_heads' " +
                              std::to_string(m.n_heads) + " (and no 'head_dim' says the heads' width)");
  if (m.n_kv_heads > 0 && m.n_heads % m.n_kv_heads != 0)
    r.fail("num_key_value_heads", std::to_string(m.n_kv_heads) + " does not divide 'num_attention_heads' " +
                                      std::to_string(m.n_heads));
  read_sliding_window(r, out);

  double theta = 10000.0;
  if (r.has("rope_theta")) theta = r.number("rope_theta", theta);
  // The RoPE variant of one object (4.x's rope_scaling, 5.x's
  // rope_parameters): plain ("default"), Llama 3's scaling, whose four
  // numbers transformers requires too, or linear scaling (a factor).
  const auto read_rope_type = [&](const json& obj, const std::string& key, bool type_required) {
    key_reader sub(obj, r.origin(), key + ".");
    std::string type = sub.string("rope_type", "default");
    if (!sub.has("rope_type")) type = sub.string("type", type);
    if (!type_required && !sub.has("rope_type") && !sub.has("type")) {
      sub.fail("rope_type", "missing (null or an object with \"rope_type\")");
    } else if (type == "llama3") {
      rope_scaling& rs = m.rope_scale;
      for (const char* k : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
        if (!sub.has(k)) sub.fail(k, "missing (rope_type \"llama3\" needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings)");
      rs.factor = static_cast<float>(sub.number("factor", 1.0));
      rs.low_freq_factor = static_cast<float>(sub.number("low_freq_factor", 1.0));
      rs.high_freq_factor = static_cast<float>(sub.number("high_freq_factor", 4.0));
      rs.original_context = static_cast<int32_t>(sub.integer("original_max_position_embeddings", 8192));
      if (!sub.status() && !(rs.high_freq_factor > rs.low_freq_factor))
        sub.fail("high_freq_factor", "must be greater than low_freq_factor (" + std::to_string(rs.low_freq_factor) + ")");
    } else if (type == "linear") {
      rope_scaling& rs = m.rope_scale;
      if (!sub.has("factor")) sub.fail("factor", "missing (rope_type \"linear\" needs a factor)");
      rs = rope_scaling{};
      rs.kind = rope_scaling_kind::linear;
      rs.factor = static_cast<float>(sub.number("factor", 1.0));  // number(): finite and > 0
    } else if (type != "default") {
      sub.fail("rope_type", "\"" + type + "\" is not implemented (plain RoPE, \"llama3\" and \"linear\" are)");
    }
    if (key == "rope_parameters" && sub.has("rope_theta")) theta = sub.number("rope_theta", theta);
    if (sub.has("partial_rotary_factor") && sub.number("partial_rotary_factor", 1.0) != 1.0)
      sub.fail("partial_rotary_factor", "only 1 (RoPE over the whole head) is implemented");
    r.adopt(sub.status());
  };
  if (const json* rp = r.get("rope_parameters")) {  // transformers 5
    if (!rp->is_object()) r.fail("rope_parameters", "expected an object, got " + rp->dump());
    else read_rope_type(*rp, "rope_parameters", true);
  }
  if (const json* rs = r.get("rope_scaling")) {  // transformers 4.x (null: plain RoPE)
    if (!rs->is_object()) r.fail("rope_scaling", "expected an object or null, got " + rs->dump());
    else read_rope_type(*rs, "rope_scaling", false);
  }
  m.rope_theta = static_cast<float>(theta);
}

}  // namespace

expected<hf_config> parse_hf_config(std::string_view text, const std::string& origin) {
  try {
    json j = json::parse(text.begin(), text.end());
    if (!j.is_object()) return error{errc::invalid_argument, origin + ": not a JSON object"};
    hf_config out;
    out.origin = origin;
    out.model.seq_len = 1;
    out.model.batch = 1;
    key_reader r(j, origin);
    out.model_type = r.string("model_type", "");
    if (out.model_type.empty()) {
      if (const json* a = r.get("architectures"); a && a->is_array() && !a->empty() && (*a)[0].is_string()) {
        const std::string arch = (*a)[0].get<std::string>();
        if (arch.rfind("GPT2", 0) == 0) out.model_type = "gpt2";
        else if (arch.rfind("Llama", 0) == 0) out.model_type = "llama";
        else if (arch.rfind("Mistral", 0) == 0) out.model_type = "mistral";
        else if (arch.rfind("Qwen2ForCausalLM", 0) == 0) out.model_type = "qwen2";
        else if (arch.rfind("Qwen3ForCausalLM", 0) == 0) out.model_type = "qwen3";
        else return r.fail("architectures", "\"" + arch + "\" is not an architecture actorgraph builds (GPT-2, LLaMA, Mistral, Qwen2, Qwen3)");
      } else {
        return r.fail("model_type", "missing (and no 'architectures' to infer it from)");
      }
    }
    if (out.model_type == "gpt2") read_gpt2(r, out);
    else if (out.model_type == "llama" || out.model_type == "mistral" || out.model_type == "qwen2" ||
             out.model_type == "qwen3")
      read_llama(r, out);
    else return r.fail("model_type", "\"" + out.model_type + "\" is not an architecture actorgraph builds (gpt2, llama, mistral, qwen2, qwen3)");
    read_dtype(r, out);
    read_token_ids(r, out);
    if (r.status()) return r.status();
    if (out.model.dtype = out.dtype.value_or(ag::dtype::f32); error e = validate(out.model))
      return error{e.code, origin + ": " + e.message};
    return out;
  } catch (const std::exception& ex) {
    return error{errc::invalid_argument, origin + ": not valid JSON: " + ex.what()};
  }
}

expected<hf_config> read_hf_config(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p, ec)) p /= "config.json";
  std::ifstream in(p, std::ios::binary);
  if (!in) return error{errc::invalid_argument, p.string() + ": cannot open: " + std::strerror(errno)};
  std::ostringstream s;
  s << in.rdbuf();
  return parse_hf_config(s.str(), p.string());
}

namespace {

// transformers 4.x's rope_scaling object of `s` (null: plain RoPE).
json rope_scaling_json(const rope_scaling& s) {
  if (!s.on()) return json(nullptr);
  if (s.kind == rope_scaling_kind::linear) return json{{"rope_type", "linear"}, {"factor", s.factor}};
  return json{{"rope_type", "llama3"},
              {"factor", s.factor},
              {"low_freq_factor", s.low_freq_factor},
              {"high_freq_factor", s.high_freq_factor},
              {"original_max_position_embeddings", s.original_context}};
}

}  // namespace

std::string to_hf_config_json(const transformer_config& c, int64_t max_positions) {
  json j;
  const char* dt = c.dtype == ag::dtype::bf16 ? "bfloat16" : c.dtype == ag::dtype::f16 ? "float16" : "float32";
  if (c.variant == model_variant::gpt2) {
    j = {{"architectures", {"GPT2LMHeadModel"}},
         {"model_type", "gpt2"},
         {"vocab_size", c.vocab},
         {"n_positions", max_positions > 0 ? max_positions : c.positions_rows()},
         {"n_embd", c.d_model},
         {"n_layer", c.n_layers},
         {"n_head", c.n_heads},
         {"n_inner", c.d_ff},
         {"activation_function", c.activation == gelu_mode::erf ? "gelu" : "gelu_new"},
         {"layer_norm_epsilon", c.eps},
         {"tie_word_embeddings", c.tied_head()},
         {"torch_dtype", dt}};
  } else {
    // q/k/v biases alone are Qwen2's architecture; with o's, LLaMA's
    // attention_bias; q/k norms Qwen3's (save_hf_model refuses them with
    // q/k/v biases alone).
    // A sliding window without them is Mistral's (save_hf_model refuses
    // it with o's bias).
    const bool qwen2 = c.attn_bias == attention_bias::qkv && !c.qk_norm, qwen3 = c.qk_norm;
    const bool mistral = !qwen2 && !qwen3 && c.sliding_window > 0;
    j = {{"architectures",
          {qwen3 ? "Qwen3ForCausalLM" : qwen2 ? "Qwen2ForCausalLM" : mistral ? "MistralForCausalLM" : "LlamaForCausalLM"}},
         {"model_type", qwen3 ? "qwen3" : qwen2 ? "qwen2" : mistral ? "mistral" : "llama"},
         {"vocab_size", c.vocab},
         {"hidden_size", c.d_model},
         {"intermediate_size", c.d_ff},
         {"num_hidden_layers", c.n_layers},
         {"num_attention_heads", c.n_heads},
         {"num_key_value_heads", c.kv_heads()},
         {"head_dim", c.head_dim()},
         {"hidden_act", "silu"},
         {"max_position_embeddings", max_positions > 0 ? max_positions : 2048},
         {"rms_norm_eps", c.eps},
         {"rope_theta", c.rope_theta},
         {"rope_scaling", rope_scaling_json(c.rope_scale)},
         {"tie_word_embeddings", c.tied_head()},
         {"torch_dtype", dt}};
    if (qwen2 || qwen3) {
      // Every layer's window or none (max_window_layers: the first layer with one).
      j["use_sliding_window"] = c.sliding_window > 0;
      j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
      j["max_window_layers"] = c.sliding_window > 0 ? 0 : c.n_layers;
    }
    if (mistral) j["sliding_window"] = c.sliding_window;
    if (!qwen2) {
      j["attention_bias"] = c.attn_bias == attention_bias::qkv_o;
      j["mlp_bias"] = false;
    }
  }
  return j.dump(2) + "\n";
}

}  // namespace ag::models
