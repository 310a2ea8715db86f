"""Provider replay: reasoning re-sent per route, fields a route rejected, who owns Codex input.

Everything is a pure function except the in-memory rejection memo; nothing opens a database.

:func:`route_reasoning_carriers` turns a stored replay list into what a provider receives.
Each assistant turn re-sends its reasoning in the fields its route reads
(:data:`REASONING_ROUTES`), each from its own stored value, so replay is byte-identical. The
route is matched by provider name, then ``base_url`` host, then a local host, then model
family, else :data:`DEFAULT_ROUTE`. Nothing else leaves the process: uids, runtime keys and
row metadata are dropped.

:class:`ReasoningFieldMemo` remembers carriers an endpoint refused, and
:func:`send_with_reasoning_retry` retries once without them. :func:`suppress_turn_start_echo`
drops Codex's echo of an input the agent already stored."""

from __future__ import annotations

import copy
import ipaddress
import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit


__all__ = [
    "CARRIER_FIELDS",
    "PROVIDER_KEYS",
    "REASONING_ROUTES",
    "DEFAULT_ROUTE",
    "REJECTION_PATTERNS",
    "ReasoningRoute",
    "ReasoningFieldMemo",
    "resolve_reasoning_route",
    "route_reasoning_carriers",
    "rejected_carrier_fields",
    "rejected_fields_in",
    "send_with_reasoning_retry",
    "rich_input_to_text",
    "suppress_turn_start_echo",
    "gateway_should_persist",
]

T = TypeVar("T")

# ---------------------------------------------------------------------------------------------
# Reasoning carriers per route
# ---------------------------------------------------------------------------------------------

REASONING: Final = "reasoning"
REASONING_CONTENT: Final = "reasoning_content"
REASONING_DETAILS: Final = "reasoning_details"

#: The three message fields that can carry reasoning to a provider.
CARRIER_FIELDS: Final[frozenset[str]] = frozenset({REASONING, REASONING_CONTENT, REASONING_DETAILS})

#: The only non-reasoning keys a provider ever receives.
PROVIDER_KEYS: Final[tuple[str, ...]] = ("role", "content", "tool_calls", "tool_call_id", "name")

#: What a padded tool-call turn carries in ``reasoning_content``.
PADDING: Final = " "

_GATEWAY = frozenset({REASONING_CONTENT, REASONING, REASONING_DETAILS})
_DETAILS = frozenset({REASONING_DETAILS})
_TEXT = frozenset({REASONING})
_CONTENT = frozenset({REASONING_CONTENT})
_NONE: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ReasoningRoute:
    """One row of the route table: how it is recognised and which fields it reads."""

    name: str
    carriers: frozenset[str]
    pad_tool_calls: bool = False
    providers: frozenset[str] = frozenset()
    hosts: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    path_prefix: str | None = None


def _route(
    name: str,
    carriers: frozenset[str],
    *,
    providers: Iterable[str] = (),
    hosts: Iterable[str] = (),
    models: Iterable[str] = (),
    pad: bool = False,
    path_prefix: str | None = None,
) -> ReasoningRoute:
    return ReasoningRoute(
        name=name,
        carriers=carriers,
        pad_tool_calls=pad,
        providers=frozenset(providers),
        hosts=tuple(hosts),
        models=tuple(models),
        path_prefix=path_prefix,
    )


