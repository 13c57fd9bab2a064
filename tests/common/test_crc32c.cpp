// CRC32C (common/crc32c.hpp): the published check value and the RFC 3720 (iSCSI) test vectors,
// continuation across pieces, and the SSE4.2 path equal to the table on every length and alignment.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "orrery/common/crc32c.hpp"

namespace orrery {
namespace {

TEST(Crc32c, CheckValue) {
  const std::string s = "123456789";
  EXPECT_EQ(crc32c(s.data(), s.size()), 0xE3069283u);
  EXPECT_EQ(crc32c_portable(s.data(), s.size()), 0xE3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  EXPECT_EQ(crc32c("a", 1), 0xC1D04330u);
}

// RFC 3720 appendix B.4.
TEST(Crc32c, Rfc3720Vectors) {
  std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xFF), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<unsigned char>(i);
    down[i] = static_cast<unsigned char>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down.data(), 32), 0x113FDB5Cu);
}

TEST(Crc32c, ContinuesAcrossPieces) {
  const std::string s = "123456789";
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    EXPECT_EQ(crc32c(s.data() + cut, s.size() - cut, crc32c(s.data(), cut)), 0xE3069283u) << cut;
  }
}

TEST(Crc32c, HardwarePathEqualsTable) {
  std::mt19937_64 rng(7);
  std::vector<unsigned char> buf(4096 + 16);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t offset = 0; offset < 16; ++offset) {
    for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 4096}) {
      EXPECT_EQ(crc32c(buf.data() + offset, n), crc32c_portable(buf.data() + offset, n))
          << offset << " " << n;
    }
  }
}

}  // namespace
}  // namespace orrery
