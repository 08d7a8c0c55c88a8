"""``sapgrid --help`` lists every command with a one-line help, and its summary names each of them."""
from __future__ import annotations

import argparse

from sapgrid.tools import cli


def test_every_command_is_listed_with_a_help_line():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    assert set(helps) == set(sub.choices)
    text = parser.format_help()
    for name in sub.choices:
        assert helps[name] and "\n" not in helps[name], name
        assert f"    sapgrid {name} " in text, f"the summary does not show `sapgrid {name}`"
