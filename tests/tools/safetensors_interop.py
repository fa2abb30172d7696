#!/usr/bin/env python3
"""An independent safetensors reader and writer (the published format, with
nothing but the standard library), to check that files ZEST writes load
elsewhere and that files written elsewhere load in ZEST.

  safetensors_interop.py rewrite IN OUT   reads IN strictly, checks every
                                          tensor's bytes against its dtype and
                                          shape, and writes the same tensors
                                          to OUT in reverse order, with
                                          metadata and an unpadded header
"""
import json
import math
import struct
import sys

SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    body = data[8 + n :]
    tensors = {}
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in info.items())
            continue
        assert set(info) == {"dtype", "shape", "data_offsets"}, info
        begin, end = info["data_offsets"]
        numel = math.prod(info["shape"])
        assert end - begin == numel * SIZES[info["dtype"]], (name, info)
        spans.append((begin, end))
        tensors[name] = (info["dtype"], info["shape"], body[begin:end])
    spans.sort()
    position = 0
    for begin, end in spans:  # contiguous, no holes, no overlap
        assert begin == position, (begin, position)
        position = end
    assert position == len(body), (position, len(body))
    return tensors


def values(dtype, raw):
    if dtype == "F32":
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    if dtype == "BF16":
        return [struct.unpack("<f", b"\0\0" + raw[i : i + 2])[0] for i in range(0, len(raw), 2)]
    if dtype == "F16":
        return list(struct.unpack(f"<{len(raw) // 2}e", raw))
    raise ValueError(dtype)


def write(path, tensors):
    header = {"__metadata__": {"written_by": "safetensors_interop.py"}}
    offset = 0
    order = list(reversed(sorted(tensors)))
    for name in order:
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in order:
            f.write(tensors[name][2])


def main():
    if len(sys.argv) != 4 or sys.argv[1] != "rewrite":
        sys.exit(__doc__)
    tensors = read(sys.argv[2])
    for name, (dtype, shape, raw) in tensors.items():
        assert all(math.isfinite(v) for v in values(dtype, raw)), name
    write(sys.argv[3], tensors)
    print(f"safetensors_interop: {len(tensors)} tensors read and rewritten")


if __name__ == "__main__":
    main()
