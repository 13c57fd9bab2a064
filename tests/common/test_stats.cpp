// Tests of the shared statistics (common/stats.hpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "orrery/common/stats.hpp"

namespace orrery {
namespace {

TEST(Stats, MedianOfOddAndEvenCounts) {
  EXPECT_EQ(median(std::vector<double>{}), 0.0);
  EXPECT_EQ(median(std::vector<double>{3.0}), 3.0);
  EXPECT_EQ(median(std::vector<double>{5.0, 1.0, 3.0}), 3.0);
  // Even counts: the mean of the two middle values.
  EXPECT_EQ(median(std::vector<double>{4.0, 1.0, 2.0, 10.0}), 3.0);
  EXPECT_EQ(median(std::vector<double>{1.0, 2.0}), 1.5);
}

TEST(Stats, MedianOfIntegersRoundsTowardZero) {
  EXPECT_EQ(median(std::vector<int64_t>{}), 0);
  EXPECT_EQ(median(std::vector<int64_t>{7, 1, 4}), 4);
  EXPECT_EQ(median(std::vector<int64_t>{1, 2}), 1);
  EXPECT_EQ(median(std::vector<int64_t>{-1, -2}), -1);
  EXPECT_EQ(median(std::vector<int64_t>{10, 20, 30, 40}), 25);
}

}  // namespace
}  // namespace orrery
