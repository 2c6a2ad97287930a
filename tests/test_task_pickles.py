"""An array's task pickles (hpc.pipeline.executor._dumps): the standard pickler where it writes what
submitit's cloudpickle would, cloudpickle where the job could not import what a task names."""

import pickle
import subprocess
import sys
import types

from hpc.pipeline.executor import StageTask, _dumps


def load_in_a_fresh_interpreter(data: bytes) -> subprocess.CompletedProcess:
    code = "import pickle, sys; t = pickle.loads(sys.stdin.buffer.read()); print(t.item.value)"
    return subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, timeout=60)


def test_a_task_of_importable_parts_is_pickled_by_reference():
    task = StageTask("/run", "train", "jobs.x:train", item=3)
    data = _dumps(task)
    assert data == pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL)
    assert pickle.loads(data).item == 3


def test_an_item_defined_in_main_travels_by_value():
    main = sys.modules["__main__"]
    Point = type("Point", (), {"__module__": "__main__", "__init__": lambda self, v: setattr(self, "value", v)})
    main.Point = Point  # as a notebook or a script run directly defines it
    try:
        data = _dumps(StageTask("/run", "train", "jobs.x:train", item=Point(7)))
    finally:
        del main.Point
    out = load_in_a_fresh_interpreter(data)  # a job has no such class in its __main__
    assert out.returncode == 0 and out.stdout.strip() == b"7", out.stderr


def test_a_lambda_item_falls_back_to_cloudpickle():
    data = _dumps(StageTask("/run", "train", "jobs.x:train", item=types.SimpleNamespace(value=lambda: 5)))
    assert pickle.loads(data).item.value() == 5
