#include "graph/checkpoint/safetensors.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace ag::models {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

error bad(const std::string& where, const std::string& what) { return error{errc::invalid_argument, where + ": " + what}; }
std::string quoted(const std::string& name) { return "tensor '" + name + "'"; }

struct dtype_info {
  const char* name;
  std::size_t size;
};
// The dtypes of the safetensors format (sub-byte F4/F6 types are not listed:
// their byte size is not an element count, and no model here uses them).
constexpr dtype_info known_dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1}, {"I16", 2},
    {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},     {"F64", 8},
    {"I64", 8},  {"U64", 8}, {"C64", 8},
};

std::optional<ag::dtype> graph_dtype(std::string_view name) {
  if (name == "F32") return ag::dtype::f32;
  if (name == "F16") return ag::dtype::f16;
  if (name == "BF16") return ag::dtype::bf16;
  if (name == "I32") return ag::dtype::i32;
  return std::nullopt;
}

std::string dims_string(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// Converts n elements between the float storage types (f32 / f16 / bf16).
// Both pointers may be unaligned (tensor offsets in a file need not be). One
// loop per pair, so that the common bf16 -> f32 case is a plain shift.
template <class Load, class Store>
void convert_loop(const std::byte* src, std::size_t in, std::byte* dst, std::size_t out, std::size_t n, Load load,
                  Store store) noexcept {
  for (std::size_t i = 0; i < n; ++i) store(dst + i * out, load(src + i * in));
}

void convert(const std::byte* src, ag::dtype from, std::byte* dst, ag::dtype to, std::size_t n) noexcept {
  auto load_f32 = [](const std::byte* p) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  };
  auto load_16 = [](const std::byte* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return h;
  };
  auto load_bf16 = [&](const std::byte* p) { return bf16_to_float(load_16(p)); };
  auto load_f16 = [&](const std::byte* p) { return half_to_float(load_16(p)); };
  auto store_f32 = [](std::byte* p, float f) { std::memcpy(p, &f, 4); };
  auto store_bf16 = [](std::byte* p, float f) {
    const uint16_t h = float_to_bf16(f);
    std::memcpy(p, &h, 2);
  };
  auto store_f16 = [](std::byte* p, float f) {
    const uint16_t h = float_to_half(f);
    std::memcpy(p, &h, 2);
  };
  const std::size_t in = dtype_size(from), out = dtype_size(to);
  if (to == ag::dtype::f32) {
    if (from == ag::dtype::bf16) convert_loop(src, in, dst, out, n, load_bf16, store_f32);
    else convert_loop(src, in, dst, out, n, load_f16, store_f32);
  } else if (to == ag::dtype::bf16) {
    if (from == ag::dtype::f32) convert_loop(src, in, dst, out, n, load_f32, store_bf16);
    else convert_loop(src, in, dst, out, n, load_f16, store_bf16);
  } else {
    if (from == ag::dtype::f32) convert_loop(src, in, dst, out, n, load_f32, store_f16);
    else convert_loop(src, in, dst, out, n, load_bf16, store_f16);
  }
}

// A tensor of a mapped file, read as `as_`.
class mapped_tensor final : public weight_source {
 public:
  mapped_tensor(std::shared_ptr<const mapped_file> file, const safetensors_entry& e, ag::shape dims, ag::dtype as,
                std::shared_ptr<read_counter> progress)
      : file_(std::move(file)),
        progress_(std::move(progress)),
        offset_(e.offset),
        from_(*e.type),
        as_(as),
        dims_(dims),
        origin_(file_->path() + ": '" + e.name + "'") {}

  ag::dtype type() const noexcept override { return as_; }
  const ag::shape& dims() const noexcept override { return dims_; }
  std::string origin() const override { return origin_; }

