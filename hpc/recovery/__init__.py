"""What happens when a job is stopped: preemption, time limits, node failures, hung ranks.

Usage (TrainLoop does all of it; a loop of one's own can too)::

    flag = stopsignal.install()                  # SIGTERM and the time-limit signal: a flag, never an exception
    vote = stopsignal.StopVote(flag)
    request = vote.poll()                        # every rank: the same answer at the same step
    if request: save(); preemption.exit_for(preemption.handle_stop(request, history))   # rank 0 decides

Parts::

    stopsignal.py   stop signals as a flag; the step every rank agrees to stop at, without a per-step sync
    verdict.py      what happened to a stopped job (SLURM's fields) and the requeue table; pure
    preemption.py   a stop carried out: SLURM asked, the verdict recorded, the job requeued or ended
    requeue.py      a stop's requeue asked again within the grace time; a requeued job's node range and exclusions
    nodefail.py     was it a node or the code, and is another attempt worth it (the task's history)
    nodeaction.py   what the srun wrapper (python -m hpc.afterstep) reads, decides and carries out
    supervise.py    the wrapper's loop: srun to its end under SIGTERM, the ranks' requests polled
    inplace.py      which failure restarts in place (a new srun step, same allocation), on which nodes; pure
    restart.py      a restart in place read, decided, recorded, and the next step's srun line
    watchdog.py     no step for watchdog_s: every rank's stacks, the stuck ranks named, a requeue
    hangs.py        what a hang leaves in the run directory
    submitstop.py   which stop requeued a stage without hpc's loop (time limit, preemption, node failure), told

The decisions are pure functions of SLURM's answers (documented from its observed states); the
effects (scontrol calls, files) sit in one place each.
"""
