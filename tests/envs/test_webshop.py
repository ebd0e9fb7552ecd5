"""WebShop (lite): the reward by hand (Yao et al. 2022, Eq. 1), the keyword search, the pages and
actions of an episode, bad actions and bad options, and the bundled generated set."""

import json
import random
import subprocess
import sys
import warnings
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from ragen_lit.envs import make_env
from ragen_lit.envs.webshop import WebShopEnv
from ragen_lit.envs.webshop_catalog import (
    Goal,
    Product,
    attribute_matches,
    default_data_path,
    load_shop,
    option_matches,
    search_products,
    shop_from_dict,
    type_reward,
    webshop_reward,
)
from ragen_lit.envs.webshop_synthetic import make_shop

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_webshop_data.py"


def product(pid, title, kind, category, attributes, options=None, price=25.0):
    return Product(pid, title, kind, tuple(category), tuple(attributes), options or {}, price)


SHIRT = product(
    "P1",
    "Alder red cotton shirt",
    "shirt",
    ["clothing", "tops", "shirt"],
    ["red", "cotton", "long sleeve", "machine washable"],
    {"size": ("s", "m", "l"), "fit": ("slim fit", "regular fit")},
    price=24.99,
)
GOAL = Goal(
    "I need a red cotton shirt, long sleeve, size: m, fit: slim fit, under $40",
    SHIRT,
    ("red", "cotton", "long sleeve"),
    {"size": "m", "fit": "slim fit"},
    40.0,
)
PERFECT = {"size": "m", "fit": "slim fit"}


# ---------------------------------------------------------------------------------------- reward
@pytest.mark.parametrize(
    "query_match, category_match, title_score, expected",
    [
        (True, False, 1.0, 1.0),
        (False, True, 0.5, 1.0),
        (False, False, 0.5, 1.0),  # more than 0.2 of the target's nouns
        (False, False, 0.2, 0.5),  # no match of any kind: halved
        (True, False, 0.2, 1.0),
        (True, True, 0.05, 0.1),  # under 0.1 of the nouns: 0.1 whatever else matches
        (True, True, 0.0, 0.0),  # no noun in common: 0
    ],
)
def test_type_reward_levels(query_match, category_match, title_score, expected):
    assert type_reward(query_match, category_match, title_score) == expected


def test_reward_of_the_target_with_its_options_is_one():
    assert webshop_reward(SHIRT, PERFECT, GOAL) == 1.0


@pytest.mark.parametrize(
    "purchased, selected, expected",
    [
        # r = r_type * (attributes + options + price) / (3 + 2 + 1)
        (SHIRT, {}, (3 + 0 + 1) / 6),  # options not selected
        (SHIRT, {"size": "l", "fit": "slim fit"}, (3 + 1 + 1) / 6),  # wrong size
        (
            product("P2", "Cobalt blue cotton shirt", "shirt", ["clothing", "tops", "shirt"], ["blue", "cotton"]),
            PERFECT,
            (1 + 2 + 1) / 6,  # neither red nor long sleeve
        ),
        (
            product("P3", "Lumen cotton shirt", "shirt", ["clothing", "tops", "shirt"], SHIRT.attributes, price=45.0),
            PERFECT,
            (3 + 2 + 0) / 6,  # over the price limit
        ),
        (
            product("P4", "Alder red cotton shirt", "shirt", ["clothing", "tops", "shirt"], ["long sleeve"]),
            PERFECT,
            (3 + 2 + 1) / 6,  # red and cotton read from the title, as WebShop does
        ),
        (
            # same category path (clothing > tops): the type reward stays 1
            product("P5", "Alder red cotton t-shirt", "t-shirt", ["clothing", "tops", "t-shirt"], SHIRT.attributes),
            {"size": "m", "pack": "1 pack"},
            (3 + 1 + 1) / 6,
        ),
        (
            # another kind of product: r_type 0, whatever else matches
            product("P6", "Alder red ceramic mug", "mug", ["home", "kitchen", "mug"], ["red", "cotton", "long sleeve"]),
            PERFECT,
            0.0,
        ),
    ],
)
def test_reward_by_hand(purchased, selected, expected):
    assert webshop_reward(purchased, selected, GOAL) == pytest.approx(expected)


