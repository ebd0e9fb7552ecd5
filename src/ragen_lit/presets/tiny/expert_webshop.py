"""The scripted WebShop (lite) shopper behind `ExpertEngine`: reads the page, answers one turn.

It plays the way a person new to the shop would: it reads the instruction into the wanted item
(colour, material and type), features, option values and price limit; searches for the item and
features; on the results page clicks the first product not yet visited whose title holds every word
of the item and whose price is within the limit (else the next page, else the best partial match);
on the product page checks the item, features, options and price, goes back to the results when
something is missing, otherwise answers with clicks on the wanted option values and `buy` (an
episode limited to fewer actions per turn drops the rest; the next turn picks up from the page). With
probability `epsilon` per turn it tries something else and says so ("I try result 3."): a random listed
product, or buying without the remaining options; that leaves an imitating policy imperfect.

It clicks a product by its number on the results page (`click[1]`), not by its id, and its reasoning
names no id: a number is one token to write, an id five to copy off the page, which the tiny model
learns last (the env accepts either; envs/webshop.py).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from ragen_lit.envs.webshop_catalog import words

_INSTRUCTION = re.compile(r"^Instruction: (.*)$", re.MULTILINE)
_OPENER = re.compile(r"^(?:i need|i want|find me|i am looking for)\s+(?:a pair of|an|a)\s+", re.IGNORECASE)
_PRICE = re.compile(r"^under \$(\d+(?:\.\d+)?)$")
_RESULT = re.compile(r"^(\d+)\. \[(\w+)\] (.*) \$(\d+\.\d\d)$", re.MULTILINE)
_VISITED = re.compile(r"^Page: product (\w+)$", re.MULTILINE)
_FIELD = re.compile(r"^(Price|Attributes|Options|Selected): (.*)$", re.MULTILINE)


@dataclass
class Wish:
    """What an instruction asks for."""

    item: str  # e.g. "red cotton shirt"
    features: list[str] = field(default_factory=list)
    options: dict[str, str] = field(default_factory=dict)
    price_limit: float = float("inf")


def read_instruction(instruction: str) -> Wish:
    """`I need a red cotton shirt, long sleeve, size: m, under $40` -> item, features, options, limit."""
    first, *rest = [part.strip() for part in instruction.split(",")]
    wish = Wish(item=_OPENER.sub("", first))
    for part in rest:
        price = _PRICE.match(part)
        if price:
            wish.price_limit = float(price.group(1))
        elif ": " in part:
            name, value = part.split(": ", 1)
            wish.options[name] = value
        elif part:
            wish.features.append(part)
    return wish


def webshop_reply(observation: str, prompt: str, rng: random.Random, epsilon: float) -> tuple[str, list[str]]:
    """Reasoning and the one action of a WebShop turn (`prompt` is the whole rendered prompt: the
    product pages already in it count as visited)."""
    instruction = _INSTRUCTION.search(observation)
    if instruction is None:
        raise ValueError(f"not a WebShop observation: {observation[:80]!r}")
    wish = read_instruction(instruction.group(1))
    page = next((line[len("Page: ") :] for line in observation.split("\n") if line.startswith("Page: ")), "")
    if page == "search":
        query = " ".join([wish.item, *wish.features])
        return f"I search for {query}.", [f"search[{query}]"]
    text = f"Wanted: {wish.item}."
    if page.startswith("results"):
        return _results_turn(observation, prompt, wish, text, rng, epsilon)
    if page.startswith("product"):
        return _product_turn(observation, page.split()[-1], wish, text, rng, epsilon)
    return text + " Nothing to do here; back to search.", ["click[back to search]"]


def _results_turn(
    observation: str, prompt: str, wish: Wish, text: str, rng: random.Random, epsilon: float
) -> tuple[str, list[str]]:
    listed = [(number, pid, title, float(price)) for number, pid, title, price in _RESULT.findall(observation)]
    if not listed:
        return text + " No results; back to search.", ["click[back to search]"]
    if rng.random() < epsilon:
        number = rng.choice(listed)[0]
        return text + f" I try result {number}.", [f"click[{number}]"]
    visited = set(_VISITED.findall(prompt))
    wanted = set(words(wish.item))

    def matched(title: str) -> int:
        return len(wanted & set(words(title)))

    fresh = [entry for entry in listed if entry[1] not in visited]
    full = [entry for entry in fresh if matched(entry[2]) == len(wanted) and entry[3] <= wish.price_limit]
    if full:
        number, _, _, price = full[0]
        return text + f" Result {number} matches the item at ${price:.2f}.", [f"click[{number}]"]
    if "click[next page]" in observation:
        return text + " No new match on this page; next page.", ["click[next page]"]
    if fresh:
        number = max(fresh, key=lambda entry: matched(entry[2]))[0]
        return text + f" No full match; result {number} is the closest.", [f"click[{number}]"]
    return text + " Every listed product was visited; back to search.", ["click[back to search]"]


def _product_turn(
    observation: str, pid: str, wish: Wish, text: str, rng: random.Random, epsilon: float
) -> tuple[str, list[str]]:
    fields = dict(_FIELD.findall(observation))
    title = observation.split(f"Page: product {pid}\n", 1)[-1].split("\n", 1)[0]
    attributes = [a.strip() for a in fields.get("Attributes", "").split(",")]
    available = set(re.findall(r"\[([^\]]+)\]", fields.get("Options", "")))
    selected = {part.strip() for part in fields.get("Selected", "none").split(", ")}
    price = float(fields.get("Price", "$0").lstrip("$"))
    have = set(words(title + " " + " ".join(attributes)))
    missing = [w for w in words(wish.item) if w not in have]
    missing += [f for f in wish.features if f not in attributes]
    missing += [value for value in wish.options.values() if value not in available]
    if price > wish.price_limit:
        missing.append(f"a price within ${wish.price_limit:.0f}")
    if missing:
        return text + f" It lacks {', '.join(missing)}; back to results.", ["click[back to results]"]
    todo = [(name, value) for name, value in wish.options.items() if f"{name}: {value}" not in selected]
    if rng.random() < epsilon:
        if todo or not available:
            return text + " It fits; I try buying it as it is.", ["buy"]
        value = rng.choice(sorted(available))
        return text + f" It fits; I try {value}.", [f"click[{value}]"]
    if todo:
        chosen = " and ".join(f"{name} {value}" for name, value in todo)
        return text + f" It fits; I select {chosen}, then buy.", [*(f"click[{value}]" for _, value in todo), "buy"]
    return text + " It fits with every option selected; I buy it.", ["buy"]
