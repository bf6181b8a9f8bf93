"""The one exception type whose message is meant for the user."""


class SplatwrightError(Exception):
    """A problem with the user's input or environment; the message says what and what to do."""
