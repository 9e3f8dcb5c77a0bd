"""Rewrite a weights file's decision rule: ``python redecide.py SRC DST RULE`` (``median`` needs
``recipe.patch`` applied to load). The network's tensors are copied unchanged."""

import sys

import torch

src, dst, rule = sys.argv[1:4]
payload = torch.load(src, map_location="cpu", weights_only=True)
payload["config"]["decision"] = rule
torch.save(payload, dst)
