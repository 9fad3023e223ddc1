"""The model catalog: every model the platform can serve, from one TOML file (`TOKENYARD_CATALOG`).

Each model names its provider and where it lives, its prices, context window, capability tier, the
tiers it may serve and its fallback chain. A commercial model whose API key is not in the
environment stays in the catalog as unavailable: listed by `/v1/models`, never routed to.
"""

import os
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import msgspec

from tokenyard.backends.fields import Provider as Wire
from tokenyard.backends.fields import Supports
from tokenyard.core.settings import Settings
from tokenyard.tenancy.limits import TAG

DEFAULT_CATALOG = Path(__file__).parent / "catalog.toml"
# azure: Azure OpenAI, OpenAI's API at a deployment's URL with an `api-key` header; vertex and
# bedrock: Anthropic's models on Google Cloud's Vertex AI and on Amazon Bedrock, their Messages API
# under those clouds' addresses; gemini: Google's Gemini API (AI Studio with a key; a deployment
# with provider vertex serves a Gemini model from Vertex AI); bedrock-converse: any model on
# Amazon Bedrock (Llama, Mistral, Nova, ...) through its Converse API
Provider = Literal[
    "self-hosted", "openai", "anthropic", "azure", "vertex", "bedrock", "gemini", "bedrock-converse"
]
Tier = Literal["interactive", "batch"]
# what the tokenyard engine does for any model it serves (constrained decoding: tools, schemas)
ENGINE_SUPPORTS = Supports(tools=True, structured_outputs=True, logprobs=True)
# what a model serves: chat (and legacy) completions, embeddings (/v1/embeddings), rankings of
# documents for a query (/v1/rerank: a cross-encoder's server, or Cohere's API), images from a
# prompt (/v1/images/generations), text from audio (/v1/audio/transcriptions and /translations)
# or audio from text (/v1/audio/speech): OpenAI's or Azure's image and audio models
Kind = Literal["chat", "embedding", "rerank", "image", "transcription", "speech"]
# the kinds only OpenAI's API serves (on OpenAI or Azure)
OPENAI_ONLY = ("image", "transcription", "speech")
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]
Seconds = Annotated[float, msgspec.Meta(ge=0)]
# what a deployment is, for teams that may use only some (tenancy's deployment_tags): "eu",
# "zero-retention", "hipaa"
Tag = Annotated[str, msgspec.Meta(pattern=f"^{TAG.pattern}$")]
# Azure's api-version goes into every request's query string: nothing that could end or extend it
ApiVersion = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9.\-]*$")]
Region = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9-]*$")]


