"""A harness candidate's failed guard answers (flows.harness): of each task's episodes, the
first one the guard's scorer failed is kept for review, with the task's question and expected
answer; an episode the engine could not answer (no score) is no answer at all."""

from __future__ import annotations

from reef.flows.harness import _failed_episodes
from reef.recipes.harness.episodes import Outcome, Task


def test_the_first_failed_episode_of_each_task_is_kept() -> None:
    tasks = [
        Task("a", [{"role": "user", "content": "Capital of Egypt?"}], {"answer": "Cairo"}),
        Task("b", [{"role": "user", "content": "Legs of an insect?"}], {"answer": "six"}),
        Task("c", [{"role": "user", "content": "Colour of the sky?"}], {"answer": "blue"}),
    ]
    episodes = [
        Outcome("a", 0, "Cairo.", 1.0),
        Outcome("a", 1, "Paris.", 0.0),
        Outcome("a", 2, "Rome.", 0.0),
        Outcome("b", 0, "Six.", 1.0),
        Outcome("b", 1, "Six legs.", 1.0),
        Outcome("c", 0, "", None, "engine unreachable"),
        Outcome("c", 1, "Green.", 0.0),
    ]
    kept = _failed_episodes("facts", tasks, episodes)
    assert [(k.task_id, k.answer, k.expected) for k in kept] == [
        ("a", "Paris.", "Cairo"),
        ("c", "Green.", "blue"),
    ]
    assert kept[0].guard == "facts" and kept[0].messages == tasks[0].messages
