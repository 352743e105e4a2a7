"""The Python side of lamp's Python interop tests (tests/python_interop_test.cpp).

Each command writes what Python writes, or checks what lamp wrote, with the
real torch; it exits 0 when the check holds and prints the difference and
exits 1 when it does not.

  write_scaler PATH        torch.save of a torch.amp.GradScaler's state_dict
                           after two finite steps (init_scale=1024,
                           growth_factor=3, backoff_factor=0.25,
                           growth_interval=7: scale 1024, tracker 2)
  write_disabled_scaler PATH   torch.save of a disabled scaler's state ({})
  check_scaler PATH JSON   torch.load(PATH) equals the dict JSON (types
                           included), and GradScaler.load_state_dict accepts
                           it and gives back its Python keys
  check_loads NAME STATE   bench/peer_pytorch.py's model NAME loads the
                           state_dict STATE (strict), FP32 and int64 on the CPU
  check_model NAME STATE IO   bench/peer_pytorch.py's model NAME loads the
                           state_dict STATE (strict); in eval mode its output
                           on IO's "input" matches IO's "output"
  check_custom STATE IO    CustomTree (tests/custom_tree.h's twin) loads the
                           state_dict STATE (strict) whose keys are its
                           state_dict's in its order; in eval mode its output
                           on IO's "input" matches IO's "output"
  check_gpt STATE TEXT LOG --layers L --heads H --width C --context T
            [--bias B] [--norm N] [--gelu G] [--rtol R]
                           bench/peer_pytorch.py's GPT of that shape (in
                           nanoGPT's layout, NanoGPTLayout, when STATE's keys
                           are "transformer."'s) loads the state_dict STATE
                           (strict, FP32 on the CPU); in eval mode its loss on
                           TEXT's validation part matches the "test_loss" of
                           LOG's last "epoch" record to relative tolerance R
                           (default 1e-3)
"""

import argparse
import json
import math
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
# Importing bench/peer_pytorch.py leaves no __pycache__ in the source tree.
sys.dont_write_bytecode = True

PYTHON_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval",
               "_growth_tracker")


def fail(message):
    print("lamp_interop.py: " + message, flush=True)
    sys.exit(1)


def write_scaler(path):
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_factor=3.0,
                                  backoff_factor=0.25, growth_interval=7)
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([param], lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        scaler.scale((param * 2).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
    state = scaler.state_dict()
    if state["_growth_tracker"] != 2 or state["scale"] != 1024.0:
        fail("unexpected Python state %r" % state)
    torch.save(state, path)


def write_disabled_scaler(path):
    torch.save(torch.amp.GradScaler("cpu", enabled=False).state_dict(), path)


def same(a, b):
    """Equal values of the same Python type (1 == 1.0 is not enough)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isinf(a):
        return a == b
    return a == b


def check_scaler(path, expected_json):
    expected = json.loads(expected_json)
    # JSON has no inf: lamp's max_scale comes as the string "inf".
    expected = {k: float(v) if v == "inf" else v for k, v in expected.items()}
    state = torch.load(path)  # weights_only, torch's default since 2.6
    if not isinstance(state, dict):
        fail("torch.load gave a %s, not a dict" % type(state).__name__)
    if list(state) != list(expected) or not all(
            same(state[k], expected[k]) for k in expected):
        fail("torch.load gave %r, expected %r" % (state, expected))
    scaler = torch.amp.GradScaler("cpu")
    if not state:
        return
    scaler.load_state_dict(state)
    back = scaler.state_dict()
    python_part = {k: state[k] for k in PYTHON_KEYS}
    if back != python_part:
        fail("GradScaler.load_state_dict then state_dict gave %r, expected %r"
             % (back, python_part))


def load_model(name, state_path):
    import peer_pytorch

    state = torch.load(state_path)
    for key, tensor in state.items():
        want = torch.int64 if key.endswith("num_batches_tracked") else torch.float32
        if tensor.dtype != want or tensor.device.type != "cpu":
            fail("%s is %s on %s, expected %s on cpu"
                 % (key, tensor.dtype, tensor.device, want))
    model = peer_pytorch.make_model(name)
    model.load_state_dict(state, strict=True)
    return model


def check_loads(name, state_path):
    load_model(name, state_path)


def check_model(name, state_path, io_path):
    model = load_model(name, state_path)
    model.eval()
    io = torch.load(io_path)
    with torch.no_grad():
        output = model(io["input"])
    expected = io["output"]
    # FP32 on the CPU: the same operations, but another LibTorch's kernels
    # may sum in another order; float32 rounding then differs by a few ulps
    # per layer, far below 1e-5 of the outputs' size.
    atol = 1e-5 * max(1.0, expected.abs().max().item())
    if not torch.allclose(output, expected, rtol=1e-5, atol=atol):
        fail("%s: max |python - lamp| = %g (atol %g)"
             % (name, (output - expected).abs().max().item(), atol))
    print("%s: max |python - lamp| = %g" % (name, (output - expected).abs().max().item()))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4))
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 4),
                                        torch.nn.BatchNorm1d(4))
        self.register_buffer("offset", torch.zeros(4))

    def forward(self, x):
        return x * self.scale + self.body(x) + self.offset


class CustomTree(torch.nn.Module):
    """tests/custom_tree.h's CustomTree, written as a Python user would."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Linear(3, 4)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.heads = torch.nn.ModuleDict({
            "main": torch.nn.Linear(4, 2),
            "aux": torch.nn.Linear(4, 3, bias=False)})
        self.norm = torch.nn.BatchNorm1d(4, track_running_stats=False)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        return torch.cat([self.heads["main"](x), self.heads["aux"](x)], 1)


