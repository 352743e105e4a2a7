#!/usr/bin/env python3
"""The Python PyTorch peer of lamp_bench: the same training step, timed the
same way, so lamp's C++ numbers can be compared with PyTorch at its best on
one machine in one run: eager (foreach or fused SGD), torch.compile (default
or reduce-overhead, foreach or fused SGD) and the whole step captured in one
CUDA graph (see TOOLS).

Models: the CIFAR-style ResNet18/34/50 (3x3 stem, stride 1, no max-pool) and
the MNIST CNN, with lamp's module names and parameter counts (checked at
startup). Data: one fixed synthetic batch, already on the device. Step: SGD
(lr 0.1, momentum 0.9, Nesterov, weight decay 5e-4), zero_grad(set_to_none),
forward, cross_entropy on FP32 logits, backward, step.

Precision modes (lamp's names):
  fp32      FP32, TF32 off (cuBLAS and cuDNN)
  tf32      FP32 weights, TF32 on (cuBLAS and cuDNN)
  amp       torch.autocast(float16) + dynamic loss scaling (GradScaler)
  amp-bf16  torch.autocast(bfloat16), no scaling
  half      fastai's network_to_half: FP16 model, BatchNorm FP32, input cast to
            FP16, FP32 master weights in the optimizer, dynamic loss scaling
  bf16      the same in bfloat16, no scaling
amp/amp-bf16/half/bf16 leave TF32 at PyTorch's defaults (cuDNN on, cuBLAS
off). A mode the device cannot run with this torch (FP16 on CPU with torch
1.13), or a tool it cannot run (fused SGD before torch 2, the whole-step CUDA
graph on a CPU), is reported as skipped, with the reason.

Every result also says how many steps the loss scaler skipped (overflow),
the final loss and whether it and every parameter are finite, and on CUDA
the steady-state peak (reset after warm-up, so cuDNN's autotuning workspace
is not counted) and the reserved bytes after the timed steps (CUDA-graph
pools included).

Only the standard library and torch are needed (torch 1.13 or 2.x).
"""

import argparse
import collections
import contextlib
import datetime
import gc
import inspect
import json
import math
import platform
import resource
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

PRECISIONS = ("fp32", "tf32", "amp", "amp-bf16", "half", "bf16")
MODELS = ("resnet18", "resnet34", "resnet50", "cnn")

# lamp's counts (include/lamp/models/*.h) for 10 classes; a mismatch means the
# two tools would not be timing the same network.
EXPECTED_PARAMETERS = {
    "resnet18": 11173962,
    "resnet34": 21282122,
    "resnet50": 23520842,
    "cnn": 28938,
}


# ---------------------------------------------------------------------------
# Models (the same layers and names as lamp's C++ ones)
# ---------------------------------------------------------------------------


def _projection(in_planes, out_planes, stride):
    """The 1x1 convolution + BatchNorm shortcut, or None for the identity."""
    if stride == 1 and in_planes == out_planes:
        return None
    return nn.Sequential(
        nn.Conv2d(in_planes, out_planes, 1, stride=stride, bias=False),
        nn.BatchNorm2d(out_planes),
    )


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1,
                               bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1,
                               bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = _projection(in_planes, planes * self.expansion, stride)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out = out + (x if self.shortcut is None else self.shortcut(x))
        return F.relu(out)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1,
                               bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.shortcut = _projection(in_planes, planes * self.expansion, stride)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out = out + (x if self.shortcut is None else self.shortcut(x))
        return F.relu(out)


class ResNet(nn.Module):
    def __init__(self, block, blocks, num_classes=10, in_channels=3):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1,
                               bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.in_planes = 64
        self.layer1 = self._stage(block, 64, blocks[0], 1)
        self.layer2 = self._stage(block, 128, blocks[1], 2)
        self.layer3 = self._stage(block, 256, blocks[2], 2)
        self.layer4 = self._stage(block, 512, blocks[3], 2)
        self.linear = nn.Linear(512 * block.expansion, num_classes)

    def _stage(self, block, planes, num_blocks, stride):
        layers = []
        for i in range(num_blocks):
            layers.append(block(self.in_planes, planes, stride if i == 0 else 1))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*layers)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


