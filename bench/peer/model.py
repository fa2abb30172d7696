# examples/gpt/model.h's GPT in Python torch, module for module: token and
# position embeddings, pre-norm blocks (causal self-attention with plain
# matmuls and softmax, then an MLP with tanh GELU), a final LayerNorm and a
# head tied to the token embedding or not; no dropout. The parameters have
# the same names, shapes and registration order, and are initialized as
# GptImpl does: in that order from one CPU generator seeded with `seed`, so
# that the same seed gives the same values as the C++ model.
import math

import torch
import torch.nn.functional as F
from torch import nn


class Config:
    def __init__(self, vocab=256, context=64, layers=4, heads=4, d_model=128, tied_head=True):
        self.vocab, self.context, self.layers, self.heads, self.d_model = vocab, context, layers, heads, d_model
        self.tied_head = tied_head

    def validate(self):
        """Raises ValueError naming the field (gpt::Config::validate)."""
        for name in ("vocab", "context", "layers", "heads", "d_model"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} is {getattr(self, name)}; it must be at least 1")
        if self.d_model % self.heads != 0:
            raise ValueError(f"d_model {self.d_model} does not divide into {self.heads} heads; "
                             "pick d_model a multiple of heads")

    def parameters(self):
        """gpt::Config::parameters(): every parameter, a tied head once."""
        d = self.d_model
        block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (4 * d * d + 4 * d) + (4 * d * d + d)
        return (self.vocab * d + self.context * d + self.layers * block + 2 * d +
                (0 if self.tied_head else self.vocab * d))

    def __str__(self):
        return (f"{self.layers} layers, {self.heads} heads, d_model {self.d_model}, context {self.context}, "
                f"vocab {self.vocab}, {'tied' if self.tied_head else 'untied'} head")


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c.d_model, 3 * c.d_model)
        self.c_proj = nn.Linear(c.d_model, c.d_model)
        self.heads = c.heads

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.heads
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, hd).transpose(1, 2) for t in (q, k, v))
        att = q.matmul(k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = torch.softmax(att.masked_fill(future, float("-inf")), dim=-1)
        return self.c_proj(att.matmul(v).transpose(1, 2).contiguous().view(B, T, C))


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c.d_model, 4 * c.d_model)
        self.c_proj = nn.Linear(4 * c.d_model, c.d_model)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.d_model)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c.d_model)
        self.mlp = Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, c, seed):
        super().__init__()
        c.validate()
        self.config = c
        self.wte = nn.Embedding(c.vocab, c.d_model)
        self.wpe = nn.Embedding(c.context, c.d_model)
        self.h = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.lm_head = None if c.tied_head else nn.Linear(c.d_model, c.vocab, bias=False)
        gen = torch.Generator().manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2.0 * c.layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith(".bias"):
                    p.zero_()
                elif "ln_" in name:
                    p.fill_(1.0)
                elif name.endswith("c_proj.weight"):
                    p.normal_(0.0, residual_std, generator=gen)
                else:
                    p.normal_(0.0, 0.02, generator=gen)

    def forward(self, tokens):
        T = tokens.size(1)
        if T > self.config.context:
            raise ValueError(f"a sequence of {T} tokens is longer than the context {self.config.context}")
        x = self.wte(tokens) + self.wpe(torch.arange(T, dtype=torch.long, device=tokens.device))
        for block in self.h:
            x = block(x)
        y = self.ln_f(x)
        return y.matmul(self.wte.weight.t()) if self.lm_head is None else self.lm_head(y)


def lm_loss(logits, targets):
    """Mean cross-entropy of logits [B, T, vocab] against targets [B, T]."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
