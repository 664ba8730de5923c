// safetensors: the writer's files read back through the memory-mapped reader
// (every dtype, conversions, slices, shards), and every kind of bad file
// refused with an error that names the file and the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "checkpoint_test_util.hpp"
#include "graph/checkpoint/safetensors.hpp"

using namespace ag;
using namespace ag::models;
using ag::test::temp_dir;
using ag::test::write_raw_safetensors;

namespace {

// Every value of a source, as floats, read through read_all.
std::vector<float> values_of(const weight_source& w) {
  auto t = read_all(w);
  EXPECT_TRUE(t.has_value()) << t.err().to_string();
  return t ? t->to_floats() : std::vector<float>{};
}

error open_error(const std::string& path) {
  auto f = safetensors_file::open(path);
  EXPECT_FALSE(f.has_value()) << path << " opened";
  return f ? error{} : f.err();
}

void expect_names(const error& e, const std::string& path, const std::string& what) {
  EXPECT_EQ(e.code, errc::invalid_argument) << e.to_string();
  EXPECT_NE(e.message.find(path), std::string::npos) << "does not name the file: " << e.message;
  EXPECT_NE(e.message.find(what), std::string::npos) << "does not say '" << what << "': " << e.message;
}

}  // namespace

TEST(Safetensors, WrittenTensorsReadBackExactlyInEveryDtype) {
  temp_dir dir;
  const std::string path = dir / "t.safetensors";
  std::vector<host_tensor> ts = {host_tensor::random_normal(dtype::f32, {3, 5}, 1),
                                 host_tensor::random_normal(dtype::f16, {2, 3, 4}, 2),
                                 host_tensor::random_normal(dtype::bf16, {7}, 3),
                                 host_tensor::random_ints({2, 2, 2, 3}, 4, 1000)};
  std::vector<named_weight> named;
  for (std::size_t i = 0; i < ts.size(); ++i) named.push_back({"t" + std::to_string(i), make_host_weight(ts[i])});
  ASSERT_FALSE(save_safetensors(path, named, {{"format", "pt"}}));
  auto f = safetensors_file::open(path);
  ASSERT_TRUE(f.has_value()) << f.err().to_string();
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  ASSERT_EQ((*f)->tensors().size(), ts.size());
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const std::string name = "t" + std::to_string(i);
    const safetensors_entry* e = (*f)->find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->dtype_name, safetensors_dtype_name(ts[i].type()));
    EXPECT_EQ(e->bytes, ts[i].bytes());
    auto w = (*f)->weight(name, ts[i].type());
    ASSERT_TRUE(w.has_value()) << w.err().to_string();
    EXPECT_EQ((*w)->dims(), ts[i].dims());
    EXPECT_EQ((*w)->in_memory(), nullptr) << "a mapped tensor must not hold a copy";
    EXPECT_NE((*w)->origin().find(path + ": '" + name + "'"), std::string::npos) << (*w)->origin();
    auto back = read_all(**w);
    ASSERT_TRUE(back.has_value());
    EXPECT_TRUE(*back == ts[i]) << name;
  }
  // Header length is a multiple of 8 (the reference writer pads with spaces).
  std::ifstream in(path, std::ios::binary);
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  EXPECT_EQ(len[0] % 8, 0);
}

TEST(Safetensors, ConversionsRoundToTheRequestedDtype) {
  temp_dir dir;
  const std::string path = dir / "c.safetensors";
  const host_tensor f32 = host_tensor::random_normal(dtype::f32, {4, 6}, 7, 3.0f);
  const host_tensor bf16 = host_tensor::random_normal(dtype::bf16, {4, 6}, 8, 3.0f);
  const host_tensor f16 = host_tensor::random_normal(dtype::f16, {4, 6}, 9, 3.0f);
  ASSERT_FALSE(save_safetensors(path, {{"f32", make_host_weight(f32)},
                                       {"bf16", make_host_weight(bf16)},
                                       {"f16", make_host_weight(f16)}}));
  auto f = safetensors_file::open(path);
  ASSERT_TRUE(f.has_value()) << f.err().to_string();
  for (const auto* src : {&f32, &bf16, &f16}) {
    const std::string name = to_string(src->type());
    for (dtype to : {dtype::f32, dtype::f16, dtype::bf16}) {
      auto w = (*f)->weight(name, to);
      ASSERT_TRUE(w.has_value()) << w.err().to_string();
      EXPECT_EQ((*w)->type(), to);
      auto got = read_all(**w);
      ASSERT_TRUE(got.has_value());
      EXPECT_TRUE(*got == src->cast(to)) << name << " -> " << to_string(to);
    }
  }
  // Integers do not turn into floats or back.
  auto bad = (*f)->weight("f32", dtype::i32);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.err().code, errc::dtype_mismatch);
  EXPECT_NE(bad.err().message.find("'f32'"), std::string::npos) << bad.err().message;
}

