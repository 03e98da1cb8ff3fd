"""The ctypes mirror of ctxpar_attn_params (ctxpar/_lib.py) has C's layout: each field's name,
offset and size, in order, and the struct's size, as the library reports them
(ctxpar_attn_params_field, from its parameter table)."""
import ctypes

from ctxpar import _lib


def c_attn_params_layout():
    """[(name, offset, size)] of every field, and sizeof(ctxpar_attn_params)."""
    name, offset, size = ctypes.c_char_p(), ctypes.c_size_t(), ctypes.c_size_t()
    fields = []
    while True:
        _lib.check(_lib.lib.ctxpar_attn_params_field(len(fields), ctypes.byref(name),
                                                     ctypes.byref(offset), ctypes.byref(size)))
        if name.value is None:
            return fields, offset.value
        fields.append((name.value.decode(), offset.value, size.value))


def test_attn_params_mirror_has_the_c_layout():
    fields, size = c_attn_params_layout()
    mirror = [(n, getattr(_lib.AttnParams, n).offset, getattr(_lib.AttnParams, n).size)
              for n, _ in _lib.AttnParams._fields_]
    assert mirror == fields
    assert ctypes.sizeof(_lib.AttnParams) == size


def test_layout_query_refuses_an_index_past_the_end():
    fields, _ = c_attn_params_layout()
    name, n = ctypes.c_char_p(), ctypes.c_size_t()
    status = _lib.lib.ctxpar_attn_params_field(len(fields) + 1, ctypes.byref(name),
                                               ctypes.byref(n), ctypes.byref(n))
    assert _lib.STATUS_NAMES[status] == "CTXPAR_ERR_INVALID_ARG"
