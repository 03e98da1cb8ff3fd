"""Prints "WIDTH HEIGHT DISTINCT_COLOURS DARKEST_SHARE" of an 8-bit RGB or RGBA PNG (what
chromium --screenshot writes), decoded here with zlib and NumPy: the browser test's proof that a
page rendered into a picture (many colours, not one flat one) without an imaging library."""
import struct
import sys
import zlib

import numpy as np


def decode(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    at, idat, head = 8, b"", None
    while at < len(data):
        (n,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + n]
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        at += 12 + n
    w, h, depth, colour, _, _, interlace = head
    assert depth == 8 and colour in (2, 6) and interlace == 0, head
    bpp = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + w * bpp)
    img = np.zeros((h, w * bpp), np.int32)
    prev = np.zeros(w * bpp, np.int32)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) & 255
        elif f == 1:  # each byte adds the reconstructed one bpp before: a running sum per channel
            cur = np.cumsum(line.reshape(w, bpp), axis=0).reshape(-1) & 255
        else:  # Average (3) and Paeth (4) depend on the byte just reconstructed: byte by byte
            cur = np.zeros_like(line)
            for x in range(w * bpp):
                a = cur[x - bpp] if x >= bpp else 0
                b, c = prev[x], prev[x - bpp] if x >= bpp else 0
                if f == 3:
                    pred = (a + b) >> 1
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                cur[x] = (line[x] + pred) & 255
        img[y], prev = cur, cur
    return img.reshape(h, w, bpp)[:, :, :3]


def main():
    img = decode(sys.argv[1])
    h, w, _ = img.shape
    packed = (img[:, :, 0] << 16) | (img[:, :, 1] << 8) | img[:, :, 2]
    colours = len(np.unique(packed))
    dark = float(np.mean(img.sum(axis=2) < 3 * 64))
    print(w, h, colours, "%.4f" % dark)


if __name__ == "__main__":
    main()
