"""``pfamalign prepare``: build training datasets (the logic lives in pfamalign.pipelines)."""

from __future__ import annotations

import math
import os

import click
from click.core import ParameterSource


def _floats(text: str, name: str, n: int | None = None, *,
            bounds: tuple[float, float] = (-math.inf, math.inf)) -> tuple[float, ...]:
    """Comma-separated finite numbers within ``bounds`` (float() also reads nan and inf)."""
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {text!r}",
                                 param_hint=name) from None
    if n is not None and len(values) != n:
        raise click.BadParameter(f"expected {n} comma-separated numbers, got {text!r}",
                                 param_hint=name)
    low, high = bounds
    if not all(math.isfinite(v) and low <= v <= high for v in values):
        within = "" if bounds == (-math.inf, math.inf) else f" from {low:g} to {high:g}"
        raise click.BadParameter(f"expected finite numbers{within}, got {text!r}", param_hint=name)
    return values


def _fold(text: str | None) -> tuple[int, int] | None:
    """``"K/N"`` -> ``(K, N)``; None stays None (the --splits fractions apply)."""
    if text is None:
        return None
    k, sep, n = text.partition("/")
    if not (sep and k.strip().isdigit() and n.strip().isdigit()):
        raise click.BadParameter(f"expected K/N such as 0/5, got {text!r}", param_hint="--fold")
    return int(k), int(n)


@click.group()
def prepare():
    """Prepare datasets from Pfam alignments.

    \b
    Examples:
      # built-in features (one-hot + BLOSUM62 rows), the settings of data_b62_1k
      pfamalign prepare shards --pfam Pfam-A.seed.gz --embedder builtin/onehot+blosum62 \\
          --pairs-per-family 1000 --stratify-pid --splits 0.7,0.1,0.2 --out data/
      # ESM-2 features (the last layer of the 8M model), from a directory of Stockholm files
      pfamalign prepare shards --pfam stockholm/ --embedder esm2_t6_8M_UR50D \\
          --weights ~/models/esm2_t6_8M_UR50D.pt --out data_esm/
      # cross-validation fold 0 of 5 (test = the families of fold 0)
      pfamalign prepare shards --pfam Pfam-A.seed.gz --fold 0/5 --out folds/0/

    Re-running the same command resumes an unfinished dataset; `pfamalign prepare shards
    --help` lists every option.
    """


@prepare.command("shards")
@click.option("--pfam", "inputs", multiple=True, required=True, type=click.Path(exists=True),
              help="Stockholm input: a file (.gz ok; Pfam-A.seed.gz is streamed) or a directory "
                   "of them. Repeat for several.")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Dataset directory (created; a re-run resumes an unfinished one).")
@click.option("--embedder", default="builtin/onehot", show_default=True,
              help="builtin/onehot, builtin/onehot+blosum62, or an ESM-2 model such as "
                   "esm2_t6_8M_UR50D[/layerN].")
@click.option("--weights", type=click.Path(), default=None,
              help="ESM-2 checkpoint (esm2_*.pt) or a directory holding it. Default: "
                   "$PFAMALIGN_ESM_WEIGHTS, then the torch hub cache.")
@click.option("--layer", type=int, default=None,
              help="ESM-2 layer (negative counts from the top); same as '/layerN' in --embedder.")
@click.option("--long-seqs", "long_policy", type=click.Choice(["refuse", "window"]),
              default="refuse", show_default=True,
              help="ESM-2 and sequences over 1022 residues: leave them out (refuse) or embed "
                   "overlapping windows.")
@click.option("--toks-per-batch", type=click.IntRange(min=1), default=4096, show_default=True,
              help="ESM-2 batch size in tokens. Lower it if ESM-2 runs out of memory: an "
                   "unfinished run resumes with another batch size, its work kept.")
@click.option("--dtype", type=click.Choice(["float16", "float32"]), default="float16",
              show_default=True, help="Embedding storage type.")
@click.option("--pairs-per-family", type=click.IntRange(min=1), default=50, show_default=True,
              help="Pairs drawn per family, before splitting (a family goes whole to one split; "
                   "a family with fewer pairs gives all it has).")
@click.option("--min-len", type=int, default=10, show_default=True,
              help="Shortest sequence (residues) used.")
@click.option("--max-len", type=int, default=1022, show_default=True,
              help="Longest sequence (residues) used.")
@click.option("--stratify-pid/--no-stratify-pid", default=False, show_default=True,
              help="Sample pairs round-robin across percent-identity bins.")
