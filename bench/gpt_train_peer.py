"""PyTorch reference for //bench:train_step: the same GPT-2-small-shaped model (12 layers,
width 768, 12 heads, context 1024, vocab 50304, tied head, GELU-tanh MLP, LayerNorm), trained
on random tokens with bf16 autocast, flash attention (scaled_dot_product_attention) and fused
AdamW, eager and torch.compile. Prints one JSON line per mode: median step time over timed
steps after warm-up, tokens/s, peak memory and MFU counted as //bench:train_step counts it.

  python3 bench/gpt_train_peer.py [--steps 20] [--modes eager,compile] [--json out.jsonl]

The module names match lossrt's checkpoints (nanoGPT's: transformer.h.0.attn.c_attn.weight,
nn.Linear layout), so `--load DIR/model.safetensors` loads weights that examples/train_lm
saved (with --width/--layers/... to match) and prints the loss of random tokens.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(width, 3 * width)
        self.attn.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(width, 4 * width)
        self.mlp.c_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn.c_proj(y.transpose(1, 2).reshape(batch, seq, width))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, heads, width, context, vocab):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(vocab, width)
        self.transformer.wpe = nn.Embedding(context, width)
        self.transformer.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.transformer.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, ids, targets):
        seq = ids.shape[1]
        x = self.transformer.wte(ids) + self.transformer.wpe(torch.arange(seq, device=ids.device))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def measure(args, compile_model):
    torch.manual_seed(0)
    model = Gpt(args.layers, args.heads, args.width, args.seq, args.vocab).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
    step_model = torch.compile(model) if compile_model else model
    params = sum(p.numel() for p in model.parameters())
    flops_per_token = 6 * params + 6 * args.layers * args.width * args.seq
    tokens = args.batch * args.seq

    def step():
        data = torch.randint(0, 50257, (args.batch, args.seq + 1), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(data[:, :-1], data[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    step_ms = statistics.median(times)
    return {
        "mode": "compile" if compile_model else "eager",
        "batch": args.batch, "seq": args.seq, "params": params,
        "step_ms": step_ms, "tokens_per_s": tokens / step_ms * 1e3,
        "peak_gb": torch.cuda.max_memory_allocated() / 1e9,
        "mfu": tokens / step_ms * 1e3 * flops_per_token / (args.peak_tflops * 1e12),
        "loss": loss.item(),
    }


def load_checkpoint(args):
    from safetensors.torch import load_file
    state = load_file(args.load)
    model = Gpt(args.layers, args.heads, args.width, args.seq, args.vocab)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # lm_head.weight is the tied token table; nothing else may be missing.
    missing = [name for name in missing if name != "lm_head.weight"]
    print(json.dumps({"checkpoint": args.load, "tensors": len(state),
                      "missing": missing, "unexpected": unexpected}))
    ids = torch.randint(0, args.vocab, (1, args.seq + 1))
    with torch.no_grad():
        print(json.dumps({"loss_random_tokens": model(ids[:, :-1], ids[:, 1:]).item()}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--peak_tflops", type=float, default=989.0)
    parser.add_argument("--modes", default="eager,compile")
    parser.add_argument("--json", default="")
    parser.add_argument("--load", default="", help="a model.safetensors to load instead")
    args = parser.parse_args()
    if args.load:
        load_checkpoint(args)
        return
    for mode in args.modes.split(","):
        result = measure(args, mode == "compile")
        print(json.dumps(result), flush=True)
        if args.json:
            with open(args.json, "a") as out:
                out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
