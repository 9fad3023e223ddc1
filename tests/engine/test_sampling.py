"""Sampler (seeds, truncation, penalties, min_tokens) and stop strings across token boundaries."""

import torch

from tokenyard.engine.detokenizer import IncrementalText
from tokenyard.engine.sampler import Sampler
from tokenyard.engine.sequence import GenerationRequest, SamplingParams, Sequence

EOS = 2
V = 50


def make_seq(seq_id=0, choice=0, prompt=(5, 6, 7), output=(), **params) -> Sequence:
    request = GenerationRequest("r", list(prompt), SamplingParams(**params))
    return Sequence(seq_id, request, choice, [*prompt, *output])


def logits(rows=1, seed=0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def draw(params: dict, n=20, seq_id=0, choice=0) -> list[int]:
    sampler = Sampler((EOS,), torch.device("cpu"))
    seq = make_seq(seq_id, choice, **params)
    return [sampler(logits(seed=i), [seq])[0].token_id for i in range(n)]


def test_greedy_is_argmax():
    x = logits()
    sampler = Sampler((EOS,), torch.device("cpu"))
    assert sampler(x.clone(), [make_seq(temperature=0.0)])[0].token_id == x.argmax().item()


def test_seed_reproduces_and_choices_differ():
    params = {"temperature": 1.0, "seed": 1234}
    assert draw(params) == draw(params)
    assert draw(params, choice=0) != draw(params, choice=1)
    assert draw({"temperature": 1.0, "seed": 1}) != draw({"temperature": 1.0, "seed": 2})


def test_top_k_one_and_tiny_top_p_are_greedy():
    greedy = [logits(seed=i).argmax().item() for i in range(20)]
    assert draw({"temperature": 1.5, "top_k": 1, "seed": 3}) == greedy
    assert draw({"temperature": 1.5, "top_p": 1e-6, "seed": 3}) == greedy
    assert draw({"temperature": 1.5, "min_p": 1.0, "seed": 3}) == greedy


def test_top_k_keeps_samples_inside_the_top_k():
    samples = draw({"temperature": 2.0, "top_k": 3, "seed": 9}, n=1)
    top3 = logits(seed=0)[0].topk(3).indices.tolist()
    assert samples[0] in top3
    many = [
        Sampler((EOS,), torch.device("cpu"))(logits(seed=0), [make_seq(temperature=2.0, top_k=3)])[
            0
        ]
        for _ in range(50)
    ]
    assert {s.token_id for s in many} <= set(top3)


def test_penalties_push_down_seen_tokens():
    x = torch.zeros(1, V)
    x[0, 10] = 1.0
    x[0, 11] = 0.9
    sampler = Sampler((EOS,), torch.device("cpu"))
    seq = make_seq(output=(10, 10), temperature=0.0, frequency_penalty=0.1)
    assert sampler(x.clone(), [seq])[0].token_id == 11
    seq = make_seq(output=(10,), temperature=0.0, presence_penalty=0.2)
    assert sampler(x.clone(), [seq])[0].token_id == 11
    seq = make_seq(prompt=(10,), temperature=0.0, repetition_penalty=1.2)  # prompt counts too
    assert sampler(x.clone(), [seq])[0].token_id == 11


def test_min_tokens_holds_back_eos_and_stop_tokens():
    x = torch.zeros(1, V)
    x[0, EOS] = 10.0
    x[0, 3] = 9.0
    x[0, 4] = 8.0
    sampler = Sampler((EOS,), torch.device("cpu"))
    seq = make_seq(temperature=0.0, min_tokens=2, stop_token_ids=[3])
    assert sampler(x.clone(), [seq])[0].token_id == 4
    seq = make_seq(output=(4, 4), temperature=0.0, min_tokens=2)
    assert sampler(x.clone(), [seq])[0].token_id == EOS


def test_logprobs_are_log_softmax_with_top_k():
    x = logits()
    sampler = Sampler((EOS,), torch.device("cpu"))
    out = sampler(x.clone(), [make_seq(temperature=0.0, logprobs=3)])[0]
    expected = torch.log_softmax(x[0], -1)
    assert abs(out.logprob - expected.max().item()) < 1e-6
    assert [t for t, _ in out.top_logprobs] == expected.topk(3).indices.tolist()


PIECES = {1: "Hel", 2: "lo, wo", 3: "rld", 4: "! END", 5: "ing", 6: "\u00e9"}


def decode(ids):
    return "".join(PIECES[i] for i in ids)


def feed(stop, ids):
    text = IncrementalText(stop)
    out = []
    for i in range(1, len(ids) + 1):
        out.append(text.add(decode, ids[:i]))
        if text.stopped:
            break
    out.append(text.flush())
    return out, text


def test_stop_string_across_token_boundaries_is_never_emitted():
    out, text = feed(["world"], [1, 2, 3, 4])
    assert "".join(out) == "Hello, "
    assert text.stopped
    assert all("wo" not in piece for piece in out)


def test_text_is_held_back_only_as_long_as_a_stop_could_start():
    out, text = feed(["xyz"], [1, 2, 3, 4])
    assert "".join(out) == "Hello, world! END"
    assert not text.stopped
    assert out[0] == "H"  # the last len("xyz") - 1 characters wait for the next token


def test_no_stop_strings_release_everything_at_once():
    out, _ = feed([], [1, 2, 5])
    assert out[:3] == ["Hel", "lo, wo", "ing"]


def test_a_row_whose_grammar_forbids_every_token_ends_at_eos():
    """A dead end of a grammar used to make sampling raise (every probability 0), which failed
    the step and every request in it; the row ends at EOS and its neighbours sample as before."""
    from tokenyard.engine.constraints import Masks

    x = logits(rows=2)
    bitmask = torch.full((2, (V + 31) // 32), -1, dtype=torch.int32)  # every token allowed
    bitmask[0] = 0  # row 0: none
    sampler = Sampler((EOS,), torch.device("cpu"))
    seqs = [make_seq(0, temperature=1.0, seed=3), make_seq(1, temperature=0.0)]
    out = sampler.verify(x.clone(), seqs, [[], []], Masks(bitmask, [0, 1], unpack=True))
    assert out[0][0].token_id == EOS
    assert out[1][0].token_id == x[1].argmax().item()


def test_allowed_tokens_and_bad_words_shape_every_draw():
    """allowed_token_ids: only those are drawn; bad_words: a one-token word never, a longer one's
    last token only right after the rest of it; every token banned: the row ends at EOS."""
    allowed = draw({"temperature": 2.0, "seed": 5, "allowed_token_ids": [3, 17, 40]}, n=40)
    assert set(allowed) <= {3, 17, 40} and len(set(allowed)) > 1
    greedy = logits(seed=0)[0].argmax().item()
    sampler = Sampler((EOS,), torch.device("cpu"))
    banned = make_seq(temperature=0.0, bad_words_ids=[[greedy]])
    assert sampler(logits(seed=0), [banned])[0].token_id != greedy
    prefix = make_seq(temperature=0.0, output=(9, 11), bad_words_ids=[[11, greedy]])
    assert sampler(logits(seed=0), [prefix])[0].token_id != greedy
    other = make_seq(temperature=0.0, output=(11, 9), bad_words_ids=[[11, greedy]])
    assert sampler(logits(seed=0), [other])[0].token_id == greedy
    stuck = make_seq(temperature=0.7, allowed_token_ids=[4], bad_words_ids=[[4]])
    assert sampler(logits(seed=0), [stuck])[0].token_id == EOS


def test_a_kept_stop_string_ends_the_text():
    text = IncrementalText(["END"], include_stop=True)
    pieces = ["Hello E", "N", "D and more"]
    out = "".join(
        text.add(lambda ids: "".join(pieces[i] for i in ids), list(range(n + 1))) for n in range(3)
    )
    assert out + text.flush() == "Hello END" and text.matched == "END"