@click.option("--pid-bins", default="30,50", show_default=True,
              help="Percent-identity bin edges (0 to 100) for --stratify-pid.")
@click.option("--inserts", type=click.Choice(["unaligned", "aligned"]), default="unaligned",
              show_default=True,
              help="Lower-case (insert-state) residues: never aligned (Pfam convention) or "
                   "aligned by column like match states.")
@click.option("--splits", "split_text", default="0.8,0.1,0.1", show_default=True,
              help="train,val,test shares of the families (summing to 1): each family goes "
                   "to one split, drawn from its key and --seed with these probabilities, so a "
                   "family keeps its split when others are added, and a few families may split "
                   "unevenly.")
@click.option("--fold", "fold_text", default=None, metavar="K/N",
              help="Cross-validation fold K of N (0-based), instead of --splits (not with "
                   "it): test = the families of fold K, val = about 10 % of the others, "
                   "train = the rest.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the family split and the pair sampling.")
@click.option("--skip-bad", is_flag=True,
              help="Report malformed families and continue instead of stopping.")
@click.option("--workers", type=int, default=1, show_default=True,
              help="Worker processes (the result does not depend on it).")
@click.option("--engine", type=click.Choice(["local", "beam"]), default="local",
              show_default=True, help="Run the stages locally or as an Apache Beam pipeline.")
@click.option("--beam-arg", "beam_args", multiple=True,
              help="Beam pipeline option, e.g. --beam-arg=--runner=FnApiRunner (repeatable).")
@click.option("--records-per-shard", type=int, default=20000, show_default=True,
              help="Pair records per shard file.")
@click.option("--families-per-chunk", type=int, default=64, show_default=True,
              help="Families per unit of ingest work (resume granularity).")
@click.option("--seqs-per-part", type=int, default=2048, show_default=True,
              help="Sequences per unit of embedding work (resume granularity).")
@click.option("--reuse-embeddings", "reuse", multiple=True, type=click.Path(exists=True,
              file_okay=False), help="A finished dataset with the same embedder, weights and "
              "dtype whose embeddings are copied instead of recomputed (repeatable). With "
              "--overwrite it may be --out itself: the new dataset is built beside the old "
              "one, which is replaced only when the new one is finished.")
@click.option("--keep-work", is_flag=True, help="Keep OUT/work (intermediate files).")
@click.option("--overwrite", is_flag=True,
              help="Replace a dataset built with other options in --out (only the files "
                   "prepare wrote; other files stay).")
@click.option("--device", default="cpu", show_default=True, help="torch device for ESM-2.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch threads per process for ESM-2 (default: torch's choice; 1 is often "
                   "fastest on a busy machine).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars and no summary.")
