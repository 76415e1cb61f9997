"""Sinks: the commit protocol (:mod:`.table`: writers stage manifests, a coordinator commits
them into a table), the sink task that guards one staging writer, the sink writer actor that
feeds it from the stream, and the coordinator worker that commits each epoch once."""

import typing as _typing

from barrierflow._removed import removed_names as _removed_names

#: Nothing: the sinks' public names (``add_sink``, the table protocol, the
#: commit outcomes) have one home, :mod:`barrierflow.actors`.
__all__: list[str] = []

if not _typing.TYPE_CHECKING:
    # A removed name says what replaced it (see CHANGELOG.md); a type checker does not see
    # this, so it still reports a removed or misspelt name as missing.
    __getattr__ = _removed_names(__name__)
