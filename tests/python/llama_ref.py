"""An independent Llama in plain PyTorch (no transformers): the reference mxtrain is checked against.

Functional style: parameters live in a dict keyed by Hugging Face names, so the same dict is what
hf_io writes, what mxtrain reads, and what the gradients come back under. The math is written from
the Llama / Hugging Face definitions, not from mxtrain's code:

  RMSNorm      x * rsqrt(mean(x^2) + eps) * w              (computed in the parameter dtype)
  RoPE         HF rotate-half: x*cos + rotate_half(x)*sin, inv_freq = 1/theta^(arange(0,D,2)/D)
  attention    causal softmax(q k^T / sqrt(D)) v, query head h reads kv head h // (H / KV)
  MLP          down(silu(gate(x)) * up(x))
  head         lm_head (or embed_tokens when tied); loss = mean cross-entropy over all tokens
"""
import math

import numpy as np
import torch
import torch.nn.functional as F


def make_shape(hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
               num_key_value_heads=None, vocab_size=256, head_dim=None, rope_theta=10000.0,
               rms_norm_eps=1e-5, tie_word_embeddings=False):
    """The model's shape as a dict of HF config fields (head_dim filled in)."""
    if num_key_value_heads is None:
        num_key_value_heads = num_attention_heads
    if head_dim is None:
        head_dim = hidden_size // num_attention_heads
    return dict(hidden_size=hidden_size, intermediate_size=intermediate_size,
                num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                num_key_value_heads=num_key_value_heads, head_dim=head_dim,
                vocab_size=vocab_size, rope_theta=rope_theta, rms_norm_eps=rms_norm_eps,
                tie_word_embeddings=tie_word_embeddings)


def param_shapes(cfg):
    """{HF name: shape} in a fixed order (embedding, blocks, final norm, head)."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    shapes = {"model.embed_tokens.weight": (v, h)}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (q, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, q)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (i, h)
        shapes[p + "mlp.up_proj.weight"] = (i, h)
        shapes[p + "mlp.down_proj.weight"] = (h, i)
    shapes["model.norm.weight"] = (h,)
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, h)
    return shapes


def random_params(cfg, seed, std=0.1, norm_jitter=0.2):
    """Random float32 numpy weights: matrices ~ N(0, std^2), norms ~ 1 + U(-jitter, jitter)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in param_shapes(cfg).items():
        if len(shape) == 1:
            out[name] = (1.0 + rng.uniform(-norm_jitter, norm_jitter, shape)).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) * std).astype(np.float32)
    return out


def to_torch(params, dtype=torch.float64, requires_grad=True):
    """numpy dict -> dict of leaf tensors (in param_shapes order when keys match)."""
    return {k: torch.tensor(np.asarray(v), dtype=dtype).requires_grad_(requires_grad)
            for k, v in params.items()}


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_cos_sin(seq_len, head_dim, theta, dtype):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    t = torch.arange(seq_len, dtype=torch.float64)
    freqs = torch.outer(t, inv_freq)                 # [T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)          # [T, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x, cos, sin):
    # x: [B, heads, T, D]; cos/sin: [T, D]
    return x * cos + rotate_half(x) * sin


def attention(x, p, prefix, cfg, cos, sin):
    B, T, _ = x.shape
    H, KV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    q = (x @ p[prefix + "q_proj.weight"].t()).view(B, T, H, D).transpose(1, 2)
    k = (x @ p[prefix + "k_proj.weight"].t()).view(B, T, KV, D).transpose(1, 2)
    v = (x @ p[prefix + "v_proj.weight"].t()).view(B, T, KV, D).transpose(1, 2)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    group = H // KV
    k = k.repeat_interleave(group, dim=1)            # head h -> kv head h // group
    v = v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    y = (probs @ v).transpose(1, 2).reshape(B, T, H * D)
    return y @ p[prefix + "o_proj.weight"].t()


def mlp(x, p, prefix):
    gate = x @ p[prefix + "gate_proj.weight"].t()
    up = x @ p[prefix + "up_proj.weight"].t()
    return (F.silu(gate) * up) @ p[prefix + "down_proj.weight"].t()


