"""Exceptions raised by Strata. The native module raises these classes too."""


class StrataError(Exception):
    """Base class of every error Strata raises on purpose."""

    exit_code = 1


class ConfigError(StrataError, ValueError):
    """An option value is missing, malformed, out of range or contradicts another."""

    exit_code = 2


class InputError(StrataError, ValueError):
    """An input file is malformed; the message names the file (and line)."""

    exit_code = 2


class InputNotFoundError(InputError, FileNotFoundError):
    """An input path does not exist."""


class ProgramError(InputError):
    """A vertex program (``strata.grid.VertexProgram``) cannot run: its file does not define
    one, its Python code raised, or a value it computed does not fit its array; the message
    names the program and the step (and the vertex)."""


class StoreFormatError(StrataError):
    """A store is not valid: wrong format version, missing or truncated arrays."""

    exit_code = 2


class StoreExistsError(StrataError, FileExistsError):
    """The output store already exists and overwriting was not asked for."""

    exit_code = 2


class BudgetError(StrataError):
    """The memory budget cannot hold the minimum a step needs, or the disk has less free space
    than a job would write (refused before it starts)."""

    exit_code = 2


class RunError(StrataError):
    """A run directory is not valid, or does not match the store it was trained on."""

    exit_code = 2


class DivergedError(StrataError):
    """Training diverged: an epoch's loss is NaN or infinite (a learning rate or an initial
    scale too large for the model). Nothing of that epoch is committed: the run keeps its last
    checkpoint and resumes from it."""


class StrataIOError(StrataError, OSError):
    """An operating-system I/O error, with the file it happened on."""


class DiskFullError(StrataIOError):
    """The disk filled up (or the file size limit was reached) while writing."""


class DownloadError(StrataError):
    """A dataset download failed or its checksum did not match."""


class MissingDependencyError(StrataError, ImportError):
    """An optional dependency (torch, torch_geometric, matplotlib) is not installed."""

    exit_code = 2


class GroupError(StrataError):
    """A distributed run failed: another rank, the bucket scheduler on rank 0 or a collective
    could not be reached in time (the message names the address and what timed out)."""


class DataMismatchError(GroupError):
    """The ranks of a distributed run hold different data (stores or grids whose content
    digests differ) or run with different options; the message names both ranks' host:path,
    digests or options."""

    exit_code = 2
