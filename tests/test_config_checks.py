"""hpc.config.checks.has_control: the characters no run dir, config value or sweep value may hold,
since they would start a line of their own in an sbatch script.

    python -m pytest tests/test_config_checks.py
"""
import sys
import unicodedata

import pytest

import hpc
from hpc.config.checks import has_control


def test_has_control_is_unicode_s_cc_zl_and_zp_over_every_code_point():
    wrong = [hex(c) for c in range(sys.maxunicode + 1)
             if has_control(chr(c)) != (unicodedata.category(chr(c)) in ("Cc", "Zl", "Zp"))]
    assert not wrong


@pytest.mark.parametrize("char", ["\n", "\x85", "\u2028", "\u2029"])
def test_a_run_dir_with_a_line_break_of_any_kind_is_refused(tmp_path, char):
    with pytest.raises(hpc.ConfigError, match="control character"):
        hpc.submit("langsplat", levels=[0], cluster="local", run_dir=str(tmp_path / f"a{char}b"), dry_run=True)
