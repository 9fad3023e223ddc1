"""The admin UI's pieces without a server: team-form validation, the SVG chart, grouping of the
daily rollups, the dashboard's view parameters, prefix-cache hit rate, sign-in redirects."""

import re
from datetime import UTC, date, datetime, timedelta

import pytest
from multidict import MultiDict

from tokenyard.admin_ui import charts, forms, status, usage
from tokenyard.admin_ui.pages.sign_in import _local_next
from tokenyard.billing.models import UsageDaily
from tokenyard.tenancy.limits import LIMIT_FIELDS
from tokenyard.tenancy.models import Team
from tokenyard.tenancy.teams import create_team

CATALOG = ["small", "big"]


class Form(MultiDict):
    """Stands in for Litestar's FormMultiDict: get() and getall()."""


def _form(**fields: str | list[str]) -> Form:
    items = []
    for name, value in fields.items():
        items += [(name, v) for v in value] if isinstance(value, list) else [(name, value)]
    return Form(items)


def test_every_team_field_has_a_label() -> None:
    assert set(forms.LABELS) == set(LIMIT_FIELDS)


def test_a_valid_form_gives_the_limits_blank_meaning_unlimited() -> None:
    parsed = forms.parse(
        _form(name="ml", rpm="60", tpm="", usd_per_day="12.5", auto_threshold="0.7",
              default_tier="batch", models=["big", "small"], user_usd_per_day="0.5",
              model_limits="big: rpm=10, tpm=20000\nsmall: tpm=5", scopes="embeddings"),
        CATALOG,
        with_name=True,
    )  # fmt: skip
    assert parsed.errors == {}
    assert parsed.limits["scopes"] == "embeddings"
    assert parsed.limits["rpm"] == 60
    assert parsed.limits["tpm"] is None
    assert parsed.limits["usd_per_day"] == 12.5
    assert parsed.limits["auto_threshold"] == 0.7
    assert parsed.limits["default_tier"] == "batch"
    assert parsed.limits["user_usd_per_day"] == 0.5 and parsed.limits["user_rpm"] is None
    assert parsed.limits["models"] == "small,big"  # the catalog's order
    assert parsed.limits["model_limits"] == {"big": {"rpm": 10, "tpm": 20000}, "small": {"tpm": 5}}
    assert set(parsed.limits) == set(LIMIT_FIELDS)


def test_each_bad_value_gets_its_own_message() -> None:
    parsed = forms.parse(
        _form(name="no spaces", rpm="-1", tpm="1.5", usd_per_day="-3", concurrency="lots",
              auto_threshold="1.2", strong_share="nan", default_tier="urgent",
              models=["small", "gpt-9"], model_limits="big: rpm=0", scopes="chat"),
        CATALOG,
        with_name=True,
    )  # fmt: skip
    assert parsed.errors == {
        "name": "1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit",
        "rpm": "must be 0 or more",
        "tpm": "must be a whole number (or blank)",
        "usd_per_day": "must be 0 or more",
        "concurrency": "must be a whole number (or blank)",
        "auto_threshold": "must be between 0 and 1",
        "strong_share": "must be 0 or more",
        "default_tier": "must be one of interactive, batch",
        "models": "not in the catalog: gpt-9",
        "model_limits": f"'big': rpm must be a whole number from 1 to {2**53}",
        "scopes": "names no scope chat: the scopes are completions, embeddings, images, "
        "audio, moderations, batch, usage, feedback",
    }
    # per-model limits must name the catalog's models, each with rpm=N and/or tpm=N
    for typed, error in (
        ("gpt-9: rpm=5", "name models not in the catalog: gpt-9"),
        ("big rpm=5", "'big rpm=5' is not 'model: rpm=N, tpm=N'"),
        ("big: rpm=5, burst=2", "'big': 'burst=2' is not rpm=N or tpm=N"),
        ("big:", "'big' must set rpm, tpm or both"),
    ):
        form = _form(default_tier="interactive", model_limits=typed)
        assert forms.parse(form, CATALOG, False).errors == {"model_limits": error}
    assert parsed.values["rpm"] == "-1"  # what was typed goes back into the form


def test_a_teams_limits_per_model_show_as_typed_and_read_back_the_same() -> None:
    limits = {"big": {"rpm": 10, "tpm": 20000}, "small": {"tpm": 5}}
    shown = forms.from_team(Team(name="t", model_limits=limits)).values["model_limits"]
    assert shown == "big: rpm=10, tpm=20000; small: tpm=5"
    form = _form(default_tier="batch", model_limits=shown)
    assert forms.parse(form, CATALOG, False).limits["model_limits"] == limits
    assert forms.from_team(Team(name="t")).values["model_limits"] == ""


@pytest.mark.parametrize("name", [".", "..", "-x", "_x", "a" * 65, "a/b", ""])
def test_names_that_would_break_team_urls_are_refused(name: str) -> None:
    assert "name" in forms.parse(_form(name=name), CATALOG, with_name=True).errors
    with pytest.raises(ValueError, match="starting with a letter or digit"):
        create_team(None, name)  # type: ignore[arg-type]  # refused before the database


@pytest.mark.parametrize("name", ["ml", "ml-team.eu_2", "7up", "a" * 64])
def test_ordinary_team_names_pass(name: str) -> None:
    assert "name" not in forms.parse(_form(name=name), CATALOG, with_name=True).errors


def test_an_edit_form_ignores_the_name() -> None:
    parsed = forms.parse(_form(default_tier="interactive"), CATALOG, with_name=False)
    assert parsed.errors == {}
    assert parsed.limits["models"] == ""  # none ticked: every model


