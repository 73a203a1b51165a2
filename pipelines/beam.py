"""Apache Beam engine (optional extra ``pfamalign[beam]``): the ingest and embed stages of
``stages.py`` as Beam transforms, writing the same work files as the local engine, so the
finished dataset is byte-identical whichever engine (or mix of engines, across resumes) ran.

    pfamalign prepare shards --engine beam --beam-arg=--runner=FnApiRunner ...

Ingest: one element per input file -> stream its families -> group by family key (the first
occurrence, by (input, position), wins; later ones are recorded as duplicates, exactly as the
local engine does) -> group by chunk -> write each missing chunk file. Embed: one element per
missing embedding part -> reshuffle -> embed and write. Plan and finalize are sequential I/O
and stay local. Without ``--runner`` the in-process ``FnApiRunner`` is used (Beam's default
runner tries to download a runner binary). Work files are written with POSIX renames: on a
cluster, ``--out`` must be a filesystem shared by all workers.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterator, Sequence

from pfamalign.pipelines import stages
from pfamalign.pipelines.stockholm import RawFamily, check_parses, iter_raw_families


def require_beam():
    """The ``apache_beam`` module; an ImportError saying how to install it where it is missing."""
    try:
        import apache_beam as beam  # noqa: F401
    except ImportError as err:
        raise ImportError("the Beam engine needs Apache Beam: pip install 'pfamalign[beam]' "
                           "(or use --engine local)") from err
    return beam


def pipeline_options(beam_args: Sequence[str]):
    from apache_beam.options.pipeline_options import PipelineOptions

    args = list(beam_args)
    if not any(a.startswith("--runner") for a in args):
        args.append("--runner=FnApiRunner")
    return PipelineOptions(args)


def _read_file(element: tuple[int, str], skip_bad: bool) -> Iterator[tuple[str, RawFamily]]:
    input_index, path = element
    for raw in iter_raw_families(path, input_index=input_index, skip_bad=skip_bad):
        if skip_bad:
            raw = check_parses(raw)  # a family that fails to parse claims no key
        key = raw.key if raw.error is None else f"\0bad:{raw.input_index}:{raw.index}"
        yield key, raw


def _mark_duplicates(element, families_per_chunk: int):
    _, raws = element
    raws = sorted(raws, key=lambda r: (r.input_index, r.index))
    first = raws[0]
    for i, raw in enumerate(raws):
        dup = None if i == 0 else f"{first.source}:{first.start_line}"
        yield (raw.input_index, raw.index // families_per_chunk), (raw, dup)


def _write_chunk(element, chunks_dir: str, opts: stages.IngestOptions) -> str:
    (input_index, chunk_index), items = element
    items = sorted(items, key=lambda item: item[0].index)
    path = pathlib.Path(chunks_dir) / stages.chunk_name(input_index, chunk_index)
    if not path.exists():
        stages.process_chunk(items, path, opts)
    return path.name


def _unwrap_input_errors(err: Exception) -> Exception:
    """Beam wraps worker exceptions in RuntimeError; give malformed input its own message."""
    from pfamalign.pipelines.prepare import PrepareError

    m = re.search(r"StockholmError: (.*?)(?: \[while running [^\]]*\])?$", str(err), re.S)
    if m:
        return PrepareError(f"{m.group(1)}\nFix the file, or pass --skip-bad to report bad "
                            "families and continue.")
    return err


def run_ingest(files: Sequence[pathlib.Path], cfg, work: stages.WorkDir,
               opts: stages.IngestOptions) -> list[pathlib.Path]:
    """Stage 1 on Beam; returns the chunk files in stream order."""
    try:
        _run_ingest(files, cfg, work, opts)
    except Exception as err:
        unwrapped = _unwrap_input_errors(err)
        if unwrapped is err:
            raise
        raise unwrapped from err
    return stages.in_stream_order(work.chunks.glob("chunk-*.rec"))


def _run_ingest(files, cfg, work, opts) -> None:
    beam = require_beam()
    with beam.Pipeline(options=pipeline_options(cfg.beam_args)) as p:
        _ = (p
             | "inputs" >> beam.Create([(i, str(f)) for i, f in enumerate(files)])
             | "read families" >> beam.FlatMap(_read_file, cfg.skip_bad)
             | "by family key" >> beam.GroupByKey()
             | "duplicates" >> beam.FlatMap(_mark_duplicates, cfg.families_per_chunk)
             | "by chunk" >> beam.GroupByKey()
             | "write chunks" >> beam.Map(_write_chunk, str(work.chunks), opts))


def _embed_one(part: int, work_root: str, spec: stages.EmbedderSpec, dtype: str,
               cache: stages.EmbeddingCache | None) -> int:
    work = stages.WorkDir(pathlib.Path(work_root))
    if not work.emb_file(part).exists():
        stages.embed_part(work.plan_file(part), work.emb_file(part), spec, dtype=dtype,
                          cache=cache)
    return part


def run_embed(parts: Sequence[int], cfg, work: stages.WorkDir, spec: stages.EmbedderSpec,
              cache: stages.EmbeddingCache | None = None) -> int:
    """Stage 3 on Beam: embeds the given parts. (Cache hits are not counted: returns 0.)"""
    beam = require_beam()
    with beam.Pipeline(options=pipeline_options(cfg.beam_args)) as p:
        _ = (p
             | "parts" >> beam.Create(list(parts))
             | "spread" >> beam.Reshuffle()
             | "embed" >> beam.Map(_embed_one, str(work.root), spec, cfg.dtype, cache))
    return 0
