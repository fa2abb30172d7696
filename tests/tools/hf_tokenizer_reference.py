#!/usr/bin/env python3
"""An independent reference of what Hugging Face's fast tokenizer and TRL's
SFTTrainer make of text records, written from their source without
SentencePiece: it reads tokenizer.json (the vocabulary and merges that
transformers' LlamaConverter writes from tokenizer.model) and runs the
pipeline of huggingface/tokenizers as its source runs it:

  - AddedVocabulary: the added tokens split out of the raw text,
    leftmost-longest (aho-corasick MatchKind::LeftmostLongest), lstrip and
    rstrip taking the whitespace beside a match;
  - the normalizer: none, or Sequence[Prepend("▁"), Replace(" ", "▁")]
    (LlamaConverter with legacy true), applied to each piece between added
    tokens (Prepend only to a non-empty piece);
  - the Metaspace pre-tokenizer (legacy false): " " -> "▁", then "▁"
    prepended when the piece does not start with it and (prepend_scheme
    "first") starts at byte 0 of the text;
  - BPE (models/bpe/word.rs merge_all): characters, unknown ones as their
    UTF-8 bytes <0xXX> (byte_fallback), then the adjacent pair of lowest
    merge rank merged, leftmost first, until none is left;
  - the post-processor: <s> first when add_bos_token, </s> last when
    add_eos_token (LlamaTokenizerFast.update_post_processor).

and TRL's sft_trainer.py on top: the completion (or text) gets eos_token
appended unless it ends with it; prompt-completion ids are those of prompt +
completion, the first len(ids of the prompt) labelled -100.

Usage: hf_tokenizer_reference.py TOKENIZER_JSON LAYOUT RECORDS_JSONL
  LAYOUT: first (as tokenizer.json says: Mistral v0.3) or legacy (the
  layout LlamaConverter writes for legacy true)
Prints one JSON line per record: {"input_ids": [...], "labels": [...]}.
tests/tokenizer/test_hf_tokenizer.cpp holds its output for the records
there, made with Mistral-7B-Instruct-v0.3's tokenizer.json (git blob
8d7d23136b474a3df1182ed829db19984e295ee7).
"""
import json
import sys

SPACE = "\u2581"


class Tokenizer:
    def __init__(self, path, layout):
        t = json.load(open(path, encoding="utf-8"))
        m = t["model"]
        assert m["type"] == "BPE" and m["byte_fallback"] and not m.get("ignore_merges")
        self.vocab = m["vocab"]
        self.ranks = {}
        for r, merge in enumerate(m["merges"]):
            a, b = merge.split(" ") if isinstance(merge, str) else merge
            self.ranks[(a, b)] = r
        self.added = sorted(t["added_tokens"], key=lambda a: -len(a["content"]))
        self.layout = layout
        self.bos, self.eos = self.vocab["<s>"], self.vocab["</s>"]

    def split_added(self, text):
        """[(piece, offset, id or None)] as AddedVocabulary splits text."""
        out, at, i = [], 0, 0
        while i < len(text):
            hit = next((a for a in self.added if text.startswith(a["content"], i)), None)
            if hit is None:
                i += 1
                continue
            b, e = i, i + len(hit["content"])
            if hit["lstrip"]:
                while b > at and text[b - 1].isspace():
                    b -= 1
            if hit["rstrip"]:
                while e < len(text) and text[e].isspace():
                    e += 1
            out.append((text[at:b], at, None))
            out.append((hit["content"], b, hit["id"]))
            at = i = e
        out.append((text[at:], at, None))
        return [p for p in out if p[2] is not None or p[0]]

    def bpe(self, word):
        symbols = []
        for ch in word:
            if ch in self.vocab:
                symbols.append(ch)
            else:
                symbols += ["<0x%02X>" % b for b in ch.encode("utf-8")]
        while True:
            best = None
            for k in range(len(symbols) - 1):
                r = self.ranks.get((symbols[k], symbols[k + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, k)
            if best is None:
                break
            k = best[1]
            symbols[k:k + 2] = [symbols[k] + symbols[k + 1]]
        return [self.vocab[s] for s in symbols]

    def encode(self, text, add_bos=True, add_eos=False):
        ids = [self.bos] if add_bos else []
        for piece, offset, token in self.split_added(text):
            if token is not None:
                ids.append(token)
                continue
            if self.layout == "legacy":
                word = SPACE + piece.replace(" ", SPACE)
            else:
                word = piece.replace(" ", SPACE)
                if not word.startswith(SPACE) and offset == 0:
                    word = SPACE + word
            ids += self.bpe(word)
        if add_eos:
            ids.append(self.eos)
        return ids


def trl_record(tok, record, eos_token="</s>"):
    if "prompt" in record:
        completion = record["completion"]
        if not completion.endswith(eos_token):
            completion += eos_token
        prompt_ids = tok.encode(record["prompt"])
        ids = tok.encode(record["prompt"] + completion)
        return {"input_ids": ids, "labels": [-100] * len(prompt_ids) + ids[len(prompt_ids):]}
    text = record["text"]
    if not text.endswith(eos_token):
        text += eos_token
    ids = tok.encode(text)
    return {"input_ids": ids, "labels": ids}


def main():
    tok = Tokenizer(sys.argv[1], sys.argv[2])
    for line in open(sys.argv[3], encoding="utf-8"):
        if line.strip():
            print(json.dumps(trl_record(tok, json.loads(line))))


if __name__ == "__main__":
    main()
