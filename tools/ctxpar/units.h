/*
 * units.h - numbers for people in the tool's text tables: bytes in B, KiB, MiB, GiB, TiB and
 * seconds in s, ms, us (three significant digits). JSON keeps the exact numbers.
 */
#ifndef CPT_TOOL_UNITS_H
#define CPT_TOOL_UNITS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* "673186816" -> "642 MiB"; "1536" -> "1.5 KiB"; below 1024: "12 B". Returns buf. */
const char *cpt_bytes_text(double bytes, char *buf, size_t n);

/* 3.987e-05 -> "39.9 us"; 0.0123 -> "12.3 ms"; 6.1 -> "6.1 s"; 1234.4 -> "1234 s". Returns
 * buf. */
const char *cpt_seconds_text(double seconds, char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TOOL_UNITS_H */
