"""Write the bundled SearchQA set (`src/ragen_lit/envs/data/search_qa_corpus.jsonl` and
`search_qa_questions.jsonl`): a generated world of companies, people, cities and countries, one passage per
entity, and single- and multi-hop questions about it, a pure function of --seed.

    python scripts/make_search_qa_data.py                   # seed 0, into the package
    python scripts/make_search_qa_data.py --seed 1 --out /tmp/searchqa

The generator is `ragen_lit.envs.search_qa_synthetic`.
"""

if __name__ == "__main__":
    from ragen_lit.envs.search_qa_synthetic import main

    raise SystemExit(main())
