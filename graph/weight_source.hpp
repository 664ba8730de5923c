#pragma once
/// \file weight_source.hpp
/// Where a weight node's values come from. A graph holds the *description*
/// of each weight (dtype, dims) and a source that can produce its values on
/// demand, whole or as a slice along one dimension:
///  - in memory (a host_tensor the graph owns: builder.weight(name, tensor));
///  - a tensor in a memory-mapped checkpoint file (read straight from the
///    mapping into a device's staging buffer, so the host never holds a second
///    copy of the model);
///  - shapes only: planning, describe() and cost estimates work, loading onto
///    a device or evaluating fails with an error naming the weight. Large
///    layouts (an 80-layer model over 64 devices) are planned this way.
/// A tensor-parallel plan uploads to each device only its shard of a weight:
/// read_slice() along the sharded dimension is what the loader calls.
///
/// Thread-safety: a source is immutable once made and read_slice() may run on
/// several threads at once (uploads to several devices in parallel).

#include <cstdint>
#include <memory>
#include <string>

#include "graph/dtype.hpp"
#include "graph/error.hpp"
#include "graph/host_tensor.hpp"
#include "graph/shape.hpp"

namespace ag {

class weight_source {
 public:
  virtual ~weight_source() = default;

  /// dtype and dims of the values (the weight node takes them).
  virtual dtype type() const noexcept = 0;
  virtual const shape& dims() const noexcept = 0;
  /// False for a shapes-only source: read_slice() then always fails.
  virtual bool has_values() const noexcept { return true; }
  /// Copies the elements whose index along `dim` lies in [begin, end), with
  /// every index of the other dims, into `dst`, row-major contiguous, as
  /// type(): numel() / dims()[dim] * (end - begin) elements. Errors:
  /// invalid_argument for a dim or range outside dims() (naming origin()), an
  /// I/O or decode error of the backing store, or missing values.
  virtual error read_slice(int dim, int64_t begin, int64_t end, void* dst) const = 0;
  /// Where the values come from, for errors and describe():
  /// "in memory", "model.safetensors: 'h.0.attn.c_attn.weight'", "shapes only".
  virtual std::string origin() const = 0;
  /// The values as one contiguous host tensor when the source holds them in
  /// memory (fast path of uploads and of the reference evaluator); null else.
  virtual const host_tensor* in_memory() const noexcept { return nullptr; }

  /// Bytes of all values (dims().numel() * dtype size).
  int64_t bytes() const noexcept { return dims().numel() * static_cast<int64_t>(dtype_size(type())); }
  /// Bytes of a slice of `rows` indices along `dim`.
  int64_t slice_bytes(int dim, int64_t rows) const noexcept;
};

using weight_source_ptr = std::shared_ptr<const weight_source>;

/// A source over a tensor held in memory; `origin` names it in errors and
/// describe() (a copy read out of a checkpoint keeps the tensor's name).
weight_source_ptr make_host_weight(host_tensor values, std::string origin = "in memory");
/// A source with a shape and no values (planning only).
weight_source_ptr make_shape_only_weight(dtype type, shape dims);

/// Whether `a` and `b` give the same values, decided without reading a file:
/// the same source; in-memory tensors with equal bytes; slices of sources
/// that give the same values, over the same range; or two file-backed
/// sources of the same origin (file and tensor name), dtype and dims. False
/// for shapes-only sources. Two plans whose weights are the same values may
/// share one upload (plan_options::share_weights_with).
bool same_values(const weight_source& a, const weight_source& b);

/// The slice [begin, end) along `dim` of `base`, as a source of its own (a
/// tensor-parallel shard): its dims are base's with dims[dim] = end - begin,
/// and reading it reads only that slice of `base` (read_slice along `dim`
/// goes straight to base.read_slice), so a device uploading its shard never
/// touches the rest of the weight. Slices of slices along the same dim
/// collapse into one. Errors: invalid_argument for a dim or range outside
/// base's dims (naming base's origin).
expected<weight_source_ptr> make_slice_weight(weight_source_ptr base, int dim, int64_t begin, int64_t end);

/// `base` with every element multiplied by `scale[k]`, k its index along
/// `dim` (W'[.., k, ..] = W[.., k, ..] * scale[k], computed in float and
/// rounded to base's dtype once): the planner folds an rms_norm's weight into
/// the weights of the projections that read the norm (fold_norm_weights,
/// graph/fusion.hpp), so the GEMVs read x alone. Reading a slice reads only
/// that slice of `base` (and of `scale` when the slice is along `dim`): a
/// tensor-parallel shard of a scaled weight stays a shard read. Errors:
/// invalid_argument when base or scale is not a float type, scale is not a
/// vector of base.dims()[dim] elements, or dim is outside base; read_slice
/// fails (naming both origins) where a product of finite values overflows
/// base's dtype (an f16 weight times a large norm weight).
expected<weight_source_ptr> make_scaled_weight(weight_source_ptr base, weight_source_ptr scale, int dim);

/// Reads all values into a host tensor (the reference evaluator, tests).
expected<host_tensor> read_all(const weight_source& w);

/// Checks (dim, begin, end) against `dims`: invalid_argument naming `origin`.
error check_slice(const shape& dims, int dim, int64_t begin, int64_t end, const std::string& origin);

/// Copies a slice along `dim` out of a contiguous row-major buffer `src`
/// holding a tensor of `dims` with elements of `elem_bytes` bytes. The shared
/// core of every source that can address its values in memory (a host tensor,
/// a mapped file).
void copy_slice(const std::byte* src, const shape& dims, std::size_t elem_bytes, int dim, int64_t begin,
                int64_t end, void* dst) noexcept;

}  // namespace ag
