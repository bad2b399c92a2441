"""User-facing CLI errors: printed as one line, exit status 2, never a traceback."""


class UserError(ValueError):
    """A problem with what the user asked for; the message names the option, file or field."""
