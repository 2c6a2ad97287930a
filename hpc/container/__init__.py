"""Containers: a stage's ranks inside an image (Pyxis/enroot, Apptainer, or any prefix command).

    python -m hpc.submit langsplat --profile sandbox --dry-run \\
        cluster.container.runtime=pyxis cluster.container.image=/images/torch.sqsh   # the srun line shows it

The plan (hpc.pipeline.plan) resolves each stage's `container` section here; the sbatch script's
srun line and a `--cluster here` step both take their words from spec.launch(); a submission makes
what those lines name (spec.prepare) before any job starts. Only the ranks run inside: the batch
script, hpc.afterstep and every SLURM call stay on the host.

Parts::

    spec.py     a stage's container section checked, the mounts hpc adds, the srun line, the plan's notes
    carry.py    hpc and its pure-Python requirements copied once into the cache, for images with torch alone
    squash.py   Pyxis: a registry image imported once, at submission, to a shared .sqsh file

Imports no torch, and nothing of the plan: the plan imports it.
"""
