"""Builds a tiny randomly initialised ESM-2 saved in the real fair-esm checkpoint format.

Used by the tests and scripts/bench_prepare.py so the real fair-esm loader
(``esm.pretrained.load_model_and_alphabet_local``) and extraction code run without the real
weights. fair-esm picks the ESM-2 code path from the file name (``esm2*``), so the file is
``esm2_t2_tiny_random.pt`` with ``esm2_t2_tiny_random-contact-regression.pt`` beside it.
"""

from __future__ import annotations

import argparse
import pathlib

TINY_NAME = "esm2_t2_tiny_random"


def build_tiny_esm(directory, *, name: str = TINY_NAME, num_layers: int = 2,
                   embed_dim: int = 32, attention_heads: int = 4, seed: int = 0,
                   regression: bool = True) -> pathlib.Path:
    """Writes ``{directory}/{name}.pt`` (+ the regression file) and returns the .pt path."""
    import esm
    import torch

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    alphabet = esm.data.Alphabet.from_architecture("ESM-1b")
    model = esm.model.esm2.ESM2(num_layers=num_layers, embed_dim=embed_dim,
                                attention_heads=attention_heads, alphabet=alphabet,
                                token_dropout=True)
    state = model.state_dict()
    reg_keys = {k for k in state if k.startswith("contact_head.regression")}
    cfg = argparse.Namespace(encoder_layers=num_layers, encoder_embed_dim=embed_dim,
                             encoder_ffn_embed_dim=4 * embed_dim,
                             encoder_attention_heads=attention_heads, token_dropout=True,
                             arch="ESM2", max_positions=1024)
    path = directory / f"{name}.pt"
    torch.save({"model": {"encoder." + k: v for k, v in state.items() if k not in reg_keys},
                "cfg": {"model": cfg}, "args": None}, path)
    if regression:
        torch.save({"model": {k: state[k] for k in reg_keys}},
                   directory / f"{name}-contact-regression.pt")
    return path
