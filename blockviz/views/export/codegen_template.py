"""The body of an exported `train_<name>.py`: everything after the imports and the config.

`blockviz.views.export.codegen` puts a header, the imports and the run's constants in front of
it. It is kept as text (this module never runs it), mirrors blockviz.training (model.py,
data.py, lit.py, trainer.py) step for step, and must stay in sync with them: the test in
tests/views/export/test_codegen.py trains both and compares the losses.
"""

from __future__ import annotations

SCRIPT_BODY = r'''
# -----------------------------------------------------------------------------
# data: one text, its sorted characters as the vocabulary, a contiguous train/val split

SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)


def read_text(source):
    """The text to train on: a UTF-8 file, or one of the corpora this script can build."""
    if source == "pydocs":  # Python's own help topics, in sorted order (blockviz's "pydocs")
        from pydoc_data.topics import topics

        return "\n".join(topics[key] for key in sorted(topics))
    path = Path(source)
    if source == "shakespeare" and not path.exists():
        path = Path("tinyshakespeare.txt")
        if not path.exists():
            print(f"downloading {SHAKESPEARE_URL} to {path}")
            urllib.request.urlretrieve(SHAKESPEARE_URL, path)
    data = path.read_bytes()
    data = data.removeprefix(codecs.BOM_UTF8)
    # Windows line ends would add a '\r' symbol that the model must learn to emit.
    return data.decode("utf-8").replace("\r\n", "\n")


def get_batch(ids, starts):
    """Inputs and next-character targets (B, T) of the windows that begin at `starts` (B,)."""
    offsets = torch.arange(BLOCK_SIZE + 1)  # (T+1,)
    windows = ids[starts[:, None] + offsets]  # (B, T+1)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()  # (B, T), (B, T)


# -----------------------------------------------------------------------------
# model: embeddings -> N_LAYER blocks -> optional final norm -> LM head
#
# How a block wires one sublayer f (attention or FFN) with its norm, residual scale s:
#     NORM_POSITION   RESIDUAL on            RESIDUAL off
#     pre             x + s*f(norm(x))       s*f(norm(x))
#     post            norm(x + s*f(x))       norm(s*f(x))
#     none            x + s*f(x)             s*f(x)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight: LayerNorm without centring or bias (in float32)."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x_float = x.float()
        inv_rms = torch.rsqrt(x_float.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return (x_float * inv_rms * self.weight).type_as(x)


class BatchNorm(nn.Module):
    """Per-channel statistics over batch and positions (train); running statistics (eval)."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.bn = nn.BatchNorm1d(dim, eps=eps, affine=False)
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if BIAS else None

    def forward(self, x):
        out = self.bn(x.float().reshape(-1, x.shape[-1])).reshape(x.shape) * self.weight
        if self.bias is not None:
            out = out + self.bias
        return out.type_as(x)


def make_norm():
    if NORM_TYPE == "rmsnorm":
        return RMSNorm(D_MODEL, eps=1e-5)
    if NORM_TYPE == "batchnorm":
        return BatchNorm(D_MODEL, eps=1e-5)
    return nn.LayerNorm(D_MODEL, eps=1e-5, bias=BIAS)


def make_head_norm():
    """QK_NORM's norm of a head's q or k: RMSNorm under rmsnorm, else LayerNorm (batchnorm too)."""
    if NORM_TYPE == "rmsnorm":
        return RMSNorm(D_MODEL // N_HEAD, eps=1e-5)
    return nn.LayerNorm(D_MODEL // N_HEAD, eps=1e-5, bias=BIAS)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused q, k, v projection."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL, bias=BIAS)
        # one norm for the queries and one for the keys, each shared by every head
        self.q_norm = make_head_norm() if QK_NORM else None
        self.k_norm = make_head_norm() if QK_NORM else None
        self.proj = nn.Linear(D_MODEL, D_MODEL, bias=BIAS)
        self.resid_drop = nn.Dropout(DROPOUT)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q = q.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2)  # (B, nh, T, hs)
        if self.q_norm is not None:  # the logits then cannot grow with the size of q and k
            q, k = self.q_norm(q), self.k_norm(k)  # (B, nh, T, hs) each
        dropout_p = DROPOUT if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C): heads side by side
        return self.resid_drop(self.proj(y))


class FeedForward(nn.Module):
    """fc_in -> activation -> fc_out; SwiGLU splits fc_in's 2*d_ff outputs into gate, value."""

    def __init__(self):
        super().__init__()
        d_ff = FFN_MULT * D_MODEL
        self.gated = ACTIVATION == "swiglu"
        self.fc_in = nn.Linear(D_MODEL, 2 * d_ff if self.gated else d_ff, bias=BIAS)
        self.act = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "swiglu": nn.SiLU}[
            ACTIVATION
        ]()
        self.fc_out = nn.Linear(d_ff, D_MODEL, bias=BIAS)
        self.drop = nn.Dropout(DROPOUT)

    def forward(self, x):
        hidden = self.fc_in(x)  # (B, T, d_ff), or (B, T, 2*d_ff) when gated
        if self.gated:
            gate, value = hidden.chunk(2, dim=-1)  # 2 x (B, T, d_ff)
            hidden = self.act(gate) * value
        else:
            hidden = self.act(hidden)
        return self.drop(self.fc_out(hidden))  # (B, T, C)


class Block(nn.Module):
    """[norm1] attention, [norm2] FFN; a sublayer switched off has no norm either."""

    def __init__(self):
        super().__init__()
        has_norm = NORM_POSITION != "none"
        self.norm1 = make_norm() if ATTENTION and has_norm else None
        self.attn = CausalSelfAttention() if ATTENTION else None
        self.norm2 = make_norm() if FFN and has_norm else None
        self.ffn = FeedForward() if FFN else None

    def forward(self, x):
        if self.attn is not None:
            x = self.sublayer(x, self.norm1, self.attn)
        if self.ffn is not None:
            x = self.sublayer(x, self.norm2, self.ffn)
        return x

    def sublayer(self, x, norm, f):
        if NORM_POSITION == "pre":
            out = RESIDUAL_SCALE * f(norm(x))
            return x + out if RESIDUAL else out
        stream = RESIDUAL_SCALE * f(x)
        if RESIDUAL:
            stream = x + stream
        return norm(stream) if NORM_POSITION == "post" else stream


class CharTransformer(nn.Module):
    # The modules are created in this order, as in blockviz: the default init draws from
    # torch's generator in creation order, so the same seed gives the same weights.
    def __init__(self, vocab_size):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, D_MODEL)
        self.pos_emb = nn.Embedding(BLOCK_SIZE, D_MODEL)
        self.drop = nn.Dropout(DROPOUT)
        self.blocks = nn.ModuleList(Block() for _ in range(N_LAYER))
        self.final_norm = make_norm() if USE_FINAL_NORM else None
        self.lm_head = nn.Linear(D_MODEL, vocab_size, bias=False)
        if TIE_WEIGHTS:  # one matrix embeds tokens and scores them; it keeps the head's init
            self.tok_emb.weight = self.lm_head.weight
        if INIT == "gpt2":
            self.init_gpt2()
        elif INIT == "xavier":
            self.init_xavier()

    def init_gpt2(self):
        """N(0, 0.02) weights, zero biases, the projections into the stream shrunk by depth."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        residual_std = 0.02 / math.sqrt(2 * N_LAYER)
        for block in self.blocks:
            if block.attn is not None:
                nn.init.normal_(block.attn.proj.weight, mean=0.0, std=residual_std)
            if block.ffn is not None:
                nn.init.normal_(block.ffn.fc_out.weight, mean=0.0, std=residual_std)

    def init_xavier(self):
        """Xavier-uniform Linear weights (qkv as one matrix), zero biases; embeddings kept."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        positions = torch.arange(T, device=idx.device)  # (T,)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(positions))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
        logits = self.lm_head(x)  # (B, T, vocab)
        if LOGIT_SOFTCAP > 0:  # smooth, and no logit leaves (-LOGIT_SOFTCAP, LOGIT_SOFTCAP)
            logits = LOGIT_SOFTCAP * torch.tanh(logits / LOGIT_SOFTCAP)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0):
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -BLOCK_SIZE:])
            probs = (logits[:, -1, :] / temperature).softmax(dim=-1)  # (B, vocab)
            idx = torch.cat([idx, torch.multinomial(probs, num_samples=1)], dim=1)
        return idx


# -----------------------------------------------------------------------------
# optimizer and schedule


def lr_at(step, lr, max_steps):
    """Linear warm-up to lr, then constant, or a cosine / linear decay to MIN_LR at max_steps."""
    if step < WARMUP_STEPS:
        return lr * (step + 1) / WARMUP_STEPS
    if LR_SCHEDULE == "constant":
        return lr
    progress = min(1.0, (step - WARMUP_STEPS) / max(1, max_steps - WARMUP_STEPS))
    if LR_SCHEDULE == "cosine":
        return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - MIN_LR)
    return lr - progress * (lr - MIN_LR)  # linear


def param_groups(model):
    """Linear weight matrices decay; biases, norms and embeddings (unless tied) do not."""
    decay_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    decay = [p for p in model.parameters() if id(p) in decay_ids]
    no_decay = [p for p in model.parameters() if id(p) not in decay_ids]
    return [
        {"params": decay, "weight_decay": WEIGHT_DECAY},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def pick_device(requested):
    """The torch device for --device: auto and gpu take CUDA, else MPS (auto: else the CPU)."""
    if requested in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return "cuda"
    if requested in ("auto", "gpu", "mps") and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def autocast_dtype(device):
    """None for float32; bf16 / fp16 autocast for the mixed precisions ("auto": bf16 on CUDA)."""
    precision = PRECISION
    if precision == "auto":
        cuda_bf16 = device == "cuda" and torch.cuda.is_bf16_supported()
        precision = "bf16-mixed" if cuda_bf16 else "32-true"
    return {"32-true": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}[precision]


def loader_start():
    # blockviz feeds batches through torch DataLoaders, and each one draws one number from
    # torch's global generator when it starts (the training loader before step 0, the
    # validation loader at each evaluation). Drawing it here too keeps every later dropout
    # mask the same as blockviz's; without dropout nothing else reads that generator.
    torch.empty((), dtype=torch.int64).random_()


# -----------------------------------------------------------------------------
# the command line: each flag defaults to the run's value above and accepts what blockviz
# would accept for that field, so every run it starts is one blockviz could train too

DEVICE_CHOICES = ("auto", "cpu", "gpu", "cuda", "mps")


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line naming it (no usage), then exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def parsed(text, kind):
    """`kind(text)`, or None when text is not one (a typo, "1e3" for an integer)."""
    try:
        return kind(text)
    except ValueError:
        return None


def refused(text, value, allowed):
    shown = repr(text) if value is None else text
    return argparse.ArgumentTypeError(f"{shown} is not allowed; {allowed}")


def data_flag(text):
    """--data: a text file, or a corpus the script builds (pydocs) or downloads (shakespeare)."""
    if text in ("pydocs", "shakespeare") or Path(text).is_file():
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not a file; pass a UTF-8 text file's path")


def max_steps_flag(text):
    steps = parsed(text, int)
    low = max(1, WARMUP_STEPS)  # blockviz refuses a run shorter than its warm-up
    if steps is None or not low <= steps <= MAX_STEPS_LIMIT:
        warmup = f" (WARMUP_STEPS = {WARMUP_STEPS} must fit)" if low > 1 else ""
        raise refused(text, steps, f"must be an integer in [{low}, {MAX_STEPS_LIMIT}]{warmup}")
    return steps


def lr_flag(text):
    lr = parsed(text, float)
    # blockviz refuses a peak below MIN_LR, where the decays end (whatever the schedule)
    if lr is None or not (0 < lr <= LR_LIMIT and lr >= MIN_LR):
        low = f"[MIN_LR = {MIN_LR}" if MIN_LR > 0 else "(0"
        raise refused(text, lr, f"must be a number in {low}, {LR_LIMIT}]")
    return lr


def seed_flag(text):
    seed = parsed(text, int)
    if seed is None or not 0 <= seed <= SEED_LIMIT:
        raise refused(text, seed, f"must be an integer in [0, {SEED_LIMIT}]")
    return seed


def device_flag(text):
    if text not in DEVICE_CHOICES:
        raise refused(text, None, "choose one of " + ", ".join(DEVICE_CHOICES))
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if not {"cuda": cuda, "mps": mps, "gpu": cuda or mps}.get(text, True):
        missing = {"cuda": "CUDA GPU", "mps": "MPS device", "gpu": "CUDA GPU or MPS device"}[text]
        raise argparse.ArgumentTypeError(
            f"{text} is not available here: torch finds no {missing}; pass --device cpu or auto"
        )
    return text


def parse_flags(argv=None):
    """(parser, flags) from the command line, or `argv`; a bad flag exits with status 2."""
    parser = Parser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--data", type=data_flag, default=DATASET, help="UTF-8 text file, or pydocs / shakespeare")
    add("--max_steps", type=max_steps_flag, default=MAX_STEPS, help="steps to train")
    add("--lr", type=lr_flag, default=LR, help="peak learning rate")
    add("--seed", type=seed_flag, default=SEED, help="seeds weights, dropout, training batches")
    add(
        "--device",
        type=device_flag,
        default=ACCELERATOR,
        help="auto (CUDA, else MPS, else the CPU), cpu, gpu (CUDA, else MPS), cuda or mps",
    )
    return parser, parser.parse_args(argv)


# -----------------------------------------------------------------------------
# training


def main(argv=None):
    parser, args = parse_flags(argv)
    try:
        text = read_text(args.data)
    except UnicodeDecodeError as err:
        parser.error(f"argument --data: {args.data!r} is not UTF-8 text (byte {err.start})")
    chars = sorted(set(text))
    char_id = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([char_id[c] for c in text], dtype=torch.long)  # (N,)
    n_train = int(len(ids) * (1 - VAL_FRACTION))  # the last VAL_FRACTION is validation
    train_ids, val_ids = ids[:n_train], ids[n_train:]
    if min(len(train_ids), len(val_ids)) <= BLOCK_SIZE:
        parser.error(
            f"argument --data: {args.data!r} is too short: each split needs "
            f"{BLOCK_SIZE + 1} characters (VAL_FRACTION = {VAL_FRACTION})"
        )
    print(f"{len(text):,} characters, vocabulary of {len(chars)}, {n_train:,} for training")

    # Batches come from generators of their own: the same windows whatever else draws.
    # Validation windows follow a fixed evaluation seed, not --seed, EVAL_DRAW at a time:
    # every run of this text and block size is scored on the same text.
    train_generator = torch.Generator().manual_seed(args.seed)
    val_generator = torch.Generator().manual_seed(EVAL_SEED)
    n_windows = EVAL_ITERS * BATCH_SIZE
    draws = [
        torch.randint(len(val_ids) - BLOCK_SIZE, (EVAL_DRAW,), generator=val_generator)
        for _ in range(-(-n_windows // EVAL_DRAW))
    ]
    val_starts = torch.cat(draws)[:n_windows].view(EVAL_ITERS, BATCH_SIZE)  # (iters, B)

    device = pick_device(args.device)
    amp_dtype = autocast_dtype(device)
    torch.manual_seed(args.seed)  # the weights (and dropout masks) follow from the seed
    model = CharTransformer(len(chars)).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params:,} parameters on {device}, autocast {amp_dtype or 'off (float32)'}")
    forward = torch.compile(model) if COMPILE else model
    optimizer = torch.optim.AdamW(param_groups(model), lr=args.lr, betas=(BETA1, BETA2))
    # The decay ends at --max_steps, as blockviz plans it for a run of that many steps.
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_at(step, args.lr, args.max_steps) / args.lr
    )
    scaler = torch.amp.GradScaler(device, enabled=amp_dtype == torch.float16)

    def autocast():
        return torch.autocast(device, dtype=amp_dtype, enabled=amp_dtype is not None)

    @torch.no_grad()
    def evaluate(step):
        loader_start()
        model.eval()
        total = torch.zeros((), device=device)
        for starts in val_starts:
            x, y = get_batch(val_ids, starts)
            with autocast():
                _, loss = forward(x.to(device), y.to(device))
            total += loss.float()
        model.train()
        val_loss = float(total) / len(val_starts)
        print(f"step {step:6d}  val loss {val_loss:.6f}  bpc {val_loss / math.log(2):.4f}")
        return val_loss

    model.train()
    loader_start()
    recent = []
    started = time.time()
    last_eval = None
    for step in range(args.max_steps):
        lr = optimizer.param_groups[0]["lr"]
        n_starts = len(train_ids) - BLOCK_SIZE  # the last start leaves room for one target
        starts = torch.randint(n_starts, (BATCH_SIZE,), generator=train_generator)  # (B,)
        x, y = get_batch(train_ids, starts)
        with autocast():
            logits, loss = forward(x.to(device), y.to(device))
        objective = loss
        if Z_LOSS > 0:  # pulls each position's log-normaliser towards 0; printed: loss alone
            objective = loss + Z_LOSS * logits.float().logsumexp(dim=-1).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(objective).backward()
        if GRAD_CLIP > 0:
            scaler.unscale_(optimizer)
            params = [p for group in optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()

        recent.append(loss.item())
        if not math.isfinite(recent[-1]):
            print(f"step {step:6d}  train loss {recent[-1]}: diverged")
            return
        if step % LOG_INTERVAL == 0 or step == args.max_steps - 1:
            # Each loss is measured on batch `step` before the update that batch causes.
            mean_loss = sum(recent) / len(recent)
            elapsed = time.time() - started
            print(f"step {step:6d}  train loss {mean_loss:.6f}  lr {lr:.3e}  {elapsed:.1f}s")
            recent = []
        if (step + 1) % EVAL_INTERVAL == 0:
            last_eval = evaluate(step + 1)
    if last_eval is None or args.max_steps % EVAL_INTERVAL:
        evaluate(args.max_steps)

    model.eval()
    start = torch.tensor([[char_id.get("\n", 0)]], device=device)
    sample = model.generate(start, max_new_tokens=200)[0, 1:].tolist()
    print("sample:", "".join(chars[i] for i in sample))


if __name__ == "__main__":
    main()
'''
