#!/usr/bin/env python3
"""The Python PyTorch peer of lamp_bench: the same training step, timed the
same way, so lamp's C++ numbers can be compared with PyTorch at its best on
one machine in one run: eager (foreach or fused optimizer), torch.compile
(default or reduce-overhead, foreach or fused optimizer) and the whole step
captured in one CUDA graph (see TOOLS).

Models: the CIFAR-style ResNet18/34/50 (3x3 stem, stride 1, no max-pool), the
MNIST CNN and a GPT over bytes (nanoGPT's layout, lamp::models::GPT: --model
gpt with --gpt-layers, --gpt-heads, --gpt-width, --context, --gpt-vocab), with lamp's
module names and parameter counts (checked at startup). Data: one fixed
synthetic batch, already on the device (for gpt, random byte tokens and
targets [batch, context]). Step: zero_grad(set_to_none), forward,
cross_entropy on FP32 logits, backward, step; the optimizer is SGD (lr 0.1,
momentum 0.9, Nesterov, weight decay 5e-4) for the CNNs and, for gpt,
train_gpt's AdamW, nanoGPT's for its character model (lr 1e-3, betas (0.9,
0.99), eps 1e-8, weight decay 0.1 on the tensors of 2+ dimensions,
embeddings included) after clipping the gradients to global norm 1.0.
For gpt, images_per_second counts sequences; tokens_per_second is that times
the context.

Precision modes (lamp's names):
  fp32      FP32, TF32 off (cuBLAS and cuDNN)
  tf32      FP32 weights, TF32 on (cuBLAS and cuDNN)
  amp       torch.autocast(float16) + dynamic loss scaling (GradScaler)
  amp-bf16  torch.autocast(bfloat16), no scaling
  half      fastai's network_to_half: FP16 model, BatchNorm FP32, input cast to
            FP16, FP32 master weights in the optimizer, dynamic loss scaling
  bf16      the same in bfloat16, no scaling
  fp8       amp-bf16 with FP8 products in the eligible Linear layers (in and
            out features multiples of 16): lamp::nn::float8_linear written
            with torch._scaled_mm (current scaling, E4M3 forward, E5M2
            gradients), as torchao's Float8Linear does it; --model gpt only
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
import os
import platform
import resource
import sys
import time
import traceback
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

PRECISIONS = ("fp32", "tf32", "amp", "amp-bf16", "half", "bf16", "fp8")
MODELS = ("resnet18", "resnet34", "resnet50", "cnn", "gpt")

# lamp's counts (include/lamp/models/*.h) for 10 classes; a mismatch means the
# two tools would not be timing the same network.
EXPECTED_PARAMETERS = {
    "resnet18": 11173962,
    "resnet34": 21282122,
    "resnet50": 23520842,
    "cnn": 28938,
}

# An epoch of the GPT, for s/epoch: a million byte tokens (about the training
# part of a 1 MB text), in sequences of the context.
GPT_EPOCH_TOKENS = 1000000


def expected_parameters(name, shape=None):
    """lamp's parameter count of model `name` (a GPT's from its shape, in
    closed form: the embeddings, 12 C^2 + 13 C per block (12 C^2 + 2 C
    without biases), the final norm; the output projection is tied to
    wte)."""
    if name != "gpt":
        return EXPECTED_PARAMETERS[name]
    shape = shape or GPTShape()
    c = shape.width
    norm = 2 * c if shape.norm == "layernorm" and shape.bias else c
    per_block = 12 * c * c + (9 * c if shape.bias else 0) + 2 * norm
    return (shape.vocab_size + shape.context) * c + shape.layers * per_block + norm


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


class GPTShape(collections.namedtuple(
        "GPTShape",
        "layers heads width context vocab_size dropout bias norm gelu",
        defaults=(6, 6, 384, 256, 256, 0.0, True, "layernorm", "exact"))):
    """lamp::models::GPTOptions: transformer blocks, attention heads (they
    divide the width), the residual stream's width, the longest sequence,
    the vocabulary (bytes), the dropout probability (0 in the bench),
    biases in the Linears and LayerNorms, the norm ("layernorm" or
    "rmsnorm", eps 1e-5 both) and the MLP's GELU ("exact" or "tanh")."""

    def __str__(self):
        return "gpt(layers=%d, heads=%d, width=%d, context=%d)" % (
            self.layers, self.heads, self.width, self.context)


