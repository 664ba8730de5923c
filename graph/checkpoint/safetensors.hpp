#pragma once
/// \file safetensors.hpp
/// The safetensors checkpoint format (Hugging Face): read through a read-only
/// memory mapping, written from any weight sources.
///
/// File layout: an 8-byte little-endian header length N, N bytes of JSON
/// (`{"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}, ...,
/// "__metadata__": {"k": "v"}}`), then the data; offsets count from the first
/// data byte. Opening a file validates every entry before any tensor is
/// used: a known dtype, a shape of non-negative dims, offsets inside the file,
/// a byte size equal to shape x dtype size, no two tensors overlapping, and a
/// sane header length (at most 100 MB, as the reference implementation
/// allows). A bad file is an error (errc::invalid_argument) that names the
/// file and, where it applies, the tensor; nothing throws.
///
/// Tensors become weight sources (graph/weight_source.hpp) whose read_slice()
/// copies straight out of the mapping, converting f32 / f16 / bf16 into the
/// dtype the graph asks for. A sharded checkpoint is a folder with
/// `model.safetensors.index.json` naming the shard of each tensor.
///
/// Thread-safety: files and checkpoints are immutable once opened; their
/// weight sources may be read from several threads at once (the progress
/// counter is atomic).

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/dtype.hpp"
#include "graph/error.hpp"
#include "graph/graph.hpp"
#include "graph/weight_source.hpp"
#include "graph/checkpoint/mapped_file.hpp"

namespace ag::models {

/// Largest header a file may declare (the reference implementation's limit).
constexpr uint64_t safetensors_max_header_bytes = 100'000'000;

/// Bytes read out of a checkpoint's mappings by its weight sources so far:
/// the progress of a load. Shared by a checkpoint and the sources it made.
struct read_counter {
  std::atomic<int64_t> bytes{0};
};

/// One tensor of a safetensors file, as its header describes it (validated).
struct safetensors_entry {
  std::string name;
  std::string dtype_name;          ///< as written: "F32", "BF16", "I64", ...
  std::optional<ag::dtype> type;   ///< F32 / F16 / BF16 / I32: the dtypes a graph can hold
  std::vector<int64_t> dims;       ///< any rank, as written
  uint64_t offset = 0;             ///< absolute byte offset of the first element in the file
  uint64_t bytes = 0;              ///< data bytes (= numel x element size)
};

/// Element size of a safetensors dtype name ("F32" -> 4, "BOOL" -> 1), 0 if unknown.
std::size_t safetensors_dtype_size(std::string_view name) noexcept;
/// "F32" / "F16" / "BF16" / "I32".
const char* safetensors_dtype_name(ag::dtype t) noexcept;

/// One validated safetensors file.
class safetensors_file {
 public:
  /// Maps and validates `path` (see the file comment for what is checked).
  static expected<std::shared_ptr<const safetensors_file>> open(const std::string& path,
                                                               std::shared_ptr<read_counter> progress = {});
  /// Validates a file's bytes already in memory (a mapping or a buffer): the
  /// parser behind open(), and the fuzz target's entry point.
  static expected<std::shared_ptr<const safetensors_file>> parse(std::shared_ptr<const mapped_file> bytes,
                                                                std::shared_ptr<read_counter> progress = {});

  const std::string& path() const noexcept { return file_->path(); }
  /// Entries in file (data offset) order.
  const std::vector<safetensors_entry>& tensors() const noexcept { return tensors_; }
  /// The entry called `name`, or null.
  const safetensors_entry* find(const std::string& name) const;
  /// The header's "__metadata__" (string -> string), empty if none.
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  /// Sum of all tensors' data bytes.
  int64_t data_bytes() const noexcept { return data_bytes_; }

  /// A weight source over tensor `name` whose values come as `as`: the file's
  /// own dtype, or a conversion among f32 / f16 / bf16 (rounding to nearest
  /// even). Errors naming the file and the tensor: no such tensor, a dtype the
  /// graph cannot hold (F64, I64, ...) or cannot convert (int <-> float), a
  /// rank outside 1..4. read_slice() never fails for a valid range: the
  /// entry was validated against the mapping at open.
  expected<weight_source_ptr> weight(const std::string& name, ag::dtype as) const;

 private:
  safetensors_file() = default;
  std::shared_ptr<const mapped_file> file_;
  std::shared_ptr<read_counter> progress_;
  std::vector<safetensors_entry> tensors_;
  std::map<std::string, std::size_t> by_name_;
  std::map<std::string, std::string> metadata_;
  int64_t data_bytes_ = 0;
};

/// A model's tensors: one safetensors file, or the shards of a sharded
/// checkpoint, behind one name lookup.
class checkpoint {
 public:
  /// Opens a checkpoint: `path` is a folder holding `model.safetensors` or
  /// `model.safetensors.index.json` (+ its shards), or a `.safetensors` file
  /// or an index file itself. Every file is mapped and validated now. Index
  /// errors name the index and the tensor: bad JSON, a `weight_map` that is not
  /// an object of file names, a shard name with a path separator or "..", a
  /// shard that fails to open, a tensor the map puts in a shard that lacks it.
  static expected<checkpoint> open(const std::string& path);

  /// Files in the order opened (one, or the shards in name order).
  const std::vector<std::shared_ptr<const safetensors_file>>& files() const noexcept { return files_; }
  /// Tensor names, sorted.
  std::vector<std::string> names() const;
  /// The file holding `name` (with the entry), or {null, null}.
  std::pair<const safetensors_file*, const safetensors_entry*> find(const std::string& name) const;
  /// As safetensors_file::weight, for whichever file holds the tensor; a
  /// missing tensor names the checkpoint (folder or index).
  expected<weight_source_ptr> weight(const std::string& name, ag::dtype as) const;
  /// Sum of the data bytes of every tensor.
  int64_t data_bytes() const noexcept;
  /// Bytes the sources made by weight() have copied out so far (all threads).
  int64_t bytes_read() const noexcept { return progress_->bytes.load(std::memory_order_relaxed); }
  /// The folder, file or index given to open().
  const std::string& origin() const noexcept { return origin_; }

 private:
  std::string origin_;
  std::shared_ptr<read_counter> progress_ = std::make_shared<read_counter>();
  std::vector<std::shared_ptr<const safetensors_file>> files_;
  std::map<std::string, std::size_t> file_of_;  // tensor name -> index into files_
};

/// A tensor to write: a name and where its values come from.
struct named_weight {
  std::string name;
  weight_source_ptr source;
};

/// Writes `tensors` to `path` as one safetensors file (header entries and
/// data in the given order, header padded with spaces to a multiple of 8 as
/// the reference writer does). Each tensor is read through its source one
/// at a time, so mapped sources are written without holding the model in
/// memory. The file appears atomically (written as `path.tmp`, renamed).
/// Errors: an empty or duplicate name, "__metadata__" as a tensor name, a
/// source without values, an I/O failure (naming the path).
error save_safetensors(const std::string& path, const std::vector<named_weight>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
/// Writes every weight of `g` under its node name.
error save_safetensors(const std::string& path, const graph& g,
                       const std::map<std::string, std::string>& metadata = {});
/// Writes `tensors` into folder `dir` as shards `model-0000k-of-0000n.safetensors`
/// of at most `max_shard_bytes` of data each (a larger tensor gets a shard of
/// its own) and `model.safetensors.index.json` mapping each tensor to its shard,
/// as Hugging Face's save_pretrained does. Returns the number of shards.
expected<int> save_safetensors_sharded(const std::string& dir, const std::vector<named_weight>& tensors,
                                       int64_t max_shard_bytes);

}  // namespace ag::models