  error read_slice(int dim, int64_t begin, int64_t end, void* dst) const override {
    if (auto e = check_slice(dims_, dim, begin, end, origin_)) return e;
    const std::byte* src = file_->data() + offset_;
    const std::size_t in = dtype_size(from_);
    int64_t outer = 1, inner = 1;
    for (int k = 0; k < dim; ++k) outer *= dims_[k];
    for (int k = dim + 1; k < dims_.rank(); ++k) inner *= dims_[k];
    const auto row = static_cast<std::size_t>(inner);
    const auto run = static_cast<std::size_t>(end - begin) * row;  // elements
    // The slice spans [first run, last run] of the tensor's bytes: ask the
    // kernel to read that span ahead in large chunks.
    const std::size_t first = static_cast<std::size_t>(begin) * row * in;
    const std::size_t span = (static_cast<std::size_t>(outer - 1) * static_cast<std::size_t>(dims_[dim]) * row +
                              run) * in;
    if (run > 0 && outer > 0) file_->prefetch(offset_ + first, span);
    if (from_ == as_) {
      copy_slice(src, dims_, in, dim, begin, end, dst);
    } else {
      auto* out = static_cast<std::byte*>(dst);
      const std::size_t out_size = dtype_size(as_);
      for (int64_t o = 0; o < outer; ++o) {
        const std::size_t at = (static_cast<std::size_t>(o * dims_[dim] + begin)) * row;
        convert(src + at * in, from_, out, as_, run);
        out += run * out_size;
      }
    }
    if (progress_)
      progress_->bytes.fetch_add(static_cast<int64_t>(run * static_cast<std::size_t>(outer) * in),
                                 std::memory_order_relaxed);
    return {};
  }

 private:
  std::shared_ptr<const mapped_file> file_;
  std::shared_ptr<read_counter> progress_;
  uint64_t offset_;
  ag::dtype from_, as_;
  ag::shape dims_;
  std::string origin_;
};

// Reads a non-negative JSON integer; false if it is anything else.
bool as_u64(const json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

error parse_entry(const std::string& where, const std::string& name, const json& v, uint64_t data_start,
                  uint64_t data_size, safetensors_entry& e) {
  const std::string at = where + ": " + quoted(name);
  if (name.empty()) return bad(where, "a tensor has an empty name");
  if (!v.is_object()) return bad(at, "entry is not an object");
  auto dt = v.find("dtype");
  auto sh = v.find("shape");
  auto off = v.find("data_offsets");
  if (dt == v.end() || !dt->is_string()) return bad(at, "no \"dtype\" string");
  if (sh == v.end() || !sh->is_array()) return bad(at, "no \"shape\" array");
  if (off == v.end() || !off->is_array() || off->size() != 2) return bad(at, "no \"data_offsets\" [begin, end] pair");
  e.name = name;
  e.dtype_name = dt->get<std::string>();
  const std::size_t esize = safetensors_dtype_size(e.dtype_name);
  if (esize == 0) return bad(at, "unknown dtype \"" + e.dtype_name + "\"");
  e.type = graph_dtype(e.dtype_name);
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& d : *sh) {
    uint64_t n = 0;
    if (!as_u64(d, n) || n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return bad(at, "shape " + sh->dump() + " has an entry that is not a non-negative integer");
    e.dims.push_back(static_cast<int64_t>(n));
    if (__builtin_mul_overflow(numel, n, &numel)) overflow = true;
  }
  if (std::find(e.dims.begin(), e.dims.end(), 0) != e.dims.end()) {
    numel = 0;
    overflow = false;
  }
  uint64_t b = 0, en = 0;
  if (!as_u64((*off)[0], b) || !as_u64((*off)[1], en))
    return bad(at, "data_offsets " + off->dump() + " are not non-negative integers");
  if (en < b) return bad(at, "data_offsets " + off->dump() + " end before they begin");
  uint64_t bytes = 0;
  if (overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(esize), &bytes))
    return bad(at, "shape " + dims_string(e.dims) + " overflows 64-bit byte counts");
  if (en - b != bytes)
    return bad(at, "data_offsets " + off->dump() + " hold " + std::to_string(en - b) + " bytes, shape " +
                       dims_string(e.dims) + " of " + e.dtype_name + " needs " + std::to_string(bytes));
  if (en > data_size)
    return bad(at, "data_offsets " + off->dump() + " run past the end of the data (" + std::to_string(data_size) +
                       " bytes after the header; file truncated?)");
  e.offset = data_start + b;
  e.bytes = bytes;
  return {};
}

}  // namespace

std::size_t safetensors_dtype_size(std::string_view name) noexcept {
  for (const auto& d : known_dtypes)
    if (name == d.name) return d.size;
  return 0;
}

