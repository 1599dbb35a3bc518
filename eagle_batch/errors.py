"""The one base class of errors a user's input causes (config, data, run directory, environment).

Their message already names the file, row or key and says what to do, so the CLI prints it as one line
and exits with `exit_code`, without a traceback. Anything else that reaches the CLI is a bug in
eagle-batch, and its traceback is what a bug report needs.
"""

from __future__ import annotations


class UserError(Exception):
    """An input-caused failure; str(e) is the whole message for the user."""

    exit_code = 1
