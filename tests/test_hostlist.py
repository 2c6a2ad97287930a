"""Hostlist expansion; the expected lists are what `scontrol show hostnames` printed (Slurm 22.05)."""

import pytest

from hpc.hostlist import HostlistError, expand

SCONTROL_SAID = {
    "gpu-a[001-003,010],gpu-b07": ["gpu-a001", "gpu-a002", "gpu-a003", "gpu-a010", "gpu-b07"],
    "n[1-2]-ib[0-1]": ["n1-ib0", "n1-ib1", "n2-ib0", "n2-ib1"],
    "n[1-010]": [f"n{i}" for i in range(1, 11)],
    "x[007-10]": ["x007", "x008", "x009", "x010"],
    "a[01-2,5-006]": ["a01", "a02", "a5", "a6"],
    "a1,a1,b[2,1]": ["a1", "a1", "b2", "b1"],
    "a[1,1-2]": ["a1", "a1", "a2"],
    "x[9-11]": ["x9", "x10", "x11"],
    "a[1-2][3-4]": ["a13", "a14", "a23", "a24"],
    "n1 n2": ["n1", "n2"],
    "a,,b": ["a", "b"],
    "[1-2]": ["1", "2"],
    "a[00-00]": ["a00"],
    "node": ["node"],
    "": [],
}


@pytest.mark.parametrize("expr", sorted(SCONTROL_SAID))
def test_matches_scontrol(expr):
    assert expand(expr) == SCONTROL_SAID[expr]


@pytest.mark.parametrize("expr, words", [
    ("n[3-1]", "runs backwards"),        # scontrol: Invalid range
    ("a[1-2]b", "after the last"),       # scontrol: Invalid hostlist
    ("a[]", "not N or N-M"),
    ("a[x]", "not N or N-M"),
    ("a[1-2", "unclosed"),
    ("a]", "without"),
    ("a[1[2]]", "nested"),
    ("n[1-99999999]", "more than"),
    ("n[1-1000]x[1-1000]y[1-1000]", "more than"),  # refused before the product is built
])
def test_rejects_what_slurm_rejects(expr, words):
    with pytest.raises(HostlistError, match="HINT") as info:
        expand(expr)
    assert words in str(info.value) and expr in str(info.value)


def test_wide_ranges_keep_padding():
    hosts = expand("r[0998-1001]")
    assert hosts == ["r0998", "r0999", "r1000", "r1001"]