class Price(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """US dollars per 1M tokens; audio models priced otherwise by the minute of audio they
    transcribe or by the 1M characters they speak."""

    input: float = 0.0
    cached_input: float = 0.0
    output: float = 0.0
    # prompt tokens written to the provider's prompt cache (Anthropic: 1.25x input for its
    # 5-minute cache); 0: the input price
    cache_write_input: float = 0.0
    audio_minute: float = 0.0  # per minute of audio transcribed (whisper-1: 0.006)
    characters: float = 0.0  # per 1M characters of text spoken (tts-1: 15.00)

    def cost(
        self,
        prompt_tokens: int,
        cached_tokens: int,
        completion_tokens: int,
        cache_write_tokens: int = 0,
        audio_seconds: float = 0.0,
        characters: int = 0,
    ) -> float:
        """Cached and cache-written tokens are part of the prompt tokens (OpenAI's usage
        convention)."""
        plain = max(0, prompt_tokens - cached_tokens - cache_write_tokens)
        return (
            plain * self.input
            + cached_tokens * self.cached_input
            + cache_write_tokens * (self.cache_write_input or self.input)
            + completion_tokens * self.output
            + characters * self.characters
        ) / 1e6 + audio_seconds / 60 * self.audio_minute

    @property
    def listed(self) -> dict[str, float]:
        """What a model card shows: every token price; the audio units only where they are set
        (a chat model is not "free per character")."""
        prices = msgspec.structs.asdict(self)
        return {k: v for k, v in prices.items() if v or k not in ("audio_minute", "characters")}

    @property
    def blended(self) -> float:
        """One number to order models by price: a 3:1 input:output mix."""
        return (3 * self.input + self.output) / 4


def wire_of(provider: Provider) -> Wire:
    """Azure OpenAI speaks OpenAI's API; Vertex AI's and Bedrock's Anthropic models, Anthropic's."""
    wires = {
        "azure": "openai",
        "vertex": "anthropic",
        "bedrock": "anthropic",
        "bedrock-converse": "converse",
    }
    return wires.get(provider, provider)  # type: ignore[return-value]


def serves_wire(provider: Provider, wire: Wire) -> bool:
    """Whether a deployment of this provider can serve a model speaking `wire`: Vertex AI serves
    Google's own Gemini models as well as Anthropic's."""
    return wire_of(provider) == wire or (provider == "vertex" and wire == "gemini")


# providers whose requests carry the cloud's own credentials, found where the platform runs
KEYLESS = ("vertex", "bedrock", "bedrock-converse")
# Amazon Bedrock's: each request signed for its region (SigV4), or a Bedrock API key
AWS = ("bedrock", "bedrock-converse")


class EntraAuth(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Azure: bearer tokens from Microsoft Entra ID in place of a key (backends/entra.py). All three
    set: that service principal; none: the identity the environment gives (DefaultAzureCredential:
    AZURE_* variables, Kubernetes workload identity, a managed identity)."""

    tenant_id: str = ""
    client_id: str = ""
    client_secret_env: str = ""  # the environment variable holding the client secret

    @property
    def ready(self) -> bool:
        """Its secret is in the environment, where it names one."""
        return not self.client_secret_env or bool(os.environ.get(self.client_secret_env))


class DeploymentEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One place a commercial model is served: an Azure region's deployment, another account or
    project with its own key and rate limits (LiteLLM's deployments of one model name). A model
    with several takes each request at one, by weight and load (backends/deployments.py)."""

    base_url: str
    api_key_env: str = ""
    entra: EntraAuth | None = None  # azure: Entra ID tokens in place of api_key_env
    # default: the model's; openai and azure may share a model (both speak OpenAI's wire)
    provider: Provider | None = None
    upstream_model: str = ""  # default: the model's
    api_version: ApiVersion = ""
    region: Region = ""  # Bedrock's: the AWS region its requests are signed for
    # its share of requests when the model is idle (say, in proportion to its tokens-per-minute
    # quota); under load, requests go where the fewest are in flight per unit of weight
    weight: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    # its own requests and tokens per minute (an Azure deployment's quota), every gateway's
    # together: at either, it is passed over until the next minute; 0: none
    rpm: Annotated[int, msgspec.Meta(ge=0)] = 0
    tpm: Annotated[int, msgspec.Meta(ge=0)] = 0
    name: str = ""  # in logs and metrics; default: the URL's host
    # where it is and what it promises (with the model's own): a team whose deployment_tags are
    # not all among them never has a request sent there
    tags: tuple[Tag, ...] = ()

    @property
    def api_key(self) -> str:
        return os.environ.get(self.api_key_env, "") if self.api_key_env else ""

    @property
    def live(self) -> bool:
        """Whether it can be called: its key or its Entra ID secret is in the environment (without
        a secret of its own, and on Vertex AI and Bedrock, whether the environment gives an
        identity shows at the first call)."""
        if self.provider in KEYLESS and not self.api_key_env:
            return True
        return self.entra.ready if self.entra is not None else bool(self.api_key)

    @property
    def label(self) -> str:
        return self.name or urlsplit(self.base_url).netloc or self.base_url


class ModelEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: str
    provider: Provider
    kind: Kind = "chat"
    # an embedding model whose server also ranks documents by their embeddings (ours does)
    rerank: bool = False
    upstream_model: str = ""  # the provider's name for it; empty: the id
    # self-hosted: one URL per engine replica; commercial: the API base (…/v1 for OpenAI)
    base_urls: tuple[str, ...] = ()
    api_key_env: str = ""  # commercial: the environment variable holding the key
    entra: EntraAuth | None = None  # azure: Entra ID tokens in place of api_key_env
    # Azure OpenAI with a deployment's URL (…/openai/deployments/NAME): the api-version its
    # requests name; empty with the v1 API's base URL (…/openai/v1), which takes none
    api_version: ApiVersion = ""
    # bedrock: the AWS region its requests are signed for (SigV4), as its base URL's
    region: Region = ""
    # commercial: where else it is served, in place of base_urls/api_key_env/api_version; the
    # deployments whose keys are set share its requests
    deployments: tuple[DeploymentEntry, ...] = ()
    price: Price = Price()  # list price
    # self-hosted: what one replica costs per hour, spread over the requests by engine time
    usd_per_hour: float = 0.0
    max_context: int = 0  # 0: ask the backend (the engine's /load)
    # what it can do (tools, structured outputs, logprobs, image input, reasoning): requests that
    # need more are routed elsewhere or refused (backends/fields.py)
    supports: Supports = Supports()
    # how an Anthropic model (on any cloud, Converse included) thinks: with a budget of tokens
    # (Claude 3.7 to 4.5), or adaptively, deciding how much itself (Claude Opus 4.6 and later;
    # Opus 4.7 and Claude 5 refuse a budget): reasoning_effort asks it in its own way
    thinking: Literal["budget", "adaptive"] = "budget"
    capability: int = 1  # higher answers harder prompts
    # model="auto" with a quality bar: the model of the router's data whose quality curve stands
    # for this one (router/quality.py) until ratings give it its own; with neither, never chosen
    quality_reference: str = ""
    tiers: tuple[Tier, ...] = ("interactive", "batch")
    fallbacks: tuple[str, ...] = ()  # tried in order when this model is saturated or down
    # models with larger windows, tried in order (each with its own fallbacks) only when this
    # model's context window cannot hold a request (LiteLLM's context_window_fallbacks): a long
    # prompt goes to a bigger, dearer model, but load and outages never send traffic there
    context_fallbacks: tuple[str, ...] = ()
    # requests and tokens per minute of every team's together (a provider's limits on the
    # platform's account, a replica set's capacity); past them, its fallbacks take requests;
    # 0: none
    rpm: int = 0
    tpm: int = 0
    # the request field that caps its output: OpenAI's reasoning models (o-series, GPT-5) refuse
    # max_tokens and take max_completion_tokens only
    max_tokens_param: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    # this model's own waits and tries, where the platform's (TOKENYARD_BACKEND_*) do not suit it
    # (LiteLLM's per-deployment timeout, stream_timeout, num_retries): a reasoning model thinks
    # for minutes before its first token; a slow provider deserves fewer tries. 0: the platform's
    first_token_timeout_s: Seconds = 0.0
    read_timeout_s: Seconds = 0.0
    retry_attempts: Annotated[int, msgspec.Meta(ge=0, le=10)] = 0
    # other names requests may use for it (a retired model's, a provider's dated snapshot's), so
    # clients keep working while the operator moves the name to another model
    aliases: tuple[str, ...] = ()
    # what every deployment (self-hosted: every replica) of it is: "eu", "zero-retention"; a team
    # with deployment_tags uses only deployments that carry them all
    tags: tuple[Tag, ...] = ()

    @property
    def name_upstream(self) -> str:
        return self.upstream_model or self.id

    @property
    def all_deployments(self) -> tuple[DeploymentEntry, ...]:
        """Commercial: every deployment, its provider, model name and api-version filled in (one
        from base_urls/api_key_env where it lists none)."""
        if self.provider == "self-hosted":
            return ()
        listed = self.deployments
        keyless = self.provider in KEYLESS  # the cloud's own credentials
        if not listed and self.base_urls and (self.api_key_env or self.entra or keyless):
            own = DeploymentEntry(
                self.base_urls[0],
                self.api_key_env,
                self.entra,
                api_version=self.api_version,
                region=self.region,
            )
            listed = (own,)
        return tuple(
            msgspec.structs.replace(
                d,
                provider=d.provider or self.provider,
                upstream_model=d.upstream_model or self.name_upstream,
                tags=tuple(dict.fromkeys(self.tags + d.tags)),
            )
            for d in listed
        )

    @property
    def live_deployments(self) -> tuple[DeploymentEntry, ...]:
        """The deployments it can call (`DeploymentEntry.live`)."""
        return tuple(d for d in self.all_deployments if d.live)

    def serves_tags(self, required: Iterable[str]) -> bool:
        """Whether a team that requires these tags can use it: every one is the model's
        (self-hosted) or some callable deployment's."""
        need = set(required)
        if not need or self.provider == "self-hosted":
            return need <= set(self.tags)
        return any(need <= set(d.tags) for d in self.live_deployments)

    @property
    def wire(self) -> Wire:
        """The API it speaks, which decides how each request field fares (backends/fields.py)."""
        return wire_of(self.provider)

    def serves(self, kind: Kind) -> bool:
        return self.kind == kind or (kind == "rerank" and self.kind == "embedding" and self.rerank)

    @property
    def configured(self) -> bool:
        """Whether the platform can call it at all: replicas known, or the API key present."""
        if self.provider == "self-hosted":
            return bool(self.base_urls)
        return bool(self.live_deployments)


class AutoRouting(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How `model="auto"` chooses: score below the threshold → the cheapest model; at or above →
    the cheapest model of at least `strong_capability`. With a quality bar: the cheapest model
    whose predicted quality on the prompt clears it."""

    strong_capability: int = 2
    # the platform defaults when a team sets none of quality bar, threshold and strong share:
    # the bar when set, else the share
    strong_share: Fraction = 0.3
    quality_bar: Fraction | None = None


class CatalogFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    models: tuple[ModelEntry, ...]
    auto: AutoRouting = AutoRouting()


class CatalogError(ValueError):
    pass


class Catalog:
    def __init__(self, spec: CatalogFile) -> None:
        self.models = {m.id: m for m in spec.models}
        self.auto = spec.auto
        if len(self.models) != len(spec.models):
            raise CatalogError("model ids must be unique")
        if "auto" in self.models:
            raise CatalogError('"auto" is the router, not a model id')
        for m in spec.models:
            for field in ("fallbacks", "context_fallbacks"):
                unknown = [f for f in getattr(m, field) if f not in self.models or f == m.id]
                if unknown:
                    raise CatalogError(f"{m.id}: unknown {field} {unknown}")
            _check_deployments(m)
            if m.rerank and m.kind != "embedding":
                raise CatalogError(f"{m.id}: only an embedding model reranks by its embeddings")
            if m.kind in OPENAI_ONLY and m.wire != "openai":
                raise CatalogError(f"{m.id}: a model of kind {m.kind} speaks OpenAI's API")
        self.aliases = {alias: m.id for m in spec.models for alias in m.aliases}
        named = [alias for m in spec.models for alias in m.aliases]
        clash = sorted({a for a in named if a in self.models or a == "auto" or named.count(a) > 1})
        if clash:
            raise CatalogError(f"aliases must name one model each, and no model id: {clash}")

    @classmethod
    def load(cls, path: Path | str = DEFAULT_CATALOG, engine_urls: str = "") -> "Catalog":
        try:
            raw = tomllib.loads(Path(path).read_text())
            spec = msgspec.convert(raw, CatalogFile)
        except (OSError, tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
            raise CatalogError(f"catalog {path}: {exc}") from exc
        return cls(_with_engine_urls(spec, engine_urls) if engine_urls else spec)

    def get(self, model_id: str) -> ModelEntry | None:
        return self.models.get(model_id)

    def resolve(self, name: str) -> str:
        """The model id an alias stands for; any other name as it is."""
        return self.aliases.get(name, name)

    def chain(self, model_id: str) -> list[str]:
        """The model and its fallbacks, transitively, each once, in the order to try them."""
        order: list[str] = []
        todo = [model_id]
        while todo:
            current = todo.pop(0)
            if current in order or current not in self.models:
                continue
            order.append(current)
            todo.extend(self.models[current].fallbacks)
        return order

    def by_price(self) -> list[ModelEntry]:
        return sorted(self.models.values(), key=lambda m: (m.price.blended, -m.capability))


def _check_deployments(m: ModelEntry) -> None:
    if m.deployments and (m.provider == "self-hosted" or m.base_urls or m.api_key_env or m.entra):
        raise CatalogError(
            f"{m.id}: deployments replace base_urls, api_key_env and entra (a self-hosted model's "
            "replicas are its base_urls)"
        )
    if m.provider != "self-hosted" and len(m.base_urls) > 1:
        raise CatalogError(f"{m.id}: one base URL per commercial model; several are deployments")
    labels = [d.label for d in m.all_deployments]
    if len(set(labels)) != len(labels):
        raise CatalogError(f"{m.id}: deployments need distinct names (or hosts): {labels}")
    for d in m.all_deployments:
        assert d.provider is not None  # filled in from the model's
        if d.provider == "self-hosted" or not serves_wire(d.provider, m.wire):
            raise CatalogError(f"{m.id}: deployment {d.label} speaks {d.provider}, not {m.wire}")
        if d.provider == "azure" and "/openai/deployments/" in d.base_url and not d.api_version:
            raise CatalogError(f"{m.id}: an Azure deployment's URL needs its api_version")
        if d.provider == "vertex" and (d.entra is not None or d.api_key_env):
            raise CatalogError(
                f"{m.id}: Vertex AI takes Google Cloud's credentials, not api_key_env or entra"
            )
        if d.provider in AWS and (d.entra is not None or not d.region):
            raise CatalogError(
                f"{m.id}: Bedrock needs its region (signed with AWS's credentials, or a Bedrock "
                "API key in api_key_env), not entra"
            )
        if d.provider not in KEYLESS and (d.entra is not None) == bool(d.api_key_env):
            raise CatalogError(f"{m.id}: deployment {d.label} needs api_key_env or entra, not both")
        if d.entra is not None and d.provider != "azure":
            raise CatalogError(f"{m.id}: entra authenticates to Azure only, not {d.provider}")
        named = [d.entra.tenant_id, d.entra.client_id, d.entra.client_secret_env] if d.entra else []
        if any(named) and not all(named):
            raise CatalogError(
                f"{m.id}: entra needs tenant_id, client_id and client_secret_env together"
            )


def parse_engine_urls(spec: str, default_model: str) -> dict[str, tuple[str, ...]]:
    """ "URL" or "MODEL=URL", comma-separated, a model repeated once per replica; a bare URL serves
    `default_model`."""
    replicas: dict[str, list[str]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, url = item.partition("=")
        replicas.setdefault(name if sep else default_model, []).append(url if sep else item)
    return {name: tuple(urls) for name, urls in replicas.items()}


def _with_engine_urls(spec: CatalogFile, engine_urls: str) -> CatalogFile:
    """`TOKENYARD_ENGINE_URLS` names the replicas of self-hosted models; a model it names that the
    catalog lacks is added as a self-hosted model with default settings."""
    self_hosted = [m.id for m in spec.models if m.provider == "self-hosted" and m.kind == "chat"]
    default = self_hosted[0] if self_hosted else "self-hosted"
    replicas = parse_engine_urls(engine_urls, default)
    models = [
        msgspec.structs.replace(m, base_urls=replicas[m.id]) if m.id in replicas else m
        for m in spec.models
    ]
    known = {m.id for m in spec.models}
    models += [
        ModelEntry(id=name, provider="self-hosted", base_urls=urls, supports=ENGINE_SUPPORTS)
        for name, urls in replicas.items()
        if name not in known
    ]
    return msgspec.structs.replace(spec, models=tuple(models))


def load_catalog(settings: Settings) -> Catalog:
    """The catalog the settings name; self-hosted replicas from `engine_urls`, else from the file,
    else the local servers: the engine (`engine_host`/`engine_port`) for the first self-hosted chat
    model, the embeddings server (`embeddings_host`/`embeddings_port`) for the first embedding
    one."""
    path = settings.catalog or DEFAULT_CATALOG
    catalog = Catalog.load(path, settings.engine_urls)
    if settings.engine_urls:
        return catalog
    local = {
        "chat": f"http://{settings.engine_host}:{settings.engine_port}",
        "embedding": f"http://{settings.embeddings_host}:{settings.embeddings_port}",
    }
    urls = []
    for kind, url in local.items():
        missing = [
            m
            for m in catalog.models.values()
            if m.provider == "self-hosted" and m.kind == kind and not m.base_urls
        ]
        if missing:
            urls.append(f"{missing[0].id}={url}")
    return Catalog.load(path, ",".join(urls)) if urls else catalog
