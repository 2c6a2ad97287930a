"""Sweep grids: parsing --sweep tokens and grid files, points and their signatures (hpc.sweep.grid).

    python -m pytest tests/test_grid.py -q
"""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpc.sweep import grid

KEYS = st.text(alphabet="abcdefghij.", min_size=1, max_size=8).filter(lambda k: k.strip("."))
VALUES = st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
                   st.text(max_size=6), st.lists(st.integers(), max_size=3))


def test_tokens_become_axes_with_values_read_as_yaml():
    g = grid.parse_tokens(["tiny.score=1,2.5", "opt.name=adam,sgd", "tiny.parts=[0,1],[2]", "flag=true"])
    assert g == {"tiny.score": [1, 2.5], "opt.name": ["adam", "sgd"], "tiny.parts": [[0, 1], [2]],
                 "flag": [True]}


@pytest.mark.parametrize("tokens, words", [
    (["tiny.score"], ["has no '='"]),
    (["=1,2"], ["has no key"]),
    (["tiny.score="], ["empty value"]),
    (["tiny.score=1,,2"], ["empty value"]),
    (["tiny.score=1", "tiny.score=2"], ["given twice"]),
    (["tiny.score=1,1"], ["repeat"]),
    ([], ["no axes"]),
])
def test_bad_tokens_are_refused_in_one_line_with_a_hint(tokens, words):
    with pytest.raises(grid.SweepError) as err:
        grid.parse_tokens(tokens)
    text = str(err.value)
    assert len(text.splitlines()) == 1 and "HINT:" in text
    for word in words:
        assert word in text


def test_keys_must_be_config_keys_and_not_shared_settings():
    known = ["tiny.score", "tiny.parts", "stages.first.nodes", "run.root"]
    grid.check_keys({"tiny.score": [1]}, known, "tiny")
    grid.check_keys({"tiny": [{"score": 1}]}, known, "tiny")  # a whole section is a key too
    with pytest.raises(grid.SweepError, match=r"unknown config key of pipeline tiny.*\['tiny.score'\].*HINT"):
        grid.check_keys({"tiny.scor": [1]}, known, "tiny")  # the close keys, not every key
    with pytest.raises(grid.SweepError, match=r"expected one of \['tiny.parts', 'tiny.score'\]"):
        grid.check_keys({"tiny.nope": [1]}, known, "tiny")  # none close: the keys at the level it left
    with pytest.raises(grid.SweepError, match=r"expected one of \['tiny'\]"):
        grid.check_keys({"tinny.score": [1]}, known, "tiny")
    for key in ("stages.first.nodes", "run.root"):
        with pytest.raises(grid.SweepError, match=r"shared by all points.*HINT: pass"):
            grid.check_keys({key: [1, 2]}, known, "tiny")


def test_points_are_the_product_in_grid_order():
    pts = grid.points({"a": [1, 2], "b": ["x", "y", "z"]})
    assert [p.overrides for p in pts][:4] == [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 1, "b": "z"},
                                              {"a": 2, "b": "x"}]
    assert len(pts) == 6 and len({p.signature for p in pts}) == 6
    assert pts[0].args() == ['a=1', 'b="x"'] and pts[0].describe() == "a=1 b=x"


def test_a_value_spelled_two_ways_is_one_point():
    one = grid.points(grid.parse_tokens(["lr=0.10", "name=a"]))[0]
    two = grid.points(grid.parse_tokens(["name=a", "lr=0.1"]))[0]
    assert one.signature == two.signature
    assert grid.signature({"lr": 0.1}) != grid.signature({"lr": 0.2})


@given(st.dictionaries(KEYS, VALUES, min_size=1, max_size=5), st.randoms())
def test_signature_is_stable_under_key_order(overrides, rnd):
    items = list(overrides.items())
    rnd.shuffle(items)
    assert grid.signature(dict(items)) == grid.signature(overrides)
    assert len(grid.signature(overrides)) == grid.SIGNATURE_CHARS


@given(st.lists(st.text(alphabet=st.characters(blacklist_characters=",[]{}'\"", blacklist_categories=("Cs",)),
                        min_size=1, max_size=6), min_size=1, max_size=5))
def test_split_values_round_trips_plain_values(values):
    assert grid.split_values(",".join(values)) == values


def test_grid_file(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text("tiny.score: [1, 2]\ntiny.sleep_s: 0.5\n")
    assert grid.read_file(path) == {"tiny.score": [1, 2], "tiny.sleep_s": [0.5]}
    assert grid.merge(grid.read_file(path), {"other": [1]}) == {"tiny.score": [1, 2], "tiny.sleep_s": [0.5],
                                                                "other": [1]}
    with pytest.raises(grid.SweepError, match="given twice"):
        grid.merge(grid.read_file(path), {"tiny.score": [3]})
    path.write_text("tiny.score: [1, 2\n")
    with pytest.raises(grid.SweepError, match=r"grid.yaml:\d+: YAML syntax error.*HINT"):
        grid.read_file(path)
    path.write_text("- 1\n")
    with pytest.raises(grid.SweepError, match="expected a mapping"):
        grid.read_file(path)
    with pytest.raises(grid.SweepError, match="cannot be read"):
        grid.read_file(tmp_path / "missing.yaml")
