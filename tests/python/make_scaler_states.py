"""Writes tests/python/scaler_states/*.pt: GradScaler states as Python's
torch.save writes them in the forms LibTorch's own reader does not handle,
for tests/python_interop_test.cpp (which reads the committed files, so the
tests need no Python). Made with torch 2.11.0 on Python 3.11:

  python tests/python/make_scaler_states.py tests/python/scaler_states

Every state is torch.amp.GradScaler("cpu", init_scale=1024.0,
growth_factor=3.0, backoff_factor=0.25, growth_interval=7).state_dict() with
_growth_tracker 2, changed as the file name says:

  ordered_dict.pt      collections.OrderedDict(state)
  ints_for_floats.pt   scale 1024 and growth_factor 3 as Python ints
  scale_2_pow_40.pt    scale 2**40 as a Python int (pickled in 6 bytes)
  tracker_2_pow_70.pt  _growth_tracker 2**70 (beyond int64)
  legacy_format.pt     the state in the legacy (non-zip) format,
                       _use_new_zipfile_serialization=False
  in_checkpoint.pt     a whole training checkpoint, the state under
                       "scaler" beside a Linear(4, 4)'s state_dict, its
                       AdamW's after one step and an epoch (torch 2.15.0)
  checkpoint_without_scaler.pt
                       the same checkpoint without "scaler" (torch 2.15.0)
"""

import collections
import os
import sys

import torch


def main(folder):
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_factor=3.0,
                                  backoff_factor=0.25, growth_interval=7)
    state = dict(scaler.state_dict(), _growth_tracker=2)
    path = lambda name: os.path.join(folder, name)
    torch.save(collections.OrderedDict(state), path("ordered_dict.pt"))
    torch.save(dict(state, scale=1024, growth_factor=3),
               path("ints_for_floats.pt"))
    torch.save(dict(state, scale=2**40), path("scale_2_pow_40.pt"))
    torch.save(dict(state, _growth_tracker=2**70), path("tracker_2_pow_70.pt"))
    torch.save(state, path("legacy_format.pt"),
               _use_new_zipfile_serialization=False)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    checkpoint = {"model": model.state_dict(),
                  "optimizer": optimizer.state_dict(), "epoch": 3}
    torch.save(checkpoint, path("checkpoint_without_scaler.pt"))
    torch.save(dict(checkpoint, scaler=state), path("in_checkpoint.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
