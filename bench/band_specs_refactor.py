"""Refactor candidates for the calibrated band (bench/band_tasks.py builds the tasks from these rows).

Behaviour-preserving changes with a surface the hidden tests can check from the judge: a new function name
(the old one gone), a renamed parameter (called by keyword, `inspect.signature`), a default argument, a
docstring (`__doc__`), type hints (`__annotations__`), a module constant, an extracted helper. Each row gives
the snapshot `before` and the reference `after` as whole files, and `checks`: asserts run with the module
imported by its name (and `inspect`).
"""

import re


def fn(sig: str, body: str, doc: str = "", head: str = "") -> str:
    """A module text: optional `head` lines, then one function (body unindented, lines joined by newlines)."""
    lines = [f"def {sig}:"] + ([f'    """{doc}"""'] if doc else []) + ["    " + ln for ln in body.splitlines()]
    return (head + "\n\n" if head else "") + "\n".join(lines) + "\n"


def rename(name, mod, level, old, new, args, body, prompt, checks):
    """Rename function `old` to `new`: the new name works, the old one is gone."""
    return dict(name=name, mod=mod, level=level, prompt=prompt, before=fn(f"{old}({args})", body),
                after=fn(f"{new}({args})", body), checks=checks + [f"not hasattr({mod}, '{old}')"])


def rename_param(name, mod, level, func, old, new, body, prompt, checks):
    """Rename the parameters `old` to `new` (comma-separated): the signature lists the new names."""
    new_names = [p.strip() for p in new.split(",")]
    return dict(name=name, mod=mod, level=level, prompt=prompt, before=fn(f"{func}({old})", body),
                after=fn(f"{func}({new})", _rebind(body, old, new)),
                checks=[f"list(inspect.signature({mod}.{func}).parameters) == {new_names!r}"] + checks)


def _rebind(body: str, old: str, new: str) -> str:
    """The body with each old parameter name replaced by its new name (whole words only)."""
    for o, n in zip(old.split(","), new.split(","), strict=True):
        body = re.sub(rf"\b{o.strip()}\b", n.strip(), body)
    return body


