"""Audio uploads (/v1/audio/transcriptions and /translations): the multipart form read into a
Parsed that carries its file, and the audio's length, which duration-priced models (whisper-1)
are charged by where the provider's reply does not say it (its text, SRT and VTT formats)."""

import io
import math

import anyio
import msgspec
from litestar import Request
from litestar.datastructures import UploadFile
from tinytag import TinyTag, TinyTagException

from tokenyard.backends.base import Upload
from tokenyard.core.errors import GatewayError
from tokenyard.core.usage import Usage
from tokenyard.gateway.validation import Kind, Parsed, Tier, client_request_id, convert

MAX_AUDIO_BYTES = 25 * 1024 * 1024  # OpenAI's limit on an uploaded audio file
MAX_FORM_BYTES = MAX_AUDIO_BYTES + 1024 * 1024  # the form around it: its other fields
# a file whose length no header gives (WebM, or damaged) is taken as 128 kbit/s audio, a
# common encoding, to price and hold it by
FALLBACK_BYTES_PER_S = 16_000
# audio tokens held per second before a token-priced model (gpt-4o-transcribe) reports its own
TOKENS_PER_S = 10


class _Own(msgspec.Struct):
    """The gateway's own fields of the form, as of a JSON request: never sent on."""

    tier: Tier | None = None
    priority: Tier | None = None
    request_id: str | None = None


def duration_s(content: bytes) -> float:
    """The audio's length in seconds, from its header (MP3, MP4/M4A, Ogg/Opus, FLAC, WAV,
    AIFF, WMA), else from its size at FALLBACK_BYTES_PER_S."""
    try:
        found = TinyTag.get(file_obj=io.BytesIO(content)).duration
    except (TinyTagException, OSError, ValueError, EOFError):
        found = None
    if found is None or not math.isfinite(found) or found <= 0:
        return len(content) / FALLBACK_BYTES_PER_S
    return float(found)


async def read_form(request: Request, kind: Kind) -> Parsed:
    """A transcription or translation request: its form's fields (repeated ones as lists) to
    send on, its file, and the audio's length."""
    try:
        form = await request.form()
    except UnicodeDecodeError:  # a text field that is not UTF-8 (Litestar decodes them)
        raise GatewayError(400, "the form's fields must be UTF-8") from None
    fields: dict[str, str | list[str]] = {}
    upload = None
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            if name != "file" or upload is not None:
                raise GatewayError(400, "the form takes one file, as `file`", param=name)
            upload = value
        elif name in fields:
            held = fields[name]
            fields[name] = [*held, value] if isinstance(held, list) else [held, value]
        else:
            fields[name] = value
    model = fields.get("model")
    if not isinstance(model, str) or not model:
        raise GatewayError(400, "you must provide a model parameter", param="model")
    if upload is None:
        raise GatewayError(400, "an audio file is required", param="file")
    content = await upload.read()
    if not content:
        raise GatewayError(400, "the audio file is empty", param="file")
    if len(content) > MAX_AUDIO_BYTES:
        message = f"the audio file is {len(content)} bytes, over the {MAX_AUDIO_BYTES} allowed"
        raise GatewayError(413, message, code="file_too_large", param="file")
    stream = str(fields.get("stream", "false")).lower() == "true"
    if stream and kind == "translation":
        raise GatewayError(400, "translations do not stream", param="stream")
    own = convert(
        {name: fields.pop(name) for name in _Own.__struct_fields__ if name in fields}, _Own
    )
    seconds = await anyio.to_thread.run_sync(duration_s, content)
    prompt = fields.get("prompt")
    prompt_tokens = math.ceil(len(prompt.encode()) / 4) if isinstance(prompt, str) else 0
    return Parsed(
        model=model,
        body=fields,
        # its events as the provider sends them, the last (transcript.text.done) with the usage
        stream=stream,
        include_usage=stream,
        prompt_sizes=[prompt_tokens + math.ceil(seconds * TOKENS_PER_S)],
        max_tokens=0,
        n=1,
        tier=own.tier or own.priority,
        client_request_id=client_request_id(own.request_id, "request_id"),
        upload=Upload(
            upload.filename or "audio", content, upload.content_type or "application/octet-stream"
        ),
        metered=Usage(audio_seconds=seconds),
    )