def test_reward_with_half_type_match_and_no_options():
    # target type "tote bag" (nouns tote, bag); a "laptop bag" shares half of them in another aisle: r_type 1
    # (share > 0.2); the goal has no options, so the denominator is attributes + 1
    tote = product("T1", "Harbor black canvas tote bag", "tote bag", ["bags", "everyday", "tote bag"], ["black"])
    goal = Goal("Find me a black tote bag, under $30", tote, ("black", "canvas"), {}, 30.0)
    laptop_bag = product("T2", "Harbor black nylon laptop bag", "laptop bag", ["office", "bags", "laptop bag"], [])
    assert webshop_reward(laptop_bag, {}, goal) == pytest.approx((1 + 1) / 3)
    assert webshop_reward(tote, {}, goal) == 1.0
    assert attribute_matches(laptop_bag, goal) == 1 and option_matches({}, goal) == 0


def test_attribute_phrases_match_whole_words_only():
    sneaker = product("S1", "Kestrel bored mesh sneakers", "sneakers", ["shoes", "athletic", "sneakers"], [])
    goal = Goal("I want a pair of red mesh sneakers, under $90", sneaker, ("red", "mesh"), {}, 90.0)
    assert attribute_matches(sneaker, goal) == 1  # "red" is not a word of "bored"


# ---------------------------------------------------------------------------------------- search
def test_search_scores_title_words_twice_and_drops_non_matches():
    products = [
        product("A", "Alder blue cotton shirt", "shirt", ["clothing", "tops", "shirt"], ["blue", "cotton"]),
        product("B", "Brightline red linen shirt", "shirt", ["clothing", "tops", "shirt"], ["red", "linen", "cotton"]),
        product("C", "Cobalt red ceramic mug", "mug", ["home", "kitchen", "mug"], ["red", "ceramic"]),
        product("D", "Dunmore red cotton shirt", "shirt", ["clothing", "tops", "shirt"], ["red", "cotton"]),
    ]
    # "red cotton shirt": D 2+2+2 = 6, B 2+1+2 = 5, A 0+2+2 = 4, C 2 = 2 (ties would keep catalog order)
    assert search_products(products, "Red cotton SHIRT, please") == [3, 1, 0, 2]
    assert search_products(products, "kitchen") == [2]  # category words count once
    assert search_products(products, "bicycle") == []
    assert search_products(products, "shirt", limit=2) == [0, 1]


# ------------------------------------------------------------------------------------------ env
def shop_file(tmp_path, products, goals):
    path = tmp_path / "shop.json"
    path.write_text(json.dumps({"products": products, "goals": goals}))
    return str(path)


@pytest.fixture
def small_shop(tmp_path):
    colours = ["red", "blue", "green", "black", "white", "grey", "pink"]
    products = [
        {
            "id": f"P{i}",
            "title": f"Alder {colour} cotton shirt",
            "type": "shirt",
            "category": ["clothing", "tops", "shirt"],
            "attributes": [colour, "cotton", "long sleeve"],
            "options": {"size": ["s", "m", "l"]},
            "price": 20.0 + i,
        }
        for i, colour in enumerate(colours)
    ]
    products.append(
        {
            "id": "M1",
            "title": "Cobalt red ceramic mug",
            "type": "mug",
            "category": ["home", "kitchen", "mug"],
            "attributes": ["red", "ceramic"],
            "options": {},
            "price": 9.99,
        }
    )
    goals = [
        {
            "product": "P5",
            "instruction": "I need a grey cotton shirt, size: m, under $30",
            "attributes": ["grey", "cotton"],
            "options": {"size": "m"},
            "price_upper": 30.0,
        }
    ]
    return shop_file(tmp_path, products, goals)


