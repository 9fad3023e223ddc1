"""Audio through the gateway, against the fake OpenAI, with OpenAI's own client: speech relayed
as the provider's bytes and charged by its characters; transcriptions and translations sent on as
multipart forms, charged by the minute (whisper-1, by the seconds the reply states, else by the
file's own length) or by tokens; bad forms refused before anything is sent."""

import io
import time
import warnings
import wave
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.backends.conftest import stats
from tests.gateway.conftest import wait_until
from tests.gateway.test_gateway_providers import (
    OPENAI_KEY,
    _gateway,
    providers,  # noqa: F401 - a fixture
    settled,
)
from tests.guard.conftest import Texts, classifier, texts  # noqa: F401 - fixtures
from tokenyard.gateway.audio import FALLBACK_BYTES_PER_S, MAX_AUDIO_BYTES, duration_s
from tokenyard.guard import store
from tokenyard.guard.policy import DEFAULT, apply, parse_change
from tokenyard.tenancy import keys

TTS_PRICE, WHISPER_PRICE = 15.0, 0.006  # per 1M characters; per minute


def audio_models(openai_url: str) -> str:
    def model(name: str, upstream: str, kind: str, price: str) -> str:
        return f"""
[[models]]
id = "{name}"
provider = "openai"
kind = "{kind}"
upstream_model = "{upstream}"
base_urls = ["{openai_url}/v1"]
api_key_env = "{OPENAI_KEY}"
price = {{ {price} }}
"""

    return (
        model("tts-fake", "tts-1", "speech", f"characters = {TTS_PRICE}")
        + model("whisper-fake", "whisper-1", "transcription", f"audio_minute = {WHISPER_PRICE}")
        + model(
            "transcribe-fake",
            "gpt-4o-mini-transcribe",
            "transcription",
            "input = 3.0, output = 5.0",
        )
    )


@pytest.fixture
def gw(start_gateway: Any, providers: dict[str, str], tmp_path: Path) -> Any:  # noqa: F811
    return _gateway(start_gateway, providers, tmp_path, audio_models(providers["openai"]))


