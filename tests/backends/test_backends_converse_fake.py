"""The fake Bedrock's Converse API, proven with botocore's own `bedrock-runtime` client: replies,
event streams, a tool round trip, the refusals Bedrock gives, SigV4."""

import base64
from typing import Any

import botocore.session
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, EventStreamError

from tests.backends.conftest import AWS_KEYS, control, stats

MODEL = "meta.llama3-1-70b-instruct-v1:0"
WEATHER = {
    "toolSpec": {
        "name": "weather",
        "description": "The weather in a city",
        "inputSchema": {"json": {"type": "object", "properties": {"city": {"type": "string"}}}},
    }
}
TOOLS = {"tools": [WEATHER], "toolChoice": {"auto": {}}}


def client(url: str, secret: str = AWS_KEYS["secret"]) -> Any:
    # no retries: a refusal reaches the test at once
    return botocore.session.get_session().create_client(
        "bedrock-runtime",
        region_name="us-west-2",
        endpoint_url=url,
        aws_access_key_id=AWS_KEYS["access"],
        aws_secret_access_key=secret,
        config=Config(retries={"total_max_attempts": 1}),
    )


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"text": text}]}


def refused(call: Any, **request: Any) -> ClientError:
    with pytest.raises(ClientError) as caught:
        call(modelId=MODEL, **request)
    return caught.value


def code(error: ClientError) -> tuple[int, str]:
    response: Any = error.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"]


def test_converse_answers_with_text_usage_and_a_stop_reason(bedrock_url: str) -> None:
    control(bedrock_url, reset=True)
    reply = client(bedrock_url).converse(
        modelId=MODEL,
        system=[{"text": "be brief"}],
        messages=[user("hello #chunks=3 #cached=1")],
        inferenceConfig={"maxTokens": 16, "temperature": 0.5, "stopSequences": ["END"]},
    )
    assert reply["output"]["message"] == {"role": "assistant", "content": [{"text": "w0 w1 w2 "}]}
    assert reply["stopReason"] == "end_turn" and reply["metrics"]["latencyMs"] == 5
    usage = reply["usage"]  # five words, one read from the cache
    assert (usage["inputTokens"], usage["cacheReadInputTokens"], usage["outputTokens"]) == (4, 1, 3)
    assert usage["totalTokens"] == 8
    seen = stats(bedrock_url)
    assert (seen["model"], seen["verb"], seen["auth"], seen["region"]) == (
        MODEL,
        "converse",
        "sigv4",
        "us-west-2",
    )
    assert seen["last_body"]["messages"] == [user("hello #chunks=3 #cached=1")]
    assert seen["requests"] == 1
    named = client(bedrock_url).converse(modelId=MODEL, messages=[user("hi #stop=max_tokens")])
    assert named["stopReason"] == "max_tokens"


def test_converse_stream_gives_bedrocks_events(bedrock_url: str) -> None:
    control(bedrock_url, reset=True)
    stream = client(bedrock_url).converse_stream(modelId=MODEL, messages=[user("hi #chunks=4")])
    events = list(stream["stream"])
    assert events[0] == {"messageStart": {"role": "assistant"}}
    pieces = [e["contentBlockDelta"]["delta"]["text"] for e in events if "contentBlockDelta" in e]
    assert "".join(pieces) == "w0 w1 w2 w3 "
    assert {"contentBlockStop": {"contentBlockIndex": 0}} in events
    assert events[-2] == {"messageStop": {"stopReason": "end_turn"}}
    usage = events[-1]["metadata"]["usage"]
    assert (usage["inputTokens"], usage["outputTokens"], usage["totalTokens"]) == (2, 4, 6)
    assert stats(bedrock_url)["verb"] == "converse-stream"


