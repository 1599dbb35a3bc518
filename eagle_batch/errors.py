"""The one base class of errors a user's input causes (config, data, run directory, environment).

Their message already names the file, row or key and says what to do, so the CLI prints it as one line
and exits with `exit_code` (2, a usage or input mistake, unless the raiser says otherwise), without a
traceback. Anything else that reaches the CLI is a bug in
eagle-batch, and its traceback is what a bug report needs.
"""

from __future__ import annotations


class UserError(Exception):
    """An input-caused failure; str(e) is the whole message for the user."""

    exit_code = 2

    def __init__(self, message: str = "", exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
