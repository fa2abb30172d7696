#!/usr/bin/env python3
"""A Llama checkpoint directory as Hugging Face's save_pretrained writes it
(config.json; model.safetensors, or shards of at most --max-shard-size bytes
of tensor data with model.safetensors.index.json), written with nothing but
the standard library, and a strict comparison of two such directories.

  hf_llama_writer.py write DIR [--dtype bf16|fp16|fp32] [--max-shard-size N]
                     [--layers L] [--hidden H] [--intermediate I] [--vocab V]
                     [--nan NAME:INDEX]...
  hf_llama_writer.py compare DIR1 DIR2   same tensor names, dtypes, shapes and
                                         bytes, whatever the sharding

Element i of tensor NAME is (n - 127) / 64 with n = (h + 7919 i) mod 255,
h = the name's bytes folded as h = (31 h + byte) mod 2^32, taken mod 255:
exact in bf16, fp16 and fp32, so a reader can check every bit.
"""
import argparse
import json
import math
import os
import struct
import sys

SIZES = {"F32": 4, "F16": 2, "BF16": 2}
DTYPES = {"bf16": "BF16", "fp16": "F16", "fp32": "F32"}


def name_hash(name):
    h = 0
    for b in name.encode("utf-8"):
        h = (31 * h + b) % (1 << 32)
    return h % 255


def value(name_h, i):
    return ((name_h + 7919 * i) % 255 - 127) / 64.0


def encode(dtype, values):
    if dtype == "F32":
        return struct.pack(f"<{len(values)}f", *values)
    if dtype == "F16":
        return struct.pack(f"<{len(values)}e", *values)
    # bf16: the upper half of the fp32 bits (every value here is exact).
    raw = struct.pack(f"<{len(values)}f", *values)
    return b"".join(raw[i + 2 : i + 4] for i in range(0, len(raw), 4))


def llama_tensors(layers, hidden, intermediate, vocab):
    """LlamaForCausalLM's state dict, in module order."""
    out = [("model.embed_tokens.weight", [vocab, hidden])]
    for l in range(layers):
        p = f"model.layers.{l}."
        out += [
            (p + "self_attn.q_proj.weight", [hidden, hidden]),
            (p + "self_attn.k_proj.weight", [hidden, hidden]),
            (p + "self_attn.v_proj.weight", [hidden, hidden]),
            (p + "self_attn.o_proj.weight", [hidden, hidden]),
            (p + "mlp.gate_proj.weight", [intermediate, hidden]),
            (p + "mlp.up_proj.weight", [intermediate, hidden]),
            (p + "mlp.down_proj.weight", [hidden, intermediate]),
            (p + "input_layernorm.weight", [hidden]),
            (p + "post_attention_layernorm.weight", [hidden]),
        ]
    out += [("model.norm.weight", [hidden]), ("lm_head.weight", [vocab, hidden])]
    return out


def write_safetensors(path, tensors):
    """tensors: [(name, dtype, shape, bytes)], written in sorted name order as
    the safetensors library does, the header padded with spaces to 8 bytes."""
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, raw in sorted(tensors):
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, raw in sorted(tensors):
            f.write(raw)


def shards(sizes, max_shard_size):
    """huggingface_hub's split_state_dict_into_shards_factory."""
    out, current, current_size = [], [], 0
    for key, size in sizes:
        if size > max_shard_size:
            out.append([key])
            continue
        if current_size + size > max_shard_size:
            out.append(current)
            current, current_size = [], 0
        current.append(key)
        current_size += size
    if current:
        out.append(current)
    return out


def write(args):
    dtype = DTYPES[args.dtype]
    nan = {}
    for spec in args.nan:
        name, index = spec.rsplit(":", 1)
        nan.setdefault(name, []).append(int(index))
    tensors = {}
    for name, shape in llama_tensors(args.layers, args.hidden, args.intermediate, args.vocab):
        h = name_hash(name)
        values = [value(h, i) for i in range(math.prod(shape))]
        for i in nan.get(name, []):
            values[i] = float("nan")
        tensors[name] = (dtype, shape, encode(dtype, values))
    os.makedirs(args.dir, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": args.hidden,
        "intermediate_size": args.intermediate, "num_hidden_layers": args.layers, "vocab_size": args.vocab,
        "num_attention_heads": 4, "num_key_value_heads": 4, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "torch_dtype": {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[dtype],
    }
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    split = shards([(name, len(t[2])) for name, t in tensors.items()], args.max_shard_size)
    if len(split) == 1:
        write_safetensors(os.path.join(args.dir, "model.safetensors"), [(n, *tensors[n]) for n in split[0]])
        return
    weight_map = {}
    for i, keys in enumerate(split):
        file = f"model-{i + 1:05d}-of-{len(split):05d}.safetensors"
        write_safetensors(os.path.join(args.dir, file), [(n, *tensors[n]) for n in keys])
        weight_map.update({n: file for n in keys})
    index = {"metadata": {"total_size": sum(len(t[2]) for t in tensors.values())}, "weight_map": weight_map}
    with open(os.path.join(args.dir, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")


def read_dir(path):
    """name -> (dtype, shape, bytes), every file checked strictly."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(os.path.join(path, "model.safetensors")):
        files = {"model.safetensors"}
        weight_map = None
    else:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = set(weight_map.values())
    out = {}
    for file in sorted(files):
        with open(os.path.join(path, file), "rb") as f:
            data = f.read()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
        body = data[8 + n :]
        position = 0
        for name, info in sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                                 key=lambda kv: kv[1]["data_offsets"]):
            begin, end = info["data_offsets"]
            assert begin == position and end - begin == math.prod(info["shape"]) * SIZES[info["dtype"]], name
            position = end
            assert name not in out, f"{name} twice"
            assert weight_map is None or weight_map[name] == file, name
            out[name] = (info["dtype"], info["shape"], body[begin:end])
        assert position == len(body), file
    assert weight_map is None or set(weight_map) == set(out)
    return out


def compare(a, b):
    ta, tb = read_dir(a), read_dir(b)
    if set(ta) != set(tb):
        sys.exit(f"names differ: only in {a}: {sorted(set(ta) - set(tb))}; only in {b}: {sorted(set(tb) - set(ta))}")
    for name in sorted(ta):
        if ta[name][:2] != tb[name][:2]:
            sys.exit(f"{name}: {ta[name][:2]} in {a}, {tb[name][:2]} in {b}")
        if ta[name][2] != tb[name][2]:
            sys.exit(f"{name}: the bytes differ")
    print(f"{len(ta)} tensors, the same names, dtypes, shapes and bytes")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("dir")
    w.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    w.add_argument("--max-shard-size", type=int, default=5_000_000_000)
    w.add_argument("--layers", type=int, default=2)
    w.add_argument("--hidden", type=int, default=24)
    w.add_argument("--intermediate", type=int, default=40)
    w.add_argument("--vocab", type=int, default=67)
    w.add_argument("--nan", action="append", default=[])
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = p.parse_args()
    if args.cmd == "write":
        write(args)
    else:
        compare(args.a, args.b)


if __name__ == "__main__":
    main()
