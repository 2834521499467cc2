"""The models the embedded engine answers to, and their life on the scheduler thread.

A `Variant` is the base model, a LoRA adapter on it, or a full checkpoint; the event loop makes
it and never changes it. `Variants` is the scheduler thread's side of them: it attaches LoRA
adapters to the base model (inside a PEFT wrapper made with the first) and detaches them, sets
what the LoRA layers apply for each forward pass, and frees unloaded variants once no request
uses them. All of it runs between decode steps, never during a forward pass.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from reef.engines.prefixes import PrefixCache, VariantKey
from reef.errors import BadRequest, EngineError

log = logging.getLogger(__name__)

BASE_ADAPTER = "__base__"  # PEFT's adapter name for rows of a mixed batch that take no adapter
_MIXED = "__mixed__"  # LoRA layers enabled, each row's adapter named in the forward call


@dataclass(eq=False)
class Variant:
    """A model the engine answers to: the base, a LoRA adapter on it, or a full checkpoint.

    `weights` is the model whose parameters a forward pass reads: the base model for the base
    and every adapter (which then share a batch), a model of its own for a checkpoint. Made on
    the event loop, never changed; the scheduler only reads it.
    """

    name: str
    weights: torch.nn.Module
    adapter: str | None = None  # the PEFT adapter's key inside the base model

    @property
    def key(self) -> VariantKey:
        """What the keys and values it computes depend on (the prefix cache's key)."""
        return (id(self.weights), self.adapter)


def settle(done: Future[Any], result: Any = None, error: Exception | None = None) -> None:
    """Hand a result to the event loop waiting on `done`; nobody waits when it was cancelled."""
    if not done.set_running_or_notify_cancel():
        return
    if error is None:
        done.set_result(result)
    else:
        done.set_exception(error)


class Variants:
    """The base model's adapters and the variants being unloaded. Scheduler thread only."""

    def __init__(self, model: torch.nn.Module, model_id: str):
        self.model_id = model_id
        self._model: Any = model  # the base model, never wrapped: adapters go in `_peft`
        self._peft: Any = None  # PeftModel around `_model` while an adapter is loaded
        self._lora_mode: str | None = None  # what its LoRA layers apply now (see _lora_layers)
        self.retiring: list[tuple[Variant, Future[None]]] = []  # unloaded, maybe still in use

    def lora(self, weights: torch.nn.Module, adapters: Sequence[str | None]) -> frozenset[str]:
        """The LoRA settings rows naming `adapters` need on `weights` (empty: none apply); a
        forward pass over rows of one setting calls the model as it is."""
        if weights is not self._model or self._peft is None:
            return frozenset()
        return frozenset(a or BASE_ADAPTER for a in adapters)

    def forward(
        self, weights: torch.nn.Module, adapters: Sequence[str | None]
    ) -> tuple[torch.nn.Module, dict[str, Any]]:
        """What to call for a forward pass over rows naming `adapters`, and the extra
        arguments it takes.

        With adapters loaded the base model's layers carry LoRA weights. Rows of several kinds
        (adapters, or adapters and plain base rows) go through the PEFT wrapper, which applies
        each row's own adapter; PEFT then hooks every LoRA layer for that one pass, which costs
        a few milliseconds, so a pass whose rows are all of one kind instead sets the layers
        for that kind (only when it changes) and calls the model as it is.
        """
        kinds = self.lora(weights, adapters)
        if not kinds:
            return weights, {}
        if len(kinds) == 1:
            self._lora_layers(next(iter(kinds)))
            return weights, {}
        self._lora_layers(_MIXED)
        return self._peft, {"adapter_names": [a or BASE_ADAPTER for a in adapters]}

    def _lora_layers(self, mode: str) -> None:
        """Set what the LoRA layers apply: nothing (BASE_ADAPTER), one adapter, or per row."""
        if mode == self._lora_mode:
            return
        tuner = self._peft.base_model
        if mode == BASE_ADAPTER:
            tuner.disable_adapter_layers()
        else:
            tuner.enable_adapter_layers()
            if mode != _MIXED:
                self._peft.set_adapter(mode, inference_mode=True)
        self._lora_mode = mode

    def attach(self, key: str, config: Any, weights: dict[str, torch.Tensor]) -> None:
        """Add a LoRA adapter to the base model under `key`; on failure leave it as it was."""
        from peft import PeftModel, set_peft_model_state_dict

        self._lora_mode = None  # adding an adapter may change which one is active
        try:
            if self._peft is None:
                with warnings.catch_warnings():
                    # PEFT reads transformers' deprecated `is_gradient_checkpointing`.
                    warnings.simplefilter("ignore", FutureWarning)
                    self._peft = PeftModel(self._model, config, adapter_name=key)
            else:
                self._peft.add_adapter(key, config)
            loaded: Any = set_peft_model_state_dict(self._peft, weights, adapter_name=key)
            missing = [k for k in loaded.missing_keys if f".{key}." in k]
            if loaded.unexpected_keys or missing:
                raise ValueError(
                    f"tensors it lacks: {missing[:3]}, tensors the model has no place for: "
                    f"{loaded.unexpected_keys[:3]}"
                )
            self._peft.eval()  # new LoRA layers start in training mode (dropout)
        except Exception as exc:
            self.detach(key)
            raise BadRequest(
                f"the adapter does not fit the base model {self.model_id}: {exc}",
                code="invalid_adapter",
                param="path",
            ) from exc

    def detach(self, key: str) -> None:
        """Remove adapter `key`; with the last one gone the base model is plain again."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        peft = self._peft
        self._lora_mode = None
        others = [k for k in peft.peft_config if k != key] if peft is not None else []
        if not others:
            if peft is not None:
                peft.unload()  # puts the base layers back in place of the LoRA ones
            else:  # PeftModel() failed halfway: some layers may be wrapped already
                for name, module in list(self._model.named_modules()):
                    if isinstance(module, BaseTunerLayer):
                        parent, _, child = name.rpartition(".")
                        setattr(self._model.get_submodule(parent), child, module.get_base_layer())
            self._peft = None
            return
        if key in peft.active_adapters:  # PEFT would warn and pick another
            peft.set_adapter(others[0], inference_mode=True)
        if key in peft.peft_config:
            peft.delete_adapter(key)
        for module in peft.modules():  # a failed add_adapter may have wrapped some layers
            if isinstance(module, BaseTunerLayer):
                module.delete_adapter(key)

    def retire(self, busy: set[int], prefixes: PrefixCache | None) -> None:
        """Free unloaded variants no request uses any more (`busy`: ids of the variants
        requests in flight or waiting use), and tell their unload() so."""
        still = []
        for variant, freed in self.retiring:
            if id(variant) in busy:
                still.append((variant, freed))
                continue
            try:
                if prefixes is not None:
                    prefixes.forget(variant.key)
                if variant.adapter is not None:
                    self.detach(variant.adapter)
                settle(freed)  # a checkpoint goes with the last reference to it
            except Exception as exc:
                log.exception("embedded engine: unloading %s failed", variant.name)
                settle(freed, error=EngineError(f"unloading '{variant.name}' failed: {exc}"))
        self.retiring = still

    def close(self, error: Exception) -> None:
        """The engine stops: whoever waits for an unload is told `error`; the wrapper goes."""
        for _, freed in self.retiring:
            settle(freed, error=error)
        self.retiring = []
        self._peft = None