const char* safetensors_dtype_name(ag::dtype t) noexcept {
  switch (t) {
    case ag::dtype::f32: return "F32";
    case ag::dtype::f16: return "F16";
    case ag::dtype::bf16: return "BF16";
    case ag::dtype::i32: return "I32";
  }
  return "?";
}

// ---- safetensors_file ----------------------------------------------------------

expected<std::shared_ptr<const safetensors_file>> safetensors_file::open(const std::string& path,
                                                                        std::shared_ptr<read_counter> progress) {
  auto f = mapped_file::open(path);
  if (!f) return f.err();
  return parse(std::move(*f), std::move(progress));
}

expected<std::shared_ptr<const safetensors_file>> safetensors_file::parse(std::shared_ptr<const mapped_file> bytes,
                                                                         std::shared_ptr<read_counter> progress) {
  const std::string& where = bytes->path();
  const uint64_t size = bytes->size();
  if (size < 8)
    return bad(where, "file of " + std::to_string(size) + " bytes is shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes->data()[i]);
  if (n > safetensors_max_header_bytes)
    return bad(where, "header length " + std::to_string(n) + " exceeds the limit of " +
                          std::to_string(safetensors_max_header_bytes) + " bytes");
  if (n > size - 8)
    return bad(where, "header length " + std::to_string(n) + " runs past the end of the file (" +
                          std::to_string(size) + " bytes; truncated?)");
  if (n < 2) return bad(where, "header length " + std::to_string(n) + " is too short for a JSON object");
  const char* text = reinterpret_cast<const char*>(bytes->data() + 8);
  std::shared_ptr<safetensors_file> out(new safetensors_file());
  out->progress_ = std::move(progress);
  try {
    json header = json::parse(text, text + n);  // trailing spaces (padding) are whitespace
    if (!header.is_object()) return bad(where, "header is not a JSON object");
    const uint64_t data_start = 8 + n, data_size = size - 8 - n;
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        if (!it->is_object()) return bad(where, "\"__metadata__\" is not an object");
        for (auto m = it->begin(); m != it->end(); ++m) {
          if (!m->is_string()) return bad(where, "\"__metadata__\" entry '" + m.key() + "' is not a string");
          out->metadata_[m.key()] = m->get<std::string>();
        }
        continue;
      }
      safetensors_entry e;
      if (auto err = parse_entry(where, it.key(), *it, data_start, data_size, e)) return err;
      out->tensors_.push_back(std::move(e));
    }
  } catch (const std::exception& ex) {
    return bad(where, std::string("header is not valid JSON: ") + ex.what());
  }
  std::sort(out->tensors_.begin(), out->tensors_.end(),
            [](const safetensors_entry& a, const safetensors_entry& b) {
              return a.offset != b.offset ? a.offset < b.offset : a.bytes < b.bytes;
            });
  const safetensors_entry* prev = nullptr;
  for (std::size_t i = 0; i < out->tensors_.size(); ++i) {
    const auto& e = out->tensors_[i];
    out->by_name_[e.name] = i;
    out->data_bytes_ += static_cast<int64_t>(e.bytes);
    if (e.bytes == 0) continue;
    if (prev && prev->offset + prev->bytes > e.offset)
      return bad(where, quoted(e.name) + " overlaps " + quoted(prev->name) + " (bytes " +
                            std::to_string(e.offset) + ".." + std::to_string(prev->offset + prev->bytes) + ")");
    prev = &e;
  }
  out->file_ = std::move(bytes);
  return std::shared_ptr<const safetensors_file>(std::move(out));
}

const safetensors_entry* safetensors_file::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

expected<weight_source_ptr> safetensors_file::weight(const std::string& name, ag::dtype as) const {
  const safetensors_entry* e = find(name);
  const std::string at = path() + ": " + quoted(name);
  if (!e) return error{errc::invalid_argument, at + " is not in the file"};
  if (!e->type)
    return error{errc::dtype_mismatch, at + " has dtype " + e->dtype_name + ", which a graph cannot hold (F32, F16, BF16, I32)"};
  if ((*e->type == ag::dtype::i32) != (as == ag::dtype::i32))
    return error{errc::dtype_mismatch, at + " of " + e->dtype_name + " cannot be read as " + ag::to_string(as)};
  if (e->dims.empty() || e->dims.size() > static_cast<std::size_t>(max_rank))
    return error{errc::invalid_shape, at + " has rank " + std::to_string(e->dims.size()) + ", a graph holds ranks 1 to " +
                                          std::to_string(max_rank)};
  ag::shape dims = ag::shape::from_range(e->dims.begin(), e->dims.end());
  return weight_source_ptr(std::make_shared<mapped_tensor>(file_, *e, dims, as, progress_));
}

