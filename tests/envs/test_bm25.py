"""BM25 scores checked by hand on a three-document corpus, and the retrieval rules around them."""

import math

import numpy as np
import pytest

from ragen_lit.envs.bm25 import BM25Index, tokenize

# N = 3 documents of 2, 3 and 1 tokens: avgdl = 2.
CORPUS = ["cat dog", "Cat, cat! mouse", "bird"]


def test_tokenize_lowercases_and_splits_on_non_alphanumerics():
    assert tokenize("Zorvex-Labs, Inc. (1987)") == ["zorvex", "labs", "inc", "1987"]
    assert tokenize("snake_case Zoë") == ["snake", "case", "zoë"]
    assert tokenize(" ,.; ") == []


def test_scores_by_hand():
    index = BM25Index(CORPUS, k1=1.2, b=0.75)
    # cat: df 2 -> idf ln(1 + 1.5/2.5) = ln 1.6
    # d0: tf 1, |d|/avgdl 1   -> 1 * 2.2 / (1 + 1.2 * (0.25 + 0.75))     = 1.0
    # d1: tf 2, |d|/avgdl 1.5 -> 2 * 2.2 / (2 + 1.2 * (0.25 + 1.125))    = 4.4 / 3.65
    assert index.idf("cat") == pytest.approx(math.log(1.6))
    expected = [math.log(1.6), 4.4 / 3.65 * math.log(1.6), 0.0]
    np.testing.assert_allclose(index.scores("cat"), expected)
    np.testing.assert_allclose(index.scores("cat"), [0.470004, 0.566580, 0.0], atol=1e-6)
    # mouse, bird: df 1 -> idf ln(1 + 2.5/1.5) = ln(8/3)
    # d1: tf 1 -> 2.2 / (1 + 1.65) ; d2: tf 1, |d|/avgdl 0.5 -> 2.2 / (1 + 1.2 * (0.25 + 0.375)) = 2.2 / 1.75
    idf = math.log(8 / 3)
    np.testing.assert_allclose(index.scores("mouse bird"), [0.0, 2.2 / 2.65 * idf, 2.2 / 1.75 * idf])
    np.testing.assert_allclose(index.scores("mouse bird"), [0.0, 0.814273, 1.233042], atol=1e-6)


def test_k1_and_b():
    # b = 0: no length normalisation, d1's cat = 2 * 2.2 / (2 + 1.2)
    np.testing.assert_allclose(BM25Index(CORPUS, b=0.0).scores("cat"), [math.log(1.6), 4.4 / 3.2 * math.log(1.6), 0.0])
    # k1 = 0: a term counts by presence only, score = sum of idf
    np.testing.assert_allclose(
        BM25Index(CORPUS, k1=0.0).scores("cat mouse"), [math.log(1.6), math.log(1.6) + math.log(8 / 3), 0]
    )
    with pytest.raises(ValueError, match="k1"):
        BM25Index(CORPUS, b=1.5)


def test_repeated_query_terms_count_once_and_unknown_terms_nothing():
    index = BM25Index(CORPUS)
    np.testing.assert_allclose(index.scores("cat cat CAT"), index.scores("cat"))
    assert not index.scores("zebra").any()
    assert index.idf("zebra") == pytest.approx(math.log(1 + 3.5 / 0.5))


def test_search_ranks_best_first_drops_non_matches_and_breaks_ties_by_position():
    index = BM25Index(CORPUS)
    assert [i for i, _ in index.search("mouse bird", 5)] == [2, 1]
    assert [i for i, _ in index.search("cat", 1)] == [1]
    assert index.search("zebra", 3) == []
    assert [i for i, _ in BM25Index(["a x", "a y", "a z"]).search("a", 3)] == [0, 1, 2]


def test_empty_corpus_and_empty_documents():
    assert BM25Index([]).search("cat", 3) == []
    assert BM25Index(["", "..."]).search("cat", 3) == []