#: The route table, in matching order (see :func:`resolve_reasoning_route`).
REASONING_ROUTES: Final[tuple[ReasoningRoute, ...]] = (
    _route("openrouter", _GATEWAY, providers={"openrouter"}, hosts=("openrouter.ai",)),
    _route("kilo", _GATEWAY, providers={"kilo", "kilocode", "kilo-code"}, hosts=("kilo.ai",)),
    _route(
        "vercel-ai-gateway",
        _GATEWAY,
        providers={"vercel", "ai-gateway", "vercel-ai-gateway"},
        hosts=("ai-gateway.vercel.sh",),
    ),
    _route(
        "nous-portal",
        _GATEWAY,
        providers={"nous", "nous-portal", "nousresearch"},
        hosts=("nousresearch.com",),
    ),
    _route("novita", _DETAILS, providers={"novita", "novita-ai"}, hosts=("novita.ai",)),
    _route(
        "minimax",
        _DETAILS,
        providers={"minimax", "minimax-cn"},
        hosts=("minimax.io", "minimaxi.com", "minimax.chat"),
        path_prefix="/v1",
    ),
    _route("tokenhub", _DETAILS, providers={"tokenhub", "tencent-tokenhub"}),
    _route(
        "local",
        _TEXT,
        providers={"local", "lmstudio", "lm-studio", "llamacpp", "llama-cpp", "llama.cpp",
                   "vllm", "sglang"},
    ),
    _route("ollama", _TEXT, providers={"ollama", "ollama-cloud"}, hosts=("ollama.com",)),
    _route("upstage", _TEXT, providers={"upstage"}, hosts=("upstage.ai",)),
    _route("mistral", _NONE, providers={"mistral", "mistralai"}, hosts=("mistral.ai",)),
    _route("groq", _NONE, providers={"groq"}, hosts=("groq.com",)),
    _route("cerebras", _NONE, providers={"cerebras"}, hosts=("cerebras.ai",)),
    _route("sambanova", _NONE, providers={"sambanova"}, hosts=("sambanova.ai",)),
    _route("fireworks", _CONTENT, providers={"fireworks", "fireworks-ai"}, hosts=("fireworks.ai",)),
    _route(
        "deepseek", _CONTENT, pad=True, providers={"deepseek"}, hosts=("deepseek.com",),
        models=("deepseek",),
    ),
    _route(
        "kimi",
        _CONTENT,
        pad=True,
        providers={"kimi", "moonshot", "moonshotai", "kimi-coding"},
        hosts=("moonshot.ai", "moonshot.cn", "kimi.com"),
        models=("kimi", "moonshot"),
    ),
    _route(
        "mimo",
        _CONTENT,
        pad=True,
        providers={"mimo", "xiaomi", "xiaomi-mimo"},
        hosts=("xiaomimimo.com",),
        models=("mimo",),
    ),
)

#: The route of anything the table does not recognise.
DEFAULT_ROUTE: Final = ReasoningRoute(name="default", carriers=_CONTENT)

_ROUTES_BY_NAME: Final = {route.name: route for route in REASONING_ROUTES}


def _normalize_provider(provider: str | None) -> str:
    return (provider or "").strip().lower().replace("_", "-").replace(" ", "-")


def _split_base_url(base_url: str | None) -> tuple[str, str, int | None]:
    """``(host, path, port)`` of ``base_url``; a bare host without a scheme is accepted."""
    if not base_url:
        return "", "", None
    text = base_url.strip()
    parts = urlsplit(text if "//" in text else f"//{text}")
    try:
        port = parts.port
    except ValueError:
        port = None
    return (parts.hostname or "").lower(), parts.path or "", port


def _host_matches(host: str, domains: Iterable[str]) -> bool:
    return any(host == domain or host.endswith("." + domain) for domain in domains)


def _is_local_host(host: str) -> bool:
    if not host:
        return False
    if host in {"localhost", "host.docker.internal"} or host.endswith((".localhost", ".local")):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_link_local


def _path_allows(route: ReasoningRoute, base_url: str | None, path: str) -> bool:
    if route.path_prefix is None or not base_url:
        return True
    prefix = route.path_prefix.rstrip("/")
    return path == prefix or path.startswith(prefix + "/")


