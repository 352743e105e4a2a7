#!/usr/bin/env python3
"""nanoGPT's own model in a plain PyTorch training loop, timed the way
train_gpt reports itself, for a side-by-side comparison on the same
LibTorch, threads and data.

  nanogpt_loop.py --nanogpt DIR --data FILE [--precision fp32|amp-bf16]
                  [--layers 2 --heads 2 --width 128 --context 64]
                  [--batch-size 32 --steps 200 --threads 2]

DIR is a checkout of https://github.com/karpathy/nanoGPT (its model.py is
imported from there, nothing of it is copied here). The text is read as
bytes and split as train_gpt splits it (the first 90% train, the rest
validate), cut into windows of --context bytes that follow each other,
shuffled each epoch; the loop is nanoGPT's train.py reduced to what a CPU
run does: AdamW from model.configure_optimizers (weight decay 0.1 on the
2-D tensors, betas 0.9 and 0.99), a constant lr of 1e-3 (give train_gpt
--schedule constant to compare), gradient clipping at 1.0, and for amp-bf16
torch.autocast("cpu", dtype=torch.bfloat16). The first step is warm-up and
not timed (train_gpt's rule); the train loss is the mean over every step
(train_gpt's epoch line's). Prints one line:
  nanogpt: PRECISION  tokens/s T  train loss L  val loss V  threads N
"""

import argparse
import math
import os
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nanogpt", required=True, help="a nanoGPT checkout")
    p.add_argument("--data", required=True, help="a text file")
    p.add_argument("--precision", default="fp32", choices=["fp32", "amp-bf16"])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-batches", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main():
    args = parse()
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    sys.path.insert(0, os.path.abspath(args.nanogpt))
    from model import GPT, GPTConfig  # nanoGPT's model.py

    with open(args.data, "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    cut = int(len(data) * 0.9)
    parts = {"train": data[:cut], "val": data[cut:]}

    def windows(part):
        n = (len(part) - 1) // args.context
        x = part[: n * args.context].view(n, args.context).long()
        y = part[1 : n * args.context + 1].view(n, args.context).long()
        return x, y

    train_x, train_y = windows(parts["train"])
    val_x, val_y = windows(parts["val"])
    model = GPT(GPTConfig(block_size=args.context, vocab_size=256,
                          n_layer=args.layers, n_head=args.heads,
                          n_embd=args.width, dropout=0.0, bias=True))
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    autocast = args.precision == "amp-bf16"

    def loss_of(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            _, loss = model(x, y)
        return loss

    order = torch.randperm(len(train_x))
    position, losses, start = 0, [], None
    model.train()
    for step in range(args.steps):
        if position + args.batch_size > len(order):
            order, position = torch.randperm(len(train_x)), 0
        batch = order[position : position + args.batch_size]
        position += args.batch_size
        loss = loss_of(train_x[batch], train_y[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step == 0:
            start = time.perf_counter()  # the first step is warm-up
    seconds = time.perf_counter() - start
    tokens = (args.steps - 1) * args.batch_size * args.context
    model.eval()
    with torch.no_grad():
        val = [loss_of(val_x[i : i + args.batch_size],
                       val_y[i : i + args.batch_size]).item()
               for i in range(0, min(len(val_x),
                                     args.eval_batches * args.batch_size),
                              args.batch_size)]
    # The mean over every step, as train_gpt's epoch line gives it.
    print(f"nanogpt: {args.precision}  tokens/s {tokens / seconds:.0f}  "
          f"train loss {sum(losses) / len(losses):.4f}  val loss "
          f"{sum(val) / len(val):.4f}  threads {torch.get_num_threads()}")
    return 0 if all(math.isfinite(v) for v in val) else 1


if __name__ == "__main__":
    sys.exit(main())
