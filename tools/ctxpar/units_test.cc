// Bytes and seconds for people: the unit steps at 1024 (bytes) and 1000 (seconds), three
// significant digits, and the values written out here by hand.
#include "tools/ctxpar/units.h"

#include <cmath>
#include <string>

#include <gtest/gtest.h>

namespace {

std::string Bytes(double b) {
    char buf[32];
    return cpt_bytes_text(b, buf, sizeof buf);
}

std::string Seconds(double s) {
    char buf[32];
    return cpt_seconds_text(s, buf, sizeof buf);
}

TEST(Units, Bytes) {
    EXPECT_EQ(Bytes(0), "0 B");
    EXPECT_EQ(Bytes(12), "12 B");
    EXPECT_EQ(Bytes(1023), "1023 B");
    EXPECT_EQ(Bytes(1024), "1 KiB");
    EXPECT_EQ(Bytes(1536), "1.5 KiB");
    EXPECT_EQ(Bytes(673186816), "642 MiB"); // the plan the issue quoted: 642 x 2^20 bytes
    EXPECT_EQ(Bytes(1023.0 * 1024 * 1024), "1023 MiB");
    EXPECT_EQ(Bytes(3.0 * 1024 * 1024 * 1024), "3 GiB");
    EXPECT_EQ(Bytes(5.0 * 1024 * 1024 * 1024 * 1024 * 1024), "5120 TiB"); // no larger unit
}

TEST(Units, Seconds) {
    EXPECT_EQ(Seconds(6.1), "6.1 s");
    EXPECT_EQ(Seconds(999.4), "999 s");
    EXPECT_EQ(Seconds(1234.4), "1234 s");
    EXPECT_EQ(Seconds(1.0), "1 s");
    EXPECT_EQ(Seconds(0.0123), "12.3 ms");
    EXPECT_EQ(Seconds(3.987e-05), "39.9 us");
    EXPECT_EQ(Seconds(0), "0 s");
    EXPECT_EQ(Seconds(NAN), "-");
}

} // namespace