TEST(Safetensors, SlicesAlongEveryDimMatchTheInMemorySource) {
  temp_dir dir;
  const std::string path = dir / "s.safetensors";
  const host_tensor t = host_tensor::random_normal(dtype::bf16, {3, 4, 5, 6}, 5);
  ASSERT_FALSE(save_safetensors(path, {{"w", make_host_weight(t)}}));
  auto f = safetensors_file::open(path);
  ASSERT_TRUE(f.has_value());
  auto mem = make_host_weight(t);
  for (dtype as : {dtype::bf16, dtype::f32}) {
    auto w = (*f)->weight("w", as);
    ASSERT_TRUE(w.has_value());
    auto mem_as = make_host_weight(t.cast(as));
    for (int dim = 0; dim < 4; ++dim) {
      const int64_t n = t.dims()[dim];
      std::vector<std::byte> a(static_cast<std::size_t>((*w)->slice_bytes(dim, n - 1)));
      std::vector<std::byte> b(a.size());
      ASSERT_FALSE((*w)->read_slice(dim, 1, n, a.data()));
      ASSERT_FALSE(mem_as->read_slice(dim, 1, n, b.data()));
      EXPECT_EQ(a, b) << "dim " << dim << " as " << to_string(as);
    }
    std::vector<std::byte> buf(1024);
    EXPECT_EQ((*w)->read_slice(4, 0, 1, buf.data()).code, errc::invalid_argument);
    EXPECT_EQ((*w)->read_slice(1, 3, 5, buf.data()).code, errc::invalid_argument);
  }
  (void)mem;
}

TEST(Safetensors, ShardedCheckpointFindsEveryTensorAndCountsBytesRead) {
  temp_dir dir;
  std::vector<named_weight> named;
  std::vector<host_tensor> ts;
  for (int i = 0; i < 7; ++i) ts.push_back(host_tensor::random_normal(dtype::f32, {10 + i, 8}, 100 + i));
  for (int i = 0; i < 7; ++i) named.push_back({"layer." + std::to_string(i) + ".w", make_host_weight(ts[static_cast<std::size_t>(i)])});
  auto shards = save_safetensors_sharded(dir.str(), named, 1000);
  ASSERT_TRUE(shards.has_value()) << shards.err().to_string();
  EXPECT_GE(*shards, 3);
  EXPECT_TRUE(std::filesystem::exists(dir / "model-00001-of-0000" + std::to_string(*shards) + ".safetensors"));
  auto ck = checkpoint::open(dir.str());
  ASSERT_TRUE(ck.has_value()) << ck.err().to_string();
  EXPECT_EQ(static_cast<int>(ck->files().size()), *shards);
  EXPECT_EQ(ck->names().size(), 7u);
  int64_t total = 0;
  for (int i = 0; i < 7; ++i) {
    auto w = ck->weight(named[static_cast<std::size_t>(i)].name, dtype::f32);
    ASSERT_TRUE(w.has_value()) << w.err().to_string();
    auto got = read_all(**w);
    ASSERT_TRUE(got.has_value());
    EXPECT_TRUE(*got == ts[static_cast<std::size_t>(i)]);
    total += static_cast<int64_t>(ts[static_cast<std::size_t>(i)].bytes());
  }
  EXPECT_EQ(ck->data_bytes(), total);
  EXPECT_EQ(ck->bytes_read(), total);
  auto missing = ck->weight("layer.9.w", dtype::f32);
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.err().message.find("'layer.9.w' is missing"), std::string::npos) << missing.err().message;
}

