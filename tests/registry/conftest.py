"""Registry fixtures: the tiny model, a LoRA adapter on it made with PEFT, greedy reference
answers from plain transformers + PEFT, an MLflow tracking store (SQLite) per test, and the
S3 server of the experience tests."""

from __future__ import annotations

import itertools
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.models import resolve_model
from tests.experience.conftest import s3_bucket, s3_endpoint

__all__ = ["s3_bucket", "s3_endpoint"]

PROMPTS = ["Hello! How can I help you today?", "What is the capital of France?"]
MAX_NEW = 8
_scenarios = itertools.count()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return resolve_model("tiny", tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def adapter_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter with random (non-zero) weights, so it visibly changes the answers."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("adapter")
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing", category=FutureWarning
        )
        torch.manual_seed(7)
        get_peft_model(model, config).save_pretrained(out)
    return out


def generate(model_dir: Path, adapter: Path | None, prompts: list[str], max_new: int) -> list[str]:
    """Greedy answers from plain transformers (+ PEFT), one prompt at a time."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if adapter is not None:
        from peft import PeftModel

        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=".*is_gradient_checkpointing", category=FutureWarning
            )
            model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    answers = []
    for prompt in prompts:
        enc = tok.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )
        with torch.no_grad():
            out = model.generate(
                **enc, max_new_tokens=max_new, do_sample=False, pad_token_id=tok.pad_token_id
            )
        answers.append(tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True))
    return answers


@pytest.fixture(scope="session")
def base_answers(tiny_dir: Path) -> list[str]:
    return generate(tiny_dir, None, PROMPTS, MAX_NEW)


@pytest.fixture(scope="session")
def adapter_answers(tiny_dir: Path, adapter_dir: Path) -> list[str]:
    return generate(tiny_dir, adapter_dir, PROMPTS, MAX_NEW)


@pytest.fixture(scope="session")
def mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty, migrated MLflow database: creating one takes seconds, copying it does not."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    client = MlflowClient(f"sqlite:///{path}")
    client.search_experiments()  # creates and migrates the tables
    client.search_registered_models()
    return path


@pytest.fixture
def tracking_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_db: Path) -> str:
    """A fresh MLflow SQLite tracking store (and registry) for the test."""
    monkeypatch.chdir(tmp_path)  # anything MLflow writes relative to the cwd stays in tmp
    shutil.copyfile(mlflow_db, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def artifact_location(tmp_path: Path) -> str:
    return (tmp_path / "mlflow-artifacts").as_uri()


@pytest.fixture
def scenario() -> str:
    return f"reg-{next(_scenarios)}"


@pytest.fixture
def global_tracking_uri(tracking_uri: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """MLflow's process-global tracking (and so registry) URI set to the test's store, for
    plain `mlflow.pyfunc.load_model("models:/...")`; put back afterwards."""
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # set_tracking_uri writes it
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    monkeypatch.setattr(registry_utils, "_registry_uri", None)  # registry follows tracking
    with _use_tracking_uri(tracking_uri):
        yield tracking_uri
