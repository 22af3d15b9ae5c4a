from heddle.agentspec.templates import render


def test_placeholders_with_and_without_spaces():
    assert render("{{a}} and {{ b }}", {"a": "x", "b": "y"}) == "x and y"


def test_non_strings_render_as_compact_json():
    assert render("{{n}} {{o}} {{l}} {{t}}", {"n": 3, "o": {"k": [1, 2]}, "l": ["é"], "t": True}) == \
        '3 {"k":[1,2]} ["é"] true'


def test_unknown_placeholders_are_left_as_written():
    assert render("keep {{ missing }} and {{x}}", {"x": "ok"}) == "keep {{ missing }} and ok"
