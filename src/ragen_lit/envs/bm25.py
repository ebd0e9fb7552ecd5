"""Okapi BM25 retrieval over a small in-memory corpus (pure Python + numpy), the retriever of `search_qa`.

For a query q and a document d of length |d| (tokens) in a corpus of N documents with mean length avgdl,

    score(q, d) = sum over distinct terms t of q:  idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + K(d))
    K(d)        = k1 * (1 - b + b * |d| / avgdl)
    idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

with tf(t, d) the count of t in d and df(t) the number of documents holding t (Robertson & Zaragoza 2009;
the `1 +` inside the log is Lucene's, so a term in more than half the documents still scores >= 0). A query
term counts once however often it is repeated. `k1` saturates the term frequency, `b` sets how much a long
document is discounted. The tokenizer lower-cases and splits on anything that is not a letter or a digit.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np

_TOKEN = re.compile(r"[^\W_]+")


def tokenize(text: str) -> list[str]:
    """Lower-cased runs of letters and digits: `"Zorvex-Labs, Inc."` -> `["zorvex", "labs", "inc"]`."""
    return _TOKEN.findall(text.lower())


class BM25Index:
    """An inverted index of `documents` (strings) scored with BM25 (see the module docstring).

    Args:
        documents: the texts to index; results refer to them by position.
        k1: term-frequency saturation, >= 0 (0: a term counts only by presence).
        b: length normalisation in [0, 1] (0: none, 1: full).
    """

    def __init__(self, documents: Sequence[str], k1: float = 1.2, b: float = 0.75) -> None:
        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        self.k1, self.b = float(k1), float(b)
        self.num_documents = len(documents)
        postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        lengths = np.zeros(self.num_documents, dtype=np.float64)
        for index, document in enumerate(documents):
            counts = Counter(tokenize(document))
            lengths[index] = sum(counts.values())
            for term, count in counts.items():
                postings[term].append((index, count))
        self.lengths = lengths  # [N] tokens per document
        self.mean_length = float(lengths.mean()) if self.num_documents and lengths.sum() > 0 else 1.0
        # term -> (document indices [n] int, term counts [n] float)
        self._postings = {
            term: (np.array([i for i, _ in pairs], dtype=np.int64), np.array([c for _, c in pairs], dtype=np.float64))
            for term, pairs in postings.items()
        }

    def idf(self, term: str) -> float:
        """The inverse document frequency of `term` (a token; 0 documents hold it -> ln(1 + (N + 0.5) / 0.5))."""
        held = self._postings.get(term)
        df = 0 if held is None else len(held[0])
        return math.log(1.0 + (self.num_documents - df + 0.5) / (df + 0.5))

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for `query`: [N] float, 0 for documents sharing no term with it."""
        scores = np.zeros(self.num_documents, dtype=np.float64)
        for term in dict.fromkeys(tokenize(query)):
            held = self._postings.get(term)
            if held is None:
                continue
            indices, counts = held
            norm = self.k1 * (1.0 - self.b + self.b * self.lengths[indices] / self.mean_length)
            scores[indices] += self.idf(term) * counts * (self.k1 + 1.0) / (counts + norm)
        return scores

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """The `k` best `(document index, score)` pairs for `query`, best first; documents that share no
        term with the query are never returned; ties go to the earlier document."""
        scores = self.scores(query)
        order = np.argsort(-scores, kind="stable")[:k]
        return [(int(i), float(scores[i])) for i in order if scores[i] > 0]
