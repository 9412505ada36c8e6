"""Claim-based metrics: ROUGE-L clustering on hand-made claims with known cluster counts,
deduplication, sentence selection and the agreement with the judge."""
import asyncio

import pytest

from scripted import ScriptedLLM, last_user, schema_name
from sensegraph.evaluate.claims import (agreement, cluster_counts, deduplicate, distance_matrix, rouge_l,
                                        run_claims, sentences)
from sensegraph.evaluate.store import EvalStore

# Distances (1 - ROUGE-L F1): a1-a2 0.25, a3-a1 = a3-a2 0.5, b1-b2 1/7, anything across groups 1.
CLAIMS = ["alpha beta gamma delta", "alpha beta gamma epsilon", "alpha beta zeta eta",
          "red green blue yellow", "red green blue", "one two three four"]


def test_distances_are_one_minus_rouge_l():
    d = distance_matrix(CLAIMS)
    assert d[0, 1] == pytest.approx(0.25) and d[0, 2] == pytest.approx(0.5) and d[1, 2] == pytest.approx(0.5)
    assert d[3, 4] == pytest.approx(1 / 7) and d[0, 5] == 1.0 and d[3, 0] == 1.0
    assert (d == d.T).all() and (d.diagonal() == 0).all()


@pytest.mark.parametrize("threshold, clusters", [
    (0.1, 6),   # nothing is that close
    (0.2, 5),   # b1+b2 (1/7)
    (0.3, 4),   # + a1+a2 (0.25)
    (0.4, 4),
    (0.5, 3),   # + a3, at exactly 0.5 from both, joins a1+a2 (complete linkage: max(0.5, 0.5); <= t)
    (0.6, 3),
    (0.99, 3),  # unrelated claims (distance 1) merge at no threshold below 1
    (1.0, 1),   # ... and at t = 1 every distance is <= t: one cluster
])
def test_cluster_counts_at_thresholds(threshold, clusters):
    assert cluster_counts(CLAIMS, (threshold,)) == {threshold: clusters}


def test_claims_exactly_at_the_threshold_cluster_together():
    # The paper merges at distance <= t. 1 - ROUGE-L is 0.5 exactly for the first pair, and
    # 1 - 0.7 = 0.30000000000000004 in floating point for the second (7 of 10 words shared).
    half = ["alpha beta gamma delta", "alpha beta zeta eta"]
    seven = ["w1 w2 w3 w4 w5 w6 w7 w8 w9 w10", "w1 w2 w3 w4 w5 w6 w7 x8 x9 x10"]
    assert distance_matrix(half)[0, 1] == 0.5 and distance_matrix(seven)[0, 1] == pytest.approx(0.3)
    assert cluster_counts(half, (0.5, 0.49)) == {0.5: 1, 0.49: 2}
    assert cluster_counts(seven, (0.3, 0.29)) == {0.3: 1, 0.29: 2}


def test_complete_linkage_not_single():
    # a chain x-y-z with neighbours at 0.25 but ends at 0.5: single linkage would give one
    # cluster at 0.4, complete linkage keeps the far end apart.
    chain = ["k1 k2 k3 k4", "k2 k3 k4 k5", "k3 k4 k5 k6"]
    d = distance_matrix(chain)
    assert d[0, 1] == pytest.approx(0.25) and d[0, 2] == pytest.approx(0.5)
    assert cluster_counts(chain, (0.4,)) == {0.4: 2}
    assert cluster_counts([], (0.5,)) == {0.5: 0} and cluster_counts(["x"], (0.5,)) == {0.5: 1}


def test_deduplicate_and_sentences():
    assert deduplicate(["The river flooded.", "the river  flooded", "The river flooded the old town.",
                        "Wheat prices rose"]) == ["The river flooded.", "The river flooded the old town.",
                                                  "Wheat prices rose"]
    assert deduplicate(["A B C D E F G H I J", "A B C D E F G H I J K"]) == ["A B C D E F G H I J"]  # F1 0.95
    text = "# Themes\n\nThe river flooded the town [Data: Reports (1, 2)]. Farmers sold wheat! - A bullet"
    assert sentences(text) == ["Themes", "The river flooded the town.", "Farmers sold wheat!", "A bullet"]
    assert sentences("河流淹没了城镇。农民卖了小麦！") == ["河流淹没了城镇。", "农民卖了小麦！"]
    assert rouge_l("河流淹没了城镇", "河流淹没了村庄") > 0.5  # Chinese is tokenised by character


def test_run_claims_dedupes_clusters_and_reruns_free(tmp_path):
    store = EvalStore(tmp_path / "ev")
    store.write_all("questions", [{"id": "q1", "persona": "", "task": "", "question": "What happened?"}])
    store.append("answers", {"question_id": "q1", "condition": "C0",
                             "answer": "Alpha beta happened. Red green followed. I think it matters."})
    store.append("answers", {"question_id": "q1", "condition": "SS", "answer": "Nothing much."})

    def responder(body):
        assert schema_name(body) == "Extracted"
        if "Alpha beta" in last_user(body):
            return {"selected": [1, 2, 9], "claims": CLAIMS + ["Alpha Beta Gamma Delta."]}
        return {"selected": [], "claims": []}

    llm = ScriptedLLM(responder)
    out = asyncio.run(run_claims(llm.client(cache=tmp_path / "c.sqlite"), store, ["C0", "SS"],
                                 thresholds=(0.3, 0.6)))
    assert out["run"]["calls"] == 2
    rows = store.done("claims")
    c0 = rows[("q1", "C0")]
    assert c0["raw_claims"] == 7 and c0["n_claims"] == 6  # the repeated claim is dropped
    assert c0["selected"] == [1, 2]  # sentence numbers outside the answer are dropped
    assert c0["clusters"] == {"0.3": 4, "0.6": 3}
    assert rows[("q1", "SS")]["n_claims"] == 0 and rows[("q1", "SS")]["clusters"] == {"0.3": 0, "0.6": 0}
    again = ScriptedLLM(responder)
    asyncio.run(run_claims(again.client(cache=tmp_path / "c.sqlite"), store, ["C0", "SS"]))
    assert again.requests == []


def test_agreement_excludes_ties():
    rows = [{"question_id": q, "condition": c, "n_claims": n, "clusters": {"0.5": k}}
            for q, c, n, k in [("q1", "A", 10, 5), ("q1", "B", 4, 5),
                               ("q2", "A", 3, 2), ("q2", "B", 8, 6),
                               ("q3", "A", 5, 1), ("q3", "B", 5, 3)]]
    majority = {("q1", "A", "B", "comprehensiveness"): "A",   # claims agree
                ("q2", "A", "B", "comprehensiveness"): "A",   # claims say B: disagree
                ("q3", "A", "B", "comprehensiveness"): "B",   # equal claim counts: excluded
                ("q1", "A", "B", "diversity"): "A",           # equal clusters: excluded
                ("q2", "A", "B", "diversity"): "B",           # agree
                ("q3", "A", "B", "diversity"): "tie"}         # judge tie: excluded
    got = {a["metric"]: a for a in agreement(rows, majority, (0.5,))}
    assert (got["claims"]["agree"], got["claims"]["compared"]) == (1, 2)
    assert (got["clusters@0.5"]["agree"], got["clusters@0.5"]["compared"]) == (1, 1)
