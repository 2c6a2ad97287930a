"""Users' own training scripts, run unmodified under `python -m hpc.submit run`, and resumed.

Parts::

    runner.py     run_argv: the script as one task, the time-limit warning passed on, one stop decision
    workspace.py  the task's working directory (hpc.rundir.workdir), laid out once per attempt
"""