class MnistCNN(nn.Module):
    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.fc = nn.Linear(32 * 7 * 7, num_classes)

    def forward(self, x):
        out = F.max_pool2d(F.relu(self.conv1(x)), 2)
        out = F.max_pool2d(F.relu(self.conv2(out)), 2)
        return F.log_softmax(self.fc(out.flatten(1)), dim=1)


def make_model(name):
    if name == "resnet18":
        return ResNet(BasicBlock, (2, 2, 2, 2))
    if name == "resnet34":
        return ResNet(BasicBlock, (3, 4, 6, 3))
    if name == "resnet50":
        return ResNet(Bottleneck, (3, 4, 6, 3))
    if name == "cnn":
        return MnistCNN()
    raise ValueError("unknown model %r; valid names are %s"
                     % (name, ", ".join(MODELS)))


def count_parameters(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def input_shape(model_name):
    return (1, 28, 28) if model_name == "cnn" else (3, 32, 32)


# ---------------------------------------------------------------------------
# Precision machinery
# ---------------------------------------------------------------------------


def autocast_dtype(precision):
    return {"amp": torch.float16, "amp-bf16": torch.bfloat16}.get(precision)


def model_dtype(precision):
    return {"half": torch.float16, "bf16": torch.bfloat16}.get(precision)


def uses_loss_scaling(precision):
    return precision in ("amp", "half")


def network_to_half(model, dtype):
    """fastai's network_to_half, in place: everything to `dtype`, then every
    BatchNorm back to FP32 (cuDNN and ATen take low-precision inputs with
    FP32 BatchNorm weights). The input is cast by the caller."""
    model.to(dtype)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.float()
    return model


class MasterWeights:
    """FP32 copies of the model's parameters for the optimizer (Micikevicius
    et al. 2018; Apex's prep_param_lists): gradients are copied model ->
    master after backward, weights master -> model after the step."""

    def __init__(self, params):
        self.model_params = [p for p in params if p.requires_grad]
        self.master_params = []
        for p in self.model_params:
            master = p.detach().clone().float().requires_grad_(True)
            master.grad = torch.zeros_like(master)
            self.master_params.append(master)

    def model_grads_to_master_grads(self):
        model_grads = []
        master_grads = []
        for p, m in zip(self.model_params, self.master_params):
            if p.grad is None:
                m.grad.zero_()
            else:
                model_grads.append(p.grad)
                master_grads.append(m.grad)
        _copy_all(master_grads, model_grads)

    def master_params_to_model_params(self):
        with torch.no_grad():
            _copy_all(self.model_params, self.master_params)


def _copy_all(dst, src):
    if not dst:
        return
    if hasattr(torch, "_foreach_copy_"):
        # One fused launch per dtype group instead of one per tensor.
        torch._foreach_copy_(dst, src)
    else:
        for d, s in zip(dst, src):
            d.copy_(s)


class PortableGradScaler:
    """Dynamic loss scaling where torch has no GradScaler for the device
    (CPU before torch 2.3): PyTorch's defaults and rule (scale 2**16, halve
    and skip the step on inf/NaN, double after 2000 finite steps). It reads
    the overflow flag on the host, one sync per step."""

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0,
                 backoff_factor=0.5, growth_interval=2000):
        self._scale = init_scale
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._growth_tracker = 0
        self._found_inf = False

    def scale(self, loss):
        return loss * self._scale

    def step(self, optimizer):
        grads = [p.grad for group in optimizer.param_groups
                 for p in group["params"] if p.grad is not None]
        inv_scale = 1.0 / self._scale
        finite = True
        for g in grads:
            g.mul_(inv_scale)
            finite = finite and bool(torch.isfinite(g).all())
        self._found_inf = not finite
        if finite:
            optimizer.step()

    def update(self):
        if self._found_inf:
            self._scale *= self._backoff_factor
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self._growth_interval:
                self._scale *= self._growth_factor
                self._growth_tracker = 0


def found_inf_flag(scaler, optimizer):
    """The overflow flag of the step just taken (between scaler.step and
    scaler.update): a tensor, 1 where the gradients held an inf or NaN
    (summed over devices), read without a host sync, or None where
    this torch's GradScaler keeps it elsewhere. torch's GradScaler has no
    public accessor; its per-optimizer state holds one flag per device."""
    if isinstance(scaler, PortableGradScaler):
        return torch.tensor(float(scaler._found_inf))
    states = getattr(scaler, "_per_optimizer_states", None)
    state = states.get(id(optimizer)) if isinstance(states, dict) else None
    flags = list((state or {}).get("found_inf_per_device", {}).values())
    if not flags:
        return None
    total = flags[0]
    for flag in flags[1:]:
        total = total + flag.to(total.device)
    return total


