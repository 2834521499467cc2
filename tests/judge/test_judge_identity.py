"""A judge endpoint's identity, copied into every judgment's metadata (which scenario-scoped
tokens read): the URL's scheme, host, port and path, never its userinfo, query or fragment."""

from __future__ import annotations

import pytest

from reef.judge import configured_judge
from reef.settings import JudgeSettings


@pytest.mark.parametrize(
    ("url", "identity"),
    [
        ("https://judge.example/v1", "endpoint:https://judge.example/v1#m"),
        (
            "https://user:s3cret@judge.example:8443/v1?api-key=s3cret&x=1#frag",
            "endpoint:https://judge.example:8443/v1#m",
        ),
        ("http://tok@[::1]:9000/v1/", "endpoint:http://[::1]:9000/v1/#m"),
    ],
)
def test_judgments_name_the_endpoint_without_credentials(url: str, identity: str) -> None:
    judge = configured_judge(JudgeSettings(url=url, model="m"))
    assert judge is not None and judge.identity == identity
    assert "s3cret" not in judge.identity and "tok@" not in judge.identity
