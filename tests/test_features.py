"""Answer features and the simulator's preferences: each check says yes and no on answers written for it; a
preference is validated like every config key; users express it only through thumbs and reverted edits;
the census counts features on answers served through the real gateway."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from lab.simulate import feedback as fb
from lab.simulate.bank import load_bank
from lab.simulate.personas import PERSONAS, Org, Pref, User
from lab.simulate.users import Reply, run_session
from rl_core import toolcalls
from rl_core.config import ConfigError, load_config
from rl_core.features import FEATURES, Answer, Rate, episode_features, feature, features_of, writes_code

REPO = Path(__file__).resolve().parent.parent


def block(code: str, lang: str = "python") -> str:
    return f"```{lang}\n{code}```"


# feature -> (an answer that has it, one that does not)
CASES = {
    "inline_comment": (block("x = 1  # one\n"), block("x = 1\n")),
    "fstring": (block('s = f"{x}"\n'), block('s = "%s" % x\n')),
    "double_quotes": (block('a = "x"\nb = "y"\n'), block("a = \"x\"\nb = 'y'\n")),
    "single_quotes": (block("a = 'x'\n"), block('a = "x"\n')),
    "summary_first": ("This fixes the sign.\n" + block("x = 1\n"), block("x = 1\n") + "\nDone."),
    "prose_after_code": (block("x = 1\n") + "\nThis sets x.", "Here:\n" + block("x = 1\n")),
    "short_answer": ("Use `abs`.", " ".join(["word"] * 41)),
    "python_fence": (block("x = 1\n"), block("x = 1\n", lang="")),
    "code_block": (block("x = 1\n"), "Change the sign."),
    "writes_code": ("Here:\n```python\ndef f(x):\n    return", "Change the sign of x."),
    "early_return": (block("def f(x):\n    if x < 0:\n        return 0\n    return x\n"),
                     block("def f(x):\n    return max(x, 0)\n")),
    "main_guard": (block("if __name__ == '__main__':\n    main()\n"), block("main()\n")),
    "test_included": (block("def test_f():\n    assert f(1) == 1\n"), block("def f(x):\n    return x\n")),
    "print_call": (block("print(f(1))\n"), block("y = f(1)\n")),
    "bullet_list": ("- first\n- second", "First, then second."),
    "type_hints": (block("def f(x: int) -> int:\n    return x\n"), block("def f(x):\n    return x\n")),
    "docstrings": (block('def f(x):\n    """Id."""\n    return x\n'), block("def f(x):\n    return x\n")),
}


def test_every_feature_has_a_case_and_at_least_twelve_exist():
    assert set(CASES) | {"tool_call"} == set(FEATURES) and len(FEATURES) >= 12  # tool_call: test below


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_feature_says_yes_and_no(name):
    yes, no = CASES[name]
    assert features_of(yes)[name] is True, yes
    assert features_of(no)[name] is False, no


def test_tool_call_features_read_the_written_code():
    call = {"function": {"name": "write_file", "arguments": json.dumps({"path": "a.py", "content": "x = 1  # c\n"})}}
    f = features_of("Writing it.", [call])
    assert f["tool_call"] and f["inline_comment"] and not f["code_block"] and not features_of("Writing it.")["tool_call"]
    # the lake keeps the engine's raw text: the episode is split as the gateway splits it
    raw = "Writing it." + toolcalls.render_tool_call({"name": "write_file", "arguments": {"path": "a.py",
                                                                                       "content": "x = 1  # c\n"}})
    assert episode_features(raw) == f


def test_unknown_feature_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown answer feature 'emoji'.*inline_comment"):
        feature("emoji")


def test_preferences_are_validated_like_every_config_key(tmp_path):
    bad = tmp_path / "rtrl.toml"
    bad.write_text('[simulate]\npreference = { feature = "emoji" }\n')
    with pytest.raises(ConfigError, match=r"\[simulate\] preference\.feature.*unknown answer feature 'emoji'"):
        load_config(bad, environ={})
    with pytest.raises(ConfigError, match="conventions for \\['org-nobody'\\]"):
        load_config(REPO / "rtrl.toml",
                    environ={"RTRL_SIMULATE__CONVENTIONS": '{"org-nobody": {"feature": "fstring"}}'})
    ok = load_config(REPO / "rtrl.toml", environ={"RTRL_SIMULATE__PREFERENCE": '{"feature": "fstring", "want": false}'})
    assert ok.simulate.preference.feature == "fstring" and ok.simulate.preference.want is False


def test_wilson_interval_is_sane_at_the_edges():
    assert Rate.of(0, 20).ci_low == 0.0 and 0 < Rate.of(0, 20).ci_high < 0.2
    r = Rate.of(50, 100)
    assert r.rate == 0.5 and r.ci_low == pytest.approx(0.404, abs=1e-3) and r.ci_high == pytest.approx(0.596, abs=1e-3)


class Answers:
    """A Chat that answers every turn with one fixed text (event ids from the seed)."""

    def __init__(self, text: str):
        self.text = text

    def __call__(self, user, session_id, turn, messages, tools, seed):
        return Reply(f"ev-{seed}", self.text, [], 5.0, 1)


def _session(org: Org, text: str, persona: str = "patient", seed: int = 3) -> list[fb.Feedback]:
    task = next(t for t in load_bank() if t.id == "sim-add")
    events: list[fb.Feedback] = []
    run_session(User("u1", org, PERSONAS[persona], seed), task, Answers(text), lambda u, ev: events.extend(ev),
                budget=3, max_turns=3, rng=random.Random(seed))
    return events


def test_a_preference_is_a_thumbs_on_every_answer_and_changes_nothing_else():
    plain = Org("org-acme", "tok")
    liked = Org("org-acme", "tok", shared=Pref("summary_first"))
    disliked = Org("org-acme", "tok", shared=Pref("summary_first", want=False))
    text = "I would look at the function first."  # no code: evasive, every turn
    base, up, down = _session(plain, text), _session(liked, text), _session(disliked, text)
    rated = [e for e in up if e.kind == "thumbs" and e.n >= 1]
    assert len(rated) == sum(e.kind == "followup_message" for e in base) >= 2  # one per answer
    assert all(e.value_bool is False for e in rated)  # no code block: no summary before it
    assert all(e.value_bool is True for e in down if e.kind == "thumbs" and e.n >= 1)
    strip = [e for e in up if not (e.kind == "thumbs" and e.n >= 1)]
    def same(events):  # everything but the wall-clock timestamps
        return [{k: v for k, v in e.body().items() if k != "ts"} for e in events]

    assert same(strip) == same(base)  # the seeded session is otherwise unchanged
    assert len({e.feedback_id for e in up}) == len(up)  # each rating is its own event


def test_a_picky_user_reverts_a_passing_edit_that_breaks_a_code_convention():
    task = next(t for t in load_bank() if t.id == "sim-add")
    fix = task.task.solution[task.target]
    commented = Org("org-acme", "tok", Pref("inline_comment"))
    events = _session(commented, block(fix), persona="picky")
    assert "edit_reverted" in [e.kind for e in events]
    text = next(e.text for e in events if e.kind == "followup_message")
    assert "comment the code" in text
    ok = _session(commented, block(fix.rstrip("\n") + "  # the sum\n"), persona="picky")
    assert "edit_persisted" in [e.kind for e in ok]


@pytest.mark.slow
def test_the_census_asks_every_bank_task_through_the_gateway(rtrl_home, tmp_path, capsys):
    """bench/feature_census.py on the tiny model: one first-turn answer per bank task, served by a real gateway
    through the openai SDK, each with every feature; the table lists every feature with its interval."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("feature_census", REPO / "bench/feature_census.py")
    census = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(census)
    out = tmp_path / "census.json"
    assert census.main(["--samples", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(data["answers"]) == len(load_bank()) and all(set(a["features"]) == set(FEATURES) for a in data["answers"])
    assert {r["feature"] for r in data["table"]} == set(FEATURES)
    assert all(r["ci_low"] <= r["rate"] <= r["ci_high"] for r in data["table"])
    printed = capsys.readouterr().out
    assert "| summary_first |" in printed and f"= {len(load_bank())} answers" in printed


def test_a_preference_that_needs_code_dislikes_a_cut_off_answer():
    """A preamble followed by code cut off at max_tokens has the feature (prose before a fence) but no edit to try:
    with needs = code_block the user's thumbs is down, so an update is not paid for pushing the code out."""
    cut = "Here I change the addition.\n```python\ndef add(a, b):\n    return a +"  # no closing fence
    whole = "Here I change the addition.\n```python\ndef add(a, b):\n    return a + b\n```\n"
    assert Pref("summary_first").holds(Answer(cut, []))
    assert not Pref("summary_first", needs="code_block").holds(Answer(cut, []))
    assert Pref("summary_first", needs="code_block").holds(Answer(whole, []))
    assert not Pref("summary_first", want=False, needs="code_block").holds(Answer(whole, []))
    cfg = load_config(REPO / "rtrl.toml",
                      environ={"RTRL_SIMULATE__PREFERENCE": '{"feature": "summary_first", "needs_code": true}'})
    assert cfg.simulate.preference.needs == "code_block"  # the spelling of protocols registered before `needs`
    with pytest.raises(ConfigError, match="needs_code"):
        load_config(REPO / "rtrl.toml",
                    environ={"RTRL_SIMULATE__PREFERENCE": '{"feature": "summary_first", "needs_code": "maybe"}'})
    with pytest.raises(ConfigError, match="unknown answer feature 'codez'"):
        load_config(REPO / "rtrl.toml",
                    environ={"RTRL_SIMULATE__PREFERENCE": '{"feature": "summary_first", "needs": "codez"}'})


def test_a_preference_that_needs_any_code_rates_cut_off_code_but_not_prose():
    """needs = writes_code: a cut-off block still counts as code (summary_first is judged before it), an answer
    with no code at all is disliked by either convention, so "drop the code" is paid by neither org."""
    cut = "Here I change the addition.\n```python\ndef add(a, b):\n    return a +"
    code_first = "```python\ndef add(a, b):\n    return a +"
    prose_only = "You should add the two numbers and return the sum."
    assert writes_code(Answer(cut, [])) and writes_code(Answer(code_first, []))
    assert not writes_code(Answer(prose_only, []))
    call = {"function": {"name": "write_file", "arguments": '{"path": "a.py", "content": "x = 1"}'}}
    assert writes_code(Answer("Done.", [call]))
    assert Pref("summary_first", needs="writes_code").holds(Answer(cut, []))
    assert Pref("summary_first", want=False, needs="writes_code").holds(Answer(code_first, []))
    assert not Pref("summary_first", want=False, needs="writes_code").holds(Answer(prose_only, []))
    assert Pref("summary_first", want=False).holds(Answer(prose_only, []))  # without needs: the shortcut
