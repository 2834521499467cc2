"""Registered versions loaded back as MLflow pyfunc models that answer chat prompts.

A version's artifact is an MLflow pyfunc model whose loader module is the package `reef.registry`
(`LOADER_MODULE`): its data directory holds the release's files (a PEFT adapter, a full
checkpoint or a harness tree) and ``reef_release.json`` (kind, base model, release ids), and
``mlflow.pyfunc.load_model(uri)`` returns a `ReleaseModel` whose ``predict`` answers a list of chat
prompts with transformers (+ PEFT). Loading needs ``reef`` importable (it holds the loader module)
and, for adapters, the base model directory recorded at registration (or another one passed as
``model_config={"base_model": ...}``).
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reef.registry.clients import mlflow_client, s3_endpoint
from reef.registry.names import DEFAULT_MAX_NEW_TOKENS, RELEASE_FILE
from reef.registry.versions import version_of

# Recorded as ``loader_module`` in the MLmodel file of every version ever registered, and MLflow
# calls that module's ``_load_pyfunc``: this path and that function must keep resolving.
LOADER_MODULE = "reef.registry"


def mlflow_pyfunc() -> Any:
    """`mlflow.pyfunc`, imported without the UserWarning MLflow 3.17 emits about its own type
    hints while importing it (an error where warnings are errors, as in Reef's tests)."""
    if "mlflow.pyfunc" not in sys.modules:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=".*type hint is inferred as AnyType", category=UserWarning
            )
            import mlflow.pyfunc  # noqa: F401
    return sys.modules["mlflow.pyfunc"]


def load(
    tracking_uri: str,
    model_uri: str,
    *,
    registry_uri: str | None = None,
    s3_endpoint_url: str | None = None,
    base_model: str | Path | None = None,
) -> Any:
    """`mlflow.pyfunc.load_model` of a registered version, resolved through this tracking URI
    (not MLflow's global one). `base_model` overrides the base directory recorded at
    registration (another machine, another cache)."""
    client = mlflow_client(tracking_uri, registry_uri)
    mv = version_of(client, model_uri)
    source = client.get_model_version_download_uri(mv.name, mv.version)
    config = {"base_model": str(base_model)} if base_model is not None else None
    with s3_endpoint(s3_endpoint_url):
        return mlflow_pyfunc().load_model(source, model_config=config)


def load_release(data_path: str, model_config: Mapping[str, Any] | None = None) -> ReleaseModel:
    """What `LOADER_MODULE`'s ``_load_pyfunc`` (which `mlflow.pyfunc.load_model` calls) does."""
    config = dict(model_config or {})
    return ReleaseModel(Path(data_path), base_model=config.get("base_model"))


class ReleaseModel:
    """A release loaded for generation: the base model, with the adapter applied (PEFT) or the
    checkpoint in its place. `predict` answers chat prompts greedily, one at a time (so answers
    do not depend on what else is in the batch)."""

    def __init__(self, release_dir: Path, *, base_model: str | Path | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.dir = Path(release_dir)
        self.meta: dict[str, Any] = json.loads((self.dir / RELEASE_FILE).read_text())
        self.kind = self.meta["kind"]
        if self.kind == "harness":
            weights = self.meta.get("weights_model_uri") or "the base model"
            raise ValueError(
                f"release {self.meta['release_id']} is a harness: it holds prompts and tools, "
                f"not weights, and is served by Reef with the weights of {weights}"
            )
        weights = self.dir if self.kind == "checkpoint" else self._base_dir(base_model)
        model: Any = AutoModelForCausalLM.from_pretrained(weights)
        if self.kind == "adapter":
            from peft import PeftModel

            with warnings.catch_warnings():
                # peft 0.21 reads a property transformers 5 deprecated
                warnings.filterwarnings(
                    "ignore", message=".*is_gradient_checkpointing", category=FutureWarning
                )
                model = PeftModel.from_pretrained(model, self.dir)
        self.model = model.eval()
        has_tokenizer = (self.dir / "tokenizer_config.json").is_file()
        self.tokenizer = AutoTokenizer.from_pretrained(self.dir if has_tokenizer else weights)
        self._no_grad = torch.no_grad

    def _base_dir(self, override: str | Path | None) -> Path:
        from reef.errors import ConfigError
        from reef.models import resolve_model
        from reef.settings import EngineSettings

        ref = override if override is not None else self.meta.get("base_model")
        hint = 'load it with model_config={"base_model": "<model dir>"}'
        if not ref:
            raise ConfigError(f"release {self.meta['release_id']} records no base model; {hint}")
        try:
            return resolve_model(str(ref), EngineSettings().model_cache)
        except ConfigError as e:
            raise ConfigError(
                f"base model of release {self.meta['release_id']}: {e}; {hint}"
            ) from None

    def get_raw_model(self) -> Any:
        """The transformers model (a PeftModel for an adapter); PyFuncModel.get_raw_model
        returns it."""
        return self.model

    def predict(self, model_input: Any, params: Mapping[str, Any] | None = None) -> list[str]:
        """Replies to `model_input`: a list of prompts, each a string (one user message), a
        list of chat messages, or ``{"messages": [...]}``. `params`: ``max_new_tokens``."""
        max_new = int((params or {}).get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS)
        return [self._generate(_messages(p), max_new) for p in _prompts(model_input)]

    def _generate(self, messages: list[dict[str, Any]], max_new_tokens: int) -> str:
        tok = self.tokenizer
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        enc = tok(text, return_tensors="pt", add_special_tokens=False)
        with self._no_grad():
            out = self.model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
            )
        return str(tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True))


def _prompts(model_input: Any) -> Sequence[Any]:
    if isinstance(model_input, (str, dict)):
        return [model_input]
    if hasattr(model_input, "to_dict") and hasattr(model_input, "columns"):  # a DataFrame
        column = "messages" if "messages" in model_input.columns else model_input.columns[0]
        return list(model_input[column])
    return list(model_input)


def _messages(prompt: Any) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, Mapping):
        if "messages" in prompt:
            return list(prompt["messages"])
        return [dict(prompt)]  # one message
    return [dict(m) for m in prompt]
