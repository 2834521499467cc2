"""The rollout watcher: every `rollout.check_interval_s`, each live canary is checked and the
verdict acted on (deploy.rollout.check), with this process's view of each arm's health.

Every replica runs one. They agree because the decision's inputs are in the shared database
and the actions are compare-and-swaps: a second replica acting on the same verdict gets a
Conflict, which is logged and ignored.
"""

from __future__ import annotations

import logging

from reef.background import BackgroundTask
from reef.deploy import rollout
from reef.deploy.chain import ReleaseChain
from reef.errors import ReefError
from reef.rollouts import Rollouts
from reef.settings import RolloutSettings
from reef.store.base import Store

log = logging.getLogger("reef.rollouts")


_DECIDED = ("canary", "shadow")  # the modes the watcher decides (an A/B split waits for a human)


def canary_scenarios(settings: RolloutSettings, store: Store) -> list[str]:
    """The scenarios whose rollout mode is canary or shadow (none: nothing to watch)."""
    if settings.mode not in _DECIDED and not any(
        o.get("mode") in _DECIDED for o in settings.scenarios.values()
    ):
        return []
    return [
        s.name for s in store.list_scenarios() if settings.for_scenario(s.name).mode in _DECIDED
    ]


def check_all(chain: ReleaseChain, rollouts: Rollouts) -> list[str]:
    """Check every live canary once; returns the ids of the releases that ended a rollout."""
    ended = []
    for name in canary_scenarios(rollouts.settings, chain.store):
        if not chain.store.list_candidates(name, "canary"):
            continue
        canary = chain.canary(name)
        try:
            release = rollout.check(chain, name, rollouts.health(canary.id))
        except ReefError as e:  # another replica acted first, or the head moved: next time
            log.warning("checking the rollout of %s: %s", name, e.message)
            continue
        finally:
            rollouts.forget(name)
        if release is not None:
            ended.append(release.id)
    return ended


def watcher(chain: ReleaseChain, rollouts: Rollouts, interval_s: float) -> BackgroundTask:
    """The background task that checks the live canaries every `interval_s`; a check that
    fails is logged and the next one runs on time."""
    return BackgroundTask("rollout-watcher", lambda: check_all(chain, rollouts), every_s=interval_s)
