"""A small Llama-style decoder whose attention reads and writes a paged KV pool."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from device_pool import DeviceKVPool, dtype_from_name
from hicache.config.cache import ModelConfig
from hicache.engine.attention import causal_attention
from hicache.engine.invariant import pad_rows, silu
from hicache.engine.mla import MlaWeights, expand

WaitLayer = Callable[[int], None]


@dataclass(frozen=True)
class ModelSpec:
    """Shape and seed of a ``TinyLlama``. ``num_layers``, ``kv_heads``,
    ``head_dim`` and ``dtype`` (the KV dtype) must match the KV pool the model
    runs on. Weights and activations use ``compute_dtype`` (default: ``dtype``);
    on CPUs without half-precision GEMM, float32 compute with a float16 KV
    cache is orders of magnitude faster.

    ``attention="mla"`` makes a DeepSeek-style latent-attention model (see
    ``hicache.engine.mla``): the pool keeps ``kv_lora_rank + rope_dim`` values
    per token and layer, ``head_dim`` is each head's non-rotary query/key and
    value width, and ``kv_heads`` is unused (set it to 1)."""

    num_layers: int = 2
    num_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    hidden: int = 64
    intermediate: int = 128
    vocab: int = 256
    dtype: str = "float32"
    seed: int = 0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_positions: int = 8192
    attention_block: int = 64  # keys per online-softmax step
    compute_dtype: str | None = None
    attention: str = "mha"
    kv_lora_rank: int = 0
    rope_dim: int = 0

    def __post_init__(self) -> None:
        if self.attention not in ("mha", "mla"):
            raise ValueError(f"attention must be 'mha' or 'mla', got {self.attention!r}")
        if self.attention == "mla" and (self.kv_lora_rank < 1 or self.rope_dim < 2):
            raise ValueError("MLA needs kv_lora_rank >= 1 and rope_dim >= 2")
        if self.rope_dim % 2:
            raise ValueError("rope_dim must be even (rotary embeddings)")
        dtype_from_name(self.dtype)
        dtype_from_name(self.compute_dtype or self.dtype)
        positive = (self.num_layers, self.num_heads, self.kv_heads, self.head_dim, self.hidden)
        if min(positive) < 1 or min(self.intermediate, self.vocab, self.max_positions) < 1:
            raise ValueError("model dimensions must be >= 1")
        if self.num_heads % self.kv_heads:
            raise ValueError("num_heads must be a multiple of kv_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (rotary embeddings)")
        if self.attention_block < 1:
            raise ValueError("attention_block must be >= 1")

    def describe(self) -> str:
        """One line for a person: layers, heads, widths, dtypes."""
        if self.attention == "mla":
            kv = f"MLA latent {self.kv_lora_rank} + rope {self.rope_dim}"
        else:
            kv = f"{self.kv_heads} KV heads of {self.head_dim}"
        compute = self.compute_dtype or self.dtype
        dtypes = f"{self.dtype} KV" + (f", {compute} compute" if compute != self.dtype else "")
        return (
            f"{self.num_layers} layers, {self.num_heads} heads ({kv}), hidden {self.hidden}, "
            f"vocab {self.vocab}, {dtypes}"
        )

    @classmethod
    def for_cache(
        cls, model: ModelConfig, hidden: int, vocab: int, device: torch.device, seed: int = 0
    ) -> ModelSpec:
        """A spec whose KV geometry is the cache's ``[model]`` section: as many
        query heads as ``hidden`` holds (a multiple of ``kv_heads``), an MLP twice
        as wide, and float32 compute for a half-precision KV cache on CPU."""
        mla = model.attention == "mla"
        kv_heads = 1 if mla else model.kv_heads
        heads = max(hidden // model.head_dim // kv_heads, 1) * kv_heads
        half_on_cpu = device.type == "cpu" and model.dtype != "float32"
        return cls(
            num_layers=model.num_layers,
            num_heads=heads,
            kv_heads=kv_heads,
            head_dim=model.head_dim,
            hidden=hidden,
            intermediate=hidden * 2,
            vocab=vocab,
            dtype=model.dtype,
            seed=seed,
            compute_dtype="float32" if half_on_cpu else None,
            attention=model.attention,
            kv_lora_rank=model.kv_lora_rank if mla else 0,
            rope_dim=model.rope_dim if mla else 0,
        )

    @property
    def rotary_dim(self) -> int:
        """Width of the rotated part of a query/key head."""
        return self.rope_dim if self.attention == "mla" else self.head_dim

    def check_pool(self, pool: DeviceKVPool) -> None:
        """ValueError unless ``pool`` stores this model's KV."""
        shape = pool.shape
        dtype = dtype_from_name(self.dtype)
        if self.attention == "mla":
            ours = (self.num_layers, self.kv_lora_rank, self.rope_dim, dtype)
            theirs = (shape.num_layers, shape.kv_lora_rank, shape.rope_dim, shape.dtype)
        else:
            ours = (self.num_layers, self.kv_heads, self.head_dim, dtype)
            theirs = (shape.num_layers, shape.kv_heads, shape.head_dim, shape.dtype)
        if shape.attention != self.attention or ours != theirs:
            raise ValueError(f"KV pool {shape} does not fit model {self}")