class CausalSelfAttention(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.c_attn = nn.Linear(shape.width, 3 * shape.width, bias=shape.bias)
        self.c_proj = nn.Linear(shape.width, shape.width, bias=shape.bias)
        self.heads = shape.heads
        self.dropout = shape.dropout

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.c_attn(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0,
            is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, c)
        return F.dropout(self.c_proj(y), self.dropout, self.training)


class MLP(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.c_fc = nn.Linear(shape.width, 4 * shape.width, bias=shape.bias)
        # exact (erf) or tanh, as lamp's GPTOptions::gelu
        self.gelu = nn.GELU(approximate="tanh" if shape.gelu == "tanh"
                            else "none")
        self.c_proj = nn.Linear(4 * shape.width, shape.width, bias=shape.bias)
        self.dropout = shape.dropout

    def forward(self, x):
        return F.dropout(self.c_proj(self.gelu(self.c_fc(x))), self.dropout,
                         self.training)


def gpt_norm(shape):
    """The norm of lamp's GPTOptions::norm: LayerNorm (without its bias
    where shape.bias is false) or RMSNorm, eps 1e-5."""
    if shape.norm == "rmsnorm":
        return nn.RMSNorm(shape.width, eps=1e-5)
    return nn.LayerNorm(shape.width, eps=1e-5, bias=shape.bias)


class GPTBlock(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.ln_1 = gpt_norm(shape)
        self.attn = CausalSelfAttention(shape)
        self.ln_2 = gpt_norm(shape)
        self.mlp = MLP(shape)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """lamp::models::GPT (include/lamp/models/gpt.h), nanoGPT's layout: token
    and position embeddings, pre-norm blocks, a final LayerNorm and logits
    from the token embedding (tied: no output parameter). GPT-2's
    initialisation: Linear and Embedding weights N(0, 0.02), the residual
    projections (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 layers)),
    biases 0. Token ids int64 [B, T], T <= context -> logits [B, T, vocab]."""

    def __init__(self, shape=None):
        super().__init__()
        shape = shape or GPTShape()
        if shape.width % shape.heads != 0:
            raise ValueError("gpt: %d heads do not divide width %d"
                             % (shape.heads, shape.width))
        self.shape = shape
        self.wte = nn.Embedding(shape.vocab_size, shape.width)
        self.wpe = nn.Embedding(shape.context, shape.width)
        self.h = nn.ModuleList(GPTBlock(shape) for _ in range(shape.layers))
        self.ln_f = gpt_norm(shape)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = 0.02
                if name.endswith("c_proj"):
                    std = 0.02 / math.sqrt(2 * shape.layers)
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens):
        t = tokens.shape[1]
        if t > self.shape.context:
            raise ValueError("gpt: a sequence of %d tokens is longer than the "
                             "context, %d" % (t, self.shape.context))
        positions = torch.arange(t, device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        x = F.dropout(x, self.shape.dropout, self.training)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def gpt_flops_per_token(shape):
    """A GPT's training FLOPs per token, nanoGPT's estimate (PaLM's appendix
    B): 6 N for the matmuls of forward and backward, N the parameters but
    wpe, and 12 layers width context for attention's scores and sums."""
    n = expected_parameters("gpt", shape) - shape.context * shape.width
    return 6 * n + 12 * shape.layers * shape.width * shape.context


def make_model(name, gpt_shape=None):
    """The model `name`; for "gpt", of `gpt_shape` (default GPTShape())."""
    if name == "gpt":
        return GPT(gpt_shape)
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
    return {"amp": torch.float16, "amp-bf16": torch.bfloat16,
            "fp8": torch.bfloat16}.get(precision)


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
        self._unscaled = False

    def scale(self, loss):
        return loss * self._scale

    def unscale_(self, optimizer):
        grads = [p.grad for group in optimizer.param_groups
                 for p in group["params"] if p.grad is not None]
        inv_scale = 1.0 / self._scale
        finite = True
        for g in grads:
            g.mul_(inv_scale)
            finite = finite and bool(torch.isfinite(g).all())
        self._found_inf = not finite
        self._unscaled = True

    def step(self, optimizer):
        if not self._unscaled:
            self.unscale_(optimizer)
        self._unscaled = False
        if not self._found_inf:
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


# ---------------------------------------------------------------------------
# FP8 Linear layers: the twin of lamp::nn::float8_linear
# (src/nn/float8_linear.cpp) with current scaling, so that the benchmark
# compares like with like.
# ---------------------------------------------------------------------------

E4M3_MAX = 448.0
E5M2_MAX = 57344.0


def _to_float8(t, dtype, max_value):
    """fp8(clamp(t * scale, -max, max)) with scale = max / amax, and the
    factor that undoes the scale."""
    amax = t.detach().abs().amax().float()
    scale = max_value / amax.clamp_min(1e-12)
    data = (t.float() * scale).clamp(-max_value, max_value).to(dtype)
    return data, scale.reciprocal()


class _Float8Linear(torch.autograd.Function):
    """Y = X W^T (E4M3 x E4M3), dX = dY W and dW = dY^T X (E5M2 x E4M3), the
    rows padded to a multiple of 16 as lamp pads them."""

    @staticmethod
    def forward(ctx, x, weight, bias, out_dtype):
        n, k = weight.shape
        x2 = x.reshape(-1, k)
        m = x2.shape[0]
        rows = (m + 15) // 16 * 16
        if rows != m:
            x2 = F.pad(x2, (0, 0, 0, rows - m))
        xq, xs = _to_float8(x2, torch.float8_e4m3fn, E4M3_MAX)
        wq, ws = _to_float8(weight, torch.float8_e4m3fn, E4M3_MAX)
        fused = bias is not None and out_dtype in (torch.bfloat16,
                                                   torch.float16)
        y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws,
                             bias=bias.to(out_dtype) if fused else None,
                             out_dtype=out_dtype, use_fast_accum=True)
        if bias is not None and not fused:
            y = y + bias.to(out_dtype)
        ctx.save_for_backward(xq, xs, wq, ws)
        ctx.m = m
        ctx.dtypes = (x.dtype, weight.dtype,
                      bias.dtype if bias is not None else None)
        return y[:m].view(*x.shape[:-1], n)

    @staticmethod
    def backward(ctx, dy):
        xq, xs, wq, ws = ctx.saved_tensors
        n, k = wq.shape
        m = ctx.m
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        g2 = dy.reshape(m, n)
        rows = xq.shape[0]
        if rows != m:
            g2 = F.pad(g2, (0, 0, 0, rows - m))
        gq, gs = _to_float8(g2, torch.float8_e5m2, E5M2_MAX)
        dx = torch._scaled_mm(gq, wq.t().contiguous().t(), scale_a=gs,
                              scale_b=ws, out_dtype=x_dtype)
        dw = torch._scaled_mm(gq.t().contiguous(), xq.t().contiguous().t(),
                              scale_a=gs, scale_b=xs, out_dtype=w_dtype)
        db = None
        if b_dtype is not None:
            db = dy.reshape(m, n).sum(0, dtype=torch.float32).to(b_dtype)
        return dx[:m].view(*dy.shape[:-1], k), dw, db, None


class Float8Linear(nn.Linear):
    """nn.Linear whose product runs in FP8 (same parameters and names)."""

    def forward(self, x):
        device = x.device.type
        dtype = (torch.get_autocast_dtype(device)
                 if torch.is_autocast_enabled(device) else x.dtype)
        with torch.autocast(device, enabled=False):
            return _Float8Linear.apply(x, self.weight, self.bias, dtype)


def convert_to_float8(model):
    """lamp::nn::convert_to_float8: every nn.Linear with in and out features
    that are multiples of 16 computes in FP8; returns their names."""
    converted = []
    for name, module in model.named_modules():
        if (type(module) is nn.Linear and module.in_features % 16 == 0
                and module.out_features % 16 == 0):
            module.__class__ = Float8Linear
            converted.append(name)
    return converted


def float8_unsupported_reason(device):
    """Why torch._scaled_mm cannot run on `device` (None when it can)."""
    if not hasattr(torch, "float8_e4m3fn"):
        return "torch %s has no float8 types" % torch.__version__
    try:
        a = torch.zeros(16, 16, device=device).to(torch.float8_e4m3fn)
        one = torch.ones((), device=device)
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one,
                         out_dtype=torch.float32)
    except (AttributeError, RuntimeError, TypeError) as error:
        return ("FP8 products (torch._scaled_mm) do not run on %s in torch "
                "%s (%s)" % (device, torch.__version__, _first_line(error)))
    return None


def _first_line(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def unsupported_reason(precision, device):
    """Why this torch cannot run `precision` on `device`, or None. Probes the
    operations the models use instead of trusting version numbers."""
    if precision == "fp8":
        return unsupported_reason("amp-bf16", device) or \
            float8_unsupported_reason(device)
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


def warmup_steps(tool, requested):
    """The untimed steps `tool` takes before its timed ones: `requested`
    (--warmup), at least 3 for a whole-step CUDA graph (the optimizer's
    and the scaler's state exist before capture only after eager steps:
    PyTorch's example takes 3) and for torch.compile, which compiles on its
    first step and, with CUDA graphs (reduce-overhead, max-autotune),
    records them on the next ones: none of that is a steady step."""
    return max(requested, 3) if tool.cuda_graph or tool.compile else requested


class Tool(collections.namedtuple(
        "Tool", "compile compile_mode optimizer_impl cuda_graph")):
    """One way a Python user runs the step: torch.compile on the model (and
    its mode), the optimizer's implementation (torch.optim.SGD's, or
    AdamW's for gpt), and whether the whole step is captured in one CUDA
    graph."""


# The tools --tools names. The fused ones are what a Python expert writes on
# CUDA: fused SGD and fused AdamW take GradScaler's scale and overflow flag on
# the device (no host sync per step, unlike foreach ones under GradScaler).
TOOLS = {
    "pytorch-eager": Tool(False, "default", "foreach", False),
    "pytorch-fused": Tool(False, "default", "fused", False),
    "pytorch-compile": Tool(True, "default", "foreach", False),
    "pytorch-compile-ro": Tool(True, "reduce-overhead", "foreach", False),
    "pytorch-compile-fused": Tool(True, "default", "fused", False),
    "pytorch-compile-ro-fused": Tool(True, "reduce-overhead", "fused", False),
    # torch.compile's longest search: Triton templates for the products
    # autotuned, and CUDA graphs (minutes of compilation on a GPU).
    "pytorch-compile-max-fused": Tool(True, "max-autotune", "fused", False),
    "pytorch-graph": Tool(False, "default", "fused", True),
}


def tool_of(args):
    return Tool(args.compile, args.compile_mode, args.optimizer_impl,
                args.cuda_graph)


def optimizer_class(model_name):
    """The model's optimizer: AdamW for gpt, SGD for the CNNs."""
    return torch.optim.AdamW if model_name == "gpt" else torch.optim.SGD


def fused_unsupported_reason(device, model_name="resnet18"):
    """Why the model's optimizer with fused=True (torch.optim.SGD, or AdamW
    for gpt) cannot run on `device`, or None: one step of a two-element
    parameter, instead of trusting version numbers."""
    optimizer_type = optimizer_class(model_name)
    name = optimizer_type.__name__
    if "fused" not in inspect.signature(optimizer_type).parameters:
        return "torch %s's %s has no fused=True" % (torch.__version__, name)
    try:
        param = torch.zeros(2, device=device, requires_grad=True)
        kwargs = {"momentum": 0.9} if optimizer_type is torch.optim.SGD \
            else {}
        optimizer = optimizer_type([param], lr=0.1, fused=True, **kwargs)
        param.grad = torch.ones_like(param)
        optimizer.step()
    except (RuntimeError, NotImplementedError) as error:
        return ("fused %s is not supported on %s by torch %s (%s)"
                % (name, device, torch.__version__, _first_line(error)))
    return None


def model_unsupported_reason(model_name):
    """Why this torch cannot build or run `model_name`, or None."""
    if model_name == "gpt" and \
            not hasattr(F, "scaled_dot_product_attention"):
        return ("gpt needs F.scaled_dot_product_attention (torch >= 2.0); "
                "this is torch %s" % torch.__version__)
    return None


def tool_unsupported_reason(tool, device, model_name="resnet18"):
    """Why `tool` cannot run `model_name` on `device` with this torch, or
    None."""
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
        return fused_unsupported_reason(device, model_name)
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


def make_adamw(model, params, implementation, capturable=False):
    """lamp_bench's AdamW for the GPT (train_gpt's, nanoGPT's for its
    character model) in torch.optim.AdamW's `implementation`: lr 1e-3, betas
    (0.9, 0.99), eps 1e-8, weight decay 0.1 on the tensors of 2 or more
    dimensions (the Linear weights and the embeddings wte, wpe) and none on
    the others (biases, the LayerNorms): nanoGPT's configure_optimizers and
    lamp's OptimizerOptions::no_bias_decay. `params` are the model's
    parameters or their FP32 masters, in model.parameters()'s order.
    `capturable` for a step captured in a CUDA graph (the step count stays
    on the device)."""
    pairs = list(zip(model.parameters(), params))
    groups = [
        {"params": [q for p, q in pairs if p.dim() >= 2],
         "weight_decay": 0.1},
        {"params": [q for p, q in pairs if p.dim() < 2],
         "weight_decay": 0.0},
    ]
    kwargs = {}
    if implementation == "fused":
        kwargs["fused"] = True
    elif implementation == "for-loop":
        kwargs["foreach"] = False
    if capturable:
        kwargs["capturable"] = True
    return torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99), eps=1e-8,
                             **kwargs)


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
        shape = gpt_shape(args)
        model = make_model(args.model, shape)
        expected = expected_parameters(args.model, shape)
        got = count_parameters(model)
        assert got == expected, ("%s has %d parameters, lamp's has %d"
                                 % (args.model, got, expected))
        model.to(device)
        model.train()
        half_dtype = model_dtype(precision)
        if half_dtype is not None:
            network_to_half(model, half_dtype)
        if precision == "fp8":
            self.float8_layers = convert_to_float8(model)
        memory_format = (torch.channels_last if args.channels_last
                         else torch.contiguous_format)
        if args.channels_last:
            model.to(memory_format=memory_format)
        self.model = model

        self.master = MasterWeights(model.parameters()) \
            if half_dtype is not None else None
        params = self.master.master_params if self.master \
            else list(model.parameters())
        self.params = params
        if args.model == "gpt":
            self.optimizer = make_adamw(model, params, args.optimizer_impl,
                                        capturable=args.cuda_graph)
            self.max_grad_norm = 1.0
        else:
            self.optimizer = make_sgd(params, args.optimizer_impl)
            self.max_grad_norm = None
        self.scaler = make_grad_scaler(device) \
            if uses_loss_scaling(precision) else None
        def forward_loss(inputs, targets):
            logits = model(inputs)
            if logits.dim() == 3:  # gpt: one prediction per position
                logits = logits.flatten(0, 1)
            return F.cross_entropy(logits.float(), targets.flatten())

        # The compile tools compile the loss with the model, as nanoGPT's
        # train.py does (its model returns the loss): Inductor fuses the
        # logits' cast, log-softmax and NLL, which lamp fuses too
        # (--fused-head-loss).
        if args.compile:
            self.forward_loss = torch.compile(forward_loss) \
                if args.compile_mode == "default" \
                else torch.compile(forward_loss, mode=args.compile_mode)
        else:
            self.forward_loss = forward_loss

        generator = torch.Generator().manual_seed(1)
        if shape is not None:
            # Byte tokens and the targets (random too: the step's cost does
            # not depend on them being the next tokens).
            tokens = (args.batch_size, shape.context)
            self.inputs = torch.randint(0, shape.vocab_size, tokens,
                                        generator=generator).to(device)
            self.targets = torch.randint(0, shape.vocab_size, tokens,
                                         generator=generator).to(device)
        else:
            batch = (args.batch_size,) + input_shape(args.model)
            images = torch.randn(batch, generator=generator).to(device)
            self.inputs = images.contiguous(memory_format=memory_format)
            self.targets = torch.randint(0, 10, (args.batch_size,),
                                         generator=generator).to(device)
            if half_dtype is not None:
                # Cast once, as lamp_bench does: the batch is already in the
                # model's dtype, so neither tool times an input cast.
                self.inputs = self.inputs.to(half_dtype)
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
        """Forward, loss, backward, gradient clipping (gpt), optimizer (and
        scaler) step: the step but zero_grad. Returns the loss."""
        with self._autocast(cache_enabled):
            loss = self.forward_loss(self.inputs, self.targets)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        if self.master:
            self.master.model_grads_to_master_grads()
        if self.max_grad_norm is not None:
            # The norm of the true gradients: unscaled first (the fused
            # optimizer then gets only the overflow flag, still on the
            # device). Without an error on a non-finite norm: that would
            # sync the host, and the scaler skips such a step anyway.
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
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
        with torch.cuda.stream(side), warnings.catch_warnings():
            # A capturable AdamW warns that its warm-up steps run uncaptured:
            # they are meant to.
            warnings.filterwarnings("ignore", message=".*capturable=True")
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


