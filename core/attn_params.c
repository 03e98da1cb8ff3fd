// The attention parameters' table (params_table.h) as data, the compile-time proof that it
// describes ctxpar_attn_params exactly, and the public layout query.
#include <string.h>

#include "ctxpar_backend.h"
#include "params_table.h"

typedef ctxpar_attn_params params_t;
#define FIELD_OF(name) (((params_t *)0)->name)

// Each line names a field of its type, and its kind fits that type.
#define CHECK_TYPE(name, type, kind, ...)                                                          \
    _Static_assert(_Generic(FIELD_OF(name), type: 1, default: 0),                                 \
                   "params_table.h: ctxpar_attn_params." #name " is not a " #type);                \
    _Static_assert(CTXPAR_KIND_##kind != CTXPAR_KIND_INT ||                                       \
                       _Generic(FIELD_OF(name), int64_t: 1, default: 0),                          \
                   "params_table.h: INT " #name " is not int64_t");                                \
    _Static_assert(CTXPAR_KIND_##kind != CTXPAR_KIND_FLOAT ||                                     \
                       _Generic(FIELD_OF(name), float: 1, default: 0),                            \
                   "params_table.h: FLOAT " #name " is not float");                                \
    _Static_assert(CTXPAR_KIND_##kind != CTXPAR_KIND_ENUM ||                                      \
                       sizeof(FIELD_OF(name)) == sizeof(int),                                     \
                   "params_table.h: ENUM " #name " is not int-sized");
CTXPAR_PARAMS_TABLE(CHECK_TYPE)
#undef CHECK_TYPE

// The lines are in declaration order: 0 < off(a) + 1 < off(b) + 1 < ... < sizeof + 1 (the + 1
// keeps unsigned comparisons with 0 meaningful).
#define IN_ORDER(name, ...) offsetof(params_t, name) + 1 && offsetof(params_t, name) + 1 <
_Static_assert(0 < CTXPAR_PARAMS_TABLE(IN_ORDER) sizeof(params_t) + 1,
               "params_table.h: the lines are not in ctxpar_attn_params' order");
#undef IN_ORDER

// The defaults, positionally: a field missing from the table leaves this initializer short,
// which the pragma makes an error (too many lines are an error anyway). With the order above,
// the table is exactly the struct.
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wmissing-field-initializers"
#define DEFAULT(name, type, kind, def, ...) def,
const params_t ctxpar_param_defaults = {CTXPAR_PARAMS_TABLE(DEFAULT)};
#undef DEFAULT
#pragma GCC diagnostic pop

// The ENUM lines' names functions, taking the value as an int.
static const char *param_algo_name(int v) { return ctxpar_algo_name((ctxpar_algo)v); }
static const char *param_layout_name(int v) { return ctxpar_layout_name((ctxpar_layout)v); }
static const char *param_mask_name(int v) { return ctxpar_mask_name((ctxpar_mask)v); }

#define DESCRIBE(name, type, kind, def, names, lo, unset, agree, agreed, flag, value, help)        \
    {#name, #type, offsetof(params_t, name), sizeof(FIELD_OF(name)), CTXPAR_KIND_##kind, names,    \
     lo, unset, agree, flag, value, help},
const ctxpar_param_field ctxpar_param_fields[CTXPAR_PARAM_COUNT] = {
    CTXPAR_PARAMS_TABLE(DESCRIBE)};
#undef DESCRIBE

int64_t ctxpar_param_int(const ctxpar_attn_params *p, const ctxpar_param_field *f) {
    const char *at = (const char *)p + f->offset;
    if (f->kind == CTXPAR_KIND_ENUM) {
        int v;
        memcpy(&v, at, sizeof v);
        return v;
    }
    int64_t v;
    memcpy(&v, at, sizeof v);
    return v;
}

float ctxpar_param_float(const ctxpar_attn_params *p, const ctxpar_param_field *f) {
    float v;
    memcpy(&v, (const char *)p + f->offset, sizeof v);
    return v;
}

void ctxpar_param_set_int(ctxpar_attn_params *p, const ctxpar_param_field *f, int64_t v) {
    char *at = (char *)p + f->offset;
    if (f->kind == CTXPAR_KIND_ENUM) {
        const int e = (int)v;
        memcpy(at, &e, sizeof e);
    } else {
        memcpy(at, &v, sizeof v);
    }
}

void ctxpar_param_set_float(ctxpar_attn_params *p, const ctxpar_param_field *f, float v) {
    memcpy((char *)p + f->offset, &v, sizeof v);
}

ctxpar_status ctxpar_attn_params_field(int index, const char **name_out, size_t *offset_out,
                                       size_t *size_out) {
    if (!name_out || !offset_out || !size_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "name_out, offset_out and size_out must be "
                                                    "set");
    if (index < 0 || index > CTXPAR_PARAM_COUNT)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "index (%d) is not in [0, %d]: ctxpar_attn_params has %d fields",
                            index, CTXPAR_PARAM_COUNT, CTXPAR_PARAM_COUNT);
    if (index == CTXPAR_PARAM_COUNT) { // past the last field: the struct's size
        *name_out = NULL;
        *offset_out = sizeof(ctxpar_attn_params);
        *size_out = 0;
        return CTXPAR_OK;
    }
    const ctxpar_param_field *f = &ctxpar_param_fields[index];
    *name_out = f->name;
    *offset_out = f->offset;
    *size_out = f->size;
    return CTXPAR_OK;
}