def test_an_episode_search_click_select_buy(small_shop):
    env = WebShopEnv(path=small_shop, results_per_page=3)
    obs, info = env.reset(seed=0)
    assert obs == (
        "WebShop\nInstruction: I need a grey cotton shirt, size: m, under $30\nPage: search\nActions: search[keywords]"
    )
    obs, reward, terminated, truncated, info = env.step("search[Grey cotton shirt]")
    assert (reward, terminated, truncated, info["action_valid"]) == (0.0, False, False, True)
    assert obs.split("\n")[2:] == [
        'Page: results for "grey cotton shirt" (page 1 of 3, 7 products)',
        "1. [P5] Alder grey cotton shirt $25.00",
        "2. [P0] Alder red cotton shirt $20.00",
        "3. [P1] Alder blue cotton shirt $21.00",
        "Actions: click[result number or product id], click[next page], click[back to search]",
    ]
    obs = env.step("click[p5]")[0]
    assert obs.split("\n")[2:] == [
        "Page: product P5",
        "Alder grey cotton shirt",
        "Price: $25.00",
        "Attributes: grey, cotton, long sleeve",
        "Options: size [s] [m] [l]",
        "Selected: none",
        "Actions: click[option value], click[back to results], click[back to search], buy",
    ]
    assert "Selected: size: m" in env.step("click[ M ]")[0]
    obs, reward, terminated, truncated, info = env.step("buy")
    assert (reward, terminated, truncated, info) == (1.0, True, False, {"success": True, "action_valid": True})
    assert obs.endswith("Page: done\nBought [P5] Alder grey cotton shirt (size: m) for $25.00. Score 1.00")
    assert env.num_actions == 4


@pytest.mark.parametrize(
    "click, product",
    [
        ("click[P0]", "P0"),  # the id, as WebShop clicks
        ("click[2]", "P0"),  # the number the page shows
        ("click[ alder RED  cotton shirt ]", "P0"),  # the exact title, case and spaces aside
        ("click[1]", "P5"),
        ("click[3]", "P1"),
    ],
)
def test_a_listed_product_is_clicked_by_id_number_or_title(small_shop, click, product):
    env = WebShopEnv(path=small_shop, results_per_page=3)
    env.reset(seed=0)
    env.step("search[grey cotton shirt]")
    assert env.parse_action(click) == f"click[{product}]"
    obs, reward, terminated, truncated, info = env.step(click)
    assert info["action_valid"] and env.page == "product" and env.product.id == product
    assert obs.split("\n")[2] == f"Page: product {product}"


def test_numbers_count_on_the_shown_page_only(small_shop):
    env = WebShopEnv(path=small_shop, results_per_page=3)
    env.reset(seed=0)
    env.step("search[grey cotton shirt]")
    for bad in ("click[0]", "click[4]", "click[-1]", "click[Alder pink cotton shirt]", "click[alder grey]"):
        assert env.parse_action(bad) is None, bad  # off the page, or not a whole shown title
    obs = env.step("click[next page]")[0]
    assert obs.split("\n")[3] == "1. [P2] Alder green cotton shirt $22.00"
    assert env.parse_action("click[1]") == "click[P2]"
    assert env.parse_action("click[Alder grey cotton shirt]") is None  # listed on page 1, not here
    env.step("click[next page]")  # the last page shows one product
    assert env.parse_action("click[1]") == "click[P6]" and env.parse_action("click[2]") is None


def test_an_id_wins_over_a_number_and_the_first_of_equal_titles_is_clicked(tmp_path):
    product = {
        "title": "Alder red cotton shirt",
        "type": "shirt",
        "category": ["clothing", "tops", "shirt"],
        "attributes": ["red"],
        "options": {},
        "price": 10.0,
    }
    products = [{**product, "id": "2"}, {**product, "id": "X"}]
    goals = [
        {"product": "X", "instruction": "I need a red shirt", "attributes": ["red"], "options": {}, "price_upper": 20}
    ]
    env = WebShopEnv(path=shop_file(tmp_path, products, goals))
    env.reset(seed=0)
    env.step("search[red shirt]")
    assert env.parse_action("click[2]") == "click[2]"  # product "2", although "2." numbers product X
    assert env.parse_action("click[1]") == "click[2]"
    assert env.parse_action("click[alder red cotton shirt]") == "click[2]"


