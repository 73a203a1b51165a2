"""``prepare``: from Pfam Stockholm files to a training-ready dataset directory.

    from pfamalign.pipelines.config import PrepareConfig
    from pfamalign.pipelines.prepare import run_prepare
    result = run_prepare(PrepareConfig(inputs=("Pfam-A.seed.gz",), out="data/"))
    result.summary, result.manifest

Engine: the stages of ``stages.py`` run in this process (``workers=1``) or in a pool of
spawned worker processes; ``engine="beam"`` runs the ingest and embed stages as an Apache Beam
pipeline instead (``beam.py``). Resume: every unit of work is a file committed atomically, so
a re-run (after a crash, Ctrl-C or kill -9) redoes only the missing units and produces the
same bytes as an uninterrupted run. ``manifest.json`` is written last: it marks completion.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import json
import multiprocessing
import os
import pathlib
import shutil
from collections.abc import Callable, Iterable, Iterator

from pfamalign import jsonio
from pfamalign.outputs import is_temporary
from pfamalign.pipelines import records as rec
from pfamalign.pipelines import stages
from pfamalign.pipelines.config import (FORMAT_VERSION, PrepareConfig, config_hash,
                                        n_parts_for)
from pfamalign.pipelines.embed import Embedder, get_embedder
from pfamalign.pipelines.locks import LOCK_NAME, LockError, directory_lock
from pfamalign.pipelines.progress import bars, progress_enabled
from pfamalign.pipelines.reader import FAILED, dataset_files
from pfamalign.pipelines.splits import SPLITS
from pfamalign.pipelines.stockholm import (RawFamily, check_parses, expand_inputs,
                                           iter_raw_families)



class PrepareError(RuntimeError):
    """A user-facing prepare failure (the message says what to do)."""


@dataclasses.dataclass
class PrepareResult:
    out: pathlib.Path
    manifest: dict
    summary: dict
    already_complete: bool = False
    replaced: str | None = None  # --overwrite: the config hash of the dataset this one replaced


# ------------------------------------------------------------------------------------------
# Worker pool
# ------------------------------------------------------------------------------------------

Unit = tuple[Callable, tuple, dict, float]  # fn, args, kwargs, progress weight


def run_units(units: Iterable[Unit], workers: int, on_done: Callable[[object, float], None]
              ) -> None:
    """Runs units in this process (workers == 1) or in a spawned process pool, keeping at
    most ``2 * workers`` in flight; the first failure cancels the rest and is re-raised."""
    if workers <= 1:
        for fn, args, kwargs, weight in units:
            on_done(fn(*args, **kwargs), weight)
        return
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        pending: dict[cf.Future, float] = {}
        try:
            for fn, args, kwargs, weight in units:
                pending[pool.submit(fn, *args, **kwargs)] = weight
                while len(pending) >= 2 * workers:
                    done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                    for fut in done:
                        on_done(fut.result(), pending.pop(fut))
            for fut in cf.as_completed(list(pending)):
                on_done(fut.result(), pending.pop(fut))
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise


# ------------------------------------------------------------------------------------------
# Setup: output directory state and the config hash
# ------------------------------------------------------------------------------------------

def _input_digests(files: list[pathlib.Path]) -> list[list[str]]:
    return [[f.name, rec.file_sha256(f)] for f in files]


# Names of the files prepare writes outside ``work/`` (its stage-4 outputs), for replacing a
# run that never reached its manifest; a finished dataset is replaced by its manifest's list.
_OUTPUT_PATTERNS = ("manifest.json", "shards.tsv", "families.tsv", "embeddings/index.tsv",
                    "embeddings/emb-*.array_record",
                    *(f"{s}/{name}" for s in SPLITS for name in ("lengths.npy",
                                                                 "pairs-*.array_record")))


def _manifest_files(manifest: dict) -> list[str]:
    """The files (relative to the dataset) that a finished dataset's manifest says prepare
    wrote."""
    return ["manifest.json", *dataset_files(manifest)]


def _remove_owned(out: pathlib.Path, manifest: dict | None) -> None:
    """Removes what prepare wrote in ``out`` (the manifest's files, else prepare's own file
    names) and its ``work/``; directories left empty go too, anything else stays."""
    names = (_manifest_files(manifest) if manifest is not None
             else [str(p.relative_to(out)) for pattern in _OUTPUT_PATTERNS for p in out.glob(pattern)])
    shutil.rmtree(out / "work", ignore_errors=True)
    for name in names:
        path = (out / name).resolve()
        if path.is_relative_to(out.resolve()) and path.is_file():
            path.unlink()
    for d in sorted({(out / n).parent for n in names}, key=lambda p: -len(p.parts)):
        inside = d.resolve().is_relative_to(out.resolve())  # a manifest's "../x" names no folder of ours
        if inside and d != out and d.is_dir() and not any(d.iterdir()):
            d.rmdir()


def _user_entries(out: pathlib.Path) -> list[str]:
    """What ``out`` holds besides the lock file and leftover temporary files."""
    return sorted(p.name for p in out.iterdir()
                  if p.name != LOCK_NAME and not is_temporary(p.name))


def _what_differs(old: dict | None, new: dict, old_hash, chash: str) -> str:
    """``key: old -> new`` of the settings that differ between two recorded configurations
    (nested ones as ``sampling.pairs_per_family``; the first six), or the two config hashes
    where the old configuration is not recorded."""
    if isinstance(old, dict):
        shown = lambda x: "(not set)" if x is None else repr(x) if len(repr(x)) <= 60 else "(a long value)"  # noqa: E731
        changed = [line for key, a, b in jsonio.changes(old, json.loads(json.dumps(new)))
                   for line in (_input_changes(a, b) if key == "inputs" else  # ``new`` as recorded:
                                [f"{key}: {shown(a)} -> {shown(b)}"])]  # tuples are lists there
        if changed:
            return "; ".join(changed[:6])
    return f"config hash {old_hash}, this run {chash}"


def _input_changes(old, new) -> list[str]:
    """Which input files changed, by name, between two recorded ``[name, digest]`` lists."""
    try:
        a, b = dict(map(tuple, old or [])), dict(map(tuple, new or []))
    except (TypeError, ValueError):  # not the recorded form: say only that they differ
        return ["inputs: other files or contents"]
    return ([f"input {n}: its contents changed" for n in sorted(a.keys() & b.keys()) if a[n] != b[n]]
            + [f"input {n}: new" for n in sorted(b.keys() - a.keys())]
            + [f"input {n}: no longer given" for n in sorted(a.keys() - b.keys())])


BATCH_SIZE_KEY = "embedder.toks_per_batch"


def _with_recorded_batch_size(out: pathlib.Path, output_config: dict) -> dict:
    """``output_config`` with the ESM-2 batch size that the dataset or unfinished run in
    ``out`` records, where that is all that differs: ``--toks-per-batch`` is lowered after
    running out of memory, and the run must resume with its work kept (the batch size moves
    an embedding only by rounding, as ``--device`` and ``--threads`` do, which the config
    leaves out). The config keeps the key so that the hashes of existing datasets stand."""
    for path in (out / "manifest.json", out / "work" / "config.json",
                 out / REPLACEMENT / "work" / "config.json"):  # (an --overwrite's rebuild)
        try:
            recorded = json.loads(path.read_text()).get("config")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            continue  # missing or not ours: _check_out_dir says which
        if not isinstance(recorded, dict):
            continue
        differs = jsonio.changes(recorded, json.loads(json.dumps(output_config)))
        if differs and [key for key, _, _ in differs] == [BATCH_SIZE_KEY]:
            old = differs[0][1]
            return {**output_config, "embedder": {**output_config["embedder"], "toks_per_batch": old}}
    return output_config


def _check_out_dir(out: pathlib.Path, chash: str, overwrite: bool,
                   config: dict | None = None) -> tuple[dict | None, dict | None]:
    """``(done, replaced)``: ``done`` the manifest if ``out`` already holds this exact dataset;
    ``replaced`` the manifest of a finished dataset of other options that ``overwrite`` will
    replace (built beside it first: ``_swap_in``). Raises when ``out`` holds something else;
    ``overwrite`` removes an unfinished run at once (prepare's own files only)."""
    manifest_path = out / "manifest.json"
    work_config = out / "work" / "config.json"
    not_ours = lambda what: PrepareError(  # noqa: E731
        f"{out} is not empty and is not a pfamalign dataset ({what}); choose an empty or new --out "
        "directory. --overwrite replaces only a pfamalign dataset.")
    if manifest_path.exists():
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise PrepareError(f"{manifest_path} is damaged ({err}); remove {out} or choose "
                               "another --out") from None
        if not (isinstance(manifest, dict) and "format_version" in manifest and "config_hash" in manifest):
            raise not_ours("its manifest.json is not a pfamalign manifest: no format_version / config_hash")
        if manifest.get("config_hash") == chash:
            return manifest, None
        if not overwrite:
            raise PrepareError(
                f"{out} already holds a dataset built with a different configuration ("
                f"{_what_differs(manifest.get('config'), config or {}, manifest.get('config_hash'), chash)}). "
                "Use another --out, or pass --overwrite to replace it.")
        return None, manifest
    elif work_config.exists():
        try:  # prepare writes it whole (atomically): one of another shape is not prepare's
            recorded = json.loads(work_config.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            recorded = None
        if not (isinstance(recorded, dict) and isinstance(recorded.get("config_hash"), str)):
            raise not_ours("work/config.json is not a pfamalign run's: no config_hash")
        old, old_config = recorded["config_hash"], recorded.get("config")
        failed = (out / "work" / FAILED).exists()
        if old != chash:
            if not (overwrite or failed):
                raise PrepareError(
                    f"{out} holds an unfinished run with a different configuration "
                    f"({_what_differs(old_config, config or {}, old, chash)}); it cannot be resumed with "
                    "these options. Re-run with the original options to finish it, use another --out, "
                    "or pass --overwrite to start over.")
            _remove_owned(out, None)  # a run that stopped on an error is not worth resuming
    elif out.exists() and set(_user_entries(out)) <= {"work", REPLACEMENT} and \
            all(_holds_only_temporaries(out / name) for name in ("work", REPLACEMENT)):
        for name in ("work", REPLACEMENT):  # killed before its config was saved
            shutil.rmtree(out / name, ignore_errors=True)
    elif out.exists() and _user_entries(out):
        raise not_ours(f"no manifest.json; it holds {', '.join(_user_entries(out)[:5])}")
    return None, None


def _holds_only_temporaries(directory: pathlib.Path) -> bool:
    """Whether ``directory`` (absent counts) holds no file but temporary ones: what a run killed
    between making its work directory and saving its config there leaves, and nothing of a
    user's."""
    return not directory.exists() or (directory.is_dir() and all(
        is_temporary(p.name) for p in directory.rglob("*") if not p.is_dir()))


# In --out: the new dataset of an --overwrite, built beside the finished one it replaces.
REPLACEMENT = "replacement"


def _swap_in(out: pathlib.Path, staged: pathlib.Path, replaced: dict | None) -> None:
    """Replaces the dataset in ``out`` by the finished one in ``staged``: the old manifest goes
    first (``out`` is no longer a finished dataset), then the old files the new one does not
    name, then the new files, the new manifest last. Safe to run again after a kill at any
    point (``_run_prepare`` finishes a swap it finds begun): only files still in ``staged``
    move, and no file the new manifest names is removed."""
    new = json.loads((staged / "manifest.json").read_text())
    keep = set(_manifest_files(new))
    (out / "manifest.json").unlink(missing_ok=True)
    old = set(_manifest_files(replaced)) if replaced is not None else set()
    old |= {str(p.relative_to(out)) for pattern in _OUTPUT_PATTERNS for p in out.glob(pattern)}
    for name in sorted(old - keep):
        path = (out / name).resolve()
        if path.is_relative_to(out.resolve()) and path.is_file():
            path.unlink()
    shutil.rmtree(out / "work", ignore_errors=True)
    if (staged / "work").is_dir():  # --keep-work
        os.replace(staged / "work", out / "work")
    for name in sorted(keep - {"manifest.json"}):
        if (staged / name).is_file():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged / name, out / name)
    os.replace(staged / "manifest.json", out / "manifest.json")
    shutil.rmtree(staged, ignore_errors=True)
    for d in sorted({(out / n).parent for n in old - keep}, key=lambda p: -len(p.parts)):
        if d != out and d.is_dir() and not any(d.iterdir()):
            d.rmdir()


# ------------------------------------------------------------------------------------------
# Stage drivers
# ------------------------------------------------------------------------------------------

def _chunk_units(files: list[pathlib.Path], cfg: PrepareConfig, work: stages.WorkDir,
                 opts: stages.IngestOptions, chunk_paths: list[pathlib.Path],
                 on_bytes: Callable[[int], None]) -> Iterator[Unit]:
    """Streams the inputs and yields one unit per chunk whose file does not exist yet."""
    seen: dict[str, str] = {}
    offset = 0
    for file_index, path in enumerate(files):
        buf: list[tuple[RawFamily, str | None]] = []
        current = None
        base = offset

        def flush(chunk_index: int, items: list, file_index: int = file_index) -> Unit | None:
            target = work.chunks / stages.chunk_name(file_index, chunk_index)
            chunk_paths.append(target)
            if target.exists():
                return None
            return (stages.process_chunk, (items, target, opts), {}, 1.0)

        for raw in iter_raw_families(path, input_index=file_index, skip_bad=cfg.skip_bad,
                                     on_bytes=lambda pos, base=base: on_bytes(base + pos)):
            chunk = raw.index // cfg.families_per_chunk
            if current is not None and chunk != current:
                unit = flush(current, buf)
                if unit is not None:
                    yield unit
                buf = []
            current = chunk
            dup = None
            if raw.error is None and cfg.skip_bad:  # every family, as the Beam engine does: a
                raw = check_parses(raw)  # malformed one claims no key and is reported as malformed
            if raw.error is None:
                if raw.key in seen:
                    dup = seen[raw.key]
                else:
                    seen[raw.key] = f"{raw.source}:{raw.start_line}"
            buf.append((raw, dup))
        if buf:
            unit = flush(current, buf)
            if unit is not None:
                yield unit
        offset += path.stat().st_size


def _ingest_summary(chunk_paths: list[pathlib.Path]) -> dict:
    totals = collections.Counter()
    for p in chunk_paths:
        h = stages.read_chunk_header(p)
        for k, v in h.items():
            if k != "kind":
                totals[k] += v
    return {"chunks": [p.name for p in chunk_paths], "n_families": totals["n_families"],
            "n_seq_records": totals["n_seq_records"], "n_pairs": totals["n_pairs"],
            "pairs": {s: totals[f"pairs_{s}"] for s in SPLITS}}


def _size_and_sha256(path: pathlib.Path) -> dict:
    """A manifest row's record of a file, checked by ``reader.dataset_problems``."""
    return {"bytes": path.stat().st_size, "sha256": rec.file_sha256(path)}


def _manifest(cfg: PrepareConfig, out: pathlib.Path, output_config: dict, chash: str,
              embedder: Embedder, plan: dict, fin: dict, summary: dict,
              input_names: list[list[str]]) -> dict:
    import pandas as pd

    shard_rows = []
    for split in SPLITS:
        for path, n in fin["shard_files"][split]:
            shard_rows.append({"kind": "pairs", "split": split, "path": str(path.relative_to(out)),
                               "records": n})
    for p, path in enumerate(fin["emb_files"]):
        shard_rows.append({"kind": "embeddings", "split": "", "path": str(path.relative_to(out)),
                           "records": plan["counts"][p]})
    for row in shard_rows:
        row.update(_size_and_sha256(out / row["path"]))
    pd.DataFrame(shard_rows, columns=["kind", "split", "path", "records", "bytes", "sha256"]
                 ).to_csv(out / "shards.tsv", sep="\t", index=False)
    fam_cols = ["key", "accession_base", "name", "split", "n_seqs", "n_usable", "n_pairs", "skip",
                "error", "source", "start_line", "seq_skips", "pairs_no_aligned"]
    pd.DataFrame(fin["families"], columns=fam_cols).to_csv(out / "families.tsv", sep="\t",
                                                            index=False)
    # the tables and lengths are checked like the shards: a changed family split or length
    # list would silently change what is trained on and evaluated
    tables = ["shards.tsv", "families.tsv", "embeddings/index.tsv",
              *(f"{split}/lengths.npy" for split in SPLITS)]
    table_rows = [{"path": name, **_size_and_sha256(out / name)} for name in tables]
    splits = {}
    for split in SPLITS:
        splits[split] = {
            "families": summary["splits"][split]["families"],
            "pairs": summary["splits"][split]["pairs"],
            "residues": summary["splits"][split]["residues"],
            "shards": [str(p.relative_to(out)) for p, _ in fin["shard_files"][split]],
            "lengths": f"{split}/lengths.npy",
        }
    return {
        "format_version": FORMAT_VERSION,
        "config_hash": chash,
        "config": output_config,
        "inputs": input_names,
        "embedder": {"id": embedder.embedder_id, "dim": embedder.dim, "dtype": cfg.dtype,
                     "fingerprint": embedder.fingerprint()},
        "splits": splits,
        "embeddings": {"count": fin["n_embeddings"], "residues": plan["n_residues"],
                       "shards": [str(p.relative_to(out)) for p in fin["emb_files"]],
                       "index": "embeddings/index.tsv"},
        "shards": shard_rows,
        "tables": table_rows,
        "families_table": "families.tsv",
        # run-independent (a resumed run writes the same manifest as an uninterrupted one)
        "summary": {**{k: v for k, v in summary.items() if k != "out"},
                    "embeddings": {k: v for k, v in summary["embeddings"].items()
                                   if k not in ("computed_this_run", "reused", "from_cache")}},
    }


def build_summary(out: pathlib.Path, families: list[dict], plan: dict, fin_residues: dict,
                  embedder: Embedder, dtype: str, computed: int, notes: list[str], *,
                  from_cache: int = 0) -> dict:
    fam_skips = collections.Counter(f["skip"] for f in families if f["skip"])
    seq_skips = collections.Counter()
    for f in families:
        seq_skips.update(json.loads(f["seq_skips"]))
    pairs_split = collections.Counter()
    fams_split = collections.Counter()
    for f in families:
        if f["n_pairs"]:
            pairs_split[f["split"]] += f["n_pairs"]
            fams_split[f["split"]] += 1
    errors = [f["error"] for f in families if f["error"]]
    return {
        "out": str(out),
        "families": {"read": len(families), "used": sum(fams_split.values())},
        "sequences": {"total": sum(f["n_seqs"] for f in families),
                      "usable": sum(f["n_usable"] for f in families),
                      "used_unique": plan["n_unique"]},
        "pairs": {"total": sum(pairs_split.values()), **{s: pairs_split[s] for s in SPLITS}},
        "residues": {"embedded": plan["n_residues"], "in_pairs": sum(fin_residues.values())},
        "splits": {s: {"families": fams_split[s], "pairs": pairs_split[s],
                       "residues": fin_residues.get(s, 0)} for s in SPLITS},
        "embeddings": {"embedder": embedder.embedder_id, "dim": embedder.dim, "dtype": dtype,
                       "count": plan["n_unique"], "computed_this_run": computed,
                       "from_cache": from_cache,
                       "reused": plan["n_unique"] - computed - from_cache},
        "skipped": {"families": dict(sorted(fam_skips.items())),
                    "sequences": dict(sorted(seq_skips.items())),
                    "pair candidates": ({"fewer than min_aligned aligned residues":
                                         sum(f["pairs_no_aligned"] for f in families)}
                                        if any(f["pairs_no_aligned"] for f in families) else {})},
        "errors": errors,
        "notes": notes,
    }


def empty_split_warnings(summary: dict, cfg: PrepareConfig) -> list[str]:
    """A warning per split that was asked for (by --fold, or a fraction > 0 in --splits) but
    holds no pair: families are assigned whole, so few families can leave a split empty
    (training would then have no validation, evaluation no test)."""
    used = summary["families"]["used"]
    if not used:
        return []  # no pairs at all: the notes say so
    if cfg.fold is None:
        rule = f"--splits {','.join(f'{f:g}' for f in cfg.split_fractions)}"
        fix, asked = "raise its fraction in --splits", [f > 0 for f in cfg.split_fractions]
    else:
        rule, fix, asked = f"--fold {cfg.fold[0]}/{cfg.fold[1]}", "add families", [True] * 3
    return [f"the {split} split is empty: none of the {used} families with pairs was assigned "
            f"to it ({rule}, --seed {cfg.seed}). Splits take whole families; {fix} or try "
            "another --seed."
            for split, wanted in zip(SPLITS, asked)
            if wanted and summary["splits"][split]["pairs"] == 0]


def run_prepare(cfg: PrepareConfig, *, quiet: bool = False,
                embedder: Embedder | None = None) -> PrepareResult:
    """Builds (or resumes, or recognizes as complete) the dataset described by ``cfg``.

    Holds the lock of ``cfg.out`` (``locks.directory_lock``): a second run on the same
    directory stops with a message naming the first. A run that stops on an error (not a kill)
    marks its work directory failed, so that a re-run with other options (e.g. ``--skip-bad``,
    as the error suggests) starts over instead of refusing the unfinished run."""
    out = pathlib.Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise PrepareError(f"--out {out} is a file; give a directory")
    if cfg.engine == "beam":  # before --out is made: a missing Beam is a setup error
        from pfamalign.pipelines.beam import require_beam

        try:
            require_beam()
        except ImportError as err:
            raise PrepareError(str(err)) from None
    try:
        with directory_lock(out, "prepare"):
            try:
                return _run_prepare(cfg, quiet=quiet, embedder=embedder)
            except Exception as err:
                for work in (out / "work", out / REPLACEMENT / "work"):
                    if (work / "config.json").exists():
                        rec.write_json(work / FAILED, {"error": str(err)})
                raise
    except LockError as err:
        raise PrepareError(str(err)) from None


def _run_prepare(cfg: PrepareConfig, *, quiet: bool, embedder: Embedder | None) -> PrepareResult:
    out = pathlib.Path(cfg.out)
    files, notes = expand_inputs(cfg.inputs)
    if not files:
        raise PrepareError(f"no Stockholm files found in {', '.join(map(str, cfg.inputs))}")
    threads = cfg.threads
    if threads is None and cfg.workers > 1:
        threads = max(1, (os.cpu_count() or 1) // cfg.workers)
    spec = None
    if embedder is None:
        embedder = get_embedder(cfg.embedder, cfg.weights, long_policy=cfg.long_policy,
                                toks_per_batch=cfg.toks_per_batch, device=cfg.device,
                                threads=cfg.threads)
    else:
        cfg = dataclasses.replace(cfg, embedder=embedder.embedder_id)
    if cfg.workers > 1 or cfg.engine == "beam":
        weights = getattr(embedder, "weights", None)
        spec = stages.EmbedderSpec(embedder.embedder_id, str(weights) if weights else None,
                                   cfg.long_policy,
                                   cfg.toks_per_batch, threads, cfg.device)
    input_names = _input_digests(files)
    output_config = cfg.output_config(input_digests=input_names,
                                      embedder_id=embedder.embedder_id,
                                      embedder_fingerprint=embedder.fingerprint(),
                                      dim=embedder.dim)
    output_config = _with_recorded_batch_size(out, output_config)
    chash = config_hash(output_config)
    staged = out / REPLACEMENT
    if (staged / "manifest.json").exists():  # killed while swapping a replacement in: finish
        _swap_in(out, staged, None)
    cache = None
    if cfg.reuse_embeddings:  # before _check_out_dir: a bad source must not cost --out its dataset
        cache = stages.EmbeddingCache(cfg.reuse_embeddings)
        try:
            cache.validate(embedder_id=embedder.embedder_id,
                           fingerprint=embedder.fingerprint(), dtype=cfg.dtype)
        except ValueError as err:
            raise PrepareError(str(err)) from err
    done, replaced = _check_out_dir(out, chash, cfg.overwrite, output_config)
    if replaced is not None:  # --overwrite of a finished dataset: the old one stays until the
        final, out = out, staged  # new one is finished (a failed run must not cost it)
        done = _check_out_dir(out, chash, True)[0]
    elif staged.exists():  # an unfinished replacement the user gave up on
        shutil.rmtree(staged)
    stages.clean_tmp(out)  # a kill between a temporary file and its rename (manifest.json)
    if done is not None:
        if not cfg.keep_work and (out / "work").exists():  # killed after the manifest
            shutil.rmtree(out / "work", ignore_errors=True)
        summary = dict(done["summary"], out=str(out))
        summary["embeddings"] = dict(summary["embeddings"], computed_this_run=0, from_cache=0,
                                     reused=summary["embeddings"]["count"])
        return PrepareResult(out, done, summary, already_complete=True)

    work = stages.WorkDir(out / "work")
    work.root.mkdir(parents=True, exist_ok=True)
    (work.root / FAILED).unlink(missing_ok=True)  # resuming with the same options
    if not work.config.exists():
        rec.write_json(work.config, {"config_hash": chash, "config": output_config})
    work.make()
    for d in (work.root, work.chunks, work.plan, work.emb):
        stages.clean_tmp(d)
    opts = stages.IngestOptions(cfg.sampling, cfg.seed, cfg.split_fractions, cfg.fold, cfg.skip_bad,
                                embedder.max_residues)
    computed = from_cache = 0
    with bars(progress_enabled(quiet)) as ui:
        # -- stage 1: ingest ------------------------------------------------------------
        if work.ingest.exists():
            ingest = json.loads(work.ingest.read_text())
            chunk_paths = [work.chunks / n for n in ingest["chunks"]]
        else:
            chunk_paths: list[pathlib.Path] = []
            if cfg.engine == "beam":
                from pfamalign.pipelines import beam as beam_engine

                chunk_paths = beam_engine.run_ingest(files, cfg, work, opts)
            else:
                total = sum(f.stat().st_size for f in files)
                set_bytes = ui.setter("reading families (bytes)", total)
                units = _chunk_units(files, cfg, work, opts, chunk_paths, set_bytes)
                run_units(units, cfg.workers, lambda r, w: None)
                set_bytes(total)
            ingest = _ingest_summary(chunk_paths)
            rec.write_json(work.ingest, ingest)
        # -- stage 2: plan ----------------------------------------------------------------
        if work.plan_json.exists():
            plan = json.loads(work.plan_json.read_text())
        else:
            plan = stages.plan_parts(work, chunk_paths,
                                     n_parts_for(ingest["n_seq_records"], cfg.seqs_per_part))
        # -- stage 3: embed ---------------------------------------------------------------
        todo = [p for p in range(plan["n_parts"]) if not work.emb_file(p).exists()]
        advance = ui.task(f"embedding ({embedder.embedder_id}, residues)", plan["n_residues"])
        advance(sum(plan["residues"][p] for p in range(plan["n_parts"]) if p not in todo))
        computed = sum(plan["counts"][p] for p in todo)
        if cfg.engine == "beam" and todo:
            from pfamalign.pipelines import beam as beam_engine

            from_cache = beam_engine.run_embed(todo, cfg, work, spec, cache)
            advance(sum(plan["residues"][p] for p in todo))
        else:
            def done(result: dict, weight: float) -> None:
                nonlocal from_cache
                from_cache += result["from_cache"]
                advance(weight)

            units = ((stages.embed_part, (work.plan_file(p), work.emb_file(p),
                                          spec if cfg.workers > 1 else embedder),
                      {"dtype": cfg.dtype, "cache": cache}, plan["residues"][p]) for p in todo)
            run_units(units, cfg.workers, done)
        computed -= from_cache
        # -- stage 4: finalize ------------------------------------------------------------
        advance_pairs = ui.task("writing shards (pairs)", ingest["n_pairs"])
        fin = stages.finalize(work, out, chunk_paths, plan, pair_counts=ingest["pairs"],
                              records_per_shard=cfg.records_per_shard, progress=advance_pairs)
    summary = build_summary(out, fin["families"], plan, fin["pair_residues"], embedder,
                            cfg.dtype, computed, notes, from_cache=from_cache)
    if summary["pairs"]["total"] == 0:
        summary["notes"].append("no pairs were produced: check the skipped table")
    summary["warnings"] = empty_split_warnings(summary, cfg)
    manifest = _manifest(cfg, out, output_config, chash, embedder, plan, fin, summary,
                         input_names)
    rec.write_json(out / "manifest.json", manifest)
    if not cfg.keep_work:
        shutil.rmtree(work.root, ignore_errors=True)
    if replaced is not None:
        if summary["pairs"]["total"] == 0:
            shutil.rmtree(out)
            raise PrepareError(f"no pairs were produced from these inputs (check the skipped table "
                               f"of a run into a new --out); {final} keeps its dataset")
        _swap_in(final, out, replaced)
        out = final
        summary["out"] = str(out)
    return PrepareResult(out, manifest, summary,
                         replaced=None if replaced is None else str(replaced.get("config_hash")))
