"""The CUDA device from Python (Context("cuda")): libctxpar_cuda.so, loaded when asked for,
registers "cuda" with libctxpar.so; tensors are torch CUDA tensors (their data pointers), and
each call runs on torch's current CUDA stream of the tensors' GPU (ctxpar_cuda_stream_wrap), so
that it is ordered with the caller's own work. Outputs come from torch's caching allocator; the
context's workspace is the library's own (cudaMalloc'ed once and reused).
"""
import contextlib
import ctypes

from . import _lib

_cuda = None


def library():
    """libctxpar_cuda.so, or ValueError saying that this ctxpar has none."""
    global _cuda
    if _cuda is None:
        try:
            lib = _lib.load_sibling("CTXPAR_CUDA_LIBRARY", "libctxpar_cuda.so.0")
        except OSError as e:
            raise ValueError(f"device 'cuda': libctxpar_cuda.so cannot be loaded ({e}); ctxpar "
                             "installs it only when built with CUDA") from e
        lib.ctxpar_cuda_stream_wrap.restype = ctypes.c_int
        lib.ctxpar_cuda_stream_wrap.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                                ctypes.POINTER(ctypes.c_void_p)]
        lib.ctxpar_cuda_stream_release.restype = None
        lib.ctxpar_cuda_stream_release.argtypes = [ctypes.c_void_p]
        _cuda = lib
    return _cuda


@contextlib.contextmanager
def current_stream(device, tensor):
    """torch's current stream on tensor's GPU as a ctxpar_stream of `device` (released after
    the call: the stream stays torch's)."""
    import torch
    raw = torch.cuda.current_stream(tensor.device).cuda_stream
    stream = ctypes.c_void_p()
    _lib.check(library().ctxpar_cuda_stream_wrap(device, raw, ctypes.byref(stream)))
    try:
        yield stream
    finally:
        library().ctxpar_cuda_stream_release(stream)
