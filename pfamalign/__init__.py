"""pfamalign: protein pairwise alignment with a differentiable banded Sinkhorn aligner.

The Python API (``pfamalign.pairwise``): ``pfamalign.align(seq_a, seq_b)`` and
``pfamalign.PairAligner``, returning ``AlignmentRecord``s.
"""

import os
import sys

__version__ = "0.1.0"
__all__ = ["PairAligner", "align", "AlignmentRecord", "__version__"]


def __getattr__(name: str):
    # imported when first used: the command line's start stays free of jax and the model
    if name in ("PairAligner", "align", "AlignmentRecord"):
        from pfamalign import pairwise

        return getattr(pairwise, name)
    raise AttributeError(f"module 'pfamalign' has no attribute {name!r}")


class _SourceTreeFinder:
    """``pfamalign.kernels`` and ``pfamalign.pipelines`` from the folders beside this one.

    In the source tree they sit beside ``pfamalign/`` (the layout of docs/design.md §2);
    installed, they are inside it. Python started in the repository root imports this folder
    ahead of an installed copy, which would leave those two unimportable (an editable install
    maps them itself: its finder comes first)."""

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, name, path=None, target=None):
        if name not in ("pfamalign.kernels", "pfamalign.pipelines"):
            return None
        import importlib.util

        folder = os.path.join(self.root, name.rpartition(".")[2])
        return importlib.util.spec_from_file_location(
            name, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])


_here = os.path.dirname(os.path.realpath(__file__))
if not os.path.isdir(os.path.join(_here, "kernels")) and \
        os.path.isfile(os.path.join(_here, os.pardir, "kernels", "__init__.py")):
    sys.meta_path.append(_SourceTreeFinder(os.path.dirname(_here)))
