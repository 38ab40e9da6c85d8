"""The one exception type for problems a user can cause (bad file, unsupported op, wrong shape)."""


class MnnToolError(Exception):
    """Printed by the CLI as one line, with a non-zero exit code (2 unless `code` says otherwise)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


class InvalidModel(MnnToolError):
    """A model whose own parameters contradict each other (a group that does not divide the channels,
    weights of the wrong size): refused at prepare, before any kernel touches memory."""
