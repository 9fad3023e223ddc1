"""Cost arithmetic per provider, and how a usage event becomes a record."""

from datetime import UTC, date, datetime

import msgspec
import pytest

from tests.billing.conftest import event
from tokenyard.billing.events import decoder, to_row
from tokenyard.billing.pricing import costs
from tokenyard.billing.settle import Pricer
from tokenyard.core.usage import Usage, UsageEvent
from tokenyard.router.catalog import Catalog, CatalogFile, ModelEntry, Price

CATALOG = Catalog.load()
# 1,000 prompt tokens (400 of them cached) and 200 completion tokens
USED = Usage(1000, 200, 400)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        # (1000 - 400) * 0.15 + 400 * 0.075 + 200 * 0.60, per 1M
        ("gpt-4o-mini", (600 * 0.15 + 400 * 0.075 + 200 * 0.60) / 1e6),
        ("gpt-4o", (600 * 2.50 + 400 * 1.25 + 200 * 10.00) / 1e6),
        ("claude-3-5-haiku", (600 * 0.80 + 400 * 0.08 + 200 * 4.00) / 1e6),
        ("claude-sonnet-4", (600 * 3.00 + 400 * 0.30 + 200 * 15.00) / 1e6),
    ],
)
def test_commercial_models_cost_their_list_price_cached_tokens_included(
    model: str, expected: float
) -> None:
    got = costs(CATALOG.get(model), USED, None)
    assert got.charged == pytest.approx(expected, rel=1e-12)
    assert got.list == got.charged
    # engine timings never change a commercial model's price
    assert costs(CATALOG.get(model), USED, {"compute": 9.0}) == got


def test_self_hosted_is_charged_engine_time_and_reports_list_price_beside_it() -> None:
    entry = CATALOG.get("smollm2")
    assert entry is not None and entry.provider == "self-hosted"
    got = costs(entry, USED, {"compute": 1.8})
    assert got.charged == pytest.approx(1.8 * 0.10 / 3600, rel=1e-12)
    assert got.list == pytest.approx((600 * 0.02 + 400 * 0.01 + 200 * 0.05) / 1e6, rel=1e-12)
    # an engine that reported no timings: the list price is all there is
    assert costs(entry, USED, None).charged == got.list


def test_unknown_model_costs_nothing() -> None:
    assert costs(None, Usage(1000, 1000), {"compute": 1.0}).charged == 0.0


def test_price_fills_the_event() -> None:
    entry = ModelEntry(id="m", provider="openai", price=Price(input=1.0, cached_input=0.5))
    ev = UsageEvent(request_id="r", team="alpha", model="m", model_served="m", ts=0.0)
    price = Pricer(Catalog(CatalogFile(models=(entry,))))
    charged = price("alpha", "m", Usage(100, 10, 40, reported=True), ev)
    assert charged == pytest.approx((60 * 1.0 + 40 * 0.5) / 1e6)
    assert (ev.provider, ev.usage_reported) == ("openai", True)
    assert ev.cost_usd == ev.list_cost_usd == charged  # no compute-priced model: list is charged


def test_cache_writes_are_charged_their_own_price() -> None:
    """Anthropic's cache writes cost a premium (1.25x input): of 100 prompt tokens, 40 read from
    the cache and 30 written to it, each at its own rate; without a write price, the input's."""
    premium = Price(input=1.0, cached_input=0.1, cache_write_input=1.25, output=2.0)
    assert premium.cost(100, 40, 10, 30) == pytest.approx(
        (30 * 1.0 + 40 * 0.1 + 30 * 1.25 + 20) / 1e6
    )
    assert Price(input=1.0, cached_input=0.1).cost(100, 40, 0, 30) == pytest.approx(64 / 1e6)
    entry = ModelEntry(id="c", provider="anthropic", price=premium)
    ev = UsageEvent(request_id="r", team="alpha", model="c", model_served="c", ts=0.0)
    price = Pricer(Catalog(CatalogFile(models=(entry,))))
    charged = price("alpha", "c", Usage(100, 10, 40, 30, reported=True), ev)
    assert charged == premium.cost(100, 40, 10, 30) == ev.cost_usd


def test_audio_is_charged_by_the_minute_and_by_the_character() -> None:
    """whisper-1 costs its price per minute of audio, tts-1 its price per 1M characters spoken;
    a model priced by tokens as well charges both."""
    whisper = Price(audio_minute=0.006)
    assert whisper.cost(0, 0, 0, audio_seconds=90.0) == pytest.approx(0.009)
    tts = Price(characters=15.0)
    assert tts.cost(0, 0, 0, characters=2000) == pytest.approx(0.03)
    both = ModelEntry(id="a", provider="openai", price=Price(input=2.0, audio_minute=0.01))
    got = costs(both, Usage(500, audio_seconds=30.0), None)
    assert got.charged == pytest.approx(500 * 2.0 / 1e6 + 0.005)


def test_event_to_row() -> None:
    ts = datetime(2026, 3, 4, 23, 59, 59, tzinfo=UTC).timestamp()
    row = to_row(decoder.decode(msgspec.json.encode(event(request_id="r1", ts=ts, e2e=2.0))))
    assert row["day"] == date(2026, 3, 4)  # the UTC day the request started
    assert row["finished_at"] == datetime(2026, 3, 5, 0, 0, 1, tzinfo=UTC)
    assert (row["queue_s"], row["ttft_s"], row["compute_s"]) == (0.01, 0.05, 0.2)
    assert row["finish_reason"] is None
    measured = to_row(decoder.decode(msgspec.json.encode(event(ttft=0.3, finish_reason="stop"))))
    assert (measured["ttft_s"], measured["finish_reason"]) == (0.3, "stop")  # the gateway's own
    failed = to_row(decoder.decode(msgspec.json.encode(event(status=502, timings=None))))
    assert failed["finish_reason"] == "error" and failed["compute_s"] is None
    gone = to_row(decoder.decode(msgspec.json.encode(event(status=499))))
    assert gone["finish_reason"] == "cancelled"
