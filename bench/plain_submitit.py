"""The plain-submitit side of the submission benchmark (bench.submission): the same two jobs as
`python -m hpc.submit langsplat --levels 0 1 2 --profile sandbox`, written as a user of submitit
alone would write them.

    python bench/plain_submitit.py FOLDER      # prints {"rgb": [id], "features": [id_0, id_1, id_2]}

Run as a file, not as a module of the `bench` package: the baseline imports nothing but submitit
and the standard library modules it needs itself, so that the benchmark's own modules do not
count against it.
"""
import json
import sys

import submitit

LEVELS = 3


def noop() -> int:
    return 0


def main(folder: str) -> dict:
    """rgb, then a 3-task features array with afterok, through submitit's SlurmExecutor; the
    options are the sandbox profile's (templates/profiles/sandbox.yaml), as bench.submission's
    bare sbatch calls spell them."""
    ex = submitit.SlurmExecutor(folder=f"{folder}/rgb/%j")
    ex.update_parameters(job_name="rgb", partition="low", nodes=1, ntasks_per_node=1, cpus_per_task=1,
                         gpus_per_node=1, time=20, signal_delay_s=90, additional_parameters={"requeue": True})
    rgb = ex.submit(noop)
    ex = submitit.SlurmExecutor(folder=f"{folder}/features/%j")
    ex.update_parameters(job_name="features", partition="low", nodes=2, ntasks_per_node=2, cpus_per_task=1,
                         gpus_per_node=2, time=20, signal_delay_s=90,
                         additional_parameters={"requeue": True, "dependency": f"afterok:{rgb.job_id}"})
    with ex.batch():
        features = [ex.submit(noop) for _ in range(LEVELS)]
    return {"rgb": [rgb.job_id], "features": [j.job_id for j in features]}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python bench/plain_submitit.py FOLDER")
    print(json.dumps(main(sys.argv[1])))
