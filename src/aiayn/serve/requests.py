# The body models' field types are built at run time from the server's limits (bounds a
# static type cannot hold); mypy sees them as variables, pydantic as the types they are, and
# a form field defaults to None without being nullable (see `FormKey`).
# mypy: disable-error-code="valid-type, assignment"
"""What a request to `aiayn serve` may say, as pydantic models, and what a model directory tells
the server (its languages, example sentences).

The models are built per server (`request_models`): their bounds are that server's limits and
that model's languages, layers and heads, so `/openapi.json` states exactly what is accepted
and a client generator or a fuzzer learns the real API from it. aiayn's own endpoints (`/v1/*`)
are strict JSON (no type coercion, no NaN or Infinity, no unknown fields); LibreTranslate's
(`/translate`, `/detect`) also take HTML forms, whose fields are strings, so they coerce.

What a schema cannot say is checked after validation and refused with an `ApiError`: the
characters of a whole request and the search rows (sentences x beam) it asks for.
"""

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from aiayn.config import MAX_ALPHA
from aiayn.config_files import read_run_config


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (`aiayn serve --help` names the flags)."""

    max_chars_per_request: int = 20_000
    max_chars_per_sentence: int = 1_000
    max_sentences: int = 128
    max_beam: int = 8
    timeout_s: float = 30.0  # from arrival to answer, queueing included
    max_output_tokens: int = 256  # per sentence (and the most decoding steps of an explanation)
    max_rows: int = 512  # sentences x beam (or x samples) of one request
    max_trace_numbers: int = 2_000_000  # numbers one /v1/explain trace may hold

    @property
    def max_body_bytes(self) -> int:
        """A JSON body's bytes at most: UTF-8 (up to 4 bytes a character), escapes, fields."""
        return 4 * self.max_chars_per_request + 65_536