def wav(seconds: float, rate: int = 16_000) -> bytes:
    """Silence as a 16-bit mono WAV file."""
    out = io.BytesIO()
    with wave.open(out, "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(2)
        audio.setframerate(rate)
        audio.writeframes(b"\0\0" * round(seconds * rate))
    return out.getvalue()


def records(gw: Any, key: str, count: int) -> list[dict[str, Any]]:
    """The team's newest `count` usage records, oldest first, once all are written."""

    def logged() -> list[dict[str, Any]]:
        answer = httpx.get(
            gw.url + "/v1/usage/requests", headers={"authorization": f"Bearer {key}"}
        )
        return answer.json()["data"]

    wait_until(lambda: len(logged()) >= count, 10, f"{count} requests recorded")
    return logged()[:count][::-1]


def test_audio_lengths_come_from_the_files_header_else_from_its_size() -> None:
    assert duration_s(wav(1.5)) == pytest.approx(1.5)
    assert duration_s(wav(0.25, rate=8000)) == pytest.approx(0.25)
    unknown = b"\x1a\x45\xdf\xa3" + b"\x00" * 31_996  # a WebM's magic: no header tinytag reads
    assert duration_s(unknown) == pytest.approx(32_000 / FALLBACK_BYTES_PER_S)
    assert duration_s(b"RIFF" + b"\xff" * 40) == pytest.approx(44 / FALLBACK_BYTES_PER_S)


def test_speech_is_the_providers_audio_charged_by_its_characters(
    gw: Any,
    team: Any,
    providers: dict[str, str],  # noqa: F811
    sql: Any,
    redis_server: Any,
    texts: Texts,  # noqa: F811
) -> None:
    """OpenAI's client gets the audio bytes as the provider sent them, in the asked format; the
    request is charged its characters at the model's price; the end user is recorded but not sent
    on; a chat model serves no speech and a speech model no chat; the SSE form, a key without the
    `audio` scope and a text the team's guard blocks are refused before anything is sent."""
    name, key = team()
    client = gw.client(key)
    said = "Hello there, team: the build is green."
    spoken = client.audio.speech.with_raw_response.create(
        model="tts-fake", voice="alloy", input=said, extra_body={"user": "u-7"}
    )
    assert spoken.headers["content-type"] == "audio/mpeg"
    assert spoken.headers["x-tokenyard-model"] == "tts-fake"
    assert spoken.content == b"ID3\x04\x00\x00" + b"\x00" * len(said)
    sent = stats(providers["openai"])
    assert sent["last_path"] == "/v1/audio/speech"
    assert sent["last_body"] == {"model": "tts-1", "input": said, "voice": "alloy"}
    as_wav = client.audio.speech.create(
        model="tts-fake", voice="nova", input="Two.", response_format="wav", speed=1.25
    )
    assert as_wav.content.startswith(b"RIFF")
    first, second = records(gw, key, 2)
    assert (first["characters"], first["end_user"], first["status"]) == (len(said), "u-7", 200)
    assert first["cost_usd"] == pytest.approx(len(said) * TTS_PRICE / 1e6)
    assert (first["prompt_tokens"], first["completion_tokens"]) == (0, 0)
    assert second["characters"] == 4
    card = client.models.retrieve("tts-fake").model_extra or {}
    assert card["pricing"] == {"input": 0.0, "cached_input": 0.0, "output": 0.0} | {
        "cache_write_input": 0.0,
        "characters": TTS_PRICE,
    }
    with pytest.raises(openai.NotFoundError, match="speech only"):
        client.chat.completions.create(
            model="tts-fake", messages=[{"role": "user", "content": "hi"}]
        )
    with pytest.raises(openai.NotFoundError, match="chat and completions only"):
        client.audio.speech.create(model="gpt-fake", voice="alloy", input="hi")
    before = stats(providers["openai"])["requests"]
    with pytest.raises(openai.BadRequestError) as sse:
        client.audio.speech.create(model="tts-fake", voice="alloy", input="hi", stream_format="sse")
    assert sse.value.body["param"] == "stream_format"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as long:
        client.audio.speech.create(model="tts-fake", voice="alloy", input="x" * 4097)
    assert long.value.body["param"] == "input"  # type: ignore[index]
    restricted = keys.create_key(sql, name, limits={"scopes": "completions"}).key
    with pytest.raises(openai.PermissionDeniedError) as refused:
        gw.client(restricted).audio.speech.create(model="tts-fake", voice="alloy", input="hi")
    assert refused.value.code == "insufficient_scope"
    # a team whose policy blocks (set before its first request: gateways cache a team's policy)
    strict, strict_key = team()
    store.write_policy(sql, strict, apply(DEFAULT, [parse_change("input.*=block")]))
    with pytest.raises(openai.BadRequestError) as blocked:
        gw.client(strict_key).audio.speech.create(
            model="tts-fake", voice="alloy", input=texts.harmful
        )
    assert blocked.value.code == "content_policy_violation"
    assert stats(providers["openai"])["requests"] == before  # nothing was spoken, or paid for
    settled(redis_server, name)
    settled(redis_server, strict)


def test_speech_is_relayed_as_it_is_made_and_a_cut_is_the_clients_error(
    gw: Any,
    team: Any,
    redis_server: Any,
) -> None:
    """Audio reaches the client as the provider makes it, not once it is whole; a provider that
    drops the connection mid-audio drops the client's too (never a short file that looks whole),
    and the request is still charged its characters, as the provider charges them."""
    name, key = team()
    said = "A long answer, read aloud. #chunks=3 #delay=0.5"
    started = time.perf_counter()
    with gw.client(key).audio.speech.with_streaming_response.create(
        model="tts-fake", voice="alloy", input=said
    ) as response:
        assert response.headers["content-type"] == "audio/mpeg"
        arrivals = [(time.perf_counter() - started, piece) for piece in response.iter_bytes()]
    assert b"".join(piece for _, piece in arrivals) == b"ID3\x04\x00\x00" + b"\x00" * len(said)
    # two half-second pauses between the provider's pieces: the first came well before the last
    assert arrivals[-1][0] - arrivals[0][0] > 0.8
    cut = "Cut short. #chunks=4 #cut=2"
    url, auth = gw.url + "/v1/audio/speech", {"authorization": f"Bearer {key}"}
    asked = {"model": "tts-fake", "voice": "alloy", "input": cut}
    with httpx.stream("POST", url, json=asked, headers=auth, timeout=30) as streamed:
        assert streamed.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            b"".join(streamed.iter_bytes())
    whole, broken = records(gw, key, 2)
    assert (whole["status"], whole["characters"]) == (200, len(said))
    assert (broken["status"], broken["characters"]) == (502, len(cut))
    assert broken["cost_usd"] == pytest.approx(len(cut) * TTS_PRICE / 1e6)
    settled(redis_server, name)


def test_transcriptions_are_forms_charged_by_the_minute_or_by_their_tokens(
    gw: Any,
    team: Any,
    providers: dict[str, str],  # noqa: F811
    redis_server: Any,
) -> None:
    """whisper-1 is charged the seconds its reply states (json, verbose_json), else the file's
    own length (text, SRT, VTT); a token-priced model its tokens; the form reaches the provider
    with the provider's model name, every field (repeated ones repeated) and the file as sent."""
    name, key = team()
    client = gw.client(key)
    audio = wav(1.5)
    heard = client.audio.transcriptions.with_raw_response.create(
        model="whisper-fake", file=("memo.wav", audio, "audio/wav"), language="en"
    )
    assert heard.headers["x-tokenyard-model"] == "whisper-fake"
    assert heard.parse().text == "the fake heard 1.5 seconds"
    sent = stats(providers["openai"])
    assert sent["last_path"] == "/v1/audio/transcriptions"
    assert sent["last_body"] == {
        "model": "whisper-1",
        "language": "en",
        "file": {"filename": "memo.wav", "content_type": "audio/wav", "size": len(audio)}
        | {"seconds": 1.5},
    }
    plain = client.audio.transcriptions.create(
        model="whisper-fake", file=("memo.wav", audio), response_format="text"
    )
    assert plain.strip() == "the fake heard 1.5 seconds"
    verbose = client.audio.transcriptions.create(
        model="whisper-fake",
        file=("memo.wav", audio),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )
    assert verbose.duration == pytest.approx(1.5)
    assert stats(providers["openai"])["last_body"]["timestamp_granularities[]"] == [
        "word",
        "segment",
    ]
    with warnings.catch_warnings():  # the SDK marks translations deprecated; OpenAI serves them
        warnings.simplefilter("ignore", DeprecationWarning)
        translated = client.audio.translations.create(
            model="whisper-fake", file=("memo.wav", audio)
        )
    assert translated.text == "the fake heard 1.5 seconds"
    assert stats(providers["openai"])["last_path"] == "/v1/audio/translations"
    srt = client.audio.transcriptions.create(
        model="whisper-fake", file=("memo.wav", audio), response_format="srt"
    )
    assert srt.startswith("1\n00:00:00,000 --> 00:00:01,500\n")
    tokens = client.audio.transcriptions.create(
        model="transcribe-fake", file=("memo.wav", audio), prompt="a build status memo"
    )
    assert tokens.text.startswith("the fake heard")
    whole, text, stated, translation, as_srt, by_tokens = records(gw, key, 6)
    # json and verbose_json: the 2 seconds whisper-1 reports (it rounds up); text and SRT: the
    # file's own 1.5
    settled_seconds = ((whole, 2.0), (text, 1.5), (stated, 2.0), (translation, 2.0), (as_srt, 1.5))
    for record, seconds in settled_seconds:
        assert record["audio_seconds"] == pytest.approx(seconds)
        assert record["cost_usd"] == pytest.approx(seconds / 60 * WHISPER_PRICE)
    # 15 audio tokens and the prompt's 4 words in, the transcript's 5 words out
    assert (by_tokens["prompt_tokens"], by_tokens["completion_tokens"]) == (19, 5)
    assert by_tokens["cost_usd"] == pytest.approx((19 * 3.0 + 5 * 5.0) / 1e6)
    assert by_tokens["audio_seconds"] == pytest.approx(1.5)
    settled(redis_server, name)


def test_a_streamed_transcript_arrives_as_its_events_charged_by_their_usage(
    gw: Any,
    team: Any,
    providers: dict[str, str],  # noqa: F811
    redis_server: Any,
) -> None:
    """A gpt-4o transcription asked with stream=true: OpenAI's client reads its delta events and
    the done event with the usage, which settles the request (tokens; the file's seconds kept)."""
    name, key = team()
    events = list(
        gw.client(key).audio.transcriptions.create(
            model="transcribe-fake", file=("memo.wav", wav(1.5), "audio/wav"), stream=True
        )
    )
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert "".join(deltas) == "the fake heard 1.5 seconds"
    done = events[-1]
    assert done.type == "transcript.text.done" and done.usage is not None
    assert stats(providers["openai"])["last_body"]["stream"] == "true"
    (record,) = records(gw, key, 1)
    assert (record["prompt_tokens"], record["completion_tokens"], record["stream"]) == (15, 5, True)
    assert record["audio_seconds"] == pytest.approx(1.5)  # the 5 output tokens: the reported
    assert record["cost_usd"] == pytest.approx((15 * 3.0 + 5 * 5.0) / 1e6)
    settled(redis_server, name)


def test_bad_audio_forms_are_refused_before_anything_is_sent(
    gw: Any,
    team: Any,
    providers: dict[str, str],  # noqa: F811
    redis_server: Any,
) -> None:
    """No file, no model, a streamed translation, a file over 25 MB, a second file and a model
    of another kind are the gateway's 400s (413 for the size), in OpenAI's shape; a file the
    provider cannot read is the provider's 400, charged nothing."""
    name, key = team()
    url, auth = gw.url + "/v1/audio/transcriptions", {"authorization": f"Bearer {key}"}
    audio = ("a.wav", wav(0.5), "audio/wav")
    before = stats(providers["openai"])["requests"]

    def refused(status: int, param: str, **form: Any) -> None:
        answer = httpx.post(url, headers=auth, timeout=30, **form)
        assert answer.status_code == status, answer.text
        error = answer.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error"

    refused(400, "file", data={"model": "whisper-fake"})
    refused(400, "model", files={"file": audio})
    translations = gw.url + "/v1/audio/translations"
    streamed = {"model": "whisper-fake", "stream": "true"}
    answer = httpx.post(translations, headers=auth, data=streamed, files={"file": audio})
    assert (answer.status_code, answer.json()["error"]["param"]) == (400, "stream")
    refused(400, "tier", data={"model": "whisper-fake", "tier": "gold"}, files={"file": audio})
    two = [("file", audio), ("other", audio)]
    refused(400, "other", data={"model": "whisper-fake"}, files=two)
    huge = ("big.wav", b"\0" * (MAX_AUDIO_BYTES + 1), "audio/wav")
    refused(413, "file", data={"model": "whisper-fake"}, files={"file": huge})
    refused(404, "model", data={"model": "gpt-fake"}, files={"file": audio})
    assert stats(providers["openai"])["requests"] == before
    client = gw.client(key)
    with pytest.raises(openai.BadRequestError, match="Invalid file format"):
        client.audio.transcriptions.create(model="whisper-fake", file=("a.ogg", b"OggS" * 100))
    (record,) = records(gw, key, 1)
    assert (record["status"], record["cost_usd"], record["audio_seconds"]) == (400, 0.0, 0.0)
    settled(redis_server, name)