def check_custom(state_path, io_path):
    state = torch.load(state_path)
    model = CustomTree()
    if list(state) != list(model.state_dict()):
        fail("keys %s, Python's state_dict has %s"
             % (list(state), list(model.state_dict())))
    model.load_state_dict(state, strict=True)
    model.eval()
    io = torch.load(io_path)
    with torch.no_grad():
        output = model(io["input"])
    if not torch.allclose(output, io["output"], rtol=1e-5, atol=1e-5):
        fail("custom tree: max |python - lamp| = %g"
             % (output - io["output"]).abs().max().item())
    print("custom tree: %d keys, max |python - lamp| = %g"
          % (len(state), (output - io["output"]).abs().max().item()))


def check_rms_norm(state_path, io_path):
    """lamp::nn::RMSNorm's state dict loads strictly into torch.nn.RMSNorm
    of the same shape and eps, and gives lamp's outputs, in FP32 and (from
    the same FP32 weight) on a BF16 input."""
    if not hasattr(torch.nn, "RMSNorm"):
        print("torch %s has no torch.nn.RMSNorm (2.4 and later)"
              % torch.__version__)
        return
    state = torch.load(state_path)
    io = torch.load(io_path)
    norm = torch.nn.RMSNorm(list(state["weight"].shape),
                            eps=float(io["eps"].item()))
    norm.load_state_dict(state, strict=True)
    with torch.no_grad():
        fp32 = norm(io["input"])
        bf16 = norm(io["input"].to(torch.bfloat16).float()).to(torch.bfloat16)
    # FP32: the same formula, summed in another order: a few ulp.
    if not torch.allclose(fp32, io["output"], rtol=1e-5, atol=1e-6):
        fail("RMSNorm FP32: max |python - lamp| = %g"
             % (fp32 - io["output"]).abs().max().item())
    # BF16 input: lamp computes in FP32 and rounds once, as Python does on
    # the same FP32 values: equal, or one BF16 ulp apart (2^-7 of the value
    # at most).
    diff = (bf16.float() - io["output_bf16"].float()).abs()
    bound = io["output_bf16"].float().abs() * 2.0 ** -7 + 1e-6
    if not bool((diff <= bound).all()):
        fail("RMSNorm BF16: max |python - lamp| = %g" % diff.max().item())
    print("RMSNorm: FP32 max |python - lamp| = %g; BF16 %d of %d equal"
          % ((fp32 - io["output"]).abs().max().item(),
             int((diff == 0).sum()), diff.numel()))


class NanoGPTLayout(torch.nn.Module):
    """bench/peer_pytorch.py's GPT under nanoGPT's model.py names: the model
    as "transformer" and the output head "lm_head", tied to its wte (one
    tensor, as nanoGPT ties them). A state dict nanoGPT's GPT loads strictly
    loads strictly here, and the other way round."""

    def __init__(self, shape):
        import peer_pytorch

        super().__init__()
        self.transformer = peer_pytorch.GPT(shape)
        self.lm_head = torch.nn.Linear(shape.width, shape.vocab_size,
                                       bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, tokens):
        return self.transformer(tokens)


def validation_loss(model, data, context, windows_per_batch=64):
    """The mean cross-entropy of `model` over every target of the validation
    windows of `data` (the text's bytes), train_gpt's split: the first
    floor(0.9 n) bytes train, the rest (m bytes) validate, in windows
    k = 0 .. (m - 1) // context - 1 of inputs [k T, k T + T) and targets
    [k T + 1, k T + T + 1) of the validation part. Returns (loss, windows)."""
    validation = data[int(0.9 * len(data)):]
    windows = (len(validation) - 1) // context
    if windows < 1:
        fail("the validation part of the text (%d of its %d bytes) is shorter "
             "than one window of context %d + 1 bytes; give a longer text or "
             "a shorter --context" % (len(validation), len(data), context))
    tokens = torch.tensor(list(validation[:windows * context + 1]),
                          dtype=torch.int64)
    inputs = tokens[:-1].view(windows, context)
    targets = tokens[1:].view(windows, context)
    total = 0.0
    with torch.no_grad():
        for start in range(0, windows, windows_per_batch):
            stop = min(start + windows_per_batch, windows)
            logits = model(inputs[start:stop])
            total += torch.nn.functional.cross_entropy(
                logits.flatten(0, 1).float(), targets[start:stop].flatten(),
                reduction="sum").double().item()
    return total / (windows * context), windows


