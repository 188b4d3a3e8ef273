"""Small transformer models in plain torch, as the families write them (a ViT, a BERT-like encoder, a GPT-2-like
decoder, a Llama-like decoder), for the memory ledger's checks against real training steps."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Attention(nn.Module):
    """Eager multi-head attention (grouped-query with ``kv_heads`` < ``heads``: K and V repeated by expand and
    reshape, as transformers' ``repeat_kv``), an optional causal mask by masked fill, dropout on the probabilities."""

    def __init__(self, h: int, heads: int, kv_heads: int | None = None, bias: bool = True, p: float = 0.1,
                 causal: bool = False):
        super().__init__()
        self.heads, self.kv, self.d = heads, kv_heads or heads, h // heads
        self.q = nn.Linear(h, h, bias=bias)
        self.k = nn.Linear(h, self.kv * self.d, bias=bias)
        self.v = nn.Linear(h, self.kv * self.d, bias=bias)
        self.o = nn.Linear(h, h, bias=bias)
        self.drop, self.causal = nn.Dropout(p), causal

    def _split(self, t: torch.Tensor, n: int) -> torch.Tensor:
        b, s, _ = t.shape
        t = t.view(b, s, n, self.d).transpose(1, 2)
        if n == self.heads:
            return t
        r = self.heads // n
        return t[:, :, None].expand(b, n, r, s, self.d).reshape(b, self.heads, s, self.d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self._split(self.q(x), self.heads), self._split(self.k(x), self.kv), self._split(self.v(x), self.kv)
        scores = q @ k.transpose(-1, -2) / self.d ** 0.5
        if self.causal:
            mask = torch.ones(s, s, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        probs = self.drop(torch.softmax(scores, dim=-1))
        return self.o((probs @ v).transpose(1, 2).reshape(b, s, h))


class Mlp(nn.Module):
    def __init__(self, h: int, i: int, act: nn.Module, p: float = 0.1):
        super().__init__()
        self.fc1, self.act, self.fc2, self.drop = nn.Linear(h, i), act, nn.Linear(i, h), nn.Dropout(p)

    def forward(self, x):
        return self.drop(self.fc2(self.act(self.fc1(x))))


class PreNormBlock(nn.Module):
    """x + attn(ln(x)); x + mlp(ln(x)): ViT's and GPT-2's block."""

    def __init__(self, h, heads, i, act, causal=False):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(h), Attention(h, heads, causal=causal)
        self.ln2, self.mlp, self.drop = nn.LayerNorm(h), Mlp(h, i, act), nn.Dropout(0.1)

    def forward(self, x):
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    """Patch embedding, a CLS token and positions, pre-norm blocks with exact GELU, the CLS token's head."""

    def __init__(self, image=16, patch=4, h=32, heads=4, i=64, layers=2, classes=10):
        super().__init__()
        n = (image // patch) ** 2
        self.embed = nn.Conv2d(3, h, patch, stride=patch)
        self.cls, self.pos = nn.Parameter(torch.randn(1, 1, h)), nn.Parameter(torch.randn(1, n + 1, h))
        self.drop = nn.Dropout(0.1)
        self.layers = nn.ModuleList(PreNormBlock(h, heads, i, nn.GELU()) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(h), nn.Linear(h, classes)

    def forward(self, images):
        x = self.embed(images).flatten(2).transpose(1, 2)
        x = self.drop(torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos)
        for block in self.layers:
            x = block(x)
        return self.head(self.norm(x)[:, 0]).sum()


class Bert(nn.Module):
    """Token, position embeddings and their layer norm, post-norm encoder layers with exact GELU, a pooler on the
    CLS token (tanh)."""

    def __init__(self, vocab=61, s=16, h=32, heads=4, i=64, layers=2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, h), nn.Embedding(s, h)
        self.ln, self.drop = nn.LayerNorm(h), nn.Dropout(0.1)
        self.layers = nn.ModuleList(nn.ModuleDict({
            "attn": Attention(h, heads), "ln1": nn.LayerNorm(h), "mlp": Mlp(h, i, nn.GELU()), "ln2": nn.LayerNorm(h),
        }) for _ in range(layers))
        self.pooler = nn.Linear(h, h)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1])
        x = self.drop(self.ln(self.tok(ids) + self.pos(positions)))
        for layer in self.layers:
            x = layer["ln1"](x + F.dropout(layer["attn"](x), 0.1, self.training))
            x = layer["ln2"](x + layer["mlp"](x))
        return torch.tanh(self.pooler(x[:, 0])).sum()


class Gpt2(nn.Module):
    """Token and position embeddings, pre-norm causal blocks with tanh GELU and biases, a final norm, the LM head
    and cross-entropy on shifted labels."""

    def __init__(self, vocab=61, s=16, h=32, heads=4, i=128, layers=2):
        super().__init__()
        self.tok, self.pos, self.drop = nn.Embedding(vocab, h), nn.Embedding(s, h), nn.Dropout(0.1)
        self.layers = nn.ModuleList(PreNormBlock(h, heads, i, nn.GELU(approximate="tanh"), causal=True)
                                    for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(h), nn.Linear(h, vocab, bias=False)

    def forward(self, ids):
        x = self.drop(self.tok(ids) + self.pos(torch.arange(ids.shape[1])))
        for block in self.layers:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


class RMSNorm(nn.Module):
    """transformers' Llama RMSNorm: in float32, x·rsqrt(mean(x²) + eps), scaled in the input's type."""

    def __init__(self, h, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(h)), eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class SwiGlu(nn.Module):
    def __init__(self, h, i):
        super().__init__()
        self.gate, self.up, self.down = (nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False),
                                         nn.Linear(i, h, bias=False))

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Llama(nn.Module):
    """Token embedding, pre-norm causal blocks (RMSNorm, grouped-query attention without dropout or biases, a
    SwiGLU MLP), a final norm and the summed logits."""

    def __init__(self, vocab=61, h=32, heads=4, kv_heads=2, i=88, layers=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, h)
        self.layers = nn.ModuleList(nn.ModuleDict({
            "norm1": RMSNorm(h), "attn": Attention(h, heads, kv_heads, bias=False, p=0.0, causal=True),
            "norm2": RMSNorm(h), "mlp": SwiGlu(h, i),
        }) for _ in range(layers))
        self.norm, self.head = RMSNorm(h), nn.Linear(h, vocab, bias=False)

    def forward(self, ids):
        x = self.tok(ids)
        for layer in self.layers:
            x = x + layer["attn"](layer["norm1"](x))
            x = x + layer["mlp"](layer["norm2"](x))
        return self.head(self.norm(x)).sum()