def resolve_reasoning_route(
    provider: str | None, base_url: str | None = None, model: str | None = None
) -> ReasoningRoute:
    """The row of :data:`REASONING_ROUTES` for this request. Matched in order: the provider
    name (case-insensitive, ``_`` and spaces read as ``-``); the ``base_url`` host or a
    subdomain of a listed domain; a loopback, private or ``.local`` host (``local``); the model
    id after its last ``/``, as a prefix, for the families that need padding; else
    :data:`DEFAULT_ROUTE`. A route with a path prefix (MiniMax ``/v1``) matches only that path
    or no ``base_url``."""
    name = _normalize_provider(provider)
    host, path, _ = _split_base_url(base_url)
    if name:
        for route in REASONING_ROUTES:
            if name in route.providers and _path_allows(route, base_url, path):
                return route
    if host:
        for route in REASONING_ROUTES:
            if _host_matches(host, route.hosts) and _path_allows(route, base_url, path):
                return route
        if _is_local_host(host):
            return _ROUTES_BY_NAME["local"]
    family = (model or "").strip().lower().rsplit("/", 1)[-1]
    if family:
        for route in REASONING_ROUTES:
            if any(family.startswith(prefix) for prefix in route.models):
                return route
    return DEFAULT_ROUTE


def _decode_details(value: Any) -> list[Any] | None:
    """Stored ``reasoning_details`` as a list; a JSON string (as REST returns it) is decoded."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, Mapping):
        return [value]
    if isinstance(value, list) and value:
        return value
    return None


def _details_text(details: list[Any] | None) -> str:
    parts: list[str] = []
    for item in details or ():
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        key = "summary" if kind == "reasoning.summary" else "text"
        if kind in (None, "reasoning.text", "reasoning.summary"):
            text = item.get(key)
            if isinstance(text, str):
                parts.append(text)
    return "".join(parts)


def _nonempty_text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _carried(message: Mapping[str, Any], carriers: AbstractSet[str], pad: bool) -> dict[str, Any]:
    """The reasoning fields one assistant turn sends on a route reading ``carriers``."""
    stored_text = {
        REASONING_CONTENT: _nonempty_text(message.get(REASONING_CONTENT)),
        REASONING: _nonempty_text(message.get(REASONING)),
    }
    details = _decode_details(message.get(REASONING_DETAILS))
    any_text = (
        stored_text[REASONING_CONTENT]
        or stored_text[REASONING]
        or _nonempty_text(_details_text(details))
    )
    out: dict[str, Any] = {}
    for carrier in (REASONING_CONTENT, REASONING):
        if carrier in carriers:
            text = stored_text[carrier] or any_text
            if text is not None:
                out[carrier] = text
    if REASONING_DETAILS in carriers:
        if details is not None:
            out[REASONING_DETAILS] = copy.deepcopy(details)
        elif any_text is not None:
            out[REASONING_DETAILS] = [{"type": "reasoning.text", "text": any_text}]
    if pad and REASONING_CONTENT in carriers and REASONING_CONTENT not in out:
        if message.get("tool_calls"):
            out[REASONING_CONTENT] = PADDING
    return out


def _provider_message(message: Mapping[str, Any]) -> dict[str, Any]:
    out = {key: copy.deepcopy(message[key]) for key in PROVIDER_KEYS if key in message}
    tool_name = message.get("tool_name")
    if message.get("role") == "tool" and "name" not in out and isinstance(tool_name, str):
        out["name"] = tool_name
    api_content = message.get("api_content")
    if isinstance(api_content, str):
        out["content"] = api_content
    return out


def rejected_carrier_fields(
    rejected: ReasoningFieldMemo | AbstractSet[str] | None,
    *,
    provider: str | None,
    base_url: str | None = None,
    model: str | None = None,
) -> frozenset[str]:
    """The carriers to leave out: from a memo for this combination, or a plain set of names."""
    if rejected is None:
        return frozenset()
    if isinstance(rejected, ReasoningFieldMemo):
        return rejected.rejected_fields(provider, base_url, model)
    return frozenset(rejected) & CARRIER_FIELDS


def route_reasoning_carriers(
    messages: Iterable[Mapping[str, Any]],
    *,
    provider: str | None,
    base_url: str | None = None,
    model: str | None = None,
    rejected: ReasoningFieldMemo | AbstractSet[str] | None = None,
) -> list[dict[str, Any]]:
    """A new provider-ready copy of ``messages`` with reasoning in the route's carriers.

    Each carrier takes its own stored value; one with no stored text takes
    ``reasoning_content``, then ``reasoning``, then the text of ``reasoning_details``.
    ``reasoning_details`` built from text alone is ``[{"type": "reasoning.text", "text": ...}]``,
    with no invented id or signature. A turn with no reasoning gets no carrier, except the
    padding of the routes that need it.

    ``rejected`` is a :class:`ReasoningFieldMemo` (its fields for this provider, host and model
    are dropped) or a set of carrier names to drop. The input is never modified; values are
    deep-copied, so changing the result cannot reach the caller's history either.
    """
    route = resolve_reasoning_route(provider, base_url, model)
    dropped = rejected_carrier_fields(rejected, provider=provider, base_url=base_url, model=model)
    carriers = route.carriers - dropped
    result: list[dict[str, Any]] = []
    for message in messages:
        out = _provider_message(message)
        if message.get("role") == "assistant":
            out.update(_carried(message, carriers, route.pad_tool_calls))
        result.append(out)
    return result


# ---------------------------------------------------------------------------------------------
# Rejected carrier fields
# ---------------------------------------------------------------------------------------------

_FIELD = r"(?P<field>reasoning_content|reasoning_details|reasoning)\b"
_QUOTE = r"[\"'`]"
_MESSAGE_PATH = r"(?:body\.)?messages(?:\[\d+\]|\.\d+)\."

#: Error texts that name a refused carrier, each with the field in group ``field``:
#: a pydantic-style extra field (``Extra inputs are not permitted, field: messages[3].reasoning``,
#: also ``messages.3.reasoning``), OpenAI's ``Unrecognized request argument supplied: X``,
#: a strict decoder's ``unknown field "X"`` (any quote, optionally ``messages[N].X``) and a JSON
#: schema's ``property 'X' is not allowed`` / ``is unsupported``. Case is ignored.
REJECTION_PATTERNS: Final[tuple[re.Pattern[str], ...]] = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        rf"extra inputs are not permitted[^\n]{{0,200}}?field:\s*{_QUOTE}?{_MESSAGE_PATH}{_FIELD}",
        rf"unrecognized request arguments? supplied:\s*{_QUOTE}?{_FIELD}",
        rf"unknown field:?\s*{_QUOTE}(?:{_MESSAGE_PATH})?{_FIELD}{_QUOTE}",
        rf"property\s+{_QUOTE}(?:{_MESSAGE_PATH})?{_FIELD}{_QUOTE}\s+is\s+(?:not\s+allowed"
        rf"|unsupported)",
    )
)


def rejected_fields_in(error_text: str) -> list[str]:
    """The carriers ``error_text`` says were refused, in order of appearance, without repeats."""
    found: list[tuple[int, str]] = []
    for pattern in REJECTION_PATTERNS:
        for match in pattern.finditer(error_text):
            found.append((match.start("field"), match.group("field").lower()))
    fields: list[str] = []
    for _, name in sorted(found):
        if name not in fields:
            fields.append(name)
    return fields


_MemoKey = tuple[str, str, str]


def _memo_key(provider: str | None, base_url: str | None, model: str | None) -> _MemoKey:
    host, _, port = _split_base_url(base_url)
    where = f"{host}:{port}" if host and port is not None else host
    return _normalize_provider(provider), where, (model or "").strip().lower()


class ReasoningFieldMemo:
    """Carriers a (provider, host[:port] of ``base_url``, model) combination rejected by name.

    In memory only and thread-safe; an agent session keeps one for its lifetime. Nothing is
    ever written to history or to disk.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rejected: dict[_MemoKey, frozenset[str]] = {}

    def record_rejection(
        self,
        error_text: str,
        *,
        provider: str | None,
        base_url: str | None = None,
        model: str | None = None,
    ) -> str | None:
        """Record every carrier ``error_text`` names as refused; return the first, else None."""
        fields = rejected_fields_in(error_text)
        if not fields:
            return None
        key = _memo_key(provider, base_url, model)
        with self._lock:
            self._rejected[key] = self._rejected.get(key, frozenset()) | frozenset(fields)
        return fields[0]

    def rejected_fields(
        self, provider: str | None, base_url: str | None = None, model: str | None = None
    ) -> frozenset[str]:
        """The carriers recorded for this combination (empty when none)."""
        key = _memo_key(provider, base_url, model)
        with self._lock:
            return self._rejected.get(key, frozenset())


