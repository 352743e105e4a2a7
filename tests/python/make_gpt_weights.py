"""Writes tests/python/gpt_weights/*.pt: a small GPT's weights as Python
programs save them, for tests/gpt_weights_test.cpp (which reads the
committed files, so the tests need no Python). Made with torch 2.15.0 on
Python 3.11:

  python tests/python/make_gpt_weights.py tests/python/gpt_weights

Each model is bench/peer_pytorch.py's GPT (lamp's twin) of 2 layers, 2
heads, width 8, context 8 and 16 token ids, seeded, every parameter
(norms and biases too) moved off its initial value by N(0, 0.1) noise so
that each one shows in the output:

  nanogpt_state_dict.pt   model.state_dict() of nanoGPT's layout
                          ("transformer." names and the tied lm_head.weight)
  nanogpt_ckpt.pt         nanoGPT's train.py checkpoint of a torch.compile'd
                          model without biases ("_orig_mod." names under
                          "model", "model_args" with n_head, the AdamW state
                          after one step, iter_num, best_val_loss, config)
  huggingface_state_dict.pt
                          GPT2LMHeadModel's layout: nanoGPT's names, the
                          blocks' c_attn, c_proj, c_fc and mlp.c_proj weights
                          transposed ([in, out], Conv1D's), the attention-mask
                          buffers of its older files (attn.bias,
                          attn.masked_bias); the tanh GELU
  expected.pt             the tokens [2, 8] and each model's logits on them
                          in eval mode, FP32, under the file's name
  views.pt                an OrderedDict (as a state dict, which LibTorch's
                          own reader cannot read) of two views torch.save
                          stores with their whole storage: "offset_view"
                          (arange(10.)[3:7], offset 3) and "strided_view"
                          (arange(12.).view(3, 4).t(), strides (1, 4))
"""

import collections
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True

import peer_pytorch  # noqa: E402
from lamp_interop import NanoGPTLayout  # noqa: E402

CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight",
          ".mlp.c_proj.weight")


def model(seed, **shape):
    torch.manual_seed(seed)
    gpt = NanoGPTLayout(peer_pytorch.GPTShape(
        layers=2, heads=2, width=8, context=8, vocab_size=16, **shape))
    with torch.no_grad():
        for parameter in gpt.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return gpt.eval()


def main(folder):
    os.makedirs(folder, exist_ok=True)
    path = lambda name: os.path.join(folder, name)
    torch.manual_seed(0)
    tokens = torch.randint(0, 16, (2, 8))
    expected = {"tokens": tokens}

    nanogpt = model(1)
    torch.save(nanogpt.state_dict(), path("nanogpt_state_dict.pt"))
    with torch.no_grad():
        expected["nanogpt_state_dict.pt"] = nanogpt(tokens)

    compiled = model(2, bias=False)
    optimizer = torch.optim.AdamW(compiled.parameters(), lr=1e-3)
    compiled.train()
    torch.nn.functional.cross_entropy(
        compiled(tokens).flatten(0, 1), tokens.roll(-1, 1).flatten()).backward()
    optimizer.step()
    compiled.eval()
    torch.save({
        "model": {"_orig_mod." + k: v for k, v in compiled.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "model_args": dict(n_layer=2, n_head=2, n_embd=8, block_size=8,
                           bias=False, vocab_size=16, dropout=0.0),
        "iter_num": 1,
        "best_val_loss": torch.tensor(2.75),
        "config": dict(out_dir="out", batch_size=2, learning_rate=1e-3,
                       compile=True, dataset="shakespeare_char"),
    }, path("nanogpt_ckpt.pt"))
    with torch.no_grad():
        expected["nanogpt_ckpt.pt"] = compiled(tokens)

    hugging = model(3, gelu="tanh")
    state = {}
    for key, tensor in hugging.state_dict().items():
        state[key] = tensor.t().contiguous() if key.endswith(CONV1D) else tensor
    for layer in range(2):
        prefix = "transformer.h.%d.attn." % layer
        state[prefix + "bias"] = torch.tril(
            torch.ones(8, 8, dtype=torch.bool)).view(1, 1, 8, 8)
        state[prefix + "masked_bias"] = torch.tensor(-1e4)
    torch.save(state, path("huggingface_state_dict.pt"))
    with torch.no_grad():
        expected["huggingface_state_dict.pt"] = hugging(tokens)

    torch.save(expected, path("expected.pt"))
    torch.save(collections.OrderedDict(
        offset_view=torch.arange(10.0)[3:7],
        strided_view=torch.arange(12.0).view(3, 4).t()), path("views.pt"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_gpt_weights.py FOLDER")
    main(sys.argv[1])
