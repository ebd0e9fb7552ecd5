"""WebShop (lite): find, customise and buy the product an instruction asks for, on text web pages.

After WebShop (Yao et al. 2022, "WebShop: Towards Scalable Real-World Web Interaction with Grounded
Language Agents"; ragen_reference.md §3.7), shrunk to run offline on a small generated catalog. The
catalog and the instructions come from a JSON file (`path`), by default the bundled set
`ragen_lit/envs/data/webshop_synthetic.json` made by `scripts/make_webshop_data.py`; the instance of
seed s is instruction `s % len(goals)`.

Pages and the actions each accepts (anything else is an invalid action: state kept, reward 0):

* search page: `search[keywords]`;
* results page (`results_per_page` products of the ranked list, numbered from 1 on each page:
  `1. [P0042] Alder red cotton shirt $19.99`): `click[<product id>]`, `click[<number>]` or
  `click[<title>]` on a listed product, `click[next page]`, `click[prev page]`, `click[back to search]`;
* product page: `click[<option value>]` (or `click[<option>: <value>]`) to select an option,
  `click[back to results]`, `click[back to search]`, and `buy` (also `buy now`, `click[buy now]`),
  which ends the episode with the reward `webshop_reward`.

As in WebShop, searching is only possible from the search page. Search ranks products by a keyword
score (`search_products`): every distinct query word found in a product's title counts 2, one found
only in its type, category or attributes counts 1; products scoring 0 are left out, ties go by
catalog order, and at most `MAX_RESULTS` are listed (WebShop lists the top 50 of a BM25 search).

A listed product is clicked by its id as in WebShop, or by what else the page shows of it: its number
on the page or its exact title (the first listed one with that title; an id wins over a number).
WebShop's ids are links a person clicks without reading them; here they are strings a policy must copy,
and a model trained from scratch (the tiny model) copies a 5-token id off a page far less reliably
than it writes a one-token number (docs/DEFAULT_RECIPE.md, "The new environments"). Every way of
clicking lands on the same product page with the same canonical action `click[<product id>]`.

Other differences from WebShop, all for a small offline catalog: no description, features or reviews
sub-pages (the product page lists the attributes); attributes and options match exactly where WebShop
matches fuzzily; the product's type name stands for the title nouns WebShop extracts with spaCy.
The reward comes at `buy` only (0 for every other step and for an episode that runs out of actions).
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragen_lit.envs.base import CHARSET, OptionError, TextEnv, check_int

MAX_RESULTS = 50
MAX_QUERY_LENGTH = 100  # characters of a query kept (and shown on the results page)
HEADER = "WebShop"
_WORD = re.compile(r"[a-z0-9]+")
_ACTION = re.compile(r"^(search|click)\s*\[(.*)\]$", re.DOTALL)
BUY_WORDS = ("buy", "buy now", "click[buy now]", "buy[]", "buy[now]")


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


# ------------------------------------------------------------------------------------------- env
class WebShopEnv(TextEnv):
    """WebShop (lite). Public state for scripted experts and tests: `goal`, `page` (search, results,
    product or done), `query`, `results` (product indices), `page_number` (0-based), `product`,
    `selected` (option -> value), `purchase_reward`."""

    instruction = (
        "You are shopping in a web shop. Find the product that matches the instruction, select its "
        "options and buy it. Actions: search[keywords] on the search page; click[result number or product "
        "id], click[next page], click[prev page], click[back to search] on a results page; click[option "
        "value], click[back to results], click[back to search] and buy on a product page."
    )
    actions = None

    def __init__(
        self,
        path: str | None = None,
        results_per_page: int = 5,
        max_actions_per_episode: int = 9,
        render_mode: str | None = None,
    ) -> None:
        shop = load_shop(path)
        self.path = path
        self.products = shop.products
        self.goals = shop.goals
        self._by_id = shop.by_id
        self.results_per_page = check_int("results_per_page", results_per_page, 1)
        self.goal = self.goals[0]
        self._reset_state()
        super().__init__(
            max_actions_per_episode=max_actions_per_episode,
            observation_max_length=self._max_observation_length(),
            observation_charset=shop.charset,
            render_mode=render_mode,
        )

    def _reset_state(self) -> None:
        self.page = "search"
        self.query = ""
        self.results: list[int] = []
        self.page_number = 0
        self.product: Product | None = None
        self.selected: dict[str, str] = {}
        self.purchase_reward: float | None = None

    def _max_observation_length(self) -> int:
        """An upper bound on every page's length (the observation space's `max_length`)."""
        instruction = max(len(g.instruction) for g in self.goals)
        number = len(f"{self.results_per_page}. ")
        result_line = max(len(self._result_line(p)) + 1 for p in self.products) + number
        results = 200 + MAX_QUERY_LENGTH + self.results_per_page * result_line  # 200: header and actions lines
        longest = [(p, {name: max(values, key=len) for name, values in p.options.items()}) for p in self.products]
        product = max(len(self._product_page(p, selected)) for p, selected in longest)
        done = max(len(self._done_page(p, selected, 1.0)) for p, selected in longest)
        return len(HEADER) + len("\nInstruction: \n") + instruction + max(results, product, done, 200)

    # ----------------------------------------------------------------------------- TextEnv hooks
    @property
    def item_count(self) -> int:
        return len(self.goals)

    def _new_episode(self, seed: int) -> None:
        self.goal = self.goals[seed % len(self.goals)]
        self._reset_state()

    @property
    def is_success(self) -> bool:
        return self.purchase_reward == 1.0

    def parse_action(self, text: str) -> str | None:
        """The canonical action (`search[red cotton shirt]`, `click[P0042]` also for `click[1]` or
        `click[<its title>]`, `click[size: m]`,
        `click[next page]`, `buy`, ...) for `text` if the current page accepts it, else None."""
        if not isinstance(text, str) or self.page == "done":
            return None
        key = " ".join(text.split()).lower()
        if key in BUY_WORDS:
            return "buy" if self.page == "product" else None
        match = _ACTION.match(key)
        if match is None:
            return None
        verb, argument = match.group(1), match.group(2).strip()
        if not argument:
            return None
        if verb == "search":
            query = " ".join(words(argument))[:MAX_QUERY_LENGTH].strip()
            return f"search[{query}]" if self.page == "search" and query else None
        if argument == "back to search":
            return "click[back to search]" if self.page in ("results", "product") else None
        if self.page == "results":
            return self._parse_results_click(argument)
        if self.page == "product":
            return self._parse_product_click(argument)
        return None

    def _parse_results_click(self, argument: str) -> str | None:
        if argument in ("next page", "next", "next >") and self.page_number + 1 < self._page_count():
            return "click[next page]"
        if argument in ("prev page", "prev", "< prev") and self.page_number > 0:
            return "click[prev page]"
        listed = [self.products[i] for i in self._shown()]
        by_id = {p.id.lower(): p.id for p in listed}
        by_number = {str(n): p.id for n, p in enumerate(listed, 1)}
        by_title = {}
        for p in listed:
            by_title.setdefault(" ".join(p.title.split()).lower(), p.id)
        product_id = by_id.get(argument) or by_number.get(argument) or by_title.get(argument)
        return f"click[{product_id}]" if product_id else None

    def _parse_product_click(self, argument: str) -> str | None:
        if argument in ("back to results", "prev", "< prev", "prev page"):
            return "click[back to results]"
        if argument == "buy now":
            return "buy"
        assert self.product is not None
        name, _, value = argument.rpartition(":")
        name, value = name.strip(), value.strip()
        for option, values in self.product.options.items():
            for candidate in values:
                if candidate.lower() == value and name in ("", option.lower()):
                    return f"click[{option}: {candidate}]"
        return None

    def _apply(self, action: str) -> tuple[float, bool]:
        if action == "buy":
            assert self.product is not None
            self.purchase_reward = webshop_reward(self.product, self.selected, self.goal)
            self.page = "done"
            return self.purchase_reward, True
        verb, argument = action[:-1].split("[", 1)
        if verb == "search":
            self.query, self.results, self.page_number = argument, search_products(self.products, argument), 0
            self.page = "results"
        elif argument == "back to search":
            self.page, self.product, self.selected = "search", None, {}
        elif argument == "back to results":
            self.page, self.product, self.selected = "results", None, {}
        elif argument == "next page":
            self.page_number += 1
        elif argument == "prev page":
            self.page_number -= 1
        elif self.page == "results":
            self.product, self.selected, self.page = self._by_id[argument], {}, "product"
        else:
            option, value = argument.split(": ", 1)
            self.selected[option] = value
        return 0.0, False

    # ----------------------------------------------------------------------------------- pages
    def _page_count(self) -> int:
        return max(1, math.ceil(len(self.results) / self.results_per_page))

    def _shown(self) -> list[int]:
        start = self.page_number * self.results_per_page
        return self.results[start : start + self.results_per_page]

    @staticmethod
    def _result_line(product: Product) -> str:
        return f"[{product.id}] {product.title} {format_price(product.price)}"

    def _observation(self) -> str:
        text = f"{HEADER}\nInstruction: {self.goal.instruction}\n"
        if self.page == "search":
            return text + "Page: search\nActions: search[keywords]"
        if self.page == "results":
            return text + self._results_page()
        assert self.product is not None
        if self.page == "product":
            return text + self._product_page(self.product, self.selected)
        return text + self._done_page(self.product, self.selected, self.purchase_reward or 0.0)

    def _results_page(self) -> str:
        if not self.results:
            return f'Page: results for "{self.query}": no products match\nActions: click[back to search]'
        lines = [
            f'Page: results for "{self.query}" (page {self.page_number + 1} of {self._page_count()}, '
            f"{len(self.results)} products)"
        ]
        lines += [f"{n}. {self._result_line(self.products[i])}" for n, i in enumerate(self._shown(), 1)]
        actions = ["click[result number or product id]"]
        if self.page_number + 1 < self._page_count():
            actions.append("click[next page]")
        if self.page_number > 0:
            actions.append("click[prev page]")
        actions.append("click[back to search]")
        return "\n".join(lines) + "\nActions: " + ", ".join(actions)

    @staticmethod
    def _product_page(product: Product, selected: Mapping[str, str]) -> str:
        lines = [
            f"Page: product {product.id}",
            product.title,
            f"Price: {format_price(product.price)}",
            f"Attributes: {', '.join(product.attributes)}",
        ]
        if product.options:
            buttons = {name: " ".join(f"[{value}]" for value in values) for name, values in product.options.items()}
            listed = "; ".join(f"{name} {values}" for name, values in buttons.items())
            lines.append(f"Options: {listed}")
            chosen = ", ".join(f"{name}: {value}" for name, value in selected.items())
            lines.append(f"Selected: {chosen or 'none'}")
        actions = "click[option value], " if product.options else ""
        lines.append(f"Actions: {actions}click[back to results], click[back to search], buy")
        return "\n".join(lines)

    @staticmethod
    def _done_page(product: Product, selected: Mapping[str, str], reward: float) -> str:
        chosen = ", ".join(f"{name}: {value}" for name, value in selected.items())
        options = f" ({chosen})" if chosen else ""
        bought = f"[{product.id}] {product.title}{options} for {format_price(product.price)}"
        return f"Page: done\nBought {bought}. Score {reward:.2f}"
