#!/usr/bin/env python3
"""Tokenized datasets as Megatron-LM and Hugging Face write them, with
nothing but the standard library, and the rows a packing collator makes of
them: the independent side of tests/data/test_token_data.cpp.

  token_data_writer.py megatron PREFIX --dtype uint16|int32 [--split-sentences] [--vocab V]
      PREFIX.bin and PREFIX.idx as megatron/core/datasets/indexed_dataset.py's
      IndexedDatasetBuilder writes them (add_item per sequence, end_document
      per document), and PREFIX.expected.json: each document's tokens.
  token_data_writer.py jsonl PATH [--vocab V] [--records N]
      records as datasets' to_json writes a tokenized, instruction-masked,
      partly padded dataset (input_ids, labels, attention_mask), and
      PATH.expected.json: each record's tokens and labels once padding is
      dropped.
  token_data_writer.py rows EXPECTED MAX_SEQ_LEN [--packing]
      the rows of those documents in file order, packed greedily without
      splitting (or one to a row), as Hugging Face's
      DataCollatorWithFlattening flattens them: input_ids concatenated,
      position_ids restarting at 0 per document, labels with -100 at each
      document's first token; then shifted as LlamaForCausalLM's loss shifts
      them (the target of position t is the label at t + 1, -100 past a
      document's end). Printed as JSON: a list of rows, each
      {tokens, targets, positions, documents}, padded with 0 / -100 / 0 / -1.

Token t of sequence k of document d is (7919 d + 31 k + 13 t + 1) mod VOCAB
with VOCAB 50000 (uint16) or 150000 (int32), or --vocab; a JSONL record's
tokens likewise with VOCAB 32000 or --vocab.
"""
import argparse
import json
import struct
import sys

HEADER = b"MMIDIDX\x00\x00"
CODES = {"uint16": (8, "H", 2), "int32": (4, "i", 4)}


def megatron(args):
    code, fmt, size = CODES[args.dtype]
    vocab = args.vocab or (50000 if args.dtype == "uint16" else 150000)
    # 37 documents of 0 to 300 tokens, a few of them several sequences.
    docs = []
    for d in range(37):
        n_seq = 1 + (d % 3 if args.split_sentences else 0)
        seqs = []
        for k in range(n_seq):
            length = (d * 53 + k * 17) % 301 if d != 5 else 0
            seqs.append([(7919 * d + 31 * k + 13 * t + 1) % vocab for t in range(length)])
        docs.append(seqs)
    lengths, pointers, doc_idx = [], [], [0]
    with open(args.path + ".bin", "wb") as b:
        ptr = 0
        for seqs in docs:
            for s in seqs:
                b.write(struct.pack("<%d%s" % (len(s), fmt), *s))
                lengths.append(len(s))
                pointers.append(ptr)
                ptr += len(s) * size
            doc_idx.append(len(lengths))
    with open(args.path + ".idx", "wb") as f:
        f.write(HEADER)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(struct.pack("<%di" % len(lengths), *lengths))
        f.write(struct.pack("<%dq" % len(pointers), *pointers))
        f.write(struct.pack("<%dq" % len(doc_idx), *doc_idx))
    with open(args.path + ".expected.json", "w") as f:
        json.dump([{"tokens": [t for s in seqs for t in s]} for seqs in docs], f)


def jsonl(args):
    vocab = args.vocab or 32000
    expected = []
    with open(args.path, "w") as f:
        for r in range(args.records):
            prompt = 3 + r % 5
            length = 5 + (r * 37) % 90
            ids = [(7919 * r + 13 * t + 1) % vocab for t in range(length)]
            labels = [-100] * prompt + ids[prompt:]
            record = {"input_ids": ids, "labels": labels}
            if r % 4 == 1:  # right padding, as padding="max_length" adds
                pad = 3 + r % 4
                record = {"input_ids": ids + [0] * pad, "labels": labels + [-100] * pad,
                          "attention_mask": [1] * length + [0] * pad}
            elif r % 4 == 2:  # left padding
                record = {"input_ids": [2] * 2 + ids, "labels": [-100] * 2 + labels,
                          "attention_mask": [0] * 2 + [1] * length}
            elif r % 4 == 3:  # no labels: every token trained on
                record = {"input_ids": ids, "attention_mask": [1] * length, "text": "ignored"}
                labels = ids
            f.write(json.dumps(record) + "\n")
            if r == 10:
                f.write("\n")  # a blank line, skipped
            expected.append({"tokens": ids, "labels": labels})
    with open(args.path + ".expected.json", "w") as f:
        json.dump(expected, f)


def rows(args):
    with open(args.expected) as f:
        docs = json.load(f)
    L = args.max_seq_len
    groups, current, room = [], [], 0
    for d in docs:
        ids = d["tokens"][:L]
        if not ids:
            continue
        labels = (d.get("labels") or d["tokens"])[:L]
        if not args.packing or len(ids) > room:
            current = []
            groups.append(current)
            room = L
        current.append((ids, labels))
        room -= len(ids)
    out = []
    for g in groups:
        # DataCollatorWithFlattening: labels of each sequence with its first
        # set to -100 (the separator), position_ids from 0.
        input_ids, labels, positions, documents = [], [], [], []
        for i, (ids, lab) in enumerate(g):
            input_ids += ids
            labels += [-100] + lab[1:]
            positions += list(range(len(ids)))
            documents += [i] * len(ids)
        # The model's shift: position t predicts labels[t + 1]; the last
        # position of the row predicts nothing.
        targets = labels[1:] + [-100]
        pad = L - len(input_ids)
        out.append({"tokens": input_ids + [0] * pad, "targets": targets + [-100] * pad,
                    "positions": positions + [0] * pad, "documents": documents + [-1] * pad})
    json.dump(out, sys.stdout)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("megatron")
    m.add_argument("path")
    m.add_argument("--dtype", choices=sorted(CODES), required=True)
    m.add_argument("--split-sentences", action="store_true")
    m.add_argument("--vocab", type=int, default=0)
    j = sub.add_parser("jsonl")
    j.add_argument("path")
    j.add_argument("--vocab", type=int, default=0)
    j.add_argument("--records", type=int, default=23)
    r = sub.add_parser("rows")
    r.add_argument("expected")
    r.add_argument("max_seq_len", type=int)
    r.add_argument("--packing", action="store_true")
    args = p.parse_args()
    {"megatron": megatron, "jsonl": jsonl, "rows": rows}[args.cmd](args)


if __name__ == "__main__":
    main()