class Segment(NamedTuple):
    """One request's share of a forward pass: ``tokens`` at positions
    ``start .. start + len(tokens)``; ``slots`` are the device slots of the whole
    context (``start + len(tokens)`` of them), the last ``len(tokens)`` receive
    the new KV."""

    tokens: torch.Tensor
    start: int
    slots: torch.Tensor


class _Batch(NamedTuple):
    """What every layer of one forward pass needs besides its weights. Every
    tensor is on the model's device, uploaded once per pass: indexing device
    buffers with CPU slots would sync the host with the GPU in every layer."""

    segments: tuple[Segment, ...]
    new_slots: torch.Tensor  # where the new tokens' KV goes, segment after segment
    contexts: tuple[torch.Tensor, ...]  # each segment's context slots
    cos: torch.Tensor  # rotary tables at the new tokens' positions, [rows, 1, head_dim / 2]
    sin: torch.Tensor
    pool: DeviceKVPool
    wait_layer: WaitLayer


@dataclass(frozen=True)
class _Layer:
    attn_norm: torch.Tensor
    wqkv: torch.Tensor | None  # MHA: [hidden, (heads + 2 * kv_heads) * head_dim]
    mla: MlaWeights | None  # MLA: latent attention weights
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    w_gate_up: torch.Tensor  # [hidden, 2 * intermediate]
    w_down: torch.Tensor


