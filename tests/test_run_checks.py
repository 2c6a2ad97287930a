"""Mistakes in a `python -m hpc.submit run` that would only show in the job, refused before submission
with one line and a HINT (hpc.scripts.checks, jobs/run.py's validate)."""

import os
import sys

import pytest

from hpc import submit
from hpc.config.checks import ConfigError
from hpc.scripts import checks
from hpc.scripts.presets import PRESETS, Preset, detect


def test_a_node_range_the_parallel_degrees_cannot_split_is_refused():
    cmd = ["python", "-m", "torchtitan.train", "--parallelism.tensor_parallel_degree", "8",
           "--parallelism.data_parallel_shard_degree=-1"]
    with pytest.raises(ConfigError, match="tensor_parallel_degree=8 needs a multiple of 8 ranks.*gives 4.*HINT"):
        checks.check_world_sizes(PRESETS["torchtitan"], cmd, (1, 2), 4)
    checks.check_world_sizes(PRESETS["torchtitan"], cmd, (2, 2), 4)  # 8 ranks: fine
    with pytest.raises(ConfigError, match="gives 12"):
        checks.check_world_sizes(PRESETS["torchtitan"], cmd, (2, 4), 4)  # 8, 12, 16: 12 is not


def test_lightning_topology_fixed_on_the_command_line_must_match_the_job():
    with pytest.raises(ConfigError, match="--trainer.num_nodes=2.*1-2.*HINT: drop"):
        checks.check_world_sizes(PRESETS["lightning"], ["python", "t.py", "--trainer.num_nodes", "2"], (1, 2), 4)
    with pytest.raises(ConfigError, match="--trainer.devices=8"):
        checks.check_world_sizes(PRESETS["lightning"], ["python", "t.py", "--trainer.devices=8"], (1, 1), 4)
    checks.check_world_sizes(PRESETS["lightning"], ["python", "t.py", "--trainer.num_nodes", "2"], (2, 2), 4)


def test_a_preset_whose_package_the_interpreter_lacks_is_refused(tmp_path):
    missing = Preset("made-up", ("hpc_no_such_package_x",))
    with pytest.raises(ConfigError, match="cannot import. HINT: pip install hpc_no_such_package_x"):
        checks.check_importable(missing, [sys.executable, "train.py"])
    checks.check_importable(Preset("ok", ("json",)), [sys.executable, "train.py"])


def test_the_interpreter_of_a_launcher_is_read_from_its_shebang(tmp_path):
    launcher = tmp_path / "accelerate"
    launcher.write_text(f"#!{sys.executable}\nprint('hi')\n")
    launcher.chmod(0o755)
    assert checks.interpreter([str(launcher), "launch", "train.py"]) == sys.executable
    assert checks.interpreter([sys.executable, "train.py"]) == sys.executable
    assert checks.interpreter(["no-such-program-here"]) is None


def test_auto_reads_the_frameworks_from_the_scripts_imports(tmp_path):
    cases = {"lightning": "import lightning as L\n", "hf": "from transformers import AutoModel, Trainer\n",
             "accelerate": "from accelerate import Accelerator\n", "none": "import torch\n"}
    for name, source in cases.items():
        (tmp_path / f"{name}.py").write_text(source)
        assert detect(["python", f"{name}.py"], tmp_path) == name
    assert detect(["python", "-m", "torchtitan.train"], tmp_path) == "torchtitan"


@pytest.mark.parametrize("args, words", [
    (["--resume-args", "--init_from=resume"], "without --resume-if"),
    (["--resume-if", "out/*.pt", "--resume-args", "--x=$HPC_LAST"], "unknown placeholder"),
    (["--resume-if", "train.py"], "names code"),
    (["--heartbeat", "step ("], "not a regular expression"),
    (["--hang-after", "-1"], "hang_after_s=-1"),
    (["--framework", "lightning", "--nodes", "1-2"], None),  # fine without a fixed num_nodes
])
def test_resume_and_watchdog_mistakes_are_one_line_with_a_hint(tmp_path, monkeypatch, capsys, args, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import torch\n")
    code = submit.main(["run", "--cluster", "local", "--dry-run", "--run-dir", str(tmp_path / "r"), *args,
                        "--", sys.executable, "train.py"])
    err = capsys.readouterr().err
    if words is None:
        assert code == 0, err
        return
    assert code == 2 and words in err and "HINT" in err and len(err.strip().splitlines()) == 1, err


def test_the_accelerate_config_reaches_every_rank_as_accelerate_launch_would_export_it(tmp_path):
    """The variables hpc exports per rank, against those accelerate's own launcher computes."""
    pytest.importorskip("accelerate")
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import prepare_multi_gpu_env

    from hpc.scripts import accelerate_cfg

    config = tmp_path / "fsdp.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nmixed_precision: bf16\n"
                      "num_machines: 1\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"
                      "  fsdp_offload_params: false\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                      "  fsdp_transformer_layer_cls_to_wrap: Block\n  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
                      "  fsdp_version: 2\n")
    ours = accelerate_cfg.environ(accelerate_cfg.read_config(str(config)))
    args = launch_command_parser().parse_args(["--config_file", str(config), "train.py"])
    args = _validate_launch_command(args)[0]
    theirs = prepare_multi_gpu_env(args)
    for key, value in ours.items():
        assert theirs.get(key) == value, (key, value, theirs.get(key))
    assert {"ACCELERATE_USE_FSDP", "ACCELERATE_MIXED_PRECISION", "FSDP_SHARDING_STRATEGY",
            "FSDP_TRANSFORMER_CLS_TO_WRAP", "FSDP_STATE_DICT_TYPE", "FSDP_VERSION"} <= set(ours)
    deepspeed = tmp_path / "ds.yaml"
    deepspeed.write_text("distributed_type: DEEPSPEED\n")
    with pytest.raises(ConfigError, match="DeepSpeed.*HINT: run it per node"):
        accelerate_cfg.environ(accelerate_cfg.read_config(str(deepspeed)))
    assert os.environ.get("ACCELERATE_USE_FSDP") is None


def test_accelerate_launch_per_node_gets_the_jobs_topology_unless_given():
    from types import SimpleNamespace

    from hpc.scripts import accelerate_cfg

    dist = SimpleNamespace(num_nodes=2, node_rank=1, master_addr="n1", master_port=23456)
    argv = ["accelerate", "launch", "--multi_gpu", "train.py", "--lr", "1"]
    assert accelerate_cfg.is_launcher(argv) and not accelerate_cfg.is_launcher(["python", "train.py"])
    assert accelerate_cfg.launcher_argv(argv, dist, 4) == [
        "accelerate", "launch", "--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "n1",
        "--main_process_port", "23456", "--num_processes", "8", "--multi_gpu", "train.py", "--lr", "1"]
    given = ["accelerate", "launch", "--num_processes=4", "train.py"]
    assert accelerate_cfg.launcher_argv(given, dist, 4).count("--num_processes") == 0
    assert accelerate_cfg.launcher_argv(given, dist, 0)[-2:] == ["--num_processes=4", "train.py"]
    scripts_own = ["accelerate", "launch", "train.py", "--num_processes", "3"]
    assert accelerate_cfg.launcher_argv(scripts_own, dist, 4)[2:4] == ["--num_machines", "2"]
