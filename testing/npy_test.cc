// The .npy reader and writer: round trips, NumPy's exact header bytes, and malformed files that
// must each give CTXPAR_ERR_INVALID_ARG with a message naming the file and the problem.
#include "reference/npy.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace {

using Bytes = std::string;

std::string TempPath(const std::string &name) {
    const char *dir = std::getenv("TEST_TMPDIR");
    return std::string(dir ? dir : "/tmp") + "/" + name;
}

void WriteFile(const std::string &path, const Bytes &b) {
    FILE *f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(b.data(), 1, b.size(), f), b.size());
    ASSERT_EQ(std::fclose(f), 0);
}

// A file image: magic, version, little-endian header length, header, data.
Bytes Build(int major, int minor, const std::string &header, const Bytes &data) {
    Bytes b("\x93NUMPY", 6);
    b += (char)major;
    b += (char)minor;
    size_t n = header.size();
    b += (char)(n & 0xff);
    b += (char)(n >> 8 & 0xff);
    if (major >= 2) {
        b += (char)(n >> 16 & 0xff);
        b += (char)(n >> 24 & 0xff);
    }
    return b + header + data;
}

std::string Header(const std::string &descr, const std::string &order, const std::string &shape) {
    return "{'descr': '" + descr + "', 'fortran_order': " + order + ", 'shape': " + shape + ", }\n";
}

Bytes FloatData(size_t n) {
    Bytes d(n * 4, '\0');
    for (size_t i = 0; i < n; i++) {
        float f = 0.5f * (float)i - 1.0f;
        std::memcpy(&d[i * 4], &f, 4);
    }
    return d;
}

// The bytes ml_dtypes 0.5 writes for np.save(f, np.array([1.0, -2.5, 3.140625],
// dtype=ml_dtypes.bfloat16)): a 2-byte void, little-endian bfloat16 bits.
TEST(NpyRead, MlDtypesBfloat16) {
    std::string dict = "{'descr': '<V2', 'fortran_order': False, 'shape': (3,), }";
    std::string header = dict + std::string(118 - dict.size() - 1, ' ') + "\n";
    Bytes file = Build(1, 0, header, Bytes("\x80\x3f\x20\xc0\x49\x40", 6));
    ASSERT_EQ(file.size() - 6, 128u); // data at byte 128, as NumPy aligns it
    cpt_npy_array a;
    ASSERT_EQ(cpt_npy_read_mem(file.data(), file.size(), "bf16.npy", &a), CTXPAR_OK);
    EXPECT_EQ(a.dtype, CPT_NPY_BF16);
    ASSERT_EQ(a.count, 3u);
    const uint16_t *bits = static_cast<const uint16_t *>(a.data);
    // bfloat16 is the high half of a float32.
    const float want[3] = {1.0f, -2.5f, 3.140625f};
    for (int i = 0; i < 3; i++) {
        uint32_t u = (uint32_t)bits[i] << 16;
        float f;
        std::memcpy(&f, &u, 4);
        EXPECT_EQ(f, want[i]) << i;
    }
    cpt_npy_free(&a);
    EXPECT_STREQ(cpt_npy_dtype_descr(CPT_NPY_BF16), "<V2");
}

TEST(NpyRead, ValidVersion1) {
    Bytes file = Build(1, 0, Header("<f4", "False", "(2, 3)"), FloatData(6));
    cpt_npy_array a;
    ASSERT_EQ(cpt_npy_read_mem(file.data(), file.size(), "x.npy", &a), CTXPAR_OK)
        << ctxpar_last_error();
    EXPECT_EQ(a.dtype, CPT_NPY_F32);
    EXPECT_EQ(a.ndim, 2);
    EXPECT_EQ(a.shape[0], 2);
    EXPECT_EQ(a.shape[1], 3);
    EXPECT_EQ(a.count, 6u);
    EXPECT_EQ(((float *)a.data)[5], 1.5f);
    cpt_npy_free(&a);
    EXPECT_EQ(a.data, nullptr);
    cpt_npy_free(&a); // a second free does nothing
    cpt_npy_free(nullptr);
}

