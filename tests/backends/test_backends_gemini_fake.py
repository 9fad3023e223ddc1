"""The fake Gemini API (fake_gemini.py) speaks Google's wire as the official `google-genai` SDK
expects it, at AI Studio's door and at Vertex AI's: text whole and streamed, usage, token counts,
function calls and their responses (Gemini 3's thought signatures carried back), refusals in
Google's error shape, blocked prompts; and it refuses, as Google does, what a translation gets
wrong."""

from collections.abc import Iterator
from typing import Any

import google.oauth2.credentials
import httpx
import msgspec
import pytest
from google import genai
from google.genai import errors, types

from tests.backends.conftest import control, stats

MODEL = "gemini-2.5-flash"
GEMINI_3 = "gemini-3-pro-preview"
WEATHER = types.Tool(
    function_declarations=[
        types.FunctionDeclaration(
            name="get_weather",
            description="The weather in a city",
            parameters=types.Schema(
                type=types.Type.OBJECT,
                properties={"city": types.Schema(type=types.Type.STRING)},
                required=["city"],
            ),
        )
    ]
)
MANUAL = types.AutomaticFunctionCallingConfig(disable=True)
TOOLS = types.GenerateContentConfig(tools=[WEATHER], automatic_function_calling=MANUAL)
ASK = {"contents": [{"role": "user", "parts": [{"text": "hello #chunks=2"}]}]}
KEY = {"x-goog-api-key": "k"}


@pytest.fixture
def studio(gemini_url: str) -> Iterator[genai.Client]:
    control(gemini_url, reset=True)
    options = types.HttpOptions(base_url=gemini_url, api_version="v1beta")
    client = genai.Client(api_key="k", http_options=options)
    yield client
    client.close()


def test_text_whole_with_usage(studio: genai.Client, gemini_url: str) -> None:
    reply = studio.models.generate_content(
        model=MODEL,
        contents="hi there #chunks=3 #thoughts=2 #cached=1",
        config=types.GenerateContentConfig(system_instruction="Be brief.", temperature=0.2),
    )
    assert reply.text == "w0 w1 w2 "  # the thought part is not the answer's text
    candidate = reply.candidates[0]  # type: ignore[index]
    parts = candidate.content.parts  # type: ignore[union-attr]
    assert [(p.text, p.thought) for p in parts] == [("thinking…", True), ("w0 w1 w2 ", None)]  # type: ignore[union-attr]
    assert candidate.finish_reason == types.FinishReason.STOP
    usage = reply.usage_metadata
    assert usage is not None
    assert (usage.prompt_token_count, usage.candidates_token_count) == (7, 3)  # both turns' words
    assert (usage.thoughts_token_count, usage.cached_content_token_count) == (2, 1)
    assert usage.total_token_count == 12
    assert (reply.model_version, reply.response_id) == (MODEL, "fake-response")
    seen = stats(gemini_url)
    assert (seen["cloud"], seen["model"], seen["verb"], seen["key"]) == (
        "studio",
        MODEL,
        "generateContent",
        "k",
    )
    assert seen["last_body"]["generationConfig"] == {"temperature": 0.2}
    assert seen["last_body"]["systemInstruction"]["parts"] == [{"text": "Be brief."}]


def test_text_streamed(studio: genai.Client, gemini_url: str) -> None:
    chunks = list(studio.models.generate_content_stream(model=MODEL, contents="hi #chunks=4"))
    assert [c.text for c in chunks] == ["w0 ", "w1 ", "w2 ", "w3 "]
    finishes = [c.candidates[0].finish_reason for c in chunks]  # type: ignore[index]
    assert finishes == [None, None, None, types.FinishReason.STOP]
    counts = [c.usage_metadata.candidates_token_count for c in chunks]  # type: ignore[union-attr]
    assert counts == [1, 2, 3, 4]  # the usage so far, in every event
    assert {c.usage_metadata.prompt_token_count for c in chunks} == {2}  # type: ignore[union-attr]
    assert (stats(gemini_url)["verb"], stats(gemini_url)["query"]) == (
        "streamGenerateContent",
        "alt=sse",
    )


