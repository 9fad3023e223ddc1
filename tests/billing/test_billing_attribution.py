"""Self-hosted attribution at the engine: each step's measured wall time is split across the
sequences in it by their share of the tokens processed, and the shares add up to the step time."""

from typing import Any

import pytest

from tests.engine.conftest import engine_factory, run_to_completion  # noqa: F401 - a fixture
from tokenyard.engine.sequence import GenerationRequest, SamplingParams


def test_attribution_sums_to_the_measured_step_time(engine_factory: Any) -> None:  # noqa: F811
    engine = engine_factory()
    steps: list[tuple[float, list[tuple[Any, int, float]]]] = []
    account = engine._account

    def measured(batch: Any, emitted: Any, elapsed: float) -> None:
        before = [(seq, n, seq.timings.compute) for seq, n in batch.items]
        account(batch, emitted, elapsed)
        steps.append((elapsed, [(s, n, s.timings.compute - c) for s, n, c in before]))

    engine._account = measured
    try:
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        requests = [
            GenerationRequest(f"attr-{i}", list(range(10, 10 + length)), params)
            for i, length in enumerate((5, 40, 120))
        ]
        requests.append(GenerationRequest("attr-n", list(range(20, 50)), params, n=2))
        outputs = run_to_completion(engine, requests)
    finally:
        del engine._account  # back to the class's method
    assert steps and any(len(shares) > 1 for _, shares in steps), "no step held two sequences"
    for elapsed, shares in steps:
        total = sum(n for _, n, _ in shares)
        assert sum(share for _, _, share in shares) == pytest.approx(elapsed, rel=1e-9)
        for _, n, share in shares:
            assert share == pytest.approx(elapsed * n / total, rel=1e-9)
    finished = [o.stats for outs in outputs.values() for o in outs if o.stats is not None]
    assert len(finished) == 5  # every sequence, both choices of n=2 included
    measured_total = sum(elapsed for elapsed, _ in steps)
    assert sum(s.compute for s in finished) == pytest.approx(measured_total, rel=1e-9)
