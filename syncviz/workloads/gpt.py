"""A small GPT (nanoGPT-style) for demos and tests: real transformer parameter shapes, so the
buckets DDP builds look like those of a real language model.

Presets name parameter shapes; sequence length and batch size are separate so GPT-2-sized models
still train (slowly) on CPU ranks."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    """Shape of the model."""
    n_layer: int = 2        # transformer blocks
    n_head: int = 2         # attention heads per block
    n_embd: int = 64        # embedding width
    vocab_size: int = 512   # tokens
    block_size: int = 128   # longest sequence (size of the position table)


PRESETS: dict[str, GPTConfig] = {
    # ~0.2M params: tests (a 2-rank step takes milliseconds)
    "tiny": GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=512, block_size=128),
    # ~3M params: quick demos with a handful of buckets
    "mini": GPTConfig(n_layer=4, n_head=4, n_embd=192, vocab_size=4096, block_size=256),
    # GPT-2 124M ("small") and 355M ("medium") shapes
    "small": GPTConfig(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, block_size=1024),
    "medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024, vocab_size=50257, block_size=1024),
}


class Block(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.n_embd)
        self.attn = nn.Linear(c.n_embd, 3 * c.n_embd)
        self.proj = nn.Linear(c.n_embd, c.n_embd)
        self.ln_2 = nn.LayerNorm(c.n_embd)
        self.fc = nn.Linear(c.n_embd, 4 * c.n_embd)
        self.fc_proj = nn.Linear(4 * c.n_embd, c.n_embd)
        self.n_head = c.n_head

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(self._init)
        self.lm_head.weight = self.wte.weight   # tied as in GPT-2 (so "small" is 124M parameters)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def synthetic_batch(config: GPTConfig, batch: int, seq: int, *, seed: int, device="cpu"):
    """Random tokens (inputs, next-token targets), reproducible per (seed)."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, config.vocab_size, (batch, seq + 1), generator=g)
    return data[:, :-1].to(device), data[:, 1:].to(device)


def preset(name: str) -> GPTConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name]


