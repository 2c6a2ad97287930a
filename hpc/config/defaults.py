"""Defaults that code outside a pipeline's config also falls back to, each written once.

    python -c "from hpc.config import defaults; print(defaults.MAX_TIMEOUTS)"

The schema (hpc.config.schema.Resources) takes its field defaults from here, and so do the srun
wrapper (hpc.recovery.nodefail), TrainLoop's stop handling (hpc.recovery.preemption) and the
executors, which run in every job: this module imports nothing, so reading a default costs them
no import of the config machinery.
"""

MAX_TIMEOUTS = 3  # requeues of a job that hit its time limit
MAX_NODE_FAILURES = 3  # requeues of a job after a node failure, the failed nodes excluded
MAX_RESTARTS_IN_PLACE = 3  # new srun steps in the same allocation after a failure it can recover from
