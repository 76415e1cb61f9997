"""Sources: the batch feed that drivers such as the Spark bridge push numbered batches into
and the live split source (:class:`SplitSource`) that reads a split log (:class:`SplitLog`, a
partitioned log addressed by :class:`Offset`)."""

import typing as _typing

from barrierflow._removed import removed_names as _removed_names

#: Nothing: the sources' public names have one home, :mod:`barrierflow.actors`.
__all__: list[str] = []

if not _typing.TYPE_CHECKING:
    # A removed name says what replaced it (see CHANGELOG.md); a type checker does not see
    # this, so it still reports a removed or misspelt name as missing.
    __getattr__ = _removed_names(__name__)
