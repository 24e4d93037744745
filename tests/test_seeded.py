"""The seeded order behind every data split: fixed by the seed and the keys, not by the input's order."""

from privret.data.seeded import seeded_digest, seeded_order, seeded_unit


def test_the_digest_is_sha256_of_seed_colon_key():
    # `echo -n "0:a" | sha256sum`; a change here would reshuffle every split built before it
    assert seeded_digest(0, "a") == "9df3c5fab8ef8fe78a408912e52e76477b5bd838eec3cbf48191a848ec8563d3"
    assert seeded_unit(0, "a") == int("9df3c5fab8ef8fe", 16) / 16 ** 15


def test_the_order_is_pinned_and_ignores_the_input_order():
    keys = ["a", "b", "c", "d", "e"]
    assert seeded_order(keys, 0) == ["d", "a", "c", "b", "e"]
    assert seeded_order(reversed(keys), 0) == ["d", "a", "c", "b", "e"]
    assert seeded_order(keys, "validation") == ["d", "b", "e", "c", "a"]  # a string seed, as the validation carve
    ids = [f"d{i}" for i in range(50)]
    assert seeded_order(ids, 0) != seeded_order(ids, 1)  # the seed moves the order


def test_adding_items_keeps_the_others_in_their_relative_order():
    small = seeded_order([f"q{i}" for i in range(20)], 3)
    large = seeded_order([f"q{i}" for i in range(40)], 3)
    assert [q for q in large if q in set(small)] == small


def test_a_key_function_orders_records():
    records = [{"title": t} for t in "abcde"]
    assert [r["title"] for r in seeded_order(records, 0, key=lambda r: r["title"])] == ["d", "a", "c", "b", "e"]