def shards(inputs, out, embedder, weights, layer, long_policy, toks_per_batch, dtype,
           pairs_per_family, min_len, max_len, stratify_pid, pid_bins, inserts, split_text,
           fold_text, seed, skip_bad, workers, engine, beam_args, records_per_shard, families_per_chunk,
           seqs_per_part, reuse, keep_work,
           overwrite, device, threads, quiet):
    """Build train/val/test pair shards from Pfam Stockholm alignments.

    \b
    Examples:
      pfamalign prepare shards --pfam Pfam-A.seed.gz --out data/            # one-hot features
      pfamalign prepare shards --pfam Pfam-A.seed.gz --out data/ \\
          --embedder esm2_t6_8M_UR50D --weights ~/models/esm2_t6_8M_UR50D.pt

    Re-running the same command resumes an interrupted run and never duplicates a record.
    """
    from pfamalign.outputs import UnwritableOutput, naming, table_console
    from pfamalign.pipelines.config import PrepareConfig
    from pfamalign.pipelines.embed import EmbedderError
    from pfamalign.pipelines.pairs import SamplingConfig
    from pfamalign.pipelines.prepare import PrepareError, run_prepare
    from pfamalign.pipelines.progress import render_summary
    from pfamalign.pipelines.stockholm import StockholmError

    given = lambda name: click.get_current_context().get_parameter_source(name) is ParameterSource.COMMANDLINE  # noqa: E731
    esm_options = {"device": "--device", "threads": "--threads", "toks_per_batch": "--toks-per-batch",
                   "long_policy": "--long-seqs"}
    esm_given = [flag for name, flag in esm_options.items() if given(name)]
    if esm_given and embedder.strip().startswith("builtin"):  # it would be silently ignored
        raise click.UsageError(f"{' and '.join(esm_given)} set{'s' if len(esm_given) == 1 else ''} how an "
                               f"ESM-2 embedder runs; {embedder} has no such setting (drop "
                               f"{'it' if len(esm_given) == 1 else 'them'}, or give --embedder esm2_...)")
    splits_given = click.get_current_context().get_parameter_source("split_text")
    if fold_text is not None and splits_given is not ParameterSource.DEFAULT:
        raise click.UsageError("--fold K/N and --splits both choose the splits; give one of them "
                               "(a fold's val and test do not use the --splits fractions)")
    if layer is not None:
        if embedder.strip().startswith("builtin"):
            raise click.BadParameter(f"--layer picks a layer of an ESM-2 embedder; {embedder} has "
                                     "none (drop --layer, or give --embedder esm2_...)",
                                     param_hint="--layer")
        if "/" in embedder:
            raise click.BadParameter("give the layer either in --embedder or with --layer",
                                     param_hint="--layer")
        embedder = f"{embedder}/layer{layer}"
    try:
        sampling = SamplingConfig(pairs_per_family=pairs_per_family, min_len=min_len,
                                  max_len=max_len, stratify_pid=stratify_pid,
                                  pid_bins=_floats(pid_bins, "--pid-bins", bounds=(0, 100)),
                                  inserts_aligned=inserts == "aligned")
        if given("pid_bins") and not stratify_pid:  # (checked once they parse)
            raise click.UsageError("--pid-bins are the bins of --stratify-pid; add --stratify-pid, or drop them")
        cfg = PrepareConfig(inputs=tuple(inputs), out=out, embedder=embedder, weights=weights,
                            long_policy=long_policy, toks_per_batch=toks_per_batch, dtype=dtype,
                            sampling=sampling,
                            split_fractions=_floats(split_text, "--splits", 3),  # type: ignore
                            fold=_fold(fold_text),
                            seed=seed, skip_bad=skip_bad, workers=workers,
                            records_per_shard=records_per_shard,
                            families_per_chunk=families_per_chunk, seqs_per_part=seqs_per_part,
                            reuse_embeddings=tuple(reuse), keep_work=keep_work,
                            overwrite=overwrite, device=device, threads=threads, engine=engine,
                            beam_args=tuple(beam_args))
        result = run_prepare(cfg, quiet=quiet)
    except KeyboardInterrupt as err:  # Ctrl-C, SIGTERM: what was done is kept
        err.add_note(f"The work done so far is kept in {out}: re-run the same command to resume.")
        raise
    except StockholmError as err:
        raise click.ClickException(f"{err}\nFix the file, or pass --skip-bad to report bad "
                                   "families and continue.") from err
    except (EmbedderError, PrepareError, ValueError, FileNotFoundError) as err:
        raise click.ClickException(str(err)) from err
    except OSError as err:  # a full disk: the dataset named, and its work kept for the rerun
        if isinstance(named := naming(err, out), UnwritableOutput):
            raise click.ClickException(f"{named}\nThe work done so far is kept in {out}: re-run the same "
                                       "command to resume.") from err
        raise
    for warning in result.summary.get("warnings", []):  # even with --quiet: act on it now
        click.echo(f"Warning: {warning}", err=True)
    left_out = result.summary["skipped"]["families"]
    malformed = left_out.get("malformed Stockholm", 0)  # only with --skip-bad, else an error
    duplicates = left_out.get("duplicate family key", 0)  # always: the first copy is kept
    for count, what in ((malformed, "--skip-bad left out {} malformed"),
                        (duplicates, "left out {} duplicate")):
        if count:  # even with --quiet: the dataset lacks these families
            click.echo(f"Warning: {what.format(count)} famil{'y' if count == 1 else 'ies'} "
                       f"(file:line in {out}/families.tsv)", err=True)
    if not quiet:
        console = table_console()
        if result.already_complete:
            console.print(f"{out}: already complete (config {result.manifest['config_hash']}); "
                          "nothing to do.")
        elif result.replaced is not None:
            console.print(f"{out}: replaced the dataset of config {result.replaced} (--overwrite) by this "
                          f"one (config {result.manifest['config_hash']})")
        render_summary(result.summary, console)
        console.print(f"dataset: {os.path.abspath(out)} (manifest.json)")
    if not result.summary["pairs"]["total"]:  # nothing to train or score on: not a success
        raise click.ClickException(
            f"no pairs were produced from the {result.summary['families']['read']} families read "
            f"({malformed} malformed): {out} is an empty dataset; the summary's skipped table "
            "(without -q) says why")
