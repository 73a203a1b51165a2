"""What the commands share: error exit, the options naming a pair and the decoder options,
and turning them into library inputs."""

from __future__ import annotations

import contextlib
import math
import os
import pathlib
import re
import sys

import click


def fail(message: str, code: int = 2):
    """Prints ``Error: message`` to stderr and exits (no traceback: the message says what to fix)."""
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


def check_outputs(*outputs, inputs=()) -> None:
    """Checks every output file the user named before any work starts (``outputs``: not an
    input, not each other, in an existing directory); exits with the message otherwise."""
    from pfamalign.outputs import OutputError, check_output_path, same_file

    named = [o for o in outputs if o is not None and str(o) != "-"]
    for i, path in enumerate(named):
        if twin := next((o for o in named[:i] if same_file(o, path)), None):
            fail(f"two outputs name one file ({twin} and {path}); give each its own name")
    try:
        for path in named:
            check_output_path(path, inputs)
    except OutputError as err:
        fail(str(err))


class Number(click.FloatRange):
    """A float option in a range that is also a real number: click's ``FloatRange`` lets
    ``nan`` through (every comparison with it is false) and ``inf`` past an open top.
    ``finite=False`` keeps ``inf`` where it means "no limit"."""

    def __init__(self, min=None, max=None, *, min_open=False, finite=True):
        super().__init__(min=min, max=max, min_open=min_open)
        self.finite = finite

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if math.isnan(number) or (self.finite and math.isinf(number)):
            self.fail(f"{value!r} is not a {'finite ' if self.finite else ''}number.", param, ctx)
        return number


class OutputFile(click.Path):
    """An output file's path. A name ending in ``/`` names a directory and is refused here:
    ``pathlib`` would drop the slash and the output would become a file of that name."""

    name = "file"

    def __init__(self):
        super().__init__(dir_okay=False, path_type=pathlib.Path)

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.endswith(("/", os.sep)):
            self.fail(f"{value!r} names a directory; give a file name", param, ctx)
        return super().convert(value, param, ctx)


class ModelDirectory(click.Path):
    """A model directory, or the name of a model shipped with pfamalign
    (``inference.SHIPPED_MODELS``) where no such path exists."""

    name = "model"

    def __init__(self):
        super().__init__(exists=True, file_okay=False, path_type=pathlib.Path)

    def convert(self, value, param, ctx):
        from pfamalign.inference import model_directory

        return super().convert(model_directory(value), param, ctx)


def checkpoint_option(help: str = "Model directory", *, ensembles: bool = True):
    """``--checkpoint``: a model (or, where the command takes one, ensemble) directory, or a
    shipped model's name."""
    shipped = ("or `ensemble`: the shipped ensemble (more accurate, about 3x slower; "
               "pfamalign/assets/ensemble_model/TRAINING.md in the package)" if ensembles else
               "not an ensemble: name one of its members, e.g. `ensemble/align_ce` (a member of the shipped "
               "ensemble)")
    return click.option("--checkpoint", type=ModelDirectory(), metavar="DIR|NAME",
                        help=f"{help}, {shipped}. Default: the model shipped with pfamalign.")


def sequence_paths(*args: str | None) -> list[pathlib.Path]:
    """The FASTA files among sequence arguments (``inputs.argument_path``): inputs that no
    output may overwrite."""
    from pfamalign.inputs import argument_path

    return [p for p in (argument_path(a) for a in args if a) if p is not None]


