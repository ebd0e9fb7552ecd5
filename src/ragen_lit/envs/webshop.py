"""WebShop (lite): find, customise and buy the product an instruction asks for, on text web pages.

After WebShop (Yao et al. 2022, "WebShop: Towards Scalable Real-World Web Interaction with Grounded
Language Agents"; docs/METHOD.md §6, WebShop), shrunk to run offline on a small generated catalog. The
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
score (`webshop_catalog.search_products`): every distinct query word found in a product's title counts 2, one found
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

import math
import re
from collections.abc import Mapping

from ragen_lit.envs.base import TextEnv, check_int
from ragen_lit.envs.webshop_catalog import (
    Product,
    format_price,
    load_shop,
    search_products,
    webshop_reward,
    words,
)

MAX_QUERY_LENGTH = 100  # characters of a query kept (and shown on the results page)
HEADER = "WebShop"
_ACTION = re.compile(r"^(search|click)\s*\[(.*)\]$", re.DOTALL)
BUY_WORDS = ("buy", "buy now", "click[buy now]", "buy[]", "buy[now]")


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