TEST(NpyRead, ValidVersion2AnyKeyOrderDoubleQuotes) {
    Bytes data(3 * 8, '\0');
    int64_t v[3] = {-5, 1LL << 40, 7};
    std::memcpy(&data[0], v, sizeof v);
    Bytes file =
        Build(2, 0, "{\"shape\": (3,), \"descr\": \"<i8\", \"fortran_order\": False}", data);
    cpt_npy_array a;
    ASSERT_EQ(cpt_npy_read_mem(file.data(), file.size(), nullptr, &a), CTXPAR_OK)
        << ctxpar_last_error();
    EXPECT_EQ(a.dtype, CPT_NPY_I64);
    EXPECT_EQ(a.ndim, 1);
    EXPECT_EQ(((int64_t *)a.data)[1], 1LL << 40);
    cpt_npy_free(&a);
}

TEST(NpyRead, ScalarAndEmpty) {
    Bytes file = Build(1, 0, Header("<i4", "False", "()"), Bytes("\x2a\0\0\0", 4));
    cpt_npy_array a;
    ASSERT_EQ(cpt_npy_read_mem(file.data(), file.size(), "s", &a), CTXPAR_OK);
    EXPECT_EQ(a.ndim, 0);
    EXPECT_EQ(a.count, 1u);
    EXPECT_EQ(((int32_t *)a.data)[0], 42);
    cpt_npy_free(&a);
    file = Build(1, 0, Header("<f2", "False", "(4, 0)"), "");
    ASSERT_EQ(cpt_npy_read_mem(file.data(), file.size(), "e", &a), CTXPAR_OK);
    EXPECT_EQ(a.count, 0u);
    EXPECT_NE(a.data, nullptr);
    cpt_npy_free(&a);
}

TEST(NpyWrite, HeaderIsNumpysExactBytes) {
    // np.save of a float32 array of shape (2, 3): 128-byte header, then the data.
    float x[6] = {0, 1, 2, 3, 4, 5};
    int64_t shape[2] = {2, 3};
    void *bytes = nullptr;
    size_t size = 0;
    ASSERT_EQ(cpt_npy_write_mem(CPT_NPY_F32, 2, shape, x, &bytes, &size), CTXPAR_OK);
    std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    Bytes expect("\x93NUMPY\x01\x00\x76\x00", 10);
    expect += dict + std::string(128 - 10 - dict.size() - 1, ' ') + "\n";
    ASSERT_EQ(size, 128u + sizeof x);
    EXPECT_EQ(Bytes((const char *)bytes, 128), expect);
    EXPECT_EQ(std::memcmp((const char *)bytes + 128, x, sizeof x), 0);
    std::free(bytes);
    // One dimension keeps Python's trailing comma: (5,).
    int64_t n = 5;
    ASSERT_EQ(cpt_npy_write_mem(CPT_NPY_F32, 1, &n, x, &bytes, &size), CTXPAR_OK);
    EXPECT_NE(Bytes((const char *)bytes, 128).find("'shape': (5,), }"), std::string::npos);
    std::free(bytes);
}

struct RoundTrip {
    cpt_npy_dtype dtype;
    std::vector<int64_t> shape;
};

// gtest would otherwise print the struct's bytes, padding included (valgrind objects).
void PrintTo(const RoundTrip &c, std::ostream *os) {
    *os << cpt_npy_dtype_descr(c.dtype) << " ndim " << c.shape.size();
}

class NpyRoundTrip : public ::testing::TestWithParam<RoundTrip> {};

