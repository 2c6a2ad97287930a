"""The GPU suite's report (bench.gpu): which paths ran on a GPU, read from pytest's results; every
test it names exists in tests/gpu, so a renamed test cannot leave a path 'not collected' unnoticed.

    python -m pytest -n 0 tests/test_gpu_report.py
"""

import ast
from pathlib import Path

from bench.gpu import PATHS, path_rows, results

GPU_TESTS = Path(__file__).with_name("gpu")


def test_every_path_names_tests_that_exist():
    defined = {f"{p.stem}::{node.name}" for p in GPU_TESTS.glob("test_*.py")
               for node in ast.parse(p.read_text()).body if isinstance(node, ast.FunctionDef)}
    for path, tests in PATHS.items():
        for prefix in tests:
            assert any(name.startswith(prefix) for name in defined), (path, prefix)


def test_only_cuda_runs_count_and_a_failure_shows():
    ddp = "test_collectives::test_ddp_binds_the_sessions_device"
    vote = "test_collectives::test_the_stop_vote_reads_the_agreed_flag_one_poll_later"
    outcomes = {f"{ddp}[cpu]": "passed", f"{ddp}[cuda]": "skipped: no CUDA device here",
                f"{vote}[cpu]": "failed", f"{vote}[cuda]": "passed",
                "test_device::test_tf32_x": "passed"}
    rows = {row[0].split(" (")[0]: row[1] for row in path_rows(outcomes)}
    assert rows["DDP with device_ids"] == "not run: no CUDA device here"  # its CPU pass does not count
    assert rows["the stop vote on CUDA streams"] == "passed"
    assert rows["CUDA RNG capture"] == "not collected"
    outcomes[f"{vote}[cuda]"] = "failed"
    assert {r[0].split(" (")[0]: r[1] for r in path_rows(outcomes)}["the stop vote on CUDA streams"] == "FAILED"


def test_junit_outcomes_are_read_per_test(tmp_path):
    xml = tmp_path / "junit.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="tests.gpu.test_device" name="test_a[cuda]">'
                   '<skipped message="no CUDA device here"/></testcase>'
                   '<testcase classname="tests.gpu.test_device" name="test_b"><failure message="x"/></testcase>'
                   '<testcase classname="tests.gpu.test_device" name="test_c[cpu]"/></testsuite></testsuites>')
    assert results(xml) == {"test_device::test_a[cuda]": "skipped: no CUDA device here",
                            "test_device::test_b": "failed", "test_device::test_c[cpu]": "passed"}


def test_the_readme_lists_every_path_and_whether_it_ran_on_a_gpu():
    table = [line for line in (GPU_TESTS / "README.md").read_text().splitlines() if line.startswith("| ")][1:]
    assert len(table) == len(PATHS)
    for path in PATHS:
        label = path.split(" (")[0].replace("device_ids", "`device_ids`").replace("cuda:0", "`cuda:0`")
        assert any(row.startswith(f"| {label}") for row in table), label