def test_the_stream_on_the_wire(gemini_url: str) -> None:
    """CRLF-framed events; a call arrives whole in its own event, after the text."""
    route = f"{gemini_url}/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
    body = {
        "contents": [{"parts": [{"text": "#tool #chunks=2"}]}],
        "tools": [{"functionDeclarations": [{"name": "get_weather"}]}],
    }
    reply = httpx.post(route, json=body, headers=KEY)
    assert reply.headers["content-type"] == "text/event-stream"
    raw = reply.content
    assert raw.endswith(b"\r\n\r\n") and raw.count(b"data: ") == 3
    events = [msgspec.json.decode(e[6:]) for e in raw.split(b"\r\n\r\n") if e]
    parts = [e["candidates"][0]["content"]["parts"] for e in events]
    assert parts[:2] == [[{"text": "w0 "}], [{"text": "w1 "}]]
    call = parts[2][0]
    assert call["functionCall"] == {"name": "get_weather", "args": {"city": "Paris"}}
    assert "id" not in call["functionCall"] and call["thoughtSignature"]
    assert events[2]["candidates"][0]["finishReason"] == "STOP"  # Gemini has no tool reason


def test_count_tokens(studio: genai.Client, gemini_url: str) -> None:
    assert studio.models.count_tokens(model=MODEL, contents="one two three").total_tokens == 3
    assert stats(gemini_url)["last_body"] == {
        "contents": [{"parts": [{"text": "one two three"}], "role": "user"}]
    }
    route = f"{gemini_url}/v1beta/models/{MODEL}:countTokens"
    wrapped = {"generateContentRequest": {"model": f"models/{MODEL}", **ASK}}
    counted = httpx.post(route, json=wrapped, headers=KEY)
    assert counted.json() == {"totalTokens": 2}
    extra = _refusal(gemini_url, {**ASK, "model": MODEL}, f"/v1beta/models/{MODEL}:countTokens")
    assert extra["message"].endswith('Unknown name "model": Cannot find field.')


def test_a_gemini_3_call_needs_its_thought_signature_back(
    studio: genai.Client, gemini_url: str
) -> None:
    question = types.Content(role="user", parts=[types.Part(text="Weather in Paris? #tool")])
    first = studio.models.generate_content(model=GEMINI_3, contents=[question], config=TOOLS)
    turn = first.candidates[0].content  # type: ignore[index]
    call = turn.parts[-1]  # type: ignore[union-attr,index]
    assert call.function_call is not None and call.function_call.name == "get_weather"
    assert call.function_call.args == {"city": "Paris"} and call.function_call.id is None
    assert call.thought_signature == b"sig-get_weather"  # base64 on the wire, bytes in the SDK
    answer = types.Part.from_function_response(name="get_weather", response={"sky": "clear"})
    history = [question, turn, types.Content(role="user", parts=[answer])]  # type: ignore[list-item]
    second = studio.models.generate_content(model=GEMINI_3, contents=history, config=TOOLS)
    assert second.candidates  # the signature came back as issued: accepted
    sent = stats(gemini_url)["last_body"]["contents"]
    assert sent[1]["role"] == "model" and "thoughtSignature" in sent[1]["parts"][-1]
    assert sent[2]["parts"][0]["functionResponse"]["name"] == "get_weather"

    unsigned = turn.model_copy(deep=True)  # type: ignore[union-attr]
    unsigned.parts[-1].thought_signature = None  # type: ignore[index]
    with pytest.raises(errors.ClientError) as refused:
        studio.models.generate_content(
            model=GEMINI_3, contents=[question, unsigned, history[2]], config=TOOLS
        )
    assert refused.value.code == 400 and refused.value.status == "INVALID_ARGUMENT"
    assert "missing a thought_signature" in (refused.value.message or "")
    # an older model takes the unsigned history; no model takes an answer to an uncalled function
    studio.models.generate_content(model=MODEL, contents=[question, unsigned, history[2]])
    stray = types.Part.from_function_response(name="get_time", response={"t": 1})
    with pytest.raises(errors.ClientError, match="function response"):
        studio.models.generate_content(
            model=MODEL, contents=[question, turn, types.Content(role="user", parts=[stray])]
        )


def test_errors_in_googles_shape(studio: genai.Client) -> None:
    with pytest.raises(errors.ClientError) as limited:
        studio.models.generate_content(model=MODEL, contents="hi #status=429 #retry_after=2")
    assert (limited.value.code, limited.value.status) == (429, "RESOURCE_EXHAUSTED")
    with pytest.raises(errors.ServerError) as down:
        studio.models.generate_content(model=MODEL, contents="hi #status=503")
    assert (down.value.code, down.value.status) == (503, "UNAVAILABLE")
    stream = studio.models.generate_content_stream(model=MODEL, contents="#stream_error=2")
    received = []
    with pytest.raises(errors.ServerError) as broken:
        for chunk in stream:
            received.append(chunk.text)
    assert received == ["w0 ", "w1 "] and broken.value.message == "The model is overloaded."