class ApiError(Exception):
    """A request the server refuses: HTTP `status` with `{"error": message}`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# --- what the model directory records -------------------------------------------------------------

# File suffixes corpora use that babel would read as languages (Sardinian, Toki Pona).
_NOT_LANGUAGES = {"src", "tok"}


def is_language_code(code: str) -> bool:
    """A language code babel knows (en, de, pt_BR, sr-Latn, yue), not a file suffix."""
    from babel import Locale, UnknownLocaleError

    if not code or code.lower() in _NOT_LANGUAGES or not code.replace("-", "").isalpha():
        return False
    try:
        Locale.parse(code.replace("-", "_"))
    except (ValueError, UnknownLocaleError):
        return False
    return True


def model_languages(directory: Path) -> tuple[str, str] | None:
    """(source, target) language codes a model directory records: an imported model's
    (`aiayn import marian` writes them under `imported`), else the training files' suffixes in
    `run_config.json` (`train.en` / `train.de` -> ("en", "de"), as the quick start and Multi30k
    name them, but not `train.src` / `train.tok`); None when neither names two languages."""
    config = read_run_config(directory)
    imported, train = config.get("imported", {}), config.get("train", {})
    if isinstance(imported, dict) and imported.get("source_lang"):
        codes = (str(imported.get("source_lang")), str(imported.get("target_lang") or ""))
    elif isinstance(train, dict):
        src, tgt = str(train.get("src", "")), str(train.get("tgt", ""))
        codes = (Path(src).suffix.lstrip("."), Path(tgt).suffix.lstrip("."))
    else:
        return None
    if all(is_language_code(c) for c in codes) and codes[0] != codes[1]:
        return codes[0], codes[1]
    return None


def example_sentences(directory: Path, given: Path | None, n: int = 12) -> list[str]:
    """Sentences for the page's picker: `given`, else the run's validation sources (found as
    recorded, as `../data/valid.*` beside the model (the quick start's layout), or the
    validation set a two-file run held out)."""
    candidates = [given] if given else []
    config = read_run_config(directory)
    train = config.get("train", {})
    valid = str(train.get("valid_src", "") or "") if isinstance(train, dict) else ""
    if valid:
        candidates += [Path(valid), directory.parent / "data" / Path(valid).name]
    heldout = config.get("heldout_valid", {})  # a two-file run's own validation set
    if isinstance(heldout, dict) and heldout.get("src"):
        name = str(heldout["src"])  # relative to the run directory (`averaged/` is inside it)
        candidates += [directory / name, directory.parent / name]
    for path in candidates:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            lines = path.read_text(encoding="utf-8").splitlines()
            return [s for s in lines if s.strip() and len(s) <= 200][:n]
    return []


def language_name(code: str) -> str:
    from babel import Locale, UnknownLocaleError

    try:
        return str(Locale.parse(code.replace("-", "_")).get_display_name("en"))
    except (ValueError, UnknownLocaleError):
        return code


# --- request bodies -------------------------------------------------------------------------------

Key = Annotated[str | None, Field(description="the API key (or 'Authorization: Bearer')")]


def _encodable(text: str) -> str:
    """JSON can carry lone surrogates ("\\ud800") that no UTF-8 text can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the text is not valid Unicode (a lone surrogate)") from None
    return text


def _whole(value: object) -> object:
    """JSON Schema's integers include 10.0: a float with no fraction is taken as an int."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _int(ge: int, le: int) -> Any:
    """An integer in [ge, le] (strict otherwise: not true, not "2")."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_whole)]


# A character that is not a space as Python's str.strip() sees one, nor U+FEFF (the translator
# reads `source_text`), spelled in escapes that JSON Schema's (ECMAScript) and pydantic's (Rust)
# regexes read alike.
SOME_TEXT = (
    r"[^\t\n\x0B\f\r\x1C-\x1F \x85\xA0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F"
    r"\u3000\uFEFF]"
)


def _text(max_length: int, *, required: bool = False) -> Any:
    """A string of at most `max_length` characters (`required`: with some non-space text)."""
    # Not `\S`: JSON Schema's (ECMAScript) and pydantic's (Rust) regexes disagree on which
    # characters are spaces (U+0085), and neither is Python's (U+001C).
    field = Field(max_length=max_length, pattern=SOME_TEXT if required else None)
    return Annotated[str, field, AfterValidator(_encodable)]


class StrictBody(BaseModel):
    """aiayn's JSON bodies: no unknown fields, no coercion, finite numbers only."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class FormBody(BaseModel):
    """LibreTranslate's bodies (JSON or a form, whose fields are strings): coerced."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ErrorBody(BaseModel):
    error: str = Field(description="what is wrong, in one line")


class Hypothesis(BaseModel):
    text: str
    tokens: list[int] = Field(description="target ids, without BOS and EOS")
    log_prob: float = Field(description="sum of the tokens' log-probabilities (EOS included)")
    score: float = Field(description="log_prob / length penalty: what the search ranks by")
    eos: bool = Field(description="false when the output stopped at its length limit")


class TranslationOut(BaseModel):
    text: str
    hypotheses: list[Hypothesis]


class V1TranslateResponse(BaseModel):
    translations: list[TranslationOut]
    settings: dict[str, Any] = Field(description="the search settings used (DecodeConfig)")


class Detected(BaseModel):
    confidence: float
    language: str


class LibreTranslateResponse(BaseModel):
    translatedText: str | list[str]
    alternatives: list[str] | list[list[str]] | None = None
    detectedLanguage: Detected | list[Detected] | None = None


class HealthResponse(BaseModel):
    status: Literal["ok"]
    queued: int
    in_flight: int
    kind: Literal["translator", "language_model", "classifier"] = Field(
        description="the model served: a translator (/v1/translate), a language model "
        "(/v1/generate) or a classifier (/v1/classify)"
    )


class Completion(BaseModel):
    text: str = Field(description="the new text (the prompt not included)")
    tokens: list[int] = Field(description="its token ids, without EOS")
    log_prob: float = Field(description="sum of the tokens' log-probabilities (EOS included)")
    prompt_tokens: int = Field(description="prompt tokens the model saw, BOS included")
    finish_reason: Literal["eos", "length"] = Field(
        description="'eos': the model ended it; 'length': it reached max_tokens"
    )


class V1GenerateResponse(BaseModel):
    completions: list[list[Completion]] = Field(description="per prompt, its completions")
    model: str = Field(description="the model directory's name")
    settings: dict[str, Any] = Field(description="the search settings used (DecodeConfig)")


@dataclass(frozen=True)
class RequestModels:
    """The body models of one server (`request_models`)."""

    libre_translate: type[FormBody]
    detect: type[FormBody]
    v1_translate: type[StrictBody]
    v1_explain: type[StrictBody]


def request_models(
    limits: Limits, languages: tuple[str, str] | None, n_layers: int, n_heads: int
) -> RequestModels:
    """Body models whose bounds are this server's limits and this model's shape."""
    Sentence = _text(limits.max_chars_per_sentence)
    OneText = _text(limits.max_chars_per_request, required=True)
    Lines = Annotated[list[Sentence], Field(min_length=1, max_length=limits.max_sentences)]
    BeamSize = _int(1, limits.max_beam)
    Tokens = _int(0, limits.max_output_tokens)
    # A form field is a string or absent, never null: the form models' optional fields are
    # typed without None (their default is None), so their schema offers no null to send.
    FormKey = Annotated[str, Field(description="the API key (or 'Authorization: Bearer')")]
    if languages:
        SourceT: Any = Literal[languages[0], "auto"]
        TargetT: Any = Literal[languages[1]]
    else:  # a model that records no languages accepts any pair
        SourceT = TargetT = Annotated[str, Field(max_length=32)]

    class LibreTranslateRequest(FormBody):
        """LibreTranslate's /translate: each line of each text is a sentence."""

        q: OneText | Annotated[list[OneText], Field(min_length=1)]
        source: SourceT = None
        target: TargetT = None
        format: Literal["text"] = Field("text", description="plain text only (no 'html')")
        alternatives: _int(0, limits.max_beam - 1) = 0
        api_key: FormKey = None

    class DetectRequest(FormBody):
        q: OneText | Annotated[list[OneText], Field(min_length=1)]
        api_key: FormKey = None

    class V1TranslateRequest(StrictBody):
        """aiayn's own: the search, and every hypothesis with its scores. Unset fields take
        the model's saved settings; `nbest` over `beam` widens the beam to `nbest`."""

        q: _text(limits.max_chars_per_sentence, required=True) | Lines
        beam: BeamSize | None = None
        nbest: BeamSize | None = None
        alpha: Annotated[float, Field(ge=0, le=MAX_ALPHA)] | None = None
        length_penalty: Literal["gnmt", "power"] | None = None
        sample: bool | None = None
        temperature: Annotated[float, Field(gt=0, le=100)] | None = None
        top_k: _int(0, 1_000_000) | None = None
        top_p: Annotated[float, Field(gt=0, le=1)] | None = None
        seed: _int(0, 2**53 - 1) | None = None
        min_len: Tokens | None = None
        max_len_a: Annotated[float, Field(ge=0, le=100)] | None = None
        max_len_b: Tokens | None = None
        max_tokens: _int(1, limits.max_output_tokens) | None = None
        api_key: Key = None

    Layer = _int(0, max(n_layers - 1, 0))
    Head = _int(1, n_heads)
    Step = _int(0, limits.max_output_tokens - 1)

    class V1ExplainRequest(StrictBody):
        """One sentence traced: what `aiayn explain --format json` prints. `layers`, `heads`
        and `steps` choose what is kept (default all); `tensors: "attention"` keeps the
        attention weights only; `stack` keeps one stack (the page's forward-pass view)."""

        q: _text(limits.max_chars_per_sentence, required=True)
        beam: _int(0, limits.max_beam) = 0
        top_k: _int(1, 100) = 5
        max_len: _int(1, limits.max_output_tokens) | None = None
        alpha: Annotated[float, Field(ge=0, le=MAX_ALPHA)] | None = None
        length_penalty: Literal["gnmt", "power"] | None = None
        min_len: Tokens | None = None
        sample: bool | None = None
        temperature: Annotated[float, Field(gt=0, le=100)] | None = None
        sample_top_k: _int(0, 1_000_000) | None = None
        top_p: Annotated[float, Field(gt=0, le=1)] | None = None
        seed: _int(0, 2**53 - 1) | None = None
        layers: Annotated[list[Layer], Field(max_length=n_layers)] | None = None
        heads: Annotated[list[Head], Field(max_length=n_heads)] | None = None
        steps: Annotated[list[Step], Field(max_length=limits.max_output_tokens)] | None = None
        dims: _int(1, 4096) = 8
        precision: _int(0, 12) = 4
        tensors: Literal["all", "attention"] = "all"
        stack: Literal["encoder", "decoder"] | None = Field(
            None,
            description="keep one stack only: 'encoder' (the source's embeddings and encoder "
            "layers) or 'decoder' (the decoding steps: embeddings, layers, logits)",
        )
        api_key: Key = None

    return RequestModels(LibreTranslateRequest, DetectRequest, V1TranslateRequest, V1ExplainRequest)


def generate_model(limits: Limits) -> type[StrictBody]:
    """The body of /v1/generate (a language model's server), bounded by this server's limits."""
    Prompt = _text(limits.max_chars_per_sentence)  # "" too: the model writes from nothing
    Many = Annotated[list[Prompt], Field(min_length=1, max_length=limits.max_sentences)]
    Rows = _int(1, limits.max_beam)

    class V1GenerateRequest(StrictBody):
        """A language model continues each prompt. Unset fields take the model's saved
        settings (sampling at temperature 1 if it saved none); `sample: false` searches (a
        beam of 1: greedy), as does a `beam` without `sample`. `num_samples`: completions per
        prompt (samples, or a beam's best, widening the beam to them); `stream`: server-sent
        events, one per piece of new text as it is produced (not for a beam), then `done`."""

        prompt: Prompt | Many
        max_tokens: _int(1, limits.max_output_tokens) | None = None
        sample: bool | None = None
        beam: Rows | None = None
        num_samples: Rows | None = None
        temperature: Annotated[float, Field(gt=0, le=100)] | None = None
        top_k: _int(0, 1_000_000) | None = None
        top_p: Annotated[float, Field(gt=0, le=1)] | None = None
        seed: _int(0, 2**53 - 1) | None = None
        min_len: _int(0, limits.max_output_tokens) | None = None
        alpha: Annotated[float, Field(ge=0, le=MAX_ALPHA)] | None = None
        length_penalty: Literal["gnmt", "power"] | None = None
        stream: bool = False
        api_key: Key = None

    return V1GenerateRequest


def validation_message(errors: list[Any], task: str = "translate") -> str:
    """pydantic's first error as one line: `'beam': Input should be ... (got 9)`; an empty
    text is "no text to {task}"."""
    if not errors:
        return "invalid request"
    first = errors[0]
    many = _field(first) in ("q", "prompt")  # a string or a list of them
    union = many and len(errors) > 1 and all(_field(e) == _field(first) for e in errors)
    if union and first.get("type") != "missing":  # the union: every branch failed
        value = first.get("input")
        if not isinstance(value, str | list):
            return f"'{_field(first)}': must be a string or a list of strings (got {_shown(first)})"
        # the error of the branch of the value's own kind (a str branch's errors come first)
        kind = [e for e in errors if any(str(p).startswith("list") for p in e["loc"])]
        first = first if isinstance(value, str) or not kind else kind[0]
    # A union's branch names (`str`, `chain[...]`, `list[...]`) say nothing to a client: the
    # place is the field and the list index.
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _is_branch(p)]
    where = f"'{'.'.join(loc)}': " if loc else ""
    if first.get("type") == "string_pattern_mismatch":  # the only pattern: SOME_TEXT
        return f"{where}no text to {task} (empty or only spaces)"
    got = f" (got {_shown(first)})" if "input" in first and first["type"] != "missing" else ""
    return f"{where}{first.get('msg', 'invalid')}{got}"


