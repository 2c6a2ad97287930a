"""Hostlist expansion against `scontrol show hostnames` (Slurm 22.05).

The tables hold what scontrol printed; where SLURM is installed, hypothesis also fuzzes
hpc.slurm.hostlist against the real scontrol (refused: scontrol printed an error or nothing).
"""

import os
import subprocess

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from hpc.slurm.hostlist import MAX_HOSTS, HostlistError, expand

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
    # three or more groups: the last varies fastest, then the first, second, ...
    "a[1-2]b[3-4]c[5-6]": ["a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6",
                           "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6"],
    "a[1-2][3-4][5-6][7-8]": [f"a{a}{b}{c}{d}" for c in "56" for b in "34" for a in "12"
                              for d in "78"],
    "n1 n2": ["n1", "n2"],
    "n1\tn2,,n3": ["n1", "n2", "n3"],
    "a,,b": ["a", "b"],
    "[1-2]": ["1", "2"],
    "a[00-00]": ["a00"],
    "node": ["node"],
    "": [],
    ",": [],
    # strtoul's leniency: padding is the byte length of the low bound's text
    "n[1-]": ["n1"],
    "n[01-]": ["n01"],
    "n[ 1-2]": ["n01", "n02"],
    "n[1 -2]": ["n01", "n02"],
    "n[1- 2]": ["n1", "n2"],
    "n[+1]": ["n01"],
    "n[1a-2]": ["n01", "n02"],
    "n[1-+2]": ["n1", "n2"],
    "n[1-65536]": [f"n{i}" for i in range(1, 65537)],
    "n[65537]": ["n65537"],
    # a '[' without ']' after it is part of a name
    "n[1-": ["n]"],
    "n[1,2": ["n]", "2"],
    "[1-2": ["1-2"],
    "a[[1-2]": ["a[1", "a[2"],
    "a]": ["a]"],
    "n١": ["n١"],
    "n1-3": ["n1-3"],
    # a host that continues the previous range joins it: whitespace is ignored in that comparison
    "x\vy1,xy2": ["x\vy1", "x\vy2"],
}


@pytest.mark.parametrize("expr", sorted(SCONTROL_SAID))
def test_matches_scontrol(expr):
    assert expand(expr) == SCONTROL_SAID[expr]


@pytest.mark.parametrize("expr, words", [
    ("n[3-1]", "runs backwards"),        # scontrol: Invalid range
    ("a[1-2]b", "after the last"),       # scontrol: Invalid hostlist
    ("a[1-2]]", "after the last"),
    ("a[1[2]]", "after the last"),
    ("a[]", "not N or N-M"),
    ("a[x]", "not N or N-M"),
    ("a[1,]", "not N or N-M"),
    ("a[1 ]", "not N or N-M"),
    ("a[-2]", "not N or N-M"),
    ("a[1--2]", "not N or N-M"),
    ("a[1-2x]", "not N or N-M"),
    ("n[١-٢]", "not N or N-M"),          # unicode digits: scontrol refuses them
    ("n[1-65537]", "more than 65536"),
    ("n[1- -2]", "more than 65536"),     # strtoul reads -2 as 2**64-2
    ("a[x]b[1]c[2]", "not N or N-M"),    # scontrol reports it and prints nothing
    ("a[1-70000]b[1]c[1]", "more than 65536"),
    ("n[18446744073709551614-18446744073709551615]", "cannot count past"),  # scontrol crashes
    ("n99999999999999999999999", "cannot count past"),
    ("n[1-1000]x[1-1000]y[1-1000]", "more than"),  # refused before the product is built
])
def test_rejects_what_slurm_rejects(expr, words):
    with pytest.raises(HostlistError, match="HINT") as info:
        expand(expr)
    assert words in str(info.value) and repr(expr) in str(info.value)


def test_expansion_is_bounded():
    with pytest.raises(HostlistError, match=f"more than {MAX_HOSTS} hosts"):
        expand(",".join(f"r{i}n[1-60000]" for i in range(20)))


# -- fuzzing against the real scontrol -------------------------------------------------------

NUMBER = st.one_of(st.integers(0, 30), st.sampled_from([99, 100, 65535, 65536, 65537])).map(str)
PADDED = st.tuples(NUMBER, st.integers(0, 3)).map(lambda t: "0" * t[1] + t[0])
LENIENT = st.sampled_from(["", "", "", "", " ", "+", "\t", "a", "-", "x", "١"])
RANGE = st.one_of(
    PADDED,
    st.tuples(LENIENT, PADDED, LENIENT, st.sampled_from(["-", "--"]), LENIENT,
              st.one_of(PADDED, st.just(""))).map("".join),
)
GROUP = st.lists(RANGE, min_size=1, max_size=3).map(lambda r: "[" + ",".join(r) + "]")
TEXT = st.text(alphabet="nab-_.1 07x\v", max_size=3)
ITEM = st.tuples(st.lists(st.tuples(TEXT, GROUP).map("".join), max_size=4).map("".join),
                 TEXT).map("".join)
EXPRESSION = st.one_of(
    st.tuples(st.lists(ITEM, min_size=1, max_size=3),
              st.sampled_from([",", " ", "\t", ",,", "\n"])).map(lambda t: t[1].join(t[0])),
    st.text(alphabet="n1-2[],x 0+\t\v", max_size=14),
).filter(lambda e: not e.startswith("-"))  # scontrol would read it as an option


def scontrol_hostnames(expr: str) -> str | None:
    """What scontrol prints; None when it reports an error, or prints nothing for a real token."""
    out = subprocess.run(["scontrol", "show", "hostnames", expr], capture_output=True, text=True,
                         timeout=60)
    if out.stderr or out.returncode or (not out.stdout and expr.strip(" \t,")):
        return None
    return out.stdout


def printed(expr: str) -> str | None:
    try:
        return "".join(host + "\n" for host in expand(expr))
    except HostlistError as err:
        # Expansions beyond MAX_HOSTS are refused here, and would take scontrol minutes.
        assume(f"more than {MAX_HOSTS} hosts" not in str(err))
        return None


@pytest.mark.slurm
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=EXPRESSION)
def test_fuzz_matches_scontrol(slurm_cluster, expr):
    ours = printed(expr)
    assert ours == scontrol_hostnames(expr), expr


@pytest.mark.slurm
def test_scontrol_is_really_asked(slurm_cluster):
    # The fuzz test compares with what this returns: it must see scontrol's answers, not a stub.
    assert os.environ.get("SLURM_CONF")
    assert scontrol_hostnames("a[1-2]b[3-4]c[5-6]").split() == SCONTROL_SAID["a[1-2]b[3-4]c[5-6]"]
    assert scontrol_hostnames("n[3-1]") is None
