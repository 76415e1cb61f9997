"""The crash harness (``barrierflow chaos``): kills the demo's live pipelines — driver, Spark
JVM and all — at seeded moments (traced events of the run, and a share at uniform random
moments of it), resumes them, and audits their tables independently of the pipeline's code
(:mod:`.harness`)."""

from barrierflow.app.chaos.harness import ChaosConfig as ChaosConfig
from barrierflow.app.chaos.harness import ChaosReport as ChaosReport
from barrierflow.app.chaos.harness import run_chaos as run_chaos

__all__ = ["ChaosConfig", "ChaosReport", "run_chaos"]
