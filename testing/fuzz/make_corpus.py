#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets: testing/fuzz/corpus/<target>/seed_*.

    python3 testing/fuzz/make_corpus.py

Seeds are small, named for what they hold, and cover the valid shapes of the input first (so the
fuzzer starts from calls that run for real) and then one broken thing each. Crash inputs found
by run_fuzzers.sh are kept next to the seeds as regress_* files; this script leaves them alone.
The validate_fuzz layout is described in fuzz_problem.h: keep the two in step.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# ------------------------------------------------------------------ npy_fuzz


def npy(descr, shape, data=b"", fortran="False", major=1, header=None, tail=b""):
    """A .npy image; header overrides the dict text."""
    if header is None:
        dims = ", ".join(str(d) for d in shape)
        if len(shape) == 1:
            dims += ","
        header = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }" % (descr, fortran, dims)
    pre = 10 if major == 1 else 12
    text = header.encode()
    hlen = (pre + len(text) + 1 + 63) // 64 * 64 - pre
    text = text + b" " * (hlen - len(text) - 1) + b"\n"
    size = struct.pack("<H", hlen) if major == 1 else struct.pack("<I", hlen)
    return b"\x93NUMPY" + bytes([major, 0]) + size + text + data + tail


def floats(n):
    return struct.pack("<%df" % n, *[(i % 7) * 0.25 - 0.75 for i in range(n)])


def npy_seeds():
    ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
    return {
        "f32_2x3": npy("<f4", (2, 3), floats(6)),
        "f32_scalar": npy("<f4", (), floats(1)),
        "f32_empty": npy("<f4", (0, 5)),
        "f16_4": npy("<f2", (4,), struct.pack("<4H", 0x3C00, 0xBC00, 0x7C00, 0x7E00)),
        "i32_cu_seqlens": npy("<i4", (4,), struct.pack("<4i", 0, 3, 7, 16)),
        "i64_1x1x2": npy("<i8", (1, 1, 2), struct.pack("<2q", -1, 2**40)),
        "f32_bshd": npy("<f4", (1, 2, 2, 2), floats(8)),
        "v2_f32_3": npy("<f4", (3,), floats(3), major=2),
        "keys_reordered": npy("", (), floats(6), header="{'shape': (2, 3), 'fortran_order': "
                              "False, 'descr': '<f4'}"),
        "bad_magic": b"\x93NUMPZ" + npy("<f4", (2, 3), floats(6))[6:],
        "bad_version": npy("<f4", (2, 3), floats(6))[:6] + b"\x03\x00"
        + npy("<f4", (2, 3), floats(6))[8:],
        "truncated_data": npy("<f4", (2, 3), floats(5)),
        "extra_bytes": npy("<f4", (2, 3), floats(6), tail=b"\x00"),
        "fortran": npy("<f4", (2, 3), floats(6), fortran="True"),
        "big_endian": npy(">f4", (2, 3), floats(6)),
        "float64": npy("<f8", (3,), b"\x00" * 24),
        "negative_dim": npy("", (), header="{'descr': '<f4', 'fortran_order': False, "
                            "'shape': (-1, 3), }"),
        "huge_dims": npy("", (), header="{'descr': '<f4', 'fortran_order': False, "
                         "'shape': (4294967296, 4294967296, 16), }"),
        "nine_dims": npy("<f4", (1,) * 9, floats(1)),
        "duplicate_key": npy("", (), floats(6), header=ok[:-1] + "'shape': (2, 3)}"),
        "missing_key": npy("", (), floats(6), header="{'descr': '<f4', 'shape': (2, 3), }"),
        "int_not_tuple": npy("", (), floats(6), header="{'descr': '<f4', 'fortran_order': "
                             "False, 'shape': (6), }"),
        "header_past_end": b"\x93NUMPY\x01\x00\xff\xff{'descr'",
        "empty": b"",
    }


# ------------------------------------------------------------------ validate_fuzz

BWD, RAW, NULL_CTX, NULL_PARAMS, NULL_LSE, HUGE = 1, 2, 4, 8, 16, 32
F32, F16, BF16 = 0, 1, 2
AUTO, RING, ALLGATHER, ALLTOALL = 0, 1, 2, 3
CONTIG, ZIGZAG, STRIPED, CUSTOM = 0, 1, 2, 3
HYBRID = 4
SINKS, DSINKS, LSE_LO, ASSIGNMENT = 1, 2, 4, 8


