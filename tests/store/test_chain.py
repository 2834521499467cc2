"""ChainStore's contract on every backend: the release chain's compare-and-swap, and the
candidates table with its status compare-and-swap."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from reef.errors import BadRequest, Conflict, HeadMoved, NotFound
from reef.records import Candidate, Release, utcnow
from reef.store.chain import ChainStore
from reef.store.sql import SQLStore, open_store
from tests.store.builders import new_candidate, new_release


def test_base_release_is_a_creation_with_empty_fields(
    chain_store: ChainStore, store: SQLStore
) -> None:
    sc = store.create_scenario("support")
    base = chain_store.head_release("support")
    assert base.id == sc.head_release_id
    assert (base.seq, base.parent_id, base.operation) == (0, None, "creation")
    assert (base.content_hash, base.recipe, base.dataset_id, base.model_uri) == (None,) * 4
    assert (base.metrics, base.gate) == ({}, {})
    assert chain_store.list_releases("support") == [base]


def test_publish_moves_head_and_numbers_the_chain(chain_store: ChainStore, store: SQLStore) -> None:
    sc = store.create_scenario("support")
    before = utcnow()
    wanted = new_release("support", sc.head_release_id)
    published = chain_store.publish_release(wanted)

    assert published.seq == 1
    assert published.created_at >= before
    assert published.created_at.utcoffset() == timedelta(0)
    assert published == Release(**{**wanted.__dict__, "seq": 1, "created_at": published.created_at})
    assert store.get_scenario("support").head_release_id == published.id
    assert chain_store.head_release("support") == published
    assert chain_store.get_release("support", published.id) == published
    assert [r.id for r in chain_store.list_releases("support")] == [
        sc.head_release_id,
        published.id,
    ]


def test_a_chain_of_publishes_is_linear(chain_store: ChainStore, store: SQLStore) -> None:
    sc = store.create_scenario("support")
    parent = sc.head_release_id
    operations = ["training", "training", "rollback", "promote", "training"]
    for op in operations:
        parent = chain_store.publish_release(new_release("support", parent, operation=op)).id
    chain = chain_store.list_releases("support")
    assert [r.seq for r in chain] == list(range(len(operations) + 1))
    assert [r.operation for r in chain] == ["creation", *operations]
    assert [r.parent_id for r in chain] == [None] + [r.id for r in chain[:-1]]
    assert [r.created_at for r in chain] == sorted(r.created_at for r in chain)
    assert chain_store.head_release("support") == chain[-1]
    assert chain[-1].id == parent


def test_stale_parent_raises_head_moved_and_writes_nothing(
    chain_store: ChainStore, store: SQLStore
) -> None:
    sc = store.create_scenario("support")
    base = sc.head_release_id
    first = chain_store.publish_release(new_release("support", base))
    chain = chain_store.list_releases("support")

    stale = new_release("support", base)
    with pytest.raises(HeadMoved, match=f"is release '{first.id}', not '{base}'") as info:
        chain_store.publish_release(stale)
    assert (info.value.status, info.value.code) == (409, "head_moved")
    assert isinstance(info.value, Conflict)
    assert chain_store.list_releases("support") == chain
    assert store.get_scenario("support").head_release_id == first.id
    with pytest.raises(NotFound):
        chain_store.get_release("support", stale.id)

    # A parent from another scenario, or no release at all, is just as stale.
    other = store.create_scenario("other")
    with pytest.raises(HeadMoved):
        chain_store.publish_release(new_release("support", other.head_release_id))
    with pytest.raises(HeadMoved):
        chain_store.publish_release(new_release("support", "rel_nope"))
    assert chain_store.list_releases("support") == chain


def test_publish_rejects_what_cannot_join_a_chain(chain_store: ChainStore, store: SQLStore) -> None:
    sc = store.create_scenario("support")
    with pytest.raises(BadRequest, match="no parent_id"):
        chain_store.publish_release(new_release("support", None))
    with pytest.raises(BadRequest, match="operation 'creation'"):
        chain_store.publish_release(
            new_release("support", sc.head_release_id, operation="creation")
        )
    with pytest.raises(BadRequest, match="operation 'retrain'"):
        chain_store.publish_release(new_release("support", sc.head_release_id, operation="retrain"))
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        chain_store.publish_release(new_release("ghost", sc.head_release_id))
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        chain_store.head_release("ghost")
    assert len(chain_store.list_releases("support")) == 1


def test_publishing_a_taken_release_id_conflicts(chain_store: ChainStore, store: SQLStore) -> None:
    sc = store.create_scenario("support")
    first = chain_store.publish_release(new_release("support", sc.head_release_id))
    with pytest.raises(Conflict, match=f"release id '{first.id}' already exists") as info:
        chain_store.publish_release(new_release("support", first.id, id=first.id))
    assert not isinstance(info.value, HeadMoved)
    with pytest.raises(Conflict, match="already exists"):
        chain_store.publish_release(new_release("support", first.id, id=sc.head_release_id))
    assert chain_store.head_release("support") == first
    assert len(chain_store.list_releases("support")) == 2


def _publish_at_once(stores: list[SQLStore], scenario: str, parent: str) -> list[Any]:
    """Each store in its own thread publishes on `parent` at the same moment."""
    barrier = threading.Barrier(len(stores))
    results: list[Any] = [None] * len(stores)

    def publish(i: int) -> None:
        barrier.wait()
        try:
            results[i] = stores[i].publish_release(new_release(scenario, parent))
        except BaseException as e:
            results[i] = e

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _assert_one_winner(store: SQLStore, results: list[Any], base: str) -> None:
    won = [r for r in results if isinstance(r, Release)]
    lost = [r for r in results if isinstance(r, HeadMoved)]
    assert len(won) == 1, results
    assert len(lost) == len(results) - 1, [r for r in results if not isinstance(r, Release)]
    chain = store.list_releases("raced")
    assert [(r.seq, r.parent_id) for r in chain] == [(0, None), (1, base)]
    assert chain[1] == won[0]
    assert store.head_release("raced") == won[0]


def test_concurrent_publishers_one_wins(store: SQLStore) -> None:
    base = store.create_scenario("raced").head_release_id
    results = _publish_at_once([store] * 32, "raced", base)
    _assert_one_winner(store, results, base)


def test_concurrent_publishers_on_separate_engines_one_wins(database_url: str) -> None:
    # Separate engines stand in for separate processes (API replicas, training workers).
    stores = [open_store(database_url) for _ in range(8)]
    try:
        stores[0].migrate()
        base = stores[0].create_scenario("raced").head_release_id
        results = _publish_at_once(stores, "raced", base)
        _assert_one_winner(stores[0], results, base)
    finally:
        for s in stores:
            s.close()


def test_candidate_add_get_list(chain_store: ChainStore, store: SQLStore) -> None:
    sc = store.create_scenario("support")
    first = chain_store.add_candidate(new_candidate("support", sc.head_release_id))
    assert chain_store.get_candidate("support", first.id) == first
    assert first.created_at.utcoffset() == timedelta(0)
    second = chain_store.add_candidate(
        new_candidate(
            "support",
            sc.head_release_id,
            created_at=first.created_at + timedelta(seconds=1),
            status="rejected",
            gate={"decision": "reject", "delta": -0.1},
            message="worse than the head",
        )
    )
    assert chain_store.get_candidate("support", second.id) == second
    assert chain_store.list_candidates("support") == [second, first]
    assert chain_store.list_candidates("support", status="pending") == [first]
    assert chain_store.list_candidates("support", status="published") == []

    store.create_scenario("empty")
    assert chain_store.list_candidates("empty") == []


def test_candidate_errors(chain_store: ChainStore, store: SQLStore) -> None:
    sc = store.create_scenario("support")
    c = chain_store.add_candidate(new_candidate("support", sc.head_release_id))
    with pytest.raises(Conflict, match=f"candidate '{c.id}' already exists"):
        chain_store.add_candidate(new_candidate("support", sc.head_release_id, id=c.id))
    with pytest.raises(Conflict, match="already a release's id"):
        chain_store.add_candidate(
            new_candidate("support", sc.head_release_id, id=sc.head_release_id)
        )
    with pytest.raises(NotFound, match="release 'rel_nope' not found in scenario 'support'"):
        chain_store.add_candidate(new_candidate("support", "rel_nope"))
    other = store.create_scenario("other")
    with pytest.raises(NotFound, match="not found in scenario 'support'"):
        chain_store.add_candidate(new_candidate("support", other.head_release_id))
    with pytest.raises(BadRequest, match="unknown candidate status 'maybe'"):
        chain_store.add_candidate(new_candidate("support", sc.head_release_id, status="maybe"))
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        chain_store.add_candidate(new_candidate("ghost", sc.head_release_id))
    with pytest.raises(NotFound, match="candidate 'rel_nope' not found in scenario 'support'"):
        chain_store.get_candidate("support", "rel_nope")
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        chain_store.get_candidate("ghost", c.id)
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        chain_store.list_candidates("ghost")
    with pytest.raises(NotFound, match="candidate 'rel_nope' not found"):
        chain_store.set_candidate_status("support", "rel_nope", "failed")
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        chain_store.set_candidate_status("ghost", c.id, "failed")
    with pytest.raises(BadRequest, match="unknown candidate status"):
        chain_store.set_candidate_status("support", c.id, "done")
    assert chain_store.list_candidates("support") == [c]


def test_candidate_status_compare_and_swap(chain_store: ChainStore, store: SQLStore) -> None:
    sc = store.create_scenario("support")
    c = chain_store.add_candidate(new_candidate("support", sc.head_release_id))

    gate = {"decision": "accept", "delta": 0.04}
    published = chain_store.set_candidate_status(
        "support", c.id, "published", expected="pending", gate=gate, model_uri="models:/m/1"
    )
    assert (published.status, published.gate, published.model_uri) == (
        "published",
        gate,
        "models:/m/1",
    )
    assert published.updated_at > c.updated_at
    assert (published.created_at, published.metrics, published.message) == (
        c.created_at,
        c.metrics,
        None,
    )
    assert chain_store.get_candidate("support", c.id) == published

    with pytest.raises(Conflict, match="is 'published', not 'pending'") as info:
        chain_store.set_candidate_status("support", c.id, "rejected", expected="pending")
    assert info.value.code == "candidate_status"
    assert chain_store.get_candidate("support", c.id) == published

    # Without `expected`, an unconditional move; None leaves the other fields as they were.
    failed = chain_store.set_candidate_status("support", c.id, "failed", message="upload broke")
    assert (failed.status, failed.message, failed.gate, failed.model_uri) == (
        "failed",
        "upload broke",
        gate,
        "models:/m/1",
    )


def test_concurrent_candidate_status_swaps_one_wins(
    chain_store: ChainStore, store: SQLStore
) -> None:
    sc = store.create_scenario("support")
    c = chain_store.add_candidate(new_candidate("support", sc.head_release_id))
    n = 16
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def swap(i: int) -> None:
        barrier.wait()
        try:
            results[i] = chain_store.set_candidate_status(
                "support", c.id, "published", expected="pending", message=f"worker {i}"
            )
        except BaseException as e:
            results[i] = e

    threads = [threading.Thread(target=swap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [r for r in results if isinstance(r, Candidate)]
    lost = [r for r in results if isinstance(r, Conflict) and r.code == "candidate_status"]
    assert (len(won), len(lost)) == (1, n - 1), results
    assert chain_store.get_candidate("support", c.id) == won[0]


def test_a_harness_candidate_keeps_its_operation_and_metadata(
    chain_store: ChainStore, store: SQLStore
) -> None:
    scen = store.create_scenario("hc")
    meta = {
        "harness": {"key": "harness/hc/ab", "content_hash": "sha256:ab"},
        "weights_release_id": "r",
    }
    cand = chain_store.add_candidate(
        new_candidate("hc", scen.head_release_id, operation="harness", metadata=meta, kind="base")
    )
    got = chain_store.get_candidate("hc", cand.id)
    assert (got.operation, got.metadata) == ("harness", meta)
    plain = chain_store.add_candidate(new_candidate("hc", scen.head_release_id))
    assert (plain.operation, plain.metadata) == ("training", {})
