"""One definition of the model's plan metrics: the validation inside training and
`pfamalign eval` score the same pairs alike, with and without a dustbin."""

import pathlib

import pytest

from pfamalign import checkpoint, evaluation
from pfamalign.alignment.metrics import PlanMetrics
from pfamalign.inference import Predictor
from pfamalign.model import build_model
from pfamalign.pipelines import reader
from pfamalign.pipelines.config import PrepareConfig
from pfamalign.pipelines.pairs import SamplingConfig
from pfamalign.pipelines.prepare import run_prepare
from pfamalign.training import loop, rundir

SEED = pathlib.Path(__file__).parent / "data" / "pfam_seed"
# tiny models (3 base steps: the metrics do not depend on convergence); pairs of <= 52
# residues: one padded shape (64) in both paths
TINY = {"encoder_layers": 1, "encoder_width": 16, "heads": 2, "head_dim": 8, "value_dim": 8,
        "transport.base_steps": 3,
        "train.eval_pairs": 8, "train.eval_batch_size": 4}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Two short families, every pair in the val split."""
    out = tmp_path_factory.mktemp("evaluation") / "ds"
    run_prepare(PrepareConfig(inputs=(str(SEED / "PF05371.sto"), str(SEED / "PF02184.sto")),
                              out=str(out), embedder="builtin/onehot+blosum62",
                              sampling=SamplingConfig(pairs_per_family=12),
                              split_fractions=(0.0, 1.0, 0.0)), quiet=True)
    return out


@pytest.mark.parametrize("name", ["k2_eps1", "muot_dustbin_hybrid"])
def test_validation_and_eval_give_the_same_plan_metrics(name, dataset, tmp_path):
    cfg = rundir.resolve_config(dataset, name, overrides=TINY)
    checkpoint.save_model(tmp_path / "model", build_model(cfg.model, seed=2), cfg.model)
    predictor = Predictor(tmp_path / "model")
    val = evaluation.validate(predictor.model, loop.val_batches(dataset, cfg.train))

    # the same pairs, through `pfamalign eval`'s path
    lengths = reader.PairDataset(dataset).lengths("val")
    chosen = set(reader.select_pairs(lengths, max_pairs=cfg.train.eval_pairs).tolist())
    records = [r for i, r in enumerate(reader.iter_pairs(dataset, "val", features=True))
               if i in chosen]
    assert any((r["target"] < 0).any() for r in records)  # unaligned rows: the case in question
    ev = evaluation.evaluate(records, predictor=predictor, baselines=())
    pooled = PlanMetrics.pool(ev.plan["model"])

    assert val["val/n_pairs"] == len(records) == 8
    for metric in ("sparse_ce", "barycenter_mae", "within5", "monotonicity_violation"):
        assert val[f"val/{metric}"] == pytest.approx(getattr(pooled, metric), rel=1e-4), metric
    diag = PlanMetrics.pool(ev.plan["diagonal"])
    assert val["diag/sparse_ce"] == pytest.approx(diag.sparse_ce, rel=1e-6)
    # without a dustbin, unaligned rows are left out of the CE (as in the training loss)
    n_aligned = sum(int((r["target"] >= 0).sum()) for r in records)
    n_rows = sum(len(r["target"]) for r in records)
    assert pooled.n_ce == (n_rows if cfg.model.dustbin else n_aligned)
