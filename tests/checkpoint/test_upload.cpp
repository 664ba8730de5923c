// Weight upload from a memory-mapped checkpoint goes in chunks of whole rows
// through one staging buffer (runtime_options::upload_chunk_bytes): no read
// of a weight is larger than a chunk (or one row, when a row is larger), every
// byte is read once, and the loaded model computes what the reference does.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>

#include "actors/actorgraph.hpp"
#include "checkpoint/checkpoint_test_util.hpp"
#include "graph/reference.hpp"

namespace {

using namespace std::chrono_literals;

// Forwards to a source and records the size of its reads.
class recording_source final : public ag::weight_source {
 public:
  recording_source(ag::weight_source_ptr base, std::atomic<int64_t>& largest, std::atomic<int64_t>& total)
      : base_(std::move(base)), largest_(largest), total_(total) {}
  ag::dtype type() const noexcept override { return base_->type(); }
  const ag::shape& dims() const noexcept override { return base_->dims(); }
  ag::error read_slice(int dim, int64_t begin, int64_t end, void* dst) const override {
    const int64_t n = base_->slice_bytes(dim, end - begin);
    int64_t seen = largest_.load();
    while (n > seen && !largest_.compare_exchange_weak(seen, n)) {
    }
    total_ += n;
    return base_->read_slice(dim, begin, end, dst);
  }
  std::string origin() const override { return base_->origin(); }

 private:
  ag::weight_source_ptr base_;
  std::atomic<int64_t>& largest_;
  std::atomic<int64_t>& total_;
};

}  // namespace

TEST(WeightUpload, MappedWeightsUploadInChunksOfWholeRows) {
  for (const std::string spec : {"cpu:1", "sim:2"}) {
    SCOPED_TRACE(spec);
    const auto cfg = ag::test::tiny_model(ag::models::model_variant::llama, 2);
    ag::test::temp_dir dir;
    ag::test::save_random_model(dir.str(), cfg);
    auto m = ag::models::hf_model::open(dir.str());
    ASSERT_TRUE(m.has_value()) << m.err().to_string();
    std::atomic<int64_t> largest{0}, total{0};
    const auto provider = m->provider();
    auto g = ag::models::build_transformer(
        m->model_config(cfg.seq_len),
        [&](const std::string& name, ag::dtype t, const ag::shape& s) -> ag::expected<ag::weight_source_ptr> {
          auto src = provider(name, t, s);
          if (!src) return src.err();
          return ag::weight_source_ptr(std::make_shared<recording_source>(*src, largest, total));
        });
    ASSERT_TRUE(g.has_value()) << g.err().to_string();
    ag::runtime_options ro;
    ro.upload_chunk_bytes = 300;  // rows of d 32 f32 are 128 bytes: 2 rows a chunk; d_ff rows are 192
    ro.backend.sim.time_scale = 1e-2;
    auto rt = ag::runtime::create(spec, ro);
    ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
    auto p = (*rt)->compile(*g, {.pipeline_stages = spec == "sim:2" ? 2 : 1});
    ASSERT_TRUE(p.has_value()) << p.err().to_string();
    EXPECT_LE(largest.load(), 300);
    EXPECT_GT(largest.load(), 0);
    // Every weight is read once (a pipeline's stages hold disjoint weights;
    // the tiny llama's head is separate, so nothing is uploaded twice).
    EXPECT_EQ(total.load(), g->weight_bytes());
    const auto in = ag::models::transformer_inputs(m->model_config(cfg.seq_len), 5);
    ag::job j = (*rt)->submit(*p, in);
    ASSERT_TRUE(j.wait_for(60s));
    ASSERT_TRUE(j.wait().has_value()) << j.wait().err().to_string();
    auto want = ag::evaluate_reference(*g, in);
    ASSERT_TRUE(want.has_value());
    auto c = ag::compare(j.wait()->at(0), (*want)[0], 2e-4, 2e-3);
    EXPECT_TRUE(c.ok) << c.message;
  }
}
