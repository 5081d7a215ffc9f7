"""CharTransformer: embeddings -> n_layer configurable Blocks -> optional final norm -> LM head.

One `Block` class covers every architecture toggle of `ModelConfig`; the toggles are fields,
not subclasses, and they combine freely. How a block wires one sublayer f (attention or FFN)
with its norm, for residual scale s:

    norm_position   residual on              residual off
    pre             x + s*f(norm(x))         s*f(norm(x))
    post            norm(x + s*f(x))         norm(s*f(x))
    none            x + s*f(x)               s*f(x)

With the residual off the norm stays where `norm_position` puts it; only the skip path goes.

Each block owns named identity modules, "taps", in `block.taps` (a ModuleDict), so probes
can hook activations by module name (`blocks.0.taps.resid_mid`) without touching forward.
A tap exists only where its activation does; see `block_tap_names`.

One model or K of them: every module also runs with its parameters stacked, (K, ...),
and inputs (K, B, T) (`LitReplicas` calls the model with `functional_call` on the stacked
parameters). Replica i's tokens then meet only replica i's weights: a stacked Linear is one
batched matrix product, a stacked norm scales by its replica's gains, and attention folds
the replicas into the batch, so the fused attention kernels run on a stack as they run on
one model. With ordinary (unstacked) parameters every forward is exactly what it was.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from blockviz.core.config_model import ModelConfig
from blockviz.core.spec import block_tap_names


class ModelInputError(ValueError):
    """An input the model cannot take (too long a sequence, a bad sampling setting)."""


class NonFiniteLogits(ArithmeticError):
    """Sampling met NaN or infinite logits: the weights or the stream blew up."""


def per_replica(gain: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A norm's gain (dim,) as it is, or a stack of K gains (K, dim) shaped to scale
    x (K, ..., dim) replica by replica."""
    if gain.dim() == 1:
        return gain
    return gain.view(gain.shape[0], *([1] * (x.dim() - 2)), gain.shape[-1])


