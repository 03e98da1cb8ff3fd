"""Loading libctxpar.so and declaring the C functions the package calls (ctypes).

ctypes.CDLL releases the GIL around every foreign call, so ranks running as Python threads
really run in parallel inside the library, and block there on each other without deadlock.
"""
import ctypes
import os
import pathlib

c_int, c_int64, c_void_p, c_char_p = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p


class Tensor(ctypes.Structure):
    """ctxpar_tensor: a [batch, seq, heads, head_dim] view, strides in elements."""
    _fields_ = [("data", c_void_p), ("dtype", c_int), ("shape", c_int64 * 4),
                ("stride", c_int64 * 4)]


class AttnParams(ctypes.Structure):
    """ctxpar_attn_params (fields only appended; struct_size tells the library which); its
    layout is held to the library's (ctxpar_attn_params_field) by tests/test_layout.py."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("algo", c_int), ("layout", c_int),
                ("mask", c_int), ("window_left", c_int64),
                ("cu_seqlens", ctypes.POINTER(ctypes.c_int32)), ("num_docs", c_int64),
                ("softmax_scale", ctypes.c_float), ("seq_len_global", c_int64),
                ("window_right", c_int64), ("sinks", c_void_p), ("dsinks", c_void_p),
                ("softcap", ctypes.c_float), ("assignment", ctypes.POINTER(ctypes.c_int32)),
                ("ulysses", c_int64), ("cu_seqlens_rows", c_int64), ("lse_lo", c_void_p),
                ("q_len", c_int64), ("reproducible", c_int64)]


class CpuOptions(ctypes.Structure):
    """The first fields of ctxpar_cpu_options (struct_size says which we set)."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("num_threads", c_int)]


class ContextOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("verify_transfers", c_int)]


STATUS_NAMES = {0: "CTXPAR_OK", -1: "CTXPAR_ERR_INVALID_ARG", -2: "CTXPAR_ERR_INVALID_USAGE",
                -3: "CTXPAR_ERR_NOT_SUPPORTED", -4: "CTXPAR_ERR_OUT_OF_MEMORY",
                -5: "CTXPAR_ERR_DEVICE", -6: "CTXPAR_ERR_COMM", -7: "CTXPAR_ERR_REMOTE",
                -8: "CTXPAR_ERR_TIMEOUT", -9: "CTXPAR_ERR_INTERNAL"}


class CtxparError(RuntimeError):
    """A ctxpar call failed: .status (the C status, e.g. -1), .name ("CTXPAR_ERR_INVALID_ARG")
    and .message (ctxpar_last_error() of the failing call)."""

    def __init__(self, status, name, message):
        super().__init__(f"{name}: {message}")
        self.status, self.name, self.message = status, name, message


def _candidates():
    """Where libctxpar.so is looked for, in order."""
    env = os.environ.get("CTXPAR_LIBRARY")
    if env:
        return [env]
    here = pathlib.Path(__file__).resolve().parent
    # Installed: PREFIX/lib/python3/site-packages/ctxpar -> PREFIX/lib/libctxpar.so.0
    return [str(here.parents[2] / "libctxpar.so.0"), "libctxpar.so.0"]


def _load():
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError("ctxpar: cannot load libctxpar.so (set CTXPAR_LIBRARY to its path); tried "
                      + "; ".join(errors))


lib, library_path = _load()

_P = ctypes.POINTER
_SIGNATURES = {
    "ctxpar_status_string": (c_char_p, [c_int]),
    "ctxpar_last_error": (c_char_p, []),
    "ctxpar_version": (c_char_p, []),
    "ctxpar_algo_name": (c_char_p, [c_int]),
    "ctxpar_device_create_cpu": (c_int, [_P(CpuOptions), _P(c_void_p)]),
    "ctxpar_device_destroy": (None, [c_void_p]),
    "ctxpar_device_names": (c_int, [_P(ctypes.c_char_p), _P(ctypes.c_char_p), c_int]),
    "ctxpar_comm_names": (c_int, [_P(ctypes.c_char_p), _P(ctypes.c_char_p), c_int]),
    "ctxpar_device_create_by_name": (c_int, [ctypes.c_char_p, c_int, _P(c_void_p)]),
    "ctxpar_device_host_memory": (c_int, [c_void_p]),
    "ctxpar_local_group_create": (c_int, [c_int, _P(c_void_p)]),
    "ctxpar_local_group_destroy": (None, [c_void_p]),
    "ctxpar_comm_create_local": (c_int, [c_void_p, c_int, c_void_p, _P(c_void_p)]),
    "ctxpar_comm_destroy": (None, [c_void_p]),
    "ctxpar_comm_rank": (c_int, [c_void_p]),
    "ctxpar_comm_size": (c_int, [c_void_p]),
    "ctxpar_comm_set_timeout": (c_int, [c_void_p, ctypes.c_double]),
    "ctxpar_context_create": (c_int, [c_void_p, c_void_p, _P(ContextOptions), _P(c_void_p)]),
    "ctxpar_context_destroy": (None, [c_void_p]),
    "ctxpar_attn_fwd": (c_int, [c_void_p, _P(AttnParams), _P(Tensor), _P(Tensor), _P(Tensor),
                                _P(Tensor), c_void_p, c_void_p]),
    "ctxpar_attn_bwd": (c_int, [c_void_p, _P(AttnParams), _P(Tensor), _P(Tensor), _P(Tensor),
                                _P(Tensor), c_void_p, _P(Tensor), _P(Tensor), _P(Tensor),
                                _P(Tensor), c_void_p]),
    "ctxpar_positions": (c_int, [c_int, c_int64, c_int, c_int, _P(c_int64)]),
    "ctxpar_positions_assigned": (c_int, [c_int, c_void_p, c_int64, c_int, c_int,
                                          _P(c_int64)]),
    "ctxpar_shard_count": (c_int, [c_int, c_void_p, c_int64, c_int, c_int, _P(c_int64)]),
    "ctxpar_attn_params_field": (c_int, [c_int, _P(c_char_p), _P(ctypes.c_size_t),
                                         _P(ctypes.c_size_t)]),
}
for _name, (_res, _args) in _SIGNATURES.items():
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = _res, _args


def check(status):
    """Raises CtxparError for a failed status; call on the thread that made the C call (the
    message is thread-local)."""
    if status != 0:
        message = lib.ctxpar_last_error().decode(errors="replace")
        name = lib.ctxpar_status_string(status).decode()
        raise CtxparError(status, name, message)


def version():
    """The C library's version, "MAJOR.MINOR.PATCH"."""
    return lib.ctxpar_version().decode()


def load_sibling(env, soname):
    """A backend's or comm's library: from $env, else next to libctxpar.so, else through the
    loader's search path (RTLD_GLOBAL: it registers itself with libctxpar.so when loaded)."""
    path = os.environ.get(env)
    if not path:
        sibling = pathlib.Path(library_path).with_name(soname)
        path = str(sibling) if sibling.exists() else soname
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


_mpi = None


def mpi_library():
    """libctxpar_mpi.so (the MPI comm), loaded on first use (load_sibling)."""
    global _mpi
    if _mpi is None:
        _mpi = load_sibling("CTXPAR_MPI_LIBRARY", "libctxpar_mpi.so.0")
        _mpi.ctxpar_comm_create_mpi.restype = c_int
        _mpi.ctxpar_comm_create_mpi.argtypes = [c_void_p, _P(c_void_p)]
    return _mpi
