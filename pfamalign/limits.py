"""Input limits shared by the application and ``pipelines/`` (a leaf module: it imports
nothing, so the pipelines may take it without importing the application, docs/design.md §2)."""

MAX_LINE = 1 << 20  # characters per line: longer is not a sequence or alignment file (and must not fill memory)