def features(flags=0, vdim=0, window_right=0, softcap=0, ulysses=0, doc_rows=0, assign_token=0,
             assign_rank=0, sink_scale=0):
    """The 16-byte features block (FUZZ_EXT_* in fuzz_problem.h); softcap is the raw byte."""
    blk = bytes([flags, vdim]) + struct.pack("<h", window_right)
    blk += bytes([softcap & 0xFF, ulysses & 0xFF, doc_rows & 0xFF, assign_token,
                  assign_rank & 0xFF, sink_scale])
    return blk + bytes(16 - len(blk))


def problem(flags=0, dtype=F32, b=1, s=8, hkv=2, group=1, d=16, algo=RING, layout=CONTIG,
            mask=0, window=0, scale_mode=0, scale=0.0, seq_global=0, docs_mode=0, docs_n=0,
            docs=b"", struct_size=0, records=None, ext=None, raw=b""):
    """A validate_fuzz input: header, 8 tensor records, features block (ext: the arguments of
    features()), raw tail (see fuzz_problem.h)."""
    hdr = bytes([flags, dtype & 0xFF, b - 1, s - 1, hkv - 1, group - 1, d - 1, algo & 0xFF,
                 layout & 0xFF, mask & 0xFF])
    hdr += struct.pack("<h", window) + bytes([scale_mode]) + struct.pack("<f", scale)
    hdr += struct.pack("<h", seq_global) + bytes([docs_mode, docs_n])
    hdr += (docs + b"\x00" * 9)[:9] + bytes([struct_size])
    assert len(hdr) == 31
    recs = [bytes(8)] * 8
    for i, rec in (records or {}).items():
        recs[i] = bytes(rec) + bytes(8 - len(rec))
    blk = features(**(ext or {}))
    if not ext and not raw:
        blk = b""  # missing bytes read as zero: plain attention
    return hdr + b"".join(recs) + blk + raw


Q, K, V, OUT, DOUT, DQ, DK, DV = range(8)


