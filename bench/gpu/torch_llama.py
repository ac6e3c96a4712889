#!/usr/bin/env python3
"""The PyTorch reference for bench/gpu/check.sh: a Llama decoder trained the usual way (fp32
master weights, BF16 autocast, F.scaled_dot_product_attention, torch.compile of every block,
fused AdamW),
timed on the same shapes as mxtrain, in the same run.

Prints one JSON object per shape on stdout (and appends it to --json):
  {"impl": "torch", "seq": T, "micro_batch": B, "tokens_per_s": ..., "mfu": ..., "loss": ...,
   "checkpointing": bool, "compiled": bool, "step_s": [...], "peak_mem_bytes": ...,
   "attention": "torch sdpa" (or "torch math (no sdpa)" on a PyTorch without SDPA, < 2.0),
   with --profile "op_profile": one more step's top kernels, as mxtrain's run.profile}
MFU uses mxtrain's FLOP count (model/config.cpp, flops_per_token: 6 N + 12 L H D T, N without
the norms, the head counted) over --peak-tflops (dense BF16: 989.4 for H100/H200, datasheet).

The largest micro-batch that fits: tries --batches in order (descending) and keeps the first
that does not run out of memory; --checkpointing wraps every block in torch.utils.checkpoint.

Runs on a CPU too, for checking this script without a GPU:
  /usr/bin/python3 bench/gpu/torch_llama.py --preset tiny --seq 64 --batches 2 --steps 3 \\
      --device cpu --no-compile
"""
import argparse
import contextlib
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

PRESETS = {
    # Llama-3.2-1B (Hugging Face config): tied embeddings, rope_theta 500000.
    "llama3.2-1b": dict(hidden=2048, inter=8192, layers=16, heads=32, kv=8, head_dim=64,
                        vocab=128256, theta=500000.0, tied=True),
    # mxtrain's `tiny` preset (model/config.cpp).
    "tiny": dict(hidden=64, inter=160, layers=2, heads=4, kv=2, head_dim=16, vocab=256,
                 theta=10000.0, tied=False),
}


def flops_per_token(p, seq):
    C, I, L, H, KV, D, V = (p["hidden"], p["inter"], p["layers"], p["heads"], p["kv"],
                            p["head_dim"], p["vocab"])
    block = C * H * D + 2 * C * KV * D + H * D * C + 3 * C * I  # without the two norms
    n = L * block + V * C
    return 6.0 * n + 12.0 * L * H * D * seq


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight).to(x.dtype)


