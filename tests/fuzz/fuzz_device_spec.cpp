// Fuzz target: device spec strings ("sim:4", "cpu:2", "sim:2,cpu:1",
// "cuda:0,1"), as runtime::create and the REPL take them. Only the parser
// (gpu/device_factory.hpp): creating devices would start threads and touch
// GPUs. Properties: no crash; an accepted spec has counts 1..1024, no kind
// twice, unique non-negative CUDA ordinals; a refused one says where.
#include <set>
#include <string>

#include "fuzz_check.hpp"
#include "gpu/device_factory.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string spec(reinterpret_cast<const char*>(data), size);
  auto reqs = ag::gpu::parse_device_spec(spec);
  if (!reqs) {
    ag::fuzz::check_error(reqs.err(), "parse_device_spec");
    FUZZ_CHECK(reqs.err().code == ag::errc::bad_device_spec, "code %s", ag::to_string(reqs.err().code));
    return 0;
  }
  FUZZ_CHECK(!reqs->empty(), "an accepted spec names a device");
  std::set<int> kinds;
  for (const auto& r : *reqs) {
    FUZZ_CHECK(kinds.insert(static_cast<int>(r.kind)).second, "kind given twice");
    FUZZ_CHECK(r.pos <= spec.size(), "item position %zu past the spec", r.pos);
    if (r.kind == ag::device_kind::cuda) {
      FUZZ_CHECK(r.all != !r.ordinals.empty(), "cuda: either all or ordinals");
      // A repeated ordinal is allowed: another logical device of that GPU
      // ("cuda:0,0", how multi-device CUDA code runs on one GPU).
      for (int o : r.ordinals) FUZZ_CHECK(o >= 0, "negative ordinal %d", o);
    } else {
      FUZZ_CHECK(r.count >= 1 && r.count <= 1024, "count %d", r.count);
    }
  }
  return 0;
}