class TinyLlama:
    """Embedding, RMSNorm, rotary embeddings, grouped-query attention, SwiGLU,
    LM head; random weights drawn from ``spec.seed``. Immutable after
    construction; ``forward`` mutates only the KV pool it is given."""

    def __init__(self, spec: ModelSpec, device: str | torch.device = "cpu") -> None:
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = dtype_from_name(spec.compute_dtype or spec.dtype)
        gen = torch.Generator().manual_seed(spec.seed)
        self._embed = self._weight(gen, (spec.vocab, spec.hidden), 1.0)
        self._layers = tuple(self._layer(gen) for _ in range(spec.num_layers))
        self._final_norm = self._norm(gen)
        self._lm_head = self._weight(gen, (spec.hidden, spec.vocab), spec.hidden**-0.5)
        rot = spec.rotary_dim
        half = torch.arange(0, rot, 2, dtype=torch.float64) / rot
        angles = torch.outer(
            torch.arange(spec.max_positions, dtype=torch.float64), spec.rope_theta**-half
        )
        self._cos = angles.cos().float().to(self.device)
        self._sin = angles.sin().float().to(self.device)

    def _weight(self, gen: torch.Generator, shape: tuple[int, int], std: float) -> torch.Tensor:
        w = torch.randn(shape, generator=gen) * std
        return w.to(device=self.device, dtype=self.dtype)

    def _norm(self, gen: torch.Generator) -> torch.Tensor:
        w = 1.0 + 0.1 * torch.randn(self.spec.hidden, generator=gen)
        return w.to(device=self.device, dtype=self.dtype)

    def _layer(self, gen: torch.Generator) -> _Layer:
        s = self.spec
        attn_norm = self._norm(gen)
        wqkv, mla = None, None
        if s.attention == "mla":
            mla = self._mla_weights(gen)
        else:
            qkv = (s.num_heads + 2 * s.kv_heads) * s.head_dim
            wqkv = self._weight(gen, (s.hidden, qkv), s.hidden**-0.5)
        return _Layer(
            attn_norm=attn_norm,
            wqkv=wqkv,
            mla=mla,
            wo=self._weight(
                gen, (s.num_heads * s.head_dim, s.hidden), (s.num_heads * s.head_dim) ** -0.5
            ),
            mlp_norm=self._norm(gen),
            w_gate_up=self._weight(gen, (s.hidden, 2 * s.intermediate), s.hidden**-0.5),
            w_down=self._weight(gen, (s.intermediate, s.hidden), s.intermediate**-0.5),
        )

    def _mla_weights(self, gen: torch.Generator) -> MlaWeights:
        s = self.spec
        rank, heads = s.kv_lora_rank, s.num_heads
        return MlaWeights(
            wq=self._weight(gen, (s.hidden, heads * (s.head_dim + s.rope_dim)), s.hidden**-0.5),
            wkv_a=self._weight(gen, (s.hidden, rank + s.rope_dim), s.hidden**-0.5),
            kv_norm=(1.0 + 0.1 * torch.randn(rank, generator=gen)).to(self.device, self.dtype),
            w_uk=self._weight(gen, (rank, heads * s.head_dim), rank**-0.5),
            w_uv=self._weight(gen, (rank, heads * s.head_dim), rank**-0.5),
        )

    @torch.inference_mode()
    def forward(
        self, segments: Sequence[Segment], pool: DeviceKVPool, wait_layer: WaitLayer
    ) -> torch.Tensor:
        """Run the new tokens of every segment; write their KV into ``pool``
        (layer by layer, at the segment's last slots) and return the float32
        logits of each segment's last token, ``[len(segments), vocab]``.
        ``wait_layer(i)`` is called before layer i reads KV from the pool."""
        ids, ends, batch = self._batch(segments, pool, wait_layer)
        x = pad_rows(self._embed[ids])
        for i, layer in enumerate(self._layers):
            x = self._layer_forward(i, layer, x, batch)
        last = pad_rows(x[ends])
        logits = self._rms_norm(last, self._final_norm) @ self._lm_head
        return logits[: len(segments)].float()

    def _batch(
        self, segments: Sequence[Segment], pool: DeviceKVPool, wait: WaitLayer
    ) -> tuple[torch.Tensor, torch.Tensor, _Batch]:
        """Token ids, last-row indices and the per-pass state, all on the device."""
        if not segments:
            raise ValueError("forward needs at least one segment")
        for seg in segments:
            if len(seg.tokens) < 1 or seg.slots.numel() != seg.start + len(seg.tokens):
                raise ValueError("a segment needs tokens and one slot per context token")
        if max(s.start + len(s.tokens) for s in segments) > self.spec.max_positions:
            raise ValueError(f"position beyond max_positions={self.spec.max_positions}")
        positions = torch.cat([torch.arange(s.start, s.start + len(s.tokens)) for s in segments])
        ends = torch.tensor([len(s.tokens) for s in segments]).cumsum(0) - 1
        parts = [
            torch.cat([s.tokens for s in segments]),
            positions,
            ends,
            *(s.slots[s.start :] for s in segments),
            *(s.slots for s in segments),
        ]
        ids, positions, ends, *slots = self._upload(parts)
        new_slots = torch.cat(slots[: len(segments)])
        pos = pad_rows(positions)  # padding rows sit at position 0
        cos, sin = self._cos[pos][:, None, :], self._sin[pos][:, None, :]
        state = _Batch(
            tuple(segments), new_slots, tuple(slots[len(segments) :]), cos, sin, pool, wait
        )
        return ids, ends, state

    def _upload(self, parts: list[torch.Tensor]) -> list[torch.Tensor]:
        """int64 ``parts`` on the model's device, in one copy (from pinned
        memory on CUDA, so that the host does not wait for the GPU)."""
        flat = torch.cat([p.to(torch.int64).reshape(-1) for p in parts])
        if self.device.type == "cuda":
            flat = flat.pin_memory().to(self.device, non_blocking=True)
        else:
            flat = flat.to(self.device)
        return list(flat.split([p.numel() for p in parts]))

    def _layer_forward(self, index: int, layer: _Layer, x: torch.Tensor, b: _Batch) -> torch.Tensor:
        h = self._rms_norm(x, layer.attn_norm)
        if layer.mla is not None:
            attn = self._mla_attention(index, layer.mla, h, b)
        else:
            assert layer.wqkv is not None
            attn = self._mha_attention(index, layer.wqkv, h, b)
        x = x + attn @ layer.wo
        gate, up = (self._rms_norm(x, layer.mlp_norm) @ layer.w_gate_up).chunk(2, dim=1)
        return x + (silu(gate) * up) @ layer.w_down

    def _mha_attention(
        self, index: int, wqkv: torch.Tensor, h: torch.Tensor, b: _Batch
    ) -> torch.Tensor:
        s = self.spec
        n = len(b.new_slots)
        q, k, v = (h @ wqkv).split(
            [s.num_heads * s.head_dim, *[s.kv_heads * s.head_dim] * 2], dim=1
        )
        q = _rotate(q.reshape(-1, s.num_heads, s.head_dim), b.cos, b.sin).to(self.dtype)
        k = _rotate(k.reshape(-1, s.kv_heads, s.head_dim), b.cos, b.sin)
        b.pool.set_kv(index, b.new_slots, k[:n], v.reshape(-1, s.kv_heads, s.head_dim)[:n])
        b.wait_layer(index)
        k_buf, v_buf = b.pool.layer_buffers(index)
        return self._attend(q, b, lambda ctx: (k_buf[ctx], v_buf[ctx]))

    def _mla_attention(self, index: int, w: MlaWeights, h: torch.Tensor, b: _Batch) -> torch.Tensor:
        s = self.spec
        n, rank = len(b.new_slots), s.kv_lora_rank
        q = (h @ w.wq).reshape(-1, s.num_heads, s.head_dim + s.rope_dim)
        q_nope, q_pe = q.split([s.head_dim, s.rope_dim], dim=-1)
        q = torch.cat([q_nope.float(), _rotate(q_pe, b.cos, b.sin)], dim=-1).to(self.dtype)
        c_kv, k_pe = (h @ w.wkv_a).split([rank, s.rope_dim], dim=1)
        c_kv = self._rms_norm(c_kv, w.kv_norm).float()
        k_pe = _rotate(k_pe[:, None, :], b.cos, b.sin)[:, 0]
        b.pool.set_kv(index, b.new_slots, torch.cat([c_kv, k_pe], dim=1)[:n, None, :])
        b.wait_layer(index)
        (latent,) = b.pool.layer_buffers(index)
        return self._attend(q, b, lambda ctx: expand(latent[ctx], w, s.num_heads, s.head_dim, rank))

    def _attend(
        self,
        q: torch.Tensor,
        b: _Batch,
        kv_of: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Paged attention: each segment gathers its context's K/V by (device) slot."""
        outs, row = [], 0
        for seg, ctx in zip(b.segments, b.contexts, strict=True):
            n = len(seg.tokens)
            k, v = kv_of(ctx)
            out = causal_attention(q[row : row + n], k, v, seg.start, self.spec.attention_block)
            outs.append(out.reshape(n, -1))
            row += n
        return pad_rows(torch.cat(outs).to(self.dtype))

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        scale = torch.sqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.spec.norm_eps)
        return (xf / scale).to(self.dtype) * weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half convention) in float32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