def test_item_count_is_the_number_of_goals(small_shop):
    env = WebShopEnv(path=small_shop)
    assert env.item_count == 1
    assert WebShopEnv().item_count == len(WebShopEnv().goals) == 1000


def test_partial_purchase_is_not_a_success(small_shop):
    env = WebShopEnv(path=small_shop)
    env.reset(seed=0)
    for action in ("search[red shirt]", "click[P0]"):
        env.step(action)
    _, reward, terminated, _, info = env.step("buy now")
    # red instead of grey, no size: (cotton + price) / (2 + 1 + 1)
    assert terminated and reward == pytest.approx(2 / 4) and info["success"] is False


def test_paging_and_going_back(small_shop):
    env = WebShopEnv(path=small_shop, results_per_page=3)
    env.reset(seed=0)
    env.step("search[shirt]")
    assert env.parse_action("click[prev page]") is None  # on the first page
    obs = env.step("click[next page]")[0]
    assert "(page 2 of 3, 7 products)" in obs and "click[prev page]" in obs and "[P3]" in obs
    assert env.parse_action("click[P0]") is None  # not on this page
    env.step("click[next page]")
    assert env.parse_action("click[next page]") is None  # on the last page
    env.step("click[P6]")
    assert env.step("click[back to results]")[0].split("\n")[2].endswith("(page 3 of 3, 7 products)")
    assert env.step("click[back to search]")[0].endswith("Page: search\nActions: search[keywords]")
    obs = env.step("search[bicycle]")[0]
    assert obs.endswith('Page: results for "bicycle": no products match\nActions: click[back to search]')


@pytest.mark.parametrize(
    "page_actions, bad",
    [
        ([], "buy"),  # buy on the search page
        ([], "click[P5]"),  # clicks need a results page
        ([], "search[]"),
        ([], "search[!!!]"),  # no word left to search for
        ([], "look around"),
        (["search[shirt]"], "search[mug]"),  # search only from the search page, as in WebShop
        (["search[shirt]"], "click[Z9]"),
        (["search[shirt]"], "click[]"),
        (["search[shirt]"], "buy"),
        (["search[shirt]", "click[P0]"], "click[xl]"),  # not an option of this product
        (["search[shirt]", "click[P0]"], "click[fit: m]"),  # no such option name
        (["search[shirt]", "click[P0]"], "click[next page]"),
        (["search[mug]", "click[M1]"], "click[m]"),  # the mug has no options
    ],
)
def test_actions_the_page_does_not_offer_are_invalid(small_shop, page_actions, bad):
    env = WebShopEnv(path=small_shop, results_per_page=3)
    env.reset(seed=0)
    for action in page_actions:
        assert env.step(action)[4]["action_valid"]
    before, used = env.render(), env.num_actions
    obs, reward, terminated, truncated, info = env.step(bad)
    assert (obs, reward, terminated, truncated) == (before, 0.0, False, False)
    assert info == {"success": False, "action_valid": False} and env.num_actions == used


def test_canonical_actions_parse_to_themselves(small_shop):
    env = WebShopEnv(path=small_shop, results_per_page=3)
    env.reset(seed=0)
    assert env.parse_action("  SEARCH [ Grey,  cotton shirt! ] ") == "search[grey cotton shirt]"
    assert env.parse_action("search[grey cotton shirt]") == "search[grey cotton shirt]"
    env.step("search[grey cotton shirt]")
    assert env.parse_action("click [P5]") == env.parse_action("click[P5]") == "click[P5]"
    assert env.parse_action("click[Next >]") == "click[next page]"
    env.step("click[P5]")
    for text in ("click[m]", "click[Size: M]", "click[size: m]"):
        assert env.parse_action(text) == "click[size: m]"
    assert env.parse_action("click[< Prev]") == "click[back to results]"
    for text in ("buy", "Buy Now", "click[buy now]", "buy"):
        assert env.parse_action(text) == "buy"


def test_episode_truncates_after_the_action_budget(small_shop):
    env = WebShopEnv(path=small_shop, max_actions_per_episode=3)
    env.reset(seed=0)
    env.step("search[shirt]")
    env.step("click[P0]")
    _, reward, terminated, truncated, info = env.step("click[back to search]")
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, True, False)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("search[shirt]")


