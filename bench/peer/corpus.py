# The GPT example's text in Python: examples/common/corpus.cpp's fortune
# cookies, split and batched byte for byte as it does, so that the peer
# trains on the same rows as ZEST at every step.
#
# A fortune file holds cookies separated by lines of a single '%'. The files
# of a directory are read in name order (the strfile indexes, *.dat, and the
# *.u8 links are skipped); cookie i is held out for validation when
# i % 20 == 0. Row r of step s's global batch is a window of context + 1
# bytes at an offset drawn by splitmix64 from (seed, s, r) alone.
import os

import torch

HOLD_OUT_EVERY = 20
MASK = (1 << 64) - 1


class CorpusError(Exception):
    """The corpus is missing, unreadable or too short (the message says which)."""


def _fortune_files(directory):
    files = []
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        ext = os.path.splitext(name)[1]
        if os.path.islink(path) or not os.path.isfile(path) or ext in (".dat", ".u8"):
            continue
        files.append(path)
    # std::sort of std::filesystem::path: byte order of the names here.
    return sorted(files, key=lambda p: os.fsencode(p))


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise CorpusError(f"cannot read {path}: {e.strerror}") from e


def mix(x):
    """splitmix64's finalizer, as corpus.cpp's mix()."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


class Corpus:
    def __init__(self, text):
        """From the text of the fortune files (Corpus::from_text)."""
        train, validation = [], []
        self.cookies = 0
        cookie = []

        def finish():
            if not cookie:
                return
            (validation if self.cookies % HOLD_OUT_EVERY == 0 else train).append(b"".join(cookie) + b"%\n")
            self.cookies += 1
            cookie.clear()

        lines = text.split(b"\n")
        if text.endswith(b"\n"):
            lines.pop()  # std::getline reads no empty line after the last '\n'
        for line in lines:
            if line == b"%":
                finish()
            else:
                cookie.append(line + b"\n")
        finish()
        self.train = b"".join(train)
        self.validation = b"".join(validation)
        self._tensors = {}  # each split as a uint8 tensor, made on first use

    def __getstate__(self):
        # The bytes only: a Corpus goes to each rank's process by pickle.
        return {"train": self.train, "validation": self.validation, "cookies": self.cookies, "_tensors": {}}

    @staticmethod
    def load(path):
        """A directory of fortune files or one file (Corpus::load)."""
        if not os.path.exists(path):
            raise CorpusError(
                f"no corpus at {path}: install Debian's fortune cookies (scripts/setup.sh does: apt-get install "
                "fortunes) or pass --data with a fortune file or a directory of them")
        if os.path.isdir(path):
            text = b""
            for f in _fortune_files(path):
                t = _read(f)
                if t and not t.endswith(b"\n"):
                    t += b"\n"
                text += t + b"%\n"  # a file's last cookie ends with the file
        else:
            text = _read(path)
        c = Corpus(text)
        if c.cookies < HOLD_OUT_EVERY:
            raise CorpusError(f"{path} holds {c.cookies} fortune cookies ('%'-separated texts); at least "
                              f"{HOLD_OUT_EVERY} are needed for a validation split")
        return c

    def _windows(self, split, starts, context):
        data = self._tensors.get(split)
        if data is None:
            data = self._tensors[split] = torch.frombuffer(bytearray(getattr(self, split)), dtype=torch.uint8)
        idx = torch.tensor(starts, dtype=torch.long).unsqueeze(1) + torch.arange(context + 1, dtype=torch.long)
        rows = data[idx].to(torch.long)
        return rows[:, :context].contiguous(), rows[:, 1:].contiguous()

    def train_batch(self, step, first_row, rows, context, seed):
        """Inputs and targets [rows, context] of rows [first_row, first_row + rows) of step `step`."""
        size = len(self.train)
        if size <= context:
            raise CorpusError(f"the training split has {size} bytes, not more than the context {context}")
        starts = [mix(mix(mix(seed) ^ step) ^ (first_row + r)) % (size - context) for r in range(rows)]
        return self._windows("train", starts, context)

    def validation_window_count(self, context, max_windows):
        size = len(self.validation)
        return min(max_windows, (size - 1) // context if size > context else 0)

    def validation_windows(self, first, count, context):
        """Consecutive non-overlapping windows [first, first + count) of the validation split."""
        starts = [(first + w) * context for w in range(count)]
        if count > 0 and starts[-1] + context >= len(self.validation):
            raise CorpusError(f"validation window {first + count - 1} is past the split's {len(self.validation)} bytes")
        return self._windows("validation", starts, context)
