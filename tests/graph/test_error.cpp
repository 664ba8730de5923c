// ag::error carries what it concerns as fields; expected<T>::value() on an
// error reports that error.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "graph/error.hpp"

namespace {

using ag::errc;
using ag::error;

TEST(Error, FieldsAreUnsetByDefaultAndToStringIsCodeAndMessage) {
  const error e{errc::op_failed, "device 'sim0' step 3 (compute0, fc): boom"};
  EXPECT_EQ(e.device, -1);
  EXPECT_EQ(e.step, -1);
  EXPECT_TRUE(e.op.empty());
  EXPECT_EQ(e.to_string(), "op_failed: device 'sim0' step 3 (compute0, fc): boom");
  // Fields do not change the human-readable form.
  const error f{errc::op_failed, "device 'sim0' step 3 (compute0, fc): boom", 0, 3, "fc"};
  EXPECT_EQ(f.to_string(), e.to_string());
  EXPECT_EQ(error{}.to_string(), "ok");
}

TEST(Error, ConcerningFillsOnlyUnsetFields) {
  error e{errc::device_failed, "dead", 2};
  e.concerning(5, 7, "act");
  EXPECT_EQ(e.device, 2) << "the innermost maker's device is kept";
  EXPECT_EQ(e.step, 7);
  EXPECT_EQ(e.op, "act");
  const error g = error{errc::internal, "x"}.concerning(1);
  EXPECT_EQ(g.device, 1);
  EXPECT_EQ(g.step, -1);
}

TEST(Expected, ValueOnAnErrorThrowsTheErrorItself) {
  ag::expected<int> bad = error{errc::out_of_memory, "device 'sim1': 5 bytes wanted", 1};
  try {
    (void)bad.value();
    FAIL() << "value() on an error returned";
  } catch (const ag::bad_expected_access& x) {
    EXPECT_STREQ(x.what(), "out_of_memory: device 'sim1': 5 bytes wanted");
    EXPECT_EQ(x.err().code, errc::out_of_memory);
    EXPECT_EQ(x.err().device, 1);
  }
  // Every accessor checks, and the exception is a std::exception.
  EXPECT_THROW((void)*bad, ag::bad_expected_access);
  ag::expected<std::vector<int>> none = error{errc::invalid_argument, "no"};
  EXPECT_THROW((void)none->size(), std::exception);
  EXPECT_THROW((void)std::move(none).value(), ag::bad_expected_access);
  const ag::expected<int> cbad = error{errc::timeout, "late"};
  EXPECT_THROW((void)cbad.value(), ag::bad_expected_access);
}

TEST(Expected, ValueOnAValueDoesNotThrow) {
  ag::expected<std::string> ok = std::string("fine");
  EXPECT_EQ(ok.value(), "fine");
  EXPECT_EQ(ok->size(), 4u);
  EXPECT_EQ(std::move(ok).value(), "fine");
}

}  // namespace