def test_random_play_stays_in_the_observation_space():
    env = WebShopEnv()
    rng = random.Random(0)
    for seed in range(40):
        obs, _ = env.reset(seed=seed)
        assert obs in env.observation_space
        done = False
        while not done:
            listed = [line.split("]")[0][1:] for line in obs.split("\n") if line.startswith("[")]
            values = [v for values in (env.product.options.values() if env.product else []) for v in values]
            pool = ["search[" + " ".join(rng.sample(env.goal.instruction.split(), 3)) + "]", "buy", "click[next page]"]
            pool += [f"click[{x}]" for x in listed + values] + ["click[back to results]", "click[back to search]"]
            obs, _, terminated, truncated, info = env.step(rng.choice(pool))
            assert obs in env.observation_space, obs
            done = terminated or truncated
    long_query = "search[" + "shirt " * 100 + "]"
    env.reset(seed=0)
    assert env.step(long_query)[0] in env.observation_space


# ------------------------------------------------------------------------------------ bad config
def test_missing_or_malformed_data_file_names_the_option(tmp_path):
    with pytest.raises(ValueError, match=r"^env\.options\.path='.*nowhere\.json' is not allowed; expected an existing"):
        make_env("webshop", path=str(tmp_path / "nowhere.json"))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"^env\.options\.path=.* expected a JSON file"):
        make_env("webshop", path=str(tmp_path / "broken.json"))
    (tmp_path / "other.json").write_text(json.dumps({"questions": []}))
    with pytest.raises(ValueError, match=r"^env\.options\.path=.* expected a WebShop catalog"):
        make_env("webshop", path=str(tmp_path / "other.json"))
    bad_goal = shop_file(
        tmp_path,
        [{"id": "A", "title": "t", "type": "x", "category": [], "attributes": [], "options": {}, "price": 1}],
        [{"product": "A", "instruction": "i", "attributes": [], "options": {"size": "m"}, "price_upper": 2}],
    )
    with pytest.raises(ValueError, match=r"^env\.options\.path=.*not options of A"):
        make_env("webshop", path=bad_goal)


@pytest.mark.parametrize(
    "option, value", [("results_per_page", 0), ("results_per_page", "5"), ("max_actions_per_episode", 0)]
)
def test_bad_options_name_the_key(option, value):
    with pytest.raises(ValueError, match=rf"^env\.options\.{option}={value!r} is not allowed"):
        make_env("webshop", **{option: value})


# ----------------------------------------------------------------------------------- bundled set
def test_bundled_set_is_the_generator_output_and_small(tmp_path):
    out = tmp_path / "shop.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.read_bytes() == default_data_path().read_bytes()
    assert default_data_path().stat().st_size < 1_000_000
    assert make_shop(30, 20, seed=1) == make_shop(30, 20, seed=1) != make_shop(30, 20, seed=2)


def test_bundled_goals_are_distinct_and_their_targets_score_one():
    shop = load_shop()
    assert len(shop.products) == 300 and len(shop.goals) == 1000
    assert len({goal.instruction for goal in shop.goals}) == 1000
    assert load_shop() is load_shop()
    for goal in shop.goals:
        assert webshop_reward(goal.target, goal.options, goal) == 1.0, goal.instruction
        assert goal.target.price <= goal.price_upper


def test_the_target_is_found_by_searching_the_instruction_item():
    shop = load_shop()
    for goal in shop.goals[:200]:
        item = goal.instruction.split(",")[0]
        assert shop.products.index(goal.target) in search_products(shop.products, item), goal.instruction


def test_shop_from_dict_rejects_duplicate_option_values():
    record = {"id": "A", "title": "t", "type": "x", "category": [], "attributes": [], "price": 1}
    with pytest.raises(ValueError, match="unique"):
        shop_from_dict({"products": [{**record, "options": {"a": ["m"], "b": ["m"]}}], "goals": []})


def test_gymnasium_make_and_env_checker():
    env = gymnasium.make("ragen_lit/WebShop-v0")
    assert env.reset(seed=0)[0].startswith("WebShop\nInstruction: ")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