def send_with_reasoning_retry(
    send: Callable[[list[dict[str, Any]]], T],
    messages: Sequence[Mapping[str, Any]],
    *,
    provider: str | None,
    base_url: str | None = None,
    model: str | None = None,
    memo: ReasoningFieldMemo,
) -> T:
    """Call ``send`` with the provider-ready list; on a named carrier rejection, retry once.

    When ``send`` raises and ``str(exc)`` names a refused carrier, the field is recorded in
    ``memo`` and the list is rebuilt without it and sent once more; a failure of that second
    call propagates (a carrier it names is still recorded, for the next request). An error that
    names no carrier, or only carriers that were not in the request, propagates at once.
    ``messages`` is never modified.
    """

    def build() -> list[dict[str, Any]]:
        return route_reasoning_carriers(
            messages, provider=provider, base_url=base_url, model=model, rejected=memo
        )

    def learn(exc: Exception) -> str | None:
        return memo.record_rejection(str(exc), provider=provider, base_url=base_url, model=model)

    first = build()
    try:
        return send(first)
    except Exception as exc:
        if not learn(exc):
            raise
        second = build()
        if second == first:
            raise
    try:
        return send(second)
    except Exception as exc:
        learn(exc)
        raise


# ---------------------------------------------------------------------------------------------
# Codex app-server input ownership
# ---------------------------------------------------------------------------------------------