def validate_seeds():
    seeds = {}
    # Calls that pass validation and run: every dtype, algorithm, layout and mask.
    for dt, dname in ((F32, "f32"), (F16, "f16"), (BF16, "bf16")):
        for algo, aname in ((RING, "ring"), (ALLGATHER, "allgather"), (AUTO, "auto")):
            seeds["ok_%s_%s_causal_bwd" % (dname, aname)] = problem(
                BWD, dt, algo=algo, mask=1, s=12, d=24)
    seeds["ok_zigzag_gqa"] = problem(BWD, layout=ZIGZAG, mask=1, hkv=1, group=3, s=6, d=40)
    seeds["ok_striped_window"] = problem(BWD, layout=STRIPED, mask=1, window=3, s=9, d=8)
    seeds["ok_docs"] = problem(BWD, mask=1, s=16, docs_mode=2, docs_n=3, docs=b"\x04\x09")
    seeds["ok_docs_window_nomask"] = problem(BWD, s=20, window=2, docs_mode=2, docs_n=7,
                                             docs=b"\x01\x05\x02\x03\x07\x01")
    seeds["ok_batch3_d80"] = problem(BWD, BF16, b=3, s=5, d=80, hkv=4, group=2)
    seeds["ok_d1_s1"] = problem(BWD, F16, s=1, d=1, hkv=1)
    seeds["ok_scale_1"] = problem(BWD, scale_mode=1, mask=1)
    seeds["ok_scale_bits"] = problem(BWD, scale_mode=3, scale=0.3)
    seeds["ok_negative_scale_window"] = problem(BWD, scale_mode=3, scale=-0.3, mask=1, window=2,
                                                s=10, d=8)
    seeds["ok_seq_global"] = problem(0, seq_global=8)
    seeds["ok_padded_strides"] = problem(BWD, records={i: [0x10, 0, 0, 0, 3, 2, 5] for i in
                                                       range(8)})
    seeds["ok_bhsd_strides"] = problem(BWD, F16, records={i: [0x20, 0, 0, 0, 1] for i in
                                                          range(8)})
    seeds["ok_raw_nan_inf"] = problem(BWD | RAW, raw=struct.pack("<4f", float("nan"), 1.0,
                                                                  float("inf"), -2.0))
    seeds["ok_lse_null_fwd"] = problem(NULL_LSE, mask=1)
    # One broken argument each.
    seeds["bad_ctx_null"] = problem(NULL_CTX | BWD)
    seeds["bad_params_null"] = problem(NULL_PARAMS | BWD)
    seeds["bad_lse_null_bwd"] = problem(NULL_LSE | BWD)
    seeds["bad_q_null"] = problem(BWD, records={Q: [1]})
    seeds["bad_dv_data_null"] = problem(BWD, records={DV: [2]})
    seeds["bad_v_dtype"] = problem(BWD, records={V: [4, F16]})
    seeds["bad_out_dtype_unknown"] = problem(0, records={OUT: [4, 7]})
    seeds["bad_k_head_dim"] = problem(BWD, records={K: [8, 0, 3, 15]})
    seeds["bad_dk_seq"] = problem(BWD, records={DK: [8, 0, 1, 9]})
    seeds["bad_q_negative_batch"] = problem(0, records={Q: [8, 0, 0, 0xFF]})
    seeds["bad_group"] = problem(0, hkv=3, group=1, records={Q: [8, 0, 2, 4]})
    seeds["bad_stride_overlap"] = problem(0, records={K: [0x30, 0, 0, 0, 64, 16, 4, 1]})
    seeds["bad_stride_head_dim"] = problem(0, records={Q: [0x30, 0, 0, 0, 127, 32, 16, 2]})
    seeds["bad_stride_negative"] = problem(0, b=2, records={V: [0x30, 0, 0, 0, 0x80, 32, 16, 1]})
    seeds["bad_algo"] = problem(0, algo=9)
    seeds["alltoall"] = problem(0, algo=ALLTOALL)
    seeds["bad_layout"] = problem(0, layout=-1)
    seeds["bad_mask"] = problem(0, mask=2)
    seeds["bad_window"] = problem(0, window=-1)
    seeds["ok_zigzag_odd"] = problem(BWD, layout=ZIGZAG, mask=1, s=7)  # any length (one rank)
    seeds["bad_scale_nan"] = problem(0, scale_mode=3, scale=float("nan"))
    seeds["bad_seq_global"] = problem(0, seq_global=9)
    seeds["old_struct_size"] = problem(0, struct_size=1)  # an older header: defaults for the rest
    seeds["bad_struct_size_zero"] = problem(0, struct_size=3)
    # Shapes near the int64 limits, one dimension each: INVALID_ARG, never a wrapped size.
    for dim in range(4):
        seeds["bad_huge_dim%d" % dim] = problem(BWD | HUGE | dim << 6)
    seeds["bad_num_docs_without_array"] = problem(0, docs_mode=1, docs_n=2)
    seeds["bad_cu_seqlens_order"] = problem(0, docs_mode=3, docs_n=2, docs=bytes([0, 5, 3, 8]))
    seeds["bad_cu_seqlens_end"] = problem(0, docs_mode=3, docs_n=0, docs=bytes([0, 7]))
    # The features block: current models' attention, and one broken value each.
    seeds["ok_mla_gqa"] = problem(BWD, mask=1, hkv=1, group=2, d=48, ext=dict(vdim=32))
    seeds["ok_sinks_dsinks"] = problem(BWD, mask=1, window=3, ext=dict(flags=SINKS | DSINKS,
                                                                        sink_scale=3))
    seeds["ok_softcap"] = problem(BWD, BF16, mask=1, ext=dict(softcap=20))
    seeds["ok_window_right"] = problem(BWD, s=12, window=3, ext=dict(window_right=2))
    seeds["ok_lse_lo"] = problem(BWD, mask=1, s=10, ext=dict(flags=LSE_LO))
    seeds["ok_custom_assignment"] = problem(BWD, layout=CUSTOM, mask=1, seq_global=8,
                                           ext=dict(flags=ASSIGNMENT))
    seeds["ok_docs_per_row"] = problem(BWD, b=3, s=16, docs_mode=2, docs_n=3,
                                       docs=b"\x04\x09\x02\x0b", ext=dict(doc_rows=3))
    seeds["ok_empty_docs"] = problem(BWD, mask=1, s=6, docs_mode=3, docs_n=2,
                                     docs=bytes([0, 3, 3, 6]))
    seeds["ok_hybrid_one_rank"] = problem(BWD, algo=HYBRID, ext=dict(ulysses=1))
    seeds["ok_everything"] = problem(BWD, F16, b=2, s=12, hkv=2, group=2, d=24, mask=0, window=4,
                                     docs_mode=2, docs_n=2, docs=b"\x05\x07",
                                     ext=dict(flags=SINKS | DSINKS | LSE_LO, vdim=8,
                                              window_right=3, softcap=40, doc_rows=2))
    seeds["bad_vdim_mismatch"] = problem(BWD, ext=dict(vdim=8), records={DV: [8, 0, 3, 9]})
    seeds["bad_softcap_nan"] = problem(0, ext=dict(softcap=255))
    seeds["bad_softcap_negative"] = problem(0, ext=dict(softcap=-8))
    seeds["bad_softcap_inf"] = problem(0, ext=dict(softcap=254))
    seeds["bad_sink_nan"] = problem(BWD, ext=dict(flags=SINKS | DSINKS, sink_scale=255))
    seeds["bad_dsinks_without_sinks"] = problem(BWD, ext=dict(flags=DSINKS))
    seeds["bad_window_right"] = problem(0, ext=dict(window_right=-2))
    seeds["bad_assignment_rank"] = problem(0, layout=CUSTOM, seq_global=8,
                                           ext=dict(flags=ASSIGNMENT,
                                                                       assign_token=3,
                                                                       assign_rank=1))
    seeds["bad_custom_without_assignment"] = problem(0, layout=CUSTOM, seq_global=8)
    seeds["bad_custom_without_seq_global"] = problem(0, layout=CUSTOM, ext=dict(flags=ASSIGNMENT))
    seeds["bad_assignment_not_custom"] = problem(0, ext=dict(flags=ASSIGNMENT))
    seeds["bad_doc_rows"] = problem(0, b=2, docs_mode=2, docs_n=2, docs=b"\x03",
                                    ext=dict(doc_rows=3))
    seeds["bad_doc_rows_without_docs"] = problem(0, ext=dict(doc_rows=1))
    seeds["bad_ulysses_ring"] = problem(0, ext=dict(ulysses=2))
    seeds["bad_lse_lo_lse_null"] = problem(NULL_LSE | BWD, ext=dict(flags=LSE_LO))
    return seeds


