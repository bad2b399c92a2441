"""User-facing CLI errors: printed as one line, exit status 2, never a traceback."""


class UserError(ValueError):
    pass
