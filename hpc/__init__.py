"""hpc: SLURM-centric job toolkit.

    python -m hpc.submit langsplat --levels 0 1 2

Data flows one way: config -> plan -> submit (submitit) -> job runtime
(env -> DDP session -> training loop with checkpoints) -> run directory on disk.
Everything up to `submit` imports without torch.
"""

__version__ = "0.1.0"