def rope_tables(seq, head_dim, theta, device):
    inv = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    ang = torch.arange(seq, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cos(ang), torch.sin(ang)  # [T, D/2]


def apply_rope(x, cos, sin):  # x [B, H, T, D], rotate-half (Hugging Face)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


# Which attention ran, for the JSON row (check.sh's table prints it): SDPA on PyTorch >= 2.0
# (the GPU machine's 2.11), else the math spelled out (only the CPU check of this script).
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")
ATTENTION = "torch sdpa" if HAS_SDPA else "torch math (no sdpa)"


def attention(q, k, v):
    if HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # Older PyTorch (this repo's CPU check of the script only): the same math, spelled out.
    T = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(s.float().masked_fill(mask, float("-inf")), dim=-1).to(v.dtype) @ v


class Block(nn.Module):
    def __init__(self, p):
        super().__init__()
        C, H, KV, D, I = p["hidden"], p["heads"], p["kv"], p["head_dim"], p["inter"]
        self.H, self.KV, self.D = H, KV, D
        self.input_norm = RMSNorm(C)
        self.q = nn.Linear(C, H * D, bias=False)
        self.k = nn.Linear(C, KV * D, bias=False)
        self.v = nn.Linear(C, KV * D, bias=False)
        self.o = nn.Linear(H * D, C, bias=False)
        self.post_norm = RMSNorm(C)
        self.gate = nn.Linear(C, I, bias=False)
        self.up = nn.Linear(C, I, bias=False)
        self.down = nn.Linear(I, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.input_norm(x)
        q = self.q(h).view(B, T, self.H, self.D).transpose(1, 2)
        k = self.k(h).view(B, T, self.KV, self.D).transpose(1, 2)
        v = self.v(h).view(B, T, self.KV, self.D).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.H // self.KV
        k = k.repeat_interleave(rep, dim=1)  # GQA: PyTorch's SDPA kernels take equal heads
        v = v.repeat_interleave(rep, dim=1)
        a = attention(q, k, v)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, self.H * self.D))
        h = self.post_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, p, checkpointing):
        super().__init__()
        self.p, self.checkpointing = p, checkpointing
        self.embed = nn.Embedding(p["vocab"], p["hidden"])
        self.blocks = nn.ModuleList(Block(p) for _ in range(p["layers"]))
        self.norm = RMSNorm(p["hidden"])
        self.head = nn.Linear(p["hidden"], p["vocab"], bias=False)
        if p["tied"]:
            self.head.weight = self.embed.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, tokens, targets, cos, sin):
        x = self.embed(tokens)
        for b in self.blocks:
            if self.checkpointing:
                x = torch.utils.checkpoint.checkpoint(b, x, cos, sin, use_reentrant=False)
            else:
                x = b(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def progress(msg):
    """A timestamped line on stderr (check.sh keeps it in errors.txt), so a run cut short by its
    time limit still says how far it got."""
    print(f"torch [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_shape(args, p, seq, batch, device):
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # a failed larger micro-batch's peak is not ours
    # Built on the device: 1.2B parameters initialized on one CPU thread (twice: the default
    # init, then normal_) took 35 s of the check's budget. (A torch.device is a context manager
    # from PyTorch 2.0; older ones, the CPU check of this script, build it here and move it.)
    with device if hasattr(device, "__enter__") else contextlib.nullcontext():
        model = Llama(p, args.checkpointing).to(device)
    progress(f"seq {seq} micro-batch {batch}: model built")
    fused = dict(fused=True) if device.type == "cuda" else {}  # (old CPU torch: no such arg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, **fused)
    cos, sin = rope_tables(seq, p["head_dim"], p["theta"], device)
    gen = torch.Generator(device="cpu").manual_seed(1)
    data = torch.randint(0, p["vocab"], (args.steps, batch, seq + 1), generator=gen).to(device)
    amp = torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    def step(tokens):
        with amp:
            loss = model(tokens[:, :-1], tokens[:, 1:], cos, sin)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if args.compile:
        # Per block, as torchtitan does: the blocks share one compiled graph (dynamo inlines
        # nn.Modules), so compilation costs one block, not the model; the head's cross-entropy
        # and the optimizer stay eager (fused AdamW is one kernel family already).
        for b in model.blocks:
            b.compile()
    fn = step
    times, losses = [], []
    for i in range(args.steps):
        sync(device)
        t0 = time.perf_counter()
        loss = fn(data[i])
        losses.append(float(loss))  # synchronizes
        sync(device)
        times.append(time.perf_counter() - t0)
        progress(f"step {i + 1}/{args.steps}: {times[-1]:.3f} s, loss {losses[-1]:.4f}")
    timed = times[args.warmup:] or times[-1:]
    tok_s = batch * seq * len(timed) / sum(timed)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    extra = {}
    if args.profile:  # after the timed steps, so the timing is the profiler's own
        extra["op_profile"] = profile_step(step, data[-1], device, args.steps + 1)
        progress(f"profiled step {args.steps + 1}: {extra['op_profile']['seconds']:.3f} s")
    return dict(impl="torch", seq=seq, micro_batch=batch, tokens_per_s=tok_s, **extra,
                mfu=flops_per_token(p, seq) * tok_s / (args.peak_tflops * 1e12),
                loss_first=losses[0], loss_last=losses[-1], step_s=times,
                checkpointing=args.checkpointing, compiled=args.compile, peak_mem_bytes=peak,
                attention=ATTENTION,
                device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")


def profile_step(step, tokens, device, number):
    """One more step under torch.profiler: where PyTorch's step time goes, in the form of
    mxtrain's run.profile (op_profile in its metrics): the kernels (on a CPU, the operators) by
    their own time, largest first, each name's calls summed. Kernel names are cut to 120
    characters. gflops is 0: the profiler does not count FLOPs here."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        step(tokens)
        sync(device)
    seconds = time.perf_counter() - t0
    ops = []
    for e in prof.key_averages():
        if device.type == "cuda":  # (PyTorch 2.4 renamed cuda to device)
            us = getattr(e, "self_device_time_total", None)
            us = getattr(e, "self_cuda_time_total", 0) if us is None else us
        else:
            us = e.self_cpu_time_total
        if us > 0:
            ops.append(dict(op=e.key[:120], calls=int(e.count), seconds=us / 1e6))
    ops.sort(key=lambda o: -o["seconds"])
    for o in ops:
        o["share"] = o["seconds"] / seconds
        o["gflops"] = 0.0
    return dict(first_step=number, last_step=number, seconds=seconds, ops=ops[:25],
                measured="kernels" if device.type == "cuda" else "operators (cpu)")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="llama3.2-1b", choices=sorted(PRESETS))
    ap.add_argument("--seq", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 4, 2, 1],
                    help="micro-batches to try, largest first (the first that fits is timed)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3, help="untimed first steps (compilation)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=989.4)
    ap.add_argument("--json", help="append one JSON line per shape here")
    ap.add_argument("--profile", action="store_true",
                    help="one more step under torch.profiler: its top kernels go to op_profile")
    args = ap.parse_args()
    device = torch.device(args.device)
    # Bad input: one `error:` line, exit 2 (as mxtrain), not a traceback mid-run.
    if device.type == "cuda" and not torch.cuda.is_available():
        fail(f"--device {args.device}: PyTorch {torch.__version__} sees no CUDA GPU "
             "(--device cpu --no-compile checks this script without one)")
    if args.compile and not hasattr(nn.Module, "compile"):
        fail(f"PyTorch {torch.__version__} has no nn.Module.compile (2.2 and later): "
             "pass --no-compile")
    p = PRESETS[args.preset]
    torch.backends.cuda.matmul.allow_tf32 = True
    for seq in args.seq:
        result = None
        for batch in args.batches:
            try:
                result = run_shape(args, p, seq, batch, device)
                break
            except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
                if not out_of_memory(e):
                    raise
                print(f"torch: seq {seq} micro-batch {batch}: out of memory", file=sys.stderr)
                reset(args, device)
        if result is None:
            result = dict(impl="torch", seq=seq, error="out of memory at every micro-batch")
        result["preset"] = args.preset
        line = json.dumps(result)
        print(line, flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(line + "\n")
        reset(args, device)


def out_of_memory(e):
    """True for CUDA's out-of-memory error, also where torch.compile's machinery re-raised it
    wrapped (a RuntimeError subclass whose message or cause carries it: on an 80 GB H100 the
    compiled step may first run out while Inductor benchmarks or allocates)."""
    while e is not None:
        if isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower():
            return True
        e = e.__cause__ or e.__context__
    return False


def fail(msg):
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def reset(args, device):
    if args.compile:
        torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
