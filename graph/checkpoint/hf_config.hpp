#pragma once
/// \file hf_config.hpp
/// A Hugging Face `config.json` (GPT-2 and LLaMA architectures) read into a
/// transformer_config for graph/models/transformer.hpp.
///
/// Keys read (missing keys take the defaults of transformers' GPT2Config /
/// LlamaConfig, as transformers itself does):
/// - gpt2: vocab_size, n_positions (older files: n_ctx), n_embd, n_layer,
///   n_head, n_inner (null: 4 n_embd), activation_function (gelu_new,
///   gelu_pytorch_tanh, gelu_fast: tanh GELU; gelu: erf GELU),
///   layer_norm_epsilon, tie_word_embeddings (default true);
/// - llama, mistral (sliding_window: transformer_config::sliding_window;
///   absent: 4096, MistralConfig's default; null: none), qwen2 and qwen3
///   (a window on every layer or on none: use_sliding_window with
///   max_window_layers 0 or every layer_types entry "sliding_attention";
///   qwen3's q/k norms, transformer_config::qk_norm,
///   and head_dim 128 by default), each with its own config class's defaults:
///   vocab_size, hidden_size,
///   intermediate_size, num_hidden_layers, num_attention_heads,
///   num_key_value_heads (GQA; default = heads), head_dim (the heads'
///   width, even; absent or null: hidden_size / heads), hidden_act (silu), max_position_embeddings,
///   rms_norm_eps, rope_theta at the top level (transformers 4.x) or inside
///   rope_parameters (5.x), rope_scaling (4.x) / rope_parameters (5.x) with
///   rope_type (older files: type) "default", "llama3" (Llama 3.1 / 3.2:
///   factor, low_freq_factor, high_freq_factor,
///   original_max_position_embeddings, all required) or "linear" (factor),
///   attention_bias (llama, qwen3: true puts biases on q, k, v and o,
///   attention_bias::qkv_o; mistral: only false; qwen2 always has q, k and v
///   biases, attention_bias::qkv, and no key says so), mlp_bias (only false),
///   tie_word_embeddings (default false);
/// - both: model_type (else architectures[0]), torch_dtype (4.x) or dtype
///   (5.x), with or without a "torch." prefix; bos_token_id; eos_token_id
///   (a number or a list).
/// A config the builder cannot honour (another rope scaling, a bias, an activation it
/// lacks, an architecture it does not build, cross-attention...) is an error
/// (errc::invalid_argument) that names the file and the key, e.g.
/// "config.json: 'rope_scaling.rope_type': \"yarn\" is not implemented
/// (plain RoPE, \"llama3\" and \"linear\" are)". Keys of the wrong JSON type are errors naming the key too.
/// Unknown keys are ignored (configs carry many that do not change the math).
///
/// Pure functions: call from any thread.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/dtype.hpp"
#include "graph/error.hpp"
#include "graph/models/transformer.hpp"

namespace ag::models {

struct hf_config {
  /// Architecture and widths; seq_len and batch are left at 1 (a graph is
  /// built per prompt length), dtype at the checkpoint's (see `dtype`).
  transformer_config model;
  std::string model_type;           ///< "gpt2", "llama", "mistral", "qwen2", "qwen3"
  std::optional<ag::dtype> dtype;   ///< torch_dtype / dtype, when given
  /// Longest sequence the model was trained for (gpt2: n_positions, also the
  /// rows of wpe; llama: max_position_embeddings).
  int64_t max_positions = 0;
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;
  std::string origin;               ///< the file (or name) it was read from
};

/// Parses config.json text; `origin` names it in errors.
expected<hf_config> parse_hf_config(std::string_view text, const std::string& origin);
/// Reads `path`: a config.json file, or a folder holding one.
expected<hf_config> read_hf_config(const std::string& path);

/// The config.json transformers would write for `cfg` (model_type gpt2,
/// llama, qwen2 for attention_bias::qkv, qwen3 for qk_norm; its widths, heads, eps, rope_theta and scaling, tie_word_embeddings,
/// activation, dtype as torch_dtype): what the tests and save_hf_model write.
std::string to_hf_config_json(const transformer_config& cfg, int64_t max_positions);

}  // namespace ag::models
