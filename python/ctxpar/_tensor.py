"""NumPy arrays and PyTorch CPU tensors as ctxpar_tensor views, without copying when the strides
allow it (head_dim contiguous, no negative or zero strides).

Tensors are 4-D, in one of two formats:
    "bshd"  [batch, seq, heads, head_dim]  (the library's own order)
    "bhsd"  [batch, heads, seq, head_dim]  (PyTorch's scaled_dot_product_attention order)
A "bhsd" tensor is passed as the BSHD view of the same memory (its strides permuted).
"""
import numpy as np

from . import _lib

DTYPES = {"f32": 0, "f16": 1, "bf16": 2}

F64_NOTE = ("ctxpar computes float64 inputs in float32 (its CPU backend has no float64): the "
            "results carry float32 accuracy (about 1e-6 relative), so float64 tolerances such as "
            "torch.autograd.gradcheck's do not hold")


def is_float64(x):
    return str(x.dtype) in ("float64", "torch.float64")
FORMATS = ("bshd", "bhsd")


def is_torch(x):
    return type(x).__module__.startswith("torch")


def dtype_name(x):
    """"f32", "f16" or "bf16" for an array or tensor; ValueError for anything else."""
    if is_torch(x):
        name = str(x.dtype).replace("torch.", "")
    else:
        name = np.asarray(x).dtype.name
    names = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
    if name not in names:
        raise ValueError(f"dtype {name} is not supported: use float32, float16 or bfloat16")
    return names[name]


def window_pair(window):
    """(left, right) from `window`: W (query i sees keys k with i - k < W) or (W, R), a two-sided
    window that also needs k - i <= R (FlashAttention's window_size); 0 means no limit."""
    left, right = (window if isinstance(window, (tuple, list)) else (window, 0))
    left, right = int(left), int(right)
    if left < 0 or right < 0:
        raise ValueError(f"window {window}: both sides must be >= 0 (0 = no limit)")
    return left, right


def check_format(fmt):
    if fmt not in FORMATS:
        raise ValueError(f"format '{fmt}' is not one of {FORMATS}")


def bshd_shape(x, fmt):
    """(batch, seq, heads, head_dim) of a 4-D array or tensor in format fmt."""
    shape = tuple(x.shape)
    if len(shape) != 4:
        raise ValueError(f"expected a 4-D tensor ({fmt}), got shape {shape}")
    return shape if fmt == "bshd" else (shape[0], shape[2], shape[1], shape[3])


def _strides(x):
    """Strides in elements, and whether the library can use them as they are. An empty tensor
    (a rank that holds no token) gets dense strides: NumPy gives it zeros, which mean nothing."""
    if (x.numel() if is_torch(x) else x.size) == 0:
        dims, st = tuple(x.shape), [1]
        for n in reversed(dims[1:]):
            st.insert(0, st[0] * max(n, 1))
        return tuple(st), True
    if is_torch(x):
        st = tuple(x.stride())
    else:
        st = tuple(s // x.itemsize for s in x.strides)
        if any(s % x.itemsize for s in x.strides):
            return st, False
    usable = st[3] == 1 and all(s > 0 or n == 1 for s, n in zip(st, x.shape))
    return st, usable


def prepare(x, fmt, memory="cpu"):
    """x itself when the library can read it in place, else a dense copy (inputs only).
    memory: where the context's device reads tensors, "cpu" or "cuda" (torch tensors only)."""
    if is_torch(x):
        if x.device.type != memory:
            raise ValueError(f"tensor on {x.device}: this context's device takes "
                             f"{'CPU' if memory == 'cpu' else memory.upper()} tensors")
        if x.requires_grad:
            x = x.detach()
    elif not isinstance(x, np.ndarray):
        raise TypeError(f"expected a numpy.ndarray or torch.Tensor, got {type(x).__name__}")
    elif memory != "cpu":
        raise TypeError(f"the {memory} device takes torch {memory.upper()} tensors, not NumPy "
                        "arrays")
    bshd_shape(x, fmt)  # 4-D
    _, usable = _strides(x)
    if usable:
        return x
    return x.contiguous() if is_torch(x) else np.ascontiguousarray(x)


# The library wants a tensor's data set even when the tensor holds nothing (a rank with no
# tokens, S < P); torch gives an empty tensor the address 0, so such a tensor points here
# (nothing is read or written through it).
_NOTHING = np.zeros(1, dtype=np.float64)


def data_pointer(x):
    if is_torch(x):
        return x.data_ptr() if x.numel() else _NOTHING.ctypes.data
    return x.ctypes.data if x.size else _NOTHING.ctypes.data


def view(x, fmt, dtype):
    """The ctxpar_tensor over x's own memory (x must satisfy prepare()'s conditions)."""
    st, usable = _strides(x)
    if not usable:
        raise ValueError(f"strides {st} cannot be passed without a copy (head_dim must be "
                         "contiguous, strides positive)")
    t = _lib.Tensor()
    t.data = data_pointer(x)
    t.dtype = DTYPES[dtype]
    order = (0, 1, 2, 3) if fmt == "bshd" else (0, 2, 1, 3)
    for i, d in enumerate(order):
        t.shape[i] = x.shape[d]
        t.stride[i] = st[d]
    return t


def empty(like, shape_bshd, fmt, np_dtype=None):
    """A new dense tensor of the same kind (and dtype, unless np_dtype) as `like`, in fmt."""
    b, s, h, d = shape_bshd
    shape = (b, s, h, d) if fmt == "bshd" else (b, h, s, d)
    if is_torch(like):
        import torch
        return torch.empty(shape, dtype=like.dtype if np_dtype is None else torch.float32,
                           device=like.device)
    return np.empty(shape, dtype=like.dtype if np_dtype is None else np_dtype)


def empty_lse(like, batch, heads, seq):
    """LSE: F32 [batch, heads, seq], dense."""
    if is_torch(like):
        import torch
        return torch.empty((batch, heads, seq), dtype=torch.float32, device=like.device)
    return np.empty((batch, heads, seq), dtype=np.float32)


def check_f32(x, shape, name):
    """x must be a dense float32 array or tensor of this shape: the library writes it as such."""
    ok_dtype = str(x.dtype) in ("float32", "torch.float32")
    if tuple(x.shape) != tuple(shape) or not ok_dtype:
        raise ValueError(f"{name} must be float32 {list(shape)}, got {x.dtype} {tuple(x.shape)}")
    contiguous = x.is_contiguous() if is_torch(x) else x.flags.c_contiguous
    if not contiguous:
        raise ValueError(f"{name} must be densely packed (C-contiguous)")


def check_lse(lse, batch, heads, seq, name="lse"):
    check_f32(lse, (batch, heads, seq), name)


# bfloat16 for NumPy, which has no such type: the upper 16 bits of a float32, stored as uint16.
def to_bf16_bits(x):
    """float array -> bfloat16 bits (uint16), rounded to nearest even (NaN stays NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    return np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16)


def from_bf16_bits(bits):
    """bfloat16 bits (uint16) -> float32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
