"""Full attention over the whole sequence in float64 (NumPy), forward and backward: the reference
that simulate()'s results are compared with. Same conventions as the library: a query at i sees
keys j <= i (causal), i - j < W and j - i <= R (window W or (W, R); 0 = no limit), in the same
document (cu_seqlens, empty documents allowed); query head
h uses K/V head h // (Hq // Hkv); a fully masked row has out 0, lse -inf and no gradient."""
import numpy as np

from . import _tensor as T


def _float64(x, fmt, bf16_bits=False):
    """A global tensor as float64 [B, S, H, D]."""
    if T.is_torch(x):
        x = x.detach().to("cpu").double().numpy()
    x = np.asarray(x)
    if x.dtype == np.uint16 and bf16_bits:
        x = T.from_bf16_bits(x)
    x = x.astype(np.float64)
    return x if fmt == "bshd" else x.transpose(0, 2, 1, 3)


def visible(seq, mask="causal", window=0, cu_seqlens=None):
    """[S, S] bool: whether query i sees key j."""
    i = np.arange(seq)[:, None]
    j = np.arange(seq)[None, :]
    vis = np.ones((seq, seq), dtype=bool)
    if mask == "causal":
        vis &= j <= i
    elif mask != "none":
        raise ValueError(f"mask '{mask}' is not 'none' or 'causal'")
    left, right = T.window_pair(window)
    if left > 0:
        vis &= i - j < left
    if right > 0:
        vis &= j - i <= right
    if cu_seqlens is not None:
        doc = np.searchsorted(np.asarray(cu_seqlens)[1:-1], np.arange(seq), side="right")
        vis &= doc[:, None] == doc[None, :]
    return vis


def oracle(q, k, v, dout=None, *, mask="causal", window=0, cu_seqlens=None, scale=None,
           format="bshd", bf16_bits=False):
    """{"out", "lse"} (+ "dq", "dk", "dv" with dout) in float64, global order, in `format`
    (lse: [B, Hq, S]). Inputs: NumPy arrays or torch tensors of any float dtype (bf16_bits: a
    uint16 array holds bfloat16 bits)."""
    T.check_format(format)
    q, k, v = (_float64(x, format, bf16_bits) for x in (q, k, v))
    B, S, Hq, D = q.shape
    Hk = k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[1] != S or k.shape[3] != D or Hq % Hk:
        raise ValueError(f"shapes q {q.shape}, k {k.shape}, v {v.shape} do not fit")
    scale = 1.0 / np.sqrt(D) if scale is None else float(scale)
    vis = visible(S, mask, window, cu_seqlens)
    group = Hq // Hk
    out = np.zeros_like(q)
    lse = np.full((B, Hq, S), -np.inf)
    go = _float64(dout, format, bf16_bits) if dout is not None else None
    grads = [np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)] if go is not None else None
    for b in range(B):
        for h in range(Hq):
            hk = h // group
            s = np.where(vis, scale * q[b, :, h] @ k[b, :, hk].T, -np.inf)
            m = s.max(axis=1, keepdims=True)
            m = np.where(np.isfinite(m), m, 0.0)
            e = np.exp(s - m)
            z = e.sum(axis=1, keepdims=True)
            p = np.divide(e, z, out=np.zeros_like(e), where=z > 0)
            lse[b, h] = np.where(z[:, 0] > 0, m[:, 0] + np.log(np.maximum(z[:, 0], 1e-300)),
                                 -np.inf)
            out[b, :, h] = p @ v[b, :, hk]
            if grads is not None:
                dp = go[b, :, h] @ v[b, :, hk].T
                ds = p * (dp - (go[b, :, h] * out[b, :, h]).sum(axis=1, keepdims=True))
                grads[0][b, :, h] = scale * ds @ k[b, :, hk]
                grads[1][b, :, hk] += scale * ds.T @ q[b, :, h]
                grads[2][b, :, hk] += p.T @ go[b, :, h]
    back = (lambda x: x) if format == "bshd" else (lambda x: x.transpose(0, 2, 1, 3))
    res = {"out": back(out), "lse": lse}
    if grads is not None:
        res.update(dq=back(grads[0]), dk=back(grads[1]), dv=back(grads[2]))
    return res