def logits(params, cfg, inputs):
    """inputs: LongTensor [B, T] -> logits [B, T, V] in the parameters' dtype."""
    p = params
    dtype = p["model.embed_tokens.weight"].dtype
    B, T = inputs.shape
    eps = cfg["rms_norm_eps"]
    cos, sin = rope_cos_sin(T, cfg["head_dim"], cfg["rope_theta"], dtype)
    x = p["model.embed_tokens.weight"][inputs]
    for l in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{l}."
        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        x = x + attention(h, p, pre + "self_attn.", cfg, cos, sin)
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        x = x + mlp(h, p, pre + "mlp.")
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else p["lm_head.weight"]
    return x @ head.t()


def loss_fn(params, cfg, inputs, targets):
    """Mean cross-entropy over all B*T tokens."""
    lg = logits(params, cfg, inputs)
    return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), targets.reshape(-1))


def loss_and_grads(params_np, cfg, tokens, dtype=torch.float64):
    """tokens: int array [B, T+1]. Returns (loss float, {name: grad numpy in float64})."""
    p = to_torch(params_np, dtype=dtype)
    tok = torch.tensor(np.asarray(tokens), dtype=torch.long)
    loss = loss_fn(p, cfg, tok[:, :-1], tok[:, 1:])
    loss.backward()
    return float(loss), {k: v.grad.double().numpy() for k, v in p.items()}


def lr_at(step, steps, lr, min_lr, warmup):
    """The contract's schedule: linear warmup over `warmup` steps, then cosine to min_lr."""
    if step < warmup:
        return lr * (step + 1) / warmup
    prog = (step - warmup) / max(1, steps - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * prog))


class RefTrainer:
    """One AdamW training run, the way the contract defines it (torch.optim.AdamW, clip_grad_norm_)."""

    def __init__(self, params_np, cfg, lr, min_lr, warmup, steps, weight_decay, grad_clip,
                 beta1=0.9, beta2=0.95, eps=1e-8, dtype=torch.float64):
        self.cfg = cfg
        self.p = to_torch(params_np, dtype=dtype)
        decay = [t for t in self.p.values() if t.dim() >= 2]
        no_decay = [t for t in self.p.values() if t.dim() < 2]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=lr, betas=(beta1, beta2), eps=eps)
        self.lr, self.min_lr, self.warmup, self.steps = lr, min_lr, warmup, steps
        self.grad_clip = grad_clip
        self.step_index = 0

    def step(self, micro_batches):
        """micro_batches: list of int arrays [B, T+1]. Returns dict(loss, lr, grad_norm)."""
        self.opt.zero_grad(set_to_none=True)
        losses = []
        n = len(micro_batches)
        for mb in micro_batches:
            tok = torch.tensor(np.asarray(mb), dtype=torch.long)
            loss = loss_fn(self.p, self.cfg, tok[:, :-1], tok[:, 1:])
            (loss / n).backward()
            losses.append(float(loss))
        params = list(self.p.values())
        for t in params:                       # a parameter the batch never touched: zero grad
            if t.grad is None:
                t.grad = torch.zeros_like(t)
        if self.grad_clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, self.grad_clip))
        else:
            norm = float(torch.norm(torch.stack([t.grad.norm() for t in params])))
        lr = lr_at(self.step_index, self.steps, self.lr, self.min_lr, self.warmup)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.step()
        self.step_index += 1
        return {"loss": sum(losses) / n, "lr": lr, "grad_norm": norm}

    def numpy_params(self):
        return {k: v.detach().double().numpy() for k, v in self.p.items()}


@torch.no_grad()
def greedy_generate(params_np, cfg, prompt_ids, max_tokens, dtype=torch.float64):
    """Greedy continuation (the argmax token each step) with a full recompute per token."""
    p = to_torch(params_np, dtype=dtype, requires_grad=False)
    ids = list(prompt_ids)
    for _ in range(max_tokens):
        lg = logits(p, cfg, torch.tensor([ids], dtype=torch.long))
        ids.append(int(lg[0, -1].argmax()))
    return ids[len(prompt_ids):]
