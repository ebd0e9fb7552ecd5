"""Write the bundled SearchQA set: a made-up world of countries, cities, people and companies, one encyclopedia
passage per entity, and single- and multi-hop questions about it.

Every fact is one fixed sentence (`RELATIONS`), so a question is a chain of relations from a named entity:
"In which city was the founder of Zorvex Labs born?" is founder -> birthplace from Zorvex Labs and needs two
searches (Zorvex Labs, then its founder). The names are invented, so a model cannot know the answers and has to
search. `parse_question` and `read_relation` let the scripted expert (presets/tiny/expert.py) follow a chain the
way an agent would: search the entity, read the relation off its passage, search the next one.

The output is a pure function of --seed: re-running it reproduces both files byte for byte. Entry point:
`scripts/make_search_qa_data.py`; the environment reading the set is `ragen_lit.envs.search_qa`.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from ragen_lit.envs.bm25 import BM25Index
from ragen_lit.envs.search_qa import default_corpus_path, default_questions_path


@dataclass(frozen=True)
class Relation:
    """One fact type: the entity kind it starts from, the sentence that states it in that entity's passage
    (`{subject}`, `{value}`), and how the reasoning names it."""

    source: str
    sentence: str
    noun: str


RELATIONS = {
    "founder": Relation("company", "It was founded by {value} in {year}.", "founder"),
    "year": Relation("company", "It was founded by {founder} in {value}.", "founding year"),
    "hq": Relation("company", "{subject} is a company headquartered in {value}.", "headquarters"),
    "profession": Relation("person", "{subject} works as a {value}.", "profession"),
    "birthplace": Relation("person", "{subject} was born in {value}.", "birthplace"),
    "country": Relation("city", "{subject} is a city in {value}.", "country"),
    "capital": Relation("country", "The capital of {subject} is {value}.", "capital"),
}
# question template -> relation chain; the start entity is {x}
TEMPLATES = {
    "Who founded {x}?": ("founder",),
    "In what year was {x} founded?": ("year",),
    "In which city is {x} headquartered?": ("hq",),
    "What is the profession of {x}?": ("profession",),
    "In which city was {x} born?": ("birthplace",),
    "In which country is {x}?": ("country",),
    "What is the capital of {x}?": ("capital",),
    "In which city was the founder of {x} born?": ("founder", "birthplace"),
    "What is the profession of the founder of {x}?": ("founder", "profession"),
    "In which country is {x} headquartered?": ("hq", "country"),
    "In which country was {x} born?": ("birthplace", "country"),
    "Which country is the birthplace of the founder of {x}?": ("founder", "birthplace", "country"),
}
# longer chains first: "In which city was the founder of X born?" must not read as birthplace of "the founder of X"
_QUESTION_PATTERNS = [
    (re.compile("^" + re.escape(template).replace(re.escape("{x}"), "(?P<x>.+)") + "$"), chain)
    for template, chain in sorted(TEMPLATES.items(), key=lambda item: -len(item[1]))
]
_READERS = {
    name: re.compile(
        re.escape(relation.sentence)
        .replace(re.escape("{subject}"), "{subject}")
        .replace(re.escape("{value}"), r"(?P<value>[^.]+?)")
        .replace(re.escape("{year}"), r"\d+")
        .replace(re.escape("{founder}"), r"[^.]+?")
    )
    for name, relation in RELATIONS.items()
}

PROFESSIONS = ["chemist", "painter", "mechanic", "teacher", "pilot", "builder", "surgeon", "composer", "farmer"]
COMPANY_KINDS = ["Labs", "Works", "Systems", "Foods", "Motors", "Press", "Studios", "Textiles", "Shipping"]
CITY_NOTES = ["a harbour", "an old bridge", "a cathedral", "a market", "a university", "vineyards", "a fortress"]
ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s", "st", "t", "tr", "v", "z"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
CODAS = ["", "", "", "n", "r", "l", "s", "m", "x"]


def parse_question(question: str) -> tuple[str, tuple[str, ...]] | None:
    """`(start entity, relation chain)` of a generated question, None for any other text."""
    for pattern, chain in _QUESTION_PATTERNS:
        match = pattern.match(question.strip())
        if match:
            return match.group("x"), chain
    return None


def read_relation(subject: str, passage: str, relation: str) -> str | None:
    """The value of `relation` that `passage` (the passage of `subject`) states, None if it states none."""
    pattern = _READERS[relation].pattern.replace("{subject}", re.escape(subject))
    match = re.search(pattern, passage)
    return match.group("value") if match else None


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(syllables)).capitalize()


def _names(rng: random.Random, count: int, make, taken: set[str]) -> list[str]:
    names = []
    while len(names) < count:
        name = make()
        # every word of a name is new, so that searching a name finds its own passage
        if name not in taken and not any(word.lower() in taken for word in name.split()):
            taken.add(name)
            taken.update(word.lower() for word in name.split())
            names.append(name)
    return names


def make_world(seed: int) -> tuple[list[dict[str, str]], list[dict[str, object]]]:
    """`(corpus, questions)`: passages as `{"id", "title", "text"}` and every question of every template about
    the world of `seed` as `{"question", "answer", "hops"}` (hops = searches needed), shuffled."""
    rng = random.Random(seed)
    taken = {w.lower() for t in [*TEMPLATES, *(r.sentence for r in RELATIONS.values())] for w in re.findall(r"\w+", t)}
    taken |= {w.lower() for w in PROFESSIONS + COMPANY_KINDS + CITY_NOTES}
    countries = _names(rng, 10, lambda: _word(rng, 2) + rng.choice(["ia", "land", "or"]), taken)
    cities = _names(rng, 40, lambda: _word(rng, 2) + rng.choice(["", "", "ton", "burg", "mouth"]), taken)
    firsts = _names(rng, 30, lambda: _word(rng, 2), taken)
    lasts = _names(rng, 60, lambda: _word(rng, rng.choice([1, 2])), taken)
    people = rng.sample([f"{first} {last}" for first in firsts for last in lasts], 150)
    companies = [f"{word} {rng.choice(COMPANY_KINDS)}" for word in _names(rng, 100, lambda: _word(rng, 2), taken)]
    city_country = {city: countries[i % len(countries)] for i, city in enumerate(cities)}
    capital = {country: next(c for c in cities if city_country[c] == country) for country in countries}
    birthplace = {person: rng.choice(cities) for person in people}
    profession = {person: rng.choice(PROFESSIONS) for person in people}
    founder = dict(zip(companies, people))  # the first 100 people found one company each
    hq = {company: rng.choice(cities) for company in companies}
    year = {company: str(rng.randint(1850, 2015)) for company in companies}

    facts = {"founder": founder, "year": year, "hq": hq, "profession": profession}
    facts |= {"birthplace": birthplace, "country": city_country, "capital": capital}
    corpus = []
    for country in countries:
        text = f"{country} is a country. " + RELATIONS["capital"].sentence.format(
            subject=country, value=capital[country]
        )
        corpus.append((country, text))
    for city in cities:
        note = rng.choice(CITY_NOTES)
        corpus.append(
            (city, RELATIONS["country"].sentence.format(subject=city, value=city_country[city]) + f" It has {note}.")
        )
    for person in people:
        text = RELATIONS["profession"].sentence.format(subject=person, value=profession[person])
        text += " " + RELATIONS["birthplace"].sentence.format(subject=person, value=birthplace[person])
        corpus.append((person, text))
    for company in companies:
        text = RELATIONS["hq"].sentence.format(subject=company, value=hq[company])
        text += " " + RELATIONS["founder"].sentence.format(value=founder[company], year=year[company])
        corpus.append((company, text))

    starts = {"company": companies, "person": people, "city": cities, "country": countries}
    questions = []
    for template, chain in TEMPLATES.items():
        for start in starts[RELATIONS[chain[0]].source]:
            answer = start
            for relation in chain:
                answer = facts[relation][answer]
            questions.append({"question": template.format(x=start), "answer": answer, "hops": len(chain)})
    rng.shuffle(questions)
    rng.shuffle(corpus)
    records = [{"id": f"p{i}", "title": title, "text": text} for i, (title, text) in enumerate(corpus)]
    _check_every_entity_is_found(records)
    return records, questions


def _check_every_entity_is_found(corpus: list[dict[str, str]]) -> None:
    """Searching an entity's exact name must return its own passage first (the expert and the hops rely on it)."""
    index = BM25Index([f"{p['title']} {p['text']}" for p in corpus])
    for number, passage in enumerate(corpus):
        best = index.search(passage["title"], 1)
        if not best or best[0][0] != number:
            raise AssertionError(f"searching {passage['title']!r} does not return its own passage first")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: the package's envs/data)")
    args = parser.parse_args(argv)
    corpus_file, questions_file = default_corpus_path(), default_questions_path()
    if args.out is not None:
        corpus_file, questions_file = args.out / corpus_file.name, args.out / questions_file.name
    corpus, questions = make_world(args.seed)
    for file, records in ((corpus_file, corpus), (questions_file, questions)):
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
        print(f"wrote {len(records)} records to {file}")
    return 0