def test_a_blocked_prompt(studio: genai.Client) -> None:
    reply = studio.models.generate_content(model=MODEL, contents="something bad #blocked")
    assert reply.candidates is None
    assert reply.prompt_feedback is not None
    assert reply.prompt_feedback.block_reason == types.BlockedReason.SAFETY
    assert reply.usage_metadata is not None and reply.usage_metadata.prompt_token_count == 3
    chunks = list(studio.models.generate_content_stream(model=MODEL, contents="bad #blocked"))
    assert len(chunks) == 1 and chunks[0].prompt_feedback is not None


def test_finish_reasons_candidates_and_logprobs(studio: genai.Client) -> None:
    config = types.GenerateContentConfig(candidate_count=2, response_logprobs=True, logprobs=2)
    reply = studio.models.generate_content(
        model=MODEL, contents="long #chunks=2 #finish=MAX_TOKENS", config=config
    )
    candidates = reply.candidates or []
    assert [c.index for c in candidates] == [0, 1]
    assert {c.finish_reason for c in candidates} == {types.FinishReason.MAX_TOKENS}
    assert reply.usage_metadata.candidates_token_count == 4  # type: ignore[union-attr]
    logprobs = candidates[0].logprobs_result
    assert logprobs is not None and candidates[0].avg_logprobs == -0.1
    assert [c.token for c in logprobs.chosen_candidates or []] == ["w0 ", "w1 "]
    assert [len(t.candidates or []) for t in logprobs.top_candidates or []] == [2, 2]


def _refusal(url: str, body: Any, path: str = "", headers: Any = KEY) -> dict[str, Any]:
    """The error of a raw request (by default a generateContent at AI Studio, with a key)."""
    route = url + (path or f"/v1beta/models/{MODEL}:generateContent")
    reply = httpx.post(route, json=body, headers=headers)
    assert reply.status_code >= 400, reply.text
    return {"code": reply.status_code, **reply.json()["error"]}


def _declaring(**declaration: Any) -> dict[str, Any]:
    return {**ASK, "tools": [{"functionDeclarations": [{"name": "f", **declaration}]}]}


def _configured(**config: Any) -> dict[str, Any]:
    return {**ASK, "generationConfig": config}


def _turns(*parts: Any) -> dict[str, Any]:
    return {"contents": [{"parts": [part]} for part in parts]}


