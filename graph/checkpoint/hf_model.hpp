#pragma once
/// \file hf_model.hpp
/// A Hugging Face model folder (config.json + safetensors checkpoint) as
/// actorgraph graphs whose weights are the checkpoint's memory-mapped tensors:
///
///     auto m = ag::models::hf_model::open("gpt2-folder");          // validates everything
///     ag::expected<ag::graph> g = m->build(/*seq_len=*/12);          // tokens [1, 12] -> logits
///     auto p = rt->compile(std::move(*g), {.pipeline_stages = 2});   // uploads from the mapping
///
/// Tensor names are Hugging Face's: GPT-2 `h.0.attn.c_attn.weight` ... with or
/// without the `transformer.` prefix (GPT-2's Conv1D weights are [in, out],
/// which is how the builder multiplies them: no transpose); LLaMA
/// `model.layers.0.self_attn.q_proj.weight` ... (nn.Linear [out, in], read
/// with trans_b). A tied head reads the embedding (an `lm_head.weight` saved
/// beside it is ignored); a separate head needs `lm_head.weight`.
///
/// open() checks the whole checkpoint against the config before anything is
/// built: every tensor present, of the shape the config implies and a float
/// dtype, and no tensor left over that the model would silently ignore (a
/// bias or layer the builder does not have), apart from buffers transformers
/// itself ignores (GPT-2's `attn.bias` / `attn.masked_bias` causal masks,
/// LLaMA's `rotary_emb.inv_freq`). Errors name the file and the tensor.
///
/// The host never holds a second copy of the model: graphs reference the
/// mapped tensors, and a device upload reads each one straight from the
/// mapping (converting dtype on the way when the graph stores another one).
///
/// Thread-safety: an hf_model is immutable after open(); build() may run on
/// several threads at once, and graphs built from it outlive it (they hold
/// the mappings).

#include <cstdint>
#include <optional>
#include <string>

#include "graph/error.hpp"
#include "graph/graph.hpp"
#include "graph/models/transformer.hpp"
#include "graph/checkpoint/hf_config.hpp"
#include "graph/checkpoint/safetensors.hpp"

namespace ag::models {

struct load_options {
  /// Storage dtype of the graph (weights and activations). Default: the
  /// config's torch_dtype / dtype, else the checkpoint's first float tensor's.
  std::optional<ag::dtype> dtype;
};

class hf_model {
 public:
  /// Reads `dir`/config.json, opens the checkpoint in `dir` (single or
  /// sharded) and checks it against the config (see the file comment).
  /// Errors name the folder, file and tensor (a missing folder or config.json
  /// too).
  static expected<hf_model> open(const std::string& dir, load_options options = {});

  const hf_config& config() const noexcept { return config_; }
  const checkpoint& weights() const noexcept { return checkpoint_; }
  /// The dtype graphs store (load_options::dtype resolved).
  ag::dtype dtype() const noexcept { return dtype_; }
  /// Bytes of the checkpoint tensors the model reads (what an upload of the
  /// whole model copies out of the mappings).
  int64_t model_bytes() const noexcept { return model_bytes_; }

  /// The transformer_config of a forward pass over `seq_len` tokens x `batch`.
  transformer_config model_config(int64_t seq_len, int64_t batch = 1) const;
  /// A graph over `seq_len` tokens x `batch` whose weights are the mapped
  /// tensors (see graph/models/transformer.hpp for its inputs and output).
  /// Errors: seq_len or batch < 1, a gpt2 seq_len beyond n_positions.
  expected<graph> build(int64_t seq_len, int64_t batch = 1) const;
  /// Hugging Face name of the builder's weight `name` in this checkpoint
  /// ("l1.attn.w_qkv" -> "transformer.h.0.attn.c_attn.weight"), empty if the
  /// builder has no such weight.
  std::string hf_name(const std::string& name) const;
  /// The builder's weights as mapped checkpoint tensors, for graphs of other
  /// forms than build() makes (ag::generator's step graphs). The provider
  /// refers to this model: keep the model alive while it is used.
  weight_provider provider() const;

 private:
  hf_config config_;
  checkpoint checkpoint_;
  ag::dtype dtype_ = ag::dtype::f32;
  std::string prefix_;  // "transformer." / "model." / ""
  int64_t model_bytes_ = 0;
};

/// hf_model::open(dir, options), then build(seq_len, batch).
expected<graph> load_model(const std::string& dir, int64_t seq_len, int64_t batch = 1, load_options options = {});

/// Hugging Face name of builder weight `name` for a model of `variant`,
/// under `prefix` (gpt2: "transformer." or ""; llama: "model." or ""); empty
/// if `name` is not a builder weight name. `lm_head` never takes the prefix.
std::string hf_tensor_name(model_variant variant, const std::string& name, const std::string& prefix);

struct save_options {
  /// 0: one model.safetensors; else shards of at most this many data bytes
  /// and model.safetensors.index.json.
  int64_t max_shard_bytes = 0;
  /// gpt2: write names with the "transformer." prefix (as save_pretrained of
  /// GPT2LMHeadModel does) or without (as the original openai-community/gpt2 file).
  bool gpt2_prefix = true;
};
/// Saves a model built by build_transformer(cfg) as a Hugging Face folder:
/// `dir`/config.json (to_hf_config_json(cfg)) and its weights under HF names.
/// `dir` must exist. Errors: a weight of `g` the name map does not know, and
/// the writer's errors.
error save_hf_model(const std::string& dir, const transformer_config& cfg, const graph& g, save_options options = {});

}  // namespace ag::models
