// Weight upload from a memory-mapped checkpoint goes in chunks of whole rows
// through one staging buffer (runtime_options::upload_chunk_bytes): no read
// of a weight is larger than a chunk (or one row, when a row is larger), every
// byte is read once, large chunks are read on several threads, and the
// loaded model computes what the reference does.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>
#include <thread>

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

namespace {

// Forwards to a source and records which threads read which rows.
class thread_recording_source final : public ag::weight_source {
 public:
  explicit thread_recording_source(ag::weight_source_ptr base) : base_(std::move(base)) {}
  ag::dtype type() const noexcept override { return base_->type(); }
  const ag::shape& dims() const noexcept override { return base_->dims(); }
  ag::error read_slice(int dim, int64_t begin, int64_t end, void* dst) const override {
    {
      std::lock_guard<std::mutex> lk(m_);
      if (threads_.empty()) first_ = std::this_thread::get_id();
      threads_.insert(std::this_thread::get_id());
      rows_read_ += dim == 0 ? end - begin : 0;
      ++reads_;
    }
    return base_->read_slice(dim, begin, end, dst);
  }
  std::string origin() const override { return base_->origin(); }
  std::size_t threads() const {
    std::lock_guard<std::mutex> lk(m_);
    return threads_.size();
  }
  int64_t rows_read() const {
    std::lock_guard<std::mutex> lk(m_);
    return rows_read_;
  }
  int reads() const {
    std::lock_guard<std::mutex> lk(m_);
    return reads_;
  }
  /// The thread of the first read.
  std::thread::id reader() const {
    std::lock_guard<std::mutex> lk(m_);
    return first_;
  }

 private:
  ag::weight_source_ptr base_;
  mutable std::mutex m_;
  mutable std::set<std::thread::id> threads_;
  mutable int64_t rows_read_ = 0;
  mutable int reads_ = 0;
  mutable std::thread::id first_;
};

}  // namespace

// A chunk of at least 8 MiB is read in pieces of whole rows on several
// threads at once (runtime_core's read_rows_in_parallel: a folded norm's
// scaled weights and a mapping's page faults use the host's cores); every
// row is read once and the product equals the reference. 16 MiB in one
// chunk: pieces of at least 4 MiB, so up to 4 threads where the host has
// the cores.
TEST(WeightUpload, LargeChunksAreReadInPiecesOnSeveralThreads) {
  const int64_t rows = 4096, cols = 1024;  // f32: 16 MiB
  auto source = std::make_shared<thread_recording_source>(
      ag::make_host_weight(ag::host_tensor::random_normal(ag::dtype::f32, {rows, cols}, 17, 0.03f)));
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {2, rows});
  b.output(b.matmul(x, b.weight("w", source), false, false, "y"));
  auto g = std::move(b).build();
  ASSERT_TRUE(g.has_value()) << g.err().to_string();
  ag::runtime_options ro;
  ro.upload_chunk_bytes = rows * cols * 4;
  auto rt = ag::runtime::create("cpu:1", ro);
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  auto p = (*rt)->compile(*g);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  EXPECT_EQ(source->rows_read(), rows) << "every row once";
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores >= 2) {
    EXPECT_EQ(source->reads(), static_cast<int>(std::min(4u, cores))) << "pieces of 4 MiB, a thread each";
    EXPECT_EQ(source->threads(), std::min<std::size_t>(4, cores));
  } else {
    std::printf("one core: the chunk is read on one thread (%d reads)\n", source->reads());
    EXPECT_EQ(source->reads(), 1);
  }
  const std::vector<ag::host_tensor> in{ag::host_tensor::random_normal(ag::dtype::f32, {2, rows}, 18)};
  ag::job j = (*rt)->submit(*p, in);
  ASSERT_TRUE(j.wait_for(60s));
  ASSERT_TRUE(j.wait().has_value()) << j.wait().err().to_string();
  auto want = ag::evaluate_reference(*g, in);
  ASSERT_TRUE(want.has_value());
  auto c = ag::compare(j.wait()->at(0), (*want)[0], 1e-4, 1e-4);
  EXPECT_TRUE(c.ok) << c.message;
}

// A plan over two devices uploads both devices' weights at once, a thread
// each (runtime_core's upload_all_weights), and each device's product equals
// the reference. The weights are pinned, one to each device of cpu:2; each
// source records the threads that read it.
TEST(WeightUpload, EachDeviceUploadsOnItsOwnThread) {
  const int64_t rows = 256, cols = 64;
  std::vector<std::shared_ptr<thread_recording_source>> sources;
  ag::graph_builder b;
  auto x = b.input("x", ag::dtype::f32, {2, rows});
  for (int d = 0; d < 2; ++d) {
    sources.push_back(std::make_shared<thread_recording_source>(
        ag::make_host_weight(ag::host_tensor::random_normal(ag::dtype::f32, {rows, cols}, 30 + d, 0.05f))));
    auto y = b.matmul(x, b.weight("w" + std::to_string(d), sources.back()), false, false, "y" + std::to_string(d));
    b.pin(y, d);
    b.output(y);
  }
  auto g = std::move(b).build();
  ASSERT_TRUE(g.has_value()) << g.err().to_string();
  auto rt = ag::runtime::create("cpu:2");
  ASSERT_TRUE(rt.has_value()) << rt.err().to_string();
  auto p = (*rt)->compile(*g);
  ASSERT_TRUE(p.has_value()) << p.err().to_string();
  for (int d = 0; d < 2; ++d) {
    ASSERT_EQ((*p)->placement()[static_cast<std::size_t>(g->find("w" + std::to_string(d)))], d);
    EXPECT_EQ(sources[static_cast<std::size_t>(d)]->rows_read(), rows) << "device " << d << ": every row once";
  }
  const auto reader = [&](int d) { return sources[static_cast<std::size_t>(d)]->reader(); };
  EXPECT_NE(reader(0), reader(1)) << "the two devices' weights were read on one thread";
  const std::vector<ag::host_tensor> in{ag::host_tensor::random_normal(ag::dtype::f32, {2, rows}, 31)};
  ag::job j = (*rt)->submit(*p, in);
  ASSERT_TRUE(j.wait_for(60s));
  ASSERT_TRUE(j.wait().has_value()) << j.wait().err().to_string();
  auto want = ag::evaluate_reference(*g, in);
  ASSERT_TRUE(want.has_value());
  for (std::size_t o = 0; o < 2; ++o) {
    auto c = ag::compare(j.wait()->at(o), (*want)[o], 1e-4, 1e-4);
    EXPECT_TRUE(c.ok) << "output " << o << ": " << c.message;
  }
}