def gpt_shape(args):
    """The GPT's shape from the command line, dropout 0 (the bench times the
    step, as lamp_bench does), or None for a CNN."""
    if args.model != "gpt":
        return None
    return GPTShape(layers=args.gpt_layers, heads=args.gpt_heads,
                    width=args.gpt_width, context=args.context,
                    vocab_size=args.gpt_vocab, gelu=args.gpt_gelu)


def run_configuration(args, precision, tf32_defaults, keep_going=False):
    tool = tool_of(args)
    shape = gpt_shape(args)
    result = {
        "model": args.model,
        "batch_size": args.batch_size,
        "precision": precision,
        "channels_last": args.channels_last,
        "cudnn_benchmark": args.cudnn_benchmark,
        # What torch runs: "foreach" passes no choice, and torch's default
        # is foreach on CUDA but the per-parameter loop on a CPU.
        "optimizer_impl": "for-loop (torch's CPU default)"
                          if tool.optimizer_impl == "foreach"
                          and args.device != "cuda" else tool.optimizer_impl,
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
        "optimizer": "sgd" if shape is None else "adamw",
    }
    if shape is not None:
        # images_per_second counts sequences of `context` tokens.
        result.update({
            "gpt_layers": shape.layers,
            "gpt_heads": shape.heads,
            "gpt_width": shape.width,
            "context": shape.context,
            "vocab_size": shape.vocab_size,
            "gpt_gelu": shape.gelu,  # as lamp_bench records it
            "parameters": expected_parameters("gpt", shape),
            "flops_per_token": gpt_flops_per_token(shape),
            "tokens_per_second": None,
            "tflops": None,
            "attention": args.attention,
        })
    device = args.device
    if device == "cuda":
        set_tf32(precision, tf32_defaults)
        torch.backends.cudnn.benchmark = args.cudnn_benchmark
        result["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        result["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
    reason = model_unsupported_reason(args.model) or \
        (precision == "fp8" and args.model != "gpt" and
         "fp8 is measured on --model gpt (FP8 products pay in "
         "transformers' Linear layers)") or \
        unsupported_reason(precision, device) or \
        tool_unsupported_reason(tool, device, args.model)
    if reason is not None:
        result["skipped"] = reason
        return result
    result["warmup"] = warmup_steps(tool, args.warmup)

    gc.collect()
    baseline = memory_baseline(device)
    step = None
    try:
        step = PeerStep(args, precision)
        step.warm_up(result["warmup"])
        warmup_peak = steady_state(step, device)
        steps, rates = timed_runs(step, args)
        result.update(memory_since(baseline, warmup_peak, device))
        if args.profile_steps:
            kernels, profiled = profile_steps(step, args.profile_steps,
                                              device)
            result["profile"] = {"steps": args.profile_steps,
                                 "seconds_per_step": profiled,
                                 "top_kernels": kernels}
        result.update(step.health())
    except Exception as error:  # noqa: BLE001: sorted below
        known = isinstance(error, (RuntimeError, NotImplementedError,
                                   TypeError))
        result["skipped"] = skip_reason(error, device) if known else None
        if result["skipped"] is None:
            if not keep_going:
                raise
            # One tool of several failed (a torch.compile that cannot
            # build, a capture that fails): its own cell says why, and the
            # process's other tools keep their results.
            traceback.print_exc()
            result["failed"] = "%s: %s" % (type(error).__name__,
                                           _first_line(error))
    step = None
    release(tool, device)
    if result["skipped"] is None and not result.get("failed"):
        images_per_second = sorted(rates)[(len(rates) - 1) // 2]
        result.update({
            "steps": steps,
            "repeats_images_per_second": rates,
            "seconds": steps * args.batch_size / images_per_second,
            "images_per_second": images_per_second,
            "seconds_per_epoch": args.epoch_images / images_per_second,
        })
        if shape is not None:
            tokens_per_second = images_per_second * shape.context
            result["tokens_per_second"] = tokens_per_second
            result["tflops"] = \
                tokens_per_second * result["flops_per_token"] / 1e12
    return result


# The kernels a --profile-steps run lists by name, as lamp_bench --profile.
TOP_KERNELS = 15
TOP_NAME_CHARS = 100


def kernel_times(events, device):
    """(name, microseconds) of each profiled GPU kernel on CUDA (a replayed
    CUDA graph's included), of each op's self time on a CPU."""
    times = []
    for e in events:
        if device == "cuda":
            if e.device_type == torch.autograd.DeviceType.CUDA:
                times.append((e.name, e.time_range.elapsed_us()))
        elif e.device_type == torch.autograd.DeviceType.CPU:
            times.append((e.name, e.self_cpu_time_total))
    return times


def top_kernels(times, steps, count=TOP_KERNELS):
    """The `count` names with the most time, largest first (ties by name),
    per step: [{"name", "seconds_per_step", "launches_per_step"}]."""
    totals = {}
    for name, micros in times:
        total = totals.setdefault(name, [0.0, 0])
        total[0] += micros
        total[1] += 1
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return [{"name": name, "seconds_per_step": micros * 1e-6 / steps,
             "launches_per_step": launches / steps}
            for name, (micros, launches) in ranked[:count]]


def format_top_kernels(kernels, step_seconds):
    """The list as lamp_bench --profile prints its own: ms per step, share
    of the step, launches per step, the name cut to TOP_NAME_CHARS."""
    if not kernels:
        return ""
    lines = ["%9s %7s %8s  %s" % ("ms/step", "share", "launches", "kernel")]
    for k in kernels:
        name = k["name"]
        if len(name) > TOP_NAME_CHARS:
            name = name[:TOP_NAME_CHARS - 3] + "..."
        share = (100.0 * k["seconds_per_step"] / step_seconds
                 if step_seconds > 0 else 0.0)
        lines.append("%9.3f %6.1f%% %8.1f  %s" % (
            1e3 * k["seconds_per_step"], share, k["launches_per_step"], name))
    return "\n".join(lines) + "\n"


def profile_steps(step, steps, device):
    """`steps` more steps under torch.profiler: their top kernels (ops on a
    CPU) and the profiled seconds per step."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    synchronize(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(device)
        seconds = time.perf_counter() - start
    return top_kernels(kernel_times(prof.events(), device), steps), \
        seconds / steps


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


# The most timed steps a calibrated run may take, and the most --min-seconds
# may ask for: lamp_bench's limits.
MAX_TIMED_STEPS = 100000
MAX_MIN_SECONDS = 3600.0


def timed_runs(step, args):
    """Calibrates the step count to at least --min-seconds (at most
    MAX_TIMED_STEPS steps, capped before they run), so that launch jitter
    and clock steps average out, then times --repeats runs of that count
    back to back. Returns (steps, images/s of each run)."""
    steps = args.steps
    while True:
        seconds = time_steps(step, steps, args.device)
        if seconds >= args.min_seconds or steps >= MAX_TIMED_STEPS:
            break
        wanted = steps * 1.2 * args.min_seconds / max(seconds, 1e-6) + 1
        steps = MAX_TIMED_STEPS if wanted >= MAX_TIMED_STEPS else int(wanted)
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
    # A TypeError is this torch's only where an argument it lacks is named
    # (an older torch.optim without fused=, say); any other is a mistake in
    # this file's step, a failure to show, not a skip to hide.
    older_api = isinstance(error, TypeError) and \
        "unexpected keyword argument" in message
    if ("not implemented for" in message or "not supported" in message
            or older_api):
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
    if result["model"] == "gpt":
        head = "gpt(layers=%d, heads=%d, width=%d, context=%d) b%d %s" % (
            result["gpt_layers"], result["gpt_heads"], result["gpt_width"],
            result["context"], result["batch_size"], result["precision"])
    else:
        layout = "channels_last" if result["channels_last"] else "NCHW"
        head = "%s b%d %s %s cudnn.benchmark=%s" % (
            result["model"], result["batch_size"], result["precision"],
            layout, "on" if result["cudnn_benchmark"] else "off")
    if result["skipped"]:
        return head + ": skipped (%s)" % result["skipped"]
    if result.get("failed"):
        return head + ": failed (%s)" % result["failed"]
    if result["model"] == "gpt":
        rate = "%.1f sequences/s, %.0f tokens/s, %.3f TFLOP/s" % (
            result["images_per_second"], result["tokens_per_second"],
            result["tflops"])
        unit = "sequences"
    else:
        rate = "%.1f images/s" % result["images_per_second"]
        unit = "images"
    text = head + (": %d steps in %.3f s, %s, %.2f s/epoch "
                   "(%d %s), peak memory %.1f MiB" % (
                       result["steps"], result["seconds"], rate,
                       result["seconds_per_epoch"], result["epoch_images"],
                       unit, result["peak_memory_bytes"] / 2.0 ** 20))
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


def min_seconds(text):
    """--min-seconds: a finite number of seconds in 0..MAX_MIN_SECONDS."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text)
    if not 0 <= value <= MAX_MIN_SECONDS:  # NaN fails too
        raise argparse.ArgumentTypeError(
            "%s is out of range: give a number in [0, %g]"
            % (text, MAX_MIN_SECONDS))
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


# --attention's names, as lamp::nn::to_string(SdpaBackend) spells them, and
# the torch.nn.attention.SDPBackend member of each.
ATTENTION_BACKENDS = {"flash": "FLASH_ATTENTION",
                      "memory-efficient": "EFFICIENT_ATTENTION",
                      "cudnn": "CUDNN_ATTENTION", "math": "MATH"}


def attention_backend(name):
    """The SDPBackend named `name` (lamp's spelling), or None where this
    torch lacks it."""
    try:
        from torch.nn.attention import SDPBackend
    except ImportError:
        return None
    return getattr(SDPBackend, ATTENTION_BACKENDS[name], None)


def attention_scope(name):
    """Allows only the attention kernel `name` while it lasts ("default":
    torch's own choice, untouched)."""
    if name == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel
    return sdpa_kernel([attention_backend(name)])


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Time lamp's benchmark training step in Python PyTorch "
                    "(eager, torch.compile with --compile, the whole step "
                    "in one CUDA graph with --cuda-graph, or several of "
                    "them with --tools).")
    parser.add_argument("--model", choices=MODELS, default="resnet18")
    parser.add_argument("--batch-size", type=positive_int, default=128,
                        help="images per step (sequences for gpt)")
    defaults = GPTShape()
    parser.add_argument("--gpt-layers", type=positive_int, default=None,
                        help="gpt: transformer blocks (default %d)"
                             % defaults.layers)
    parser.add_argument("--gpt-heads", type=positive_int, default=None,
                        help="gpt: attention heads, dividing --gpt-width "
                             "(default %d)" % defaults.heads)
    parser.add_argument("--gpt-width", type=positive_int, default=None,
                        help="gpt: embedding width (default %d)"
                             % defaults.width)
    parser.add_argument("--context", type=positive_int, default=None,
                        help="gpt: tokens per sequence, the position "
                             "embedding's length (default %d)"
                             % defaults.context)
    parser.add_argument("--gpt-vocab", type=positive_int, default=None,
                        help="gpt: vocabulary, random token ids below it "
                             "(default %d)" % defaults.vocab_size)
    parser.add_argument("--gpt-gelu", choices=("exact", "tanh"),
                        default=None,
                        help="gpt: the MLP's GELU, exact (nanoGPT's) or tanh "
                             "(GPT-2's; default %s)" % defaults.gelu)
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
                        help="torch.optim.SGD's implementation (AdamW's for "
                             "gpt; default foreach, Python's default on "
                             "CUDA)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="capture the whole step (forward, backward, "
                             "scaler, optimizer) in one CUDA graph and "
                             "replay it (CUDA only; with --optimizer-impl "
                             "fused under loss scaling)")
    parser.add_argument("--min-seconds", type=min_seconds, default=0.0,
                        help="time at least this long, 0..3600: more steps "
                             "than --steps when they are faster, up to "
                             "%d (default 0)" % MAX_TIMED_STEPS)
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: cuda when available, else cpu")
    parser.add_argument("--warmup", type=non_negative_int, default=5,
                        help="untimed steps first (default 5; at least 3 "
                             "before a CUDA graph capture)")
    parser.add_argument("--steps", type=positive_int, default=20,
                        help="timed steps (default 20)")
    parser.add_argument("--epoch-images", type=positive_int, default=None,
                        help="images per epoch for s/epoch (default 50000; "
                             "60000 for cnn; for gpt sequences, default "
                             "%d tokens / --context)" % GPT_EPOCH_TOKENS)
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
    parser.add_argument("--attention", default="default",
                        choices=sorted(ATTENTION_BACKENDS) + ["default"],
                        help="--model gpt: the one scaled_dot_product_"
                             "attention kernel allowed, as lamp_bench's "
                             "--attention (default: torch's choice)")
    parser.add_argument("--profile-steps", type=non_negative_int, default=0,
                        help="after the timed runs, profile N more steps "
                             "with torch.profiler and list the %d kernels "
                             "(ops on a CPU) that took the most time, as "
                             "lamp_bench --profile does (default 0: none)"
                        % TOP_KERNELS)
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
    gpt_flags = {"--gpt-layers": args.gpt_layers,
                 "--gpt-heads": args.gpt_heads,
                 "--gpt-width": args.gpt_width, "--context": args.context,
                 "--gpt-vocab": args.gpt_vocab, "--gpt-gelu": args.gpt_gelu}
    if args.model == "gpt":
        if args.channels_last or args.cudnn_benchmark:
            parser.error("--channels-last and --cudnn-benchmark are "
                         "convolution settings; --model gpt has no "
                         "convolutions, leave them out")
        defaults = GPTShape()
        args.gpt_layers = args.gpt_layers or defaults.layers
        args.gpt_heads = args.gpt_heads or defaults.heads
        args.gpt_width = args.gpt_width or defaults.width
        args.context = args.context or defaults.context
        args.gpt_vocab = args.gpt_vocab or defaults.vocab_size
        args.gpt_gelu = args.gpt_gelu or defaults.gelu
        if args.gpt_width % args.gpt_heads != 0:
            parser.error("--gpt-heads %d does not divide --gpt-width %d; "
                         "give a width that is a multiple of the heads"
                         % (args.gpt_heads, args.gpt_width))
    else:
        given = [flag for flag, value in gpt_flags.items()
                 if value is not None]
        if given:
            parser.error("%s: the GPT's shape, for --model gpt only (this "
                         "is --model %s)" % (", ".join(given), args.model))
    if args.attention != "default":
        if args.model != "gpt":
            parser.error("--attention is for --model gpt (this is --model "
                         "%s)" % args.model)
        if attention_backend(args.attention) is None:
            parser.error("--attention %s needs torch.nn.attention.SDPBackend "
                         "(torch >= 2.3) with that backend; this is torch %s"
                         % (args.attention, torch.__version__))
    if args.epoch_images is None:
        if args.model == "gpt":
            args.epoch_images = max(1, GPT_EPOCH_TOKENS // args.context)
        else:
            args.epoch_images = 60000 if args.model == "cnn" else 50000
    return args


# main()'s exit status where some of several tools failed and the others'
# results are written (bench/run.sh keeps them and counts the failure).
PARTLY_FAILED = 3


def host_memory():
    """glibc's malloc thresholds as the environment sets them
    ("MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456", as
    bench/run.sh gives this process: lamp_bench's keep_host_memory()), or
    "glibc defaults"."""
    names = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
             "GLIBC_TUNABLES")
    settings = ["%s=%s" % (name, os.environ[name]) for name in names
                if os.environ.get(name)]
    return " ".join(settings) or "glibc defaults"


def main(argv=None):
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    shape = gpt_shape(args)
    expected = expected_parameters(args.model, shape)
    if model_unsupported_reason(args.model) is None:
        got = count_parameters(make_model(args.model, shape))
        if got != expected:
            sys.exit("peer_pytorch.py: %s has %d parameters but lamp's has "
                     "%d; the architectures differ"
                     % (shape or args.model, got, expected))
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
        "host_memory": host_memory(),
        "results": [],
    }
    print("%s: torch %s, %s (%s), %d threads" % (
        report["tool"], report["torch_version"], report["device"],
        report["device_name"], report["threads"]), flush=True)
    tools = args.tools or [tool_name(args)]
    with attention_scope(args.attention):
        for tool in tools:
            tool_args = argparse.Namespace(**vars(args))
            if args.tools:
                (tool_args.compile, tool_args.compile_mode,
                 tool_args.optimizer_impl, tool_args.cuda_graph) = TOOLS[tool]
            for precision in args.precision:
                result = run_configuration(tool_args, precision,
                                           tf32_defaults,
                                           keep_going=len(tools) > 1)
                result["tool"] = tool
                report["results"].append(result)
                print("%s: %s" % (tool, describe(result)), flush=True)
                if result.get("profile"):
                    profiled = result["profile"]
                    print("profile of %d steps (%s): %.3f ms/step under the "
                          "profiler\n%s" % (
                              profiled["steps"],
                              "CUDA kernels" if args.device == "cuda"
                              else "CPU ops, self time",
                              1e3 * profiled["seconds_per_step"],
                              format_top_kernels(
                                  profiled["top_kernels"],
                                  profiled["seconds_per_step"])),
                          end="", flush=True)

    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)
            out.write("\n")
    failed = [r["tool"] for r in report["results"] if r.get("failed")]
    if failed:
        # The other tools' results stand (bench/run.sh keeps them); the
        # run as a whole did not do what it was asked.
        print("peer_pytorch.py: %d of %d runs failed (%s); their cells say "
              "why" % (len(failed), len(report["results"]),
                       ", ".join(failed)), file=sys.stderr, flush=True)
        return PARTLY_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
