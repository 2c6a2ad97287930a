"""The fault-campaign report (faults.reliability): written after every campaign, and rows carried
over from an earlier report keep the date of the run that measured them."""
from types import SimpleNamespace

from bench.report import Section
from faults import reliability
from faults.common import Outcome


def recording(order):
    """A campaign factory whose campaigns note their name in `order` when they run, and pass."""
    def campaign(name):
        def run(scratch, count, seed):
            order.append(name)
            return Outcome(count, 0, f"{name} checked")
        return run
    return campaign


def test_the_report_is_kept_after_each_campaign_with_the_rest_marked_still_to_run(tmp_path, monkeypatch):
    order = []
    campaign = recording(order)

    monkeypatch.setattr(reliability, "campaigns", lambda: [
        reliability.Campaign("first kind", campaign("first"), 5, 2),
        reliability.Campaign("second kind", campaign("second"), 5, 2)])
    ctx = SimpleNamespace(quick=True, scratch=lambda name: tmp_path / name)
    seen = []
    sec = reliability.run(ctx, progress=lambda part: seen.append([row[:3] for row in part.rows]))
    assert order == ["first", "second"]
    # after the first campaign: its figures, the second still to run, the total of what ran
    assert seen == [[["first kind", "2", "0"], ["second kind", "not run", "-"], ["**total**", "**2**", "**0**"]]]
    assert [row[:3] for row in sec.rows][-1] == ["**total**", "**4**", "**0**"]


def test_rows_carried_twice_keep_the_date_of_their_measurement(tmp_path):
    report = tmp_path / "RELIABILITY.md"
    report.write_text(
        "Produced by `python -m faults.reliability --only x` on 2026-11-26 04:41 UTC.\n\n"
        "| faults | injected | lost | seconds | what was checked |\n|---|---|---|---|---|\n"
        "| some kind | 3 | 0 | 1.0 | checked |\n\n"
        "- note: 1 rows are carried over from the earlier report (produced by `python -m faults.reliability` "
        "on 2026-11-24 04:46 UTC, load 1 2 3): `python -m faults.reliability --only x` reran only the others\n")
    rows = reliability.earlier_rows(report)
    assert rows["some kind"][:3] == ["some kind", "3", "0"]
    oldest = "Produced by `python -m faults.reliability` on 2026-11-24 04:46 UTC, load 1 2 3"
    last = "Produced by `python -m faults.reliability --only x` on 2026-11-26 04:41 UTC."
    assert rows[""] == [oldest, last]
    # the next report names both: the oldest run of its carried rows, and the report it replaces
    sec = reliability._finish(Section("r", "t", "g", "c"), 0, 0, [], ["some kind"], rows, "cmd --only y", 0)
    note = next(n for n in sec.notes if "carried over" in n)
    assert "on 2026-11-24 04:46 UTC" in note and "the last report before this one produced by" in note
    assert "on 2026-11-26 04:41 UTC" in note
    report.write_text(report.read_text().split("- note:")[0] + f"- note: {note}\n")
    assert reliability.earlier_rows(report)[""][0] == oldest  # a third report still finds the oldest


def test_only_given_twice_runs_the_campaigns_both_name(tmp_path, monkeypatch):
    order = []
    campaign = recording(order)

    monkeypatch.setattr(reliability, "campaigns", lambda: [
        reliability.Campaign(f"{name} kind", campaign(name), 5, 2) for name in ("first", "second", "third")])
    out = tmp_path / "R.md"
    assert reliability.main(["--quick", "--only", "first", "--only", "third", "--out", str(out)]) == 0
    assert order == ["first", "third"]
    assert "--only 'first' --only 'third'" in out.read_text()
