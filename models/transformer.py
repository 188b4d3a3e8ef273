"""BERT-base, GPT-2 small and ViT-B/16 in plain PyTorch (no transformers, no timm, no weights).

All three are stacks of the same :class:`Block`: multi-head self-attention and a two-layer GELU MLP, each in a
residual branch with a LayerNorm, after the branch (post-LN, BERT) or before it (pre-LN, GPT-2 and ViT).

- :func:`bert`: token + learned position + token-type embeddings, LayerNorm, ``layers`` post-LN blocks, and the
  pooler (``tanh(Linear(h, h))`` of the first token). Defaults are BERT-base: 12 layers, hidden 768, 12 heads,
  FFN 3072, vocabulary 30522, 128 tokens. Outputs ``(last_hidden_state, pooler_output)``.
- :func:`gpt2`: token + learned position embeddings, ``layers`` pre-LN causal blocks, a final LayerNorm and the
  LM head tied to the token embedding (no bias). Defaults are GPT-2 small: 12 layers, 768, 12 heads, FFN 3072,
  vocabulary 50257, context 1024. Outputs the logits.
- :func:`vit`: 16x16/16 patch convolution, class token, learned position embeddings, ``layers`` pre-LN blocks,
  final LayerNorm and a linear head on the class token. Defaults are ViT-B/16 at 224x224 (197 tokens).

Every linear layer has a bias except GPT-2's LM head. ``attention`` picks how the attention core is written:
``"sdpa"`` calls :func:`torch.nn.functional.scaled_dot_product_attention`; ``"matmul"`` spells it out as
``softmax(Q Kᵀ / √d [+ causal mask]) V`` with two ``torch.matmul`` calls. Both do the same products
(2·B·heads·S·S·d FLOPs each). The sequence length is fixed by the example input at export time.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ATTENTION_KINDS", "Bert", "Block", "GPT2", "SelfAttention", "ViT", "bert", "gpt2", "vit"]

ATTENTION_KINDS = ("sdpa", "matmul")


class SelfAttention(nn.Module):
    """Multi-head self-attention: Q, K, V projections (with bias), the attention core, an output projection."""

    def __init__(self, hidden: int, heads: int, *, causal: bool = False, attention: str = "sdpa") -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not a multiple of the head count {heads}")
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention {attention!r}; choose one of {', '.join(ATTENTION_KINDS)}")
        self.heads, self.head_dim = heads, hidden // heads
        self.causal, self.attention = causal, attention
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        # (B, S, h) -> (B, heads, S, d); only the last dim is split, so the export pins neither B nor S
        return x.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        if self.attention == "sdpa":
            context = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
            if self.causal:
                s = scores.shape[-1]
                future = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
                scores = scores.masked_fill(future, float("-inf"))
            context = torch.matmul(scores.softmax(dim=-1), v)
        return self.out(context.transpose(1, 2).flatten(2))


class Block(nn.Module):
    """Self-attention and a GELU MLP (hidden -> ffn -> hidden), residual, post-LN or pre-LN."""

    def __init__(
        self,
        hidden: int,
        heads: int,
        ffn: int,
        *,
        pre_norm: bool,
        causal: bool = False,
        gelu: str = "none",
        attention: str = "sdpa",
        eps: float = 1e-12,
    ) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.attn = SelfAttention(hidden, heads, causal=causal, attention=attention)
        self.norm1 = nn.LayerNorm(hidden, eps=eps)
        self.fc1 = nn.Linear(hidden, ffn)
        self.act = nn.GELU(approximate=gelu)
        self.fc2 = nn.Linear(ffn, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=eps)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.mlp(x))


class Bert(nn.Module):
    """BERT encoder with its pooler (the ``BertModel`` of the original release)."""

    def __init__(
        self,
        layers: int = 12,
        hidden: int = 768,
        heads: int = 12,
        ffn: int = 3072,
        vocab: int = 30522,
        max_positions: int = 512,
        type_vocab: int = 2,
        attention: str = "sdpa",
    ) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab, hidden)
        self.embedding_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.blocks = nn.ModuleList(
            Block(hidden, heads, ffn, pre_norm=False, attention=attention) for _ in range(layers)
        )
        self.pooler = nn.Linear(hidden, hidden)

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seq = input_ids.shape[1]
        # every token of segment 0 (token_type_ids all zero); positions 0 .. S-1
        positions = self.position_embeddings.weight[:seq]
        x = self.word_embeddings(input_ids) + positions + self.token_type_embeddings.weight[0]
        x = self.embedding_norm(x)
        for block in self.blocks:
            x = block(x)
        return x, torch.tanh(self.pooler(x[:, 0]))


class GPT2(nn.Module):
    """GPT-2 decoder (pre-LN, causal) with the LM head tied to the token embedding."""

    def __init__(
        self,
        layers: int = 12,
        hidden: int = 768,
        heads: int = 12,
        ffn: int | None = None,
        vocab: int = 50257,
        context: int = 1024,
        attention: str = "sdpa",
    ) -> None:
        super().__init__()
        ffn = 4 * hidden if ffn is None else ffn
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(context, hidden)
        self.blocks = nn.ModuleList(
            Block(hidden, heads, ffn, pre_norm=True, causal=True, gelu="tanh", attention=attention, eps=1e-5)
            for _ in range(layers)
        )
        self.ln_f = nn.LayerNorm(hidden, eps=1e-5)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(input_ids) + self.wpe.weight[: input_ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class ViT(nn.Module):
    """Vision Transformer: patch convolution, class token, position embeddings, pre-LN blocks, linear head."""

    def __init__(
        self,
        layers: int = 12,
        hidden: int = 768,
        heads: int = 12,
        ffn: int = 3072,
        image_size: int = 224,
        patch: int = 16,
        num_classes: int = 1000,
        in_channels: int = 3,
        attention: str = "sdpa",
    ) -> None:
        super().__init__()
        if image_size % patch:
            raise ValueError(f"image size {image_size} is not a multiple of the patch size {patch}")
        tokens = (image_size // patch) ** 2 + 1
        self.patch_embed = nn.Conv2d(in_channels, hidden, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, hidden))
        self.pos_embed = nn.Parameter(torch.randn(1, tokens, hidden) * 0.02)
        self.blocks = nn.ModuleList(
            Block(hidden, heads, ffn, pre_norm=True, attention=attention, eps=1e-6) for _ in range(layers)
        )
        self.norm = nn.LayerNorm(hidden, eps=1e-6)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, P, h)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


def bert(layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072, vocab: int = 30522,
         attention: str = "sdpa") -> Bert:
    """BERT-base by default; random weights. Feed it ``input_ids`` of shape (B, S), S <= 512.

    Examples
    --------
    >>> sum(p.numel() for p in bert().parameters())
    109482240
    """
    return Bert(layers, hidden, heads, ffn, vocab, attention=attention)


def gpt2(layers: int = 12, hidden: int = 768, heads: int = 12, vocab: int = 50257, context: int = 1024,
         attention: str = "sdpa") -> GPT2:
    """GPT-2 small by default (124 M parameters, LM head tied); random weights. ``input_ids``: (B, S <= context).

    Examples
    --------
    >>> sum(p.numel() for p in gpt2().parameters())
    124439808
    """
    return GPT2(layers, hidden, heads, vocab=vocab, context=context, attention=attention)


def vit(layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072, image_size: int = 224,
        patch: int = 16, num_classes: int = 1000, attention: str = "sdpa") -> ViT:
    """ViT-B/16 by default; random weights. Feed it images of shape (B, 3, image_size, image_size).

    Examples
    --------
    >>> sum(p.numel() for p in vit().parameters())
    86567656
    """
    return ViT(layers, hidden, heads, ffn, image_size, patch, num_classes, attention=attention)
