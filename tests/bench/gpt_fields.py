#!/usr/bin/env python3
"""lamp_bench --model gpt's shape flags and its MFU field.

Usage: gpt_fields.py LAMP_BENCH WORK_DIR

- --gpt-vocab, --gpt-gelu, --fused-head-loss, --fused-add-norm,
  --fused-mlp, --fused-weight-cast and --fused-bias-grad reach the model
  and the JSON record (vocab_size, gpt_gelu, fused_head_loss,
  fused_add_norm, fused_mlp, fused_weight_cast, fused_bias_grad),
  kernel_paths names the code the fused operations ran (ATen ops on a CPU;
  no casts in fp32), and the fused model's loss is the unfused one's;
- mfu is tflops over --peak-tflops, and null without a known peak (a CPU);
- --gpt-shape is refused beside a shape flag, naming it.
"""

import json
import os
import subprocess
import sys


def fail(message):
    print("FAILED: " + message)
    sys.exit(1)


def bench(lamp_bench, json_path, *extra):
    args = [lamp_bench, "--model", "gpt", "--device", "cpu", "--precision",
            "fp32", "--batch-size", "2", "--warmup", "0", "--steps", "1",
            "--json", json_path] + list(extra)
    print("$ " + " ".join(args))
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        fail(f"exit {r.returncode}: {r.stderr.strip()!r}")
    with open(json_path) as f:
        return json.load(f)["results"][0]


def main(argv):
    if len(argv) != 2:
        print(__doc__)
        return 2
    lamp_bench, work = argv
    os.makedirs(work, exist_ok=True)
    tiny = ["--gpt-layers", "1", "--gpt-heads", "2", "--gpt-width", "32",
            "--context", "16", "--gpt-vocab", "1000"]
    fused = bench(lamp_bench, os.path.join(work, "fused.json"), *tiny,
                  "--fused-head-loss", "--fused-add-norm", "--fused-mlp",
                  "--fused-weight-cast", "--fused-bias-grad", "--gpt-gelu",
                  "tanh",
                  "--peak-tflops", "2")
    if fused["vocab_size"] != 1000 or fused["fused_head_loss"] is not True \
            or fused["fused_add_norm"] is not True \
            or fused["fused_mlp"] is not True \
            or fused["fused_weight_cast"] is not True \
            or fused["fused_bias_grad"] is not True \
            or fused["gpt_gelu"] != "tanh" \
            or "gelu=tanh" not in fused["gpt_name"] \
            or fused["kernel_paths"] != [
                "residual adds fused with their norms: ATen ops: the "
                "tensors are on cpu, the kernel is CUDA's",
                "MLPs with their biases and GELU fused: ATen ops: the "
                "tensors are on cpu, cuBLASLt is CUDA's",
                "Linear weights cast to autocast's dtype at once: nothing "
                "to cast (fp32 runs without autocast)",
                "bias gradients in the weight-gradient products: ATen ops: "
                "the tensors are on cpu, cuBLASLt is CUDA's"]:
        fail(f"the record lacks the vocabulary or the switches: {fused}")
    if not (fused["tflops"] > 0 and
            abs(fused["mfu"] - fused["tflops"] / 2) <= 1e-12 and
            fused["peak_tflops"] == 2):
        fail(f"mfu {fused['mfu']} is not tflops {fused['tflops']} over "
             f"the peak 2")
    plain = bench(lamp_bench, os.path.join(work, "plain.json"), *tiny,
                  "--gpt-gelu", "tanh")
    if plain["fused_head_loss"] is not False or \
            plain["fused_add_norm"] is not False or \
            plain["fused_mlp"] is not False or \
            plain["fused_weight_cast"] is not False or \
            plain["fused_bias_grad"] is not False or \
            plain["kernel_paths"] != [] \
            or plain["mfu"] is not None \
            or plain["peak_tflops"] is not None:
        fail(f"without --peak-tflops a CPU has no peak and no MFU: {plain}")
    # The same random batch and weights: the same loss to FP32 rounding.
    if abs(plain["final_loss"] - fused["final_loss"]) > \
            1e-5 * abs(plain["final_loss"]):
        fail(f"final loss {fused['final_loss']} fused, "
             f"{plain['final_loss']} unfused")
    args = [lamp_bench, "--model", "gpt", "--gpt-shape", "gpt2-124m",
            "--gpt-width", "512", "--device", "cpu"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if r.returncode == 0 or "--gpt-shape" not in r.stderr:
        fail(f"--gpt-shape beside --gpt-width: exit {r.returncode}, "
             f"{r.stderr!r}")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