# ------------------------------------------------------------------ safetensors_fuzz


def st(header, data=b""):
    """A .safetensors image: 8-byte little-endian header length, the JSON header, the data."""
    text = header.encode()
    return struct.pack("<Q", len(text)) + text + data


def st_seeds():
    one = '{"out":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    return {
        "f32_2": st(one, floats(2)),
        "three_dtypes": st('{"c":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},'
                           '"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},'
                           '"b":{"dtype":"BF16","shape":[1,2],"data_offsets":[16,20]}}  ',
                           struct.pack("<q", 7) + floats(2) + b"\x80\x3f\x20\xc0"),
        "metadata_f16_i32": st('{"__metadata__":{"format":"pt"},'
                               '"h":{"dtype":"F16","shape":[2,1],"data_offsets":[0,4]},'
                               '"cu":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}}',
                               struct.pack("<2H2i", 0x3C00, 0xBC00, 0, 5)),
        "empty_tensor": st('{"e":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]}}'),
        "bad_header_length": struct.pack("<Q", 1000) + one.encode(),
        "bad_offsets_past_end": st(one, b"abcd"),
        "bad_overlap": st('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                          '"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', floats(2)),
        "bad_dtype": st('{"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}', floats(2)),
        "bad_duplicate": st('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{}}',
                            floats(1)),
    }


def write(target, seeds):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
        if name.startswith("seed_"):
            os.remove(os.path.join(folder, name))
    for name, data in seeds.items():
        with open(os.path.join(folder, "seed_" + name), "wb") as f:
            f.write(data)
    print("%s: %d seeds" % (target, len(seeds)))


if __name__ == "__main__":
    write("npy_fuzz", npy_seeds())
    write("safetensors_fuzz", st_seeds())
    write("validate_fuzz", validate_seeds())
