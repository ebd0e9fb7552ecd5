"""WebShop (lite)'s catalog: products and instructions from a JSON file, the keyword search over the products, and
the reward of a purchase (`webshop.WebShopEnv` is the environment on top of them; its docstring gives the rules)."""

from __future__ import annotations

import functools
import importlib.resources
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragen_lit.envs.base import CHARSET, OptionError

MAX_RESULTS = 50
_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    """Lower-case alphanumeric words of `text` (`T-Shirt` -> `t`, `shirt`)."""
    return _WORD.findall(text.lower())


def contains_phrase(text: str, phrase: str) -> bool:
    """Whether the words of `phrase` occur consecutively among the words of `text`."""
    haystack, needle = words(text), words(phrase)
    if not needle:
        return False
    return any(haystack[i : i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


# ------------------------------------------------------------------------------------------ data
@dataclass(frozen=True)
class Product:
    """One catalog entry. `type` plays WebShop's `query` (what the product is), `category` its
    `product_category` path, `title` its `name`; `options` maps an option name to its values."""

    id: str
    title: str
    type: str
    category: tuple[str, ...]
    attributes: tuple[str, ...]
    options: Mapping[str, tuple[str, ...]]
    price: float

    def option_of(self, value: str) -> str | None:
        """The option name that has `value` (values are unique within a product), or None."""
        return next((name for name, values in self.options.items() if value in values), None)


@dataclass(frozen=True)
class Goal:
    """An instruction and what a purchase is judged against: the target product (for the type
    reward), the instruction's attributes and option values, and the price limit."""

    instruction: str
    target: Product
    attributes: tuple[str, ...]
    options: Mapping[str, str]
    price_upper: float


@dataclass(frozen=True)
class Shop:
    """A loaded catalog and instruction set, with what the observation space needs."""

    products: tuple[Product, ...]
    goals: tuple[Goal, ...]
    charset: frozenset[str]
    by_id: Mapping[str, Product]


def default_data_path() -> Path:
    return Path(str(importlib.resources.files("ragen_lit.envs").joinpath("data", "webshop_synthetic.json")))


def load_shop(path: str | Path | None = None) -> Shop:
    """The catalog and goals of a JSON file (default: the bundled set); cached per file and
    modification time, so the many envs of a rollout share one copy."""
    file = default_data_path() if path is None else Path(path).expanduser()
    if not file.is_file():
        raise OptionError("path", str(file), "an existing WebShop JSON file (see scripts/make_webshop_data.py)")
    return _load_cached(str(file.resolve()), file.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _load_cached(file: str, mtime_ns: int) -> Shop:
    try:
        with open(file, encoding="utf-8") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as error:
        raise OptionError("path", file, f"a JSON file ({error.msg} at line {error.lineno})") from None
    try:
        return shop_from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise OptionError("path", file, f"a WebShop catalog with 'products' and 'goals' ({error!r:.120})") from None


def shop_from_dict(data: Mapping[str, Any]) -> Shop:
    """A `Shop` from the file layout `{"products": [...], "goals": [...]}` (see webshop_synthetic.py)."""
    products = []
    for record in data["products"]:
        options = {str(name): tuple(str(v) for v in values) for name, values in record["options"].items()}
        values = [v for vs in options.values() for v in vs]
        if len(values) != len(set(values)) or any(not v for v in values):
            raise ValueError(f"product {record['id']}: option values must be non-empty and unique")
        products.append(
            Product(
                id=str(record["id"]),
                title=str(record["title"]),
                type=str(record["type"]),
                category=tuple(str(level) for level in record["category"]),
                attributes=tuple(str(a) for a in record["attributes"]),
                options=options,
                price=float(record["price"]),
            )
        )
    by_id = {p.id: p for p in products}
    if len(by_id) != len(products) or not products:
        raise ValueError("product ids must be unique and there must be at least one product")
    goals = []
    for record in data["goals"]:
        target = by_id[record["product"]]
        options = {str(name): str(value) for name, value in record["options"].items()}
        if any(target.option_of(value) != name for name, value in options.items()):
            raise ValueError(f"goal options {options} are not options of {target.id}")
        goals.append(
            Goal(
                instruction=str(record["instruction"]),
                target=target,
                attributes=tuple(str(a) for a in record["attributes"]),
                options=options,
                price_upper=float(record["price_upper"]),
            )
        )
    if not goals:
        raise ValueError("there must be at least one goal")
    text = "".join(g.instruction for g in goals) + "".join(
        p.id + p.title + "".join(p.category) + "".join(p.attributes) + "".join(sum(p.options.values(), ()))
        for p in products
    )
    return Shop(tuple(products), tuple(goals), CHARSET | frozenset(text), by_id)


# ---------------------------------------------------------------------------------------- reward
def type_reward(query_match: bool, category_match: bool, title_score: float) -> float:
    """WebShop's r_type (Yao et al. 2022, §3.2 and its `get_type_reward`): 1 when the purchase is the
    same kind of product as the target (same search query, >= 2 shared category levels, or more
    than 0.2 of the target title's nouns in the purchased title), else 0.5; 0.1 when under 0.1 of
    the nouns are shared and 0 when none is."""
    if title_score == 0.0:
        return 0.0
    if title_score < 0.1:
        return 0.1
    return 1.0 if query_match or category_match or title_score > 0.2 else 0.5


def title_score(purchased: Product, target: Product) -> float:
    """Share of the target's type nouns found among the purchased product's type nouns (lite: the
    type names stand for the nouns WebShop's parser extracts from the titles)."""
    wanted = set(words(target.type))
    return len(wanted & set(words(purchased.type))) / len(wanted) if wanted else 0.2


def attribute_matches(purchased: Product, goal: Goal) -> int:
    """Goal attributes the purchased product has: listed among its attributes or, as in WebShop,
    written in its title (lite: exact phrases instead of WebShop's fuzzy match > 85)."""
    have = {a.lower() for a in purchased.attributes}
    return sum(a.lower() in have or contains_phrase(purchased.title, a) for a in goal.attributes)


def option_matches(selected: Mapping[str, str], goal: Goal) -> int:
    """Goal option values among the selected ones (exact, as WebShop matches sizes)."""
    chosen = {value.lower() for value in selected.values()}
    return sum(value.lower() in chosen for value in goal.options.values())


def webshop_reward(purchased: Product, selected: Mapping[str, str], goal: Goal) -> float:
    """The reward of buying `purchased` with the options `selected`, as WebShop defines it (Yao et
    al. 2022, §3.2, Eq. 1):

        r = r_type * (|U_att ∩ Y_att| + |U_opt ∩ Y_opt| + 1[y_price <= u_price]) / (|U_att| + |U_opt| + 1)

    U = the goal (instruction attributes, option values, price limit), Y = the purchase; r_type is
    `type_reward`. A task is a success when r = 1.
    """
    query_match = purchased.type == goal.target.type
    category_match = len(set(purchased.category) & set(goal.target.category)) >= 2
    r_type = type_reward(query_match, category_match, title_score(purchased, goal.target))
    matched = (
        attribute_matches(purchased, goal) + option_matches(selected, goal) + (purchased.price <= goal.price_upper)
    )
    return r_type * matched / (len(goal.attributes) + len(goal.options) + 1)


# ---------------------------------------------------------------------------------------- search
def search_products(products: Sequence[Product], query: str, limit: int = MAX_RESULTS) -> list[int]:
    """Indices of the products matching `query`, best first (keyword score; module docstring)."""
    terms = set(words(query))
    scored = []
    for index, product in enumerate(products):
        title = set(words(product.title))
        other = set(words(" ".join([product.type, *product.category, *product.attributes])))
        score = sum(2 if term in title else 1 if term in other else 0 for term in terms)
        if score > 0:
            scored.append((-score, index))
    scored.sort()
    return [index for _, index in scored[:limit]]


def format_price(price: float) -> str:
    return f"${price:.2f}"
