"""The Python twin of examples/gpt.cpp: the same character-level GPT, data, sampler and
training loop, with PyTorch's own DistributedDataParallel, under torchrun.

  torchrun --standalone --nproc-per-node 2 examples/gpt/gpt.py --init runs/gpt/init.pt

Started from the C++ program's initial weights (gpt --save-init FILE, then --init FILE
here) and given the same flags, it computes the same losses: the C++ model is the same
model, not a look-alike (tests/examples/check_gpt.py checks this at 2 ranks). The flags
are a subset of gpt.cpp's, with the same names and defaults; --metrics and --out say where
the per-step records and the final state dict go.
"""

import argparse
import gc
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

DEFAULT_CORPUS = "/usr/share/games/fortunes/songs-poems"


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        # Note [No bias on qkv] and Note [Tensor-parallel GPT], model.h
        self.q = nn.Linear(n_embd, n_embd, bias=False)
        self.k = nn.Linear(n_embd, n_embd, bias=False)
        self.v = nn.Linear(n_embd, n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        b, t, _ = x.shape
        hd = x.size(2) // self.n_head
        q = self.q(x)
        c = q.size(2)  # under tensor parallelism, this rank's heads
        q, k, v = [y.view(b, t, c // hd, hd).transpose(1, 2) for y in (q, self.k(x), self.v(x))]
        p = self.dropout if self.training else 0.0
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=p, is_causal=True)
        else:  # PyTorch 1.13: the same arithmetic as gpt.cpp's fallback
            att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            att = torch.softmax(att.masked_fill(future, float("-inf")), -1)
            att = F.dropout(att, p, self.training)
            y = torch.matmul(att, v)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return F.dropout(self.proj(y), self.dropout, self.training)


class Mlp(nn.Module):
    def __init__(self, n_embd, dropout):
        super().__init__()
        self.dropout = dropout
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return F.dropout(self.proj(F.gelu(self.fc(x))), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = Mlp(n_embd, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout):
        super().__init__()
        self.block_size, self.dropout = block_size, dropout
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block(n_embd, n_head, dropout) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        for name, p in self.named_parameters():  # GPT-2's initialisation, as gpt.cpp's
            if p.dim() == 1:
                if name.endswith("bias"):
                    nn.init.zeros_(p)
            else:
                residual = name.endswith(("attn.proj.weight", "mlp.proj.weight"))
                std = 0.02 / math.sqrt(2 * n_layer) if residual else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = F.dropout(self.wte(idx) + self.wpe(pos), self.dropout, self.training)
        x = self.ln_f(self.blocks(x))
        return F.linear(x, self.wte.weight)

    @staticmethod
    def decays(name, p):
        return p.dim() == 2 and not name.startswith(("wte.", "wpe."))


class Windows:
    """Windows of block_size + 1 tokens starting every block_size tokens (gpt/text.h)."""

    def __init__(self, tokens, block_size):
        self.tokens, self.block_size = tokens, block_size

    def __len__(self):
        return max(0, (self.tokens.numel() - 1) // self.block_size)

    def batch(self, indices):
        starts = torch.tensor(indices, dtype=torch.long) * self.block_size
        chunks = self.tokens[starts.unsqueeze(1) + torch.arange(self.block_size + 1)]
        return chunks[:, :-1].contiguous(), chunks[:, 1:].contiguous()


def load_corpus(path, truncate, train_split, block_size):
    with open(path, "rb") as f:
        text = f.read().decode("utf-8")  # no newline translation: the bytes gpt.cpp reads
    text = text[: math.floor(len(text) * truncate)]
    n = len(text)
    train_len = math.floor(n * train_split)
    if train_len < block_size + 1 or n - train_len < block_size + 1:
        raise SystemExit(f"gpt.py: --data {path} is too short for --block-size {block_size}")
    vocabulary = sorted(set(text))
    index = {c: i for i, c in enumerate(vocabulary)}
    tokens = torch.tensor([index[c] for c in text], dtype=torch.long)
    return vocabulary, Windows(tokens[:train_len], block_size), Windows(tokens[train_len:], block_size)


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--data", default=DEFAULT_CORPUS)
    a.add_argument("--truncate", type=float, default=1.0)
    a.add_argument("--train-split", type=float, default=0.9)
    a.add_argument("--block-size", type=int, default=64)
    a.add_argument("--n-layer", type=int, default=4)
    a.add_argument("--n-head", type=int, default=4)
    a.add_argument("--n-embd", type=int, default=128)
    a.add_argument("--dropout", type=float, default=0.1)
    a.add_argument("--max-epochs", type=int, default=20)
    a.add_argument("--max-steps", type=int, default=0)
    a.add_argument("--batch-size", type=int, default=32)
    a.add_argument("--grad-accum", type=int, default=1)
    a.add_argument("--learning-rate", type=float, default=1e-3)
    a.add_argument("--weight-decay", type=float, default=0.1)
    a.add_argument("--grad-norm-clip", type=float, default=1.0)
    a.add_argument("--log-every", type=int, default=10)
    a.add_argument("--seed", type=int, default=42)
    a.add_argument("--amp", action="store_true")
    a.add_argument("--backend", default="")
    a.add_argument("--tp", type=int, default=1,
                   help="tensor parallelism over all the ranks (PyTorch's parallelize_module, "
                        "gpt --tp's plan)")
    a.add_argument("--init", help="initial weights (gpt --save-init); default: initialise here")
    a.add_argument("--metrics", help="write the records here (metrics.jsonl's format)")
    a.add_argument("--out", help="rank 0 writes the final state dict here")
    args = a.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    backend = args.backend or ("nccl" if cuda else "gloo")
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{local_rank}" if backend == "nccl" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)

    vocabulary, train, validation = load_corpus(args.data, args.truncate, args.train_split,
                                                args.block_size)
    torch.manual_seed(args.seed)
    model = Gpt(len(vocabulary), args.block_size, args.n_layer, args.n_head, args.n_embd,
                args.dropout)
    if args.init:
        model.load_state_dict(torch.load(args.init))
    model.to(device)
    dp_rank, dp_size, tp = rank, world, args.tp
    if tp > 1:
        # gpt --tp's plan (Note [Tensor-parallel GPT] in model.h) with PyTorch's own styles.
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)
        if world != tp:
            sys.exit(f"gpt.py --tp {tp}: tensor parallelism over all {world} ranks only")
        plan = {}
        for i in range(args.n_layer):
            for name in ("attn.q", "attn.k", "attn.v", "mlp.fc"):
                plan[f"blocks.{i}.{name}"] = ColwiseParallel()
            for name in ("attn.proj", "mlp.proj"):
                plan[f"blocks.{i}.{name}"] = RowwiseParallel()
        parallelize_module(model, init_device_mesh(device.type, (tp,)), plan)
        dmodel, dp_rank, dp_size = model, 0, 1
    else:
        dmodel = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    torch.manual_seed(args.seed + dp_rank)

    named = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in named if Gpt.decays(n, p)], "weight_decay": args.weight_decay},
        {"params": [p for n, p in named if not Gpt.decays(n, p)], "weight_decay": 0.0},
    ]
    # (foreach kernels take DTensors or tensors, not both in one list)
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate, betas=(0.9, 0.95),
                                  foreach=False if tp > 1 else None)
    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    scaler = (torch.amp.GradScaler("cuda", enabled=args.amp and device.type == "cuda")
              if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler")
              else torch.cuda.amp.GradScaler(enabled=args.amp and device.type == "cuda"))
    sampler = DistributedSampler(range(len(train)), num_replicas=dp_size, rank=dp_rank,
                                 shuffle=True, seed=args.seed)
    eval_per_rank = min(len(validation), 1024) // dp_size

    def sum_over_ranks(values):
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.tolist()

    def validate():
        loss_sum, tokens = 0.0, 0.0
        model.eval()
        with torch.no_grad():
            for i in range(0, eval_per_rank, args.batch_size):
                begin = dp_rank * eval_per_rank + i
                end = dp_rank * eval_per_rank + min(eval_per_rank, i + args.batch_size)
                x, y = validation.batch(list(range(begin, end)))
                x, y = x.to(device), y.to(device)
                with torch.autocast(device.type, dtype=amp_dtype, enabled=args.amp):
                    logits = model(x)
                loss_sum += F.cross_entropy(logits.float().view(-1, len(vocabulary)), y.view(-1),
                                            reduction="sum").item()
                tokens += y.numel()
        model.train()
        s = sum_over_ranks([loss_sum, tokens])
        return s[0] / s[1]

    history = []
    sums = [0.0, 0.0, 0.0]  # loss, micro-batches, tokens since the last record
    start = time.time()
    interval = [time.time()]
    step = 0

    def record(epoch, with_validation):
        s = sum_over_ranks(sums)
        m = {"step": step, "epoch": epoch + 1}
        if s[1] > 0:
            m["train_loss"] = s[0] / s[1]
        if with_validation:
            m["val_loss"] = validate()
        m["tokens_per_s"] = s[2] / (time.time() - interval[0])
        m["seconds"] = time.time() - start
        m["world_size"] = world
        sums[:] = [0.0, 0.0, 0.0]
        if "train_loss" not in m and history and history[-1]["step"] == step:
            history[-1]["val_loss"] = m["val_loss"]
            m = history[-1]
        else:
            history.append(m)
        if rank == 0:
            line = f"step {step:6d}  epoch {m['epoch']}/{args.max_epochs}"
            if "train_loss" in m:
                line += f"  loss {m['train_loss']:.4f}"
            if "val_loss" in m:
                line += f"  val loss {m['val_loss']:.4f}"
            if "train_loss" in m:
                line += f"  {m['tokens_per_s']:8.0f} tok/s"
            print(line, flush=True)
            if args.metrics:
                with open(args.metrics, "w") as f:
                    f.writelines(json.dumps(r) + "\n" for r in history)
        interval[0] = time.time()

    stop = False
    for epoch in range(args.max_epochs):
        if stop:
            break
        sampler.set_epoch(epoch)
        indices = list(sampler)
        micro = [indices[i:i + args.batch_size] for i in range(0, len(indices), args.batch_size)]
        steps = [micro[i:i + args.grad_accum] for i in range(0, len(micro), args.grad_accum)]
        for group in steps:
            for k, batch in enumerate(group):
                x, y = train.batch(batch)
                x, y = x.to(device), y.to(device)
                sync = k + 1 == len(group)
                context = dmodel.no_sync() if not sync and tp == 1 else _null()
                with context:
                    with torch.autocast(device.type, dtype=amp_dtype, enabled=args.amp):
                        logits = dmodel(x)
                    loss = F.cross_entropy(logits.float().view(-1, len(vocabulary)), y.view(-1))
                    scaler.scale(loss / args.grad_accum).backward()
                sums[0] += loss.item()
                sums[1] += 1
                sums[2] += y.numel() / tp
            if scaler.is_enabled():
                scaler.unscale_(optimizer)
            if args.grad_norm_clip > 0 and tp > 1:
                clip_whole(model.parameters(), args.grad_norm_clip)
            elif args.grad_norm_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_norm_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            step += 1
            stop = args.max_steps > 0 and step >= args.max_steps
            if step % args.log_every == 0:
                record(epoch, False)
            if stop:
                break
        record(epoch, True)

    state = model.state_dict()
    if tp > 1:  # every rank takes part in gathering the DTensors
        state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}
    if rank == 0:
        if args.out:
            torch.save(state, args.out)
        print(f"done: {step} steps in {time.time() - start:.1f}s", flush=True)
    # Every rank is done before any releases its group, and the DDP wrapper, which holds the
    # group, goes first: PyTorch 2.x's Gloo can abort a process whose peer tears down its
    # connections while it still has work queued.
    dist.barrier()
    del dmodel
    gc.collect()
    dist.destroy_process_group()


def clip_whole(parameters, max_norm):
    """clip_grad_norm_ over gradients some of which are DTensors: the norm of the whole
    gradients (a sharded one gathered), in float64 as ddp::clip_grad_norm_."""
    grads = [p.grad for p in parameters if p.grad is not None]
    whole = [g.full_tensor() if hasattr(g, "full_tensor") else g for g in grads]
    total = sum(w.double().pow(2).sum() for w in whole).sqrt().item()
    coef = max_norm / (total + 1e-6)
    if coef < 1:
        for g in grads:
            g.mul_(coef)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
