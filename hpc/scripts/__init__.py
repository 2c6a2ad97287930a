"""Users' own training scripts, run unmodified under `python -m hpc.submit run`, and resumed.

Usage (what the `run` pipeline, jobs/run.py, does in each task)::

    work, plan = workspace.prepare(ctx, resume_if)     # the working directory, the resume plan
    run_argv(ctx, argv, max_timeouts, cwd=work, warn=preset.warn, watch=...)

Parts::

    runner.py          run_argv: the script as one task, the time-limit warning passed on, one stop decision
    workspace.py       the task's working directory (hpc.rundir.workdir), laid out once per attempt
    resume.py          the resume contract: $HPC_* placeholders, --resume-if/--resume-args, set aside, kept copies
    presets.py         framework presets (Lightning, HF Trainer, Accelerate, torchtitan, none) and `auto`
    hooks.py           the HF Trainer's and Accelerate's hooks, in the script's interpreter
    site/              the sitecustomize that installs them, the exit below, and the stacks signal
    scriptexit.py      the script's exit: a process group left initialised destroyed, a clean exit recorded
    accelerate_cfg.py  an `accelerate config` file as the variables `accelerate launch` exports; per-node launch
    scriptwatch.py     the hang watchdog: rank 0's output as the heartbeat, every rank's stacks, the suspect
    checks.py          mistakes refused before submission: a framework the interpreter lacks, a node range
"""
