"""Driver of bench/run-parallelisms: the GPT (examples/gpt) trained with each way of
splitting it - DDP, fully_shard, tensor parallel, tensor parallel + fully_shard,
pipeline - at 2 and 4 ranks on this machine; tokens per second (the median of the
configurations' medians over TRIALS turns) and the bytes each rank sends per step,
counted from the algorithms for the model's sizes. Writes bench/results/parallelisms.md
(docs/pipeline.md, docs/tensor_parallel.md)."""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

CONFIGS = [  # name, ranks, flags, dp, tp, pp
    ("DDP", 2, [], 2, 1, 1),
    ("fully_shard", 2, ["--fsdp"], 2, 1, 1),
    ("TP 2", 2, ["--tp", "2"], 1, 2, 1),
    ("PP 2 (1F1B, 4 microbatches)", 2, ["--pp", "2", "--microbatches", "4"], 1, 1, 2),
    ("DDP", 4, [], 4, 1, 1),
    ("fully_shard", 4, ["--fsdp"], 4, 1, 1),
    ("TP 2 + fully_shard over dp 2", 4, ["--tp", "2", "--fsdp"], 2, 2, 1),
    ("TP 4", 4, ["--tp", "4"], 1, 4, 1),
    ("PP 2 x dp 2", 4, ["--pp", "2", "--microbatches", "4"], 2, 1, 2),
    ("PP 4 (1F1B, 4 microbatches)", 4, ["--pp", "4", "--microbatches", "4"], 1, 1, 4),
]


def ring(n, nbytes):
    """Bytes one rank sends in a ring all-reduce of nbytes over n ranks."""
    return 2 * (n - 1) / n * nbytes if n > 1 else 0


def gather(n, nbytes):
    """... in an all-gather or reduce-scatter whose whole is nbytes."""
    return (n - 1) / n * nbytes if n > 1 else 0


def volume(a, vocab, dp, tp, pp, fsdp):
    """Bytes one rank sends per step (fp32), by the algorithms' definitions."""
    c, t, b, layers = a.n_embd, a.block_size, a.batch_size, a.n_layer
    block = 12 * c * c + 9 * c  # q, k, v, proj, fc, proj weights and biases, 2 LayerNorms
    rest = vocab * c + t * c + 2 * c  # wte, wpe, ln_f
    params = layers * block + rest
    act = b * t * c * 4  # one activation of the step's batch, bytes
    sent = 0.0
    # Tensor parallel: per block, forward all-reduces after attn.proj and mlp.proj, and
    # backward all-reduces of the inputs of q/k/v and fc (copy_to): four of the batch's
    # activations.
    sent += layers * 4 * ring(tp, act)
    # Pipeline: each boundary sends the batch's activations forward and their gradients
    # back; a rank sends over at most one boundary each way. The tied wte's gradient is
    # all-reduced between the first and the last stage.
    if pp > 1:
        sent += act + ring(2, vocab * c * 4)
    per_rank_params = (layers * block // tp + rest) / pp
    if fsdp:
        # all-gather forward and backward, reduce-scatter of the gradients
        sent += 3 * gather(dp, per_rank_params * 4)
    else:
        sent += ring(dp, per_rank_params * 4)
    return sent


def vocab_size(text):
    with open(text, encoding="utf-8") as f:
        return len(set(f.read()))


def run(ddprun, gpt, ranks, flags, text, size, steps, work):
    name = "b%d" % abs(hash((ranks, tuple(flags))))
    cmd = [ddprun, "--nproc-per-node", str(ranks), "--no-prefix", "--", gpt, "--data", text,
           "--run-dir", work, "--name", name, "--max-steps", str(steps), "--log-every", "5",
           "--no-save", "--sample-length", "0", "--dropout", "0", "--threads", "1"] + size + flags
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    with open(os.path.join(work, name, "metrics.jsonl")) as f:
        records = [json.loads(l) for l in f if l.strip()]
    rates = [r["tokens_per_s"] for r in records if "train_loss" in r and r["step"] > 5]
    return statistics.median(rates)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--n-head", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--data", default="/usr/share/games/fortunes/songs-poems")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "parallelisms.md"))
    a = ap.parse_args()
    ddprun = os.path.join(a.build_dir, "bin", "ddprun")
    gpt = os.path.join(a.build_dir, "bin", "gpt")
    size = ["--n-layer", str(a.n_layer), "--n-embd", str(a.n_embd), "--n-head", str(a.n_head),
            "--block-size", str(a.block_size), "--batch-size", str(a.batch_size)]
    vocab = vocab_size(a.data)
    rates = {i: [] for i in range(len(CONFIGS))}
    with tempfile.TemporaryDirectory(prefix="ddp-bench-par-") as work:
        for trial in range(a.trials):
            for i, (name, ranks, flags, dp, tp, pp) in enumerate(CONFIGS):
                rates[i].append(run(ddprun, gpt, ranks, flags, a.data, size, a.steps, work))
                print(f"trial {trial + 1}: {name} at {ranks}: {rates[i][-1]:.0f} tok/s",
                      flush=True)
    lines = [
        "# The GPT split five ways",
        "",
        f"`bench/run-parallelisms`, {datetime.date.today()}: examples/gpt at {a.n_layer} "
        f"layers, n_embd {a.n_embd}, {a.n_head} heads, block {a.block_size}, "
        f"{a.batch_size} windows per data-parallel replica per step (vocabulary {vocab}), "
        f"one thread per rank, on this machine's 2 cores (4 ranks oversubscribe them). "
        f"Tokens per second: the median over {a.trials} turns of each run's median over its "
        f"{a.steps} steps (the first 5 left out). Bytes sent per rank per step: counted "
        "from the algorithms for these sizes (ring all-reduce 2(n-1)/n, all-gather and "
        "reduce-scatter (n-1)/n of the whole), float32.",
        "",
        "| ranks | split | tokens/s | vs DDP | MB sent per rank per step |",
        "|---:|---|---:|---:|---:|",
    ]
    for i, (name, ranks, flags, dp, tp, pp) in enumerate(CONFIGS):
        med = statistics.median(rates[i])
        base = statistics.median(rates[[j for j, c in enumerate(CONFIGS)
                                        if c[0] == "DDP" and c[1] == ranks][0]])
        mb = volume(a, vocab, dp, tp, pp, "--fsdp" in flags) / 1e6
        lines.append(f"| {ranks} | {name} | {med:.0f} | {med / base:.2f} | {mb:.2f} |")
    lines += ["", "Each run's tokens/s:", "", "```"]
    for i, c in enumerate(CONFIGS):
        lines.append(f"{c[1]} ranks, {c[0]}: " + ", ".join(f"{r:.0f}" for r in rates[i]))
    lines += ["```", ""]
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
