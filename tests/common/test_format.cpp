// Tests of the formatting and size-parsing helpers.
#include <gtest/gtest.h>

#include "orrery/common/error.hpp"
#include "orrery/common/format.hpp"

namespace orrery {

TEST(Format, Durations) {
  EXPECT_EQ(format_duration_ns(999), "999 ns");
  EXPECT_EQ(format_duration_ns(1500), "1.50 us");
  EXPECT_EQ(format_duration_ns(2.5e6), "2.50 ms");
  EXPECT_EQ(format_duration_ns(3.25e9), "3.250 s");
}

TEST(Format, Bytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(25.0 * 1024 * 1024), "25.00 MiB");
}

TEST(Format, ParseSize) {
  EXPECT_EQ(parse_size("8"), 8);
  EXPECT_EQ(parse_size("64K"), 65536);
  EXPECT_EQ(parse_size("1M"), 1048576);
  EXPECT_EQ(parse_size("1G"), 1073741824);
  EXPECT_EQ(parse_size("2GB"), 2147483648LL);
  EXPECT_THROW(parse_size("abc"), InputError);
  EXPECT_THROW(parse_size("3X"), InputError);
  EXPECT_THROW(parse_size(""), InputError);
}

}  // namespace orrery