// ---- checkpoint ------------------------------------------------------------------

namespace {

expected<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error{errc::invalid_argument, path + ": cannot open: " + std::strerror(errno)};
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return error{errc::invalid_argument, path + ": read error"};
  return s.str();
}

bool plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\\') == std::string::npos && s.find('\0') == std::string::npos;
}

}  // namespace

expected<checkpoint> checkpoint::open(const std::string& path) {
  checkpoint c;
  c.origin_ = path;
  std::error_code ec;
  std::string single, index;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    if (fs::exists(dir / "model.safetensors.index.json", ec)) {
      index = (dir / "model.safetensors.index.json").string();
    } else if (fs::exists(dir / "model.safetensors", ec)) {
      single = (dir / "model.safetensors").string();
    } else {
      std::string why = path + ": no model.safetensors or model.safetensors.index.json";
      if (fs::exists(dir / "pytorch_model.bin", ec))
        why += " (pytorch_model.bin is not read: save the model with safetensors)";
      return error{errc::invalid_argument, why};
    }
  } else if (path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    index = path;
  } else {
    single = path;
  }
  if (!single.empty()) {
    auto f = safetensors_file::open(single, c.progress_);
    if (!f) return f.err();
    c.files_.push_back(*f);
    for (const auto& e : (*f)->tensors()) c.file_of_[e.name] = 0;
    return c;
  }
  auto text = read_text(index);
  if (!text) return text.err();
  std::map<std::string, std::string> weight_map;  // tensor -> shard
  try {
    json j = json::parse(*text);
    if (!j.is_object()) return bad(index, "not a JSON object");
    auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) return bad(index, "no \"weight_map\" object");
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string()) return bad(index, "weight_map: " + quoted(it.key()) + " is not mapped to a file name");
      const std::string shard = it->get<std::string>();
      if (!plain_file_name(shard))
        return bad(index, "weight_map: " + quoted(it.key()) + " names shard \"" + shard +
                              "\", which is not a plain file name in the index's folder");
      weight_map[it.key()] = shard;
    }
  } catch (const std::exception& ex) {
    return bad(index, std::string("not valid JSON: ") + ex.what());
  }
  if (weight_map.empty()) return bad(index, "weight_map is empty");
  std::set<std::string> shards;
  for (const auto& [t, s] : weight_map) shards.insert(s);
  const fs::path dir = fs::path(index).parent_path();
  std::map<std::string, std::size_t> shard_index;
  for (const auto& s : shards) {
    auto f = safetensors_file::open((dir / s).string(), c.progress_);
    if (!f) return error{f.err().code, index + ": shard: " + f.err().message};
    shard_index[s] = c.files_.size();
    c.files_.push_back(*f);
  }
  for (const auto& [t, s] : weight_map) {
    const std::size_t k = shard_index[s];
    if (!c.files_[k]->find(t))
      return bad(index, "weight_map puts " + quoted(t) + " in " + s + ", which has no such tensor");
    c.file_of_[t] = k;
  }
  // Tensors a shard holds that the map does not name still count (the map decides duplicates).
  for (std::size_t k = 0; k < c.files_.size(); ++k)
    for (const auto& e : c.files_[k]->tensors()) c.file_of_.emplace(e.name, k);
  return c;
}

std::vector<std::string> checkpoint::names() const {
  std::vector<std::string> n;
  n.reserve(file_of_.size());
  for (const auto& [name, k] : file_of_) n.push_back(name);
  return n;
}

std::pair<const safetensors_file*, const safetensors_entry*> checkpoint::find(const std::string& name) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) return {nullptr, nullptr};
  const safetensors_file* f = files_[it->second].get();
  return {f, f->find(name)};
}

expected<weight_source_ptr> checkpoint::weight(const std::string& name, ag::dtype as) const {
  auto [f, e] = find(name);
  if (!f) return error{errc::invalid_argument, origin_ + ": " + quoted(name) + " is missing"};
  return f->weight(name, as);
}

