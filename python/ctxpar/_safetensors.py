"""Writing NumPy arrays and PyTorch tensors (CPU or not) as one .safetensors file, the format the
ctxpar tool reads: an 8-byte little-endian header length, a JSON header naming each tensor's
dtype, shape and byte range, then the data, densely packed, little-endian (C order)."""
import json
import struct

import numpy as np

from . import _tensor as T

# float64: the tool reads it rounded to float32 (ctxpar computes in float32 at most).
_NUMPY = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "uint16": "BF16",
          "float64": "F64", "int32": "I32", "int64": "I64"}
_TORCH = {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16",
          "torch.float64": "F64", "torch.int32": "I32", "torch.int64": "I64"}


def as_bytes(name, x):
    """(safetensors dtype, shape, bytes) of one tensor. NumPy uint16 holds bfloat16 bits (the
    package's convention for NumPy, which has no bfloat16); ml_dtypes' bfloat16 works too."""
    if T.is_torch(x):
        dtype = _TORCH.get(str(x.dtype))
        if dtype is None:
            raise ValueError(f"{name} is {x.dtype}: use float32, float16, bfloat16 or float64 "
                             "(int32 or int64 for cu_seqlens)")
        import torch
        x = x.detach().to("cpu").contiguous()
        shape = tuple(x.shape)
        # NumPy cannot hold bfloat16: its bits travel as int16.
        arr = (x.view(torch.int16) if x.dtype == torch.bfloat16 else x).numpy()
    else:
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name}: expected a numpy.ndarray or torch.Tensor, got "
                            f"{type(x).__name__}")
        dtype = _NUMPY.get(x.dtype.name)
        if dtype is None:
            raise ValueError(f"{name} is {x.dtype}: use float32, float16, bfloat16 (uint16 "
                             "bits or ml_dtypes) or float64, and int32 or int64 for cu_seqlens")
        arr, shape = x, x.shape
    arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
    return dtype, [int(n) for n in shape], arr.tobytes()


def write(path, tensors):
    """Writes {name: array or tensor} to path as .safetensors."""
    header, blobs, offset = {}, [], 0
    for name, x in tensors.items():
        dtype, shape, data = as_bytes(name, x)
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)
