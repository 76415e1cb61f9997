"""The crash harness (``barrierflow chaos``): kills the demo's live pipelines — driver, Spark
JVM and all — at seeded moments (traced events of the run, and a share at uniform random
moments of it), resumes them, and audits their tables independently of the pipeline's code
(:mod:`.harness`)."""

import typing as _typing

from barrierflow._removed import removed_names as _removed_names

#: Nothing: the crash harness is the command ``barrierflow chaos``; its
#: Python parts are the product's own (:mod:`.harness`).
__all__: list[str] = []

if not _typing.TYPE_CHECKING:
    # A removed name says what replaced it (see CHANGELOG.md); a type checker does not see
    # this, so it still reports a removed or misspelt name as missing.
    __getattr__ = _removed_names(__name__)