int64_t checkpoint::data_bytes() const noexcept {
  int64_t n = 0;
  for (const auto& [name, k] : file_of_) n += static_cast<int64_t>(files_[k]->find(name)->bytes);
  return n;
}

// ---- writer ------------------------------------------------------------------------

namespace {

error write_file(const std::string& path, const std::vector<named_weight>& tensors,
                 const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty()) return error{errc::invalid_argument, path + ": a tensor has an empty name"};
    if (t.name == "__metadata__") return error{errc::invalid_argument, path + ": \"__metadata__\" is not a tensor name"};
    if (!seen.insert(t.name).second) return error{errc::invalid_argument, path + ": " + quoted(t.name) + " given twice"};
    if (!t.source || !t.source->has_values())
      return error{errc::invalid_argument, path + ": " + quoted(t.name) + " has no values (" +
                                               (t.source ? t.source->origin() : std::string("no source")) + ")"};
    std::vector<int64_t> dims(t.source->dims().dims().begin(), t.source->dims().dims().begin() + t.source->dims().rank());
    const auto bytes = static_cast<uint64_t>(t.source->bytes());
    header[t.name] = {{"dtype", safetensors_dtype_name(t.source->type())},
                      {"shape", dims},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return error{errc::invalid_argument, tmp + ": cannot create: " + std::strerror(errno)};
    unsigned char len[8];
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i, n >>= 8) len[i] = static_cast<unsigned char>(n & 0xff);
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& t : tensors) {
      auto values = read_all(*t.source);
      if (!values) {
        out.close();
        std::remove(tmp.c_str());
        return error{values.err().code, path + ": " + quoted(t.name) + ": " + values.err().message};
      }
      out.write(reinterpret_cast<const char*>(values->data()), static_cast<std::streamsize>(values->bytes()));
    }
    out.flush();
    if (!out) {
      out.close();
      std::remove(tmp.c_str());
      return error{errc::invalid_argument, tmp + ": write failed"};
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return error{errc::invalid_argument, path + ": cannot rename " + tmp + ": " + ec.message()};
  return {};
}

}  // namespace

error save_safetensors(const std::string& path, const std::vector<named_weight>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  try {
    return write_file(path, tensors, metadata);
  } catch (const std::exception& ex) {  // allocation failure, JSON of invalid UTF-8 names
    return error{errc::invalid_argument, path + ": " + ex.what()};
  }
}

error save_safetensors(const std::string& path, const graph& g, const std::map<std::string, std::string>& metadata) {
  std::vector<named_weight> tensors;
  for (const node& n : g.nodes())
    if (n.op == op_kind::weight) tensors.push_back({n.name, n.data});
  return save_safetensors(path, tensors, metadata);
}

expected<int> save_safetensors_sharded(const std::string& dir, const std::vector<named_weight>& tensors,
                                       int64_t max_shard_bytes) {
  if (max_shard_bytes < 1) return error{errc::invalid_argument, dir + ": max_shard_bytes must be >= 1"};
  std::vector<std::vector<named_weight>> shards;
  int64_t in_shard = 0;
  for (const auto& t : tensors) {
    const int64_t b = t.source ? t.source->bytes() : 0;
    if (shards.empty() || (in_shard > 0 && in_shard + b > max_shard_bytes)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += b;
  }
  if (shards.empty()) return error{errc::invalid_argument, dir + ": no tensors to write"};
  const int n = static_cast<int>(shards.size());
  nlohmann::ordered_json index;
  int64_t total = 0;
  for (const auto& t : tensors) total += t.source ? t.source->bytes() : 0;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = nlohmann::ordered_json::object();
  for (int k = 0; k < n; ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, n);
    if (auto e = save_safetensors((fs::path(dir) / name).string(), shards[static_cast<std::size_t>(k)])) return e;
    for (const auto& t : shards[static_cast<std::size_t>(k)]) index["weight_map"][t.name] = name;
  }
  const std::string path = (fs::path(dir) / "model.safetensors.index.json").string();
  std::ofstream out(path, std::ios::trunc);
  out << index.dump(2) << "\n";
  if (!out) return error{errc::invalid_argument, path + ": write failed"};
  return n;
}

}  // namespace ag::models