TEST(Safetensors, GraphWeightsSaveUnderTheirNodeNames) {
  temp_dir dir;
  auto cfg = ag::test::tiny_model(model_variant::llama, 2);
  auto g = build_transformer(cfg);
  ASSERT_TRUE(g.has_value());
  ASSERT_FALSE(save_safetensors(dir / "g.safetensors", *g));
  auto f = safetensors_file::open(dir / "g.safetensors");
  ASSERT_TRUE(f.has_value()) << f.err().to_string();
  EXPECT_EQ((*f)->tensors().size(), weight_names(cfg).size());
  for (const auto& name : weight_names(cfg)) {
    auto w = (*f)->weight(name, dtype::f32);
    ASSERT_TRUE(w.has_value()) << name;
    EXPECT_TRUE(*read_all(**w) == *g->at(g->find(name)).data->in_memory()) << name;
  }
}

TEST(Safetensors, WriterRefusesBadNamesAndSourcesWithoutValues) {
  temp_dir dir;
  auto w = make_host_weight(host_tensor::random_normal(dtype::f32, {2}, 1));
  EXPECT_EQ(save_safetensors(dir / "a", {{"x", w}, {"x", w}}).code, errc::invalid_argument);
  EXPECT_EQ(save_safetensors(dir / "a", {{"", w}}).code, errc::invalid_argument);
  EXPECT_EQ(save_safetensors(dir / "a", {{"__metadata__", w}}).code, errc::invalid_argument);
  error e = save_safetensors(dir / "a", {{"s", make_shape_only_weight(dtype::f32, {2})}});
  EXPECT_NE(e.message.find("'s' has no values"), std::string::npos) << e.message;
  EXPECT_FALSE(std::filesystem::exists(dir / "a"));
  e = save_safetensors(dir / "no/such/folder/x.safetensors", {{"x", w}});
  EXPECT_NE(e.message.find("cannot create"), std::string::npos) << e.message;
}

// ---- bad files --------------------------------------------------------------------

TEST(SafetensorsBadFile, TooShortForTheHeaderLength) {
  temp_dir dir;
  const std::string p = dir / "short.safetensors";
  ag::test::write_text(p, "abc");
  expect_names(open_error(p), p, "shorter than the 8-byte header length");
}

TEST(SafetensorsBadFile, HeaderLengthPastTheEnd) {
  temp_dir dir;
  const std::string p = dir / "h.safetensors";
  write_raw_safetensors(p, "{}", 0, 500);
  expect_names(open_error(p), p, "header length 500 runs past the end of the file");
}

TEST(SafetensorsBadFile, HeaderLengthBeyondTheLimit) {
  temp_dir dir;
  const std::string p = dir / "h.safetensors";
  write_raw_safetensors(p, "{}", 0, int64_t{1} << 40);
  expect_names(open_error(p), p, "exceeds the limit");
}

TEST(SafetensorsBadFile, HeaderNotJsonOrNotAnObject) {
  temp_dir dir;
  const std::string p = dir / "j.safetensors";
  write_raw_safetensors(p, "{\"a\": {\"dtype\": ", 0);
  expect_names(open_error(p), p, "header is not valid JSON");
  write_raw_safetensors(p, "[1, 2, 3]", 0);
  expect_names(open_error(p), p, "header is not a JSON object");
  write_raw_safetensors(p, "{\"__metadata__\": {\"k\": 3}}", 0);
  expect_names(open_error(p), p, "\"__metadata__\" entry 'k' is not a string");
}

TEST(SafetensorsBadFile, UnknownDtypeNamesTheTensor) {
  temp_dir dir;
  const std::string p = dir / "d.safetensors";
  write_raw_safetensors(p, R"({"w": {"dtype": "F17", "shape": [2], "data_offsets": [0, 8]}})", 8);
  expect_names(open_error(p), p, "tensor 'w': unknown dtype \"F17\"");
}