SPECS = [
    # ---- rename a function
    rename("calc-sq", "powers", "trivial", "calc_sq", "squared", "x", "return x * x",
           "rename calc_sq to squared in powers.py", ["powers.squared(3) == 9", "powers.squared(-2) == 4"]),
    rename("fn1", "ops", "trivial", "fn1", "times", "a, b", "return a * b",
           "in ops.py rename fn1 to times", ["ops.times(3, 4) == 12", "ops.times(0, 5) == 0"]),
    rename("do-it", "textfix", "easy", "do_it", "clean_text", "s", "return s.strip()",
           "do_it in textfix.py is a terrible name, call it clean_text",
           ["textfix.clean_text('  a ') == 'a'", "textfix.clean_text('') == ''"]),
    rename("helper", "sorter", "trivial", "helper", "sort_values", "xs", "return sorted(xs)",
           "rename helper() to sort_values() in sorter.py",
           ["sorter.sort_values([3, 1, 2]) == [1, 2, 3]", "sorter.sort_values([]) == []"]),
    rename("proc", "nextnum", "trivial", "proc", "next_number", "n", "return n + 1",
           "nextnum.py: rename proc to next_number", ["nextnum.next_number(1) == 2", "nextnum.next_number(-1) == 0"]),
    rename("chk", "posneg", "easy", "chk", "is_pos", "n", "return n > 0",
           "chk in posneg.py should be called is_pos",
           ["posneg.is_pos(3) is True", "posneg.is_pos(0) is False", "posneg.is_pos(-1) is False"]),
    rename("getlen", "strlen", "easy", "getlen", "text_length", "s", "return len(s)",
           "please rename getlen to text_length (strlen.py)",
           ["strlen.text_length('abc') == 3", "strlen.text_length('') == 0"]),
    rename("tmp-func", "halves", "trivial", "tmp_func", "halved", "x", "return x / 2",
           "rename tmp_func in halves.py to halved", ["halves.halved(8) == 4", "halves.halved(1) == 0.5"]),
    rename("mk-greeting", "greeting2", "easy", "mk_greeting", "make_greeting", "name", "return 'Hi ' + name",
           "rename mk_greeting to make_greeting in greeting2.py",
           ["greeting2.make_greeting('Jo') == 'Hi Jo'", "greeting2.make_greeting('') == 'Hi '"]),
    rename("avg-of", "averages", "easy", "avg_of", "average", "xs", "return sum(xs) / len(xs)",
           "averages.py: avg_of -> average, same behaviour",
           ["averages.average([1, 2, 3]) == 2", "averages.average([5]) == 5"]),
    rename("conv", "tempconv", "easy", "conv", "celsius_to_fahrenheit", "c", "return c * 9 / 5 + 32",
           "conv in tempconv.py is unclear, rename it to celsius_to_fahrenheit",
           ["tempconv.celsius_to_fahrenheit(100) == 212", "tempconv.celsius_to_fahrenheit(0) == 32"]),
    rename("isvalid", "accounts", "easy", "isvalid", "is_valid_username", "s", "return s.isalnum()",
           "rename isvalid to is_valid_username in accounts.py",
           ["accounts.is_valid_username('bob42') is True", "accounts.is_valid_username('a b') is False"]),
    rename("get-total", "receipt", "easy", "getTotal", "get_total", "prices", "return sum(prices)",
           "snake_case please: rename getTotal to get_total in receipt.py",
           ["receipt.get_total([1, 2, 3]) == 6", "receipt.get_total([]) == 0"]),
    rename("to-upper", "casing", "easy", "toUpper", "to_upper", "s", "return s.upper()",
           "casing.py uses camelCase, rename toUpper to to_upper",
           ["casing.to_upper('ab') == 'AB'", "casing.to_upper('') == ''"]),
    rename("count-items", "inventory", "easy", "countItems", "count_items", "xs", "return len(xs)",
           "countItems in inventory.py -> count_items",
           ["inventory.count_items([1, 2]) == 2", "inventory.count_items([]) == 0"]),
    # ---- rename a parameter
    rename_param("scale-by", "vectors", "easy", "scale_by", "v, k", "v, factor", "return v * k",
                 "in vectors.py rename the parameter k of scale_by to factor",
                 ["vectors.scale_by(2, factor=3) == 6", "vectors.scale_by(5, 0) == 0"]),
    rename_param("greet-user", "welcomes", "easy", "greet_user", "n", "name", "return 'Hello ' + n",
                 "greet_user(n) in welcomes.py: rename n to name",
                 ["welcomes.greet_user(name='Al') == 'Hello Al'"]),
    rename_param("repeat-word", "echo", "moderate", "repeat_word", "w, t", "word, times", "return ' '.join([w] * t)",
                 "repeat_word(w, t) in echo.py: call the parameters word and times",
                 ["echo.repeat_word(word='hi', times=3) == 'hi hi hi'", "echo.repeat_word('a', 1) == 'a'"]),
    rename_param("price-with-vat", "vat", "easy", "price_with_vat", "p", "price", "return round(p * 1.2, 2)",
                 "rename p to price in price_with_vat (vat.py)",
                 ["vat.price_with_vat(price=10) == 12", "vat.price_with_vat(0) == 0"]),
    rename_param("shift", "moves", "moderate", "shift", "x, d", "x, delta", "return x + d",
                 "moves.py: the d parameter of shift should be named delta",
                 ["moves.shift(1, delta=2) == 3", "moves.shift(5, -5) == 0"]),
    # ---- add a default argument
    dict(name="power-default", mod="pow2", level="easy", prompt="give exp in power() (pow2.py) a default of 2",
         before=fn("power(base, exp)", "return base ** exp"), after=fn("power(base, exp=2)", "return base ** exp"),
         checks=["pow2.power(3) == 9", "pow2.power(2, 3) == 8", "pow2.power(5, exp=0) == 1"]),
    dict(name="surround-default", mod="deco", level="easy",
         prompt="surround(text, ch) in deco.py: ch should default to '*'",
         before=fn("surround(text, ch)", "return ch + text + ch"),
         after=fn("surround(text, ch='*')", "return ch + text + ch"),
         checks=["deco.surround('a') == '*a*'", "deco.surround('a', '-') == '-a-'"]),
    dict(name="round-to-default", mod="rounding", level="easy",
         prompt="make digits optional in round_to (rounding.py), default 2",
         before=fn("round_to(x, digits)", "return round(x, digits)"),
         after=fn("round_to(x, digits=2)", "return round(x, digits)"),
         checks=["rounding.round_to(3.14159) == 3.14", "rounding.round_to(2.5, 0) == 2"]),
    dict(name="join-with-default", mod="joiner", level="moderate",
         prompt="join_with(items, sep) in joiner.py: let sep default to ', '",
         before=fn("join_with(items, sep)", "return sep.join(items)"),
         after=fn("join_with(items, sep=', ')", "return sep.join(items)"),
         checks=["joiner.join_with(['a', 'b']) == 'a, b'", "joiner.join_with(['a', 'b'], '-') == 'a-b'"]),
    dict(name="pad-right-default", mod="columns", level="moderate",
         prompt="pad_right in columns.py: width should be optional with default 10",
         before=fn("pad_right(s, width)", "return s.ljust(width)"),
         after=fn("pad_right(s, width=10)", "return s.ljust(width)"),
         checks=["columns.pad_right('ab') == 'ab' + ' ' * 8", "columns.pad_right('ab', 3) == 'ab '"]),
    # ---- add a docstring
    dict(name="doc-tri-area", mod="triangles", level="easy", prompt="add a docstring to tri_area in triangles.py",
         before=fn("tri_area(base, height)", "return base * height / 2"),
         after=fn("tri_area(base, height)", "return base * height / 2", doc="Area of a triangle."),
         checks=["triangles.tri_area.__doc__ and triangles.tri_area.__doc__.strip()", "triangles.tri_area(4, 3) == 6"]),
    dict(name="doc-speed", mod="motion", level="easy", prompt="speed() in motion.py needs a docstring",
         before=fn("speed(dist, secs)", "return dist / secs"),
         after=fn("speed(dist, secs)", "return dist / secs", doc="Distance over time."),
         checks=["motion.speed.__doc__ and motion.speed.__doc__.strip()", "motion.speed(10, 2) == 5"]),
    dict(name="doc-kmh", mod="speeds", level="easy", prompt="document kmh_to_ms in speeds.py with a docstring",
         before=fn("kmh_to_ms(v)", "return v / 3.6"),
         after=fn("kmh_to_ms(v)", "return v / 3.6", doc="km/h to m/s."),
         checks=["speeds.kmh_to_ms.__doc__ and speeds.kmh_to_ms.__doc__.strip()", "speeds.kmh_to_ms(36) == 10"]),
    # ---- add type hints
    dict(name="hints-halve-int", mod="intdiv", level="moderate",
         prompt="add type hints to halve_int in intdiv.py (int in, int out)",
         before=fn("halve_int(n)", "return n // 2"), after=fn("halve_int(n: int) -> int", "return n // 2"),
         checks=["_ann(intdiv.halve_int) == {'n': 'int', 'return': 'int'}", "intdiv.halve_int(7) == 3"]),
    dict(name="hints-shout-it", mod="loud", level="moderate",
         prompt="type hints for shout_it in loud.py: takes a str, returns a str",
         before=fn("shout_it(s)", "return s.upper()"), after=fn("shout_it(s: str) -> str", "return s.upper()"),
         checks=["_ann(loud.shout_it) == {'s': 'str', 'return': 'str'}", "loud.shout_it('a') == 'A'"]),
    dict(name="hints-is-short", mod="brevity", level="moderate",
         prompt="annotate is_short in brevity.py: s is a str, returns bool",
         before=fn("is_short(s)", "return len(s) < 5"), after=fn("is_short(s: str) -> bool", "return len(s) < 5"),
         checks=["_ann(brevity.is_short) == {'s': 'str', 'return': 'bool'}", "brevity.is_short('abc') is True"]),
    # ---- pull a magic number into a module constant
    dict(name="const-vat", mod="vat2", level="easy", prompt="pull the 1.25 in with_vat (vat2.py) into a constant VAT",
         before=fn("with_vat(p)", "return p * 1.25"), after=fn("with_vat(p)", "return p * VAT", head="VAT = 1.25"),
         checks=["vat2.VAT == 1.25", "vat2.with_vat(4) == 5"]),
    dict(name="const-max-len", mod="tweets", level="easy",
         prompt="tweets.py: make 80 a module constant MAX_LEN and use it in fits",
         before=fn("fits(s)", "return len(s) <= 80"), after=fn("fits(s)", "return len(s) <= MAX_LEN", head="MAX_LEN = 80"),
         checks=["tweets.MAX_LEN == 80", "tweets.fits('a' * 80) is True", "tweets.fits('a' * 81) is False"]),
    dict(name="const-day", mod="durations", level="easy",
         prompt="in durations.py, name the 86400 in seconds_in: SECONDS_PER_DAY",
         before=fn("seconds_in(days)", "return days * 86400"),
         after=fn("seconds_in(days)", "return days * SECONDS_PER_DAY", head="SECONDS_PER_DAY = 86400"),
         checks=["durations.SECONDS_PER_DAY == 86400", "durations.seconds_in(2) == 172800"]),
    # ---- extract a helper
    dict(name="extract-sq", mod="pythag", level="moderate",
         prompt="hyp in pythag.py squares twice inline; extract a helper sq(x) and use it",
         before=fn("hyp(a, b)", "return (a * a + b * b) ** 0.5"),
         after=fn("sq(x)", "return x * x") + "\n\n" + fn("hyp(a, b)", "return (sq(a) + sq(b)) ** 0.5"),
         checks=["pythag.sq(3) == 9", "pythag.hyp(3, 4) == 5"]),
    dict(name="extract-tidy", mod="labels", level="moderate",
         prompt="labels.py: move the name clean-up in label() into its own function tidy(name)",
         before=fn("label(name, qty)", "return name.strip().title() + ': ' + str(qty)"),
         after=fn("tidy(name)", "return name.strip().title()") + "\n\n"
               + fn("label(name, qty)", "return tidy(name) + ': ' + str(qty)"),
         checks=["labels.tidy(' bob ') == 'Bob'", "labels.label(' ann', 2) == 'Ann: 2'"]),
]