class Linear(nn.Linear):
    """nn.Linear, which also takes K stacked weights (K, out, in) and biases (K, out) with
    inputs (K, ..., in): one batched matrix product, replica by replica."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if weight.dim() == 2:
            return F.linear(x, weight, self.bias)
        flat = x.reshape(x.shape[0], -1, x.shape[-1])  # (K, N, in)
        if self.bias is None:
            out = torch.bmm(flat, weight.transpose(1, 2))  # (K, N, out)
        else:
            out = torch.baddbmm(self.bias.unsqueeze(1), flat, weight.transpose(1, 2))
        return out.view(*x.shape[:-1], weight.shape[1])  # (K, ..., out)


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm, which also takes K stacked gains and biases (K, dim)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is None or self.weight.dim() == 1:
            return super().forward(x)
        out = F.layer_norm(x, self.normalized_shape, None, None, self.eps)
        out = out * per_replica(self.weight, out)
        return out if self.bias is None else out + per_replica(self.bias, out)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) * weight over the last dim: LayerNorm without centring or bias.

    Computed in float32 whatever the input dtype, as autocast does for LayerNorm, so a bf16
    stream (residual off) is normalised as precisely as a float32 one.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise (..., dim) by its root mean square, then scale per channel."""
        x_float = x.float()
        inv_rms = torch.rsqrt(x_float.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return (x_float * inv_rms * per_replica(self.weight, x)).type_as(x)  # (..., dim)


class BatchNorm(nn.Module):
    """BatchNorm over the channels of a (batch, time, channel) stream, then a per-channel
    weight (and a bias when `bias`).

    In training its mean and variance come from the whole batch: every position of every
    sequence, so position t's statistics include later positions (a leak of the future
    that the causal mask does not stop). In eval mode (validation, generation) it uses the
    running statistics gathered in training and looks at nothing else in the batch.
    Computed in float32, as RMSNorm is.
    """

    def __init__(self, dim: int, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(dim, eps=eps, affine=False)
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise (..., dim) with batch (train) or running (eval) statistics."""
        flat = x.float().reshape(-1, x.shape[-1])  # (B·T, dim)
        out = self.bn(flat).reshape(x.shape) * self.weight  # (..., dim)
        if self.bias is not None:
            out = out + self.bias
        return out.type_as(x)


def make_norm(cfg: ModelConfig) -> nn.Module:
    """A LayerNorm (bias per cfg.bias), an RMSNorm (weight only) or a BatchNorm (weight,
    bias per cfg.bias; running statistics as buffers) of width d_model."""
    if cfg.norm_type == "rmsnorm":
        return RMSNorm(cfg.d_model, eps=1e-5)
    if cfg.norm_type == "batchnorm":
        return BatchNorm(cfg.d_model, bias=cfg.bias, eps=1e-5)
    return LayerNorm(cfg.d_model, eps=1e-5, bias=cfg.bias)


def make_head_norm(cfg: ModelConfig) -> nn.Module:
    """The norm qk_norm puts on each head's queries or keys: width head_dim, an RMSNorm under
    norm_type rmsnorm, else a LayerNorm (bias per cfg.bias), batchnorm included: statistics
    over the batch inside attention are not what the qk-norm papers use."""
    # k_norm's bias b adds the same q·b to every logit in a query's row, which the softmax
    # ignores: like the k slice of the qkv bias, it gets no gradient (round-off only).
    if cfg.norm_type == "rmsnorm":
        return RMSNorm(cfg.head_dim, eps=1e-5)
    return LayerNorm(cfg.head_dim, eps=1e-5, bias=cfg.bias)


class AttentionMaps(dict[int, torch.Tensor]):
    """{layer: attention weights (B, n_head, T, T)}; in `max_logits` {layer: (n_head,)}, each
    head's largest pre-softmax logit q·k/sqrt(hs) over the causal pairs of the batch, and in
    `max_abs_logits` {layer: (n_head,)} its largest |logit| (a large negative logit too).
    Of K stacked replicas: (K, B, n_head, T, T) and (K, n_head), each replica's own."""

    def __init__(self) -> None:
        super().__init__()
        self.max_logits: dict[int, torch.Tensor] = {}
        self.max_abs_logits: dict[int, torch.Tensor] = {}


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused qkv projection.

    Fast path: `scaled_dot_product_attention` (flash / memory-efficient kernels where the
    device has them). When `weights_sink` is set (by `capture_attention`), the weights are
    computed explicitly and stored there under this layer's index instead, with each
    head's largest logit.
    """

    def __init__(self, cfg: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.qkv = Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        # qk_norm (Dehghani et al. 2023; Wortsman et al. 2023): one norm for the queries and
        # one for the keys, each shared by the heads, applied before either attention path.
        self.q_norm = make_head_norm(cfg) if cfg.qk_norm else None
        self.k_norm = make_head_norm(cfg) if cfg.qk_norm else None
        self.proj = Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.attn_drop = nn.Dropout(cfg.dropout)  # explicit path only; SDPA takes dropout_p
        self.resid_drop = nn.Dropout(cfg.dropout)
        self.weights_sink: AttentionMaps | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over the causal prefix; (B, T, d_model) in and out, or (K, B, T, d_model)
        for K stacked replicas, folded into one batch of K·B sequences for the kernel."""
        *lead, T, C = x.shape  # lead: (B,), or (K, B) under replicas
        head_dim = C // self.n_head
        q, k, v = self.qkv(x).split(C, dim=-1)  # 3 x (..., T, C)
        q = q.view(*lead, T, self.n_head, head_dim).transpose(-3, -2)  # (..., nh, T, hs)
        k = k.view(*lead, T, self.n_head, head_dim).transpose(-3, -2)  # (..., nh, T, hs)
        v = v.view(*lead, T, self.n_head, head_dim).transpose(-3, -2)  # (..., nh, T, hs)
        if self.q_norm is not None:
            # Unit-scale q and k give dot products of order sqrt(hs), so the 1/sqrt(hs)
            # scale stays; how sharp attention gets is then up to the norms' gains, not
            # to how large the qkv projection has grown.
            q, k = self.q_norm(q), self.k_norm(k)  # (..., nh, T, hs) each
        # (K·B, nh, T, hs): a view (one model's q, k, v are passed as they are)
        q, k, v = (t.reshape(-1, *t.shape[-3:]) for t in (q, k, v))
        if self.weights_sink is None:
            dropout_p = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        else:
            y = self._explicit_attention(q, k, v, self.weights_sink, lead)  # (K·B, nh, T, hs)
        y = y.view(*lead, *y.shape[-3:]).transpose(-3, -2)  # (..., T, nh, hs)
        y = y.contiguous().view(*lead, T, C)  # (..., T, C): heads side by side
        return self.resid_drop(self.proj(y))  # (..., T, C)

    def _explicit_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        sink: AttentionMaps,
        lead: list[int],
    ) -> torch.Tensor:
        """softmax(q k^T / sqrt(hs), causal) v, storing the weights and max logits in `sink`,
        each replica's apart."""
        T = q.size(-2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (K·B, nh, T, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()  # (T, T)
        # Attention-logit growth (Dehghani et al. 2023) shows in the largest logits a head
        # computes, of either sign; the masked pairs never count (0 for |logit|, -inf here).
        # Each replica's over its batch, queries and keys: (*lead, nh, T, T) -> (*lead[:-1], nh)
        unfolded, over = (*lead, -1, T, T), (-4, -2, -1)
        magnitude = scores.detach().float().abs().masked_fill(~causal, 0.0).view(unfolded)
        sink.max_abs_logits[self.layer_index] = magnitude.amax(dim=over)
        scores = scores.masked_fill(~causal, float("-inf"))
        sink.max_logits[self.layer_index] = scores.detach().float().view(unfolded).amax(dim=over)
        # Softmax in float32 so the maps sum to 1 under bf16 autocast too.
        weights = scores.float().softmax(dim=-1)  # (K·B, nh, T, T)
        sink[self.layer_index] = weights.detach().view(unfolded)
        return self.attn_drop(weights.to(v.dtype)) @ v  # (K·B, nh, T, hs)


class FeedForward(nn.Module):
    """Position-wise MLP: fc_in -> activation (or SwiGLU gate) -> fc_out.

    For swiglu, fc_in is fused: d_model -> 2*d_ff, split into gate and value, and the hidden
    is silu(gate) * value. d_ff stays ffn_mult*d_model, so a swiglu FFN has 1.5x the weights
    of a plain one (three d_model x d_ff matrices instead of two).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gated = cfg.activation == "swiglu"
        in_width = 2 * cfg.d_ff if self.gated else cfg.d_ff
        self.fc_in = Linear(cfg.d_model, in_width, bias=cfg.bias)
        self.act = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "swiglu": nn.SiLU}[
            cfg.activation
        ]()
        self.fc_out = Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, hidden_tap: nn.Module) -> torch.Tensor:
        """(B, T, d_model) in and out; the hidden activations pass through `hidden_tap`."""
        hidden = self.fc_in(x)  # (B, T, d_ff), or (B, T, 2*d_ff) when gated
        if self.gated:
            gate, value = hidden.chunk(2, dim=-1)  # 2 x (B, T, d_ff)
            hidden = self.act(gate) * value  # (B, T, d_ff)
        else:
            hidden = self.act(hidden)  # (B, T, d_ff)
        hidden = hidden_tap(hidden)
        return self.drop(self.fc_out(hidden))  # (B, T, d_model)


class Block(nn.Module):
    """One transformer block: [norm1] attention, [norm2] FFN, wired per the config.

    A switched-off sublayer (attention or ffn) is None together with its norm, so it owns
    no parameters; norm1 / norm2 are also None when norm_position is "none".
    """

    def __init__(self, cfg: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.norm_position = cfg.norm_position
        self.residual = cfg.residual
        self.residual_scale = cfg.residual_scale
        has_norm = cfg.norm_position != "none"
        self.norm1 = make_norm(cfg) if cfg.attention and has_norm else None
        self.attn = CausalSelfAttention(cfg, layer_index) if cfg.attention else None
        self.norm2 = make_norm(cfg) if cfg.ffn and has_norm else None
        self.ffn = FeedForward(cfg) if cfg.ffn else None
        self.taps = nn.ModuleDict({name: nn.Identity() for name in block_tap_names(cfg)})
        self._has_resid_mid = "resid_mid" in self.taps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d_model) in and out."""
        taps = self.taps
        x = taps["resid_pre"](x)  # (B, T, C)
        if self.attn is not None:
            x = self._sublayer(x, self.norm1, "norm1_out", self._attention_branch)
            if self._has_resid_mid:
                x = taps["resid_mid"](x)  # (B, T, C)
        if self.ffn is not None:
            x = self._sublayer(x, self.norm2, "norm2_out", self._ffn_branch)
        return taps["resid_post"](x)  # (B, T, C)

    def _attention_branch(self, h: torch.Tensor) -> torch.Tensor:
        return self.taps["attn_out"](self.attn(h))  # (B, T, C)

    def _ffn_branch(self, h: torch.Tensor) -> torch.Tensor:
        return self.taps["ffn_out"](self.ffn(h, self.taps["ffn_hidden"]))  # (B, T, C)

    def _sublayer(
        self,
        x: torch.Tensor,
        norm: nn.Module | None,
        norm_tap: str,
        branch: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """One sublayer with its norm and skip path (the table in the module docstring)."""
        if self.norm_position == "pre":
            branch_out = self._scaled(branch(self.taps[norm_tap](norm(x))))  # (B, T, C)
            return x + branch_out if self.residual else branch_out
        stream = self._scaled(branch(x))  # (B, T, C)
        if self.residual:
            stream = x + stream
        if self.norm_position == "post":
            stream = self.taps[norm_tap](norm(stream))
        return stream

    def _scaled(self, branch_out: torch.Tensor) -> torch.Tensor:
        # Skip the multiply at the default scale: one elementwise kernel less per sublayer.
        if self.residual_scale == 1.0:
            return branch_out
        return self.residual_scale * branch_out


class CharTransformer(nn.Module):
    """Token + learned position embedding -> blocks -> optional final norm -> LM head, its
    logits soft-capped when cfg.logit_softcap > 0."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.final_norm = make_norm(cfg) if cfg.use_final_norm else None
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            # One matrix both embeds tokens and scores them; it keeps the head's Linear init
            # (as nanoGPT does) and is listed once, as tok_emb.weight, in named_parameters.
            self.tok_emb.weight = self.lm_head.weight
        if cfg.init == "gpt2":
            self._init_gpt2()
        elif cfg.init == "xavier":
            self._init_xavier()

    def _init_gpt2(self) -> None:
        """GPT-2 init: N(0, 0.02) weights, zero biases, residual projections shrunk."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        # Each block adds two branches to the stream; shrinking the projections that write
        # into it keeps the stream's variance from growing with depth at init.
        residual_std = 0.02 / math.sqrt(2 * self.cfg.n_layer)
        for block in self.blocks:
            if block.attn is not None:
                nn.init.normal_(block.attn.proj.weight, mean=0.0, std=residual_std)
            if block.ffn is not None:
                nn.init.normal_(block.ffn.fc_out.weight, mean=0.0, std=residual_std)

    def _init_xavier(self) -> None:
        """Xavier-uniform Linear weights, zero biases (Xiong et al. 2020); embeddings untouched.

        The fused qkv is initialised as one (3·d_model, d_model) matrix, as PyTorch's
        nn.MultiheadAttention does: q, k and v get variance 1/(2·d_model), which is also what
        fairseq gives its separate q, k, v maps (xavier with gain 1/sqrt(2)). Embeddings keep
        PyTorch's N(0, 1), the per-entry scale of fairseq's Transformer (N(0, 1/d) token
        embeddings times sqrt(d)); norms keep weight 1, bias 0. A tied matrix is the LM
        head's Linear weight, so it is initialised as one.
        """
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)  # U(±sqrt(6 / (fan_in + fan_out)))
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, vocab) for token ids (B, T), and the mean cross-entropy if targets.

        With stacked parameters (K replicas, see the module docstring): token ids
        (K, B, T), logits (K, B, T, vocab) and each replica's mean cross-entropy, (K,).
        """
        T = idx.shape[-1]
        if self.cfg.block_size < T:
            raise ModelInputError(
                f"sequence length {T} is longer than block_size={self.cfg.block_size}; "
                f"pass at most {self.cfg.block_size} tokens"
            )
        table = self.tok_emb.weight
        if table.dim() == 2:
            positions = torch.arange(T, device=idx.device)  # (T,)
            x = self.drop(self.tok_emb(idx) + self.pos_emb(positions))  # (B, T, C)
        else:  # K stacked tables: replica i's ids index rows i·V.. of the K tables end to end
            K, V = table.shape[:2]
            offsets = torch.arange(K, device=idx.device).view(K, 1, 1) * V  # (K, 1, 1)
            tokens = F.embedding(idx + offsets, table.reshape(K * V, -1))  # (K, B, T, C)
            x = self.drop(tokens + self.pos_emb.weight[:, :T].unsqueeze(1))  # (K, B, T, C)
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        if self.final_norm is not None:
            x = self.final_norm(x)
        logits = self.lm_head(x)  # (B, T, V)
        cap = self.cfg.logit_softcap
        if cap > 0:
            # Gemma 2's soft cap: smooth, near the identity for small logits, never past
            # ±cap; before the loss and before sampling (generate calls forward).
            logits = cap * torch.tanh(logits / cap)  # (B, T, V)
        if targets is None:
            return logits, None
        if table.dim() == 2:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
            return logits, loss
        per_token = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="none"
        )
        return logits, per_token.view(logits.shape[0], -1).mean(dim=1)  # (K,)

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        forward: Callable[[torch.Tensor], tuple[torch.Tensor, Any]] | None = None,
    ) -> torch.Tensor:
        """Append max_new_tokens sampled ids to idx (B, T); temperature 0 or top_k=1 is greedy.

        `forward` stands in for the model's own (LitReplicas passes the stacked model's:
        idx (K, B, T), each replica sampling from its own logits). Call model.eval() first
        if dropout should be off while sampling.
        """
        if temperature < 0:
            raise ModelInputError(f"temperature {temperature!r} is not allowed; must be >= 0")
        if top_k is not None and top_k < 1:
            raise ModelInputError(f"top_k {top_k!r} is not allowed; must be >= 1 or None")
        greedy = temperature == 0 or top_k == 1
        for _ in range(max_new_tokens):
            context = idx[..., -self.cfg.block_size :]  # (..., <=block_size): learned positions
            logits, _ = (forward or self)(context)
            logits = logits[..., -1, :]  # (..., V): only the last position predicts the next id
            if greedy:
                next_id = logits.argmax(dim=-1, keepdim=True)  # (..., 1)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth_best = torch.topk(logits, min(top_k, logits.size(-1))).values[..., -1:]
                    logits = logits.masked_fill(logits < kth_best, float("-inf"))  # (..., V)
                probs = logits.softmax(dim=-1)  # (..., V)
                if not bool(probs.isfinite().all()):  # a diverged model: nothing to sample from
                    raise NonFiniteLogits("the model's next-character logits are not finite")
                rows = probs.reshape(-1, probs.size(-1))  # (N, V)
                next_id = torch.multinomial(rows, num_samples=1).view(*probs.shape[:-1], 1)
            idx = torch.cat([idx, next_id], dim=-1)  # (..., T+1)
        return idx

    def n_params(self) -> int:
        """Number of parameters, a tied matrix counted once."""
        return sum(p.numel() for p in self.parameters())


@contextmanager
def capture_attention(model: nn.Module) -> Iterator[AttentionMaps]:
    """Record attention weights of forward passes run inside the block.

    Yields a dict {layer_index: weights (B, n_head, T, T)}, filled as forward passes run
    (a later pass overwrites an earlier one); its `max_logits` holds each layer's largest
    pre-softmax logit per head, (n_head,), and `max_abs_logits` its largest |logit|. Works on
    any module that contains the model (a LightningModule, a torch.compile wrapper). The
    fast path is restored on exit, always.
    """
    captured = AttentionMaps()
    attentions = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    for attention in attentions:
        attention.weights_sink = captured
    try:
        yield captured
    finally:
        for attention in attentions:
            attention.weights_sink = None
