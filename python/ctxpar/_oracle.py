"""Full attention over the whole sequence in float64 (NumPy), forward and backward: the reference
that simulate()'s results are compared with. Same conventions as the library: a query at i sees
keys j <= i (causal), i - j < W and j - i <= R (window W or (W, R); 0 = no limit), in the same
document (cu_seqlens [docs+1], or [B, docs+1] for documents per batch row; empty documents
allowed); query head h uses K/V head h // (Hq // Hkv); v may have its own head_dim (MLA).
Soft-capping C: the score is C tanh(scale q.k / C). Sinks sigma_h (score units) add e^sigma_h to
every row's denominator once and carry no value. A fully masked row has out 0 and no gradient;
its lse is -inf, or sigma_h with sinks (docs/numerics.md)."""
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
    """[S, S] bool: whether query i sees key j (cu_seqlens: one row's [docs+1] boundaries)."""
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


def _row_documents(cu_seqlens, batch):
    """One [docs+1] boundary list (or None) per batch row."""
    if cu_seqlens is None:
        return [None] * batch
    cu = np.asarray(cu_seqlens)
    if cu.ndim == 1:
        return [cu] * batch
    if cu.ndim != 2 or cu.shape[0] != batch:
        raise ValueError(f"cu_seqlens shape {cu.shape}: expected [docs+1] or [{batch}, docs+1]")
    return list(cu)


def oracle(q, k, v, dout=None, *, mask="causal", window=0, cu_seqlens=None, scale=None,
           softcap=0.0, sinks=None, format="bshd", bf16_bits=False):
    """{"out", "lse"} (+ "dq", "dk", "dv" with dout, and "dsinks" [Hq] with sinks too) in
    float64, global order, in `format` (lse: [B, Hq, S]). Inputs: NumPy arrays or torch tensors
    of any float dtype (bf16_bits: a uint16 array holds bfloat16 bits)."""
    T.check_format(format)
    q, k, v = (_float64(x, format, bf16_bits) for x in (q, k, v))
    B, S, Hq, D = q.shape
    Hk, Dv = k.shape[2], v.shape[3]
    if k.shape != (B, S, Hk, D) or v.shape[:3] != k.shape[:3] or Hq % Hk:
        raise ValueError(f"shapes q {q.shape}, k {k.shape}, v {v.shape} do not fit")
    scale = 1.0 / np.sqrt(D) if scale is None else float(scale)
    cap = float(softcap)
    sink = None if sinks is None else np.asarray(sinks, dtype=np.float64).reshape(-1)
    if sink is not None and sink.shape != (Hq,):
        raise ValueError(f"sinks has {sink.size} values, expected one per query head ({Hq})")
    docs = _row_documents(cu_seqlens, B)
    group = Hq // Hk
    out = np.zeros((B, S, Hq, Dv))
    lse = np.full((B, Hq, S), -np.inf)
    go = _float64(dout, format, bf16_bits) if dout is not None else None
    grads = [np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)] if go is not None else None
    dsinks = np.zeros(Hq) if sink is not None else None
    for b in range(B):
        vis = visible(S, mask, window, docs[b])
        for h in range(Hq):
            hk = h // group
            x = scale * q[b, :, h] @ k[b, :, hk].T
            t = np.tanh(x / cap) if cap > 0 else None
            s = np.where(vis, cap * t if cap > 0 else x, -np.inf)
            m = s.max(axis=1)
            if sink is not None:
                m = np.maximum(m, sink[h])
            m = np.where(np.isfinite(m), m, 0.0)
            e = np.exp(s - m[:, None])
            z = e.sum(axis=1) + (np.exp(sink[h] - m) if sink is not None else 0.0)
            p = np.divide(e, z[:, None], out=np.zeros_like(e), where=z[:, None] > 0)
            lse[b, h] = np.where(z > 0, m + np.log(np.maximum(z, 1e-300)), -np.inf)
            out[b, :, h] = p @ v[b, :, hk]
            if grads is not None:
                delta = (go[b, :, h] * out[b, :, h]).sum(axis=1)
                dp = go[b, :, h] @ v[b, :, hk].T
                ds = p * (dp - delta[:, None])
                if cap > 0:
                    ds = ds * (1.0 - t * t)
                grads[0][b, :, h] = scale * ds @ k[b, :, hk]
                grads[1][b, :, hk] += scale * ds.T @ q[b, :, h]
                grads[2][b, :, hk] += p.T @ go[b, :, h]
                if dsinks is not None:
                    dsinks[h] -= float((np.exp(sink[h] - lse[b, h]) * delta).sum())
    back = (lambda x: x) if format == "bshd" else (lambda x: x.transpose(0, 2, 1, 3))
    res = {"out": back(out), "lse": lse}
    if grads is not None:
        res.update(dq=back(grads[0]), dk=back(grads[1]), dv=back(grads[2]))
        if dsinks is not None:
            res["dsinks"] = dsinks
    return res
