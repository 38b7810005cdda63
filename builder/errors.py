"""The one exception type the command line turns into a single line and a non-zero exit."""


class BuildError(Exception):
    """A problem with the user's input or environment, explained in one line.

    Raised anywhere on the build path; `builder.cli` prints `error: <message>` and exits with 2.
    Anything else that escapes is a bug in builder and keeps its traceback.
    """