def _is_branch(part: object) -> bool:
    return isinstance(part, str) and ("[" in part or part in ("str", "list", "int"))


def _field(error: Any) -> object:
    loc = [p for p in error.get("loc", ()) if p != "body"]
    return loc[0] if loc else None


def _shown(error: Any) -> str:
    return json.dumps(error.get("input"), default=str)[:40]


def check_sizes(lines: list[str], limits: Limits, rows_per_line: int = 1) -> None:
    """413 for a request over what no schema states: its sentences after line splitting, its
    characters in all, one sentence's characters, and its search rows (sentences x beam)."""
    if len(lines) > limits.max_sentences:
        raise ApiError(
            413, f"{len(lines)} sentences; the limit is {limits.max_sentences} (--max-sentences)"
        )
    total = sum(len(s) for s in lines)
    if total > limits.max_chars_per_request:
        raise ApiError(
            413,
            f"{total} characters; the limit is {limits.max_chars_per_request} "
            "(--max-chars-per-request)",
        )
    for i, s in enumerate(lines):
        if len(s) > limits.max_chars_per_sentence:
            limit = limits.max_chars_per_sentence
            raise ApiError(
                413,
                f"sentence {i} has {len(s)} characters; the limit is {limit} "
                "(--max-chars-per-sentence)",
            )
    rows = len(lines) * rows_per_line
    if rows > limits.max_rows:
        raise ApiError(
            413,
            f"{len(lines)} sentences x {rows_per_line} = {rows} search rows; "
            f"the limit is {limits.max_rows} (--max-rows)",
        )