TEST(SafetensorsBadFile, HeaderThatLiesAboutSizes) {
  temp_dir dir;
  const std::string p = dir / "s.safetensors";
  write_raw_safetensors(p, R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 24);
  expect_names(open_error(p), p, "tensor 'w': data_offsets [0,20] hold 20 bytes, shape [2, 3] of F32 needs 24");
  write_raw_safetensors(p, R"({"w": {"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 24]}})", 24);
  expect_names(open_error(p), p, "tensor 'w': shape [2,-3] has an entry that is not a non-negative integer");
  write_raw_safetensors(p, R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 10]}})", 24);
  expect_names(open_error(p), p, "tensor 'w'");
  write_raw_safetensors(p, R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", 0);
  expect_names(open_error(p), p, "tensor 'w': shape [4294967296, 4294967296] overflows");
  write_raw_safetensors(p, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 24);
  expect_names(open_error(p), p, "tensor 'w': data_offsets [8,4] end before they begin");
  write_raw_safetensors(p, R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 24);
  expect_names(open_error(p), p, "tensor 'w': no \"dtype\" string");
  write_raw_safetensors(p, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 24);
  expect_names(open_error(p), p, "tensor 'w': no \"data_offsets\"");
  write_raw_safetensors(p, R"({"w": 5})", 24);
  expect_names(open_error(p), p, "tensor 'w': entry is not an object");
}

TEST(SafetensorsBadFile, OffsetsPastTheEndOfATruncatedFile) {
  temp_dir dir;
  const std::string p = dir / "t.safetensors";
  ASSERT_FALSE(save_safetensors(p, {{"a", make_host_weight(host_tensor::random_normal(dtype::f32, {4}, 1))},
                                    {"b", make_host_weight(host_tensor::random_normal(dtype::f32, {8}, 2))}}));
  ASSERT_TRUE(safetensors_file::open(p).has_value());
  std::filesystem::resize_file(p, std::filesystem::file_size(p) - 4);
  expect_names(open_error(p), p, "tensor 'b': data_offsets [16,48] run past the end of the data");
}

TEST(SafetensorsBadFile, OverlappingTensors) {
  temp_dir dir;
  const std::string p = dir / "o.safetensors";
  write_raw_safetensors(p,
                        R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                            "b": {"dtype": "F16", "shape": [4], "data_offsets": [12, 20]}})",
                        32);
  expect_names(open_error(p), p, "tensor 'b' overlaps tensor 'a'");
  // Empty tensors may sit anywhere; tensors side by side are fine.
  write_raw_safetensors(p,
                        R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                            "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [8, 8]},
                            "b": {"dtype": "F16", "shape": [4], "data_offsets": [16, 24]}})",
                        32);
  EXPECT_TRUE(safetensors_file::open(p).has_value());
}

TEST(SafetensorsBadFile, DtypesAndRanksAGraphCannotHoldFailOnUseNamingTheTensor) {
  temp_dir dir;
  const std::string p = dir / "u.safetensors";
  write_raw_safetensors(p,
                        R"({"ids": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]},
                            "scalar": {"dtype": "F32", "shape": [], "data_offsets": [16, 20]},
                            "r5": {"dtype": "F32", "shape": [1, 1, 1, 1, 2], "data_offsets": [20, 28]}})",
                        28);
  auto f = safetensors_file::open(p);
  ASSERT_TRUE(f.has_value()) << "known dtypes and any rank are valid files: " << f.err().to_string();
  auto ids = (*f)->weight("ids", dtype::i32);
  ASSERT_FALSE(ids.has_value());
  EXPECT_EQ(ids.err().code, errc::dtype_mismatch);
  EXPECT_NE(ids.err().message.find(p + ": tensor 'ids' has dtype I64"), std::string::npos) << ids.err().message;
  auto scalar = (*f)->weight("scalar", dtype::f32);
  ASSERT_FALSE(scalar.has_value());
  EXPECT_NE(scalar.err().message.find("tensor 'scalar' has rank 0"), std::string::npos) << scalar.err().message;
  auto r5 = (*f)->weight("r5", dtype::f32);
  ASSERT_FALSE(r5.has_value());
  EXPECT_NE(r5.err().message.find("tensor 'r5' has rank 5"), std::string::npos) << r5.err().message;
  auto none = (*f)->weight("nope", dtype::f32);
  ASSERT_FALSE(none.has_value());
  EXPECT_NE(none.err().message.find("tensor 'nope' is not in the file"), std::string::npos) << none.err().message;
}