TEST_P(NpyRoundTrip, FileAndMemory) {
    const RoundTrip &c = GetParam();
    size_t count = 1;
    for (int64_t d : c.shape)
        count *= (size_t)d;
    const size_t es = cpt_npy_dtype_size(c.dtype);
    Bytes data(count * es, '\0');
    for (size_t i = 0; i < data.size(); i++)
        data[i] = (char)(i * 37 + 11);
    const int ndim = (int)c.shape.size();
    std::string path =
        TempPath(std::string("rt_") + std::to_string(cpt_npy_dtype_size(c.dtype)) + "_" +
                 std::to_string(ndim) + "_" + std::to_string(count) + ".npy");
    ASSERT_EQ(cpt_npy_write(path.c_str(), c.dtype, ndim, c.shape.data(), data.data()), CTXPAR_OK)
        << ctxpar_last_error();
    cpt_npy_array a;
    ASSERT_EQ(cpt_npy_read(path.c_str(), &a), CTXPAR_OK) << ctxpar_last_error();
    EXPECT_EQ(a.dtype, c.dtype);
    ASSERT_EQ(a.ndim, ndim);
    for (int i = 0; i < ndim; i++)
        EXPECT_EQ(a.shape[i], c.shape[i]);
    ASSERT_EQ(a.count, count);
    EXPECT_EQ(Bytes((const char *)a.data, count * es), data);
    cpt_npy_free(&a);
    // The in-memory image is the same file, aligned to 64 bytes, and reads back the same.
    void *bytes = nullptr;
    size_t size = 0;
    ASSERT_EQ(cpt_npy_write_mem(c.dtype, ndim, c.shape.data(), data.data(), &bytes, &size),
              CTXPAR_OK);
    EXPECT_EQ((size - data.size()) % 64, 0u);
    EXPECT_EQ(((const char *)bytes)[size - data.size() - 1], '\n');
    FILE *f = std::fopen(path.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    Bytes on_disk(size + 1, '\0');
    EXPECT_EQ(std::fread(&on_disk[0], 1, size + 1, f), size);
    std::fclose(f);
    EXPECT_EQ(on_disk.substr(0, size), Bytes((const char *)bytes, size));
    ASSERT_EQ(cpt_npy_read_mem(bytes, size, "mem", &a), CTXPAR_OK);
    EXPECT_EQ(Bytes((const char *)a.data, count * es), data);
    cpt_npy_free(&a);
    std::free(bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, NpyRoundTrip,
    ::testing::Values(RoundTrip{CPT_NPY_F32, {}}, RoundTrip{CPT_NPY_F32, {0}},
                      RoundTrip{CPT_NPY_F32, {7}}, RoundTrip{CPT_NPY_F32, {2, 3, 4, 5}},
                      RoundTrip{CPT_NPY_F16, {3, 5}}, RoundTrip{CPT_NPY_I32, {4, 1, 2}},
                      RoundTrip{CPT_NPY_I64, {1, 1, 1, 1, 1, 1, 1, 9}},
                      RoundTrip{CPT_NPY_BF16, {2, 3}}, RoundTrip{CPT_NPY_F64, {3, 2}},
                      RoundTrip{CPT_NPY_F32, {1000, 1000}}));

// Each malformed image: INVALID_ARG, the file name and `why` in the message, nothing leaked.
struct Bad {
    const char *label;
    Bytes file;
    const char *why;
};

std::vector<Bad> BadFiles() {
    const Bytes d6 = FloatData(6);
    const std::string ok = Header("<f4", "False", "(2, 3)");
    Bytes v1 = Build(1, 0, ok, d6);
    Bytes hlen_past_eof = v1.substr(0, 10);
    hlen_past_eof[8] = (char)0xff;
    Bytes v2_huge = Build(2, 0, ok, d6);
    v2_huge[11] = (char)0x7f; // header length ~2 GB
    return {
        {"empty", "", "bad magic"},
        {"bad_magic", "\x93NUMPX" + v1.substr(6), "bad magic"},
        {"magic_only", v1.substr(0, 6), "truncated"},
        {"no_length", v1.substr(0, 9), "truncated"},
        {"version_3", Build(3, 0, ok, d6), "version 3.0"},
        {"version_1_1", Build(1, 1, ok, d6), "version 1.1"},
        {"header_past_eof", hlen_past_eof, "past the end"},
        {"v2_header_past_eof", v2_huge, "past the end"},
        {"truncated_header", v1.substr(0, 30), "past the end"},
        {"truncated_data", v1.substr(0, v1.size() - 1), "truncated data"},
        {"trailing_bytes", v1 + "x", "unexpected bytes"},
        {"fortran", Build(1, 0, Header("<f4", "True", "(2, 3)"), d6), "fortran_order"},
        {"big_endian", Build(1, 0, Header(">f4", "False", "(2, 3)"), d6), "big-endian"},
        {"c8", Build(1, 0, Header("<c8", "False", "(3,)"), Bytes(24, 0)), "'<c8' not supported"},
        {"u1", Build(1, 0, Header("|u1", "False", "(24,)"), Bytes(24, 0)), "not supported"},
        {"negative_dim", Build(1, 0, Header("<f4", "False", "(-2, 3)"), d6), "negative"},
        {"int_not_tuple", Build(1, 0, Header("<f4", "False", "(6)"), d6), "not a tuple"},
        {"shape_list", Build(1, 0, Header("<f4", "False", "[2, 3]"), d6), "expected '('"},
        {"nine_dims", Build(1, 0, Header("<f4", "False", "(1, 1, 1, 1, 1, 1, 1, 1, 6)"), d6),
         "dimensions"},
        {"overflow_count",
         Build(1, 0, Header("<f4", "False", "(4294967296, 4294967296, 4294967296)"), d6),
         "overflows"},
        {"overflow_bytes", Build(1, 0, Header("<f4", "False", "(4611686018427387904,)"), d6),
         "overflows"},
        {"dim_too_large", Build(1, 0, Header("<f4", "False", "(99999999999999999999,)"), d6),
         "too large"},
        {"absurd_dim", Build(1, 0, Header("<f4", "False", "(1099511627776,)"), d6),
         "truncated data"},
        {"leading_zero", Build(1, 0, Header("<f4", "False", "(02, 3)"), d6), "bad dimension"},
        {"float_dim", Build(1, 0, Header("<f4", "False", "(2.0, 3)"), d6), "expected ','"},
        {"missing_shape", Build(1, 0, "{'descr': '<f4', 'fortran_order': False}", d6), "'shape'"},
        {"extra_key",
         Build(1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1}", d6),
         "unexpected header key 'x'"},
        {"duplicate_key",
         Build(1, 0, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}", d6),
         "duplicate"},
        {"unterminated_string", Build(1, 0, "{'descr: <f4}", d6), "unterminated"},
        {"no_closing_brace",
         Build(1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,)", d6), "expected '}'"},
        {"text_after_dict", Build(1, 0, ok + "junk", d6), "after the dict"},
        {"bool_misspelled", Build(1, 0, Header("<f4", "false", "(2, 3)"), d6), "True or False"},
        {"empty_header", Build(1, 0, "", d6), "expected '{'"},
        {"nul_in_header", Build(1, 0, std::string("{'de\0scr': '<f4'}", 17), d6),
         "unsupported string"},
        {"double_comma", Build(1, 0, "{'descr': '<f4',, 'fortran_order': False}", d6),
         "quoted string"},
    };
}

TEST(NpyRead, MalformedFilesFailCleanly) {
    for (const Bad &b : BadFiles()) {
        cpt_npy_array a;
        std::memset(&a, 0x5a, sizeof a);
        std::string name = std::string(b.label) + ".npy";
        ctxpar_status st = cpt_npy_read_mem(b.file.data(), b.file.size(), name.c_str(), &a);
        EXPECT_EQ(st, CTXPAR_ERR_INVALID_ARG) << b.label;
        std::string msg = ctxpar_last_error();
        EXPECT_NE(msg.find(name), std::string::npos) << b.label << ": " << msg;
        EXPECT_NE(msg.find(b.why), std::string::npos) << b.label << ": " << msg;
        EXPECT_EQ(a.ndim, 0x5a5a5a5a) << b.label << ": output written on failure";
        // The same through a real file.
        std::string path = TempPath(name);
        WriteFile(path, b.file);
        st = cpt_npy_read(path.c_str(), &a);
        EXPECT_EQ(st, CTXPAR_ERR_INVALID_ARG) << b.label;
        msg = ctxpar_last_error();
        EXPECT_NE(msg.find(path), std::string::npos) << b.label << ": " << msg;
        EXPECT_NE(msg.find(b.why), std::string::npos) << b.label << ": " << msg;
    }
}

TEST(NpyRead, EveryPrefixAndEveryByteFlipIsHandled) {
    // A small fuzz: no prefix of a valid file reads, and no single corrupted byte crashes
    // (the sanitizer build checks the memory side).
    int64_t shape[2] = {2, 3};
    float x[6] = {1, 2, 3, 4, 5, 6};
    void *bytes = nullptr;
    size_t size = 0;
    ASSERT_EQ(cpt_npy_write_mem(CPT_NPY_F32, 2, shape, x, &bytes, &size), CTXPAR_OK);
    const Bytes good((const char *)bytes, size);
    std::free(bytes);
    cpt_npy_array a;
    for (size_t n = 0; n < size; n++) {
        Bytes prefix = good.substr(0, n);
        EXPECT_EQ(cpt_npy_read_mem(prefix.data(), n, "prefix", &a), CTXPAR_ERR_INVALID_ARG) << n;
    }
    size_t accepted = 0;
    for (size_t i = 0; i < size; i++) {
        for (int bit = 0; bit < 8; bit++) {
            Bytes m = good;
            m[i] = (char)(m[i] ^ (1 << bit));
            ctxpar_status st = cpt_npy_read_mem(m.data(), m.size(), "flip", &a);
            ASSERT_TRUE(st == CTXPAR_OK || st == CTXPAR_ERR_INVALID_ARG) << i << " " << bit;
            if (st == CTXPAR_OK) {
                accepted++;
                cpt_npy_free(&a);
            }
        }
    }
    // Every flip in the 24 data bytes reads; no single flip in the header leaves it valid (the
    // length, version, digits and quotes all break, spaces turn into non-whitespace).
    EXPECT_EQ(accepted, 24u * 8u);
}

TEST(NpyRead, MissingFileNamesIt) {
    cpt_npy_array a;
    std::string path = TempPath("does_not_exist.npy");
    EXPECT_EQ(cpt_npy_read(path.c_str(), &a), CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find(path), std::string::npos);
    EXPECT_EQ(cpt_npy_read(nullptr, &a), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(cpt_npy_read_mem(nullptr, 10, "x", &a), CTXPAR_ERR_INVALID_ARG);
}

TEST(NpyWrite, RejectsBadArguments) {
    float x[2] = {1, 2};
    int64_t neg[2] = {2, -1};
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 2};
    int64_t two = 2, huge[2] = {INT64_MAX, INT64_MAX};
    std::string path = TempPath("bad_write.npy");
    EXPECT_EQ(cpt_npy_write(path.c_str(), CPT_NPY_F32, 2, neg, x), CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("negative"), std::string::npos);
    EXPECT_EQ(cpt_npy_write(path.c_str(), CPT_NPY_F32, 9, nine, x), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(cpt_npy_write(path.c_str(), CPT_NPY_F32, 2, huge, x), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(cpt_npy_write(path.c_str(), CPT_NPY_F32, 1, &two, nullptr),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(cpt_npy_write(path.c_str(), (cpt_npy_dtype)9, 1, &two, x),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(cpt_npy_write(nullptr, CPT_NPY_F32, 1, &two, x), CTXPAR_ERR_INVALID_ARG);
    // None of these created the file.
    EXPECT_EQ(std::fopen(path.c_str(), "rb"), nullptr);
    std::string bad_dir = TempPath("no_such_dir/x.npy");
    EXPECT_EQ(cpt_npy_write(bad_dir.c_str(), CPT_NPY_F32, 1, &two, x),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find(bad_dir), std::string::npos);
}

TEST(NpyDtype, NamesAndSizes) {
    EXPECT_STREQ(cpt_npy_dtype_descr(CPT_NPY_F16), "<f2");
    EXPECT_STREQ(cpt_npy_dtype_descr((cpt_npy_dtype)9), "?");
    EXPECT_EQ(cpt_npy_dtype_size(CPT_NPY_I64), 8u);
    EXPECT_EQ(cpt_npy_dtype_size((cpt_npy_dtype)9), 0u);
}

} // namespace