_TEXT_PART_TYPES: Final = frozenset({"text", "input_text"})


def rich_input_to_text(parts: str | Iterable[Any] | None) -> str:
    """The text of a rich input, as written to ``turn/start`` and compared against its echo.

    A string is its own text. In a list of parts, a string part contributes itself and a mapping
    whose ``type`` is ``"text"`` (or ``"input_text"``) contributes its ``text``; the parts are
    concatenated in order with no separator. Every other part (images, local images, mentions,
    skills, …) is not rendered at all, so an input of only an image has the text ``""``.
    """
    if parts is None:
        return ""
    if isinstance(parts, str):
        return parts
    pieces: list[str] = []
    for part in parts:
        if isinstance(part, str):
            pieces.append(part)
        elif isinstance(part, Mapping) and part.get("type") in _TEXT_PART_TYPES:
            text = part.get("text")
            if isinstance(text, str):
                pieces.append(text)
    return "".join(pieces)


def _user_message_text(item: Mapping[str, Any]) -> str | None:
    """The text of a ``userMessage`` item: its ``content`` parts, else a plain ``text``."""
    content = item.get("content")
    if isinstance(content, (str, list, tuple)):
        return rich_input_to_text(content)
    text = item.get("text")
    return text if isinstance(text, str) else None


def suppress_turn_start_echo(
    turn_start_text: str | Iterable[Any], items: Iterable[T]
) -> list[T]:
    """``items`` without Codex's echo of the input written to ``turn/start``.

    Only the first item whose ``type`` is ``"userMessage"`` is a candidate, and it is dropped
    only when its text (see :func:`rich_input_to_text`; ``{"type": "userMessage", "content":
    [...parts]}`` or ``{"type": "userMessage", "text": ...}``) equals ``turn_start_text``
    exactly — no whitespace or case folding. Every other item is kept in order: later user
    events, a first ``userMessage`` that differs, and separately accepted identical turns. The
    decision reads text only, never platform message ids, so keyless and synthesized inputs are
    treated alike. ``items`` holds one entry per item (not the raw started/completed
    notification pairs); it is not modified.
    """
    expected = rich_input_to_text(turn_start_text)
    kept: list[T] = []
    seen_user_message = False
    for item in items:
        if (
            not seen_user_message
            and isinstance(item, Mapping)
            and item.get("type") == "userMessage"
        ):
            seen_user_message = True
            if _user_message_text(item) == expected:
                continue
        kept.append(item)
    return kept


def gateway_should_persist(agent_owns_persistence: bool) -> bool:
    """Whether the gateway writes the transcript: never when the agent reports it owns it."""
    return not agent_owns_persistence
