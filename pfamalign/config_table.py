"""The named training configurations as plain data: importing it loads no jax, so the
command line can list the names (``pfamalign train --help``) without the model's imports.
``pfamalign.configs`` resolves a name into an ``AlignerConfig`` / ``TrainConfig``."""

# name -> (model fields, transport fields, train fields). "encoder": None = by features.
CONFIGS: dict[str, tuple[dict, dict, dict]] = {
    "k2_eps1": ({"recon_weight": 1.0}, {"tail_steps": 2}, {}),
    "k4_eps1": ({"recon_weight": 1.0}, {"tail_steps": 4}, {}),
    "muot_dustbin_mono": ({"recon_weight": 1.0, "mono_weight": 0.1},
                          {"dustbin": "widened"}, {}),
    "muot_dustbin_hybrid": ({"recon_weight": 1.0, "ce_weight": 1.0},
                            {"dustbin": "widened"}, {}),
    "align_ce": ({"recon_weight": 0.0, "ce_weight": 1.0, "mono_weight": 0.01,
                  "encoder": "conv", "heads": 1, "head_dim": 64, "value_dim": 16,
                  "position_features": 0, "substitution_window": None},
                 {"dustbin": "spoke"}, {}),
}
# What the column constraint and the balance are worth: align_ce with the row softmax
# (semi-relaxed rows, columns free) and with the capacity dustbin (balanced for every pair).
CONFIGS["align_softmax"] = (CONFIGS["align_ce"][0], {"dustbin": "spoke", "marginals": "rows"}, {})
CONFIGS["align_ce_capacity"] = (CONFIGS["align_ce"][0], {"dustbin": "capacity"}, {})
CONFIG_NAMES = tuple(CONFIGS)