TEST(SafetensorsBadFile, MissingFileAndFolderWithoutCheckpoint) {
  temp_dir dir;
  auto f = safetensors_file::open(dir / "none.safetensors");
  ASSERT_FALSE(f.has_value());
  EXPECT_NE(f.err().message.find("none.safetensors: cannot open"), std::string::npos) << f.err().message;
  ag::test::write_text(dir / "pytorch_model.bin", "x");
  auto ck = checkpoint::open(dir.str());
  ASSERT_FALSE(ck.has_value());
  EXPECT_NE(ck.err().message.find("no model.safetensors"), std::string::npos) << ck.err().message;
  EXPECT_NE(ck.err().message.find("pytorch_model.bin is not read"), std::string::npos) << ck.err().message;
}

TEST(SafetensorsBadFile, IndexErrorsNameTheIndexAndTheTensor) {
  temp_dir dir;
  const std::string index = dir / "model.safetensors.index.json";
  ASSERT_FALSE(save_safetensors(dir / "a.safetensors",
                                {{"x", make_host_weight(host_tensor::random_normal(dtype::f32, {2}, 1))}}));
  auto open_err = [&] {
    auto ck = checkpoint::open(dir.str());
    EXPECT_FALSE(ck.has_value());
    return ck ? error{} : ck.err();
  };
  ag::test::write_text(index, R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors"}})");
  expect_names(open_err(), index, "weight_map puts tensor 'y' in a.safetensors, which has no such tensor");
  ag::test::write_text(index, R"({"weight_map": {"x": "../a.safetensors"}})");
  expect_names(open_err(), index, "not a plain file name");
  ag::test::write_text(index, R"({"weight_map": {"x": "b.safetensors"}})");
  expect_names(open_err(), index, "b.safetensors: cannot open");
  ag::test::write_text(index, R"({"weight_map": {"x": 3}})");
  expect_names(open_err(), index, "tensor 'x' is not mapped to a file name");
  ag::test::write_text(index, R"({"weight_map": [})");
  expect_names(open_err(), index, "not valid JSON");
  ag::test::write_text(index, R"({"metadata": {}})");
  expect_names(open_err(), index, "no \"weight_map\" object");
  ag::test::write_text(index, R"({"weight_map": {"x": "a.safetensors"}})");
  EXPECT_TRUE(checkpoint::open(dir.str()).has_value());
}

TEST(SafetensorsBadFile, ParseOfArbitraryBytesNeverCrashes) {
  // A deterministic sweep of truncations and byte flips of a valid file: each
  // either parses or gives an error naming the origin (the fuzz target does
  // this at scale: tests/fuzz).
  temp_dir dir;
  const std::string p = dir / "v.safetensors";
  ASSERT_FALSE(save_safetensors(p, {{"a", make_host_weight(host_tensor::random_normal(dtype::bf16, {3, 4}, 1))},
                                    {"b", make_host_weight(host_tensor::random_normal(dtype::f32, {5}, 2))}}));
  std::ifstream in(p, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int parsed = 0, refused = 0;
  for (std::size_t cut = 0; cut <= bytes.size(); ++cut) {
    for (int flip = -1; flip < 8; ++flip) {
      std::vector<std::byte> b(cut);
      if (cut > 0) std::memcpy(b.data(), bytes.data(), cut);  // data() is null when empty
      if (flip >= 0 && cut > 0) b[(cut * 7 + static_cast<std::size_t>(flip) * 13) % cut] ^= std::byte{0x5a};
      auto f = safetensors_file::parse(mapped_file::from_bytes(std::move(b), "mem"));
      if (f) {
        ++parsed;
        for (const auto& e : (*f)->tensors()) {
          auto w = (*f)->weight(e.name, dtype::f32);
          if (w) (void)values_of(**w);
        }
      } else {
        ++refused;
        EXPECT_EQ(f.err().message.rfind("mem: ", 0), 0u) << f.err().message;
      }
    }
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(refused, 0);
}