def test_nice_ceiling_rounds_up_to_a_round_axis() -> None:
    assert [charts.nice_ceiling(v) for v in (0, 7, 12, 180, 400, 2600)] == [
        1,
        8,
        20,
        200,
        400,
        4000,
    ]


def _rects(svg: str) -> list[tuple[float, float, str]]:
    return [
        (float(y), float(h), fill)
        for y, h, fill in re.findall(r'<rect x="[\d.]+" y="([\d.]+)" width="[\d.]+" '
                                     r'height="([\d.]+)" fill="([^"]+)"', svg)
    ]  # fmt: skip


def test_bars_stack_in_series_order_with_heights_proportional() -> None:
    d1, d2 = date(2026, 1, 1), date(2026, 1, 2)
    svg = charts.stacked_bars(
        [d1, d2], {"a": {d1: 300.0, d2: 100.0}, "b": {d1: 100.0}}, "tokens", "t"
    )
    rects = _rects(svg)
    assert len(rects) == 3  # day 2 has no "b"
    (a1_y, a1_h, a1_fill), (b1_y, b1_h, b1_fill), (_, a2_h, _) = rects
    assert a1_fill == charts.PALETTE[0] and b1_fill == charts.PALETTE[1]
    assert abs(a1_h / b1_h - 3) < 0.01 and abs(a1_h / a2_h - 3) < 0.01
    assert abs(b1_y + b1_h - a1_y) < 0.01  # b sits on top of a
    assert "2026-01-01 · a: 300" in svg  # the hover title
    assert ">400</text>" in svg  # the axis top: the tallest bar, rounded


def test_costs_are_labelled_in_dollars() -> None:
    d = date(2026, 1, 1)
    svg = charts.stacked_bars([d], {"x": {d: 0.5}}, "cost", "c")
    assert "$0.5000" in svg and "$0.00" in svg


def _row(day: date, team: str, model: str, tokens: int, cost: float) -> UsageDaily:
    return UsageDaily(day=day, team=team, model=model, requests=1, prompt_tokens=tokens,
                      completion_tokens=tokens, cost_usd=cost)  # fmt: skip


def test_series_are_ranked_and_the_tail_folded_into_other() -> None:
    d = date(2026, 1, 1)
    rows = [_row(d, f"team{i}", "m", 10 * (i + 1), 0.0) for i in range(usage.MAX_SERIES + 2)]
    view = usage.View(d, d, "team", "tokens")
    series = usage.series(rows, view)
    assert len(series) == usage.MAX_SERIES
    assert next(iter(series)) == f"team{usage.MAX_SERIES + 1}"  # the largest first
    assert series[usage.OTHER][d] == 2 * (10 + 20 + 30)  # the three smallest


def test_totals_per_group_and_grand_total() -> None:
    d = date(2026, 1, 1)
    rows = [_row(d, "a", "m1", 5, 1.0), _row(d + timedelta(1), "a", "m2", 5, 2.0),
            _row(d, "b", "m1", 100, 0.5)]  # fmt: skip
    table, grand = usage.totals(rows, "team")
    assert [(t["name"], t["total_tokens"], t["cost_usd"]) for t in table] == [
        ("a", 20, 3.0),  # the most expensive first
        ("b", 200, 0.5),
    ]
    assert grand["requests"] == 3 and grand["total_tokens"] == 220


def test_view_defaults_to_the_last_30_days_and_says_what_it_fixed() -> None:
    view, notes = usage.parse_view({})
    assert (view.end - view.start).days == usage.DEFAULT_DAYS - 1
    assert (view.by, view.metric, view.team) == ("team", "tokens", None)
    assert notes == []
    view, notes = usage.parse_view({"start": "2026-02-10", "end": "2026-02-01", "by": "x"})
    assert (view.start, view.end, view.by) == (date(2026, 2, 1), date(2026, 2, 10), "team")
    assert notes == ["the start was after the end: swapped"]
    view, notes = usage.parse_view({"start": "soon"}, team="pinned")
    assert view.team == "pinned" and view.by == "model"
    assert "not a date" in notes[0]


def test_a_pinned_team_cannot_be_swapped_by_a_parameter() -> None:
    view, _ = usage.parse_view({"team": "someone-else"}, team="mine")
    assert view.team == "mine"
    assert "team=mine" in view.query() and "someone-else" not in view.query()


def test_a_view_takes_only_team_names_and_dates_it_can_count_back_from() -> None:
    """A team name ends up in the CSV's content-disposition header; the default start is counted
    back from the end (date.min overflowed)."""
    view, notes = usage.parse_view({"team": 'a"\r\nset-cookie: x=1', "end": "0001-01-01"})
    assert view.team is None and view.end == datetime.now(UTC).date()
    assert len(notes) == 2 and "not a date" in notes[0] and "not a team name" in notes[1]


def test_prefix_cache_hit_rate_from_engine_metrics() -> None:
    text = (
        "# TYPE tokenyard_engine_prefix_cache_queries_tokens counter\n"
        'tokenyard_engine_prefix_cache_queries_tokens_total{model="m"} 400.0\n'
        "# TYPE tokenyard_engine_prefix_cache_hits_tokens counter\n"
        'tokenyard_engine_prefix_cache_hits_tokens_total{model="m"} 100.0\n'
    )
    assert status.hit_rate(text) == 0.25
    assert status.hit_rate("") is None


def test_after_sign_in_only_local_admin_paths() -> None:
    assert _local_next("/admin/teams/x?y=1", "/admin/usage") == "/admin/teams/x?y=1"
    for evil in ("https://evil.example/admin", "//evil.example/admin", "/v1/models", None):
        assert _local_next(evil, "/admin/usage") == "/admin/usage"