def last_epoch_record(log_path):
    """The last "epoch" record of a --log-json file (JSON Lines; the record
    kind under "record", as examples/common/json_log.cpp writes it)."""
    last = None
    with open(log_path) as log:
        for number, line in enumerate(log, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as error:
                fail("%s line %d is not JSON (%s)" % (log_path, number, error))
            if isinstance(record, dict) and record.get("record") == "epoch":
                last = record
    if last is None:
        fail("%s has no \"epoch\" record; give the --log-json file of a run "
             "that finished an epoch" % log_path)
    return last


def check_gpt(argv):
    import peer_pytorch

    parser = argparse.ArgumentParser(
        prog="lamp_interop.py check_gpt",
        description="Loads lamp's GPT state dict into bench/peer_pytorch.py's "
                    "GPT and checks its validation loss on the text against "
                    "the last epoch's test_loss in the log.")
    parser.add_argument("state")
    parser.add_argument("text")
    parser.add_argument("log")
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--context", type=int, required=True)
    parser.add_argument("--bias", choices=("true", "false"), default="true")
    parser.add_argument("--norm", choices=("layernorm", "rmsnorm"),
                        default="layernorm")
    parser.add_argument("--gelu", choices=("exact", "tanh"), default="exact")
    parser.add_argument("--layout", choices=("lamp", "nanogpt", "huggingface"),
                        default=None,
                        help="the names the file must have (default: any)")
    parser.add_argument("--rtol", type=float, default=1e-3,
                        help="relative tolerance (default 1e-3, an FP32 "
                             "evaluation in C++ against this one)")
    args = parser.parse_args(argv)

    state = torch.load(args.state)
    for key, tensor in state.items():
        if tensor.dtype != torch.float32 or tensor.device.type != "cpu":
            fail("%s is %s on %s, expected torch.float32 on cpu"
                 % (key, tensor.dtype, tensor.device))
    shape = peer_pytorch.GPTShape(layers=args.layers, heads=args.heads,
                                  width=args.width, context=args.context,
                                  bias=args.bias == "true", norm=args.norm,
                                  gelu=args.gelu)
    nanogpt = any(key.startswith("transformer.") for key in state)
    if args.layout is not None and nanogpt != (args.layout != "lamp"):
        fail("%s has %s names, expected the %s layout's"
             % (args.state, "nanoGPT's" if nanogpt else "lamp's", args.layout))
    if args.layout == "huggingface":
        # Hugging Face's Conv1D weights are [in, out]: a Linear's transposed.
        conv1d = (".attn.c_attn.weight", ".attn.c_proj.weight",
                  ".mlp.c_fc.weight", ".mlp.c_proj.weight")
        for key in state:
            if key.endswith(conv1d):
                state[key] = state[key].t()
    model = NanoGPTLayout(shape) if nanogpt else peer_pytorch.GPT(shape)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:
        fail("%s does not load into %s: %s" % (args.state, shape, error))
    model.eval()

    with open(args.text, "rb") as text:
        data = text.read()
    loss, windows = validation_loss(model, data, args.context)
    record = last_epoch_record(args.log)
    if record.get("test_subset"):
        fail("the log's last epoch evaluated a subset of the validation set "
             "(test_subset true, %s of %s batches); its test_loss is not the "
             "whole set's" % (record.get("test_batches"),
                              record.get("test_batches_in_set")))
    logged = record.get("test_loss")
    if not isinstance(logged, (int, float)) or not math.isfinite(logged):
        fail("the log's last epoch record has no finite test_loss (%r)"
             % (logged,))
    difference = abs(loss - logged) / max(abs(logged), 1e-12)
    summary = ("%s, %d validation windows of %d tokens: python %.6f, lamp "
               "%.6f (epoch %s, %s), relative difference %.3g (rtol %g)"
               % (shape, windows, args.context, loss, logged,
                  record.get("epoch"), record.get("precision"), difference,
                  args.rtol))
    if not difference <= args.rtol:
        fail("validation loss differs: " + summary)
    print(summary)


def main(argv):
    if len(argv) >= 2 and argv[1] == "check_gpt":
        check_gpt(argv[2:])
        return 0
    commands = {
        "write_scaler": (write_scaler, 1),
        "write_disabled_scaler": (write_disabled_scaler, 1),
        "check_scaler": (check_scaler, 2),
        "check_loads": (check_loads, 2),
        "check_model": (check_model, 3),
        "check_custom": (check_custom, 2),
        "check_rms_norm": (check_rms_norm, 2),
    }
    if len(argv) < 2 or argv[1] not in commands or \
            len(argv) - 2 != commands[argv[1]][1]:
        print(__doc__)
        return 2
    commands[argv[1]][0](*argv[2:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