def pair_input_options(*, ensembles: bool = True):
    """Click options naming one sequence pair: SEQ_A SEQ_B, a Stockholm file with two row
    ids, or a dataset pair; plus the model to use (``ensembles``: as ``checkpoint_option``)."""
    return lambda f: _with_options(f, [
        click.argument("seq_a", required=False),
        click.argument("seq_b", required=False),
        click.option("--stockholm", type=click.Path(exists=True, dir_okay=False, path_type=pathlib.Path),
                     help="Reference alignment holding both sequences (with --ids): gives the target columns."),
        click.option("--ids", nargs=2, metavar="ID_A ID_B", help="Row names of the pair in --stockholm."),
        click.option("--data", type=DatasetDirectory(),
                     help="Dataset directory: take pair --index of --split."),
        click.option("--split", default="test", show_default=True, type=click.Choice(["train", "val", "test"])),
        click.option("--index", type=int, default=0, show_default=True, help="Pair index within the split."),
        checkpoint_option(ensembles=ensembles),
        click.option("--weights", type=click.Path(exists=True, path_type=pathlib.Path), help="ESM-2 weights."),
    ])


def _with_options(f, options: list):
    for option in reversed(options):
        f = option(f)
    return f


def resolve_pair(seq_a, seq_b, stockholm, ids, data, split, index) -> dict:
    """The pair record (``pfamalign.inputs``) chosen by ``pair_input_options``; ``target`` is
    None for bare sequences. Bad input exits with its message."""
    from pfamalign import inputs

    given = [name for name, value in (("SEQ_A SEQ_B", seq_a or seq_b), ("--stockholm", stockholm),
                                      ("--data", data)) if value]
    if len(given) > 1:  # one would be used and the others silently dropped
        raise click.UsageError(f"the pair is named twice ({' and '.join(given)}); give one of SEQ_A "
                               "SEQ_B, --stockholm FILE with --ids ID_A ID_B, or --data DIR")
    if ids and stockholm is None:
        raise click.UsageError("--ids names rows of --stockholm FILE; add --stockholm")
    if seq_a == seq_b == inputs.STDIN:  # one stream read once: the second side would find it empty
        raise click.UsageError("standard input (-) can be SEQ_A or SEQ_B, not both")
    ctx = click.get_current_context(silent=True)
    typed = [f"--{name}" for name in ("split", "index") if ctx is not None
             and ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
    if typed and data is None:  # it would be ignored
        raise click.UsageError(f"{' and '.join(typed)} choose{'s' if len(typed) == 1 else ''} a pair of "
                               "--data DIR; add --data")
    try:
        if stockholm is not None:
            if not ids:
                raise click.UsageError("--stockholm needs --ids ID_A ID_B")
            return inputs.pair_from_stockholm(stockholm, *ids)
        if data is not None:
            return inputs.pair_from_dataset(data, split, index)
        if seq_a is not None and seq_b is not None:  # an empty one is refused by name there
            return inputs.pair_from_sequences(seq_a, seq_b, many=(
                "this command takes one pair: a file of one record for each of SEQ_A and SEQ_B, "
                "or --stockholm FILE --ids ID_A ID_B"))
    except (ValueError, IndexError) as err:
        fail(str(err))
    raise click.UsageError("give SEQ_A SEQ_B, or --stockholm FILE --ids ID_A ID_B, or --data DIR")


DECODER_FIELDS = ("decoder", "mode", "gap_open", "gap_extend", "threshold", "gap_cost", "min_mass",
                  "plan_weight", "alpha", "objective", "plan_power")


def decoder_options(f):
    """Click options overriding the model's decoding settings (``decoding.json`` in the model
    directory, else the built-in defaults)."""
    options = [
        click.option("--decoder", type=click.Choice(["affine", "mea", "hybrid", "posterior"]), default=None,
                     help="Plan decoder: affine-gap DP on the plan, maximum expected accuracy, "
                          "affine-gap DP on BLOSUM62 + plan weight x plan, or maximum expected "
                          "accuracy on alpha x plan + (1 - alpha) x the pair-HMM's match "
                          "posteriors. Default: the model's decoding.json."),
        click.option("--mode", type=click.Choice(["global", "local"]), default=None,
                     help="global: align the sequences end to end (end gaps charged). local: find "
                          "the homologous segment inside longer sequences (Smith-Waterman ends: the "
                          "best-scoring stretch, flanks left unaligned for free; mea: only gaps "
                          "inside the segment cost). Default: the model's decoding.json (the "
                          "shipped model: global)."),
        click.option("--gap-open", type=float, default=None,
                     help="affine / hybrid: cost of opening a gap (plan-mass / BLOSUM62 units)."),
        click.option("--gap-extend", type=float, default=None, help="affine / hybrid: cost of each further gap residue."),
        click.option("--plan-weight", type=float, default=None,
                     help="hybrid: BLOSUM62 units per unit of plan mass."),
        click.option("--threshold", type=float, default=None, help="affine: mass subtracted from every aligned pair."),
        click.option("--gap-cost", type=float, default=None, help="mea / posterior: cost per unaligned residue."),
        click.option("--alpha", type=float, default=None,
                     help="posterior: the plan's share of the mixed posterior (0 = pair-HMM only, "
                          "1 = plan only)."),
        click.option("--plan-power", type=float, default=None,
                     help="posterior: > 0 puts the plan through the plan pair-HMM (the pair-HMM's gap "
                          "model with the plan's odds to this power as match scores, no substitution "
                          "matrix) before mixing; 0 mixes the plan as it is."),
        click.option("--min-mass", type=float, default=None, help="Never align a pair with less plan mass."),
        click.option("--objective", type=click.Choice(["accuracy", "f1"]), default=None,
                     help="mea / posterior: maximize the expected number of right pairs (accuracy) "
                          "or the expected F1 of the aligned pairs (f1: leaves out pairs less likely "
                          "than half the F1 reached). Default: the model's decoding.json."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _flag(field: str) -> str:
    """The command-line option of a settings field (``gap_open`` -> ``--gap-open``)."""
    return "--" + field.replace("_", "-")


def decoder_settings(base, options: dict):
    """``base`` (a DecoderSettings) overridden by the ``decoder_options`` the user gave; pops
    them from ``options``. Bad values, and options the decoder in use does not read (they
    would change nothing), exit with their message."""
    given = {k: options.pop(k) for k in DECODER_FIELDS}
    decoder = given["decoder"] or base.decoder
    reads = base.READS[decoder]
    unread = [_flag(k) for k in base.for_decoder(decoder).unread(given)]
    if unread:
        chosen = "" if given["decoder"] else " (the model's; choose another with --decoder)"
        fail(f"{', '.join(unread)} {'does' if len(unread) == 1 else 'do'} not apply to the {decoder} "
             f"decoder{chosen}, which reads {', '.join(map(_flag, reads))}")
    try:
        settings = base.override(**given)
    except ValueError as err:  # its message names fields: say them as the options the user typed
        message = re.sub(r"\b(" + "|".join(DECODER_FIELDS) + r")\b", lambda m: _flag(m.group(1)), str(err))
        fail(f"{message} (the {decoder} decoder's values; see --help)")
    if settings.decoder == "mea" and settings.mode == "local" and settings.objective == "accuracy" \
            and settings.min_mass == 0:
        click.echo("Note: --decoder mea --mode local leaves no flank unaligned with --objective accuracy "
                   "and --min-mass 0 (every pair with plan mass adds to the objective); add "
                   "--objective f1 or --min-mass M to trim weak flanks", err=True)
    return settings


MAX_ENGINE_STEPS = 10_000  # asap.MAX_ENGINE_STEPS (not imported: it loads jax; a test checks)


def engine_options(f):
    """``--engine`` and ``--steps``: how the plans are computed (``pfamalign.asap.Engine``)."""
    f = click.option("--steps", type=click.IntRange(min=1, max=MAX_ENGINE_STEPS), default=None,
                     help="With --engine steps: the number of plain Sinkhorn steps (a 64-residue "
                          "pair aligns as fast at 1,000 steps as with the default engine; at most "
                          "200 where a balanced plan leaves float32's range and needs the "
                          "reference solve).")(f)
    return click.option("--engine", type=click.Choice(["sinkhorn", "steps", "asap"]), default="sinkhorn",
                        show_default=True,
                        help="How the plan is computed: the trained Sinkhorn steps, N plain steps "
                             "(--steps N), or the compiled operator of a model written by "
                             "`pfamalign compile` (asap).")(f)


def max_length_option(help: str = "Refuse sequences longer than this (residues)."):
    return click.option("--max-length", type=click.IntRange(min=1), default=4096, show_default=True,
                        help=help)


def max_memory_option(note: str = ""):
    """``--max-memory``; ``note``: what the command's estimate is, for its help."""
    return click.option(
        "--max-memory", default=None, metavar="SIZE",
        help=f"Memory budget: refuse a pair whose estimated memory exceeds SIZE, and plan no more pairs "
             f"at once than fit in it (e.g. 8G; 0: no limit{note}). "
             "Default: 80% of this machine's memory (or of its container's limit).")

strict_option = click.option("--strict", is_flag=True,
                             help="Stop at the first bad record (default: report it with its "
                                  "file:line, go on, exit 1 at the end).")


def batch_options(f):
    """``--strict`` and ``--quiet``, the options of every batch job (``pfamalign.batch``)."""
    return strict_option(click.option("-q", "--quiet", is_flag=True, help="No progress on standard error.")(f))


@contextlib.contextmanager
def batch_progress(description: str, total: int | None, quiet: bool, *, lines: bool = False, more=()):
    """An ``advance()`` callable driving a progress bar on standard error (none when ``quiet``
    or when standard error is not a terminal). ``lines``: where there is no bar and not
    ``quiet`` (a log, a pipe, CI), a plain progress line every few seconds instead
    (``pipelines.progress.LINE_SECONDS``). Each step first raises an interrupt that arrived
    where Python dropped it (``interrupts.check``): the job stops at its next step, not at
    its end. ``more``: ``(description, total)`` of further stages, each a bar of its own
    (total None: a count); the callables then come as a tuple, this one first."""
    from pfamalign import interrupts
    from pfamalign.pipelines.progress import Bars, progress_enabled

    with Bars(progress_enabled(quiet), lines=lines and not quiet) as bars:
        def advancing(task):
            def advance(n: float = 1) -> None:
                interrupts.check()
                task(n)
            return advance

        stages = [advancing(bars.task(d, t)) for d, t in ((description, total), *more)]
        yield tuple(stages) if more else stages[0]


def error_line(error, as_json: bool) -> str:
    """A skipped record as a line of a batch job's output: a JSON object (JSON lines) or a
    ``#`` comment (every text format here skips them)."""
    if as_json:
        from pfamalign import jsonio

        return jsonio.dumps_line({"error": str(error), "where": error.where}) + "\n"
    return f"# error: {error}\n"


class DatasetDirectory(click.Path):
    """A dataset directory of `pfamalign prepare shards`, opened when parsed (manifest and
    shards checked), so that any other folder is a usage error naming the option."""

    name = "dataset"

    def __init__(self):
        super().__init__(exists=True, file_okay=False, path_type=pathlib.Path)

    def convert(self, value, param, ctx):
        from pfamalign.pipelines.reader import PairDataset

        path = super().convert(value, param, ctx)
        try:
            PairDataset(path)
        except (FileNotFoundError, ValueError) as err:
            self.fail(str(err), param, ctx)
        return path


def check_figure(path) -> str | None:
    """The figure format of a ``--plot`` file (``plots.figure_format``; None without one);
    an extension matplotlib cannot write is refused before any work."""
    if path is None:
        return None
    if str(path) == "-":  # elsewhere "-" is standard output; a figure goes to a named file
        raise click.BadParameter("give a file name (e.g. plan.png), not - (standard output)",
                                 param_hint="--plot")
    from pfamalign.alignment.plots import figure_format

    try:
        return figure_format(path)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--plot") from None