def test_a_tool_round_trip(bedrock_url: str) -> None:
    bedrock = client(bedrock_url)
    ask = user("weather in Paris? #tool #chunks=1")
    reply = bedrock.converse(modelId=MODEL, messages=[ask], toolConfig=TOOLS)
    assert reply["stopReason"] == "tool_use"
    turn = reply["output"]["message"]
    use = turn["content"][-1]["toolUse"]
    assert use == {"toolUseId": "tooluse_fake1", "name": "weather", "input": {"city": "Paris"}}
    streamed = bedrock.converse_stream(modelId=MODEL, messages=[ask], toolConfig=TOOLS)
    events = list(streamed["stream"])
    start = next(e["contentBlockStart"] for e in events if "contentBlockStart" in e)
    assert start == {
        "contentBlockIndex": 1,
        "start": {"toolUse": {"toolUseId": "tooluse_fake1", "name": "weather"}},
    }
    json = "".join(
        e["contentBlockDelta"]["delta"]["toolUse"]["input"]
        for e in events
        if "toolUse" in e.get("contentBlockDelta", {}).get("delta", {})
    )
    assert json == '{"city": "Paris"}'
    assert {"messageStop": {"stopReason": "tool_use"}} in events

    answer = {"toolResult": {"toolUseId": use["toolUseId"], "content": [{"json": {"c": 21}}]}}
    history = [ask, turn, {"role": "user", "content": [answer, {"text": "and so?"}]}]
    again = bedrock.converse(modelId=MODEL, messages=history, toolConfig=TOOLS)  # accepted
    assert again["stopReason"] == "tool_use"  # the history's #tool still asks for a call
    assert stats(bedrock_url)["last_body"]["messages"][2]["content"][0] == answer
    without = refused(bedrock.converse, messages=history)
    assert code(without) == (400, "ValidationException")
    assert "toolConfig field must be defined" in without.response["Error"]["Message"]
    stray = {"toolResult": {"toolUseId": "tooluse_other", "content": [{"text": "21"}]}}
    unknown = [ask, turn, {"role": "user", "content": [stray]}]
    assert code(refused(bedrock.converse, messages=unknown, toolConfig=TOOLS)) == (
        400,
        "ValidationException",
    )


def test_bedrocks_validation(bedrock_url: str) -> None:
    bedrock = client(bedrock_url)
    twice = refused(bedrock.converse, messages=[user("one"), user("two")])
    assert code(twice) == (400, "ValidationException")
    assert "alternate" in twice.response["Error"]["Message"]
    image = {"image": {"format": "png", "source": {"bytes": b"\x89PNG"}}}  # botocore: base64
    picture = bedrock.converse(
        modelId=MODEL, messages=[{"role": "user", "content": [{"text": "see"}, image]}]
    )
    assert picture["stopReason"] == "end_turn"
    assert stats(bedrock_url)["last_body"]["messages"][0]["content"][1]["image"]["source"] == {
        "bytes": base64.b64encode(b"\x89PNG").decode()
    }
    choice = {"tools": [WEATHER], "toolChoice": {"tool": {"name": "time"}}}
    assert code(refused(bedrock.converse, messages=[user("hi")], toolConfig=choice))[0] == 400
    starts = refused(bedrock.converse, messages=[{"role": "assistant", "content": [{"text": "x"}]}])
    assert code(starts) == (400, "ValidationException")


def test_refusals_and_stream_errors(bedrock_url: str) -> None:
    control(bedrock_url, reset=True)
    bedrock = client(bedrock_url)
    throttled = refused(bedrock.converse, messages=[user("hi #status=429")])
    assert code(throttled) == (429, "ThrottlingException")
    busy = refused(bedrock.converse_stream, messages=[user("hi #status=503")])
    assert code(busy) == (503, "ServiceUnavailableException")
    control(bedrock_url, fail_next=1, status=500)  # /control's faults reach Converse too
    assert code(refused(bedrock.converse, messages=[user("hi")])) == (
        500,
        "InternalServerException",
    )
    stream = bedrock.converse_stream(modelId=MODEL, messages=[user("hi #stream_error=2")])
    events = iter(stream["stream"])
    assert next(events) == {"messageStart": {"role": "assistant"}}
    assert "contentBlockDelta" in next(events)
    with pytest.raises(EventStreamError) as broken:
        next(events)
    assert broken.value.response["Error"]["Code"] == "serviceUnavailableException"
    wrong = refused(client(bedrock_url, "not/the/secret").converse, messages=[user("hi")])
    assert code(wrong) == (403, "AccessDeniedException")
