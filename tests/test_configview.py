"""hpc.config.view: a resolved config read as plain data, as hpc.config.schema.load returns it."""
import copy
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpc.config import schema as config, view as configview
from hpc.config.view import ConfigView

keys = st.text(alphabet="abcdefghij_", min_size=1, max_size=6)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5)
trees = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
                     max_leaves=12)


def unwrap(node):
    if isinstance(node, ConfigView):
        return {k: unwrap(v) for k, v in node.items()}
    if isinstance(node, configview.ListView):
        return [unwrap(v) for v in node]
    return node


@given(st.dictionaries(keys, trees, max_size=4))
def test_every_value_reads_back_as_it_was_and_the_data_stays_unchanged(data):
    before = copy.deepcopy(data)
    view = ConfigView(data, yaml="x: 1\n")
    assert unwrap(view) == data and config.to_dict(view) == data and list(view) == list(data) and len(view) == len(data)
    for key, value in data.items():
        assert view.get(key) == value and key in view
        if not (key.startswith("__") and key.endswith("__")):  # dunders are Python's: item access only
            assert unwrap(getattr(view, key)) == value
    out = config.to_dict(view)
    out.clear()  # a copy: the view's data is untouched
    assert data == before and unwrap(pickle.loads(pickle.dumps(view))) == data


def test_lists_compare_and_print_as_lists_and_nested_sections_have_paths():
    view = ConfigView({"cluster": {"partitions": ["low", "high"], "setup": []}, "stages": {"a": {"nodes": 2}}})
    assert view.cluster.partitions == ["low", "high"] and f"{view.cluster.partitions}" == "['low', 'high']"
    assert list(view.cluster.setup) == [] and not view.cluster.setup
    assert [(k, r.nodes) for k, r in view.stages.items()] == [("a", 2)]
    with pytest.raises(AttributeError, match=r"'stages.a.gpus' does not exist; valid keys under stages.a: \['nodes'\]"):
        view.stages.a.gpus
    with pytest.raises(KeyError):
        view["nope"]


def test_nothing_can_be_set():
    view = ConfigView({"run": {"root": "runs"}})
    for change in (lambda: setattr(view.run, "root", "x"), lambda: view.run.__setitem__("root", "x"),
                   lambda: setattr(view, "new", 1)):
        with pytest.raises(TypeError, match="read-only.*HINT: pass it as a key=value override"):
            change()
    assert view.run.root == "runs"


def test_only_the_whole_config_has_yaml():
    view = ConfigView({"run": {"root": "runs"}}, yaml="run:\n  root: runs\n")
    assert config.to_yaml(view) == "run:\n  root: runs\n"
    with pytest.raises(ValueError, match="section 'run' has no YAML"):
        config.to_yaml(view.run)