CALLED = {"role": "model", "parts": [{"functionCall": {"name": "f", "id": "1"}}]}
ANSWERED = {"parts": [{"functionResponse": {"name": "f", "id": "2", "response": {}}}]}
UNANSWERED = {"parts": [{"functionResponse": {"name": "f"}}]}  # the response itself left out
JSON = "application/json"
WRONG: list[tuple[str, Any, str]] = [
    ("unknown field", {**ASK, "max_tokens": 5}, 'Unknown name "max_tokens": Cannot find field.'),
    ("Vertex's labels", {**ASK, "labels": {"a": "b"}}, 'Unknown name "labels"'),
    ("no contents", {"contents": []}, "contents is not specified"),
    (
        "OpenAI's role",
        {"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]},
        "valid role",
    ),
    ("no parts", {"contents": [{"role": "user", "parts": []}]}, "must not be empty"),
    ("empty text", _turns({"text": ""}), "required oneof field 'data'"),
    ("two data", _turns({"text": "a", "fileData": {"fileUri": "u"}}), "already set"),
    ("bad base64", _turns({"inlineData": {"mimeType": "a", "data": "%"}}), "Base64"),
    ("an uncalled answer", _turns({"functionResponse": {"name": "f", "response": {}}}), "turn"),
    ("no response", {"contents": [CALLED, UNANSWERED]}, "response' (TYPE_MESSAGE)"),
    ("another id", {"contents": [CALLED, ANSWERED]}, "function response turn"),
    ("both parameters", _declaring(parameters={}, parametersJsonSchema={}), "mutually exclusive"),
    ("$schema", _declaring(parameters={"$schema": "x"}), 'Unknown name "$schema" at \'tools[0]'),
    ("a numeric enum", _declaring(parameters={"type": "integer", "enum": [1]}), "enum"),
    ("a bad name", {**ASK, "tools": [{"functionDeclarations": [{"name": "1f"}]}]}, "Invalid func"),
    ("a mode", {**ASK, "toolConfig": {"functionCallingConfig": {"mode": "REQUIRED"}}}, "mode"),
    ("OpenAI's stop", _configured(stop=["x"]), "at 'generation_config'"),
    ("a stop string", _configured(stopSequences="x"), "stop_sequences"),
    ("six stops", _configured(stopSequences=list("abcdef")), "at most 5"),
    (
        "both schemas",
        _configured(responseMimeType=JSON, responseSchema={}, responseJsonSchema={}),
        "mutually exclusive",
    ),
    ("a schema, no JSON", _configured(responseJsonSchema={}), "mime"),
    ("thinking", _configured(thinkingConfig={"budget": 1}), "thinking_config"),
]


@pytest.mark.parametrize(("body", "why"), [w[1:] for w in WRONG], ids=[w[0] for w in WRONG])
def test_what_google_refuses(gemini_url: str, body: Any, why: str) -> None:
    refused = _refusal(gemini_url, body)
    assert (refused["code"], refused["status"]) == (400, "INVALID_ARGUMENT")
    assert why in refused["message"]


def test_routes_keys_and_streams(gemini_url: str) -> None:
    unregistered = _refusal(gemini_url, ASK, headers={})
    assert (unregistered["code"], unregistered["status"]) == (403, "PERMISSION_DENIED")
    assert "unregistered callers" in unregistered["message"]
    vertex = f"/v1/projects/p/locations/r/publishers/google/models/{MODEL}:generateContent"
    unsigned = _refusal(gemini_url, ASK, vertex)  # a key is no access token
    assert (unsigned["code"], unsigned["status"]) == (401, "UNAUTHENTICATED")
    lost = _refusal(gemini_url, ASK, f"/v1/models/{MODEL}:generateContent")
    assert (lost["code"], lost["status"]) == (404, "NOT_FOUND")
    arrays = _refusal(gemini_url, ASK, f"/v1beta/models/{MODEL}:streamGenerateContent")
    assert (arrays["code"], arrays["status"]) == (400, "INVALID_ARGUMENT")  # alt=sse or nothing
    labelled = httpx.post(
        gemini_url + vertex,
        json={**ASK, "labels": {"team": "a"}},
        headers={"authorization": "Bearer t"},
    )
    assert labelled.status_code == 200 and labelled.json()["candidates"]


def test_vertex_through_the_sdk(gemini_url: str) -> None:
    # google-genai sends a Vertex client with project, location and base_url to
    # {base_url}/{api_version}/projects/{project}/locations/{location}/publishers/google/models/…
    control(gemini_url, reset=True)
    client = genai.Client(
        vertexai=True,
        project="proj",
        location="us-central1",
        credentials=google.oauth2.credentials.Credentials(token="ya29.sdk"),  # type: ignore[no-untyped-call]
        http_options=types.HttpOptions(base_url=gemini_url, api_version="v1"),
    )
    config = types.GenerateContentConfig(labels={"team": "search"})
    reply = client.models.generate_content(model=MODEL, contents="hi #chunks=2", config=config)
    assert reply.text == "w0 w1 "
    seen = stats(gemini_url)
    assert (seen["cloud"], seen["project"], seen["region"]) == ("vertex", "proj", "us-central1")
    assert (seen["token"], seen["key"], seen["model"]) == ("ya29.sdk", "", MODEL)
    assert seen["last_body"]["labels"] == {"team": "search"}
    streamed = client.models.generate_content_stream(model=MODEL, contents="hi #chunks=3")
    assert "".join(c.text or "" for c in streamed) == "w0 w1 w2 "
    counted = client.models.count_tokens(
        model=MODEL,
        contents="one two three",
        config=types.CountTokensConfig(system_instruction="be brief"),
    )
    assert counted.total_tokens == 5
    assert stats(gemini_url)["verb"] == "countTokens"
    embedded = client.models.embed_content(
        model="text-embedding-005",
        contents=["one two", "three"],
        config=types.EmbedContentConfig(output_dimensionality=3),
    )
    assert [len(e.values or []) for e in embedded.embeddings or []] == [3, 3]
    assert embedded.embeddings is not None and embedded.embeddings[0].statistics is not None
    assert embedded.embeddings[0].statistics.token_count == 2
    assert stats(gemini_url)["verb"] == "predict"
    client.close()
    route = f"{gemini_url}/v1/projects/p/locations/r/publishers/google/models/{MODEL}:countTokens"
    raw = httpx.post(route, json=ASK, headers={"authorization": "Bearer t"})
    assert raw.json() == {"totalTokens": 2, "totalBillableCharacters": 14}  # no spaces


def test_embeddings_through_the_sdk(studio: genai.Client, gemini_url: str) -> None:
    embedded = studio.models.embed_content(
        model="gemini-embedding-001",
        contents=["one two", "three"],
        config=types.EmbedContentConfig(output_dimensionality=4, task_type="RETRIEVAL_DOCUMENT"),
    )
    vectors = [e.values for e in embedded.embeddings or []]
    assert [len(v or []) for v in vectors] == [4, 4] and vectors[0] != vectors[1]
    seen = stats(gemini_url)
    assert seen["verb"] == "batchEmbedContents"
    assert seen["last_body"]["requests"][0]["model"] == "models/gemini-embedding-001"