def make_grad_scaler(device):
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(device)  # torch >= 2.3
    if device == "cuda":
        return torch.cuda.amp.GradScaler()
    return PortableGradScaler()


def _first_line(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def unsupported_reason(precision, device):
    """Why this torch cannot run `precision` on `device`, or None. Probes the
    operations the models use instead of trusting version numbers."""
    x = torch.randn(2, 4, 8, 8, device=device)
    w = torch.randn(4, 4, 3, 3, device=device)
    name = {"amp": "FP16 autocast", "amp-bf16": "BF16 autocast",
            "half": "FP16 compute", "bf16": "BF16 compute"}.get(precision)
    dtype = autocast_dtype(precision)
    if dtype is not None:
        try:
            # torch 1.13 refuses (RuntimeError) or warns and disables
            # autocast for a dtype the device cannot autocast to.
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                with torch.autocast(device, dtype=dtype):
                    y = F.conv2d(x, w, padding=1)
        except RuntimeError as error:
            return ("%s is not supported on %s by torch %s (%s); use "
                    "amp-bf16 or bf16 on CPU"
                    % (name, device, torch.__version__, _first_line(error)))
        if y.dtype != dtype:
            return ("%s is not supported on %s by torch %s (autocast left "
                    "convolutions in %s); use amp-bf16 or bf16 on CPU"
                    % (name, device, torch.__version__,
                       str(y.dtype).replace("torch.", "")))
        return None
    dtype = model_dtype(precision)
    if dtype is not None:
        try:
            xh = x.to(dtype).requires_grad_(True)
            y = F.conv2d(xh, w.to(dtype), padding=1)
            y = F.batch_norm(y, torch.zeros(4, device=device),
                             torch.ones(4, device=device),
                             torch.ones(4, device=device),
                             torch.zeros(4, device=device), training=True)
            y = F.max_pool2d(F.relu(y), 2).flatten(1)
            y = F.linear(y, torch.randn(3, y.shape[1], device=device).to(dtype))
            y.float().sum().backward()
        except (RuntimeError, NotImplementedError) as error:
            return ("%s is not implemented on %s in torch %s (%s); use bf16 "
                    "or amp-bf16 on CPU"
                    % (name, device, torch.__version__, _first_line(error)))
    return None


def set_tf32(precision, defaults):
    if precision == "fp32":
        matmul, cudnn = False, False
    elif precision == "tf32":
        matmul, cudnn = True, True
    else:
        matmul, cudnn = defaults
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn


# ---------------------------------------------------------------------------
# Tools: how the step is driven
# ---------------------------------------------------------------------------


class Tool(collections.namedtuple(
        "Tool", "compile compile_mode optimizer_impl cuda_graph")):
    """One way a Python user runs the step: torch.compile on the model (and
    its mode), torch.optim.SGD's implementation, and whether the whole step
    is captured in one CUDA graph."""


# The tools --tools names. The fused ones are what a Python expert writes on
# CUDA: fused SGD takes GradScaler's scale and overflow flag on the device
# (no host sync per step, unlike foreach SGD under GradScaler).
TOOLS = {
    "pytorch-eager": Tool(False, "default", "foreach", False),
    "pytorch-fused": Tool(False, "default", "fused", False),
    "pytorch-compile": Tool(True, "default", "foreach", False),
    "pytorch-compile-ro": Tool(True, "reduce-overhead", "foreach", False),
    "pytorch-compile-fused": Tool(True, "default", "fused", False),
    "pytorch-compile-ro-fused": Tool(True, "reduce-overhead", "fused", False),
    "pytorch-graph": Tool(False, "default", "fused", True),
}


def tool_of(args):
    return Tool(args.compile, args.compile_mode, args.optimizer_impl,
                args.cuda_graph)


def fused_sgd_unsupported_reason(device):
    """Why torch.optim.SGD(fused=True) cannot run on `device`, or None: one
    step of a two-element parameter, instead of trusting version numbers."""
    if "fused" not in inspect.signature(torch.optim.SGD).parameters:
        return "torch %s's SGD has no fused=True" % torch.__version__
    try:
        param = torch.zeros(2, device=device, requires_grad=True)
        optimizer = torch.optim.SGD([param], lr=0.1, momentum=0.9,
                                    fused=True)
        param.grad = torch.ones_like(param)
        optimizer.step()
    except (RuntimeError, NotImplementedError) as error:
        return ("fused SGD is not supported on %s by torch %s (%s)"
                % (device, torch.__version__, _first_line(error)))
    return None


def tool_unsupported_reason(tool, device):
    """Why `tool` cannot run on `device` with this torch, or None."""
    if tool.cuda_graph:
        if device != "cuda":
            return ("the whole-step CUDA graph (torch.cuda.graph) needs a "
                    "CUDA device; this run is on %s" % device)
        if not hasattr(torch.cuda, "graph"):
            return "torch %s has no torch.cuda.graph" % torch.__version__
    if tool.compile:
        if not hasattr(torch, "compile"):
            return ("torch.compile needs torch >= 2.0; this is torch %s"
                    % torch.__version__)
        if tool.compile_mode == "reduce-overhead" and device != "cuda":
            return ("reduce-overhead's CUDA graphs need a CUDA device; on %s "
                    "it compiles what the default mode does" % device)
    if tool.optimizer_impl == "fused":
        return fused_sgd_unsupported_reason(device)
    return None


# ---------------------------------------------------------------------------
# One configuration
# ---------------------------------------------------------------------------


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


def reset_host_peak():
    """Resets the process's peak RSS (VmHWM) to its current RSS, so that the
    next tool of this process measures its own peak (Linux >= 4.0; without
    it the peak is the process's so far)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass


def peak_host_bytes():
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    # ru_maxrss is in KiB on Linux; the process's peak so far.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def make_sgd(params, implementation):
    """lamp_bench's SGD in torch.optim.SGD's `implementation`: Python's
    default is foreach on CUDA; "fused" and "for-loop" are the other two
    implementations of the same rule."""
    kwargs = {}
    if implementation == "fused":
        kwargs["fused"] = True
    elif implementation == "for-loop":
        kwargs["foreach"] = False
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True,
                                weight_decay=5e-4, **kwargs)
    if implementation == "fused":
        # Fused SGD makes its momentum buffers with empty_like on its first
        # step, and its kernel fills them only when that step is not
        # skipped: a first step that GradScaler skips (an overflow at the
        # initial scale, usual in fp16) leaves them uninitialised and the
        # next step blows the weights up (torch 2.11, measured). Zero
        # buffers give the first step's rule, buffer = gradient (dampening
        # 0), whether or not it is skipped.
        for param in params:
            optimizer.state[param]["momentum_buffer"] = torch.zeros_like(param)
    return optimizer


class PeerStep:
    """One tool's training step on one fixed synthetic batch: model,
    optimizer, scaler and batch are built once. warm_up(n) runs the untimed
    steps (and, for the whole-step graph, then captures the step); each call
    afterwards is one timed step. health() reads the skipped steps, the last
    loss and whether loss and parameters are finite."""

    def __init__(self, args, precision):
        device = args.device
        self.device = device
        torch.manual_seed(0)
        model = make_model(args.model)
        expected = EXPECTED_PARAMETERS[args.model]
        got = count_parameters(model)
        assert got == expected, ("%s has %d parameters, lamp's has %d"
                                 % (args.model, got, expected))
        model.to(device)
        model.train()
        half_dtype = model_dtype(precision)
        if half_dtype is not None:
            network_to_half(model, half_dtype)
        memory_format = (torch.channels_last if args.channels_last
                         else torch.contiguous_format)
        if args.channels_last:
            model.to(memory_format=memory_format)
        self.model = model

        self.master = MasterWeights(model.parameters()) \
            if half_dtype is not None else None
        params = self.master.master_params if self.master \
            else list(model.parameters())
        self.optimizer = make_sgd(params, args.optimizer_impl)
        self.scaler = make_grad_scaler(device) \
            if uses_loss_scaling(precision) else None
        if args.compile:
            self.forward = torch.compile(model) \
                if args.compile_mode == "default" \
                else torch.compile(model, mode=args.compile_mode)
        else:
            self.forward = model

        generator = torch.Generator().manual_seed(1)
        shape = (args.batch_size,) + input_shape(args.model)
        images = torch.randn(shape, generator=generator).to(device)
        self.images = images.contiguous(memory_format=memory_format)
        self.labels = torch.randint(0, 10, (args.batch_size,),
                                    generator=generator).to(device)
        if half_dtype is not None:
            # Cast once, as lamp_bench does: the batch is already in the
            # model's dtype, so neither tool times an input cast.
            self.images = self.images.to(half_dtype)
        self.amp_dtype = autocast_dtype(precision)
        # Steps the scaler skipped, summed on the device (no host sync).
        self.skipped = torch.zeros((), device=device) if self.scaler \
            else None
        self.skip_count_recorded = True
        self.cuda_graph = args.cuda_graph
        self.graph = None
        self.loss = None
        self.steps_run = 0

    def _autocast(self, cache_enabled=True):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device, dtype=self.amp_dtype,
                              cache_enabled=cache_enabled)

    def _zero_grad(self):
        if self.master:
            # The low-precision gradients; the masters' are overwritten.
            self.model.zero_grad(set_to_none=True)
        else:
            self.optimizer.zero_grad(set_to_none=True)

    def _body(self, cache_enabled=True):
        """Forward, loss, backward, optimizer (and scaler) step: the step but
        zero_grad. Returns the loss."""
        with self._autocast(cache_enabled):
            logits = self.forward(self.images)
            loss = F.cross_entropy(logits.float(), self.labels)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        if self.master:
            self.master.model_grads_to_master_grads()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            flag = found_inf_flag(self.scaler, self.optimizer)
            if flag is None:
                self.skip_count_recorded = False
            else:
                self.skipped.add_(flag.to(self.skipped.device))
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.master:
            # Unconditional: after a skipped step the masters are unchanged,
            # and the copy avoids a host sync on the overflow flag.
            self.master.master_params_to_model_params()
        return loss

    def _eager_step(self):
        self._zero_grad()
        self.loss = self._body()
        self.steps_run += 1

    def warm_up(self, steps):
        """`steps` untimed steps; for the whole-step graph, PyTorch's "whole
        network capture" (CUDA semantics, CUDA Graphs) after them: warm-up on
        a side stream, gradients set to None so that backward allocates them
        from the graph's private pool, autocast without its weight cache
        inside the capture, and the batch, loss, gradients and scaler state
        static from then on. With fused SGD, GradScaler hands the scale and
        the overflow flag to the optimizer's kernel and updates the scale on
        the device: the captured step has no host sync."""
        if not self.cuda_graph:
            for _ in range(steps):
                self._eager_step()
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(steps):
                self._eager_step()
        torch.cuda.current_stream().wait_stream(side)
        self._zero_grad()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.loss = self._body(cache_enabled=False)

    def __call__(self):
        if self.graph is None:
            self._eager_step()
        else:
            self.graph.replay()
            self.steps_run += 1

    def health(self):
        """Skipped steps, the final loss and whether it and every parameter
        (and FP32 master) are finite: one host sync, after the timed steps."""
        params = [p.detach() for p in self.model.parameters()]
        if self.master:
            params += [p.detach() for p in self.master.master_params]
        params_finite = bool(torch.stack(
            [torch.isfinite(p).all() for p in params]).all())
        loss = float(self.loss.detach()) if self.loss is not None \
            else float("nan")
        loss_finite = math.isfinite(loss)
        problems = [what for what, finite in (("loss", loss_finite),
                                              ("params", params_finite))
                    if not finite]
        if self.skipped is None:
            skipped = 0  # no loss scaling: no step is skipped
        elif self.skip_count_recorded:
            skipped = int(self.skipped.item())
        else:
            skipped = None
        return {
            "skipped_steps": skipped,
            "steps_run": self.steps_run,
            "final_loss": loss if loss_finite else None,
            "finite": not problems,
            "garbage": ("non-finite " + " and ".join(problems)
                        if problems else None),
        }


def time_steps(step, steps, device):
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return time.perf_counter() - start


def run_configuration(args, precision, tf32_defaults):
    tool = tool_of(args)
    result = {
        "model": args.model,
        "batch_size": args.batch_size,
        "precision": precision,
        "channels_last": args.channels_last,
        "cudnn_benchmark": args.cudnn_benchmark,
        "optimizer_impl": tool.optimizer_impl,
        "compile_mode": tool.compile_mode if tool.compile else None,
        "cuda_graph": tool.cuda_graph,
        "steps": args.steps,
        "warmup": args.warmup,
        "seconds": None,
        "images_per_second": None,
        "seconds_per_epoch": None,
        "epoch_images": args.epoch_images,
        "peak_memory_bytes": None,
        "steady_peak_bytes": None,
        "reserved_bytes": None,
        "skipped": None,
    }
    device = args.device
    if device == "cuda":
        set_tf32(precision, tf32_defaults)
        torch.backends.cudnn.benchmark = args.cudnn_benchmark
        result["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        result["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
    reason = unsupported_reason(precision, device) or \
        tool_unsupported_reason(tool, device)
    if reason is not None:
        result["skipped"] = reason
        return result
    if tool.cuda_graph:
        # The optimizer's momentum buffers and the scaler's state exist
        # before capture only after an eager step (PyTorch's example: 3).
        result["warmup"] = max(args.warmup, 3)

    gc.collect()
    baseline = memory_baseline(device)
    step = None
    try:
        step = PeerStep(args, precision)
        step.warm_up(result["warmup"])
        warmup_peak = steady_state(step, device)
        steps, rates = timed_runs(step, args)
        result.update(memory_since(baseline, warmup_peak, device))
        result.update(step.health())
    except (RuntimeError, NotImplementedError, TypeError) as error:
        result["skipped"] = skip_reason(error, device)
        if result["skipped"] is None:
            raise
    step = None
    release(tool, device)
    if result["skipped"] is None:
        images_per_second = sorted(rates)[(len(rates) - 1) // 2]
        result.update({
            "steps": steps,
            "repeats_images_per_second": rates,
            "seconds": steps * args.batch_size / images_per_second,
            "images_per_second": images_per_second,
            "seconds_per_epoch": args.epoch_images / images_per_second,
        })
    return result


def memory_baseline(device):
    """What an earlier tool of this process still holds (allocated and
    reserved CUDA bytes), not this one's; on a CPU, resets the peak RSS."""
    if device != "cuda":
        reset_host_peak()
        return None
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return int(torch.cuda.memory_allocated()), int(torch.cuda.memory_reserved())


def steady_state(step, device):
    """After warm-up, on CUDA: releases the autotuning workspace and the
    warm-up's cached blocks, resets the peak, and runs one more untimed step
    so that the step's blocks are reserved again (the first timed run pays
    no cudaMalloc). Returns the warm-up's peak (0 on a CPU)."""
    synchronize(device)
    if device != "cuda":
        return 0
    warmup_peak = int(torch.cuda.max_memory_allocated())
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    step()
    synchronize(device)
    return warmup_peak


def timed_runs(step, args):
    """Calibrates the step count to at least --min-seconds, so that launch
    jitter and clock steps average out, then times --repeats runs of that
    count back to back. Returns (steps, images/s of each run)."""
    steps = args.steps
    while True:
        seconds = time_steps(step, steps, args.device)
        if seconds >= args.min_seconds or steps >= 100000:
            break
        steps = int(steps * 1.2 * args.min_seconds / max(seconds, 1e-6)) + 1
    rates = [steps * args.batch_size / seconds]
    for _ in range(1, args.repeats):
        rates.append(steps * args.batch_size /
                     time_steps(step, steps, args.device))
    return steps, rates


def memory_since(baseline, warmup_peak, device):
    """The tool's memory after its timed runs: on CUDA the steady-state peak,
    the reserved bytes (CUDA-graph pools included) and the whole-run peak,
    each above `baseline`; on a CPU the peak RSS since the tool started."""
    if device != "cuda":
        return {"peak_memory_bytes": peak_host_bytes()}
    allocated, reserved = baseline
    steady_peak = int(torch.cuda.max_memory_allocated())
    steady = steady_peak - allocated
    # torch.compile's reduce-overhead mode (CUDA graph trees) takes the
    # blocks of a replay's outputs off the allocator's counts between
    # replays, so the steady-state count can fall below the tool's start
    # (an H200 showed -106 MiB): no peak can be read from it then, and the
    # report falls back to the whole-run peak.
    return {
        "steady_peak_bytes": steady if steady >= 0 else None,
        "reserved_bytes": int(torch.cuda.memory_reserved()) - reserved,
        "peak_memory_bytes": max(warmup_peak, steady_peak) - allocated,
    }


def skip_reason(error, device):
    """The skip reason for an error a tool may meet (out of memory, an
    operation this torch lacks), or None for one to raise."""
    message = _first_line(error)
    if "out of memory" in message:
        return "out of memory: " + message
    if ("not implemented for" in message or "not supported" in message
            or isinstance(error, TypeError)):
        return ("not supported by torch %s on %s: %s"
                % (torch.__version__, device, message))
    return None


def release(tool, device):
    """Frees what a tool held before the next tool of this process runs:
    the model, its compiled graphs (and reduce-overhead's CUDA-graph pool),
    the whole-step graph's pool, the cached blocks."""
    gc.collect()
    if tool.compile:
        torch._dynamo.reset()
        gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------
# Command line and output
# ---------------------------------------------------------------------------


def device_name(device):
    if device == "cuda":
        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def describe(result):
    layout = "channels_last" if result["channels_last"] else "NCHW"
    head = "%s b%d %s %s cudnn.benchmark=%s" % (
        result["model"], result["batch_size"], result["precision"], layout,
        "on" if result["cudnn_benchmark"] else "off")
    if result["skipped"]:
        return head + ": skipped (%s)" % result["skipped"]
    text = head + (": %d steps in %.3f s, %.1f images/s, %.2f s/epoch "
                   "(%d images), peak memory %.1f MiB" % (
                       result["steps"], result["seconds"],
                       result["images_per_second"],
                       result["seconds_per_epoch"], result["epoch_images"],
                       result["peak_memory_bytes"] / 2.0 ** 20))
    if result.get("steady_peak_bytes") is not None:
        text += " (steady %.1f MiB, reserved %.1f MiB)" % (
            result["steady_peak_bytes"] / 2.0 ** 20,
            result["reserved_bytes"] / 2.0 ** 20)
    if result.get("skipped_steps"):
        text += ", %d of %d steps skipped" % (result["skipped_steps"],
                                               result["steps_run"])
    if result.get("garbage"):
        text += ", garbage: " + result["garbage"]
    return text


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1, got %s" % text)
    return value


def non_negative_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be at least 0, got %s" % text)
    return value


def precision_list(text):
    names = [name.strip() for name in text.split(",") if name.strip()]
    aliases = {"fp16": "half"}
    names = [aliases.get(name, name) for name in names]
    for name in names:
        if name not in PRECISIONS:
            raise argparse.ArgumentTypeError(
                "unknown precision %r; valid names are %s"
                % (name, ", ".join(PRECISIONS)))
    if not names:
        raise argparse.ArgumentTypeError("no precision given")
    return names


def tool_list(text):
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        if name not in TOOLS:
            raise argparse.ArgumentTypeError(
                "unknown tool %r; valid names are %s"
                % (name, ", ".join(TOOLS)))
    if not names:
        raise argparse.ArgumentTypeError("no tool given")
    return names


def tool_name(args):
    for name, tool in TOOLS.items():
        if tool == tool_of(args):
            return name
    if args.cuda_graph:
        return "pytorch-graph"
    return "pytorch-compile" if args.compile else "pytorch-eager"


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Time lamp's benchmark training step in Python PyTorch "
                    "(eager, torch.compile with --compile, the whole step "
                    "in one CUDA graph with --cuda-graph, or several of "
                    "them with --tools).")
    parser.add_argument("--model", choices=MODELS, default="resnet18")
    parser.add_argument("--batch-size", type=positive_int, default=128)
    parser.add_argument("--precision", type=precision_list, default=["fp32"],
                        help="comma-separated list of " + ", ".join(PRECISIONS))
    parser.add_argument("--channels-last", action="store_true",
                        help="model and input in channels_last (NHWC)")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="torch.backends.cudnn.benchmark = True")
    parser.add_argument("--compile", action="store_true",
                        help="wrap the model in torch.compile (torch >= 2)")
    parser.add_argument("--compile-mode", default="default",
                        choices=("default", "reduce-overhead", "max-autotune"),
                        help="torch.compile's mode (reduce-overhead: CUDA "
                             "graphs)")
    parser.add_argument("--optimizer-impl", default="foreach",
                        choices=("foreach", "fused", "for-loop"),
                        help="torch.optim.SGD's implementation (default "
                             "foreach, Python's default on CUDA)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="capture the whole step (forward, backward, "
                             "scaler, optimizer) in one CUDA graph and "
                             "replay it (CUDA only; with --optimizer-impl "
                             "fused under loss scaling)")
    parser.add_argument("--min-seconds", type=float, default=0.0,
                        help="time at least this long: more steps than "
                             "--steps when they are faster (default 0)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: cuda when available, else cpu")
    parser.add_argument("--warmup", type=non_negative_int, default=5,
                        help="untimed steps first (default 5; at least 3 "
                             "before a CUDA graph capture)")
    parser.add_argument("--steps", type=positive_int, default=20,
                        help="timed steps (default 20)")
    parser.add_argument("--epoch-images", type=positive_int, default=None,
                        help="images per epoch for s/epoch (default 50000; "
                             "60000 for cnn)")
    parser.add_argument("--repeats", type=positive_int, default=1,
                        help="timed runs of the calibrated step count after "
                             "one warm-up; the median is reported (default 1)")
    parser.add_argument("--tools", type=tool_list, default=None,
                        help="comma-separated tools to run one after the "
                             "other in this process, sharing its start-up: "
                             + ", ".join(TOOLS) + " (instead of --compile, "
                             "--compile-mode, --optimizer-impl and "
                             "--cuda-graph)")
    parser.add_argument("--json", metavar="PATH",
                        help="write the results as JSON to PATH")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch.set_num_threads(N) (default: torch's)")
    args = parser.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch %s sees no CUDA device"
                     % torch.__version__)
    if args.tools and (args.compile or args.compile_mode != "default" or
                       args.optimizer_impl != "foreach" or args.cuda_graph):
        parser.error("--tools replaces --compile, --compile-mode, "
                     "--optimizer-impl and --cuda-graph; give one or the "
                     "other")
    if args.cuda_graph and args.compile:
        parser.error("--cuda-graph captures the eager step; with --compile "
                     "use --compile-mode reduce-overhead for CUDA graphs")
    if args.compile and not hasattr(torch, "compile"):
        parser.error("--compile needs torch >= 2.0 (torch.compile); this is "
                     "torch %s" % torch.__version__)
    if args.epoch_images is None:
        args.epoch_images = 60000 if args.model == "cnn" else 50000
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    got = count_parameters(make_model(args.model))
    if got != EXPECTED_PARAMETERS[args.model]:
        sys.exit("peer_pytorch.py: %s has %d parameters but lamp's has %d; "
                 "the architectures differ"
                 % (args.model, got, EXPECTED_PARAMETERS[args.model]))
    tf32_defaults = (torch.backends.cuda.matmul.allow_tf32,
                     torch.backends.cudnn.allow_tf32)

    report = {
        "tool": ",".join(args.tools) if args.tools else tool_name(args),
        "compile_mode": args.compile_mode if args.compile else None,
        "optimizer_impl": args.optimizer_impl,
        "cuda_graph": args.cuda_graph,
        "torch_version": torch.__version__,
        "device": args.device,
        "device_name": device_name(args.device),
        "date": datetime.datetime.now(datetime.timezone.utc)
                .strftime("%Y-%m-%dT%H:%M:%SZ"),
        "threads": torch.get_num_threads(),
        "python_version": platform.python_version(),
        "cuda_version": torch.version.cuda,
        "cudnn_version": (torch.backends.cudnn.version()
                          if torch.backends.cudnn.is_available() else None),
        "results": [],
    }
    print("%s: torch %s, %s (%s), %d threads" % (
        report["tool"], report["torch_version"], report["device"],
        report["device_name"], report["threads"]), flush=True)
    tools = args.tools or [tool_name(args)]
    for tool in tools:
        tool_args = argparse.Namespace(**vars(args))
        if args.tools:
            (tool_args.compile, tool_args.compile_mode,
             tool_args.optimizer_impl, tool_args.cuda_graph) = TOOLS[tool]
        for precision in args.precision:
            result = run_configuration(tool_args, precision, tf32_defaults)
            result["tool"] = tool
            report["results"].append(result)
            print("%s: %s" % (tool, describe(result)), flush=True)

    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)
            out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
